"""The slot planner: physical slot ring, liveness colours, CP variants, lockstep order, records.

:func:`plan_pipeline` turns a pipeline layout, the reachable microbatch counts and the CP sizes
into one :class:`SlotPlan` per PP rank:

1. **Physical slots.** For every reachable microbatch count and every PP rank, the most forwards
   of one chunk whose backward has not run yet; the maximum over all of them (all-reduced over PP
   so every rank uses the same ring) is ``physical_slots``; microbatch ``m`` uses slot
   ``m % physical_slots``. Capture runs ``physical_slots`` microbatches (the capture order).
2. **Liveness colours** over the union of the rank's reachable orders (and the capture order):
   saved frames ``(chunk, slot, layer)`` conflict when live at the same time (forward to
   backward); an input-grad frame ``(chunk, slot)`` is live from its backward through the next
   backward (the P2P send is in flight; PP > 1 or VPP > 1) and, with PP = 1 and VPP > 1, until
   the same-rank consumer chunk's backward of that microbatch. DSATUR gives ``saved_colour`` and
   ``grad_colour``.
3. **CP variants**: sizes sorted ascending; variant 0 (smallest CP) is canonical. The **lockstep
   order** repeats every base event once per variant, canonical first.
4. One :class:`SlotRecord` per captured forward (variant x forward event x layer), in capture order.

:meth:`SlotPlan.validate` re-checks a plan from scratch by walking every reachable order with the
plan's own slots and colours (independent of how they were computed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

from harness.slotmem.colouring import dsatur
from harness.slotmem.liveness import (
    ConflictBuilder,
    OutstandingCounter,
    PlanChecker,
    walk_orders,
)
from harness.slotmem.planerrors import PlanError, SlotPeriodError
from harness.slotmem.planinputs import LayersSpec, cp_variants, layers_per_rank, reachable_counts
from harness.slotmem.records import CaptureEvent, SlotRecord
from harness.slotmem.schedule import (
    check_layout,
    lockstep_order,
    order_events,
    rank_order,
    rank_order_arrays,
)

__all__ = [
    "PipelinePlan",
    "SlotPlan",
    "cp_variants",
    "layers_per_rank",
    "lockstep_order",
    "plan_pipeline",
    "reachable_counts",
    "required_slots",
]


def _labelled(
    counts: Sequence[int], orders: Sequence[Sequence[int]], rank: int
) -> list[tuple[str, Sequence[int]]]:
    return [(f"PP rank {rank}, {m} microbatches", order) for m, order in zip(counts, orders)]


def _rank_orders(
    counts: Sequence[int], orders: Sequence[Sequence[int]], rank: int, capture: Sequence[int]
) -> list[tuple[str, Sequence[int]]]:
    """``(label, order)`` for every reachable count of one rank plus its capture order: the
    orders a plan's slots and colours must be safe for."""
    return [*_labelled(counts, orders, rank), (f"PP rank {rank}, capture order", capture)]


