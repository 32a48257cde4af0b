"""Pure byte layouts for the arenas that hold everything which outlives one CUDA graph.

A *frame* is what one captured forward keeps alive until its backward: static inputs and
*components*. A component is one storage the forward produced, as far as its outputs and native
saved tensors use it: every output and native save that shares a storage is a view into the same
component, so overlapping views stay overlapping, outputs that alias each other keep their relation
after replay, and a saved tensor that is also an output is stored once. Outputs that are module
parameters or buffers (``EXTERNAL``) need no bytes: replay returns them as they are. A *saved arena* is one liveness colour; its size is the max over
its member frames. A *grad arena* holds the input grads one backward event returns, per layer.
No torch device work happens here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch

ALIGN = 256


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class TensorMeta:
    """Shape/stride/dtype of a tensor; ``offset`` is its storage offset in elements."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0
    requires_grad: bool = False

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(tuple(t.shape), tuple(t.stride()), t.dtype, t.storage_offset(), t.requires_grad)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize  # no tensor op: this runs inside traced forwards (see .direct)

    @property
    def extent_bytes(self) -> int:
        """Bytes from the first to one past the last element addressed."""
        if any(s == 0 for s in self.shape):
            return 0
        last = sum((s - 1) * st for s, st in zip(self.shape, self.stride))
        return (last + 1) * self.itemsize

    @property
    def start_byte(self) -> int:
        return self.offset * self.itemsize

    @property
    def overlaps_itself(self) -> bool:
        """True when two elements share a byte (e.g. an expanded, stride-0 view): such a view
        cannot be written element by element, only as the bytes it spans."""
        dims = sorted((st, n) for n, st in zip(self.shape, self.stride) if n > 1)
        if any(n == 0 for n in self.shape):
            return False
        reach = 0  # highest element offset addressed by the dims with smaller strides
        for st, n in dims:
            if st <= reach:
                return True
            reach += (n - 1) * st
        return False

    def signature(self) -> tuple[object, ...]:
        """What must agree across CP variants of one slot (everything but the sizes)."""
        return (len(self.shape), self.dtype, self.requires_grad)


def contiguous_meta(shape: Sequence[int], dtype: torch.dtype, requires_grad: bool = False) -> TensorMeta:
    stride: list[int] = []
    acc = 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(int(s), 1)
    return TensorMeta(tuple(int(s) for s in shape), tuple(reversed(stride)), dtype, 0, requires_grad)


def dense_bytes(meta: TensorMeta) -> int:
    """Bytes of a contiguous tensor of ``meta``'s shape and dtype."""
    n = 1
    for s in meta.shape:
        n *= s
    return n * meta.itemsize


# kinds of saved tensors
EXTERNAL = "external"  # parameters/buffers of the callable: saved as they are
INPUT = "input"  # a view of a static input: the input region lives in the frame
NATIVE = "native"  # anything else: copied into the frame's component region


@dataclass(frozen=True)
class SavedEntry:
    kind: str
    meta: TensorMeta
    component: int = -1  # NATIVE: index into ForwardPlan.components
    rel_byte: int = 0  # NATIVE: start byte relative to the component's start
    source: int = -1  # INPUT: index of the static input


# what a producer's return is written into
COMPONENT = "component"


@dataclass(frozen=True)
class Producer:
    """The op call that allocated a saved component or an output during warmup.

    ``call``: its index among the forward's redirectable op calls (see :mod:`.direct`); ``op``: the
    overload (``aten.addmm.default``); ``returns``: its outputs as warmup saw them; ``targets``: per
    return, ``(COMPONENT, index)`` of the component it writes, or ``None``.
    """

    call: int
    op: str
    returns: tuple[TensorMeta, ...]
    targets: tuple[tuple[str, int] | None, ...]


@dataclass(frozen=True)
class OutputPlace:
    """Where an output lives: ``NATIVE``: at ``rel_byte`` of component ``component`` (its own
    strides); ``EXTERNAL``: it is (a view of) a module parameter or buffer, returned as is."""

    kind: str
    component: int = -1
    rel_byte: int = 0


