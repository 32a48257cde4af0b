"""What capture reads from a slot plan, and the fail-closed checks it runs on it (pure Python).

Capture reads one :class:`~harness.slotmem.records.SlotRecord` per captured forward x layer x
variant: the planner's records as they are, or records given as mappings (or other objects) with
the same fields, read by :func:`as_record`. Such a record may leave out ``variant`` (the variants
are then ordered by ascending CP size) and ``warmup_group`` (0: every callable in one group).

``order`` is one rank's schedule in Megatron's ``_order`` convention (``+c`` forward of 1-based chunk
``c`` for its next microbatch, ``-c`` backward of its oldest outstanding microbatch).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

from .liveness import PlanChecker, grad_lifetimes, walk_orders
from .planerrors import PlanError
from .records import SlotRecord
from .schedule import OrderEvent, check_order, order_events

FIELDS = tuple(f.name for f in fields(SlotRecord))
# fields a record given as a mapping may leave out; variant -1: order variants by ascending CP size
_OPTIONAL = {"warmup_group": 0, "variant": -1}


def as_record(obj: Any) -> SlotRecord:
    """Read a record-like object (a :class:`SlotRecord`, a mapping or an object with its fields)."""
    if isinstance(obj, SlotRecord):
        return obj
    get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
    missing = [f for f in FIELDS if f not in _OPTIONAL and get(f) is None]
    if missing:
        raise PlanError(f"slot record {obj!r} lacks fields {missing}; expected {list(FIELDS)}")
    values = {f: get(f, _OPTIONAL.get(f)) for f in FIELDS}
    return SlotRecord(**{f: int(_OPTIONAL[f] if v is None else v) for f, v in values.items()})


def events(order: Sequence[int], chunks: int) -> tuple[OrderEvent, ...]:
    """The order's events with 0-based chunk and logical microbatch; it must drain."""
    check_order(order, chunks)
    return order_events(order, chunks)


@dataclass(frozen=True)
class SlotMap:
    """Lookup tables derived from the records (validated for internal consistency)."""

    variants: tuple[int, ...]  # CP sizes, canonical first
    layers: tuple[int, ...]  # layers of each chunk (0-based index; zero-layer chunks allowed)
    slots: Mapping[int, int]  # chunk -> number of physical slots (chunks with layers only)
    slot_of: Mapping[tuple[int, int], int]  # (chunk, microbatch) -> slot
    saved_colour: Mapping[tuple[int, int, int], int]  # (chunk, slot, layer) -> colour
    grad_colour: Mapping[tuple[int, int], int]  # (chunk, slot) -> colour
    warmup_group: Mapping[tuple[int, int, int], int]  # (cp, chunk, layer) -> group


def build_slot_map(records: Iterable[Any], layers_per_chunk: Sequence[int]) -> SlotMap:
    """Validate the records against each other and the callables' ``layers_per_chunk``."""
    recs = [as_record(r) for r in records]
    if not recs:
        raise PlanError("the slot plan has no records")
    variant_of: dict[int, int] = {}
    slot_of: dict[tuple[int, int], int] = {}
    saved: dict[tuple[int, int, int], int] = {}
    grad: dict[tuple[int, int], int] = {}
    group: dict[tuple[int, int, int], int] = {}
    branches: dict[tuple[int, int, int], dict[int, int]] = {}
    seen: set[tuple[int, int, int, int]] = set()

    def agree(table: dict[Any, int], key: Any, value: int, what: str, r: SlotRecord) -> None:
        if table.setdefault(key, value) != value:
            raise PlanError(f"record {r}: {what} {value} disagrees with {table[key]} for {key}")

    for r in recs:
        if not 0 <= r.chunk < len(layers_per_chunk) or not 0 <= r.layer < layers_per_chunk[r.chunk]:
            raise PlanError(f"record {r}: no layer {r.layer} in chunk {r.chunk} (0-based); the callables have "
                            f"layers per chunk {list(layers_per_chunk)}")
        if r.microbatch < 0 or r.slot < 0 or r.cp_size < 1:
            raise PlanError(f"record {r}: microbatch and slot must be >= 0, cp_size >= 1")
        key = (r.cp_size, r.chunk, r.layer, r.microbatch)
        if key in seen:
            raise PlanError(f"two records for cp_size {r.cp_size}, chunk {r.chunk}, layer {r.layer}, "
                            f"microbatch {r.microbatch}")
        seen.add(key)
        agree(variant_of, r.cp_size, r.variant, "variant index", r)
        agree(slot_of, (r.chunk, r.microbatch), r.slot, "physical slot", r)
        agree(saved, (r.chunk, r.slot, r.layer), r.saved_colour, "saved colour", r)
        agree(grad, (r.chunk, r.slot), r.grad_colour, "grad colour", r)
        agree(group, (r.cp_size, r.chunk, r.layer), r.warmup_group, "warmup group", r)
        agree(branches.setdefault((r.slot, r.chunk, r.layer), {}), r.cp_size, r.branch, "branch", r)
    if all(v == -1 for v in variant_of.values()):
        variants = tuple(sorted(variant_of))
    elif sorted(variant_of.values()) == list(range(len(variant_of))):
        variants = tuple(sorted(variant_of, key=variant_of.__getitem__))
    else:
        raise PlanError(f"variant indices {variant_of} must be 0..K-1, one per CP size")
    for family, by_cp in branches.items():
        if len(set(by_cp.values())) != len(by_cp):
            raise PlanError(f"I/O family (slot, chunk, layer) {family}: CP variants share a branch id {by_cp}; "
                            "the variants of one slot must be distinct, mutually exclusive branches")
    base = {(c, l, m) for (_, c, l, m) in seen}
    for v in variants:
        lacking = sorted(k for k in base if (v, *k) not in seen)
        if lacking:
            raise PlanError(f"CP size {v} has no record for (chunk, layer, microbatch) {lacking[:4]}; "
                            "every variant of a slot must be captured")
    for (c, m) in slot_of:
        if any((variants[0], c, l, m) not in seen for l in range(layers_per_chunk[c])):
            raise PlanError(f"chunk {c} microbatch {m} lacks records for some of its {layers_per_chunk[c]} layers")
    for c, n in enumerate(layers_per_chunk):
        if n and not any(cc == c for (cc, _) in slot_of):
            raise PlanError(f"chunk {c} has {n} layers but no slot record")
    slots = {c: 1 + max(s for (cc, _), s in slot_of.items() if cc == c)
             for c, n in enumerate(layers_per_chunk) if n}
    if len(set(slots.values())) > 1:
        raise PlanError(f"chunks use different slot rings {slots} (chunk -> slots); every chunk must use the same "
                        "physical_slots (microbatch m replays slot m % physical_slots in every chunk)")
    for c in slots:
        used = sorted({s for (cc, _), s in slot_of.items() if cc == c})
        if used != list(range(slots[c])):
            raise PlanError(f"chunk {c} has records for slots {used}; the ring must be slots 0..{slots[c] - 1}")
    return SlotMap(variants, tuple(layers_per_chunk), slots, slot_of, saved, grad, group)


