"""Where a case of a sweep stands (a row of ``dcp-harness status``), for every backend.

A backend's ``state`` (``launch.pipeline.SweepBackend``) answers with a :class:`CaseStatus` per
case. What the case folder says is read here, once, for every backend (:func:`folder_progress`):
the arms its stored plan lists, the ones with a final outcome, the arm in flight and how many
steps it recorded, the verdict. Each backend adds what only it knows: the Slurm backend the
scheduler's word on the case's job (``slurm.status``), the local backend whether a run holds the
sweep folder (``local.backend``). Reads files; writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence, Union, get_args

from harness.caseplan import CasePlan, read_plan
from harness.compare import read_verdict
from harness.compare.verdicts import PairStatus
from harness.launch.ranks.completion import arm_needs_run
from harness.results import ArmOutcome, ResultsError, read_outcome, read_steps

# Where a case of a sweep stands, in the order of the status line's counts.
CaseState = Literal["pending", "running", "done", "failed", "error", "skipped"]
PROGRESS_ORDER: tuple[CaseState, ...] = get_args(CaseState)


@dataclass(frozen=True)
class CaseStatus:
    """Where one case of a sweep stands. ``terminal``: nothing more happens to it without a new
    command; ``arm`` / ``step`` / ``steps``: the arm in flight and its recorded steps of the
    case's; ``verdict``: the verdict's status once judged. ``job_id`` and ``scheduler_state``:
    the case's job and the scheduler's word on it, for a backend with a scheduler ('' else)."""

    case_id: str
    state: CaseState
    arms_done: int
    arms_total: int
    terminal: bool
    job_id: str = ""
    scheduler_state: str = ""
    arm: str = ""
    step: int = 0
    steps: int = 0
    detail: str = ""
    verdict: Union[PairStatus, Literal[""]] = ""  # the case's verdict once judged


def judged_state(case_dir: Path) -> Optional[tuple[CaseState, PairStatus]]:
    """Where a judged case stands by its ``verdict.json`` (read through ``CaseVerdict``): done
    for a pass, failed for a fail, else error (an unreadable verdict too), with the verdict's
    status; None while it has no verdict."""
    try:
        verdict = read_verdict(case_dir)
    except ResultsError:
        return "error", "error"
    if verdict is None:
        return None
    state: CaseState = {"pass": "done", "fail": "failed"}.get(verdict.status, "error")
    return state, verdict.status


@dataclass(frozen=True)
class FolderProgress:
    """What a case folder says of the case (:func:`folder_progress`). ``pending_arms``: the arms
    without a final outcome, in the plan's order; ``judged``: :func:`judged_state`, None before
    the case is judged."""

    plan: CasePlan
    outcomes: tuple[Optional[ArmOutcome], ...]
    pending_arms: tuple[str, ...]
    judged: Optional[tuple[CaseState, PairStatus]]

    @property
    def arms_total(self) -> int:
        return len(self.plan.arms)

    @property
    def arms_done(self) -> int:
        return self.arms_total - len(self.pending_arms)

    def in_flight(self, case_dir: Path) -> tuple[str, int]:
        """(the first arm without a final outcome, the most steps one of its ranks recorded);
        ('', 0) when every arm has one."""
        if not self.pending_arms:
            return "", 0
        arm = self.pending_arms[0]
        ranks = read_steps(Path(case_dir) / arm)
        return arm, max((len(r) for r in ranks.values()), default=0)


def folder_progress(case_dir: Path) -> FolderProgress:
    """Read a case folder: its stored plan (``PlanError`` when it has none or a bad one), each
    arm's outcome, the arms without a final one, where its verdict puts it."""
    case_dir = Path(case_dir)
    plan = read_plan(case_dir)
    outcomes = tuple(read_outcome(case_dir / a.name) for a in plan.arms)
    pending = tuple(a.name for a in plan.arms
                    if arm_needs_run(a, case_dir / a.name, retry_final=False))
    return FolderProgress(plan, outcomes, pending, judged_state(case_dir))


def outcome_state(outcomes: Sequence[Optional[ArmOutcome]]) -> CaseState:
    """The state of a case whose arms all ended, before it is judged: error when an arm hit an
    infrastructure failure or its time limit, failed when one failed, else done."""
    statuses = {o.status for o in outcomes if o is not None}
    if statuses & {"infra", "timeout"}:
        return "error"
    if "failed" in statuses:
        return "failed"
    return "done"


def counts(statuses: Sequence[CaseStatus]) -> dict[str, int]:
    """Cases per state, every state of :data:`CaseState` listed (in its order)."""
    out = {k: 0 for k in PROGRESS_ORDER}
    for s in statuses:
        out[s.state] = out.get(s.state, 0) + 1
    return out
