"""``graph_vs_eager``: the graphed arm against the eager arm; loss, aux loss and grad norm per
step (aux loss and grad norm default to the loss bound), and what the graphed arm replayed:
``capture`` (the core's capture line per rank, a figure) and ``variants_replayed`` (the CP
variants a rank captured but never replayed over its graphed steps, bound 0: a comparison over
steps that never replayed a variant says nothing about it; a graph arm that never captured
fails it), with the replays per (CP size, physical slot) frame (``StepRecord.replays``) in the
detail. Memory (``compare.pair_memory``): ``graph_pool_bytes`` and ``device_delta_pct`` (the
whole device after ``empty_cache``) as figures, and allocated / max allocated per step and the
allocated growth between the arms, bounded as declared (the growth by default). A pair of emulated
ranks (each rank's records its own) also gets, per rank, the figure ``r<k>.bitwise_steps``
(:func:`bitwise_figure`): the steps whose loss, aux loss and grad norm are bitwise equal in both
arms, out of the steps both recorded (what the emulated report shows)."""

from __future__ import annotations

from typing import Callable, Mapping, Optional

from pydantic import Field

from harness.spec.comparisons import CommandRole
from harness.spec.names import EAGER, GRAPH, GRAPH_VS_EAGER
from harness.spec.preflight import graph_arms_problem
from harness.spec.problems import Problem
from harness.spec.schema import Case, LossBound

from ..pair import Pair
from ..pair_memory import GRAPH_LEVEL_DEFAULT_PCT, PairMemoryBounds, pool_figures, probe_check, step_memory_checks
from ..registry import Comparison, Judged, Planner, register
from ..series import Steps, frame_replays, frames_text, graph_stats, series_check
from ..verdicts import Check


class GraphVsEagerContract(PairMemoryBounds):
    """The ``graph`` arm against the eager arm of the same (static-shape) case: LM loss, aux loss
    and grad norm per step; ``exact`` = bitwise (deterministic mode)."""

    loss: LossBound = "exact"
    # Bounds of the aux loss and grad norm; None: the loss bound.
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None
    # A graph arm may hold more than the eager arm (its pools keep the captured steps'
    # activations), but not without end: bounded by default (GRAPH_LEVEL_DEFAULT_PCT).
    allocated_delta_pct: Optional[float] = Field(default=GRAPH_LEVEL_DEFAULT_PCT, ge=0)
    max_allocated_delta_pct: Optional[float] = Field(default=GRAPH_LEVEL_DEFAULT_PCT, ge=0)


def _replays(graph: Steps, rank_name: Callable[[int], str]) -> tuple[Check, Check]:
    stats = graph_stats(graph)
    if not stats:  # a graph arm captures after its warmup steps (preflight: warmup < steps)
        why = "the graph arm recorded no capture statistics"
        return (Check.not_applicable("capture", why),
                Check("variants_replayed", None, 0.0, False,
                      f"{why}: it never captured its graphs, so no step replayed a variant"))
    frames = frame_replays(graph)
    capture = "; ".join(f"{rank_name(r)}: {st.summary}" for r, st in sorted(stats.items()))
    worst, parts = 0, []
    for r, st in sorted(stats.items()):
        sizes = sorted({c for c, _ in frames.get(r, {})})
        missing = max(0, st.variants - len(sizes))
        worst = max(worst, missing)
        parts.append(f"{rank_name(r)} replayed CP sizes {sizes} of {st.variants} "
                     f"captured variant(s); forward replays per frame: {frames_text(frames.get(r, {}))}")
    return (Check.figure_of("capture", None, capture),
            Check("variants_replayed", float(worst), 0.0, worst == 0, "; ".join(parts)))


def bitwise_figure(rank: int) -> str:
    """The name of rank ``rank``'s bitwise-steps figure."""
    return f"r{rank}.bitwise_steps"


def _bitwise(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """Per emulated rank: steps bitwise equal (loss, aux loss, grad norm) of those both arms
    recorded, and the first that is not; none for real ranks (their losses are global)."""
    if pair.emulated is None:
        return ()
    graph, eager = (data[a] for a in pair.two_arms())
    out = []
    for rank in sorted(set(graph) & set(eager)):
        by_step = {r.step: r for r in eager[rank]}
        both = [(a, by_step[a.step]) for a in graph[rank] if a.step in by_step]
        if not both:
            continue
        same = [(a.loss, a.aux_loss, a.grad_norm) == (b.loss, b.aux_loss, b.grad_norm)
                for a, b in both]
        first = next((a.step for (a, _), ok in zip(both, same) if not ok), None)
        out.append(Check.figure_of(bitwise_figure(rank), float(sum(same)),
                                   f"bitwise {sum(same)}/{len(both)} steps"
                                   + (f", first mismatch step {first}" if first is not None else "")))
    return tuple(out)


def check_graph_vs_eager(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: GraphVsEagerContract = pair.params
    arms = pair.two_arms()
    aux = p.aux_loss if p.aux_loss is not None else p.loss
    gn = p.grad_norm if p.grad_norm is not None else p.loss
    return (series_check("loss", "loss", data, arms, p.loss, pair),
            series_check("aux_loss", "aux_loss", data, arms, aux, pair),
            series_check("grad_norm", "grad_norm", data, arms, gn, pair),
            *_replays(data[arms[0]], pair.rank_name),
            *memory_checks(p, data, arms, pair.rank_name), *_bitwise(pair, data))


def memory_checks(p: GraphVsEagerContract, data: Mapping[str, Steps], arms: tuple[str, str],
                  rank_name: Callable[[int], str]) -> tuple[Check, ...]:
    """The graph pool and the whole device after ``empty_cache`` (figures) and the per-step
    memory bounds (``compare.pair_memory``, the same rule as ``dcp_vs_fixed_cp``'s)."""
    return (pool_figures(data, arms, rank_name),
            probe_check("device_delta_pct", data, arms, "device_used_bytes", (None, ""), True,
                        rank_name),
            *step_memory_checks(p, f"compare.{GRAPH_VS_EAGER}.", data, arms, rank_name))


class GraphVsEager(Comparison):
    name = GRAPH_VS_EAGER
    settings = GraphVsEagerContract
    order = 20
    emulated_figures = "graphed"
    judged = {GRAPH_VS_EAGER: Judged(GraphVsEagerContract, check_graph_vs_eager, figures=True,
                                     capture_checks=("capture", "variants_replayed",
                                                     "graph_pool_bytes"),
                                     probe_checks=("device_delta_pct",))}

    def rules(self, case: Case, settings: GraphVsEagerContract) -> list[Problem]:
        return graph_arms_problem(case, f"compare.{self.name}")

    def command_roles(self, case: Case, settings: GraphVsEagerContract) -> tuple[CommandRole, ...]:
        return (CommandRole(GRAPH, "the graph arm runs it"),)

    def plan(self, case: Case, settings: GraphVsEagerContract, planner: Planner) -> list[Pair]:
        arms = (planner.arm(GRAPH, "graphs"), planner.arm(EAGER, "compare.graph_vs_eager"))
        return [Pair(GRAPH_VS_EAGER, GRAPH_VS_EAGER, arms, settings)]


register(GraphVsEager())