def ring(smap: SlotMap) -> int:
    """The plan's physical slot count (one ring for every chunk, see :func:`build_slot_map`)."""
    return max(smap.slots.values())


def check_orders(orders: Sequence[tuple[str, Sequence[int]]], smap: SlotMap, pp: int) -> None:
    """Fail closed unless the records' slot ring and colours are safe for every ``(label, order)``.

    This is the planner's own check (:class:`~.liveness.PlanChecker`, what
    :meth:`~.plan.SlotPlan.validate` runs), so capture and planner apply ONE liveness rule: a
    saved frame (chunk, slot, layer) lives from its forward to its backward; the input grad a
    backward returns lives until the next backward has finished when it goes over P2P (PP > 1 or
    VPP > 1) and, with PP = 1 and VPP > 1, until its same-rank consumer chunk's backward
    (:func:`~.liveness.grad_lifetimes`). No two live frames may share a slot or a colour.
    """
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise PlanError(f"pp must be a positive integer (the pipeline size the orders run under), got {pp!r}")
    checker = PlanChecker(ring(smap), smap.layers, pp, dict(smap.saved_colour), dict(smap.grad_colour))
    walk_orders(list(orders), checker)


def check_liveness(order: Sequence[int], smap: SlotMap, pp: int = 2) -> None:
    """:func:`check_orders` for one order (``pp``: the pipeline size; 2 = grads in flight)."""
    check_orders([("order", order)], smap, pp)


def live_colours(order: Sequence[int], smap: SlotMap, upto: int, pp: int = 2) -> tuple[set[int], set[int]]:
    """Saved and grad colours live after the first ``upto`` events of ``order`` under the rule of
    :func:`check_orders` (for poisoning dead memory between replays)."""
    slots = ring(smap)
    _, grads = grad_lifetimes(slots, smap.layers, pp)
    saved: dict[tuple[int, int], set[int]] = {}
    live_grads = 0
    for ev in events(order, len(smap.layers))[:upto]:
        n = smap.layers[ev.chunk]
        if n == 0:
            continue
        slot = ev.microbatch % slots
        if ev.forward:
            saved[(ev.chunk, ev.microbatch)] = {smap.saved_colour[(ev.chunk, slot, l)] for l in range(n)}
        else:
            del saved[(ev.chunk, ev.microbatch)]
            grads.backward(ev.chunk, ev.microbatch)
            live_grads = grads.live_mask()
    grad = {smap.grad_colour[(f // slots, f % slots)] for f in range(live_grads.bit_length()) if live_grads >> f & 1}
    return set().union(*saved.values()) if saved else set(), grad


@dataclass(frozen=True)
class CaptureStep:
    """One lockstep unit: every variant of (forward|backward, chunk, slot, layer)."""

    forward: bool
    chunk: int
    slot: int
    layer: int
    microbatch: int


def capture_steps(order: Sequence[int], smap: SlotMap) -> list[CaptureStep]:
    """Capture order: the order's events, each (chunk, slot) captured once per direction,
    forward layers ascending, backward layers descending."""
    done: set[tuple[bool, int, int]] = set()
    steps: list[CaptureStep] = []
    for ev in events(order, len(smap.layers)):
        n = smap.layers[ev.chunk]
        if n == 0:
            continue
        slot = ev.microbatch % smap.slots[ev.chunk]
        if smap.slot_of.get((ev.chunk, ev.microbatch), slot) != slot:
            raise PlanError(f"record slot {smap.slot_of[(ev.chunk, ev.microbatch)]} of chunk {ev.chunk} microbatch "
                            f"{ev.microbatch} is not microbatch % {smap.slots[ev.chunk]}; replay selects by modulo")
        key = (ev.forward, ev.chunk, slot)
        if key in done:
            continue
        done.add(key)
        layer_iter = range(n) if ev.forward else range(n - 1, -1, -1)
        steps.extend(CaptureStep(ev.forward, ev.chunk, slot, l, ev.microbatch) for l in layer_iter)
    missing = {(c, s) for (c, _), s in smap.slot_of.items()} - {(c, s) for (f, c, s) in done if f}
    if missing:
        raise PlanError(f"the order never runs (chunk, slot) {sorted(missing)[:4]}; nothing would capture them")
    return steps