@dataclass(frozen=True)
class ForwardPlan:
    """What one (variant, chunk, layer) forward needs; observed during warmup."""

    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    saved: tuple[SavedEntry, ...]
    components: tuple[int, ...]  # byte sizes
    input_grads: tuple[bool, ...]  # which inputs get a returned grad
    params_used: tuple[bool, ...]  # which trainable parameters get a grad
    param_grad_bytes: int
    # ops that may write a component straight into the arena (see .direct)
    producers: tuple[Producer, ...] = ()
    # per output; empty: each output in a dense region of its own (plans built by hand)
    output_places: tuple[OutputPlace, ...] = ()

    def output_alone(self, k: int) -> bool:
        """Output ``k`` is in a component that holds nothing else (no save, no other output)."""
        if not self.output_places:
            return True
        place = self.output_places[k]
        if place.kind != NATIVE:
            return False
        others = [p for i, p in enumerate(self.output_places) if i != k and p.component == place.component]
        return not others and not any(e.kind == NATIVE and e.component == place.component for e in self.saved)

    def output_view_meta(self, k: int) -> TensorMeta:
        """Shape/strides of output ``k``'s arena view (its own, or contiguous without places)."""
        m = self.outputs[k]
        return m if self.output_places else contiguous_meta(m.shape, m.dtype)

    def signature(self) -> tuple[object, ...]:
        return (
            tuple(m.signature() for m in self.inputs),
            tuple(m.signature() for m in self.outputs),
            self.input_grads,
        )


Observation = tuple[str, int, TensorMeta, int]  # (kind, storage key, meta, source input or -1)


def component_spans(
    saves: Sequence[Observation], outputs: Sequence[Observation] = ()
) -> tuple[tuple[int, int, int], ...]:
    """``(storage_key, first byte, end byte)`` of each component, in component order: every
    storage used by a native save (in order of first use) and then by a native output, spanning
    all the bytes those saves and outputs address."""
    spans: dict[int, tuple[int, int]] = {}
    order: list[int] = []
    for kind, key, meta, _ in (*saves, *outputs):
        if kind != NATIVE:
            continue
        lo, hi = meta.start_byte, meta.start_byte + meta.extent_bytes
        if key in spans:
            a, b = spans[key]
            spans[key] = (min(a, lo), max(b, hi))
        else:
            spans[key] = (lo, hi)
            order.append(key)
    return tuple((k, *spans[k]) for k in order)


@dataclass(frozen=True)
class StorageGroups:
    """Saved entries, output places and component byte sizes of one forward."""

    saved: tuple[SavedEntry, ...]
    outputs: tuple[OutputPlace, ...]
    components: tuple[int, ...]


def group_storage(
    saves: Sequence[Observation],
    outputs: Sequence[Observation] = (),
    widen: Mapping[int, tuple[int, int]] | None = None,
) -> StorageGroups:
    """Turn raw observations ``(kind, storage_key, meta, source)`` of saves and outputs into
    entries, output places and component sizes.

    Native saves and native outputs that share ``storage_key`` form one component spanning all
    their bytes, or the byte range ``widen[storage_key]`` (which must contain them: a producer
    op's whole output). Outputs are ``NATIVE`` or ``EXTERNAL``.
    """
    comps = component_spans(saves, outputs)
    spans = {k: (lo, hi) for k, lo, hi in comps}
    for key, (lo, hi) in (widen or {}).items():
        a, b = spans[key]
        if not lo <= a <= b <= hi:
            raise ValueError(f"widened component [{lo}, {hi}) does not contain its saves [{a}, {b})")
        spans[key] = (lo, hi)
    index = {key: i for i, (key, _, _) in enumerate(comps)}

    def rel(meta: TensorMeta, key: int) -> int:
        r = meta.start_byte - spans[key][0]
        if r % meta.itemsize:
            raise ValueError(
                f"tensor {meta} starts {r} bytes into its storage group, not a multiple of its "
                "element size; mixed-dtype views of one storage at odd offsets are not supported"
            )
        return r

    entries: list[SavedEntry] = []
    for kind, key, meta, source in saves:
        if kind == NATIVE:
            entries.append(SavedEntry(NATIVE, meta, index[key], rel(meta, key)))
        elif kind == INPUT:
            entries.append(SavedEntry(INPUT, meta, source=source))
        elif kind == EXTERNAL:
            entries.append(SavedEntry(EXTERNAL, meta))
        else:
            raise ValueError(f"unknown saved-tensor kind {kind!r}")
    places: list[OutputPlace] = []
    for kind, key, meta, _ in outputs:
        if kind == NATIVE:
            places.append(OutputPlace(NATIVE, index[key], rel(meta, key)))
        elif kind == EXTERNAL:
            places.append(OutputPlace(EXTERNAL))
        else:
            raise ValueError(f"unknown output kind {kind!r}")
    sizes = tuple(spans[k][1] - spans[k][0] for k, _, _ in comps)
    return StorageGroups(tuple(entries), tuple(places), sizes)


