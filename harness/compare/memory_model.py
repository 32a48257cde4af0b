"""``<arm>.memory_model``: the memory plan against what the arm measured, per rank.

A CUDA rank records what ``harness.memplan`` predicted for its arm on its first record
(``StepRecord.memory_predicted``); this puts it beside what the records measured: the graph pool
and arenas of the last capture (``graph_stats``) and the peak allocated over the arm's steps.
The figure is ``predicted / measured`` per part and rank (Megatron's estimate beside the peak);
its value is the largest ``|ratio - 1|``. With the case's ``memory_model: {max_rel: x}`` it is a
check bounded by ``x``; without it, a figure. Arms without a prediction (CPU ranks, a case with no
memory plan) get nothing."""

from __future__ import annotations

from typing import Callable, Optional

from .series import Steps, records_of
from .verdicts import Check

NAME = "memory_model"


def _rank_ratios(records) -> Optional[tuple[list[tuple[str, float]], Optional[float]]]:  # noqa: ANN001
    pred = next((r.memory_predicted for r in records if r.memory_predicted is not None), None)
    if pred is None:
        return None
    parts: list[tuple[str, float]] = []
    stats = [r.graph_stats for r in records if r.graph_stats is not None]
    if stats and pred.pool_bytes is not None and stats[-1].pool_reserved_bytes > 0:
        parts.append(("pool", pred.pool_bytes / stats[-1].pool_reserved_bytes))
    if stats and pred.arena_bytes is not None and stats[-1].arena_bytes > 0:
        parts.append(("arenas", pred.arena_bytes / stats[-1].arena_bytes))
    peaks = [r.max_allocated_bytes for r in records if r.max_allocated_bytes]
    megatron = None
    if peaks:
        parts.append(("peak", pred.peak_bytes / max(peaks)))
        megatron = pred.megatron_bytes / max(peaks)
    return (parts, megatron) if parts else None


def memory_model_check(arm: str, steps: Steps, max_rel: Optional[float],
                       rank_name: Optional[Callable[[int], str]] = None) -> tuple[Check, ...]:
    """``<arm>.memory_model`` (see the module doc), or nothing when no rank recorded a prediction
    beside a measurement."""
    named = rank_name or (lambda r: f"rank {r}")
    by_rank: dict[int, list] = {}
    for rank, rec in records_of(steps):
        by_rank.setdefault(rank, []).append(rec)
    worst, lines = 0.0, []
    for rank in sorted(by_rank):
        got = _rank_ratios(by_rank[rank])
        if got is None:
            continue
        parts, megatron = got
        worst = max([worst] + [abs(x - 1) for _, x in parts])
        text = ", ".join(f"{k} {x:.3f}" for k, x in parts)
        if megatron is not None:
            text += f" (Megatron's estimate / peak {megatron:.3f})"
        lines.append(f"{named(rank)}: {text}")
    if not lines:
        return ()
    detail = "predicted / measured: " + "; ".join(lines)
    if max_rel is None:
        return (Check(f"{arm}.{NAME}", worst, None, True, detail, figure=True),)
    return (Check(f"{arm}.{NAME}", worst, max_rel, worst <= max_rel, detail),)
