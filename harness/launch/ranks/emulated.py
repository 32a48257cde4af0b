"""Run one arm of an emulated case: each emulated rank in a process of its own, alone on a device.

Every rank of an emulated arm (``PlannedArm.emulated``, ``ranks`` = the emulated ranks of an
``N``-rank world) runs as ``python -m harness.launch.ranks.rank_main ... --emulate-rank R``: rank R of the
world alone, its communication on the loopback layer, on one GPU (``CUDA_VISIBLE_DEVICES`` = that
GPU) or, where the case allows it (eager) and there is no GPU, on the CPU. With several GPUs the
ranks run side by side, one per GPU (the next rank starts on the GPU that a finished one left);
with one GPU (or the CPU) one after another. Each (arm, rank) is its own process, so the whole-device memory a rank
records includes nothing another arm or rank loaded (a process's CUDA context, cached kernels and
allocator are gone when it exits). Both launchers run emulated arms here: the local one with the
GPUs it sees, a Slurm job's task with the GPUs of its allocation (``slurm.job``).

Each rank's process has the arm's time limit to itself (``resources.time_min``: one emulated rank
does the work one rank of the real run does). A rank that fails does not stop the others (what a
rank that fits measures is worth having beside one that does not); the arm's outcome is the
worst of its ranks', every rank named by its label (``emulated rank r of N ...``).
"""

from __future__ import annotations

import os
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.launch.ranks.completion import rank_is_complete
from harness.launch.ranks.placement import runs_on_cuda
from harness.launch.ranks.processes import RankCommand, cpu_pinned, rank_main_argv, run_ranks
from harness.launch.ranks.repro import repro_line
from harness.launch.ranks.variation import variation
from harness.results import LOG_FILE, ArmOutcome
from harness.spec.places import rank_place

# The outcome of an arm whose ranks ended differently: the first of these among them.
_WORST_FIRST = ("failed", "timeout", "infra")


def visible_gpus(environ: Mapping[str, str], count: int) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each of the ``count`` GPUs this process sees (its own
    ``CUDA_VISIBLE_DEVICES`` entries where set, else ``0..count-1``)."""
    given = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if given:
        return given[:count]
    return [str(i) for i in range(count)]


@dataclass(frozen=True)
class RankRun:
    """How one emulated rank's process ended."""

    rank: int
    label: str
    outcome: ArmOutcome


def combine(runs: Sequence[RankRun], repro: str, wall_s: Optional[float] = None) -> ArmOutcome:
    """One outcome for the arm: ``ok`` when every rank's was, else the worst (failed, timeout,
    infra), its detail naming each rank that was not ok by its label. ``wall_s``: the arm's
    launch to exit (ranks side by side overlap); None: the ranks' walls summed (one after
    another)."""
    bad = [r for r in runs if not r.outcome.ok]
    wall = round(sum(r.outcome.wall_s for r in runs) if wall_s is None else wall_s, 3)
    if not bad:
        return ArmOutcome(status="ok", returncode=0, wall_s=wall, repro=repro,
                          detail="; ".join(f"{r.label}: ok" for r in runs))
    worst = min(bad, key=lambda r: _WORST_FIRST.index(r.outcome.status)
                if r.outcome.status in _WORST_FIRST else len(_WORST_FIRST))
    detail = "; ".join(f"{r.label}: " + (r.outcome.detail or r.outcome.status) if not r.outcome.ok
                       else f"{r.label}: ok" for r in runs)
    tails = "\n".join(f"--- {r.label} ---\n{r.outcome.log_tail}" for r in bad if r.outcome.log_tail)
    return ArmOutcome(status=worst.outcome.status, returncode=worst.outcome.returncode, wall_s=wall,
                      log_tail=tails, repro=repro, restarts=max(r.outcome.restarts for r in runs),
                      detail=detail, cause=worst.outcome.cause)


RunRanks = Callable[..., ArmOutcome]


def side_by_side(arm: PlannedArm, gpus: Sequence[str], per_gpu: int = 1) -> int:
    """How many of ``arm``'s emulated ranks run at once on ``gpus``: ``per_gpu`` per GPU (one
    unless the local GPU lane lets the arm's ranks share one: ``launch.local.gpu_lane``), one on
    the CPU."""
    return max(1, min(len(gpus) * max(1, per_gpu), len(arm.ranks)))


def _slots(gpus: Sequence[str], side: int) -> list[Optional[str]]:
    """The GPU of each rank running at once: the GPUs in turn, ``side`` in all (CPU: None)."""
    return [gpus[i % len(gpus)] for i in range(side)] if gpus else [None]


