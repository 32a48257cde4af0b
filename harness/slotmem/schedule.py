"""Per-rank pipeline orders: Megatron's interleaved 1F1B schedule in its ``_order`` convention.

An *order* is the sequence of forward/backward events one pipeline rank runs in one iteration:

* ``+c`` is the forward of 1-based model chunk ``c`` for that chunk's next microbatch;
* ``-c`` is the backward of chunk ``c`` for that chunk's oldest outstanding microbatch
  (per-chunk FIFO counters), so the logical microbatch of every event follows from the order alone.

The order is built from the *schedule table* (which microbatch and chunk each virtual microbatch
is), the per-rank warmup count, and the rule that backwards visit chunks in reverse. Chunks are
0-based everywhere in this package except in order entries, which keep Megatron's 1-based sign
convention. Nothing here depends on layers; layers per chunk only matter to the planner.

Validity rules for microbatch counts follow Megatron's interleaved schedule (VPP > 1): the
microbatch group size must lie in ``[PP, M]`` and the last group's remainder ``M % group`` must be
0 or at least PP. Without VPP every count ``M >= 1`` is schedulable.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, TypeVar, Union

from harness.slotmem.planerrors import ScheduleError

_Seq = TypeVar("_Seq", bound=Union[list, array])

__all__ = [
    "OrderEvent",
    "ScheduleError",
    "allowed_microbatch_counts",
    "check_layout",
    "check_microbatch_count",
    "check_order",
    "group_problem",
    "lockstep_order",
    "microbatch_count_problem",
    "order_events",
    "order_from_chunks",
    "rank_order",
    "rank_order_arrays",
    "schedule_table",
    "warmup_count",
]


@dataclass(frozen=True)
class OrderEvent:
    """One entry of an order with its logical microbatch made explicit.

    ``forward``: True for a forward, False for a backward. ``chunk``: 0-based model chunk.
    ``microbatch``: the chunk's logical microbatch (FIFO: the n-th forward of a chunk is microbatch
    n, and its backwards retire microbatches in the same order).
    """

    forward: bool
    chunk: int
    microbatch: int


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError(f"{name} must be a positive integer, got {value!r}")


def check_layout(pp: int, vpp: int, group: Optional[int] = None) -> int:
    """Check a pipeline layout and return the microbatch group size (default: ``pp``).

    With VPP > 1 Megatron requires the group (``microbatch_group_size_per_vp_stage``) to be at
    least PP; without VPP the group has no effect.
    """
    _positive("pp", pp)
    _positive("vpp", vpp)
    g = pp if group is None else group
    _positive("microbatch group", g)
    problem = group_problem(pp, vpp, g)
    if problem is not None:
        raise ScheduleError(problem)
    return g


def group_problem(pp: int, vpp: int, group: int) -> Optional[str]:
    """Why ``group`` cannot be the microbatch group of a PP x VPP schedule (None: it can)."""
    if vpp > 1 and group < pp:
        return (f"microbatch group {group} is smaller than PP={pp}; the interleaved schedule needs "
                f"group >= PP (set the group to at least {pp} or leave it unset for the default "
                f"{pp})")
    return None


def microbatch_count_problem(pp: int, vpp: int, group: int, microbatches: int) -> Optional[str]:
    """Why the schedule cannot run ``microbatches`` microbatches, or None when it can."""
    if not isinstance(microbatches, int) or microbatches < 1:
        return f"microbatch count must be a positive integer, got {microbatches!r}"
    if vpp == 1:
        return None
    if microbatches < group:
        return (
            f"{microbatches} microbatches is fewer than the microbatch group {group}; "
            f"the interleaved schedule (VPP={vpp}) needs at least one full group"
        )
    remainder = microbatches % group
    if 0 < remainder < pp:
        return (
            f"{microbatches} microbatches leave a last group of {remainder} (M % group = "
            f"{microbatches} % {group}), fewer than PP={pp}; use a count whose remainder is 0 "
            f"or at least {pp}"
        )
    return None


def check_microbatch_count(pp: int, vpp: int, group: int, microbatches: int) -> None:
    """Raise :class:`ScheduleError` if the schedule cannot run ``microbatches`` microbatches."""
    problem = microbatch_count_problem(pp, vpp, group, microbatches)
    if problem is not None:
        raise ScheduleError(problem)


def allowed_microbatch_counts(
    pp: int, vpp: int, group: int, candidates: Iterable[int]
) -> tuple[int, ...]:
    """The sorted, de-duplicated candidates the schedule can run (see the module docstring)."""
    return tuple(
        sorted({m for m in candidates if microbatch_count_problem(pp, vpp, group, m) is None})
    )


def schedule_table(microbatches: int, chunks: int, group: int) -> tuple[tuple[int, int], ...]:
    """``(microbatch, chunk)`` of every virtual microbatch, 0-based.

    Microbatches are taken in groups of ``group``; inside a group every chunk runs all of the
    group's microbatches (chunk-major); the last group takes the remainder.
    PP2/VPP2, 5 microbatches, group 3 gives microbatches ``0 1 2 0 1 2 3 4 3 4`` and chunks
    ``0 0 0 1 1 1 0 0 1 1``.
    """
    _positive("microbatches", microbatches)
    _positive("chunks", chunks)
    _positive("microbatch group", group)
    table: list[tuple[int, int]] = []
    for start in range(0, microbatches, group):
        stop = min(start + group, microbatches)
        table.extend((mb, chunk) for chunk in range(chunks) for mb in range(start, stop))
    return tuple(table)


def warmup_count(pp: int, rank: int, microbatches: int, chunks: int, group: int) -> int:
    """Forwards rank ``rank`` runs before its first backward.

    ``2*(pp-rank-1) + (chunks-1)*group`` with VPP (chunks > 1), ``pp-rank-1`` without; capped at
    the total number of virtual microbatches. PP=1 without VPP gives 0: forward, backward, ...
    """
    _positive("pp", pp)
    if not isinstance(rank, int) or not 0 <= rank < pp:
        raise ScheduleError(f"PP rank must be in [0, {pp}), got {rank!r}")
    total = microbatches * chunks
    if chunks > 1:
        warmup = 2 * (pp - rank - 1) + (chunks - 1) * group
    else:
        warmup = pp - rank - 1
    return min(warmup, total)


def _chunk_sequence(microbatches: int, chunks: int, group: int) -> list[int]:
    """The chunk of every virtual microbatch (the second column of :func:`schedule_table`)."""
    seq: list[int] = []
    for start in range(0, microbatches, group):
        width = min(group, microbatches - start)
        for chunk in range(chunks):
            seq.extend([chunk] * width)
    return seq


def order_from_chunks(chunk_seq: Sequence[int], chunks: int, warmup: int) -> tuple[int, ...]:
    """The ``_order`` for a virtual-microbatch chunk sequence and a warmup count.

    Warmup forwards, then alternately the forward of virtual microbatch ``k`` and the backward of
    ``k - warmup``, then the remaining backwards. The backward of a virtual microbatch whose
    table chunk is ``t`` runs chunk ``chunks-1-t`` (reverse chunk order).
    """
    total = len(chunk_seq)
    if not 0 <= warmup <= total:
        raise ScheduleError(f"warmup {warmup} is outside [0, {total}]")
    forward = [c + 1 for c in chunk_seq]
    backward = [c - chunks for c in chunk_seq]  # -(chunks - c): reverse chunk, 1-based, negative
    return tuple(_interleave(forward, backward, warmup))


def _interleave(forward: _Seq, backward: _Seq, warmup: int) -> _Seq:
    """``warmup`` forwards, then (forward k, backward k - warmup) pairs, then the remaining
    backwards; works on lists and on ``array('i')`` alike."""
    steady = len(forward) - warmup
    middle = forward[warmup:] + backward[:steady]  # the right type and length, filled below
    middle[0::2] = forward[warmup:]
    middle[1::2] = backward[:steady]
    return forward[:warmup] + middle + backward[steady:]


def rank_order(pp: int, rank: int, microbatches: int, chunks: int, group: int) -> tuple[int, ...]:
    """The ``_order`` of PP rank ``rank`` for ``microbatches`` microbatches and ``chunks`` chunks.

    PP2/VPP2, 5 microbatches, group 3, rank 0 gives
    ``1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1``.
    """
    _positive("microbatches", microbatches)
    _positive("chunks", chunks)
    _positive("microbatch group", group)
    warmup = warmup_count(pp, rank, microbatches, chunks, group)
    order = order_from_chunks(_chunk_sequence(microbatches, chunks, group), chunks, warmup)
    check_order(order, chunks)
    return order


def rank_order_arrays(
    pp: int,
    counts: Sequence[int],
    chunks: int,
    group: int,
    ranks: Optional[Sequence[int]] = None,
) -> tuple[tuple[array, ...], ...]:
    """``orders[k][i]``: the order of PP rank ``ranks[k]`` (default every rank, so ``k`` is the
    rank) for every count ``counts[i]``, as ``array('i')`` (fast to slice, compare and walk).

    Equal to :func:`rank_order` entry by entry, but the forward/backward sequences are built once
    per count and shared by the ranks, and there is no per-order drain check: walk the result
    with :class:`harness.slotmem.liveness.OutstandingCounter`, which checks draining on the way.
    """
    _positive("chunks", chunks)
    _positive("microbatch group", group)
    for m in counts:
        _positive("microbatches", m)
    rank_list = list(range(pp) if ranks is None else ranks)
    per_count: list[list[array]] = [[] for _ in rank_list]
    for m in counts:
        seq = array("i", _chunk_sequence(m, chunks, group))
        forward = array("i", [c + 1 for c in seq])
        backward = array("i", [c - chunks for c in seq])
        for k, rank in enumerate(rank_list):
            warmup = warmup_count(pp, rank, m, chunks, group)
            per_count[k].append(_interleave(forward, backward, warmup))
    return tuple(tuple(orders) for orders in per_count)


def order_events(order: Sequence[int], chunks: int) -> tuple[OrderEvent, ...]:
    """Annotate an order with each event's 0-based chunk and logical microbatch (FIFO per chunk)."""
    fwd = [0] * chunks
    bwd = [0] * chunks
    events: list[OrderEvent] = []
    for position, entry in enumerate(order):
        if not isinstance(entry, int) or entry == 0 or abs(entry) > chunks:
            raise ScheduleError(
                f"order entry {entry!r} at position {position} is not a chunk id in "
                f"+-[1, {chunks}] (fractional wgrad entries are not supported)"
            )
        chunk = abs(entry) - 1
        if entry > 0:
            events.append(OrderEvent(True, chunk, fwd[chunk]))
            fwd[chunk] += 1
        else:
            if bwd[chunk] >= fwd[chunk]:
                raise ScheduleError(
                    f"order position {position}: backward of chunk {chunk + 1} has no "
                    f"outstanding forward (forwards {fwd[chunk]}, backwards {bwd[chunk]})"
                )
            events.append(OrderEvent(False, chunk, bwd[chunk]))
            bwd[chunk] += 1
    return tuple(events)


