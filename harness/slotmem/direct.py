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

Only out-of-place ops whose returns are all fresh tensors (no aliasing, no mutation) are traced,
and only those with an out form (:class:`OutForm`):

* an ``out=`` overload that takes the same arguments plus one out argument per return, whatever
  its name (``addmm.out``, ``index.Tensor_out``, ``sum.IntList_out``, ``topk.values``,
  ``sort.values_stable``): aten's structured kernels share one implementation between the
  functional and the ``out=`` form, so results are the same bits;
* ``_to_copy`` that only changes the dtype (the casts autocast and ``.float()`` make): its ``out=``
  form has no ``dtype``, but ``_to_copy`` itself is an empty tensor plus ``copy_``, so
  ``dst.copy_(self)`` into the destination (which has the result's dtype and strides) writes the
  same bits. A ``_to_copy`` with other changes (device, layout, memory format) is counted but
  never redirected.

A call with a tensor-subclass argument or return (e.g. an FP8 wrapper) is counted but never
redirected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .arenas import COMPONENT, Producer, TensorMeta
from .saved import CaptureMismatch
from .tensors import is_plain, storage_key

Target = tuple[str, int]

# a saved component may grow by this fraction of its size to hold its producer's whole output
WIDEN_LIMIT = 1 / 16


@dataclass(frozen=True)
class OutForm:
    """How a traced op writes its returns into given tensors: its ``out=`` overload with out
    arguments ``names``, or (``overload`` None: ``_to_copy``) ``copy_`` into the one return."""

    overload: Any
    names: tuple[str, ...]

    def takes(self, args: tuple, kwargs: dict) -> bool:
        """Whether this call can be written through the form (a ``_to_copy`` only when it
        changes nothing but the dtype)."""
        return self.overload is not None or _dtype_only_copy(args, kwargs)

    def write(self, args: tuple, kwargs: dict, dsts: Sequence[torch.Tensor]) -> None:
        if self.overload is None:
            dsts[0].copy_(args[0])
        else:
            self.overload(*args, **kwargs, **dict(zip(self.names, dsts)))


_TO_COPY_KEEPS = {"dtype": None, "layout": (None, torch.strided), "device": None, "pin_memory": (None, False),
                  "non_blocking": (False,), "memory_format": (None, torch.preserve_format)}


def _dtype_only_copy(args: tuple, kwargs: dict) -> bool:
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].layout != torch.strided:
        return False
    for k, v in kwargs.items():
        if k not in _TO_COPY_KEEPS:
            return False
        if k == "device":
            if v is not None and torch.device(v) != args[0].device:
                return False
        elif k != "dtype" and v not in _TO_COPY_KEEPS[k]:
            return False
    return True


def _inputs(schema: Any) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not getattr(a, "is_out", False)]


def out_form(func: Any) -> OutForm | None:
    """The out form of ``func`` (see the module docstring), or None if it cannot be redirected."""
    schema = func._schema
    if schema.is_mutable or not schema.returns:
        return None
    if any(r.alias_info is not None or str(r.type) != "Tensor" for r in schema.returns):
        return None
    packet = func.overloadpacket
    if str(func) == "aten._to_copy.default":
        return OutForm(None, ("out",))
    want = _inputs(schema)
    names = ["out"] + [n for n in packet.overloads() if n != "out"]
    for name in names:
        overload = getattr(packet, name, None)
        if overload is None or overload is func:
            continue
        args = overload._schema.arguments
        outs = tuple(a.name for a in args if getattr(a, "is_out", False))
        if len(outs) == len(schema.returns) and _inputs(overload._schema) == want:
            return OutForm(overload, outs)
    return None


class _Counting(TorchDispatchMode):
    """Numbers the redirectable op calls of one forward (the same numbering at warmup and capture)."""

    def __init__(self) -> None:
        super().__init__()
        self._forms: dict[Any, OutForm | None] = {}
        self.calls = 0

    def out_form(self, func: Any) -> OutForm | None:
        if func not in self._forms:
            self._forms[func] = out_form(func)
        return self._forms[func]


class OpTracer(_Counting):
    """Warmup: records every redirectable call's returns (kept alive until :func:`find_producers`)."""

    def __init__(self) -> None:
        super().__init__()
        self.traced: list[tuple[str, tuple[torch.Tensor, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        form = self.out_form(func)
        if form is not None:
            self.calls += 1
            rets = out if isinstance(out, tuple) else (out,)
            plain = all(is_plain(r) for r in rets) and not _has_subclass_arg(args, kwargs)
            usable = plain and form.takes(args, kwargs)
            self.traced.append((str(func), rets if usable else ()))  # () : counted, never a producer
        return out


def _has_subclass_arg(args: tuple, kwargs: dict) -> bool:
    def leaves(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from leaves(y)
        else:
            yield x

    return any(isinstance(x, torch.Tensor) and not is_plain(x) for x in leaves((args, tuple(kwargs.values()))))


_storage = storage_key


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
        form = self.out_form(func)
        if form is None or self._busy:  # _busy: the mode's own ops while it redirects a call
            return func(*args, **kwargs)
        self._busy = True
        try:
            return self._dispatch(func, form, args, kwargs)
        finally:
            self._busy = False

    def _dispatch(self, func: Any, form: OutForm, args: tuple, kwargs: dict) -> Any:
        i = self.calls
        self.calls += 1
        p = self._by_call.get(i)
        if p is None:
            return func(*args, **kwargs)
        if str(func) != p.op:
            raise CaptureMismatch(f"{self._name}: op call {i} is {func} during capture, warmup saw {p.op} there; "
                                  "the forward must run the same ops for every microbatch")
        if not form.takes(args, kwargs):
            raise CaptureMismatch(f"{self._name}: {p.op} (call {i}) changes more than the dtype during capture; "
                                  "in warmup it changed only the dtype")
        dsts = [
            self._views[t] if t is not None
            else torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=self._device)
            for m, t in zip(p.returns, p.targets)
        ]
        form.write(args, kwargs, dsts)
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
