"""Where each case of a submitted sweep stands, from its case folder and the scheduler's word.

An arm's ``outcome.json`` and the case's ``verdict.json`` are final; otherwise the scheduler
says whether the job is pending or running. A job that the scheduler no longer knows and that left
no result is *gone*: it counts as ended (an infrastructure error), so nothing waits on it forever.
Reads files and asks the scheduler (through a :class:`~harness.launch.slurm_poll.SchedulerPoller`);
writes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness.arms import arms_for_case
from harness.launch.slurm import JobRef, latest_jobs
from harness.launch.slurm_job import arm_needs_run
from harness.launch.slurm_poll import PENDING_STATES, Runner, SchedulerPoller, SchedulerView, \
    run_command
from harness.launch.sweep import load_case
from harness.results import VERDICT_FILE, ArmOutcome, read_json, read_outcome, read_steps
from harness.spec.schema import Case

PROGRESS_ORDER = ("pending", "running", "done", "failed", "error")


@dataclass(frozen=True)
class CaseStatus:
    """Where one case of a submitted sweep stands."""

    case_id: str
    job_id: str
    state: str  # pending | running | done | failed | error
    slurm_state: str
    arms_done: int
    arms_total: int
    terminal: bool
    arm: str = ""  # the arm in flight
    step: int = 0
    steps: int = 0
    detail: str = ""
    verdict: str = ""


def arm_names(case: Case) -> list[str]:
    return [a.name for a in arms_for_case(case)]


def _outcome_state(outcomes: Sequence[Optional[ArmOutcome]]) -> str:
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
    case = load_case(case_dir)
    arms = arm_names(case)
    outcomes = [read_outcome(case_dir / a) for a in arms]
    pending_arms = [a for a in arms if arm_needs_run(case, case_dir / a)]
    sched = view.get(ref.job_id)
    slurm_state = sched.state if sched else ("gone" if view.squeue_ok else "unknown")
    base = dict(case_id=case.id, job_id=ref.job_id, slurm_state=slurm_state,
                arms_done=len(arms) - len(pending_arms), arms_total=len(arms),
                steps=case.train.steps)
    verdict_path = case_dir / VERDICT_FILE
    if verdict_path.is_file():
        verdict = str(read_json(verdict_path).get("status", "error"))
        state = {"pass": "done", "fail": "failed"}.get(verdict, "error")
        return CaseStatus(state=state, terminal=True, verdict=verdict, **base)
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


def sweep_status(sweep_dir: Path, runner: Runner = run_command,
                 poller: Optional[SchedulerPoller] = None) -> list[CaseStatus]:
    """Every case's status; ``poller`` (reused across calls) skips jobs known to have ended."""
    refs = latest_jobs(sweep_dir)
    view = (poller or SchedulerPoller(runner)).view(r.job_id for r in refs.values())
    return [case_status(Path(sweep_dir) / cid, ref, view) for cid, ref in sorted(refs.items())]


def counts(statuses: Sequence[CaseStatus]) -> dict[str, int]:
    out = {k: 0 for k in PROGRESS_ORDER}
    for s in statuses:
        out[s.state] = out.get(s.state, 0) + 1
    return out
