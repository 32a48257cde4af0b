"""One graphed block of a case, run on meta tensors through the capture's own warmup.

:func:`block_plans` builds the block of one decoder layer (``harness.workload.model``, scope
``attn`` or ``full``) on the meta device, with the case's shapes, and runs its forward and
backward once per CP size through ``harness.slotmem.warmup.ordered_warmup``: the saved-tensor
hooks, the producer tracing of direct writes and the storage grouping that capture uses. What it
returns is the capture's own ``ForwardPlan`` per CP size, so the arenas the slot plan carves from
them (``slotmem.arenas.plan_arenas``) are the bytes the capture allocates. The CP all-gathers run
on the loopback communicator (it keeps shapes), the device's autocast is
:class:`~harness.memplan.autocast.MetaAutocast`.

Beside it :class:`LiveBytes` follows every storage the ops make (a dispatch mode; frees through
weak references) to find the largest transient of one block's forward and backward: what the
graph allocates in the pool besides the arenas.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch
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
ALLOC_ROUND = 512  # the caching allocator rounds every block up to 512 bytes


def _round(n: int) -> int:
    return (n + ALLOC_ROUND - 1) // ALLOC_ROUND * ALLOC_ROUND


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops make while it is on: live now, and the most at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = id(s)
                if key not in self._seen and s.nbytes():
                    n = _round(s.nbytes())
                    self._seen.add(key)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(s, self._free, key, n)
        return out


@dataclass(frozen=True)
class BlockMemory:
    """One CP size of a case's block: the capture's plan and the transients of its graphs."""

    cp_size: int
    plan: ForwardPlan
    forward_transient: int  # most bytes alive at once in the forward that it does not keep
    backward_transient: int  # most bytes alive at once in the backward (grads, temporaries)


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
            fwd, bwd = _transients(block, sample(c, 0, 0))
            out[c] = BlockMemory(c, plans[(c, 0, 0)], fwd, bwd)
    return out


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _transients(block: Any, inputs: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(forward, backward) transients of one call of ``block`` (see :class:`LiveBytes`)."""
    xs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    with LiveBytes() as fwd:
        outs = block(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        kept = fwd.live  # saved tensors and outputs: the arenas hold them
        fwd_peak = fwd.peak
    diff = [o for o in outs if o.requires_grad]
    wrt = [t for t in xs if t.requires_grad] + [p for p in block.parameters() if p.requires_grad]
    with LiveBytes() as bwd:
        torch.autograd.grad(diff, wrt, [torch.ones_like(o) for o in diff], allow_unused=True)
        bwd_peak = bwd.peak
    return max(fwd_peak - kept, 0), bwd_peak