@dataclass(frozen=True)
class FrameLayout:
    inputs: tuple[int, ...]  # byte offsets inside the frame (-1: staged in another frame's region)
    outputs: tuple[int, ...]  # byte offset of each output's view (-1: EXTERNAL, no bytes)
    components: tuple[int, ...]
    nbytes: int


def frame_layout(plan: ForwardPlan, staged_elsewhere: frozenset[int] = frozenset()) -> FrameLayout:
    """Inputs and components back to back (aligned); outputs are views into their components
    (a plan without output places gives each output a dense region of its own, after the inputs).
    Inputs in ``staged_elsewhere`` get no bytes here (offset -1): they live in another frame's
    region."""
    off = 0

    def take(n: int) -> int:
        nonlocal off
        at = off
        off += align(n)
        return at

    ins = tuple(-1 if i in staged_elsewhere else take(dense_bytes(m)) for i, m in enumerate(plan.inputs))
    own = None if plan.output_places else tuple(take(dense_bytes(m)) for m in plan.outputs)
    comps = tuple(take(n) for n in plan.components)
    if own is not None:
        outs = own
    else:
        outs = tuple(comps[p.component] + p.rel_byte if p.kind == NATIVE else -1 for p in plan.output_places)
    return FrameLayout(ins, outs, comps, off)


@dataclass(frozen=True)
class GradLayout:
    """Byte offsets of returned input grads per (layer, input) inside one grad-arena member."""

    offsets: Mapping[tuple[int, int], int]
    nbytes: int


def grad_layout(plans_by_layer: Sequence[ForwardPlan]) -> GradLayout:
    off = 0
    offsets: dict[tuple[int, int], int] = {}
    for layer, plan in enumerate(plans_by_layer):
        for i, (meta, wanted) in enumerate(zip(plan.inputs, plan.input_grads)):
            if wanted:
                offsets[(layer, i)] = off
                off += align(dense_bytes(meta))
    return GradLayout(offsets, off)


def arena_sizes(members: Iterable[tuple[int, int]]) -> dict[int, int]:
    """``(colour, bytes)`` pairs -> colour -> max bytes (each aligned)."""
    out: dict[int, int] = {}
    for colour, n in members:
        out[colour] = max(out.get(colour, 0), align(n))
    return out


@dataclass(frozen=True)
class BackingLayout:
    """Where each named region sits inside the one backing allocation."""

    offsets: Mapping[tuple[str, int], int]
    sizes: Mapping[tuple[str, int], int]
    nbytes: int


def pack_backing(regions: Mapping[tuple[str, int], int]) -> BackingLayout:
    """Place regions ``(kind, colour) -> bytes`` back to back, aligned, in sorted key order."""
    off = 0
    offsets: dict[tuple[str, int], int] = {}
    sizes: dict[tuple[str, int], int] = {}
    for key in sorted(regions):
        offsets[key] = off
        sizes[key] = align(regions[key])
        off += sizes[key]
    return BackingLayout(offsets, sizes, max(off, ALIGN))