def _warmup_group(layers_per_chunk: Sequence[int], variants: int, variant: int, chunk: int, layer: int) -> int:
    """Warmup group of a callable: largest CP size first, then chunk-major layer index
    (``(variants - 1 - variant) * layers_on_rank + layers_before_chunk + layer``)."""
    return (variants - 1 - variant) * sum(layers_per_chunk) + sum(layers_per_chunk[:chunk]) + layer


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class SlotPlan:
    """The slot plan of one PP rank.

    Fields:
      pp, rank, chunks, group  pipeline layout (chunks = VPP size; group = microbatch group size).
      layers_per_chunk   layers of each chunk on this rank (may be uneven, may hold zeros).
      cp_sizes           CP size of each variant, ascending; variant 0 is canonical.
      microbatch_counts  the reachable microbatch counts the plan is safe for.
      order              the base capture order (Megatron ``_order``) for ``physical_slots``
                         microbatches.
      slots_per_chunk    per chunk, the most outstanding forwards on this rank over the reachable
                         counts.
      physical_slots     ring size shared by every rank and chunk (max over ranks and chunks).
      lockstep_order     ``order`` with each entry repeated per variant (see :func:`lockstep_order`).
      records            one :class:`SlotRecord` per captured forward, in capture order.
      saved_colours      number of saved-arena colours used.
      grad_colours       number of input-grad-arena colours used.
    """

    pp: int
    rank: int
    chunks: int
    group: int
    layers_per_chunk: tuple[int, ...]
    cp_sizes: tuple[int, ...]
    microbatch_counts: tuple[int, ...]
    order: tuple[int, ...]
    slots_per_chunk: tuple[int, ...]
    physical_slots: int
    lockstep_order: tuple[int, ...]
    records: tuple[SlotRecord, ...]
    saved_colours: int
    grad_colours: int

    @property
    def variants(self) -> int:
        return len(self.cp_sizes)

    def capture_events(self) -> tuple[CaptureEvent, ...]:
        """The lockstep order decoded into typed events (same length and order)."""
        out: list[CaptureEvent] = []
        for ev in order_events(self.order, self.chunks):
            slot = ev.microbatch % self.physical_slots
            for v, cp in enumerate(self.cp_sizes):
                out.append(CaptureEvent(ev.forward, ev.chunk, v, cp, ev.microbatch, slot))
        return tuple(out)

    def compact_records(self) -> tuple[tuple[int, ...], ...]:
        """Every record's :meth:`SlotRecord.compact` tuple, in capture order."""
        return tuple(r.compact() for r in self.records)

    def warmup_group_of(self, variant: int, chunk: int, layer: int) -> int:
        """Warmup group of a callable: largest CP size first, then chunk-major layer index."""
        return _warmup_group(self.layers_per_chunk, self.variants, variant, chunk, layer)

    def reachable_orders(self) -> list[tuple[str, Sequence[int]]]:
        """``(label, order)`` for every reachable count plus the capture order."""
        counts = list(self.microbatch_counts)
        orders = rank_order_arrays(self.pp, counts, self.chunks, self.group, ranks=(self.rank,))
        return _rank_orders(counts, orders[0], self.rank, self.order)

    def validate(self) -> None:
        """Raise :class:`PlanError` unless the plan is self-consistent and safe.

        Checks: the order is the capture order of this layout and drains; the lockstep order
        matches it; there is exactly one record per (variant, captured forward, layer) with the
        derived fields (cp size, slot, branch, warmup group) right and one colour per frame; and,
        walking every reachable order with this plan's slot ring, no slot is reused while live and
        no two frames that are live at the same time share a saved or an input-grad colour.
        """
        cp_variants(self.cp_sizes)
        if self.cp_sizes != tuple(sorted(self.cp_sizes)):
            raise PlanError(f"cp_sizes must be ascending (variant 0 canonical), got {self.cp_sizes}")
        check_layout(self.pp, self.chunks, self.group)
        if len(self.layers_per_chunk) != self.chunks:
            raise PlanError(
                f"layers_per_chunk has {len(self.layers_per_chunk)} entries for {self.chunks} chunks"
            )
        if len(self.slots_per_chunk) != self.chunks:
            raise PlanError(
                f"slots_per_chunk has {len(self.slots_per_chunk)} entries for {self.chunks} chunks"
            )
        if self.physical_slots < max(self.slots_per_chunk):
            raise SlotPeriodError(
                f"rank {self.rank}: physical_slots {self.physical_slots} is fewer than the "
                f"{max(self.slots_per_chunk)} outstanding forwards one chunk can have"
            )
        expected = rank_order(self.pp, self.rank, self.physical_slots, self.chunks, self.group)
        if self.order != expected:
            raise PlanError(
                f"rank {self.rank}: order is not the capture order for {self.physical_slots} "
                f"microbatches; expected {list(expected)}"
            )
        if self.lockstep_order != lockstep_order(self.order, self.chunks, self.variants):
            raise PlanError(f"rank {self.rank}: lockstep_order does not expand order per variant")
        saved, grad = self._check_records()
        walker = PlanChecker(self.physical_slots, self.layers_per_chunk, self.pp, saved, grad)
        walk_orders(self.reachable_orders(), walker)

    def _check_records(self) -> tuple[dict[tuple[int, int, int], int], dict[tuple[int, int], int]]:
        wanted = [
            (ev.variant, ev.chunk, layer, ev.microbatch)
            for ev in self.capture_events()
            if ev.forward
            for layer in range(self.layers_per_chunk[ev.chunk])
        ]
        have = [(r.variant, r.chunk, r.layer, r.microbatch) for r in self.records]
        if have != wanted:
            extra = sorted(set(have) - set(wanted))[:3]
            missing = sorted(set(wanted) - set(have))[:3]
            raise PlanError(
                f"rank {self.rank}: records do not match the captured forwards one to one in "
                f"capture order ((variant, chunk, layer, microbatch) extra {extra}, missing "
                f"{missing}, {len(have)} records for {len(wanted)} forwards)"
            )
        saved: dict[tuple[int, int, int], int] = {}
        grad: dict[tuple[int, int], int] = {}
        S = self.physical_slots
        for r in self.records:
            derived = {
                "cp_size": self.cp_sizes[r.variant],
                "slot": r.microbatch % S,
                "branch": r.variant * S + r.microbatch % S,
                "warmup_group": self.warmup_group_of(r.variant, r.chunk, r.layer),
            }
            for name, value in derived.items():
                if getattr(r, name) != value:
                    raise PlanError(
                        f"rank {self.rank}: record {r} has {name}={getattr(r, name)}, "
                        f"expected {value}"
                    )
            if r.saved_colour < 0 or r.grad_colour < 0:
                raise PlanError(f"rank {self.rank}: record {r} has a negative colour")
            if saved.setdefault(r.saved_frame, r.saved_colour) != r.saved_colour:
                raise PlanError(
                    f"rank {self.rank}: saved frame (chunk, slot, layer)={r.saved_frame} has two "
                    f"saved colours ({saved[r.saved_frame]} and {r.saved_colour})"
                )
            if grad.setdefault(r.grad_frame, r.grad_colour) != r.grad_colour:
                raise PlanError(
                    f"rank {self.rank}: input-grad frame (chunk, slot)={r.grad_frame} has two "
                    f"grad colours ({grad[r.grad_frame]} and {r.grad_colour})"
                )
        return saved, grad

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form of one rank."""
        return {
            "rank": self.rank,
            "order": list(self.order),
            "slots_per_chunk": list(self.slots_per_chunk),
            "physical_slots": self.physical_slots,
            "lockstep_order": list(self.lockstep_order),
            "layers_per_chunk": list(self.layers_per_chunk),
            "saved_colours": self.saved_colours,
            "grad_colours": self.grad_colours,
            "records": [r.as_dict() for r in self.records],
        }


@dataclass(frozen=True)
class PipelinePlan:
    """Slot plans of every PP rank of one layout (``ranks[k].rank == k``)."""

    pp: int
    vpp: int
    group: int
    cp_sizes: tuple[int, ...]
    microbatch_counts: tuple[int, ...]
    physical_slots: int
    ranks: tuple[SlotPlan, ...]

    @property
    def variants(self) -> int:
        return len(self.cp_sizes)

    def summary(self) -> str:
        """``K dynamic-CP variants over S slot-aliased physical pool slots``."""
        k, s = self.variants, self.physical_slots
        return (
            f"{k} dynamic-CP variant{'s' if k != 1 else ''} over {s} slot-aliased physical "
            f"pool slot{'s' if s != 1 else ''}"
        )

    def validate(self) -> None:
        """Validate every rank and that all ranks share one layout and one slot ring."""
        if [p.rank for p in self.ranks] != list(range(self.pp)):
            raise PlanError(f"expected plans for ranks 0..{self.pp - 1} in order")
        for p in self.ranks:
            shared = (p.pp, p.chunks, p.group, p.cp_sizes, p.microbatch_counts, p.physical_slots)
            want = (self.pp, self.vpp, self.group, self.cp_sizes, self.microbatch_counts,
                    self.physical_slots)
            if shared != want:
                raise PlanError(
                    f"rank {p.rank}: (pp, chunks, group, cp_sizes, counts, physical_slots) = "
                    f"{shared} differs from the pipeline's {want}"
                )
        required = max(max(p.slots_per_chunk) for p in self.ranks)
        if self.physical_slots < required:
            raise SlotPeriodError(
                f"physical_slots {self.physical_slots} is fewer than the {required} the schedule "
                f"needs"
            )
        for p in self.ranks:
            p.validate()

    def to_json(self) -> dict[str, Any]:
        """``{"ranks": [...], "summary": {...}}`` (see :meth:`SlotPlan.to_json`)."""
        return {
            "ranks": [p.to_json() for p in self.ranks],
            "summary": {
                "pp": self.pp,
                "vpp": self.vpp,
                "group": self.group,
                "cp_sizes": list(self.cp_sizes),
                "canonical_cp": self.cp_sizes[0],
                "variants": self.variants,
                "microbatch_counts": list(self.microbatch_counts),
                "physical_slots": self.physical_slots,
                "records": sum(len(p.records) for p in self.ranks),
                "text": self.summary(),
            },
        }


# --------------------------------------------------------------------------- planning
def required_slots(
    pp: int, vpp: int, counts: Sequence[int], group: Optional[int] = None, strict: bool = True
) -> tuple[tuple[int, ...], ...]:
    """Per rank and chunk, the most outstanding forwards over every order of ``counts``."""
    g = check_layout(pp, vpp, group)
    counts = reachable_counts(pp, vpp, g, counts, strict)
    return _peaks(counts, rank_order_arrays(pp, counts, vpp, g), vpp)


def _peaks(
    counts: Sequence[int], orders: Sequence[Sequence[Sequence[int]]], chunks: int
) -> tuple[tuple[int, ...], ...]:
    """Per rank and chunk, the most outstanding forwards over ``orders[rank][i]``."""
    out = []
    for rank, rank_orders in enumerate(orders):
        counter = OutstandingCounter(chunks)
        walk_orders(_labelled(counts, rank_orders, rank), counter)
        out.append(tuple(counter.peak))
    return tuple(out)


def _layer_graph(
    frame_adj: Sequence[int], layers: Sequence[int], slots: int
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Expand the (chunk, slot) conflict graph to (chunk, slot, layer) vertices: layers of one
    frame conflict with each other and with every layer of a conflicting frame."""
    nodes: list[tuple[int, int, int]] = []
    frame_mask: list[int] = []
    for c, n in enumerate(layers):
        for s in range(slots):
            frame_mask.append(((1 << n) - 1) << len(nodes))
            nodes.extend((c, s, l) for l in range(n))
    adj: list[int] = []
    for f, mask in enumerate(frame_mask):
        others = 0
        m = frame_adj[f]
        while m:
            low = m & -m
            others |= frame_mask[low.bit_length() - 1]
            m ^= low
        first = (mask & -mask).bit_length() - 1
        for i in range(first, first + mask.bit_count()):
            adj.append(others | (mask & ~(1 << i)))
    return adj, nodes


