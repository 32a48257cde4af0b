"""Replay side of slot-shared CUDA graphs: frames, the autograd function, the owning object.

A :class:`Frame` holds the graphs and static tensors of one (CP size, chunk, layer, physical slot).
:class:`SlotGraphs` owns the pool, the backing arenas and every frame; :class:`GraphedLayer`
replays the frame selected by ``(cp_size, microbatch % slots)`` under autograd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from . import allocator as alloc
from .arenas import BackingLayout, ForwardPlan
from .phases import Phase
from .protocol import SlotMap


@dataclass
class Frame:
    """Graphs and static tensors of one (cp_size, chunk, layer, slot)."""

    name: str
    static_inputs: tuple[torch.Tensor, ...]
    static_outputs: tuple[torch.Tensor, ...]
    out_differentiable: tuple[bool, ...]
    grad_outputs: tuple[torch.Tensor, ...]  # scratch views, one per differentiable output
    input_grads: tuple[torch.Tensor | None, ...]
    param_grads: tuple[torch.Tensor | None, ...]
    fwd: torch.cuda.CUDAGraph
    bwd: torch.cuda.CUDAGraph | None = None
    roots: tuple[torch.Tensor, ...] | None = None
    # fused wgrad accumulation: (param index, param, its main_grad buffer the graph adds into)
    fused: tuple[tuple[int, torch.nn.Parameter, torch.Tensor], ...] = ()
    zero: torch.Tensor | None = None  # scalar returned (expanded) for fused params, so hooks fire


def reset_frames(frames: dict[Any, Frame]) -> None:
    """Drop every frame's capture-time roots, reset its graphs and empty ``frames``."""
    for f in frames.values():
        f.roots = None
        f.fwd.reset()
        if f.bwd is not None:
            f.bwd.reset()
    frames.clear()


@dataclass(frozen=True)
class GraphMemory:
    pool_reserved: int
    pool_allocated: int
    backing: int  # arenas + scratch (inside the pool)
    outside_pool: int  # static buffers the graphs own outside the pool (0 on this path)

    @property
    def total(self) -> int:
        return self.pool_reserved + self.outside_pool


@dataclass(frozen=True)
class CaptureStats:
    warmup_s: float
    capture_s: float
    graphs: int
    captures_per_variant_s: Mapping[int, float]
    peak_allocated_during_capture: int  # after warmup: layout and captures only
    summary: str
    peak_allocated_during_warmup: int = 0  # ordered warmup, all variants of an event held in lockstep
    direct_writes: int = 0  # saved tensors and outputs written into the arenas by their producer op
    copies: int = 0  # saved tensors and outputs copied into the arenas
    restores: int = 0  # allocator rewinds (a variant's capture left blocks owned by tensors a module kept)
    detached_owners: int = 0  # stale owners those rewinds detached


def run_forward(frame: Frame, inputs: Sequence[torch.Tensor]) -> None:
    """Stage inputs into the frame's static inputs (unless already there) and replay its forward."""
    if len(inputs) != len(frame.static_inputs):
        raise TypeError(f"{frame.name}: expected {len(frame.static_inputs)} inputs, got {len(inputs)}")
    with torch.no_grad():
        for i, (s, x) in enumerate(zip(frame.static_inputs, inputs)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{frame.name}: input {i} is a {type(x).__name__}, not a tensor; graphed layers take "
                                "tensors only (pass metadata as an int/bool tensor)")
            if x.shape != s.shape or x.dtype != s.dtype:
                raise ValueError(f"{frame.name}: input {i} is {tuple(x.shape)} {x.dtype}, the graph was "
                                 f"captured for {tuple(s.shape)} {s.dtype}")
            if x.data_ptr() != s.data_ptr():
                s.copy_(x)
    frame.fwd.replay()


def own_grad(g: torch.Tensor) -> torch.Tensor:
    """A parameter grad returned to autograd: a clone, so ``.grad`` never aliases the graph's
    scratch buffer, which the next backward replay overwrites (pytorch/pytorch#181723)."""
    return g.clone()


