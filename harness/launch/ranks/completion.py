"""When an arm (or one rank of it) is done: the one rule of the local sweep, emulated ranks, a
Slurm job, ``status`` and ``collect``.

* A rank is complete when its ``rank<k>.jsonl`` holds every planned step (1 .. ``train.steps``).
* An arm is complete when its outcome says ``ok`` and every rank it records on (its own ranks,
  not the job's: the one-rank reference arm records on one) is complete.
* An arm needs a run when it is not complete, unless its outcome is final (``failed``,
  ``timeout``, ``skipped``) and final outcomes stand: a requeued Slurm job, ``status`` and
  ``collect`` keep them; a new local run (``retry_final=True``) runs them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from harness.caseplan import PlannedArm
from harness.results import StepRecord, read_outcome, read_steps

FINAL_STATUSES = ("failed", "timeout", "skipped")


def _holds_every_step(arm: PlannedArm, records: Sequence[StepRecord]) -> bool:
    return set(range(1, arm.case.train.steps + 1)) <= {r.step for r in records}


def rank_is_complete(arm: PlannedArm, arm_dir: Path, rank: int) -> bool:
    """``rank`` of the arm recorded every planned step (a resumed or requeued emulated arm runs
    only its other ranks again)."""
    return _holds_every_step(arm, read_steps(arm_dir).get(rank, []))


def arm_is_complete(arm: PlannedArm, arm_dir: Path) -> bool:
    """The arm's outcome says ok and every rank it records on holds every planned step."""
    outcome = read_outcome(arm_dir)
    if outcome is None or not outcome.ok:
        return False
    steps = read_steps(arm_dir)
    return all(_holds_every_step(arm, steps.get(rank, [])) for rank in arm.ranks)


def arm_needs_run(arm: PlannedArm, arm_dir: Path, *, retry_final: bool) -> bool:
    """Whether ``arm`` is to run (again): it is not complete and, unless ``retry_final``, its
    outcome is not final (module doc). An ``infra`` outcome is never final."""
    if not retry_final:
        outcome = read_outcome(arm_dir)
        if outcome is not None and outcome.status in FINAL_STATUSES:
            return False
    return not arm_is_complete(arm, arm_dir)
