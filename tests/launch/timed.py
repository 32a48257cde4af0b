"""Finished sweeps with known figures, for the tests of the time estimates: every rank process of
every arm takes exactly ``FIXED_PER_RUN`` s besides its steps, each step exactly ``STEP_S``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from harness.arms import plan_case
from harness.caseplan import CasePlan, write_plan
from harness.launch.ranks.rank_main import arm_legs
from harness.results import ArmOutcome, record_json, write_outcome
from harness.results.phases import Leg, RankPhases, StepMark, phases_file
from harness.spec.loader import load_cases

STEP_S = 1.0
FIXED_PER_RUN = 2.0  # 1.8 s in the process (start to first step, after the last) + 0.2 s exit


def leg(t0: float, first: int, last: int, stop_after: Optional[int] = None) -> Leg:
    """A process started at ``t0`` running steps ``first..last``: 1.5 s to its first step,
    ``STEP_S`` per step back to back, 0.3 s after the last."""
    marks = tuple(StepMark(s, STEP_S, t0 + 1.5 + (i + 1) * STEP_S, t0 + 1.5 + (i + 1) * STEP_S)
                  for i, s in enumerate(range(first, last + 1)))
    trained = marks[-1].written_at + 0.2
    return Leg(pid=1, device="cpu", stop_after=stop_after, spawned_at=t0, main_at=t0 + 0.1,
               entered_at=t0 + 0.2, imported_at=t0 + 1.0, rendezvous_at=t0 + 1.1,
               build_started_at=t0 + 1.1, built_at=t0 + 1.2, steps=marks, trained_at=trained,
               done_at=trained + 0.1)


def finish_arm(plan: CasePlan, arm_name: str, arm_dir: Path, status: str = "ok") -> float:
    """Write a finished arm folder (outcome and every rank's marks); its wall time."""
    arm = plan.arm(arm_name)
    steps = arm.case.train.steps
    legs = arm_legs(arm)
    bounds = [(1, legs[0] or steps)] + ([(legs[0] + 1, steps)] if legs[0] is not None else [])
    arm_dir.mkdir(parents=True, exist_ok=True)
    t, wall = 1000.0, 0.0
    per_rank: dict[int, list[Leg]] = {r: [] for r in arm.ranks}
    runs = [[r] for r in arm.ranks] if arm.emulated else [list(arm.ranks)]
    for ranks in runs:
        for (first, last), stop in zip(bounds, legs):
            made = leg(t, first, last, stop)
            for r in ranks:
                per_rank[r].append(made)
            span = made.done_at - made.spawned_at
            t += span + 0.2
            wall += span + 0.2
    for r, made in per_rank.items():
        phases_file(arm_dir, r).write_text(json.dumps(record_json(RankPhases(r, tuple(made)))))
    write_outcome(arm_dir, ArmOutcome(status=status, returncode=0 if status == "ok" else 1,
                                      wall_s=wall))
    return wall


def finished_sweep(folder: Path, case_files: Sequence[Path]) -> tuple[Path, list[CasePlan]]:
    """A sweep folder of ``case_files``, every arm finished (:func:`finish_arm`)."""
    plans = [plan_case(c) for c in load_cases(list(case_files))]
    for plan in plans:
        case_dir = folder / plan.case_id
        case_dir.mkdir(parents=True)
        (case_dir / "case.json").write_text(json.dumps(plan.case.model_dump(mode="json")))
        write_plan(case_dir, plan)
        for arm in plan.arms:
            finish_arm(plan, arm.name, case_dir / arm.name)
    return folder, plans
