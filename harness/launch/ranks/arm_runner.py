"""The one arm runner: how an arm runs, decided once for every place it runs.

:func:`run_arm` asks the place first whether the arm runs there at all (``before``: this machine
skips a case it cannot place; a Slurm task beyond the arm's ranks sits it out), then picks the
arm's kind: a ``command:`` case's training command, an emulated case's ranks each alone, or the
built-in workload's ranks; an arm the harness interrupts (``compare.resume``) runs in legs
(:func:`run_legs`: stop after step K, then resume from K's checkpoint). A place (an
:class:`ArmPlace`) says only how each kind starts there: ``local.launcher.LocalLauncher`` (processes on
this machine) and ``slurm.job.TaskLauncher`` (one task of a Slurm job).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.launch.ranks.rank_main import arm_legs
from harness.launch.ranks.repro import repro_line
from harness.results import ArmOutcome


class ArmPlace(Protocol):
    """Where an arm runs: how each kind of arm starts there. ``python``: the interpreter the repro
    line names."""

    python: str

    def before(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> Optional[ArmOutcome]:
        """The arm's outcome when it does not run here (skipped, sat out), else None."""

    def command_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                    repro: str) -> ArmOutcome: ...

    def emulated_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                     repro: str) -> ArmOutcome: ...

    def builtin_arm(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path, case_json: Path,
                    repro: str) -> ArmOutcome: ...


def run_arm(place: ArmPlace, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
            case_json: Path) -> ArmOutcome:
    """Run ``arm`` of ``plan`` at ``place`` into ``arm_dir`` (module doc)."""
    arm_dir = Path(arm_dir)
    early = place.before(plan, arm, arm_dir)
    if early is not None:
        return early
    repro = repro_line(plan, arm, case_json, place.python)
    if plan.case.command is not None:  # a training command instead of the built-in workload
        return place.command_arm(plan, arm, arm_dir, repro)
    if arm.emulated:  # each emulated rank alone
        return place.emulated_arm(plan, arm, arm_dir, case_json, repro)
    return place.builtin_arm(plan, arm, arm_dir, case_json, repro)


def leg_name(arm: PlannedArm, leg: int) -> str:
    """``<arm>`` for the first leg, ``<arm>/leg<k>`` for leg k (a Slurm task's port key)."""
    return arm.name if leg == 0 else f"{arm.name}/leg{leg}"


def run_legs(arm: PlannedArm, run_leg: Callable[[int, Optional[int]], ArmOutcome]
             ) -> list[ArmOutcome]:
    """``run_leg(leg, stop)`` for each leg of ``arm`` (``rank_main.arm_legs``: ``stop`` the step
    the leg stops after, None for the last), until one does not end ``ok``; their outcomes."""
    outcomes: list[ArmOutcome] = []
    for leg, stop in enumerate(arm_legs(arm)):
        outcomes.append(run_leg(leg, stop))
        if not outcomes[-1].ok:
            break
    return outcomes


def joined(outcomes: Sequence[ArmOutcome], arm: PlannedArm) -> ArmOutcome:
    """One outcome of an arm run in legs: the last leg's, with the legs' wall time and restarts
    summed; an interrupted arm's detail says where it was stopped (and which leg failed)."""
    legs = arm_legs(arm)
    last = outcomes[-1]
    if len(legs) == 1:
        return last
    stop = legs[0]
    where = (f"stopped by the harness after step {stop} and resumed from its checkpoint"
             if len(outcomes) == len(legs) else f"its first leg (to step {stop}) did not finish")
    detail = f"{where}; {last.detail}" if last.detail else where
    return dataclasses.replace(last, wall_s=round(sum(o.wall_s for o in outcomes), 3),
                               restarts=sum(o.restarts for o in outcomes), detail=detail)
