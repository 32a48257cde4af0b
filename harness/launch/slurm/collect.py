"""Collecting a submitted sweep: outcomes for arms an ended job left without one, verdicts,
checkpoint clean-up and reports.

When a job ended without an outcome for some arm, ``failures.classify_failure`` decides why from
the Slurm state and the logs: node failure, cancellation, preemption, host OOM kill, NCCL timeouts,
GPU faults and SIGKILL are ``infra`` (an error, never a regression; ``--retry-infra`` re-runs
them), a time limit is ``timeout``, anything else is ``failed``. An arm the job itself recorded
``failed`` because a rank died by a signal becomes ``infra`` when Slurm ended the job for an
infrastructure reason (``failures.ended_with_job``: a node failure, or a cancellation as Slurm's
daemons stopped: the signal was Slurm's). The arm's wall time is measured
as for every Slurm arm, from its ``arm_start`` event to its last sign of life (the newest file in
its folder). Complete arms lose their checkpoints (``sweep_folder.remove_checkpoints_if_complete``, the
rule local sweeps follow too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict
from harness.launch.ranks.completion import arm_needs_run
from harness.launch.ranks.failures import classify_failure, ended_with_job, tail_text
from harness.launch.ranks.rank_main import remove_empty_stacks
from harness.launch.ranks.repro import repro_line
from harness.launch.slurm.events import ArmStart, SlurmEvent, read_events
from harness.launch.slurm.poll import Runner, SchedState, SchedulerPoller, run_command
from harness.launch.slurm.status import CaseStatus, case_status, statuses_in_view
from harness.launch.slurm.submit import JobRef, latest_jobs
from harness.launch.sweep_folder import finalize_case, load_plan, remove_checkpoints_if_complete
from harness.report import ReportFiles, write_reports
from harness.results import (CASE_FILE, LOG_FILE, ArmOutcome, read_outcome, read_steps,
                             write_outcome)
from harness.trust.stored_plan import check_stored_plan


def job_log_text(ref: JobRef, lines: int = 80) -> str:
    """Tails of the job's submitit logs (every task's stderr, then stdout)."""
    folder = Path(ref.folder)
    parts = []
    for suffix in ("err", "out"):
        for path in sorted(folder.glob(f"{ref.job_id}_*_log.{suffix}")):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(text))
    return "\n".join(parts)


def _arm_started(case_dir: Path, arm: str, events: Sequence[SlurmEvent]) -> bool:
    return (any(isinstance(e, ArmStart) and e.arm == arm for e in events)
            or bool(read_steps(case_dir / arm)))


def arm_wall_s(arm_dir: Path, arm: str, events: Sequence[SlurmEvent]) -> float:
    """Seconds from the arm's last ``arm_start`` event to the newest file in its folder (its
    last sign of life); 0.0 when it has no start event or no files."""
    starts = [e.time for e in events if isinstance(e, ArmStart) and e.arm == arm]
    files = [p for p in Path(arm_dir).iterdir() if p.is_file()] if Path(arm_dir).is_dir() else []
    if not starts or not files:
        return 0.0
    return round(max(0.0, max(p.stat().st_mtime for p in files) - starts[-1]), 3)


def killed_by_slurm(case_dir: Path, ref: JobRef, sched: Optional[SchedState]
                    ) -> dict[str, ArmOutcome]:
    """``infra`` outcomes for the arms the job recorded ``failed`` because a rank died by the
    signal with which Slurm ended the job (``failures.ended_with_job``); the others left out."""
    state = sched.state if sched else "GONE"
    code = sched.exit_code if sched else ""
    out = {}
    for planned in load_plan(case_dir).arms:
        prior = read_outcome(case_dir / planned.name)
        ended = (ended_with_job(prior.returncode, state, code)
                 if prior is not None and prior.status == "failed" else None)
        if prior is not None and ended is not None:
            out[planned.name] = dataclasses.replace(
                prior, status="infra", detail=f"slurm job {ref.job_id}: {ended.reason} (the "
                f"job had recorded: failed, {prior.detail})")
    return out


def outcomes_for_ended_job(case_dir: Path, ref: JobRef, sched: Optional[SchedState]
                           ) -> dict[str, ArmOutcome]:
    """Outcomes for the arms a finished job left without one: the arm in flight gets the
    classified status, arms that never started ``infra`` ("not run")."""
    plan = load_plan(case_dir)
    events = read_events(case_dir)
    killed = killed_by_slurm(case_dir, ref, sched)
    restarts = max((e.restarts for e in events), default=0)
    logs = job_log_text(ref)
    state = sched.state if sched else "GONE"
    code = sched.exit_code if sched else ""
    out: dict[str, ArmOutcome] = {}
    blame = None
    for planned in plan.arms:
        arm = planned.name
        arm_dir = case_dir / arm
        repro = repro_line(plan, planned, case_dir / CASE_FILE)
        if not arm_needs_run(planned, arm_dir, retry_final=False):
            prior = killed.get(arm, read_outcome(arm_dir))
            if arm in killed:
                out[arm] = killed[arm]
            if prior is not None and not prior.ok:
                blame = blame or f"arm '{arm}' {prior.status}"
            continue
        if blame is None and _arm_started(case_dir, arm, events):
            arm_log = tail_text(arm_dir / LOG_FILE, 60)
            how = classify_failure(state, code, f"{arm_log}\n{logs}")
            out[arm] = ArmOutcome(
                status=how.status, returncode=None, wall_s=arm_wall_s(arm_dir, arm, events),
                log_tail=f"{arm_log}\n{logs}".strip()[-12000:],
                repro=repro, restarts=restarts,
                detail=f"slurm job {ref.job_id} ended ({state}"
                       f"{', exit ' + code if code else ''}): {how.reason}")
            blame = f"arm '{arm}' {how.status}: {how.reason}"
        else:
            why = blame or f"slurm job {ref.job_id} ended ({state}) before it started"
            out[arm] = ArmOutcome(status="infra", repro=repro,
                                  restarts=restarts, detail=f"not run: {why}",
                                  log_tail=logs[-4000:])
    return out


@dataclass(frozen=True)
class CollectResult:
    """What one collect did: every case's status, the verdicts it judged, the cases still
    queued or running, the cases it could not judge (a line each), the reports it wrote."""

    statuses: tuple[CaseStatus, ...]
    verdicts: tuple[CaseVerdict, ...]
    still_active: tuple[str, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)
    reports: Optional[ReportFiles] = None  # None when collected without reports

    @property
    def finalized(self) -> tuple[str, ...]:
        """The cases judged by this collect."""
        return tuple(v.case_id for v in self.verdicts)


def collect(sweep_dir: Path, runner: Runner = run_command, reports: bool = True,
            allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
            judged: Mapping[str, CaseVerdict] = MappingProxyType({})) -> CollectResult:
    """Give every ended case its missing outcomes and a verdict, remove the checkpoints of its
    complete arms, write the reports. Cases whose job is still queued or running are left alone
    (listed in ``still_active``). Each case is judged once: the ones judged here
    (``CollectResult.verdicts``) and ``judged`` (judged earlier in this process: ``submit``'s
    skipped cases) go to the reports as they are, every other one is judged there.""" 
    sweep_dir = Path(sweep_dir)
    refs = latest_jobs(sweep_dir)
    view = SchedulerPoller(runner).view(r.job_id for r in refs.values())
    finalized: dict[str, CaseVerdict] = {}
    active, problems = [], []
    for cid, ref in sorted(refs.items()):
        case_dir = sweep_dir / cid
        status = case_status(case_dir, ref, view)
        if not status.terminal:
            active.append(cid)
            continue
        plan = load_plan(case_dir)
        for arm in plan.arms:
            remove_checkpoints_if_complete(arm, case_dir / arm.name)
            remove_empty_stacks(case_dir / arm.name, arm.ranks)  # ranks ended by a signal
        # A verdict the job wrote stands, unless Slurm's ending of the job killed an arm it
        # judged as failed (then judged again with that arm infra).
        if status.verdict and not killed_by_slurm(case_dir, ref, view.get(ref.job_id)):
            continue
        try:  # a damaged events file or unreadable results: the report counts the case as an error
            for arm, outcome in outcomes_for_ended_job(case_dir, ref, view.get(ref.job_id)).items():
                write_outcome(case_dir / arm, outcome)
            finalized[cid] = finalize_case(case_dir)
        except Exception as exc:
            problems.append(f"{cid}: could not evaluate: {type(exc).__name__}: {exc}")
    files = (write_reports(sweep_dir, check_plan=check_stored_plan, allowed_skips=allowed_skips,
                           judged={**judged, **finalized}) if reports else None)
    statuses = statuses_in_view(sweep_dir, refs, view)
    return CollectResult(tuple(statuses), tuple(finalized.values()), tuple(active),
                         tuple(problems), files)
