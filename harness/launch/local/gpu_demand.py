"""What the placement rule (``launch.local.gpu_jobs``) needs to know of a planned arm: the figures a
neighbour on its GPU would move (from the case's pairs) and the bytes it is predicted to hold
(from the memory plan, ``harness.memplan``: what ``dcp-harness plan --memory`` prints).

* :func:`moved_figures`: per arm, ``step_time`` where a golden pair judges its step time
  (:func:`timing_judged_arms`), ``device_used`` where a pair judges the whole device's memory
  after ``empty_cache``: ``dcp_vs_fixed_cp`` (``device_delta_pct``, bounded by default on graph
  arms) and a golden pair with memory checks (``mem_device_used_bytes``).
* :func:`arm_bytes`: the arm's predicted peak on its GPU, per rank (``memplan.arm.arm_figures``),
  summed over the ranks that run at once on that GPU, plus :data:`gpu_jobs.PROCESS_OVERHEAD_BYTES`
  per process; an arm without a memory plan takes the case's largest prediction x
  ``UNPLANNED_FACTOR``, or ``UNPLANNED_DEFAULT_BYTES`` in a case without any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.launch.local.gpu_jobs import (
    DEVICE_USED,
    PROCESS_OVERHEAD_BYTES,
    STEP_TIME,
    UNPLANNED_DEFAULT_BYTES,
    UNPLANNED_FACTOR,
    ArmDemand,
)
from harness.memplan.records import MemoryTarget
from harness.spec.names import DCP_VS_FIXED_CP, GOLDEN


def timing_judged_arms(plan: CasePlan) -> frozenset[str]:
    """The arms whose step time a golden pair judges (``compare.golden.step_time``): nothing may
    run beside them, not even on other devices, while they run."""
    return frozenset(a for p in plan.pairs if p.contract == GOLDEN and p.skipped is None
                     and getattr(p.params, "step_time", None) is not None for a in p.arms)


def moved_figures(plan: CasePlan) -> dict[str, frozenset[str]]:
    """Arm name -> the judged figures of it a neighbour on its GPU would move (module doc)."""
    timing = timing_judged_arms(plan)
    device: set[str] = set()
    for p in plan.pairs:
        if p.skipped is not None:
            continue
        if p.contract == DCP_VS_FIXED_CP or (
                p.contract == GOLDEN and getattr(p.params, "memory", None) is not None):
            device.update(p.arms)
    return {a.name: frozenset(({STEP_TIME} if a.name in timing else set())
                              | ({DEVICE_USED} if a.name in device else set()))
            for a in plan.arms}


@dataclass
class Predictions:
    """The memory plan's peaks for ``target``, each layout planned once (arms of one layout, the
    same case under two ids, share a plan): :meth:`rank_peaks`."""

    target: MemoryTarget
    _seen: dict[tuple[str, tuple[int, ...]], Optional[dict[int, int]]] = field(default_factory=dict)

    def rank_peaks(self, arm: PlannedArm, ranks: Sequence[int]) -> Optional[dict[int, int]]:
        """Rank -> predicted peak bytes of ``arm`` on that rank (None: no memory plan)."""
        lay = arm.case.layout
        stages = tuple(sorted({lay.pp_rank(r) for r in ranks}))
        key = (arm.case.model_dump_json(), stages)
        if key not in self._seen:
            from harness.memplan.arm import arm_figures
            from harness.memplan.predict import MemoryPlanError, predict_case

            try:
                cm = predict_case(arm.case, self.target, pp_ranks=list(stages))
                self._seen[key] = {r.pp_rank: arm_figures(arm.case, r).peak_bytes for r in cm.ranks}
            except MemoryPlanError:
                self._seen[key] = None
        peaks = self._seen[key]
        return None if peaks is None else {r: peaks[lay.pp_rank(r)] for r in ranks}


def arm_bytes(plan: CasePlan, arm: PlannedArm, ranks: Sequence[int], together: int,
              predictions: Predictions) -> tuple[int, bool]:
    """(bytes on the GPU, predicted) of ``arm`` whose ``ranks`` run on one GPU, ``together`` of
    them at once (module doc)."""
    peaks = predictions.rank_peaks(arm, ranks)
    if peaks is None:
        others = [max(p.values()) for a in plan.arms if a is not arm
                  for p in [predictions.rank_peaks(a, ranks)] if p]
        each = int(max(others) * UNPLANNED_FACTOR) if others else UNPLANNED_DEFAULT_BYTES
        return together * (each + PROCESS_OVERHEAD_BYTES), False
    largest = sorted(peaks.values(), reverse=True)[:max(1, together)]
    return sum(largest) + len(largest) * PROCESS_OVERHEAD_BYTES, True


def arm_demand(plan: CasePlan, arm: PlannedArm, ranks: Sequence[int], together: int,
               predictions: Predictions, seconds: float = 1.0,
               moved: Optional[frozenset[str]] = None) -> ArmDemand:
    """The placement rule's view of ``arm`` (``gpu_jobs.ArmDemand``)."""
    size, predicted = arm_bytes(plan, arm, ranks, together, predictions)
    figures = moved if moved is not None else moved_figures(plan)[arm.name]
    return ArmDemand((plan.case_id, arm.name), size, figures, seconds, predicted)
