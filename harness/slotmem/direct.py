"""Direct writes into the arenas: no copy for tensors an op can write where they must live.

A forward's native saved tensors and its outputs must end up in its frame's arena. By default the
graph copies them there (:class:`~.saved.ArenaPacker`, the output copy in capture). Many of them are
the whole output of one out-of-place aten op (``addmm``, ``mul``, ``sigmoid``, ``add``, ...). Such
an op can write its result into the arena itself through its ``out=`` overload, and the copy is gone.

* Warmup runs each forward under :class:`OpTracer` (a ``TorchDispatchMode`` below autograd) and
  :func:`find_producers` names, for every component (the storage of native saves and outputs,
  see :mod:`.arenas`), the traced call that allocated it, when that call's return is contiguous
  and covers the component's bytes with little to spare (the component is widened to it).
* Capture runs the forward under :class:`Redirect`, which counts the same calls and, at each
  producer, calls the ``out=`` overload with the arena view. It fails closed
  (:class:`~.saved.CaptureMismatch`) when the call is not the op warmup saw, when the op resized its
  ``out``, or when a producer never ran. The packer and the output copy then find the tensor
  already in place and copy nothing.

Only out-of-place ops whose returns are all fresh tensors (no aliasing, no mutation) and whose
``out=`` overload takes the same arguments plus one out argument per return are traced (so not
``_to_copy``, whose ``out=`` form has no ``dtype``): aten's structured kernels share one
implementation between the functional and the ``out=`` form, so results are the same bits. A call
with a tensor-subclass argument or return (e.g. an FP8 wrapper) is counted but never redirected.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .arenas import COMPONENT, Producer, TensorMeta
from .saved import CaptureMismatch
from .tensors import is_plain

Target = tuple[str, int]

# a saved component may grow by this fraction of its size to hold its producer's whole output
WIDEN_LIMIT = 1 / 16


def _out_names(func: Any) -> tuple[str, ...] | None:
    """Out-argument names of ``func``'s ``out=`` overload, or None if ``func`` cannot be redirected."""
    schema = func._schema
    if schema.is_mutable or not schema.returns:
        return None
    if any(r.alias_info is not None or str(r.type) != "Tensor" for r in schema.returns):
        return None
    out_op = getattr(func.overloadpacket, "out", None)
    if out_op is None:
        return None
    out_args = out_op._schema.arguments
    names = tuple(a.name for a in out_args if getattr(a, "is_out", False))
    same_inputs = ([(a.name, str(a.type)) for a in schema.arguments]
                   == [(a.name, str(a.type)) for a in out_args if not getattr(a, "is_out", False)])
    return names if same_inputs and len(names) == len(schema.returns) else None


class _Counting(TorchDispatchMode):
    """Numbers the redirectable op calls of one forward (the same numbering at warmup and capture)."""

    def __init__(self) -> None:
        super().__init__()
        self._names: dict[Any, tuple[str, ...] | None] = {}
        self.calls = 0

    def out_names(self, func: Any) -> tuple[str, ...] | None:
        if func not in self._names:
            self._names[func] = _out_names(func)
        return self._names[func]


