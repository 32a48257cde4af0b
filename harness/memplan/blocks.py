"""One graphed block of a case, run on meta tensors through the capture's own warmup.

:func:`block_plans` builds the block of one decoder layer (``harness.workload.model``, scope
``attn`` or ``full``) on the meta device, with the case's shapes, and runs its forward and
backward once per CP size through ``harness.slotmem.warmup.ordered_warmup``: the saved-tensor
hooks, the producer tracing of direct writes and the storage grouping that capture uses. What it
returns is the capture's own ``ForwardPlan`` per CP size, so the arenas the slot plan carves from
them (``slotmem.arenas.plan_arenas``) are the bytes the capture allocates. The CP all-gathers run
on the loopback communicator (it keeps shapes), the device's autocast is
:class:`~harness.memplan.autocast.MetaAutocast`.

Beside it :class:`PoolEvents` records what each of the block's graphs allocates and frees in
its pool (a dispatch mode below autograd; frees through weak references), with the kernels'
own buffers of :mod:`.kernels`: the caching allocator replays them (:mod:`.cachesim`) into the
pool's segments.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from harness.memplan.autocast import MetaAutocast
from harness.slotmem.arenas import ForwardPlan
from harness.slotmem.warmup import WarmupStep, ordered_warmup
from harness.spec.schema import Case, GraphScope
from harness.workload.comm import GroupHandle
from harness.workload.graphed import sample_inputs
from harness.workload.loopback import Loopback
from harness.workload.model import DecoderLayer

META = torch.device("meta")

# one allocation ("a", key, bytes) or free ("f", key) of a graph's pool, in the order the graph's
# capture makes them
Event = tuple


def _storage_id(t: torch.Tensor) -> int:
    return StorageWeakRef(t.untyped_storage()).cdata


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


_MATMUL = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
                     "aten.addbmm.default", "aten.mv.default", "aten.addmv.default", "aten.dot.default",
                     "aten._addmm_activation.default"})
_REDUCE = frozenset({"aten.sum.dim_IntList", "aten.mean.dim", "aten.sum.default", "aten.mean.default"})
_FLASH_VARLEN_BWD = "torch_attn._varlen_attn_backward.default"
_GROUPED_MM = "aten._grouped_mm.default"


class PoolEvents(TorchDispatchMode):
    """The allocations and frees one graph's capture makes in its pool, from a meta run.

    Every storage an op returns is an allocation (freed when the storage dies: tracked through a
    weak reference), unless it aliases an input (a view, a detach) or it is one of the capture's
    direct writes into the arenas (``direct``: ``(call, return)`` of the forward's redirectable op
    calls, numbered as :mod:`harness.slotmem.direct` numbers them). Added from the kernels'
    sources (:mod:`.kernels`): cuBLAS's workspace at the graph's first product (held to its end),
    flash varlen backward's scratch, a grouped GEMM's arguments and CUTLASS workspace and a
    reduction's staging buffer (freed inside their op).
    :meth:`end` frees what is left: what the graph keeps is copied into the arenas."""

    def __init__(self, direct: frozenset = frozenset(), deterministic: bool = True) -> None:
        super().__init__()
        self.events: list[Event] = []
        self._direct = direct
        self._deterministic = deterministic
        self._calls = 0
        self._forms: dict[Any, Any] = {}
        self._live: dict[int, int] = {}  # storage id -> key
        self._keys = 0
        self._workspace: int | None = None
        self._ended = False

    def _alloc(self, n: int) -> int:
        self._keys += 1
        self.events.append(("a", self._keys, n))
        return self._keys

    def _free(self, key: int) -> None:
        if not self._ended:
            self.events.append(("f", key))

    def _storage_freed(self, sid: int, key: int) -> None:
        if self._live.get(sid) == key:
            del self._live[sid]
        self._free(key)

    def _scratch(self, sizes: Sequence[int]) -> None:
        keys = [self._alloc(n) for n in sizes]
        for k in reversed(keys):
            self._free(k)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from harness.memplan.kernels import cublas_workspace_bytes
        from harness.slotmem.direct import out_form

        kwargs = kwargs or {}
        name = str(func)
        if name in _MATMUL and self._workspace is None:
            self._workspace = self._alloc(cublas_workspace_bytes())
        inputs = {_storage_id(t) for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        if func not in self._forms:
            self._forms[func] = out_form(func)
        call = None
        if self._forms[func] is not None:
            call, self._calls = self._calls, self._calls + 1
        for j, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if not isinstance(t, torch.Tensor) or (call, j) in self._direct:
                continue
            s = t.untyped_storage()
            sid = _storage_id(t)
            if not s.nbytes() or sid in inputs or sid in self._live:
                continue
            key = self._alloc(s.nbytes())
            self._live[sid] = key
            weakref.finalize(s, self._storage_freed, sid, key)
        if name == _FLASH_VARLEN_BWD:
            self._scratch(_flash_scratch(args, self._deterministic))
        elif name in _REDUCE:
            self._scratch(_reduce_scratch(args, out))
        elif name == _GROUPED_MM:
            self._scratch(_grouped_mm_scratch(args, kwargs))
        return out

    def end(self) -> tuple[Event, ...]:
        """The graph's events, everything still live freed at its end."""
        for key in list(self._live.values()) + ([self._workspace] if self._workspace else []):
            self.events.append(("f", key))
        self._ended = True
        self._live.clear()
        return tuple(self.events)


