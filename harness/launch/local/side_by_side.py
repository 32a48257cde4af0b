"""What the two lanes that run arms side by side (``cpu_lane``, ``gpu_lane``) share: a case is
judged once its last arm ended, and an exception (Ctrl-C) ends every arm in flight."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from harness.caseplan import CasePlan
from harness.compare import CaseVerdict
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.sweep_folder import finalize_or_error


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
