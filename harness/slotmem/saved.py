"""Saved-tensor hooks: observe what a forward saves (warmup) and pack saves into arena views (capture).

A saved tensor is ``EXTERNAL`` (its bytes are module state: a parameter, a buffer, or a wrapper
subclass whose inner tensors all are), ``INPUT`` (a view of a static input) or ``NATIVE`` (made by
the forward: it goes into its component of the frame's arena). A wrapper-subclass save whose
bytes are not module state cannot be placed in an arena and is refused (:class:`WarmupError`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from .arenas import EXTERNAL, INPUT, NATIVE, Observation, SavedEntry, StorageGroups, TensorMeta, group_storage
from .tensors import WarmupError, has_storage, storage_key, storage_keys


class CaptureMismatch(RuntimeError):
    """A captured forward does not match what warmup observed for it."""


_storage_key = storage_key


def _byte_span(t: torch.Tensor) -> torch.Tensor:
    """The bytes ``t`` addresses (first to one past the last element), as a uint8 tensor."""
    m = TensorMeta.of(t)
    return torch.empty((0,), dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), m.start_byte, (m.extent_bytes,), (1,))


def copy_view(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a ``dst`` laid out like ``src``; a view whose elements share bytes
    (``expand``: stride 0) cannot be written element-wise, so its byte span is copied instead."""
    with torch.no_grad():
        if TensorMeta.of(dst).overlaps_itself:
            if (tuple(src.shape), tuple(src.stride()), src.dtype) != (tuple(dst.shape), tuple(dst.stride()), dst.dtype):
                raise CaptureMismatch(f"cannot copy a {tuple(src.shape)}/{tuple(src.stride())} tensor into a "
                                      f"self-overlapping {tuple(dst.shape)}/{tuple(dst.stride())} view")
            _byte_span(dst).copy_(_byte_span(src))
        else:
            dst.copy_(src)


def classify(t: torch.Tensor, external: set[int], source: int, what: str) -> tuple[str, int]:
    """``(kind, storage key)`` of a saved tensor or output: ``EXTERNAL`` (module state), ``INPUT``
    (``source >= 0``: a view of that input) or ``NATIVE``."""
    if not has_storage(t):
        keys = storage_keys(t)
        if keys and keys <= external:
            return EXTERNAL, min(keys)
        raise WarmupError(
            f"{what} is a {type(t).__name__}, a wrapper tensor subclass whose bytes are not module state "
            f"(its inner storages {sorted(hex(k) for k in keys) or 'cannot be found'}); slot-shared capture places "
            "saved tensors by storage and cannot put it in an arena. Save its plain inner tensors instead "
            "(or keep it a parameter/buffer of the module)"
        )
    key = _storage_key(t)
    if key in external:
        return EXTERNAL, key
    if source >= 0:
        return INPUT, key
    return NATIVE, key


class _InputIndex:
    """Which static input (if any) a tensor is a view of, by storage and byte range.

    Range-based because at capture every static input is a view of the same backing allocation."""

    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        self._spans = []
        for i, t in enumerate(inputs):
            lo = t.data_ptr()
            self._spans.append((_storage_key(t), lo, lo + max(t.numel() * t.element_size(), 1), i))

    def find(self, t: torch.Tensor) -> int:
        key, ptr = _storage_key(t), t.data_ptr()
        for skey, lo, hi, i in self._spans:
            if skey == key and lo <= ptr < hi:
                return i
        return -1


class SaveObserver:
    """Pack hook for warmup: records every save, returns it unchanged; then the outputs."""

    def __init__(self, external: set[int], inputs: Sequence[torch.Tensor]) -> None:
        self._external = external
        self._inputs = _InputIndex(inputs)
        self.raw: list[Observation] = []
        self.outputs: list[Observation] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        source = self._inputs.find(t) if has_storage(t) else -1
        kind, key = classify(t, self._external, source, f"saved tensor {len(self.raw)}")
        self.raw.append((kind, key, TensorMeta.of(t), source if kind == INPUT else -1))
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def observe_outputs(self, outputs: Sequence[torch.Tensor]) -> None:
        """Outputs of module state are ``EXTERNAL`` (returned as they are); every other output,
        also one that views an input, is ``NATIVE`` (it gets its component's bytes)."""
        for k, o in enumerate(outputs):
            kind, key = classify(o, self._external, -1, f"output {k}")
            self.outputs.append((kind, key, TensorMeta.of(o), -1))

    def groups(self, widen: Mapping[int, tuple[int, int]] | None = None) -> StorageGroups:
        """Saved entries, output places and components of the saves and outputs observed."""
        return group_storage(self.raw, self.outputs, widen)


class ArenaPacker:
    """Pack hook for capture: the k-th save is copied into its planned arena view (unless it is
    already there, written by its producer op).

    ``views[k]`` is the arena view for a NATIVE save (``None`` otherwise). External and input saves
    are returned unchanged after checking they are what warmup saw.
    """

    def __init__(
        self,
        name: str,
        entries: Sequence[SavedEntry],
        views: Sequence[torch.Tensor | None],
        external: set[int],
        inputs: Sequence[torch.Tensor],
    ) -> None:
        self._name = name
        self._entries = entries
        self._views = views
        self._external = external
        self._inputs = _InputIndex(inputs)
        self._component_base: dict[int, tuple[int, int]] = {}  # component -> (storage key, start - rel)
        self._k = 0
        self.copies = 0  # native saves copied into the arena (the others were already there)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        k = self._k
        self._k += 1
        if k >= len(self._entries):
            raise CaptureMismatch(f"{self._name}: saves more tensors during capture than warmup saw ({len(self._entries)})")
        entry = self._entries[k]
        meta = TensorMeta.of(t)
        if (meta.shape, meta.stride, meta.dtype) != (entry.meta.shape, entry.meta.stride, entry.meta.dtype):
            raise CaptureMismatch(f"{self._name}: saved tensor {k} is {meta}, warmup saw {entry.meta}")
        if entry.kind == EXTERNAL:
            keys = storage_keys(t)
            if not keys or not keys <= self._external:
                raise CaptureMismatch(f"{self._name}: saved tensor {k} was a parameter/buffer in warmup, not now")
            return t
        if not has_storage(t):
            raise CaptureMismatch(f"{self._name}: saved tensor {k} is a tensor subclass now, warmup saw a plain tensor")
        key = _storage_key(t)
        source = self._inputs.find(t)
        if entry.kind == INPUT:
            if source != entry.source:
                raise CaptureMismatch(f"{self._name}: saved tensor {k} was a view of input {entry.source} in warmup, not now")
            return t
        if key in self._external or source >= 0:
            raise CaptureMismatch(f"{self._name}: saved tensor {k} was native in warmup but is a parameter/input now")
        base = (key, meta.start_byte - entry.rel_byte)
        if self._component_base.setdefault(entry.component, base) != base:
            raise CaptureMismatch(
                f"{self._name}: saved tensor {k} does not share storage with the other saves of its group as in warmup"
            )
        dst = self._views[k]
        assert dst is not None
        if t.data_ptr() == dst.data_ptr() and key == _storage_key(dst):
            return dst  # written in place by its producer (see .direct): nothing to copy
        copy_view(t, dst)
        self.copies += 1
        return dst

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def finish(self) -> None:
        if self._k != len(self._entries):
            raise CaptureMismatch(f"{self._name}: saved {self._k} tensors during capture, warmup saw {len(self._entries)}")