def _plan_rank(
    pp: int,
    rank: int,
    group: int,
    layers: tuple[int, ...],
    cp_sizes: tuple[int, ...],
    counts: tuple[int, ...],
    orders: Sequence[Sequence[int]],
    slots_per_chunk: tuple[int, ...],
    physical_slots: int,
) -> SlotPlan:
    chunks = len(layers)
    capture = rank_order(pp, rank, physical_slots, chunks, group)
    builder = ConflictBuilder(chunks, physical_slots, layers, pp)
    walk_orders(_rank_orders(counts, orders, rank, capture), builder)

    adj, nodes = _layer_graph(builder.symmetric_saved(), layers, physical_slots)
    saved_of = dict(zip(nodes, dsatur(adj)))
    grad_of_frame = dsatur(builder.symmetric_grad())
    K = len(cp_sizes)
    records: list[SlotRecord] = []
    for ev in order_events(capture, chunks):
        if not ev.forward:
            continue
        slot = ev.microbatch % physical_slots
        for v, cp in enumerate(cp_sizes):
            for layer in range(layers[ev.chunk]):
                records.append(
                    SlotRecord(
                        variant=v,
                        cp_size=cp,
                        chunk=ev.chunk,
                        layer=layer,
                        microbatch=ev.microbatch,
                        slot=slot,
                        branch=v * physical_slots + slot,
                        saved_colour=saved_of[(ev.chunk, slot, layer)],
                        grad_colour=grad_of_frame[ev.chunk * physical_slots + slot],
                        warmup_group=_warmup_group(layers, K, v, ev.chunk, layer),
                    )
                )
    return SlotPlan(
        pp=pp,
        rank=rank,
        chunks=chunks,
        group=group,
        layers_per_chunk=layers,
        cp_sizes=cp_sizes,
        microbatch_counts=counts,
        order=capture,
        slots_per_chunk=slots_per_chunk,
        physical_slots=physical_slots,
        lockstep_order=lockstep_order(capture, chunks, K),
        records=tuple(records),
        saved_colours=len({r.saved_colour for r in records}),
        grad_colours=len({r.grad_colour for r in records}),
    )


