"""How long the arms of a planned case will take on this machine, from what arms took before.

The figures come from finished arm folders (``harness.results.timing``: the outcome's
launch-to-exit wall time, the ranks' phase marks): an earlier sweep's (``results/latest``) and the
arms a running sweep has finished. An arm is estimated, best first, from

* ``measured``: the same case's same arm, run on the same kind of device: its fixed cost (wall
  time less its steps) per run, plus the planned steps at its seconds per step;
* ``similar``: arms of the same shape (as many ranks, emulated or not, on the same kind of
  device): their median fixed cost per run and median seconds per step;
* ``skipped``: the case cannot run here (``placement.skip_reason``): 0 s;
* ``unknown``: nothing like it was measured.

A run is one process per rank started and ended: an arm the harness interrupts
(``compare.resume``) has two, an emulated arm one per emulated rank (on the CPU or one GPU they
run one after another). Judging and reports are not included (well under a second per case on
the CPU focused suite: ``bench/arm_phases.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Optional, Sequence

from harness.caseplan import PLAN_FILE, CasePlan, PlanError, PlannedArm, read_plan
from harness.launch.ranks.placement import runs_on_cuda, skip_reason
from harness.launch.ranks.rank_main import arm_legs
from harness.results import ResultsError
from harness.results.timing import ArmTiming, arm_timing, checkpoint_rule

Basis = Literal["measured", "similar", "skipped", "unknown"]  # how an estimate is known


@dataclass(frozen=True)
class MeasuredArm:
    """A finished arm's figures and what it was: case, arm, ranks, emulated, device lane."""

    case_id: str
    arm: str
    ranks: int
    emulated: bool
    lane: str  # cpu | cuda
    timing: ArmTiming

    @property
    def fixed_per_run_s(self) -> float:
        return (self.timing.fixed_s or 0.0) / max(1, self.timing.runs)


@dataclass(frozen=True)
class Estimate:
    """Seconds an arm (or a case: the sum of its arms) will take, and how that is known."""

    seconds: Optional[float]
    basis: Basis
    detail: str = ""


def lane_of(device: Optional[str]) -> Optional[str]:
    """``cpu`` or ``cuda`` of a rank's device (``cuda:0`` -> ``cuda``); None when unknown."""
    if not device:
        return None
    return "cuda" if "cuda" in device else "cpu"


def measure_arm(plan: CasePlan, arm: PlannedArm, arm_dir: Path) -> Optional[MeasuredArm]:
    """The figures of a finished arm folder; None when it did not run to the end (no outcome
    ``ok``, no phase marks)."""
    timing = arm_timing(arm_dir, checkpoint_rule(arm.case.train.checkpoint_every))
    lane = lane_of(timing.device)
    if timing.status != "ok" or lane is None or timing.wall_s is None or not timing.run_steps:
        return None
    return MeasuredArm(plan.case_id, arm.name, len(arm.ranks), arm.emulated, lane, timing)


def measure_sweep(sweep_dir: Path) -> list[MeasuredArm]:
    """Every finished arm of a sweep folder (none when it is not one, or is unreadable)."""
    out: list[MeasuredArm] = []
    root = Path(sweep_dir)
    if not root.is_dir():
        return out
    for case_dir in sorted(p for p in root.iterdir() if (p / PLAN_FILE).is_file()):
        try:
            plan = read_plan(case_dir)
            out += [m for a in plan.arms if (m := measure_arm(plan, a, case_dir / a.name))]
        except (PlanError, ResultsError, OSError, ValueError):
            continue  # a case folder that cannot be read gives no figures
    return out


def planned_runs(arm: PlannedArm) -> int:
    """Processes per rank started one after another for ``arm`` (see the module doc)."""
    return len(arm_legs(arm)) * (len(arm.ranks) if arm.emulated else 1)


def _from(arm: PlannedArm, fixed_per_run: float, per_step: float) -> float:
    steps = arm.case.train.steps * (len(arm.ranks) if arm.emulated else 1)
    return fixed_per_run * planned_runs(arm) + steps * per_step


def estimate_arm(plan: CasePlan, arm: PlannedArm, gpus: int,
                 measured: Sequence[MeasuredArm]) -> Estimate:
    """How long ``arm`` of ``plan`` will take on a machine with ``gpus`` CUDA GPUs (see the
    module doc); ``measured``: the arms to learn from, the better ones first."""
    why = skip_reason(plan, gpus)
    if why is not None:
        return Estimate(0.0, "skipped", why)
    lane = "cuda" if runs_on_cuda(plan, gpus) else "cpu"
    same = [m for m in measured if (m.case_id, m.arm, m.lane) == (plan.case_id, arm.name, lane)]
    if same:
        m = same[0]
        return Estimate(_from(arm, m.fixed_per_run_s, m.timing.per_step_s or 0.0), "measured")
    like = [m for m in measured
            if (m.ranks, m.emulated, m.lane) == (len(arm.ranks), arm.emulated, lane)]
    if like:
        fixed = statistics.median(m.fixed_per_run_s for m in like)
        per_step = statistics.median(m.timing.per_step_s or 0.0 for m in like)
        return Estimate(_from(arm, fixed, per_step), "similar",
                        f"{len(like)} arm(s) of {len(arm.ranks)} {lane} rank(s)")
    return Estimate(None, "unknown")


@dataclass(frozen=True)
class Total:
    """Several arms' estimates: the seconds of those known, and how many are not."""

    seconds: float
    unknown: int
    arms: int

    def text(self) -> str:
        """``~95 s``, ``at least ~40 s (2 of 5 arm(s) not estimable yet)``, or "" when nothing
        that takes time is known yet."""
        if not self.unknown:
            return f"~{self.seconds:.0f} s"
        if self.seconds < 1.0:
            return ""
        return (f"at least ~{self.seconds:.0f} s ({self.unknown} of {self.arms} arm(s) not "
                "estimable yet)")


def add_estimates(items: Iterable[Estimate]) -> Total:
    """The total of several arms' estimates."""
    items = list(items)
    return Total(sum(e.seconds for e in items if e.seconds is not None),
                 sum(1 for e in items if e.seconds is None), len(items))


@dataclass(frozen=True)
class CaseEstimate:
    """A case's arms' estimates: their total, and how many of them are measured, like measured
    ones, or unknown; ``skipped``: why this machine skips the case (None: it runs)."""

    total: Total
    measured: int
    similar: int
    skipped: Optional[str]


def estimate_case(plan: CasePlan, gpus: int, measured: Sequence[MeasuredArm]) -> CaseEstimate:
    """Every arm of ``plan`` estimated (:func:`estimate_arm`) and added up."""
    arms = [estimate_arm(plan, arm, gpus, measured) for arm in plan.arms]
    return CaseEstimate(add_estimates(arms), sum(1 for e in arms if e.basis == "measured"),
                        sum(1 for e in arms if e.basis == "similar"), skip_reason(plan, gpus))
