"""Saved-tensor hooks: observe what a forward saves (warmup) and pack saves into arena views (capture)."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from .arenas import EXTERNAL, INPUT, NATIVE, SavedEntry, TensorMeta, group_saves


class CaptureMismatch(RuntimeError):
    """A captured forward does not match what warmup observed for it."""


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


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
    """Pack hook for warmup: records every save, returns it unchanged."""

    def __init__(self, external: set[int], inputs: Sequence[torch.Tensor]) -> None:
        self._external = external
        self._inputs = _InputIndex(inputs)
        self.raw: list[tuple[str, int, TensorMeta, int]] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        meta = TensorMeta.of(t)
        source = self._inputs.find(t)
        if key in self._external:
            self.raw.append((EXTERNAL, key, meta, -1))
        elif source >= 0:
            self.raw.append((INPUT, key, meta, source))
        else:
            self.raw.append((NATIVE, key, meta, -1))
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def plan(self, widen: Mapping[int, tuple[int, int]] | None = None) -> tuple[tuple[SavedEntry, ...], tuple[int, ...]]:
        return group_saves(self.raw, widen)


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
        key = _storage_key(t)
        if entry.kind == EXTERNAL:
            if key not in self._external:
                raise CaptureMismatch(f"{self._name}: saved tensor {k} was a parameter/buffer in warmup, not now")
            return t
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
        with torch.no_grad():
            dst.copy_(t)
        self.copies += 1
        return dst

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def finish(self) -> None:
        if self._k != len(self._entries):
            raise CaptureMismatch(f"{self._name}: saved {self._k} tensors during capture, warmup saw {len(self._entries)}")
