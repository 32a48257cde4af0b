"""Slot-shared CUDA graph capture across dynamic-CP variants in ONE ``torch.cuda.MemPool``.

Design (measurements in bench/RESULTS.md):
* everything that outlives one graph lives in one *backing* allocation inside the pool, carved into
  explicit arenas: per saved colour (static inputs, outputs, native saved tensors of a frame), per
  grad colour (returned input grads), and two scratch regions (incoming output grads, param grads);
  each arena is sized max over its members, so CP variants of one slot share bytes by construction;
* the pool otherwise holds only per-graph transients;
* saved tensors and outputs that are the whole result of an out-of-place aten op are written into
  their arena by that op's ``out=`` overload instead of being copied there (:mod:`.direct`);
* warmup replays the rank's order eagerly, variants in lockstep, releasing each forward at its
  backward (:mod:`.warmup`);
* the variants of one schedule event are captured in lockstep; after each variant the allocator is
  rewound to the event's checkpoint (validate -> detach stale owners -> restore -> verify live set)
  so every variant leaves the identical allocator state;
* replay picks the graphs by ``(cp_size, microbatch % slots)``.

Public: :func:`make_graphed_callables`, :func:`capture_plan` (from the planner's ``SlotPlan``);
replay objects in :mod:`.replay` (:class:`SlotGraphs`, :class:`GraphedLayer`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from . import allocator as alloc
from .arenas import (
    NATIVE,
    OUTPUT,
    ForwardPlan,
    FrameLayout,
    GradLayout,
    align,
    arena_sizes,
    contiguous_meta,
    dense_bytes,
    frame_layout,
    grad_layout,
    pack_backing,
    view_at,
)
from .protocol import CaptureStep, PlanError, SlotMap, build_slot_map, capture_steps, check_liveness
from .plan import SlotPlan
from .replay import CaptureStats, Frame, SlotGraphs, reset_frames
from .direct import Redirect
from .saved import ArenaPacker
from .warmup import SampleFn, as_tuple, external_storages, ordered_warmup, trainable_params, warmup_steps

# test-only fault injection; each must be caught by a check or by the mixed-replay test
FAULTS = frozenset({"skip_restore", "skip_param_grad_clone", "drop_stale_owner", "skip_liveness_check"})


class CaptureError(RuntimeError):
    """Capture failed; nothing of it is left in the process (graphs reset, pool released)."""



# ---------------------------------------------------------------------------------------------
# Capture


def _summary(smap: SlotMap, pool_bytes: int) -> str:
    slots = max(smap.slots.values())
    return (f"{len(smap.variants)} dynamic-CP variants over {slots} slot-aliased physical pool slots "
            f"(CP sizes {list(smap.variants)}, pool {pool_bytes / 2**20:.1f} MiB)")


def _owner_candidates(module: Any, outs: Sequence[torch.Tensor]) -> list[torch.UntypedStorage]:
    """Storages that may still own pool blocks after a capture: tensors the module keeps in its
    ``__dict__`` (one level into lists/tuples/dicts) and the bases of the outputs."""
    found: list[torch.Tensor] = []

    def visit(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
        elif isinstance(v, dict):
            found.extend(x for x in v.values() if isinstance(x, torch.Tensor))

    if isinstance(module, torch.nn.Module):
        for m in module.modules():
            for k, v in vars(m).items():
                if k not in ("_parameters", "_buffers", "_modules"):
                    visit(v)
    for o in outs:
        if o._base is not None:
            found.append(o._base)
    seen: dict[int, torch.UntypedStorage] = {}
    for t in found:
        if t.is_cuda:
            s = t.untyped_storage()
            seen.setdefault(s._cdata, s)
    return list(seen.values())


def _copy_into(srcs: Sequence[torch.Tensor | None], dsts: Sequence[torch.Tensor]) -> None:
    """``dst.copy_(src)`` pairwise (zero for a missing src; nothing when src was written in place).
    A function, so that no loop variable keeps a capture-time tensor (and its pool block) alive
    after the capture."""
    with torch.no_grad():
        for src, dst in zip(srcs, dsts):
            if src is None:
                dst.zero_()
            elif not (src.data_ptr() == dst.data_ptr() and src.shape == dst.shape and src.stride() == dst.stride()):
                dst.copy_(src)


def _accumulate_into(srcs: Sequence[torch.Tensor | None], dsts: Sequence[torch.Tensor]) -> None:
    """``dst += src`` pairwise (fused wgrad accumulation into ``main_grad``)."""
    with torch.no_grad():
        for src, dst in zip(srcs, dsts):
            if src is not None:
                dst.add_(src)


class _Capturer:
    def __init__(
        self,
        modules: Mapping[tuple[int, int], Any],
        sample: SampleFn,
        smap: SlotMap,
        faults: frozenset[str],
        log: Callable[[str], None],
        fuse_wgrad: bool = False,
        chain_layers: bool = True,
        variant_hook: Callable[[int], None] | None = None,
        direct_writes: bool = True,
    ) -> None:
        self.direct_writes = direct_writes
        self.direct = 0  # tensors written straight into the arenas by their producer op
        self.copied = 0  # native saves and outputs copied into the arenas
        self.variant_hook = variant_hook or (lambda cp_size: None)
        self.fuse_wgrad = fuse_wgrad
        self.chain_layers = chain_layers
        self.modules = modules
        self.sample = sample
        self.smap = smap
        self.faults = faults
        self.log = log
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device)
        self.pool = torch.cuda.MemPool()
        self.frames: dict[tuple[int, int, int, int], Frame] = {}
        self.params = {k: trainable_params(m) for k, m in modules.items()}
        self.external = {k: external_storages(m) for k, m in modules.items()}
        self.plans: dict[tuple[int, int, int], ForwardPlan] = {}
        self.per_variant_s: dict[int, float] = {v: 0.0 for v in smap.variants}
        self.peak = 0

    # -- warmup and layout --------------------------------------------------------------------
    def warmup(self, order: Sequence[int], iters: int) -> None:
        """Ordered warmup (see :mod:`.warmup`): the rank's order, variants in lockstep by warmup group."""
        sm = self.smap
        steps = warmup_steps(order, sm.layers, sm.variants, iters, sm.warmup_group)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.plans = ordered_warmup(self.modules, self.sample, steps, self.variant_hook)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        torch.cuda.synchronize(self.device)
        missing = [(v, c, l) for v in sm.variants for (c, l) in self.modules if (v, c, l) not in self.plans]
        if missing:
            raise PlanError(f"the order never runs (cp_size, chunk, layer) {missing[:4]}; warmup observed no plan for it")
        for c, l in self.modules:
            sigs = {v: self.plans[(v, c, l)].signature() for v in self.smap.variants}
            if len(set(sigs.values())) != 1:
                raise PlanError(
                    f"chunk {c} layer {l}: CP variants disagree on tensor count, rank, dtype or requires_grad of "
                    f"inputs/outputs/grads ({sigs}); variants of one slot must be compatible"
                )

    def _can_chain(self, v: int, c: int, l: int) -> bool:
        """Layer l's first input can be staged in layer l-1's output buffer: same chunk and slot, so
        the same lifetime, and the same shape/dtype (the usual hidden-states hand-off)."""
        if l == 0:
            return False
        prev, plan = self.plans[(v, c, l - 1)], self.plans[(v, c, l)]
        if len(prev.outputs) != 1 or not plan.inputs:
            return False
        a, b = prev.outputs[0], plan.inputs[0]
        return (a.shape, a.dtype) == (b.shape, b.dtype)

    def build_layout(self) -> None:
        sm = self.smap
        self.chained = {k for k in self.plans if self._can_chain(*k)} if self.chain_layers else set()
        self.frame_layouts: dict[tuple[int, int, int], FrameLayout] = {
            k: frame_layout(p, frozenset({0}) if k in self.chained else frozenset()) for k, p in self.plans.items()
        }
        self.grad_layouts: dict[tuple[int, int], GradLayout] = {
            (v, c): grad_layout([self.plans[(v, c, l)] for l in range(sm.layers[c])])
            for v in sm.variants for c, n in enumerate(sm.layers) if n
        }
        saved = arena_sizes(
            (colour, self.frame_layouts[(v, c, l)].nbytes)
            for (c, s, l), colour in sm.saved_colour.items() for v in sm.variants
        )
        grads = arena_sizes(
            (colour, self.grad_layouts[(v, c)].nbytes) for (c, s), colour in sm.grad_colour.items() for v in sm.variants
        )
        gout = max(sum(align(dense_bytes(m)) for m in p.outputs) for p in self.plans.values())
        pgrad = max(p.param_grad_bytes + 256 * len(p.params_used) for p in self.plans.values())
        regions: dict[tuple[str, int], int] = {("saved", c): n for c, n in saved.items()}
        regions.update({("grad", c): n for c, n in grads.items()})
        regions[("gout", 0)] = gout
        regions[("pgrad", 0)] = pgrad
        self.layout = pack_backing(regions)
        with torch.cuda.use_mem_pool(self.pool):
            self.backing = torch.empty(self.layout.nbytes, dtype=torch.uint8, device=self.device)
        self.backing.fill_(0)
        alloc.require_fixed_segments(self.pool.id)

    def _saved_base(self, c: int, s: int, l: int) -> int:
        return self.layout.offsets[("saved", self.smap.saved_colour[(c, s, l)])]

    # -- one capture and its rewind -----------------------------------------------------------
    def _rewind(self, pre: alloc.Checkpoint, module: Any, outs: Sequence[torch.Tensor], name: str) -> None:
        alloc.quiesce()
        extra = alloc.live_ptrs(self.pool.id) - pre.live
        stale = [s for s in _owner_candidates(module, outs) if s.data_ptr() in extra]
        if "drop_stale_owner" in self.faults and stale:
            stale = stale[1:]
        owned = {s.data_ptr() for s in stale}
        if extra - owned:
            sizes = {b.ptr: b.size for b in alloc.pool_blocks(self.pool.id)}
            unknown = [f"{hex(p)} ({sizes.get(p, 0)} B)" for p in sorted(extra - owned)[:8]]
            raise alloc.PoolStateError(
                f"{name}: {len(extra - owned)} pool block(s) allocated during capture are still live and no known "
                f"stale owner holds them ({unknown}); everything that outlives a "
                "graph must live in the arenas (do not keep capture-time tensors outside the module's attributes)"
            )
        if stale:
            self.log(f"[slotmem] {name}: detaching {len(stale)} stale owner(s) of capture-time memory")
        if "skip_restore" in self.faults:
            alloc.verify_live(pre)
            return
        alloc.restore(pre, stale)

    def _forward(self, v: int, step: CaptureStep) -> None:
        c, s, l = step.chunk, step.slot, step.layer
        name = f"forward cp{v}/chunk{c}/slot{s}/layer{l}"
        plan = self.plans[(v, c, l)]
        fl = self.frame_layouts[(v, c, l)]
        base = self._saved_base(c, s, l)
        module = self.modules[(c, l)]
        offsets = list(fl.inputs)
        if (v, c, l) in self.chained:  # stage input 0 in layer l-1's output buffer: no copy at replay
            offsets[0] = self._saved_base(c, s, l - 1) + self.frame_layouts[(v, c, l - 1)].outputs[0] - base
        inputs = tuple(
            view_at(self.backing, base + off, contiguous_meta(m.shape, m.dtype)).detach().requires_grad_(m.requires_grad)
            for off, m in zip(offsets, plan.inputs)
        )
        with torch.no_grad():
            for t, smp in zip(inputs, self.sample(v, c, l)):
                t.copy_(smp)
        out_views = tuple(
            view_at(self.backing, base + off, contiguous_meta(m.shape, m.dtype)) for off, m in zip(fl.outputs, plan.outputs)
        )
        saved_views = [
            view_at(self.backing, base + fl.components[e.component] + e.rel_byte, e.meta) if e.kind == NATIVE else None
            for e in plan.saved
        ]
        packer = ArenaPacker(name, plan.saved, saved_views, self.external[(c, l)], inputs)
        producers = plan.producers if self.direct_writes else ()
        targets: dict[tuple[str, int], torch.Tensor] = {}
        for p in producers:
            for m, t in zip(p.returns, p.targets):
                if t is not None:
                    kind, k = t
                    targets[t] = out_views[k] if kind == OUTPUT else view_at(self.backing, base + fl.components[k], m)
        redirect = Redirect(name, producers, targets, self.device)
        graph = torch.cuda.CUDAGraph()
        alloc.clear_cublas_workspaces(self.device)
        with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
            with torch.cuda.graph(graph, pool=self.pool.id, stream=self.stream):
                with redirect:
                    outs = as_tuple(module(*inputs))
                redirect.finish()
                _copy_into(outs, out_views)
        alloc.clear_cublas_workspaces(self.device)
        packer.finish()
        self.direct += redirect.redirected
        self.copied += packer.copies + sum(o.data_ptr() != d.data_ptr() for o, d in zip(outs, out_views))
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        for o, dst in zip(outs, out_views):
            o.data = dst  # keep o as autograd root; its pool bytes are free now
        self._rewind(self._pre, module, outs, name)
        diff = tuple(o.requires_grad for o in outs)
        self.frames[(v, c, l, s)] = Frame(
            name=f"cp{v}/chunk{c}/slot{s}/layer{l}",
            static_inputs=inputs,
            static_outputs=out_views,
            out_differentiable=diff,
            grad_outputs=(),
            input_grads=(),
            param_grads=(),
            fwd=graph,
            roots=outs,
        )

    def _backward(self, v: int, step: CaptureStep) -> None:
        c, s, l = step.chunk, step.slot, step.layer
        name = f"backward cp{v}/chunk{c}/slot{s}/layer{l}"
        frame = self.frames[(v, c, l, s)]
        plan = self.plans[(v, c, l)]
        assert frame.roots is not None
        gl = self.grad_layouts[(v, c)]
        gbase = self.layout.offsets[("grad", self.smap.grad_colour[(c, s)])]
        gout_off = self.layout.offsets[("gout", 0)]
        grad_outputs = []
        for o, d in zip(plan.outputs, frame.out_differentiable):
            if d:
                meta = contiguous_meta(o.shape, o.dtype)
                grad_outputs.append(view_at(self.backing, gout_off, meta))
                gout_off += align(dense_bytes(meta))
        input_grads = tuple(
            view_at(self.backing, gbase + gl.offsets[(l, i)], contiguous_meta(m.shape, m.dtype)) if want else None
            for i, (m, want) in enumerate(zip(plan.inputs, plan.input_grads))
        )
        params = self.params[(c, l)]
        poff = self.layout.offsets[("pgrad", 0)]
        param_grads: list[torch.Tensor | None] = []
        fused: list[tuple[int, torch.nn.Parameter, torch.Tensor]] = []
        copy_srcs: list[int] = []  # indices into the grads tuple copied into scratch
        accum_srcs: list[int] = []  # indices into the grads tuple added into main_grad
        k = sum(plan.input_grads)
        copy_srcs.extend(range(k))
        for i, (p, used) in enumerate(zip(params, plan.params_used)):
            main_grad = getattr(p, "main_grad", None) if self.fuse_wgrad else None
            if used and main_grad is not None:
                if not isinstance(main_grad, torch.Tensor) or main_grad.shape != p.shape or main_grad.device != p.device:
                    raise PlanError(f"{name}: parameter {i}.main_grad must be a tensor of the parameter's shape and device")
                fused.append((i, p, main_grad))
                param_grads.append(None)
                accum_srcs.append(k)
                k += 1
            elif used:
                param_grads.append(view_at(self.backing, poff, contiguous_meta(p.shape, p.dtype)))
                poff += align(p.numel() * p.element_size())
                copy_srcs.append(k)
                k += 1
            else:
                param_grads.append(None)
        roots = [r for r, d in zip(frame.roots, frame.out_differentiable) if d]
        wrt_in = [t for t, want in zip(frame.static_inputs, plan.input_grads) if want]
        wrt_p = [p for p, used in zip(params, plan.params_used) if used]
        graph = torch.cuda.CUDAGraph()
        alloc.clear_cublas_workspaces(self.device)
        with torch.cuda.graph(graph, pool=self.pool.id, stream=self.stream):
            if roots and (wrt_in or wrt_p):
                grads = torch.autograd.grad(roots, wrt_in + wrt_p, grad_outputs=grad_outputs, allow_unused=True)
            else:
                grads = ()
            _copy_into([grads[j] for j in copy_srcs],
                       [g for g in input_grads if g is not None] + [g for g in param_grads if g is not None])
            _accumulate_into([grads[j] for j in accum_srcs], [mg for _, _, mg in fused])
        alloc.clear_cublas_workspaces(self.device)
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        del grads
        frame.roots = None
        frame.bwd = graph
        frame.grad_outputs = tuple(grad_outputs)
        frame.input_grads = input_grads
        frame.param_grads = tuple(param_grads)
        frame.fused = tuple(fused)
        if fused:
            frame.zero = torch.zeros((), dtype=params[fused[0][0]].dtype, device=self.device)
        self._rewind(self._pre, self.modules[(c, l)], (), name)

    def run(self, steps: Sequence[CaptureStep]) -> None:
        for step in steps:
            self._pre = alloc.checkpoint(self.pool.id, self.device)
            for v in self.smap.variants:
                t0 = time.perf_counter()
                self.variant_hook(v)
                if step.forward:
                    self._forward(v, step)
                else:
                    self._backward(v, step)
                self.per_variant_s[v] += time.perf_counter() - t0
            alloc.verify_live(self._pre)
        alloc.require_fixed_segments(self.pool.id)
        for key, f in self.frames.items():
            if f.bwd is None and any(f.out_differentiable):
                raise PlanError(f"no backward event captured frame {key}; the order must drain every forward")



