"""The slot ring's fill rule, for ``compare.slot_ring``: from which microbatch count on a graph
arm's memory must stay flat.

A graph arm's slot plan gives every (chunk, microbatch) frame a physical slot ``microbatch %
slots``. While a count fits its ring (``M <= slots``) every microbatch has a slot of its own and
the plan may still grow with the count; once the microbatches outnumber the slots (the ring
wraps), the steady-state schedule is covered and a larger count must not add slots or arenas,
nor bytes: memory is sized by the ring, not by the microbatch count (the point of the ring:
Megatron-LM's per-(layer, microbatch) static buffers grew with the count, PR #2391)."""

from __future__ import annotations

from typing import Mapping, Optional


def wrapping_from(slots: Mapping[int, int]) -> Optional[int]:
    """The smallest count ``M`` whose ring wraps (``M > slots[M]``), None when none does."""
    return next((m for m in sorted(slots) if m > slots[m]), None)


def growth(figures: Mapping[int, float], start: int, relative: bool) -> tuple[float, Optional[int]]:
    """The largest growth of ``figures`` (count -> value) past ``start`` over its value at
    ``start``, absolute or relative, and the count where it is (None: nothing past ``start``)."""
    base = figures[start]
    worst, where = 0.0, None
    for m in sorted(figures):
        if m <= start:
            continue
        delta = figures[m] - base
        if relative:
            delta = delta / base if base else (0.0 if figures[m] == 0 else float("inf"))
        if where is None or delta > worst:
            worst, where = delta, m
    return worst, where


def wrapped_counts(slots: Mapping[int, int]) -> tuple[Optional[int], list[int]]:
    """The first count whose ring wraps (``wrapping_from``) and every count from it on, sorted
    (empty when none wraps)."""
    start = wrapping_from(slots)
    return start, [m for m in sorted(slots) if start is not None and m >= start]


def not_wrapped(shown: str) -> str:
    """Why a flatness check does not apply: fewer than two counts wrap the ring (``shown``: the
    figures per count)."""
    return (f"fewer than two counts outnumber the slot ring ({shown}); add larger counts to "
            "compare.slot_ring.microbatches")


def worst_growth(per_rank: Mapping[int, Mapping[int, float]], start: int, relative: bool,
                 ) -> tuple[float, Optional[int], Optional[int]]:
    """The largest ``growth`` over ranks (rank -> count -> value, in rank order): its value,
    the count where it is and the rank (the first rank on a tie)."""
    worst, where, rank = 0.0, None, None
    for r, figures in per_rank.items():
        g, m = growth(figures, start, relative)
        if where is None or g > worst:
            worst, where, rank = g, m, r
    return worst, where, rank