def view_at(backing: torch.Tensor, byte_offset: int, meta: TensorMeta, *, keep_strides: bool = True) -> torch.Tensor:
    """A tensor of ``meta``'s shape/dtype at ``byte_offset`` of a uint8 ``backing``.

    With ``keep_strides`` the view has ``meta``'s strides (its storage offset is re-based), else it
    is contiguous.
    """
    itemsize = meta.itemsize
    if byte_offset % itemsize:
        raise ValueError(f"byte offset {byte_offset} is not aligned to {meta.dtype}")
    typed = backing.view(meta.dtype)
    stride = meta.stride if keep_strides else contiguous_meta(meta.shape, meta.dtype).stride
    return typed.as_strided(meta.shape, stride, byte_offset // itemsize)


def is_contiguous_meta(meta: TensorMeta) -> bool:
    """``meta`` addresses its elements densely in row-major order."""
    want = contiguous_meta(meta.shape, meta.dtype).stride
    return all(n <= 1 or s == w for n, s, w in zip(meta.shape, meta.stride, want))


Key = tuple[int, int, int]  # (cp_size, chunk, layer)


@dataclass(frozen=True)
class ArenaLayout:
    """Every byte the graphs keep: per (cp_size, chunk, layer) a frame layout, per (cp_size,
    chunk) a grad layout, and the regions of the one backing allocation (per saved colour, per
    grad colour, the output-grad scratch ``("gout", 0)`` and the param-grad scratch
    ``("pgrad", 0)``). ``chained``: forwards whose first input is staged in the previous layer's
    output view (no bytes of their own for it)."""

    chained: frozenset[Key]
    frames: Mapping[Key, FrameLayout]
    grads: Mapping[tuple[int, int], GradLayout]
    backing: BackingLayout

    def region(self, kind: str, colour: int) -> int:
        return self.backing.offsets[(kind, colour)]


def can_chain(plans: Mapping[Key, ForwardPlan], key: Key) -> bool:
    """Layer l's first input can be staged in layer l-1's output view: same chunk and slot (so
    the same lifetime), one output alone in its component (no save of layer l-1 shares its bytes,
    which a copy into the staged input would overwrite), contiguous, same shape and dtype."""
    v, c, l = key
    if l == 0:
        return False
    prev, plan = plans[(v, c, l - 1)], plans[key]
    if len(prev.outputs) != 1 or not plan.inputs or not prev.output_alone(0):
        return False
    a, b = prev.output_view_meta(0), plan.inputs[0]
    return (a.shape, a.dtype) == (b.shape, b.dtype) and is_contiguous_meta(a)


def plan_arenas(plans: Mapping[Key, ForwardPlan], layers: Sequence[int], variants: Sequence[int],
                saved_colour: Mapping[tuple[int, int, int], int], grad_colour: Mapping[tuple[int, int], int],
                chain_layers: bool = True, pgrad_bytes: Mapping[Key, int] | None = None) -> ArenaLayout:
    """The arena layout for warmup's ``plans`` under a plan's colours (``saved_colour[(chunk,
    slot, layer)]``, ``grad_colour[(chunk, slot)]``): every arena sized max over its members.
    ``pgrad_bytes[key]``: the scratch the backward of ``key`` returns parameter grads in (its
    parameters whose grads the graph accumulates into ``main_grad`` need none); default: every
    used parameter's grad."""
    chained = frozenset(k for k in plans if chain_layers and can_chain(plans, k))
    frames = {k: frame_layout(p, frozenset({0}) if k in chained else frozenset()) for k, p in plans.items()}
    grads = {(v, c): grad_layout([plans[(v, c, l)] for l in range(n)])
             for v in variants for c, n in enumerate(layers) if n}
    saved = arena_sizes((colour, frames[(v, c, l)].nbytes) for (c, _, l), colour in saved_colour.items() for v in variants)
    grad = arena_sizes((colour, grads[(v, c)].nbytes) for (c, _), colour in grad_colour.items() for v in variants)
    regions: dict[tuple[str, int], int] = {("saved", c): n for c, n in saved.items()}
    regions.update({("grad", c): n for c, n in grad.items()})
    regions[("gout", 0)] = max(sum(align(dense_bytes(m)) for m in p.outputs) for p in plans.values())
    if pgrad_bytes is None:
        pgrad_bytes = {k: p.param_grad_bytes + ALIGN * len(p.params_used) for k, p in plans.items()}
    regions[("pgrad", 0)] = max(pgrad_bytes[k] for k in plans)
    return ArenaLayout(chained, frames, grads, pack_backing(regions))
