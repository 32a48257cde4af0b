"""``slot_ring``: graph memory flat in the microbatch count (``compare.slot_ring``), judged twice.

One graph arm per count of ``compare.slot_ring.microbatches`` (``graph-mb<M>``). From the first
count that wraps the slot ring (``harness.compare.ring``) on, a larger count must not grow

* (pair ``slot_ring``, CUDA) any rank's graph pool (``GraphStats.pool_reserved_bytes``) or arena
  backing (``arena_bytes``) by more than ``max_growth`` (relative), nor its physical slots;
* (pair ``slot_ring-plan``, contract ``slot_ring_plan``, any machine; no arm runs for it) the
  slot planner's physical slots, saved arenas or input-grad arenas on any PP rank. The planner
  (:func:`ring_figures`: ``slotmem.plan_pipeline`` as the capture calls it) is asked when the
  sweep is planned and its figures are kept in the plan."""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.spec.derive import ArmSpec
from harness.spec.limits import limit
from harness.spec.names import GRAPH, SLOT_RING, SLOT_RING_PLAN, SLOT_RING_PLAN_PAIR
from harness.spec.problems import Problem, at
from harness.spec.schema import ArmCase, Case, Strict

from ..pair import Pair
from ..registry import Comparison, Judged, Planner, register
from ..ring import not_wrapped, worst_growth, wrapped_counts
from ..series import MIB, Steps, graph_stats
from ..verdicts import Check


class SlotRingContract(Strict):
    """Graph memory flat in the microbatch count (a graph case with fixed CP and PP/VPP): one graph
    arm ``graph-mb<M>`` per count in ``microbatches`` (``train.microbatches = M``). Once a count
    outnumbers the slot ring (microbatches share physical slots), a larger count must not grow
    the plan's physical slots, saved-arena or input-grad-arena counts (checked from the slot
    planner, on any machine: entry ``slot_ring-plan``), nor the graph pool's and arenas' bytes of
    any rank (CUDA: entry ``slot_ring``) by more than ``max_growth`` (relative)."""

    microbatches: list[int] = Field(min_length=2)
    max_growth: float = Field(default=0.01, ge=0)

    @field_validator("microbatches")
    @classmethod
    def _sorted_counts(cls, v: list[int]) -> list[int]:
        if any(m < 1 for m in v):
            raise ValueError("microbatch counts must be >= 1")
        if len(set(v)) != len(v):
            raise ValueError(f"microbatches has repeated counts: {v}")
        if any(m > limit("train.microbatches") for m in v):
            raise ValueError(f"a count is above {limit('train.microbatches')} (train.microbatches' bound)")
        return sorted(v)


class SlotRingPairParams(SlotRingContract):
    """``compare.slot_ring`` plus each arm's microbatch count, in arm order."""

    counts: list[int]


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
    """``compare.slot_ring`` plus the planner's figures per count (:func:`ring_figures`)."""

    planned: list[CountRing]


