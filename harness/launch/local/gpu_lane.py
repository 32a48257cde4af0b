"""The GPU lane of a local sweep: the arms of the cases that run on this machine's GPUs, several
at once where their figures allow it (issue 50).

:func:`gpu_setting` decides how many arms may run at once (``dcp-harness run --gpu-jobs N``; by
default as many as the device's memory holds by their predicted peaks, at most
:data:`AUTO_JOBS`) and whether the memory probe's whole-device figure is each arm's own (NVML's
per-process accounting readable: ``harness.metrics.device_memory``). :func:`run_gpu_lane` runs
every arm not yet complete under the placement rule (``gpu_jobs``: an arm that a neighbour would
move runs alone, the others side by side within the predicted memory), judges each case once its
arms ended, and records where each arm ran in the sweep's ``placement.json``
(``results.placement``). ``--gpu-jobs 1`` runs one arm after another. An emulated arm that may
share the GPU runs its emulated ranks side by side on it too (its predicted bytes count every
rank). Ctrl-C ends every arm in flight (``launcher.stop()``) and is raised again.
"""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.compare import CaseVerdict
from harness.errors import ConfigError
from harness.launch.arm_launcher import ArmLauncher
from harness.launch.local.gpu_demand import Predictions, arm_bytes, moved_figures
from harness.launch.local.gpu_jobs import (
    STEP_TIME,
    ArmDemand,
    alone_reason,
    USABLE,
    capacity_of,
    next_arm,
    order,
)
from harness.launch.ranks.placement import runs_on_cuda, skip_reason
from harness.launch.ranks.rank_main import arm_legs
from harness.launch.local.side_by_side import arms_to_run, judge_into, stopping_on_exit
from harness.memplan.records import MemoryTarget
from harness.results import CASE_FILE, ArmOutcome
from harness.results.placement import PlacedArm, Placement, record_placed

AUTO_JOBS = 8  # the most arms at once by default (each arm is one or a few rank processes)
# Whether NVML's per-process accounting is exact, so that an arm's whole-device memory figure
# with its neighbours' usage subtracted equals its figure alone: measured NOT exact (one H100
# 80GB, driver 580.159.04, 2026-12-07, bench/nvml_exact.py): every other process left about
# 5.6 MiB that NVML accounts to no process (NVML used = baseline + the processes + 8.8 MiB with
# one, + 14.4 MiB with two), and tiny-moe-eager's device used after empty_cache beside four arms
# came out 24.4 MiB (+3.2 %) over its golden value (bench/RESULTS.md). So an arm whose
# whole-device memory is judged runs alone.
NVML_PER_PROCESS_EXACT = False
COMMAND_CASE = "a command case: its processes' GPU memory is not planned"


@dataclass(frozen=True)
class GpuSetting:
    """How the GPU lane places arms: at most ``jobs`` at once, within ``capacity`` predicted
    bytes; ``per_process_memory``: the memory probe subtracts the other processes (NVML)."""

    jobs: int
    capacity: int
    per_process_memory: bool
    note: str


