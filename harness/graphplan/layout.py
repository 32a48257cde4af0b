"""What a graph arm plans, without torch: its slot-plan layout per PP rank and the microbatch
counts the plan covers (``harness.workload.graphed.capture`` builds the plans from these;
``harness.arms`` plans the same layouts on any machine for ``compare.slot_ring``). Below both on
the map (floor 2: it reads only ``spec`` and the pure planner of ``slotmem``)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.slotmem import PipelinePlan, SlotPlan, allowed_microbatch_counts, plan_pipeline
from harness.spec.schema import Case


@dataclass(frozen=True)
class GraphLayout:
    """What the plan of one rank is built from (pure; testable without a GPU)."""

    pp: int
    vpp: int
    group: int
    pp_rank: int
    layers_per_chunk: tuple[int, ...]
    cp_sizes: tuple[int, ...]
    microbatch_counts: tuple[int, ...]


def reachable_microbatch_counts(pp: int, vpp: int, group: int, most: int) -> tuple[int, ...]:
    """Every count in ``1..most`` the interleaved schedule runs (the packer only makes those)."""
    counts = tuple(allowed_microbatch_counts(pp, vpp, group, range(1, most + 1)))
    if not counts:
        raise ValueError(f"no microbatch count in 1..{most} is schedulable (pp={pp}, vpp={vpp}, group={group})")
    return counts


def pipeline_plans(layout: GraphLayout, separate: bool) -> list[PipelinePlan]:
    """The slot plans of every PP rank: one over every CP size, or one per CP size (separate
    pools). ``layout.pp_rank`` is not read (``harness.memplan`` plans every stage from these)."""
    sizes = [(c,) for c in layout.cp_sizes] if separate else [layout.cp_sizes]
    return [plan_pipeline(layout.pp, layout.vpp, layout.microbatch_counts, cps,
                          layers_per_chunk=list(layout.layers_per_chunk), group=layout.group)
            for cps in sizes]


def rank_plans(layout: GraphLayout, separate: bool) -> list[SlotPlan]:
    """This rank's slot plan(s): one over every CP size, or one per CP size (separate pools)."""
    return [plan.ranks[layout.pp_rank] for plan in pipeline_plans(layout, separate)]


def capture_counts(case: Case) -> tuple[int, ...]:
    """The microbatch counts a graph arm of ``case`` plans for: ``train.microbatches`` of a
    fixed-CP case, else every count the packer can make (up to the sequences of a step)."""
    lay = case.layout
    if case.train.microbatches is not None and not lay.dynamic:
        return (case.train.microbatches,)
    return reachable_microbatch_counts(lay.pp, lay.vpp, lay.group, lay.most_microbatches)


def case_graph_layout(case: Case, pp_rank: int) -> GraphLayout:
    """The plan layout of PP rank ``pp_rank`` of a graph arm of ``case`` (layers split evenly
    over the ``pp * vpp`` virtual stages, as ``model.chunk_layouts`` builds them)."""
    lay = case.layout
    per = case.model.layers // (lay.pp * lay.vpp)
    return GraphLayout(lay.pp, lay.vpp, lay.group, pp_rank, (per,) * lay.vpp, lay.cp_sizes,
                       capture_counts(case))
