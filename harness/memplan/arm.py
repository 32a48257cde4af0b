"""What one arm of a case is predicted to hold on one rank (:func:`rank_prediction`): the figures
a rank records beside its measurement (``results.PredictedMemory``), and preflight's per-rank
peaks (:func:`peaks_by_rank`)."""

from __future__ import annotations

from typing import Optional

from harness.memplan.predict import MemoryPlanError, predict_case
from harness.memplan.records import CaseMemory, MemoryTarget, RankMemory
from harness.results import PredictedMemory
from harness.spec.schema import Case, Pools


def arm_figures(case: Case, r: RankMemory) -> PredictedMemory:
    """The predicted pool, arenas and peak of the arm ``case`` runs (its pools shared or
    separate; an eager arm has no pool) on the PP stage of ``r``. An arm is graphed by its
    execution (``case.execution.graphed``), not by the ``graphs:`` section its case keeps: the
    eager arms of a graph case keep that section and hold no pool, so their peak is the eager
    one. A graph arm trains its first ``graphs.warmup_steps`` eagerly, so its peak is the larger
    of the eager and the graph peak."""
    meg = r.megatron.total_bytes
    if not case.execution.graphed:
        return PredictedMemory(None, None, r.eager_peak_bytes, meg)
    if case.execution.pools is Pools.SEPARATE:
        pool = r.pool_separate_bytes
        arenas = sum(v.arena_bytes for v in r.variants)
        graph_peak = r.graph_peak_bytes - r.pool_shared_bytes + pool
    else:
        pool, arenas, graph_peak = r.pool_shared_bytes, r.arena_bytes, r.graph_peak_bytes
    return PredictedMemory(pool, arenas, max(r.eager_peak_bytes, graph_peak), meg)


def rank_prediction(case: Case, rank: int, target: MemoryTarget = MemoryTarget()) -> Optional[PredictedMemory]:
    """The prediction for ``rank`` of the arm ``case`` runs; None when the case has no memory
    plan (dynamic shapes, fp32)."""
    try:
        cm = predict_case(case, target, pp_ranks=[case.layout.pp_rank(rank)])
    except MemoryPlanError:
        return None
    return arm_figures(case, cm.ranks[0])


def peaks_by_rank(cm: CaseMemory, ranks: tuple[int, ...]) -> dict[int, int]:
    """Expected peak of every rank in ``ranks`` (each its PP stage's)."""
    return {r: cm.of_rank(r).peak_bytes for r in ranks}
