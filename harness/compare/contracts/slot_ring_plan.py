"""``slot_ring_plan``: the slot planner's figures of a graph arm over the microbatch counts of
``compare.slot_ring`` (entry ``slot_ring-plan``; no arm runs for it). The planner
(``harness.arms.ring_figures``: ``slotmem.plan_pipeline`` as the capture calls it) is asked when
the sweep is planned, on any machine, and its figures are kept in the plan; once the counts wrap
the ring (``harness.compare.ring``), a larger count must not add a physical slot, a saved arena or
an input-grad arena on any PP rank."""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field

from harness.spec.names import SLOT_RING_PLAN
from harness.spec.schema import SlotRingContract

from ..pair import Pair
from ..registry import contract
from ..ring import not_wrapped, worst_growth, wrapped_counts
from ..series import Steps
from ..verdicts import Check

FIGURES = (("physical_slots", "physical slots"), ("saved_arenas", "saved arenas"),
           ("grad_arenas", "input-grad arenas"))


class RankRing(BaseModel):
    """One PP rank's slot plan at one count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    physical_slots: int = Field(ge=1)
    saved_arenas: int = Field(ge=0)
    grad_arenas: int = Field(ge=0)


class CountRing(BaseModel):
    """The slot plans of every PP rank at one microbatch count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    microbatches: int = Field(ge=1)
    ranks: list[RankRing] = Field(min_length=1)


class SlotRingPlanParams(SlotRingContract):
    """``compare.slot_ring`` plus the planner's figures per count (``harness.arms``)."""

    planned: list[CountRing]


@contract(SLOT_RING_PLAN, SlotRingPlanParams)
def slot_ring_plan(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: SlotRingPlanParams = pair.params
    by_count = {c.microbatches: c for c in p.planned}
    if sorted(by_count) != sorted(p.microbatches):
        raise ValueError(f"the plan holds slot plans for counts {sorted(by_count)}, the case asks "
                         f"for {sorted(p.microbatches)}")
    start, wrapping = wrapped_counts({m: c.ranks[0].physical_slots for m, c in by_count.items()})
    checks = []
    for key, what in FIGURES:
        shown = "; ".join(f"r{r}: " + ", ".join(f"{getattr(by_count[m].ranks[r], key)} at {m}"
                                                for m in sorted(by_count))
                          for r in range(len(by_count[min(by_count)].ranks)))
        if len(wrapping) < 2:
            checks.append(Check.not_applicable(f"{key}_flat", not_wrapped(shown)))
            continue
        worst, where, rank = worst_growth(
            {r: {c: float(getattr(by_count[c].ranks[r], key)) for c in wrapping}
             for r in range(len(by_count[start].ranks))}, start, relative=False)
        detail = (f"{what} per count ({shown}); the ring wraps from {start} microbatches on, and "
                  + (f"rank {rank} has {worst:+.0f} at {where} against {start}" if worst > 0
                     else f"no larger count adds any ({', '.join(map(str, wrapping))})"))
        checks.append(Check(f"{key}_flat", worst, 0.0, worst <= 0, detail))
    return tuple(checks)
