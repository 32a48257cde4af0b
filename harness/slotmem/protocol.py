"""The slot-plan records capture consumes, and the fail-closed checks on them (pure Python).

Capture reads one record per captured forward with these attributes (the planner's ``SlotRecord``
has them; :class:`CaptureRecord` is this module's own frozen form):

``cp_size, chunk (1-based, as in the order), layer, microbatch, slot, branch, saved_colour,
grad_colour, warmup_group``.

``order`` is one rank's schedule in Megatron's ``_order`` convention: ``+c`` forward of chunk ``c``
for its next microbatch, ``-c`` backward of chunk ``c`` for its oldest outstanding microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence


class PlanError(ValueError):
    """The slot plan is inconsistent or unsafe for the given orders."""


@dataclass(frozen=True)
class CaptureRecord:
    cp_size: int
    chunk: int
    layer: int
    microbatch: int
    slot: int
    branch: int
    saved_colour: int
    grad_colour: int
    warmup_group: int = 0


FIELDS = tuple(CaptureRecord.__dataclass_fields__)


def as_record(obj: Any) -> CaptureRecord:
    """Read a record-like object (the planner's record, a mapping or a CaptureRecord)."""
    if isinstance(obj, CaptureRecord):
        return obj
    get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
    missing = [f for f in FIELDS if f != "warmup_group" and get(f) is None]
    if missing:
        raise PlanError(f"slot record {obj!r} lacks fields {missing}; expected {list(FIELDS)}")
    return CaptureRecord(**{f: int(get(f, 0) or 0) for f in FIELDS})


@dataclass(frozen=True)
class Event:
    """One schedule event: ``forward`` or backward of ``chunk`` (1-based) for ``microbatch``."""

    index: int
    forward: bool
    chunk: int
    microbatch: int


def events(order: Sequence[int]) -> list[Event]:
    """Assign microbatches to an order's entries (per-chunk FIFO), checking it drains."""
    fwd: dict[int, int] = {}
    bwd: dict[int, int] = {}
    out: list[Event] = []
    for i, entry in enumerate(order):
        if entry == 0 or int(entry) != entry:
            raise PlanError(f"order entry {entry!r} at position {i} is not a non-zero integer chunk id")
        c = abs(int(entry))
        if entry > 0:
            m = fwd.get(c, 0)
            fwd[c] = m + 1
            out.append(Event(i, True, c, m))
        else:
            m = bwd.get(c, 0)
            if m >= fwd.get(c, 0):
                raise PlanError(f"order position {i}: backward of chunk {c} microbatch {m} before its forward")
            bwd[c] = m + 1
            out.append(Event(i, False, c, m))
    for c, n in fwd.items():
        if bwd.get(c, 0) != n:
            raise PlanError(f"order does not drain: chunk {c} has {n} forwards and {bwd.get(c, 0)} backwards")
    return out


@dataclass(frozen=True)
class SlotMap:
    """Lookup tables derived from the records (validated for internal consistency)."""

    variants: tuple[int, ...]  # CP sizes, canonical (branch 0) first
    slots: Mapping[int, int]  # chunk -> number of physical slots
    layers: Mapping[int, int]  # chunk -> number of layers
    slot_of: Mapping[tuple[int, int], int]  # (chunk, microbatch) -> slot
    saved_colour: Mapping[tuple[int, int, int], int]  # (chunk, slot, layer) -> colour
    grad_colour: Mapping[tuple[int, int], int]  # (chunk, slot) -> colour
    warmup_group: Mapping[tuple[int, int, int], int]  # (cp, chunk, layer) -> group


def build_slot_map(records: Iterable[Any]) -> SlotMap:
    recs = [as_record(r) for r in records]
    if not recs:
        raise PlanError("the slot plan has no records")
    branch_of: dict[int, int] = {}
    slot_of: dict[tuple[int, int], int] = {}
    saved: dict[tuple[int, int, int], int] = {}
    grad: dict[tuple[int, int], int] = {}
    group: dict[tuple[int, int, int], int] = {}
    layers: dict[int, int] = {}
    seen: set[tuple[int, int, int, int]] = set()

    def agree(table: dict[Any, int], key: Any, value: int, what: str, r: CaptureRecord) -> None:
        if table.setdefault(key, value) != value:
            raise PlanError(f"record {r}: {what} {value} disagrees with {table[key]} for {key}")

    for r in recs:
        if r.chunk < 1 or r.layer < 0 or r.microbatch < 0 or r.slot < 0 or r.cp_size < 1:
            raise PlanError(f"record {r}: chunk is 1-based; layer, microbatch, slot >= 0; cp_size >= 1")
        key = (r.cp_size, r.chunk, r.layer, r.microbatch)
        if key in seen:
            raise PlanError(f"two records for cp_size {r.cp_size}, chunk {r.chunk}, layer {r.layer}, microbatch {r.microbatch}")
        seen.add(key)
        agree(branch_of, r.cp_size, r.branch, "branch id", r)
        agree(slot_of, (r.chunk, r.microbatch), r.slot, "physical slot", r)
        agree(saved, (r.chunk, r.slot, r.layer), r.saved_colour, "saved colour", r)
        agree(grad, (r.chunk, r.slot), r.grad_colour, "grad colour", r)
        agree(group, (r.cp_size, r.chunk, r.layer), r.warmup_group, "warmup group", r)
        layers[r.chunk] = max(layers.get(r.chunk, 0), r.layer + 1)
    if sorted(branch_of.values()) != list(range(len(branch_of))):
        raise PlanError(f"branch ids {branch_of} must be 0..K-1, one per CP size")
    variants = tuple(sorted(branch_of, key=branch_of.__getitem__))
    # every variant must have every (chunk, layer, microbatch): lockstep needs complete families
    base = {(c, l, m) for (_, c, l, m) in seen}
    for v in variants:
        lacking = sorted(k for k in base if (v, *k) not in seen)
        if lacking:
            raise PlanError(f"CP size {v} has no record for (chunk, layer, microbatch) {lacking[:4]}; "
                            "every variant of a slot must be captured")
    for c, n in layers.items():
        for m in {m for (cc, m) in slot_of if cc == c}:
            if any((variants[0], c, l, m) not in seen for l in range(n)):
                raise PlanError(f"chunk {c} microbatch {m} lacks records for some of its {n} layers")
    slots = {c: 1 + max(s for (cc, _), s in slot_of.items() if cc == c) for c in layers}
    return SlotMap(variants, slots, layers, slot_of, saved, grad, group)


def check_liveness(order: Sequence[int], smap: SlotMap) -> None:
    """Fail closed unless the slot ring and colours are safe for ``order``.

    Saved frame (chunk, slot, layer) lives from its forward event to its backward event; a grad
    frame (chunk, slot) from its backward event to the end of the next backward event (the PP send
    of the returned grad is still in flight). No two live frames may share a slot or a colour.
    """
    evs = events(order)
    open_saved: dict[int, tuple[int, int, int, int]] = {}  # colour -> frame (chunk, slot, layer, mb)
    open_slots: dict[tuple[int, int], int] = {}  # (chunk, slot) -> microbatch
    open_grad: dict[int, tuple[int, int, int]] = {}  # colour -> (chunk, slot, mb)
    pending_grad: list[tuple[int, tuple[int, int, int]]] = []  # grads to close at the next backward end
    for ev in evs:
        key = (ev.chunk, ev.microbatch)
        if key not in smap.slot_of:
            raise PlanError(f"order position {ev.index}: no slot record for chunk {ev.chunk} microbatch {ev.microbatch}")
        slot = smap.slot_of[key]
        if ev.forward:
            holder = open_slots.get((ev.chunk, slot))
            if holder is not None:
                raise PlanError(
                    f"order position {ev.index}: chunk {ev.chunk} microbatch {ev.microbatch} reuses physical "
                    f"slot {slot} while microbatch {holder} still holds it; the slot ring is too small"
                )
            open_slots[(ev.chunk, slot)] = ev.microbatch
            for layer in range(smap.layers[ev.chunk]):
                colour = smap.saved_colour[(ev.chunk, slot, layer)]
                other = open_saved.get(colour)
                if other is not None:
                    raise PlanError(
                        f"order position {ev.index}: saved colour {colour} is given to live frames (chunk, slot, "
                        f"layer, microbatch) {other} and {(ev.chunk, slot, layer, ev.microbatch)}"
                    )
                open_saved[colour] = (ev.chunk, slot, layer, ev.microbatch)
        else:
            del open_slots[(ev.chunk, slot)]
            for layer in range(smap.layers[ev.chunk]):
                del open_saved[smap.saved_colour[(ev.chunk, slot, layer)]]
            colour = smap.grad_colour[(ev.chunk, slot)]
            other = open_grad.get(colour)
            if other is not None:
                raise PlanError(
                    f"order position {ev.index}: grad colour {colour} is given to live grad frames (chunk, slot, "
                    f"microbatch) {other} and {(ev.chunk, slot, ev.microbatch)}"
                )
            for c_old, frame in pending_grad:
                if open_grad.get(c_old) == frame:
                    del open_grad[c_old]
            pending_grad = [(colour, (ev.chunk, slot, ev.microbatch))]
            open_grad[colour] = (ev.chunk, slot, ev.microbatch)


@dataclass(frozen=True)
class CaptureStep:
    """One lockstep unit: every variant of (forward|backward, chunk, slot, layer)."""

    forward: bool
    chunk: int
    slot: int
    layer: int
    microbatch: int


def capture_steps(order: Sequence[int], smap: SlotMap) -> list[CaptureStep]:
    """Capture order: the base order's events, each (chunk, slot) captured once per direction,
    forward layers ascending, backward layers descending."""
    done: set[tuple[bool, int, int]] = set()
    steps: list[CaptureStep] = []
    for ev in events(order):
        slot = smap.slot_of[(ev.chunk, ev.microbatch)]
        key = (ev.forward, ev.chunk, slot)
        if key in done:
            continue
        done.add(key)
        n = smap.layers[ev.chunk]
        layer_iter = range(n) if ev.forward else range(n - 1, -1, -1)
        steps.extend(CaptureStep(ev.forward, ev.chunk, slot, l, ev.microbatch) for l in layer_iter)
    missing = {(c, s) for (c, _), s in smap.slot_of.items()} - {(c, s) for (f, c, s) in done if f}
    if missing:
        raise PlanError(f"the order never runs (chunk, slot) {sorted(missing)[:4]}; nothing would capture them")
    return steps
