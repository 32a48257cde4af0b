"""Pure byte layouts for the arenas that hold everything which outlives one CUDA graph.

A *frame* is what one captured forward keeps alive until its backward: static inputs, outputs and
native saved tensors (several saves that share one storage form one *component*, copied together so
overlapping views stay overlapping). A *saved arena* is one liveness colour; its size is the max over
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
OUTPUT = "output"


@dataclass(frozen=True)
class Producer:
    """The op call that allocated a saved component or an output during warmup.

    ``call``: its index among the forward's redirectable op calls (see :mod:`.direct`); ``op``: the
    overload (``aten.addmm.default``); ``returns``: its outputs as warmup saw them; ``targets``: per
    return, ``(COMPONENT|OUTPUT, index)`` of the arena region it writes, or ``None``.
    """

    call: int
    op: str
    returns: tuple[TensorMeta, ...]
    targets: tuple[tuple[str, int] | None, ...]


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
    # ops that may write a component or an output straight into the arena (see .direct)
    producers: tuple[Producer, ...] = ()

    def signature(self) -> tuple[object, ...]:
        return (
            tuple(m.signature() for m in self.inputs),
            tuple(m.signature() for m in self.outputs),
            self.input_grads,
        )


def component_spans(saves: Sequence[tuple[str, int, TensorMeta, int]]) -> tuple[tuple[int, int, int], ...]:
    """``(storage_key, first byte, end byte)`` of each component, in component order: the native
    saves that share ``storage_key``, spanning all their bytes."""
    spans: dict[int, tuple[int, int]] = {}
    order: list[int] = []
    for kind, key, meta, _ in saves:
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


def group_saves(
    saves: Sequence[tuple[str, int, TensorMeta, int]],
    widen: Mapping[int, tuple[int, int]] | None = None,
) -> tuple[tuple[SavedEntry, ...], tuple[int, ...]]:
    """Turn raw observations ``(kind, storage_key, meta, source)`` into entries + component sizes.

    Native saves that share ``storage_key`` form one component spanning all their bytes, or the
    byte range ``widen[storage_key]`` (which must contain them: a producer op's whole output).
    """
    comps = component_spans(saves)
    spans = {k: (lo, hi) for k, lo, hi in comps}
    for key, (lo, hi) in (widen or {}).items():
        a, b = spans[key]
        if not lo <= a <= b <= hi:
            raise ValueError(f"widened component [{lo}, {hi}) does not contain its saves [{a}, {b})")
        spans[key] = (lo, hi)
    order = [k for k, _, _ in comps]
    index = {key: i for i, key in enumerate(order)}
    entries: list[SavedEntry] = []
    for kind, key, meta, source in saves:
        if kind == NATIVE:
            rel = meta.start_byte - spans[key][0]
            if rel % meta.itemsize:
                raise ValueError(
                    f"saved tensor {meta} starts {rel} bytes into its storage group, not a multiple of its "
                    "element size; mixed-dtype views of one storage at odd offsets are not supported"
                )
            entries.append(SavedEntry(NATIVE, meta, index[key], rel))
        elif kind == INPUT:
            entries.append(SavedEntry(INPUT, meta, source=source))
        elif kind == EXTERNAL:
            entries.append(SavedEntry(EXTERNAL, meta))
        else:
            raise ValueError(f"unknown saved-tensor kind {kind!r}")
    sizes = tuple(spans[k][1] - spans[k][0] for k in order)
    return tuple(entries), sizes


@dataclass(frozen=True)
class FrameLayout:
    inputs: tuple[int, ...]  # byte offsets inside the frame
    outputs: tuple[int, ...]
    components: tuple[int, ...]
    nbytes: int


def frame_layout(plan: ForwardPlan, staged_elsewhere: frozenset[int] = frozenset()) -> FrameLayout:
    """Inputs, outputs and saved components back to back (aligned). Inputs in
    ``staged_elsewhere`` get no bytes here (offset -1): they live in another frame's region."""
    off = 0

    def take(n: int) -> int:
        nonlocal off
        at = off
        off += align(n)
        return at

    ins = tuple(-1 if i in staged_elsewhere else take(dense_bytes(m)) for i, m in enumerate(plan.inputs))
    outs = tuple(take(dense_bytes(m)) for m in plan.outputs)
    comps = tuple(take(n) for n in plan.components)
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
