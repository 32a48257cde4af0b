"""Where each case of a submitted sweep stands, from its case folder and the scheduler's word.

An arm's ``outcome.json`` and the case's ``verdict.json`` are final; otherwise the scheduler
says whether the job is pending or running. Which arms a case has and on which ranks each records
comes from its stored plan. A job that the scheduler no longer knows and that left no result is
*gone*: it counts as ended (an infrastructure error), so nothing waits on it forever. A case that
``submit`` did not queue (it cannot run on the profile's nodes) is *skipped*, with the reason.
Reads files and asks the scheduler (through a :class:`~harness.launch.slurm.poll.SchedulerPoller`);
writes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping, Optional, Sequence, Union, get_args

from harness.compare.verdicts import PairStatus
from harness.launch.pipeline import CaseState, judged_state
from harness.launch.ranks.completion import arm_needs_run
from harness.launch.slurm.poll import PENDING_STATES, Runner, SchedulerPoller, SchedulerView, \
    run_command
from harness.launch.slurm.submit import JobRef, latest_jobs, skipped_cases
from harness.launch.sweep import load_plan
from harness.results import ArmOutcome, read_outcome, read_steps

PROGRESS_ORDER: tuple[CaseState, ...] = get_args(CaseState)


@dataclass(frozen=True)
class CaseStatus:
    """Where one case of a submitted sweep stands."""

    case_id: str
    job_id: str
    state: CaseState
    slurm_state: str
    arms_done: int
    arms_total: int
    terminal: bool
    arm: str = ""  # the arm in flight
    step: int = 0
    steps: int = 0
    detail: str = ""
    verdict: Union[PairStatus, Literal[""]] = ""  # the case's verdict once judged


def _outcome_state(outcomes: Sequence[Optional[ArmOutcome]]) -> CaseState:
    statuses = {o.status for o in outcomes if o is not None}
    if statuses & {"infra", "timeout"}:
        return "error"
    if "failed" in statuses:
        return "failed"
    return "done"


def case_status(case_dir: Path, ref: JobRef, view: SchedulerView, now: Optional[float] = None,
                grace_s: float = 60.0) -> CaseStatus:
    """Status of one case from its folder and the scheduler (reads files, runs nothing)."""
    now = time.time() if now is None else now
    plan = load_plan(case_dir)
    arms = list(plan.arm_names)
    outcomes = [read_outcome(case_dir / a) for a in arms]
    pending_arms = [a.name for a in plan.arms
                    if arm_needs_run(a, case_dir / a.name, retry_final=False)]
    sched = view.get(ref.job_id)
    slurm_state = sched.state if sched else ("gone" if view.squeue_ok else "unknown")
    base = dict(case_id=plan.case_id, job_id=ref.job_id, slurm_state=slurm_state,
                arms_done=len(arms) - len(pending_arms), arms_total=len(arms),
                steps=plan.steps)
    judged = judged_state(case_dir)
    if judged is not None:
        return CaseStatus(state=judged[0], terminal=True, verdict=judged[1], **base)
    if sched is not None and sched.active:
        if sched.state in PENDING_STATES:
            return CaseStatus(state="pending", terminal=False, detail=sched.reason, **base)
        arm = pending_arms[0] if pending_arms else ""
        ranks = read_steps(case_dir / arm) if arm else {}
        step = max((len(r) for r in ranks.values()), default=0)
        return CaseStatus(state="running", terminal=False, arm=arm, step=step, **base)
    if not pending_arms:
        return CaseStatus(state=_outcome_state(outcomes), terminal=True,
                          detail="not collected yet", **base)
    if sched is None and (not view.squeue_ok or now - ref.submitted_at < grace_s):
        return CaseStatus(state="pending", terminal=False,
                          detail="the scheduler does not list the job yet", **base)
    return CaseStatus(state="error", terminal=True,
                      detail=f"job ended ({slurm_state}) before arm(s) {', '.join(pending_arms)} "
                             "finished; `collect` classifies it", **base)


def skipped_status(case_id: str, reason: str, arms_total: int = 0) -> CaseStatus:
    """A case ``submit`` did not queue: it cannot run on the profile's nodes (none of its arms ran)."""
    return CaseStatus(case_id=case_id, job_id="-", state="skipped", slurm_state="not submitted",
                      arms_done=0, arms_total=arms_total, terminal=True, detail=reason)


def sweep_status(sweep_dir: Path, runner: Runner = run_command,
                 poller: Optional[SchedulerPoller] = None) -> list[CaseStatus]:
    """Every case's status (queued ones and the ones skipped at submit time), by case id;
    ``poller`` (reused across calls) skips jobs known to have ended."""
    refs = latest_jobs(sweep_dir)
    view = (poller or SchedulerPoller(runner)).view(r.job_id for r in refs.values())
    return statuses_in_view(sweep_dir, refs, view)


def statuses_in_view(sweep_dir: Path, refs: Mapping[str, JobRef], view: SchedulerView
                     ) -> list[CaseStatus]:
    """Every case's status for one answer of the scheduler (``view``), by case id."""
    out = {cid: case_status(Path(sweep_dir) / cid, ref, view) for cid, ref in refs.items()}
    for cid, reason in skipped_cases(sweep_dir).items():
        if cid not in out:
            out[cid] = skipped_status(cid, reason, _arm_count(Path(sweep_dir) / cid))
    return [out[cid] for cid in sorted(out)]


def _arm_count(case_dir: Path) -> int:
    try:
        return len(load_plan(case_dir).arms)
    except Exception:  # the status table shows what it can; gate reports the unreadable plan
        return 0


def counts(statuses: Sequence[CaseStatus]) -> dict[str, int]:
    out = {k: 0 for k in PROGRESS_ORDER}
    for s in statuses:
        out[s.state] = out.get(s.state, 0) + 1
    return out
