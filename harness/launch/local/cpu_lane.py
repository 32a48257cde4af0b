"""The CPU lane of a local sweep on a machine without GPUs: arms side by side within the cores
(issue 50).

A CPU rank pins one intra-op thread (``launch.ranks``), so an arm of ``n`` ranks keeps ``n`` cores
busy. :func:`run_cpu_lane` starts the arms not yet complete, those that start cold first
(``execution.vary_processes``: the repeat and reference arms, each importing torch afresh while
the warm servers import theirs), then in plan order, each as soon as its ranks fit in the cores
the arms in flight leave free (the first arm that fits, so a one-rank arm fills a core a two-rank
arm cannot); an arm of more ranks than cores runs on an idle machine, and
an arm whose step time a golden pair judges (``gpu_demand.timing_judged_arms``) runs alone.
Each case is judged once its arms ended. ``cores`` 1 (``dcp-harness run --gpu-jobs 1``) runs one
arm after another. Ctrl-C ends every arm in flight (``launcher.stop()``) and is raised again.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.compare import CaseVerdict
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.local.gpu_demand import timing_judged_arms
from harness.launch.local.side_by_side import arms_to_run, judge_into, stopping_on_exit
from harness.results import CASE_FILE, ArmOutcome


@dataclass(frozen=True)
class CpuArm:
    """One arm to run: its case, the cores it keeps busy, whether nothing may run beside it."""

    plan: CasePlan
    arm: PlannedArm
    case_dir: Path
    cores: int
    alone: bool


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity; every core where it cannot be read)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def arm_cores(arm: PlannedArm, cores: int) -> int:
    """The cores ``arm`` keeps busy (one per rank process at once), at most ``cores``."""
    return max(1, min(cores, len(arm.ranks)))


def next_arm(pending: Sequence[CpuArm], running: Sequence[CpuArm], cores: int) -> CpuArm | None:
    """The first of ``pending`` that may start beside ``running`` (module doc), or None."""
    if any(r.alone for r in running):
        return None
    free = cores - sum(r.cores for r in running)
    for a in pending:
        if not running or (not a.alone and a.cores <= free):
            return a
    return None


def run_cpu_lane(cases: Sequence[tuple[int, CasePlan]], total: int, out_dir: Path,
                 launcher: ArmLauncher, shown: Any, verdicts: dict[str, CaseVerdict], cores: int,
                 needs_run: Callable[[PlannedArm, Path], bool],
                 run_arm: Callable[..., ArmOutcome]) -> None:
    """Run the arms of ``cases`` (index in the sweep, plan) not yet complete within ``cores``
    (module doc) and judge each case once its arms ended (into ``verdicts``). ``shown`` is
    called from several threads: a serialised progress display. ``needs_run`` and ``run_arm``:
    the lanes' rules (``lanes.runs_again``, ``lanes.run_arm_into``)."""
    pending: list[CpuArm] = []
    left: dict[str, int] = {}
    for index, plan in cases:
        timed = timing_judged_arms(plan)
        pending += arms_to_run(
            index, plan, Path(out_dir), shown, verdicts, left, needs_run,
            lambda arm, case_dir: CpuArm(plan, arm, case_dir, arm_cores(arm, cores),
                                         arm.name in timed))
    pending.sort(key=lambda a: not a.arm.case.execution.vary_processes)  # stable: cold first
    running: dict[Future, CpuArm] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, cores), thread_name_prefix="cpu-arm")
    try:
        with stopping_on_exit(launcher):
            while pending or running:
                a = next_arm(pending, list(running.values()), cores)
                if a is not None:
                    pending.remove(a)
                    arm_dir = a.case_dir / a.arm.name
                    running[pool.submit(
                        run_arm, launcher, a.plan, a.arm, arm_dir, a.case_dir / CASE_FILE,
                        lambda a=a, arm_dir=arm_dir: shown.arm_started(
                            a.plan.title, a.arm.name, arm_dir, a.plan.steps))] = a
                    continue
                done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                for fut in done:
                    a = running.pop(fut)
                    shown.arm_finished(a.plan.title, a.arm.name, fut.result())
                    left[a.plan.case_id] -= 1
                    if not left[a.plan.case_id]:
                        judge_into(a.plan, a.case_dir, shown, verdicts)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

