"""What the two lanes that run arms side by side (``cpu_lane``, ``gpu_lane``) share: which of a
case's arms run (those not complete yet; a case with none is judged at once), a case is judged
once its last arm ended, and an exception (Ctrl-C) ends every arm in flight."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from harness.caseplan import CasePlan, PlannedArm
from harness.compare import CaseVerdict
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.sweep_folder import finalize_or_error, prepare_case_dir
from harness.results import VERDICT_FILE

T = TypeVar("T")


def arms_to_run(index: int, plan: CasePlan, out_dir: Path, shown: Any,
                verdicts: dict[str, CaseVerdict], left: dict[str, int],
                needs_run: Callable[[PlannedArm, Path], bool],
                make: Callable[[PlannedArm, Path], T]) -> list[T]:
    """The case's folder prepared and its start shown; ``make(arm, case_dir)`` for each arm not
    yet complete (``needs_run``), the others shown skipped. A case with arms to run loses its old
    verdict and counts them in ``left``; one with none is judged now (into ``verdicts``)."""
    case_dir = prepare_case_dir(plan, out_dir, listed=True)
    shown.case_started(plan.title, index, len(plan.arms))
    mine = []
    for arm in plan.arms:
        if needs_run(arm, case_dir / arm.name):
            mine.append(make(arm, case_dir))
        else:
            shown.arm_skipped(plan.title, arm.name, "already complete")
    if mine:
        (case_dir / VERDICT_FILE).unlink(missing_ok=True)
        left[plan.case_id] = len(mine)
    else:
        judge_into(plan, case_dir, shown, verdicts)
    return mine


def judge_into(plan: CasePlan, case_dir: Path, shown: Any,
               verdicts: dict[str, CaseVerdict]) -> None:
    """Judge the case whose arms all ended (once), into ``verdicts``, and show it."""
    verdict = finalize_or_error(plan.case_id, case_dir)
    verdicts[plan.case_id] = verdict
    shown.case_finished(plan.title, verdict)


@contextlib.contextmanager
def stopping_on_exit(launcher: ArmLauncher) -> Iterator[None]:
    """An exception raised inside (Ctrl-C) stops every arm ``launcher`` runs
    (``launcher.stop()``, where it has one) and is raised again."""
    try:
        yield
    except BaseException:
        stop = getattr(launcher, "stop", None)
        if stop is not None:
            stop()
        raise