def emulated_rank_command(arm: PlannedArm, arm_dir: Path, case_json: Path, *, rank: int,
                          gpu: Optional[str], side: int, timeout_s: float, python: str,
                          repro: str) -> RankCommand:
    """The command of emulated rank ``rank`` of ``arm`` alone on ``gpu`` (its
    ``CUDA_VISIBLE_DEVICES`` value; None: on the CPU, GPUs hidden), ``side`` ranks side by side
    sharing the CPU's threads."""
    argv = rank_main_argv(python, case_json, arm.name, arm_dir)
    env = cpu_pinned({} if gpu is not None else {"CUDA_VISIBLE_DEVICES": ""})
    if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in env:
        # GPU ranks side by side share the CPU's threads
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // side))
    return RankCommand(argv=argv, world_size=arm.world_size, arm_dir=arm_dir, timeout_s=timeout_s,
                       env=env, repro=repro, ranks=(rank,), emulated=True,
                       devices={rank: gpu} if gpu is not None else {},
                       variation=variation(arm.case.execution.vary_processes))


def run_emulated_arm(plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path, *,
                     gpus: Sequence[str], timeout_s: float, python: str, repro: str,
                     run: Optional[RunRanks] = None, stack_wait_s: float = 3.0,
                     kill_grace_s: float = 5.0, per_gpu: int = 1) -> ArmOutcome:
    """Run every rank of emulated ``arm`` (see the module doc) on ``gpus`` (``CUDA_VISIBLE_DEVICES``
    values: ``per_gpu`` ranks per GPU at a time, side by side; empty: on the CPU, one after
    another, GPUs hidden); never raises for a failing rank. ``run``: ``processes.run_ranks``
    (the default)."""
    run = run or run_ranks
    started = time.monotonic()
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    labels = {r: rank_place(arm.case, r).label() for r in arm.ranks}
    side = side_by_side(arm, gpus, per_gpu)
    free: "queue.Queue[Optional[str]]" = queue.Queue()
    for gpu in _slots(gpus, side):
        free.put(gpu)

    def one(rank: int) -> RankRun:
        if rank_is_complete(arm, arm_dir, rank):  # a resumed arm: this rank has every step
            return RankRun(rank, labels[rank], ArmOutcome(status="ok", returncode=0,
                                                          detail="already complete"))
        gpu = free.get()
        try:
            where = f"GPU {gpu} (CUDA_VISIBLE_DEVICES={gpu})" if gpu is not None else "the CPU"
            with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
                log.write(f"[launcher] case {plan.case_id} arm {arm.name}: {labels[rank]} alone on "
                          f"{where}; communication on the loopback layer\n")
            cmd = emulated_rank_command(arm, arm_dir, case_json, rank=rank, gpu=gpu, side=side,
                                        timeout_s=timeout_s, python=python, repro=repro)
            outcome = run(cmd, stack_wait_s=stack_wait_s, kill_grace_s=kill_grace_s, port_retries=0)
            return RankRun(rank, labels[rank], outcome)
        finally:
            free.put(gpu)

    if side == 1:
        runs = [one(r) for r in arm.ranks]
    else:
        with ThreadPoolExecutor(max_workers=side) as pool:
            runs = list(pool.map(one, arm.ranks))
    # launch to exit: the ranks' walls summed would count twice the time ranks side by side share
    return combine(runs, repro, wall_s=time.monotonic() - started)


@dataclass(frozen=True)
class EmulatedLauncher:
    """The launcher (``launch.arm_launcher.ArmLauncher``) of an emulated arm, for this machine and for
    a Slurm job's task alike: its ranks on the ``gpus`` CUDA GPUs this process sees where the case
    runs on CUDA (``placement.runs_on_cuda``), else on the CPU; each rank with ``timeout_s``; the
    repro line of ``launch.ranks.repro``. ``run``: ``processes.run_ranks`` (the default) or one with a
    warm starter."""

    gpus: int
    timeout_s: float
    python: str = sys.executable
    run: Optional[RunRanks] = None
    stack_wait_s: float = 3.0
    kill_grace_s: float = 5.0
    per_gpu: int = 1  # emulated ranks side by side on one GPU (the local GPU lane's choice)

    def run_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                case_json: Path) -> ArmOutcome:
        """Every rank of emulated ``arm`` (:func:`run_emulated_arm`); never raises for a failing
        rank."""
        return run_emulated_arm(plan, arm, arm_dir, case_json, gpus=self._seen(plan),
                                timeout_s=self.timeout_s, python=self.python,
                                repro=repro_line(plan, arm, case_json, self.python),
                                run=self.run, stack_wait_s=self.stack_wait_s,
                                kill_grace_s=self.kill_grace_s, per_gpu=self.per_gpu)

    def first_commands(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                       case_json: Path) -> list["RankCommand"]:
        """The command of ``arm``'s first rank on each device its ranks will use (one per rank
        environment ``run_arm`` makes: what a warm start prepares)."""
        seen = self._seen(plan)
        side = side_by_side(arm, seen, self.per_gpu)
        return [emulated_rank_command(arm, Path(arm_dir), case_json, rank=arm.ranks[0], gpu=gpu,
                                      side=side, timeout_s=self.timeout_s, python=self.python,
                                      repro="")
                for gpu in dict.fromkeys(_slots(seen, side))]

    def _seen(self, plan: CasePlan) -> list[str]:
        return visible_gpus(os.environ, self.gpus) if runs_on_cuda(plan, self.gpus) else []
