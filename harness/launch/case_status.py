"""Where a case of a sweep stands (a row of ``dcp-harness status``), for every backend.

A backend's ``state`` (``launch.pipeline.SweepBackend``) answers with a :class:`CaseStatus` per
case. What the case folder says is read here, once, for every backend (:func:`folder_progress`):
the arms its stored plan lists, the ones with a final outcome, the arm in flight and how many
steps it recorded, the verdict. Each backend adds what only it knows: the Slurm backend the
scheduler's word on the case's job (``slurm.status``), the local backend whether a run holds the
sweep folder (``local_backend``). Reads files; writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping, Optional, Sequence, get_args

from harness.caseplan import CasePlan, read_plan
from harness.launch.ranks.completion import arm_needs_run
from harness.results import VERDICT_FILE, ArmOutcome, read_json, read_outcome, read_steps

# Where a case of a sweep stands, in the order of the status line's counts.
CaseState = Literal["pending", "running", "done", "failed", "error", "skipped"]
PROGRESS_ORDER: tuple[CaseState, ...] = get_args(CaseState)

_VERDICT_STATE: Mapping[str, CaseState] = {"pass": "done", "fail": "failed"}


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
    verdict: str = ""


def verdict_state(verdict: str) -> CaseState:
    """The state of a judged case: ``pass`` -> done, ``fail`` -> failed, anything else -> error."""
    return _VERDICT_STATE.get(verdict, "error")


@dataclass(frozen=True)
class FolderProgress:
    """What a case folder says of the case (:func:`folder_progress`). ``pending_arms``: the arms
    without a final outcome, in the plan's order; ``verdict``: '' before the case is judged."""

    plan: CasePlan
    outcomes: tuple[Optional[ArmOutcome], ...]
    pending_arms: tuple[str, ...]
    verdict: str

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
    arm's outcome, the arms without a final one, the verdict's status."""
    case_dir = Path(case_dir)
    plan = read_plan(case_dir)
    outcomes = tuple(read_outcome(case_dir / a.name) for a in plan.arms)
    pending = tuple(a.name for a in plan.arms
                    if arm_needs_run(a, case_dir / a.name, retry_final=False))
    verdict_path = case_dir / VERDICT_FILE
    verdict = str(read_json(verdict_path).get("status", "error")) if verdict_path.is_file() else ""
    return FolderProgress(plan, outcomes, pending, verdict)


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