def run_backward(
    frame: Frame, grads: Sequence[torch.Tensor | None], fused_grad_hooks: bool = True,
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Stage output grads, replay the backward; param grads are returned through :func:`own_grad`."""
    if frame.bwd is None:
        raise RuntimeError(f"{frame.name}: no backward graph was captured")
    diff_grads = [g for g, d in zip(grads, frame.out_differentiable) if d]
    with torch.no_grad():
        for buf, g in zip(frame.grad_outputs, diff_grads):
            if g is None:
                buf.zero_()
            elif g.data_ptr() != buf.data_ptr():
                buf.copy_(g)
    frame.bwd.replay()
    in_grads = [None if g is None else g.detach() for g in frame.input_grads]
    p_grads = [None if g is None else own_grad(g) for g in frame.param_grads]
    for i, param, main_grad in frame.fused:
        if getattr(param, "main_grad", None) is not main_grad:
            raise RuntimeError(f"{frame.name}: parameter {i}'s main_grad buffer was replaced after capture; the "
                               "graph accumulates into the captured buffer (keep main_grad fixed, or recapture)")
        assert frame.zero is not None
        # AccumulateGrad and its hooks still run (a zero gradient), or, when no hook needs it,
        # nothing runs: the graph already accumulated the gradient into main_grad.
        p_grads[i] = frame.zero.expand(param.shape) if fused_grad_hooks else None
    return in_grads, p_grads


def fresh_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s bytes with a version counter of its own. Views of the backing share
    the backing's counter, which every staging copy into any arena bumps; eager code that saves a
    replayed output for its backward (scope ``attn``: the MoE's norm saves the attention block's
    output) would then see it as modified. The slot plan, not the counter, guarantees those bytes
    stay untouched until the frame's backward."""
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    return out.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, owner: Any, frame: Frame, n_user: int, *tensors: torch.Tensor) -> Any:
        owner._run_forward(frame, tensors[:n_user])
        ctx.owner = owner
        ctx.frame = frame
        outs = tuple(fresh_alias(o) for o in frame.static_outputs)
        ctx.mark_non_differentiable(*(o for o, d in zip(outs, frame.out_differentiable) if not d))
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        in_grads, p_grads = ctx.owner._run_backward(ctx.frame, grads)
        return (None, None, None, *in_grads, *p_grads)


class GraphedLayer:
    """Callable replaying the graphs of one (chunk, layer): ``layer(*inputs, cp_size=, microbatch=)``."""

    def __init__(self, owner: Any, chunk: int, layer: int) -> None:
        self._owner = owner
        self.chunk = chunk
        self.layer = layer

    def __call__(self, *inputs: torch.Tensor, cp_size: int, microbatch: int) -> Any:
        o = self._owner
        frame = o.frame(cp_size, self.chunk, self.layer, microbatch)
        params = o._params[(self.chunk, self.layer)]
        return _Replay.apply(o, frame, len(inputs), *inputs, *params)


@dataclass
class SlotGraphs:
    """Owns the pool, the backing arenas, every graph and every static tensor the graphs touch."""

    smap: SlotMap
    pool: Any
    stream: torch.cuda.Stream
    backing: torch.Tensor
    layout: BackingLayout
    frames: dict[tuple[int, int, int, int], Frame]
    plans: Mapping[tuple[int, int, int], ForwardPlan]
    modules: Mapping[tuple[int, int], Any]
    _params: Mapping[tuple[int, int], tuple[torch.nn.Parameter, ...]]
    fused_grad_hooks: bool = True  # fused params return a zero grad (hooks fire) or none
    stats: CaptureStats | None = None
    phase: Phase = Phase.REPLAY  # REPLAY until close(), then CLOSED (see .phases)

    # -- replay -------------------------------------------------------------------------------
    def frame(self, cp_size: int, chunk: int, layer: int, microbatch: int) -> Frame:
        if self.phase is not Phase.REPLAY:
            raise RuntimeError(f"these graphs were closed (phase {self.phase.value}); capture again to replay")
        if chunk not in self.smap.slots:
            raise KeyError(f"no graphs for chunk {chunk}; chunks are {sorted(self.smap.slots)}")
        key = (cp_size, chunk, layer, microbatch % self.smap.slots[chunk])
        if key not in self.frames:
            raise KeyError(f"no graph for CP size {cp_size} (variants {self.smap.variants}), chunk {chunk}, layer {layer}")
        return self.frames[key]

    def layer(self, chunk: int, layer: int) -> GraphedLayer:
        if (chunk, layer) not in self.modules:
            raise KeyError(f"no layer {layer} in chunk {chunk}")
        return GraphedLayer(self, chunk, layer)

    def _run_forward(self, frame: Frame, inputs: Sequence[torch.Tensor]) -> None:
        run_forward(frame, inputs)

    def _run_backward(
        self, frame: Frame, grads: Sequence[torch.Tensor | None]
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        return run_backward(frame, grads, self.fused_grad_hooks)

    # -- inspection ---------------------------------------------------------------------------
    def memory(self) -> GraphMemory:
        b = alloc.pool_bytes(self.pool.id)
        return GraphMemory(b.reserved, b.allocated, self.backing.numel(), 0)

    def region(self, kind: str, colour: int) -> torch.Tensor:
        off = self.layout.offsets[(kind, colour)]
        return self.backing.narrow(0, off, self.layout.sizes[(kind, colour)])

    def poison(self, live_saved: Iterable[int], live_grad: Iterable[int], byte_value: int = 0xFF) -> int:
        """Fill every byte no live frame needs: dead arenas, scratch, free pool blocks (NaN for 0xFF)."""
        keep = {("saved", c) for c in live_saved} | {("grad", c) for c in live_grad}
        n = 0
        for key in self.layout.offsets:
            if key not in keep:
                self.region(*key).fill_(byte_value)
                n += self.layout.sizes[key]
        return n + alloc.fill_free_blocks(self.pool.id, byte_value, self.backing.device)

    def close(self) -> None:
        """Release graphs and arenas (the pool goes when its last graph and this object are gone)."""
        reset_frames(self.frames)
        self.phase = Phase.CLOSED
