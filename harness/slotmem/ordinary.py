"""The ordinary capture path (no slot plan): the baseline the slot-shared path is measured against.

One graph pair per (cp_size, chunk, layer, microbatch), captured strictly in the schedule order,
outputs and saved tensors left in the pool as the allocator places them (like Transformer Engine's
``make_graphed_callables`` with ``_order``). Safe only when graphs are replayed in capture order,
i.e. with one CP variant. With several variants it is the "no rewind" design: ``pool_mode``
``"shared"`` captures them back to back into one pool, ``"separate"`` gives each variant its own.
Warmup is the same ordered warmup as the slot-shared path (:mod:`.warmup`). Uses no private
allocator API.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from . import allocator as alloc
from .replay import Frame, GraphedLayer, reset_frames, run_backward, run_forward
from .protocol import events
from .warmup import SampleFn, as_tuple, ordered_warmup, trainable_params, warmup_steps


@dataclass
class OrdinaryGraphs:
    variants: tuple[int, ...]
    pools: Mapping[int, Any]  # cp_size -> MemPool (one object shared by all in "shared" mode)
    stream: torch.cuda.Stream
    frames: dict[tuple[int, int, int, int], Frame]
    modules: Mapping[tuple[int, int], Any]
    _params: Mapping[tuple[int, int], tuple[torch.nn.Parameter, ...]]
    outside_pool_bytes: int
    capture_s: float = 0.0
    captures_per_variant_s: dict[int, float] = field(default_factory=dict)
    peak_allocated_during_capture: int = 0

    def frame(self, cp_size: int, chunk: int, layer: int, microbatch: int) -> Frame:
        key = (cp_size, chunk, layer, microbatch)
        if key not in self.frames:
            raise KeyError(f"no ordinary graph for cp{cp_size}/chunk{chunk}/layer{layer}/microbatch{microbatch}")
        return self.frames[key]

    def layer(self, chunk: int, layer: int) -> GraphedLayer:
        return GraphedLayer(self, chunk, layer)

    def _run_forward(self, frame: Frame, inputs: Sequence[torch.Tensor]) -> None:
        run_forward(frame, inputs)

    def _run_backward(self, frame: Frame, grads: Sequence[torch.Tensor | None]) -> Any:
        return run_backward(frame, grads)

    def pool_reserved(self) -> int:
        unique = {id(p): p for p in self.pools.values()}
        return sum(alloc.pool_bytes(p.id).reserved for p in unique.values())

    def total_bytes(self) -> int:
        return self.pool_reserved() + self.outside_pool_bytes

    def close(self) -> None:
        reset_frames(self.frames)


def make_ordinary_graphed_callables(
    layers: Sequence[Sequence[Any]],
    sample_args: SampleFn,
    order: Sequence[int],
    variants: Sequence[int],
    *,
    pool_mode: str = "shared",
    num_warmup_iters: int = 2,
) -> OrdinaryGraphs:
    """Capture one graph pair per (cp_size, chunk, layer, microbatch) in ``order`` (each (event, layer)
    captured for every variant in turn), after the same ordered warmup as the slot-shared path. Other
    arguments as in :func:`harness.slotmem.capture.make_graphed_callables`; ``variants``: the CP sizes;
    ``pool_mode`` ``"shared"`` (one pool) or ``"separate"`` (one pool per variant). Replay is exact
    only in capture order with one variant (the baseline, see the module docstring)."""
    if pool_mode not in ("shared", "separate"):
        raise ValueError(f"pool_mode must be 'shared' (one pool for every variant) or 'separate' (one pool per "
                         f"variant), got {pool_mode!r}")
    device = torch.device("cuda", torch.cuda.current_device())
    modules = {(c, l): m for c, chunk in enumerate(layers) for l, m in enumerate(chunk)}
    params = {k: trainable_params(m) for k, m in modules.items()}
    stream = torch.cuda.Stream(device)
    shared = torch.cuda.MemPool()
    pools = {v: (shared if pool_mode == "shared" else torch.cuda.MemPool()) for v in variants}
    frames: dict[tuple[int, int, int, int], Frame] = {}
    outside = 0
    per_variant = {v: 0.0 for v in variants}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            steps = warmup_steps(order, [len(chunk) for chunk in layers], variants, num_warmup_iters)
            plans = ordered_warmup(modules, sample_args, steps)
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for ev in events(order, len(layers)):
            n = len(layers[ev.chunk])
            for l in (range(n) if ev.forward else range(n - 1, -1, -1)):
                for v in variants:
                    t1 = time.perf_counter()
                    key = (v, ev.chunk, l, ev.microbatch)
                    module = modules[(ev.chunk, l)]
                    plan = plans[(v, ev.chunk, l)]
                    g = torch.cuda.CUDAGraph()
                    if ev.forward:
                        inputs = tuple(s.detach().clone().requires_grad_(s.requires_grad) for s in sample_args(v, ev.chunk, l))
                        outside += sum(t.numel() * t.element_size() for t in inputs)
                        with torch.cuda.graph(g, pool=pools[v].id, stream=stream):
                            outs = as_tuple(module(*inputs))
                        frames[key] = Frame(f"cp{v}/chunk{ev.chunk}/mb{ev.microbatch}/layer{l}", inputs,
                                            tuple(o.detach() for o in outs), tuple(o.requires_grad for o in outs),
                                            (), (), (), g, None, outs)
                    else:
                        f = frames[key]
                        assert f.roots is not None
                        roots = [r for r, d in zip(f.roots, f.out_differentiable) if d]
                        gouts = tuple(torch.empty_like(r) for r in roots)
                        outside += sum(t.numel() * t.element_size() for t in gouts)
                        wrt_in = [t for t, w in zip(f.static_inputs, plan.input_grads) if w]
                        wrt_p = [p for p, u in zip(params[(ev.chunk, l)], plan.params_used) if u]
                        with torch.cuda.graph(g, pool=pools[v].id, stream=stream):
                            grads = torch.autograd.grad(roots, wrt_in + wrt_p, grad_outputs=gouts, allow_unused=True)
                        it = iter(grads)
                        f.input_grads = tuple(next(it) if w else None for w in plan.input_grads)
                        f.param_grads = tuple(next(it) if u else None for u in plan.params_used)
                        f.grad_outputs = gouts
                        f.bwd = g
                        f.roots = None
                    per_variant[v] += time.perf_counter() - t1
        torch.cuda.synchronize(device)
        capture_s = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(device)
    except BaseException:
        reset_frames(frames)
        raise
    finally:
        if gc_was:
            gc.enable()
    return OrdinaryGraphs(tuple(variants), pools, stream, frames, modules, params, outside,
                          capture_s, per_variant, peak)