def plan_pipeline(
    pp: int,
    vpp: int,
    microbatches: Union[int, Iterable[int]],
    cp_sizes: Iterable[int] = (1,),
    layers_per_chunk: LayersSpec = 1,
    group: Optional[int] = None,
    physical_slots: Optional[int] = None,
    strict: bool = True,
) -> PipelinePlan:
    """Plan every PP rank.

    ``microbatches``: one count or every reachable count (each must be schedulable, see
    :func:`harness.slotmem.schedule.allowed_microbatch_counts` to filter a range first).
    ``layers_per_chunk``: see :func:`layers_per_rank`. ``group``: microbatch group size (default
    PP). ``physical_slots``: force a ring size (at least the required one); default the required.
    ``strict=False`` also plans counts Megatron's interleaved schedule rejects (see
    :func:`reachable_counts`).
    Raises :class:`ScheduleError`, :class:`SlotPeriodError` or :class:`PlanError`.
    """
    g = check_layout(pp, vpp, group)
    counts = reachable_counts(
        pp, vpp, g, [microbatches] if isinstance(microbatches, int) else microbatches, strict
    )
    cps = cp_variants(cp_sizes)
    layers = layers_per_rank(layers_per_chunk, pp, vpp)
    orders = rank_order_arrays(pp, counts, vpp, g)
    per_rank_slots = _peaks(counts, orders, vpp)
    required = max(max(row) for row in per_rank_slots)
    if physical_slots is None:
        slots = required
    elif not isinstance(physical_slots, int) or isinstance(physical_slots, bool):
        raise PlanError(f"physical_slots must be an integer, got {physical_slots!r}")
    elif physical_slots < required:
        worst = max(range(pp), key=lambda r: max(per_rank_slots[r]))
        raise SlotPeriodError(
            f"physical_slots={physical_slots!r} is shorter than the slot period the schedule "
            f"needs: PP rank {worst} keeps up to {required} forwards of one chunk outstanding "
            f"(slots per chunk {list(per_rank_slots[worst])}); use at least {required}"
        )
    else:
        slots = physical_slots
    ranks = tuple(
        _plan_rank(pp, r, g, layers[r], cps, counts, orders[r], per_rank_slots[r], slots)
        for r in range(pp)
    )
    return PipelinePlan(
        pp=pp,
        vpp=vpp,
        group=g,
        cp_sizes=cps,
        microbatch_counts=counts,
        physical_slots=slots,
        ranks=ranks,
    )