def check_slot_ring(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """The graph pool's and arenas' bytes and the physical slots per rank, flat over the counts
    that wrap the ring (CUDA)."""
    p: SlotRingPairParams = pair.params
    if len(p.counts) != len(pair.arms):
        raise ValueError(f"pair '{pair.name}' has {len(pair.arms)} arms but {len(p.counts)} counts")
    stats = {m: graph_stats(data[a]) for m, a in zip(p.counts, pair.arms)}
    missing = [a for m, a in zip(p.counts, pair.arms) if not stats[m]]
    if missing:
        return (Check("graph_pool_flat", None, p.max_growth, False,
                      f"arm(s) {', '.join(missing)} recorded no capture (graph stats)"),)
    ranks = sorted(set.intersection(*(set(s) for s in stats.values())))
    slots = {m: stats[m][ranks[0]].physical_slots for m in stats}
    start, wrapping = wrapped_counts(slots)
    shown = ", ".join(f"{slots[m]} slots at {m}" for m in sorted(stats))
    if len(wrapping) < 2:
        why = not_wrapped(shown)
        return tuple(Check.not_applicable(n, why) for n in
                     ("physical_slots_flat", "graph_pool_flat", "arena_bytes_flat"))
    out = []
    for name, key, relative, bound in (
            ("physical_slots_flat", "physical_slots", False, 0.0),
            ("graph_pool_flat", "pool_reserved_bytes", True, p.max_growth),
            ("arena_bytes_flat", "arena_bytes", True, p.max_growth)):
        figs = {r: {m: float(getattr(stats[m][r], key)) for m in wrapping} for r in ranks}
        parts = [f"r{r} " + ", ".join(
            (f"{figs[r][c] / MIB:.1f} MiB" if relative else f"{figs[r][c]:.0f}") + f" at {c}"
            for c in wrapping) for r in ranks]
        worst, where, rank = worst_growth(figs, start, relative)
        change = f"{worst:+.2%}" if relative else f"{worst:+.0f}"
        detail = (f"{key} from {start} microbatches on (the ring wraps there; {shown}): "
                  + "; ".join(parts) + f"; largest growth {change} (rank {rank}, at {where})")
        out.append(Check(name, worst, bound, worst <= bound, detail))
    return tuple(out)


def check_slot_ring_plan(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """The planner's figures per count: no physical slot, saved arena or input-grad arena added
    once the counts wrap the ring (any machine; no arm runs for it)."""
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


def ring_figures(case: ArmCase) -> list[dict[str, int]]:
    """Per PP rank, what the slot planner gives a graph arm of ``case``: its physical slots and
    its saved-arena and input-grad-arena counts (``slotmem.plan_pipeline``, as the capture plans
    it: ``harness.graphplan``)."""
    from harness.graphplan.layout import case_graph_layout, rank_plans

    out = []
    for rank in range(case.layout.pp):
        (plan,) = rank_plans(case_graph_layout(case, rank), separate=False)
        out.append({"physical_slots": plan.physical_slots, "saved_arenas": plan.saved_colours,
                    "grad_arenas": plan.grad_colours})
    return out


class SlotRing(Comparison):
    name = SLOT_RING
    settings = SlotRingContract
    order = 80
    judged = {SLOT_RING_PLAN: Judged(SlotRingPlanParams, check_slot_ring_plan, figures=True),
              SLOT_RING: Judged(SlotRingPairParams, check_slot_ring, figures=True)}

    not_for_commands = "it runs the built-in graph pool per microbatch count"

    def rules(self, case: Case, settings: SlotRingContract) -> list[Problem]:
        """(Built-in workload) graph arms of a fixed-CP PP case, one per schedulable count."""
        if case.command is not None:
            return []
        lay = case.layout
        field = at("compare.slot_ring")
        if case.graphs is None:
            return [Problem(field, "runs one CUDA-graph arm per microbatch count: add a `graphs:` "
                                   "section (e.g. graphs: {scope: attn, warmup_steps: 2})")]
        if lay.dynamic:
            return [Problem(field, "needs a fixed microbatch count per step, so fixed CP "
                                   "(parallel.cp, not parallel.dynamic_cp): a dynamic-CP graph "
                                   "arm plans every count the packer can reach")]
        if lay.pp < 2:
            return [Problem(field, "the slot ring matters for pipelined schedules: needs "
                                   "parallel.pp >= 2 (and vpp >= 1)")]
        problems: list[Problem] = []
        most = lay.most_microbatches
        for m in settings.microbatches:
            why = lay.microbatch_count_problem(m)
            if why is None and m > most:
                why = (f"more microbatches than sequences per DP rank (global_batch "
                       f"{case.train.global_batch} / dp {lay.dp} = {most})")
            if why is not None:
                problems.append(Problem(at("compare.slot_ring.microbatches"), f"count {m}: {why}"))
        return problems

    def plan(self, case: Case, settings: SlotRingContract, planner: Planner) -> list[Pair]:
        """``graph-mb<M>`` per count (pair ``slot_ring``, the bytes on CUDA) and
        ``slot_ring-plan`` (no arm: the planner's figures per count, asked now)."""
        names, planned = [], []
        for m in settings.microbatches:
            name = planner.add(ArmSpec(GRAPH, microbatches=m))
            names.append(name)
            planned.append({"microbatches": m, "ranks": ring_figures(planner.case_of(name))})
        return [Pair(SLOT_RING_PLAN_PAIR, SLOT_RING_PLAN, (),
                     SlotRingPlanParams(**dict(settings), planned=planned)),
                Pair(SLOT_RING, SLOT_RING, tuple(names),
                     SlotRingPairParams(**dict(settings), counts=list(settings.microbatches)))]


register(SlotRing())
