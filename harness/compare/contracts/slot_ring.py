"""``slot_ring``: graph memory flat in the microbatch count, in bytes (CUDA). One graph arm per
count of ``compare.slot_ring.microbatches`` (``graph-mb<M>``); from the first count that wraps the
slot ring (``harness.compare.ring``) on, a larger count must not grow any rank's graph pool
(``GraphStats.pool_reserved_bytes``) or arena backing (``arena_bytes``) by more than
``max_growth`` (relative), nor its physical slots. The plan's side of the same rule runs on any
machine (``slot_ring_plan``)."""

from __future__ import annotations

from typing import Mapping

from harness.spec.names import SLOT_RING
from harness.spec.schema import SlotRingContract

from ..pair import Pair
from ..registry import contract
from ..ring import not_wrapped, worst_growth, wrapped_counts
from ..series import MIB, Steps, graph_stats
from ..verdicts import Check


class SlotRingPairParams(SlotRingContract):
    """``compare.slot_ring`` plus each arm's microbatch count, in arm order."""

    counts: list[int]


@contract(SLOT_RING, SlotRingPairParams)
def slot_ring(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
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