class OpTracer(_Counting):
    """Warmup: records every redirectable call's returns (kept alive until :func:`find_producers`)."""

    def __init__(self) -> None:
        super().__init__()
        self.traced: list[tuple[str, tuple[torch.Tensor, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.out_names(func) is not None:
            self.calls += 1
            rets = out if isinstance(out, tuple) else (out,)
            plain = all(is_plain(r) for r in rets) and not _has_subclass_arg(args, kwargs or {})
            self.traced.append((str(func), rets if plain else ()))  # () : counted, never a producer
        return out


def _has_subclass_arg(args: tuple, kwargs: dict) -> bool:
    def leaves(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from leaves(y)
        else:
            yield x

    return any(isinstance(x, torch.Tensor) and not is_plain(x) for x in leaves((args, tuple(kwargs.values()))))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def find_producers(
    traced: Sequence[tuple[str, tuple[torch.Tensor, ...]]],
    components: Sequence[tuple[int, int, int]],
    widen_limit: float = WIDEN_LIMIT,
) -> tuple[tuple[Producer, ...], dict[int, tuple[int, int]]]:
    """Producers for the components ``(storage_key, first byte, end byte)`` and the components to
    widen (storage_key -> byte range) so that a producer's output fits.

    A component's producer is the first traced call that returned a tensor in its storage, if that
    return is contiguous and covers the component's bytes with at most ``widen_limit`` of its size
    to spare (the component is then widened to the whole return: e.g. only one GLU half of a
    matmul output is saved, but its strided span covers nearly all of it). A return feeds at most
    one component."""
    first: dict[int, tuple[int, int]] = {}
    for i, (_, rets) in enumerate(traced):
        for j, r in enumerate(rets):
            if r.numel() > 0:
                first.setdefault(_storage(r), (i, j))
    targets: dict[tuple[int, int], Target] = {}
    widen: dict[int, tuple[int, int]] = {}
    for k, (key, lo, hi) in enumerate(components):
        at = first.get(key)
        if at is None or at in targets:
            continue
        r = traced[at[0]][1][at[1]]
        m = TensorMeta.of(r)
        r_lo, r_hi = m.start_byte, m.start_byte + m.extent_bytes
        if r.is_contiguous() and r_lo <= lo and hi <= r_hi and (r_hi - r_lo) - (hi - lo) <= widen_limit * (hi - lo):
            targets[at] = (COMPONENT, k)
            if (r_lo, r_hi) != (lo, hi):
                widen[key] = (r_lo, r_hi)
    producers = []
    for i in sorted({i for i, _ in targets}):
        op, rets = traced[i]
        producers.append(Producer(i, op, tuple(TensorMeta.of(r) for r in rets),
                                  tuple(targets.get((i, j)) for j in range(len(rets)))))
    return tuple(producers), widen


def _alias(dst: torch.Tensor) -> torch.Tensor:
    """A tensor on ``dst``'s bytes that is not a view (autograd treats it as a fresh op result)."""
    return torch.empty((0,), dtype=dst.dtype, device=dst.device).set_(
        dst.untyped_storage(), dst.storage_offset(), dst.shape, dst.stride()
    )


class Redirect(_Counting):
    """Capture: the producers' calls write into ``views[target]`` through their ``out=`` overload."""

    def __init__(self, name: str, producers: Sequence[Producer], views: Mapping[Target, torch.Tensor],
                 device: torch.device) -> None:
        super().__init__()
        self._name = name
        self._by_call = {p.call: p for p in producers}
        self._views = views
        self._device = device
        self._busy = False
        self.redirected = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        names = self.out_names(func)
        if names is None or self._busy:  # _busy: the mode's own ops while it redirects a call
            return func(*args, **kwargs)
        self._busy = True
        try:
            return self._dispatch(func, names, args, kwargs)
        finally:
            self._busy = False

    def _dispatch(self, func: Any, names: tuple[str, ...], args: tuple, kwargs: dict) -> Any:
        i = self.calls
        self.calls += 1
        p = self._by_call.get(i)
        if p is None:
            return func(*args, **kwargs)
        if str(func) != p.op:
            raise CaptureMismatch(f"{self._name}: op call {i} is {func} during capture, warmup saw {p.op} there; "
                                  "the forward must run the same ops for every microbatch")
        dsts = [
            self._views[t] if t is not None
            else torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=self._device)
            for m, t in zip(p.returns, p.targets)
        ]
        func.overloadpacket.out(*args, **kwargs, **dict(zip(names, dsts)))
        for m, d in zip(p.returns, dsts):
            if (tuple(d.shape), tuple(d.stride()), d.dtype) != (m.shape, m.stride, m.dtype):
                raise CaptureMismatch(f"{self._name}: {p.op} (call {i}) returned {tuple(d.shape)} {d.dtype}, "
                                      f"warmup saw {m.shape} {m.dtype}")
        rets = tuple(_alias(d) if t is not None else d for d, t in zip(dsts, p.targets))
        self.redirected += sum(t is not None for t in p.targets)
        return rets if len(rets) > 1 else rets[0]

    def finish(self) -> None:
        if self.calls <= max(self._by_call, default=-1):
            raise CaptureMismatch(f"{self._name}: the forward made {self.calls} redirectable op calls during capture, "
                                  f"warmup saw more (a producer at call {max(self._by_call)})")
