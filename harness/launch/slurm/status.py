"""Where each case of a submitted sweep stands, from its case folder and the scheduler's word.

An arm's ``outcome.json`` and the case's ``verdict.json`` are final; otherwise the scheduler
says whether the job is pending or running. Which arms a case has and on which ranks each records
comes from its stored plan (what the folder says: ``launch.case_status.folder_progress``). A
job that the scheduler no longer knows and that left no result is *gone*: it counts as ended
(an infrastructure error), so nothing waits on it forever. A case that ``submit`` did not queue
(it cannot run on the profile's nodes) is *skipped*, with the reason. Reads files and asks the
scheduler (through a :class:`~harness.launch.slurm.poll.SchedulerPoller`); writes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Optional

from harness.launch.case_status import CaseStatus, folder_progress, outcome_state
from harness.launch.slurm.poll import PENDING_STATES, Runner, SchedulerPoller, SchedulerView, \
    run_command
from harness.launch.slurm.submit import JobRef, latest_jobs, skipped_cases
from harness.launch.sweep_folder import load_plan


def case_status(case_dir: Path, ref: JobRef, view: SchedulerView, now: Optional[float] = None,
                grace_s: float = 60.0) -> CaseStatus:
    """Status of one case from its folder and the scheduler (reads files, runs nothing)."""
    now = time.time() if now is None else now
    folder = folder_progress(case_dir)
    sched = view.get(ref.job_id)
    scheduler_state = sched.state if sched else ("gone" if view.squeue_ok else "unknown")
    base = dict(case_id=folder.plan.case_id, job_id=ref.job_id, scheduler_state=scheduler_state,
                arms_done=folder.arms_done, arms_total=folder.arms_total, steps=folder.plan.steps)
    if folder.judged is not None:
        state, verdict = folder.judged
        return CaseStatus(state=state, terminal=True, verdict=verdict, **base)
    if sched is not None and sched.active:
        if sched.state in PENDING_STATES:
            return CaseStatus(state="pending", terminal=False, detail=sched.reason, **base)
        arm, step = folder.in_flight(case_dir)
        return CaseStatus(state="running", terminal=False, arm=arm, step=step, **base)
    if not folder.pending_arms:
        return CaseStatus(state=outcome_state(folder.outcomes), terminal=True,
                          detail="not collected yet", **base)
    if sched is None and (not view.squeue_ok or now - ref.submitted_at < grace_s):
        return CaseStatus(state="pending", terminal=False,
                          detail="the scheduler does not list the job yet", **base)
    return CaseStatus(state="error", terminal=True,
                      detail=f"job ended ({scheduler_state}) before arm(s) "
                             f"{', '.join(folder.pending_arms)} finished; `collect` classifies it",
                      **base)


def skipped_status(case_id: str, reason: str, arms_total: int = 0) -> CaseStatus:
    """A case ``submit`` did not queue: it cannot run on the profile's nodes (none of its arms ran)."""
    return CaseStatus(case_id=case_id, job_id="-", state="skipped", scheduler_state="not submitted",
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

