"""Microbatches in flight per PP rank (pure): walked over the slot planner's own orders."""

from __future__ import annotations

from typing import Sequence

from harness.slotmem import order_events, rank_order


def held_in_flight(pp: int, vpp: int, pp_rank: int, group: int, counts: Sequence[int],
                   chunk_bytes: Sequence[int]) -> int:
    """The most bytes PP rank ``pp_rank`` holds for backwards at once: ``chunk_bytes[c]`` for every
    forward of chunk ``c`` whose backward has not run, over every microbatch count of ``counts``
    (Megatron's interleaved order, as the workload runs it)."""
    most = 0
    for m in counts:
        live = 0
        for ev in order_events(rank_order(pp, pp_rank, m, vpp, group), vpp):
            n = chunk_bytes[ev.chunk]
            live += n if ev.forward else -n
            most = max(most, live)
    return most