def make_graphed_callables(
    layers: Sequence[Sequence[Any]],
    sample_args: SampleFn,
    order: Sequence[int],
    records: Iterable[Any],
    *,
    num_warmup_iters: int = 2,
    extra_orders: Sequence[Sequence[int]] = (),
    grads_in_flight: bool = True,
    fuse_wgrad_accumulation: bool = False,
    fused_grad_hooks: bool = True,
    chain_layers: bool = True,
    direct_writes: bool = True,
    variant_hook: Callable[[int], None] | None = None,
    log: Callable[[str], None] = print,
    _faults: Iterable[str] = (),
) -> SlotGraphs:
    """Capture slot-shared forward/backward graphs for every (CP variant, chunk, layer, slot).

    ``layers[c][l]`` is layer ``l`` of 0-based chunk ``c`` (order entries use ``c + 1``).
    ``sample_args(cp_size, chunk, layer)`` gives that variant's sample inputs (their
    ``requires_grad`` says which input grads are returned). ``order`` is this rank's base schedule;
    ``records`` the slot plan (one record per captured forward, see :mod:`.protocol`);
    ``extra_orders`` are other reachable orders the plan must also be safe for;
    ``grads_in_flight``: returned input grads stay live until the end of the next backward (PP > 1).
    ``fuse_wgrad_accumulation``: parameters with a ``main_grad`` tensor get their gradient added into
    it inside the backward graph; replay returns a zero gradient for them so AccumulateGrad and its
    hooks (e.g. a DDP reduce hook) still fire; ``fused_grad_hooks=False`` returns no gradient for
    them instead (no hook needs one: saves a pass over every fused gradient per replay). Other
    parameter grads are cloned on return.
    ``chain_layers``: layer l's first input is staged in layer l-1's output buffer when shapes match
    (same frame lifetime), so passing layer l-1's output to layer l copies nothing; a different
    tensor passed there is copied into that buffer.
    ``direct_writes``: a saved tensor or output that is the whole result of an out-of-place aten op
    with an ``out=`` overload is written into its arena by that op (no copy; see :mod:`.direct`).
    ``variant_hook(cp_size)`` runs on the host before every warmup and capture of that CP variant
    (e.g. to point the layers at that variant's CP process group); it is never replayed.
    Warmup replays ``order`` ``num_warmup_iters`` times eagerly (forwards and backwards interleaved,
    variants of an event in lockstep, each forward released at its backward; see :mod:`.warmup`).
    """
    faults = frozenset(_faults)
    if faults - FAULTS:
        raise ValueError(f"unknown faults {sorted(faults - FAULTS)}; known: {sorted(FAULTS)}")
    smap = build_slot_map(records, [len(chunk) for chunk in layers])
    modules = {(c, l): m for c, chunk in enumerate(layers) for l, m in enumerate(chunk)}
    if "skip_liveness_check" not in faults:
        for o in (order, *extra_orders):
            check_liveness(o, smap, grads_in_flight)
    steps = capture_steps(order, smap)
    cap: _Capturer | None = None
    with alloc.CaptureGuard():
        try:
            cap = _Capturer(modules, sample_args, smap, faults, log, fuse_wgrad_accumulation, chain_layers,
                            variant_hook, direct_writes)
            t0 = time.perf_counter()
            torch.cuda.reset_peak_memory_stats(cap.device)
            rng = torch.cuda.get_rng_state(cap.device)
            cap.warmup(order, num_warmup_iters)
            torch.cuda.set_rng_state(rng, cap.device)
            warmup_peak = torch.cuda.max_memory_allocated(cap.device)
            torch.cuda.reset_peak_memory_stats(cap.device)
            t1 = time.perf_counter()
            cap.build_layout()
            cap.run(steps)
            torch.cuda.synchronize(cap.device)
            t2 = time.perf_counter()
        except BaseException as err:
            if cap is not None:
                reset_frames(cap.frames)
            if isinstance(err, (PlanError, alloc.AllocatorUnsupported, alloc.PoolStateError)):
                raise
            if isinstance(err, Exception):
                raise CaptureError(f"slot-shared capture failed: {err}") from err
            raise
    owner = SlotGraphs(
        smap=smap,
        pool=cap.pool,
        stream=cap.stream,
        backing=cap.backing,
        layout=cap.layout,
        frames=cap.frames,
        plans=cap.plans,
        modules=modules,
        _params=cap.params,
        clone_param_grads="skip_param_grad_clone" not in faults,
        fused_grad_hooks=fused_grad_hooks,
    )
    mem = owner.memory()
    graphs = sum(1 + (f.bwd is not None) for f in cap.frames.values())
    summary = _summary(smap, mem.pool_reserved)
    owner.stats = CaptureStats(t1 - t0, t2 - t1, graphs, dict(cap.per_variant_s), cap.peak, summary, warmup_peak,
                               cap.direct, cap.copied)
    log(f"[slotmem] {summary}; {graphs} graphs, arenas {mem.backing / 2**20:.1f} MiB, capture {t2 - t1:.2f}s, "
        f"{cap.direct} tensors written into arenas directly, {cap.copied} copied")
    return owner


def capture_plan(
    layers: Sequence[Sequence[Any]],
    sample_args: SampleFn,
    plan: SlotPlan,
    **kwargs: Any,
) -> SlotGraphs:
    """:func:`make_graphed_callables` from the planner's per-rank ``SlotPlan``: validates the plan,
    captures its order and records, and checks liveness over every reachable order."""
    plan.validate()
    extra = tuple(o for _, o in plan.reachable_orders())
    return make_graphed_callables(
        layers, sample_args, plan.order, plan.records, extra_orders=extra, grads_in_flight=plan.pp > 1, **kwargs
    )


__all__ = [
    "FAULTS",
    "CaptureError",
    "capture_plan",
    "make_graphed_callables",
]