def _nvml_free_bytes(gpus: int) -> Optional[tuple[int, bool]]:
    """(the smallest free bytes of the first ``gpus`` GPUs, NVML lists processes), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        free = min(int(pynvml.nvmlDeviceGetMemoryInfo(h).free) for h in handles)
        try:
            pynvml.nvmlDeviceGetComputeRunningProcesses(handles[0])
            listed = True
        except Exception:
            listed = False
        return free, listed
    except Exception:
        return None


def _smi_free_bytes(gpus: int) -> Optional[int]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        values = [int(v) * 2**20 for v in out.split() if v.strip().isdigit()][:max(gpus, 1)]
        return min(values) if values else None
    except Exception:
        return None


def gpu_setting(requested: Optional[int], gpus: int) -> GpuSetting:
    """The lane's setting on a machine with ``gpus`` GPUs: ``requested`` arms at most at once
    (None: :data:`AUTO_JOBS`, fewer on a machine of fewer CPU cores, one a core pair)."""
    if requested is not None and requested < 1:
        raise ConfigError(f"--gpu-jobs must be at least 1 (1: one arm after another), got {requested}")
    if gpus < 1:
        return GpuSetting(1, 0, False, "no GPU: one arm after another")
    nvml = _nvml_free_bytes(gpus)
    free = nvml[0] if nvml else _smi_free_bytes(gpus)
    per_process = bool(nvml and nvml[1]) and NVML_PER_PROCESS_EXACT
    if requested == 1:
        return GpuSetting(1, free or 0, per_process, "--gpu-jobs 1: one arm after another")
    if free is None:
        return GpuSetting(1, 0, False, "the GPU's free memory could not be read (NVML, "
                          "nvidia-smi): one arm after another")
    jobs = requested if requested is not None else max(1, min(AUTO_JOBS, (os.cpu_count() or 2) // 2))
    how = f"--gpu-jobs {requested}" if requested is not None else f"up to {jobs} (the default)"
    return GpuSetting(jobs, capacity_of(free), per_process,
                      f"{how} at once within {USABLE:.0%} of {free / 2**30:.0f} GiB free")


@dataclass
class _Task:
    index: int
    plan: CasePlan
    arm: PlannedArm
    case_dir: Path
    moved: frozenset[str]
    together: int  # emulated ranks side by side on the GPU
    alone: Optional[str]  # the reason it runs alone, or None
    demand: Optional[ArmDemand] = None
    started: float = 0.0
    beside: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str]:
        return (self.plan.case_id, self.arm.name)

    @property
    def label(self) -> str:
        return f"{self.plan.case_id} / {self.arm.name}"


COLD_START_S = 10.0  # a rank process that imports torch itself (no warm server): 10-12 s on a GPU host


def _seconds(arm: PlannedArm, together: int = 1) -> float:
    """A stand-in for the arm's time, for the order only (longest first): process starts and
    steps, for each of its legs (an interrupted arm: two, ``arm_legs``), its emulated ranks one
    after another (``together`` at a time); an arm that starts cold (``vary_processes``) its
    imports too. (On one H100, 2026-12-07, the two-leg ``graph-resumed`` arms took 33 s against
    the graph arms' 14-18 s, and ended the packed group when offered among them.)"""
    runs = -(-len(arm.ranks) // max(1, together)) if arm.emulated else 1
    cold = COLD_START_S if arm.case.execution.vary_processes else 0.0
    return len(arm_legs(arm)) * runs * (10.0 + 0.5 * arm.case.train.steps + cold)


def _alone(plan: CasePlan, arm: PlannedArm, moved: frozenset[str], setting: GpuSetting,
           gpus: int) -> Optional[str]:
    """Why ``arm`` runs with nothing beside it on the GPU, or None."""
    if plan.case.command is not None and skip_reason(plan, gpus) is None:
        return COMMAND_CASE
    return alone_reason(ArmDemand((plan.case_id, arm.name), 0, moved), setting.per_process_memory)


def ranks_at_once(plan: CasePlan, arm: PlannedArm, moved: frozenset[str], setting: GpuSetting,
                  gpus: int) -> int:
    """How many of ``arm``'s ranks the lane runs at once on one GPU: every emulated rank of an
    arm that may share the GPU, else one (``moved``: the figures a neighbour would move,
    ``gpu_demand.moved_figures``). The warm servers the sweep starts ahead use it too: an
    emulated rank's environment (its CPU threads) depends on it (``ranks.emulated``)."""
    shares = (setting.jobs > 1 and _alone(plan, arm, moved, setting, gpus) is None
              and arm.emulated and runs_on_cuda(plan, gpus))
    return len(arm.ranks) if shares else 1


def lane_ranks_at_once(setting: GpuSetting, gpus: int) -> Callable[[CasePlan, PlannedArm], int]:
    """:func:`ranks_at_once` of any planned arm under ``setting`` (what the lane will choose),
    for the warm servers the sweep starts before the lane runs (``LocalLauncher.prewarm``)."""
    moved: dict[str, dict[str, frozenset[str]]] = {}

    def of(plan: CasePlan, arm: PlannedArm) -> int:
        if plan.case_id not in moved:
            moved[plan.case_id] = moved_figures(plan)
        return ranks_at_once(plan, arm, moved[plan.case_id][arm.name], setting, gpus)

    return of


def _task(index: int, plan: CasePlan, arm: PlannedArm, case_dir: Path, moved: frozenset[str],
          setting: GpuSetting, gpus: int) -> _Task:
    alone = _alone(plan, arm, moved, setting, gpus)
    task = _Task(index, plan, arm, case_dir, moved,
                 ranks_at_once(plan, arm, moved, setting, gpus), alone)
    if alone is not None:  # nothing starts beside it: the rule sees an arm that runs alone
        task.demand = ArmDemand(task.key, 0, moved | {STEP_TIME}, _seconds(arm), False)
    return task


def _demands(tasks: Sequence[_Task], gpus: int, target: MemoryTarget) -> dict[tuple[str, str], ArmDemand]:
    """Every task's demand (the memory plan's bytes; 0 for an arm this machine skips)."""
    predictions = Predictions(target)
    out = {}
    for t in tasks:
        moved = t.moved | ({STEP_TIME} if t.alone == COMMAND_CASE else frozenset())
        if skip_reason(t.plan, gpus) is not None or not runs_on_cuda(t.plan, gpus):
            size, predicted = 0, False
        else:
            ranks = t.arm.ranks if t.arm.emulated else tuple(range(t.arm.world_size))
            size, predicted = arm_bytes(t.plan, t.arm, ranks, t.together, predictions)
        out[t.key] = ArmDemand(t.key, size, moved, _seconds(t.arm, t.together), predicted)
    return out


def _target() -> MemoryTarget:
    from harness.memplan.fit import native_gqa_of

    try:
        import torch

        return MemoryTarget(native_gqa_of(torch.__version__))
    except Exception:
        return MemoryTarget()


def run_gpu_lane(cases: Sequence[tuple[int, CasePlan]], total: int, out_dir: Path,
                 launcher: ArmLauncher, shown: Any, verdicts: dict[str, CaseVerdict],
                 setting: GpuSetting, gpus: int,
                 hold_still: Callable[[], ContextManager[Any]],
                 needs_run: Callable[[PlannedArm, Path], bool],
                 run_arm: Callable[..., ArmOutcome]) -> None:
    """Run the arms of ``cases`` (index in the sweep, plan) not yet complete under ``setting``
    (module doc), judge each case once its arms ended (into ``verdicts``), and record each arm's
    placement. ``hold_still()``: the context in which nothing else of the sweep runs (the CPU
    lane stands still) while an arm whose step time is judged runs. ``shown`` is called from
    several threads: a serialised progress display. ``needs_run(arm, arm_dir)`` and
    ``run_arm(launcher, plan, arm, arm_dir, case_json, on_start)``: the lanes' rules
    (``lanes.runs_again``, ``lanes.run_arm_into``)."""
    out_dir = Path(out_dir)
    tasks: list[_Task] = []
    left: dict[str, int] = {}
    for index, plan in cases:
        moved = moved_figures(plan)
        tasks += arms_to_run(
            index, plan, out_dir, shown, verdicts, left, needs_run,
            lambda arm, case_dir: _task(index, plan, arm, case_dir, moved[arm.name], setting, gpus))
    if not tasks:
        return
    record = Placement(setting.jobs, setting.capacity, setting.per_process_memory, (), setting.note)
    pool = ThreadPoolExecutor(max_workers=setting.jobs, thread_name_prefix="gpu-arm")
    # alone: first those a neighbour's memory would move (the memory plan is computed meanwhile),
    # last those whose step time is judged (the CPU lane has ended by then: nothing to hold still)
    alone = [t for t in tasks if t.alone is not None] if setting.jobs > 1 else []
    last = [t for t in alone if STEP_TIME in t.moved or t.alone == COMMAND_CASE]
    first = [t for t in alone if t not in last]
    later = [t for t in tasks if t not in alone]
    by_key = {t.key: t for t in tasks}
    predicted: "Future[dict[tuple[str, str], ArmDemand]]"
    if setting.jobs > 1:  # planned while the arms that run alone run
        planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-plan")
        predicted = planner.submit(_demands, later, gpus, _target())
        planner.shutdown(wait=False)
    else:
        predicted = Future()
        predicted.set_result({t.key: ArmDemand(t.key, 0, t.moved, _seconds(t.arm), False)
                              for t in later})
    running: dict[Future, _Task] = {}
    pending: Optional[list[ArmDemand]] = None
    try:
        with stopping_on_exit(launcher):
            while first or later or last or running:
                started = False
                if first and not running:
                    _start(first.pop(0), pool, running, launcher, shown, hold_still, run_arm)
                    continue
                if not first and not later and last and not running:
                    _start(last.pop(0), pool, running, launcher, shown, hold_still, run_arm)
                    continue
                if not first and later:
                    if pending is None:
                        demands = predicted.result()
                        for t in later:
                            t.demand = demands[t.key]
                        pending = [t.demand for t in later if t.demand is not None]
                        if setting.jobs > 1:
                            pending = order(pending, setting.per_process_memory)
                    arm = next_arm(pending, [t.demand for t in running.values() if t.demand is not None],
                                   setting.capacity, setting.jobs, setting.per_process_memory)
                    if arm is not None:
                        pending.remove(arm)
                        later.remove(by_key[arm.key])
                        _start(by_key[arm.key], pool, running, launcher, shown, hold_still, run_arm)
                        started = True
                if started:
                    continue
                done, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                for fut in done:
                    t = running.pop(fut)
                    outcome = fut.result()  # KeyboardInterrupt of a stopped arm: raised here
                    ended = time.time()
                    shown.arm_finished(t.plan.title, t.arm.name, outcome)
                    demand = t.demand or ArmDemand(t.key, 0, t.moved, predicted=False)
                    record_placed(out_dir, record, PlacedArm(
                        case_id=t.plan.case_id, arm=t.arm.name, bytes=demand.bytes,
                        predicted=demand.predicted, ranks_at_once=t.together, started_at=t.started,
                        ended_at=ended, alone=t.alone or (alone_reason(demand, setting.per_process_memory)
                                                          if setting.jobs > 1 else "--gpu-jobs 1"),
                        beside=tuple(sorted(t.beside))))
                    left[t.plan.case_id] -= 1
                    if not left[t.plan.case_id]:
                        judge_into(t.plan, t.case_dir, shown, verdicts)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)



def _start(t: _Task, pool: ThreadPoolExecutor, running: dict[Future, _Task],
           launcher: ArmLauncher, shown: Any, hold_still: Callable[[], ContextManager[Any]],
           run_arm: Callable[..., ArmOutcome]) -> None:
    t.started = time.time()
    for other in running.values():
        other.beside.add(t.label)
        t.beside.add(other.label)
    runner = launcher
    if t.together > 1 and hasattr(launcher, "with_ranks_per_gpu"):
        runner = launcher.with_ranks_per_gpu(t.together)  # type: ignore[attr-defined]
    hold = hold_still if STEP_TIME in t.moved or t.alone == COMMAND_CASE else nullcontext
    arm_dir = t.case_dir / t.arm.name

    def work() -> ArmOutcome:
        with hold():
            return run_arm(runner, t.plan, t.arm, arm_dir, t.case_dir / CASE_FILE,
                                on_start=lambda: shown.arm_started(t.plan.title, t.arm.name,
                                                                   arm_dir, t.plan.steps))

    running[pool.submit(work)] = t

