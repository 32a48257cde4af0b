"""The local backend's arm runner: run one arm of a case on this machine, one process per rank
(``ranks.processes``).

Every arm of a case trains on CUDA (NCCL) when this machine has a CUDA GPU for every rank of the
case's largest arm, otherwise on CPU (gloo; GPUs hidden from the ranks); a case that needs CUDA and
cannot have it here is skipped with the reason (``placement``). An arm of an emulated case runs
each of its ranks alone in a process of its own (``ranks.emulated``), a command case its training
command (``ranks.command``); an arm with ``interrupt_after`` runs in two legs. Nothing here raises
for a failing arm.

    python -m harness.launch.local --case CASE_JSON --arm NAME --out ARM_DIR [--timeout-min M]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.errors import ConfigError
from harness.launch.ranks.arm_runner import joined, run_arm, run_legs
from harness.launch.ranks.command import run_command_arm
from harness.launch.ranks.emulated import EmulatedLauncher
from harness.launch.ranks.placement import runs_on_cuda, skip_reason
from harness.launch.ranks.processes import (RankCommand, cpu_pinned, cuda_device_count, device_env,
                                            rank_main_argv, run_ranks)
from harness.launch.ranks.rank_main import read_plan_beside
from harness.launch.ranks.warm import WarmStarter
from harness.launch.ranks.variation import variation
from harness.results import CASE_FILE, LOG_FILE, ArmOutcome, write_outcome


# --------------------------------------------------------------------------- the launcher
@dataclass(frozen=True)
class LocalLauncher:
    """Runs arms on this machine. ``timeout_min`` overrides ``case.resources.time_min``.
    ``warm``: fork the built-in workload's rank processes from warm servers that imported torch
    and the workload once (``harness.launch.ranks.warm``); False starts every one afresh. Use it as a
    context manager (or call :meth:`close`) so the servers end with the sweep."""

    timeout_min: Optional[float] = None
    python: str = sys.executable
    stack_wait_s: float = 3.0
    kill_grace_s: float = 5.0
    port_retries: int = 3
    warm: bool = True
    ranks_per_gpu: int = 1  # an emulated arm's ranks side by side on one GPU (the GPU lane's)
    # Set by stop(): the arms running in other threads end their ranks (Ctrl-C reaches only one).
    stop_event: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    starter: Optional[WarmStarter] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.warm and self.starter is None:
            object.__setattr__(self, "starter", WarmStarter(python=self.python))

    def __enter__(self) -> "LocalLauncher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the warm servers (a later arm starts new ones)."""
        if self.starter is not None:
            self.starter.close()
            object.__setattr__(self, "starter", WarmStarter(python=self.python))

    def with_ranks_per_gpu(self, n: int) -> "LocalLauncher":
        """This launcher (its warm servers, its stop) running an emulated arm's ranks ``n`` at
        a time on one GPU (``launch.local.gpu_lane``)."""
        return dataclasses.replace(self, ranks_per_gpu=n)

    def stop(self) -> None:
        """End the ranks of every arm this launcher runs in another thread (the sweep was
        interrupted); each such ``run_arm`` raises KeyboardInterrupt once its ranks are ended."""
        self.stop_event.set()

    def timeout_s(self, plan: CasePlan) -> float:
        minutes = self.timeout_min if self.timeout_min is not None else plan.case.resources.time_min
        return 60.0 * minutes

    def run_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                case_json: Path) -> ArmOutcome:
        """Run every rank of ``arm`` (``arm_runner.run_arm``: this machine is the place); never
        raises for a failing arm (see :class:`ArmOutcome`)."""
        return run_arm(self, plan, arm, arm_dir, case_json)

    # ------------------------------------------------------------ the place (arm_runner.ArmPlace)
    def before(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> Optional[ArmOutcome]:
        """A ``skipped`` outcome for a case this machine cannot place (``placement``), logged."""
        arm_dir.mkdir(parents=True, exist_ok=True)
        skip = skip_reason(plan, cuda_device_count())
        if skip is None:
            return None
        with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"[launcher] case {plan.case_id} arm {arm.name}: skipped: {skip}\n")
        return ArmOutcome(status="skipped", detail=skip)

    def command_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                    repro: str) -> ArmOutcome:
        return run_command_arm(plan, arm, arm_dir, self.timeout_s(plan), cuda_device_count(),
                               repro, stack_wait_s=self.stack_wait_s,
                               kill_grace_s=self.kill_grace_s)

    def emulated_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                     repro: str) -> ArmOutcome:
        # on one GPU (side by side on several) or the CPU; the same repro line
        return self._emulated(plan, cuda_device_count()).run_arm(plan, arm, arm_dir, case_json)

    def builtin_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                    repro: str) -> ArmOutcome:
        """A process per rank, each leg of an interrupted arm started afresh within what is left
        of the arm's time limit."""
        gpus = cuda_device_count()
        with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"[launcher] case {plan.case_id} arm {arm.name}: "
                      f"{self._device(plan, arm, gpus)[1]}\n")
        spent: list[float] = []

        def leg(index: int, stop: Optional[int]) -> ArmOutcome:
            if stop is not None:
                with open(arm_dir / LOG_FILE, "a", encoding="utf-8") as log:
                    log.write(f"[launcher] case {plan.case_id} arm {arm.name}: stopping its ranks "
                              f"after step {stop} (compare.resume), then starting them again from "
                              "that checkpoint\n")
            left = self.timeout_s(plan) - sum(spent)
            cmd = self._command(plan, arm, arm_dir, case_json, gpus, stop=stop,
                                timeout_s=max(left, 1.0), repro=repro)
            outcome = run_ranks(cmd, stack_wait_s=self.stack_wait_s,
                                kill_grace_s=self.kill_grace_s, port_retries=self.port_retries,
                                starter=self.starter)
            spent.append(outcome.wall_s)
            return outcome

        return joined(run_legs(arm, leg), arm)

    def prewarm(self, plans: Sequence[CasePlan], out_dir: Path,
                needs_run: Callable[[PlannedArm, Path], bool],
                ranks_per_gpu: Optional[Callable[[CasePlan, PlannedArm], int]] = None) -> int:
        """Start, without waiting for them, the warm servers the arms of ``plans`` that
        ``needs_run(arm, arm_dir)`` will fork their ranks from (each imports torch and the
        workload: 5-12 s that the first arm of each rank environment would otherwise wait for).
        ``ranks_per_gpu(plan, arm)``: the emulated ranks the GPU lane will run at once on one
        GPU (``gpu_lane.lane_ranks_at_once``; default this launcher's ``ranks_per_gpu``): their
        environment, hence their server, depends on it. Nothing without a warm starter; the
        number of servers started."""
        if self.starter is None:
            return 0
        gpus = cuda_device_count()
        started = 0
        for plan in plans:
            if skip_reason(plan, gpus) is not None or plan.case.command is not None:
                continue
            case_dir = Path(out_dir) / plan.case_id
            for arm in plan.arms:
                if not needs_run(arm, case_dir / arm.name):
                    continue
                runner = (self if ranks_per_gpu is None
                          else self.with_ranks_per_gpu(ranks_per_gpu(plan, arm)))
                for cmd in runner._first_commands(plan, arm, case_dir, gpus):
                    if cmd.variation.cold_start:  # started cold: no server to wait for
                        continue
                    rank = cmd.started[0]
                    started += self.starter.prewarm(cmd.argv_of(rank),
                                                    cmd.env_of(os.environ, rank, 0))
        return started

    def prewarm_cpu(self, plans: Sequence[CasePlan]) -> int:
        """Start, before preflight packs the steps of ``plans`` (which imports torch), the warm
        server that the built-in ranks on the CPU of a machine without GPUs fork from, where an
        arm of ``plans`` will (a built-in case placed here, an arm not started cold:
        ``ranks.variation``): their environment is the same for every arm there
        (:meth:`cpu_rank_command`), so the server imports beside the preflight instead of beside
        the first arms, on a core the preflight leaves idle. :meth:`prewarm` then finds it
        started. 1 when a server was started."""
        if self.starter is None or cuda_device_count():
            return 0
        if not any(skip_reason(plan, 0) is None and plan.case.command is None
                   and not variation(arm.case.execution.vary_processes).cold_start
                   for plan in plans for arm in plan.arms):
            return 0
        cmd = self.cpu_rank_command()
        return self.starter.prewarm(cmd.argv, cmd.env_of(os.environ, 0, 0))

    def cpu_rank_command(self, case_json: Path = Path(CASE_FILE), arm: str = "arm",
                         arm_dir: Path = Path("arm"), world_size: int = 1) -> RankCommand:
        """The rank processes of a built-in arm on the CPU of a machine without GPUs, started
        as every arm but the varied ones (``ranks.variation.FIRST``)."""
        return RankCommand(argv=rank_main_argv(self.python, case_json, arm, arm_dir),
                           world_size=world_size, arm_dir=arm_dir, timeout_s=1.0,
                           env=cpu_pinned(device_env(world_size, 0)[0]))

    def _first_commands(self, plan: CasePlan, arm: PlannedArm, case_dir: Path,
                        gpus: int) -> list[RankCommand]:
        arm_dir, case_json = case_dir / arm.name, case_dir / CASE_FILE
        if arm.emulated:
            return self._emulated(plan, gpus).first_commands(plan, arm, arm_dir, case_json)
        return [self._command(plan, arm, arm_dir, case_json, gpus, stop=None,
                              timeout_s=self.timeout_s(plan), repro="")]

    def _emulated(self, plan: CasePlan, gpus: int) -> EmulatedLauncher:
        return EmulatedLauncher(gpus, self.timeout_s(plan), self.python,
                                run=functools.partial(run_ranks, starter=self.starter),
                                stack_wait_s=self.stack_wait_s, kill_grace_s=self.kill_grace_s,
                                per_gpu=self.ranks_per_gpu)

    @staticmethod
    def _device(plan: CasePlan, arm: PlannedArm, gpus: int) -> tuple[dict[str, str], str]:
        extra, where = device_env(arm.world_size, gpus, plan.largest_arm.world_size)
        assert runs_on_cuda(plan, gpus) == (not extra)  # one rule for every arm of the case
        return extra, where

    def _command(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                 gpus: int, *, stop: Optional[int], timeout_s: float, repro: str) -> RankCommand:
        """The rank processes of one leg of built-in ``arm`` (``stop``: the step it stops after)."""
        argv = rank_main_argv(self.python, case_json, arm.name, arm_dir)
        return RankCommand(argv=argv + (("--stop-after", str(stop)) if stop is not None else ()),
                           world_size=arm.world_size, arm_dir=arm_dir, timeout_s=timeout_s,
                           env=cpu_pinned(self._device(plan, arm, gpus)[0]), repro=repro,
                           stop=self.stop_event,
                           variation=variation(arm.case.execution.vary_processes))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.launch.local",
                                description="Run one arm of a case on this machine.")
    p.add_argument("--case", required=True, type=Path, metavar="CASE_JSON")
    p.add_argument("--arm", required=True, metavar="NAME")
    p.add_argument("--out", required=True, type=Path, metavar="ARM_DIR")
    p.add_argument("--timeout-min", type=float, default=None, metavar="M")
    args = p.parse_args(argv)
    try:
        plan = read_plan_beside(args.case)
        arm = plan.arm(args.arm)
        if args.timeout_min is not None and not args.timeout_min > 0:
            raise ConfigError(f"--timeout-min must be a positive number of minutes, got {args.timeout_min}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with LocalLauncher(timeout_min=args.timeout_min) as launcher:
        outcome = launcher.run_arm(plan, arm, args.out, args.case)
    write_outcome(args.out, outcome)
    print(f"{plan.case_id} / {arm.name}: {outcome.describe()}  (log: {args.out / LOG_FILE})")
    if not outcome.ok:
        print(outcome.log_tail)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