def check_order(order: Sequence[int], chunks: int) -> None:
    """Raise :class:`ScheduleError` unless the order drains: every backward has an outstanding
    forward of its chunk, every chunk runs the same number of microbatches, and nothing is left
    outstanding at the end."""
    events = order_events(order, chunks)
    fwd = [0] * chunks
    bwd = [0] * chunks
    for ev in events:
        (fwd if ev.forward else bwd)[ev.chunk] += 1
    for chunk in range(chunks):
        if fwd[chunk] != bwd[chunk]:
            raise ScheduleError(
                f"order does not drain: chunk {chunk + 1} has {fwd[chunk]} forwards and "
                f"{bwd[chunk]} backwards"
            )
    if len(set(fwd)) > 1:
        raise ScheduleError(f"chunks run different microbatch counts: {fwd}")


def lockstep_order(order: Sequence[int], chunks: int, variants: int) -> tuple[int, ...]:
    """Each base entry repeated once per variant, canonical first: ``±c`` becomes
    ``±c, ±(c+chunks), ±(c+2*chunks), ...`` (each variant looks like its own set of chunks).

    ``[1,2,1,2,-1,-2,-1,-2]`` with 2 variants and 2 chunks gives
    ``[1,3,2,4,1,3,2,4,-1,-3,-2,-4,-1,-3,-2,-4]``.
    """
    out: list[int] = []
    for entry in order:
        sign = 1 if entry > 0 else -1
        out.extend(sign * (abs(entry) + v * chunks) for v in range(variants))
    return tuple(out)