def _flash_scratch(args: tuple, deterministic: bool) -> tuple[int, ...]:
    from harness.memplan.kernels import flash_varlen_bwd_scratch

    q, k, cu_q = args[1], args[2], args[6]
    return flash_varlen_bwd_scratch(q.shape[0], k.shape[0], q.shape[1], k.shape[1], q.shape[2],
                                    cu_q.numel() - 1, q.element_size(), deterministic)


def _grouped_mm_scratch(args: tuple, kwargs: dict) -> tuple[int, ...]:
    """``_grouped_mm(a, b, offs)``'s arguments and workspace: the group count and one group's
    ``M x N`` as the kernel's dispatch reads them from the shapes (a ragged dimension divided by
    the number of groups)."""
    from harness.memplan.kernels import grouped_mm_scratch

    a, b = args[0], args[1]
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        groups = offs.shape[0]
    elif a.dim() == 2:
        groups = b.shape[0]
        m //= groups
    elif b.dim() == 2:
        groups = a.shape[0]
        n //= groups
    else:
        groups = a.shape[0]
    return grouped_mm_scratch(groups, m, n)


def _reduce_scratch(args: tuple, out: Any) -> tuple[int, ...]:
    from harness.memplan.kernels import ReduceShape, reduce_scratch

    x = args[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not x.is_contiguous() or not x.numel():
        return ()
    dims = args[1] if len(args) > 1 and args[1] is not None else list(range(x.dim()))
    dims = sorted({d % x.dim() for d in dims}) if x.dim() else []
    outputs = max(1, x.numel() // max(1, math.prod(x.shape[d] for d in dims)))
    if not dims or len(dims) == x.dim():
        shape = ReduceShape(1, x.numel(), True)
    else:
        inner = math.prod(x.shape[d] for d in range(dims[-1] + 1, x.dim()))
        shape = ReduceShape(outputs, x.numel() // outputs, dims[-1] == x.dim() - 1, inner)
    return reduce_scratch(shape)


def live_peak(events: Sequence[Event]) -> int:
    """The most bytes of ``events`` live at once."""
    sizes: dict[int, int] = {}
    live = peak = 0
    for e in events:
        if e[0] == "a":
            sizes[e[1]] = e[2]
            live += e[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(e[1], 0)
    return peak


@dataclass(frozen=True)
class BlockMemory:
    """One CP size of a case's block: the capture's plan and the transients of its graphs."""

    cp_size: int
    plan: ForwardPlan
    forward_events: tuple[Event, ...]  # the forward graph's pool allocations and frees
    backward_events: tuple[Event, ...]  # the backward graph's

    @property
    def forward_transient(self) -> int:
        """Most bytes the forward graph holds in its pool at once (besides the arenas)."""
        return live_peak(self.forward_events)

    @property
    def backward_transient(self) -> int:
        return live_peak(self.backward_events)


def _handles(cp_sizes: Sequence[int]) -> dict[int, GroupHandle | None]:
    comm = Loopback(0)
    return {c: GroupHandle(None, c, 0, tuple(range(c)), comm) if c > 1 else None for c in cp_sizes}


def _make_block(case: Case, native_gqa: bool | None) -> Any:
    m, lay = case.model, case.layout
    with torch.device(META):
        layer = DecoderLayer(m, lay.ep, 0)
    layer.attn.varlen_gqa = native_gqa
    assert case.graphs is not None or case.static_scope is not None
    scope = case.graphs.scope if case.graphs is not None else case.static_scope
    return layer.make_block(scope, _dtype(case)), scope


def _dtype(case: Case) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(case.train.dtype.value), None)


def block_memory(case: Case, cp_sizes: Sequence[int], native_gqa: bool | None) -> dict[int, BlockMemory]:
    """Per CP size: the capture's ``ForwardPlan`` of one block of ``case`` and its transients."""
    block, scope = _make_block(case, native_gqa)
    handles = _handles(cp_sizes)
    m, lay = case.model, case.layout
    tokens = lay.tokens_per_rank

    def point_at(cp_size: int) -> None:
        block.cp = handles[cp_size]

    def sample(cp_size: int, chunk: int, layer: int) -> tuple[torch.Tensor, ...]:
        return sample_inputs(scope, cp_size, 0, tokens, m.hidden, case.train.max_seqs_per_microbatch,
                             m.experts, m.experts_per_token, META, case.train.seed)

    steps = [WarmupStep(0, fwd, 0, 0, 0, c) for c in cp_sizes for fwd in (True, False)]
    dtype = _dtype(case)
    cast = MetaAutocast(dtype) if dtype is not None else None
    with (cast if cast is not None else _Nothing()):
        plans = ordered_warmup({(0, 0): block}, sample, steps, point_at, require_cuda=False)
        out = {}
        for c in cp_sizes:
            point_at(c)
            plan = plans[(c, 0, 0)]
            fwd, bwd = _graph_events(block, sample(c, 0, 0), plan, bool(case.train.deterministic))
            out[c] = BlockMemory(c, plan, fwd, bwd)
    return out


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _graph_events(block: Any, inputs: Sequence[torch.Tensor], plan: ForwardPlan,
                  deterministic: bool) -> tuple[tuple[Event, ...], tuple[Event, ...]]:
    """(forward, backward) pool events of one block's graphs (:class:`PoolEvents`). The forward's
    saved tensors are not held by autograd here (capture copies them into the arenas, or the op
    writes them there: ``plan.producers``), so each is freed when the forward drops it; the
    backward starts from a forward run outside the recording, its saved tensors and incoming
    gradients in the arenas."""
    direct = frozenset((p.call, j) for p in plan.producers for j, t in enumerate(p.targets) if t is not None)
    xs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda _: None):
        with PoolEvents(direct, deterministic) as fwd:
            block(*xs)
        forward = fwd.end()
    outs = block(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    diff = [o for o in outs if o.requires_grad]
    wrt = [t for t in xs if t.requires_grad] + [p for p in block.parameters() if p.requires_grad]
    grads_out = [torch.ones_like(o) for o in diff]
    with PoolEvents(frozenset(), deterministic) as bwd:
        grads = torch.autograd.grad(diff, wrt, grads_out, allow_unused=True)
        del grads
    return forward, bwd.end()
