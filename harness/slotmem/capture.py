"""Slot-shared CUDA graph capture across dynamic-CP variants in ONE ``torch.cuda.MemPool``.

Design (measurements in bench/RESULTS-log.md):
* everything that outlives one graph lives in one *backing* allocation inside the pool, carved into
  explicit arenas: per saved colour (static inputs, outputs, native saved tensors of a frame), per
  grad colour (returned input grads), and two scratch regions (incoming output grads, param grads);
  each arena is sized max over its members, so CP variants of one slot share bytes by construction;
* the pool otherwise holds only per-graph transients;
* saved tensors and outputs that are the whole result of an out-of-place aten op are written into
  their arena by that op's ``out=`` overload instead of being copied there (:mod:`.direct`);
* warmup replays the rank's order eagerly, one variant at a time, releasing each forward at its
  backward (:mod:`.warmup`);
* the variants of one schedule event are captured in lockstep; after each variant the allocator
  must be back in the event's checkpoint state so every variant leaves the identical allocator
  state. When the pool's live set is the checkpoint's, it is (see :meth:`_Session._rewind`);
  otherwise the blocks left live are owned by capture-time tensors a module kept, and the
  allocator is rewound (validate -> detach stale owners -> restore -> verify live set);
* replay picks the graphs by ``(cp_size, microbatch % slots)``.

A capture session moves through explicit phases (:mod:`.phases`), each checking its invariants.

Public: :func:`make_graphed_callables`, :func:`capture_plan` (from the planner's ``SlotPlan``);
replay objects in :mod:`.replay` (:class:`SlotGraphs`, :class:`GraphedLayer`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from . import allocator as alloc
from .arenas import NATIVE, ArenaLayout, ForwardPlan, align, contiguous_meta, dense_bytes, plan_arenas, view_at
from .direct import Redirect
from .phases import Phase, PhaseState
from .plan import SlotPlan
from .procstate import ProcessStateGuard
from .protocol import CaptureStep, PlanError, SlotMap, build_slot_map, capture_steps, check_orders
from .replay import CaptureStats, Frame, SlotGraphs, reset_frames
from .saved import ArenaPacker, CaptureMismatch, copy_view
from .tensors import inner_tensors, storage_keys
from .warmup import SampleFn, as_tuple, external_storages, ordered_warmup, sample_inputs, trainable_params, warmup_steps


class CaptureError(RuntimeError):
    """Capture failed; nothing of it is left in the process (graphs reset, pool released)."""


@dataclass(frozen=True)
class CaptureOptions:
    """The knobs of :func:`make_graphed_callables` that shape a capture session."""

    num_warmup_iters: int = 2
    fuse_wgrad: bool = False
    chain_layers: bool = True
    direct_writes: bool = True
    variant_hook: Callable[[int], None] | None = None


# ---------------------------------------------------------------------------------------------
# Capture


def _summary(smap: SlotMap, pool_bytes: int) -> str:
    slots = max(smap.slots.values())
    return (f"{len(smap.variants)} dynamic-CP variants over {slots} slot-aliased physical pool slots "
            f"(CP sizes {list(smap.variants)}, pool {pool_bytes / 2**20:.1f} MiB)")


def _owner_candidates(module: Any, outs: Sequence[torch.Tensor]) -> list[torch.UntypedStorage]:
    """Storages that may still own pool blocks after a capture: tensors the module keeps in its
    ``__dict__`` (one level into lists/tuples/dicts; wrapper subclasses by their inner tensors)
    and the bases of the outputs."""
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
    for t in (x for f in found for x in inner_tensors(f)):
        if t.is_cuda:
            s = t.untyped_storage()
            seen.setdefault(s._cdata, s)
    return list(seen.values())


def _copy_into(srcs: Sequence[torch.Tensor | None], dsts: Sequence[torch.Tensor]) -> int:
    """``dst <- src`` pairwise (zero for a missing src; nothing when src already is dst's view);
    returns the number of copies. A function, so that no loop variable keeps a capture-time
    tensor (and its pool block) alive after the capture."""
    copies = 0
    with torch.no_grad():
        for src, dst in zip(srcs, dsts):
            if src is None:
                dst.zero_()
            elif not (src.data_ptr() == dst.data_ptr() and src.shape == dst.shape and src.stride() == dst.stride()):
                copy_view(src, dst)
                copies += 1
    return copies


def _accumulate_into(srcs: Sequence[torch.Tensor | None], dsts: Sequence[torch.Tensor]) -> None:
    """``dst += src`` pairwise (fused wgrad accumulation into ``main_grad``)."""
    with torch.no_grad():
        for src, dst in zip(srcs, dsts):
            if src is not None:
                dst.add_(src)


def _place_outputs(name: str, plan: ForwardPlan, outs: Sequence[torch.Tensor],
                   views: Sequence[torch.Tensor | None], external: set[int]) -> tuple[tuple[torch.Tensor, ...], int]:
    """Inside the forward capture: each output into its arena view (``None``: an output of module
    state, returned as it is). Returns the static outputs and the number of copies."""
    if len(outs) != len(plan.outputs):
        raise CaptureMismatch(f"{name}: returns {len(outs)} tensors during capture, warmup saw {len(plan.outputs)}")
    statics: list[torch.Tensor] = []
    native_src, native_dst = [], []
    for k, (o, view) in enumerate(zip(outs, views)):
        if view is None:
            keys = storage_keys(o)
            if not keys or not keys <= external:
                raise CaptureMismatch(f"{name}: output {k} was a parameter/buffer (view) in warmup, not now")
            statics.append(o.detach())
        else:
            native_src.append(o)
            native_dst.append(view)
            statics.append(view)
    return tuple(statics), _copy_into(native_src, native_dst)


def _capture_device() -> torch.device:
    """The CUDA device captures run on (the current one)."""
    return torch.device("cuda", torch.cuda.current_device())


class _Session:
    """One slot-shared capture: its phase (:mod:`.phases`), its pool and stream, and what each
    phase produced. Every attribute exists from construction on; the ones a phase produces are
    empty (or ``None``) before it."""

    def __init__(self, modules: Mapping[tuple[int, int], Any], sample: SampleFn, smap: SlotMap,
                 opts: CaptureOptions, log: Callable[[str], None]) -> None:
        self.state = PhaseState()
        self.modules = modules
        self.sample = sample
        self.smap = smap
        self.opts = opts
        self.log = log
        self.variant_hook: Callable[[int], None] = opts.variant_hook or (lambda cp_size: None)
        self.device = _capture_device()
        self.stream = torch.cuda.Stream(self.device)
        self.pool = torch.cuda.MemPool()
        self.params = {k: trainable_params(m) for k, m in modules.items()}
        self.external = {k: external_storages(m) for k, m in modules.items()}
        self.plans: dict[tuple[int, int, int], ForwardPlan] = {}  # WARMUP
        self.arenas: ArenaLayout | None = None  # LAYOUT
        self.backing: torch.Tensor | None = None  # LAYOUT
        self.frames: dict[tuple[int, int, int, int], Frame] = {}  # CAPTURE
        self.checkpoint: alloc.Checkpoint | None = None  # CAPTURE: the lockstep unit in progress
        self.per_variant_s: dict[int, float] = {v: 0.0 for v in smap.variants}
        self.peak = 0
        self.direct = 0  # tensors written straight into the arenas by their producer op
        self.copied = 0  # native saves and outputs copied into the arenas
        self.restores = 0  # allocator rewinds done (a capture left stale owners)
        self.detached = 0  # stale owners detached by those rewinds

    @property
    def phase(self) -> Phase:
        return self.state.phase

    def fail(self) -> None:
        """Enter FAILED: reset every graph and drop every capture-time root."""
        self.state.fail()
        self.checkpoint = None
        reset_frames(self.frames)

    # -- WARMUP -------------------------------------------------------------------------------
    def warmup(self, order: Sequence[int]) -> None:
        """Ordered warmup (see :mod:`.warmup`): the rank's order, one variant at a time."""
        self.state.advance(Phase.WARMUP)
        sm = self.smap
        steps = warmup_steps(order, sm.layers, sm.variants, self.opts.num_warmup_iters, sm.warmup_group)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.plans = ordered_warmup(self.modules, self.sample, steps, self.variant_hook)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        torch.cuda.synchronize(self.device)
        missing = [(v, c, l) for v in sm.variants for (c, l) in self.modules if (v, c, l) not in self.plans]
        if missing:
            raise PlanError(f"the order never runs (cp_size, chunk, layer) {missing[:4]}; warmup observed no plan for it")
        for c, l in self.modules:
            sigs = {v: self.plans[(v, c, l)].signature() for v in sm.variants}
            if len(set(sigs.values())) != 1:
                raise PlanError(
                    f"chunk {c} layer {l}: CP variants disagree on tensor count, rank, dtype or requires_grad of "
                    f"inputs/outputs/grads ({sigs}); variants of one slot must be compatible"
                )

    # -- LAYOUT -------------------------------------------------------------------------------
    def build_layout(self) -> None:
        self.state.require(Phase.WARMUP, what="build_layout")
        self.state.advance(Phase.LAYOUT)
        sm = self.smap
        self.arenas = plan_arenas(self.plans, sm.layers, sm.variants, sm.saved_colour, sm.grad_colour,
                                  self.opts.chain_layers, {k: self._pgrad_bytes(k) for k in self.plans})
        # Blocks the caller's eager steps and the warmup left cached in the default pool would
        # keep the backing from the device: return them first (a 25.7 GiB backing failed beside
        # 86 GiB of cached free blocks on an H200).
        alloc.quiesce()
        with torch.cuda.use_mem_pool(self.pool):
            self.backing = torch.empty(self.arenas.backing.nbytes, dtype=torch.uint8, device=self.device)
        self.backing.fill_(0)
        alloc.require_fixed_segments(self.pool.id)
        self._check_only_backing_live("after the layout")

    def _fused(self, p: torch.nn.Parameter) -> torch.Tensor | None:
        """The ``main_grad`` a backward graph accumulates ``p``'s gradient into (fused wgrad), if any."""
        return getattr(p, "main_grad", None) if self.opts.fuse_wgrad else None

    def _pgrad_bytes(self, key: tuple[int, int, int]) -> int:
        """Scratch for the parameter grads the backward of ``key`` returns: the used parameters
        without a fused ``main_grad`` (fused ones are added into it inside the graph)."""
        _, c, l = key
        used = self.plans[key].params_used
        return sum(align(p.numel() * p.element_size()) for p, u in zip(self.params[(c, l)], used)
                   if u and self._fused(p) is None)

    def _check_only_backing_live(self, when: str) -> None:
        assert self.backing is not None
        alloc.quiesce()
        if not alloc.check_live(self.device.index, self.pool.id, {self.backing.data_ptr()}):
            live = sorted(alloc.live_ptrs(self.pool.id) - {self.backing.data_ptr()})
            raise alloc.PoolStateError(f"{when}, the pool holds {len(live)} live block(s) besides the arenas' backing "
                                       f"({[hex(p) for p in live[:8]]}); everything that outlives a graph must live in "
                                       "the arenas")

    def _layout(self) -> tuple[ArenaLayout, torch.Tensor]:
        if self.arenas is None or self.backing is None:
            raise AssertionError(f"no arena layout in phase {self.phase.value}")
        return self.arenas, self.backing

    def _saved_base(self, c: int, s: int, l: int) -> int:
        return self._layout()[0].region("saved", self.smap.saved_colour[(c, s, l)])

    # -- CAPTURE ------------------------------------------------------------------------------
    def capture(self, steps: Sequence[CaptureStep]) -> None:
        """Every lockstep unit: checkpoint, each variant captured and rewound, live set verified."""
        self.state.require(Phase.LAYOUT, what="capture")
        self.state.advance(Phase.CAPTURE)
        for step in steps:
            self.checkpoint = alloc.checkpoint(self.pool.id, self.device)
            for v in self.smap.variants:
                t0 = time.perf_counter()
                self.variant_hook(v)
                if step.forward:
                    self._forward(v, step)
                else:
                    self._backward(v, step)
                self.per_variant_s[v] += time.perf_counter() - t0
            alloc.verify_live(self.checkpoint)
        self.checkpoint = None
        self._check_captured()
        self.state.advance(Phase.REPLAY)

    def _check_captured(self) -> None:
        alloc.require_fixed_segments(self.pool.id)
        for key, f in self.frames.items():
            if f.bwd is None and any(f.out_differentiable):
                raise PlanError(f"no backward event captured frame {key}; the order must drain every forward")
            if f.roots is not None:
                raise AssertionError(f"frame {key} still holds its capture-time autograd roots")
        self._check_only_backing_live("after capture")

    def _rewind(self, module: Any, outs: Sequence[torch.Tensor], name: str) -> None:
        """Put the pool back in the lockstep unit's checkpoint state after one variant's capture.

        If the pool's live set is the checkpoint's (``checkPoolLiveAllocations``), its state IS
        the checkpoint's and no restore is needed: the checkpoint's live blocks are the same
        tensors at the same addresses, every other byte of the pool's segments is free again, and
        the allocator merges a freed block with its free neighbours, so the free ranges between
        the live blocks are the maximal ones, as at the checkpoint (segments created during the
        capture stay free; a restore would keep them too). Otherwise the extra live blocks must
        belong to capture-time tensors the module kept (stale owners): they are detached and the
        allocator is restored, so the next variant gets the same addresses (what
        ``test_rewind_*`` in tests/slotmem/test_capture_gpu.py shows)."""
        cp = self.checkpoint
        assert cp is not None, "rewind outside a lockstep unit"
        alloc.quiesce()
        extra = alloc.live_ptrs(self.pool.id) - cp.live
        if not extra:
            alloc.verify_live(cp)
            return
        stale = [s for s in _owner_candidates(module, outs)
                 if s.data_ptr() in extra and alloc.has_standard_deleter(s)]  # a detached alias owns nothing
        owned = {s.data_ptr() for s in stale}
        if extra - owned:
            sizes = {b.ptr: b.size for b in alloc.pool_blocks(self.pool.id)}
            unknown = [f"{hex(p)} ({sizes.get(p, 0)} B)" for p in sorted(extra - owned)[:8]]
            raise alloc.PoolStateError(
                f"{name}: {len(extra - owned)} pool block(s) allocated during capture are still live and no known "
                f"stale owner holds them ({unknown}); everything that outlives a "
                "graph must live in the arenas (do not keep capture-time tensors outside the module's attributes)"
            )
        self.log(f"[slotmem] {name}: detaching {len(stale)} stale owner(s) of capture-time memory")
        alloc.restore(cp, stale)
        self.restores += 1
        self.detached += len(stale)

    def _forward(self, v: int, step: CaptureStep) -> None:
        c, s, l = step.chunk, step.slot, step.layer
        name = f"forward cp{v}/chunk{c}/slot{s}/layer{l}"
        arenas, backing = self._layout()
        plan = self.plans[(v, c, l)]
        fl = arenas.frames[(v, c, l)]
        base = self._saved_base(c, s, l)
        module = self.modules[(c, l)]
        offsets = list(fl.inputs)
        if (v, c, l) in arenas.chained:  # stage input 0 in layer l-1's output view: no copy at replay
            offsets[0] = self._saved_base(c, s, l - 1) + arenas.frames[(v, c, l - 1)].outputs[0] - base
        inputs = tuple(
            view_at(backing, base + off, contiguous_meta(m.shape, m.dtype)).detach().requires_grad_(m.requires_grad)
            for off, m in zip(offsets, plan.inputs)
        )
        sample = sample_inputs(self.sample, v, c, l)
        if len(sample) != len(inputs):
            raise CaptureMismatch(f"{name}: sample_args gave {len(sample)} inputs, warmup saw {len(inputs)}")
        with torch.no_grad():
            for t, smp in zip(inputs, sample):
                t.copy_(smp)
        del sample
        out_views = tuple(None if off < 0 else view_at(backing, base + off, plan.output_view_meta(k))
                          for k, off in enumerate(fl.outputs))
        saved_views = [
            view_at(backing, base + fl.components[e.component] + e.rel_byte, e.meta) if e.kind == NATIVE else None
            for e in plan.saved
        ]
        packer = ArenaPacker(name, plan.saved, saved_views, self.external[(c, l)], inputs)
        producers = plan.producers if self.opts.direct_writes else ()
        targets = {t: view_at(backing, base + fl.components[t[1]], m)
                   for p in producers for m, t in zip(p.returns, p.targets) if t is not None}
        redirect = Redirect(name, producers, targets, self.device)
        graph = torch.cuda.CUDAGraph()
        frame = Frame(name=f"cp{v}/chunk{c}/slot{s}/layer{l}", static_inputs=inputs, static_outputs=(),
                      out_differentiable=(), grad_outputs=(), input_grads=(), param_grads=(), fwd=graph)
        self.frames[(v, c, l, s)] = frame  # before anything can fail: a failed capture resets its graph
        alloc.clear_cublas_workspaces(self.device)
        with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
            with torch.cuda.graph(graph, pool=self.pool.id, stream=self.stream):
                with redirect:
                    outs = as_tuple(module(*inputs))
                redirect.finish()
                statics, copies = _place_outputs(name, plan, outs, out_views, self.external[(c, l)])
        alloc.clear_cublas_workspaces(self.device)
        packer.finish()
        self.direct += redirect.redirected
        self.copied += packer.copies + copies
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        arena = backing.untyped_storage().data_ptr()
        for o, view in zip(outs, out_views):
            if view is not None and o.untyped_storage().data_ptr() != arena:
                o.data = view  # keep o as autograd root; its pool bytes are free now (an output already
                # in the arenas, e.g. a static input returned as is, keeps its own bytes)
        frame.static_outputs = statics
        frame.out_differentiable = tuple(o.requires_grad for o in outs)
        frame.roots = outs
        self._rewind(module, outs, name)

    def _backward(self, v: int, step: CaptureStep) -> None:
        c, s, l = step.chunk, step.slot, step.layer
        name = f"backward cp{v}/chunk{c}/slot{s}/layer{l}"
        arenas, backing = self._layout()
        frame = self.frames[(v, c, l, s)]
        plan = self.plans[(v, c, l)]
        if frame.roots is None:
            raise AssertionError(f"{name}: its forward left no autograd roots")
        gl = arenas.grads[(v, c)]
        gbase = arenas.region("grad", self.smap.grad_colour[(c, s)])
        gout_off = arenas.region("gout", 0)
        grad_outputs = []
        for o, d in zip(plan.outputs, frame.out_differentiable):
            if d:
                meta = contiguous_meta(o.shape, o.dtype)
                grad_outputs.append(view_at(backing, gout_off, meta))
                gout_off += align(dense_bytes(meta))
        input_grads = tuple(
            view_at(backing, gbase + gl.offsets[(l, i)], contiguous_meta(m.shape, m.dtype)) if want else None
            for i, (m, want) in enumerate(zip(plan.inputs, plan.input_grads))
        )
        params = self.params[(c, l)]
        poff = arenas.region("pgrad", 0)
        param_grads: list[torch.Tensor | None] = []
        fused: list[tuple[int, torch.nn.Parameter, torch.Tensor]] = []
        copy_srcs: list[int] = []  # indices into the grads tuple copied into scratch
        accum_srcs: list[int] = []  # indices into the grads tuple added into main_grad
        k = sum(plan.input_grads)
        copy_srcs.extend(range(k))
        for i, (p, used) in enumerate(zip(params, plan.params_used)):
            main_grad = self._fused(p)
            if used and main_grad is not None:
                if not isinstance(main_grad, torch.Tensor) or main_grad.shape != p.shape or main_grad.device != p.device:
                    raise PlanError(f"{name}: parameter {i}.main_grad must be a tensor of the parameter's shape and device")
                fused.append((i, p, main_grad))
                param_grads.append(None)
                accum_srcs.append(k)
                k += 1
            elif used:
                param_grads.append(view_at(backing, poff, contiguous_meta(p.shape, p.dtype)))
                poff += align(p.numel() * p.element_size())
                copy_srcs.append(k)
                k += 1
            else:
                param_grads.append(None)
        roots = [r for r, d in zip(frame.roots, frame.out_differentiable) if d]
        wrt_in = [t for t, want in zip(frame.static_inputs, plan.input_grads) if want]
        wrt_p = [p for p, used in zip(params, plan.params_used) if used]
        graph = torch.cuda.CUDAGraph()
        frame.bwd = graph  # before anything can fail: a failed capture resets its graph
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
        del grads, roots
        frame.roots = None
        frame.grad_outputs = tuple(grad_outputs)
        frame.input_grads = input_grads
        frame.param_grads = tuple(param_grads)
        frame.fused = tuple(fused)
        if fused:
            frame.zero = torch.zeros((), dtype=params[fused[0][0]].dtype, device=self.device)
        self._rewind(module=self.modules[(c, l)], outs=(), name=name)

    # -- REPLAY -------------------------------------------------------------------------------
    def graphs(self) -> SlotGraphs:
        """The replay object (phase REPLAY): owns the pool, the backing and every frame."""
        self.state.require(Phase.REPLAY, what="graphs")
        arenas, backing = self._layout()
        return SlotGraphs(smap=self.smap, pool=self.pool, stream=self.stream, backing=backing,
                          layout=arenas.backing, frames=self.frames, plans=self.plans, modules=self.modules,
                          _params=self.params)


def make_graphed_callables(
    layers: Sequence[Sequence[Any]],
    sample_args: SampleFn,
    order: Sequence[int],
    records: Iterable[Any],
    *,
    num_warmup_iters: int = 2,
    extra_orders: Sequence[Sequence[int]] = (),
    pp: int = 2,
    fuse_wgrad_accumulation: bool = False,
    fused_grad_hooks: bool = True,
    chain_layers: bool = True,
    direct_writes: bool = True,
    variant_hook: Callable[[int], None] | None = None,
    log: Callable[[str], None] = print,
) -> SlotGraphs:
    """Capture slot-shared forward/backward graphs for every (CP variant, chunk, layer, slot).

    ``layers[c][l]`` is layer ``l`` of 0-based chunk ``c`` (order entries use ``c + 1``).
    ``sample_args(cp_size, chunk, layer)`` gives that variant's sample inputs: plain CUDA tensors
    only (their ``requires_grad`` says which input grads are returned; metadata goes in int/bool
    tensors with ``requires_grad=False``). ``order`` is this rank's base schedule; ``records`` the
    slot plan (one record per captured forward, see :mod:`.protocol`); ``extra_orders`` are other
    reachable orders the plan must also be safe for; ``pp``: the pipeline size the orders run
    under, which decides how long returned input grads stay live (the planner's rule, see
    :func:`.protocol.check_orders`; :func:`capture_plan` passes the plan's).
    ``fuse_wgrad_accumulation``: parameters with a ``main_grad`` tensor get their gradient added into
    it inside the backward graph; replay returns a zero gradient for them so AccumulateGrad and its
    hooks (e.g. a DDP reduce hook) still fire; ``fused_grad_hooks=False`` returns no gradient for
    them instead (no hook needs one: saves a pass over every fused gradient per replay). Other
    parameter grads are cloned on return.
    ``chain_layers``: layer l's first input is staged in layer l-1's output view when shapes match
    (same frame lifetime), so passing layer l-1's output to layer l copies nothing; a different
    tensor passed there is copied into that buffer.
    ``direct_writes``: a saved tensor or output that is the whole result of an out-of-place aten op
    with an ``out=`` overload is written into its arena by that op (no copy; see :mod:`.direct`).
    ``variant_hook(cp_size)`` runs on the host before every warmup and capture of that CP variant
    (e.g. to point the layers at that variant's CP process group); it is never replayed.
    Warmup replays ``order`` ``num_warmup_iters`` times eagerly per variant (forwards and backwards
    interleaved, one variant at a time, each forward released at its backward; see :mod:`.warmup`).

    Outputs keep their storage relations (outputs that view one storage are views of one
    component after replay; an output of module state is returned as that state). Errors:
    :class:`PlanError`, :class:`~.allocator.AllocatorUnsupported` and
    :class:`~.allocator.PoolStateError` as they are, anything else as :class:`CaptureError`; in
    every case the graphs are reset, and the CUDA RNG state, current stream, saved-tensor hooks
    and dispatch modes are as before the call (:mod:`.procstate`).
    """
    smap = build_slot_map(records, [len(chunk) for chunk in layers])
    modules = {(c, l): m for c, chunk in enumerate(layers) for l, m in enumerate(chunk)}
    labelled = [("capture order", order), *((f"reachable order {i}", o) for i, o in enumerate(extra_orders))]
    check_orders(labelled, smap, pp)
    steps = capture_steps(order, smap)
    opts = CaptureOptions(num_warmup_iters, fuse_wgrad_accumulation, chain_layers, direct_writes, variant_hook)
    with alloc.CaptureGuard():
        try:
            session = _Session(modules, sample_args, smap, opts, log)
            with ProcessStateGuard(session.device) as guard:
                try:
                    t0 = time.perf_counter()
                    torch.cuda.reset_peak_memory_stats(session.device)
                    session.warmup(order)
                    guard.restore_rng()  # warmup leaves the CUDA generator as it found it
                    warmup_peak = torch.cuda.max_memory_allocated(session.device)
                    torch.cuda.reset_peak_memory_stats(session.device)
                    t1 = time.perf_counter()
                    session.build_layout()
                    session.capture(steps)
                    torch.cuda.synchronize(session.device)
                    t2 = time.perf_counter()
                except BaseException:
                    session.fail()
                    raise
            if guard.removed:
                log(f"[slotmem] capture left {guard.removed} behind; removed")
        except BaseException as err:
            if isinstance(err, (PlanError, alloc.AllocatorUnsupported, alloc.PoolStateError)):
                raise
            if isinstance(err, Exception):
                raise CaptureError(f"slot-shared capture failed: {err}") from err
            raise
    owner = session.graphs()
    owner.fused_grad_hooks = fused_grad_hooks
    mem = owner.memory()
    graphs = sum(1 + (f.bwd is not None) for f in session.frames.values())
    summary = _summary(smap, mem.pool_reserved)
    owner.stats = CaptureStats(t1 - t0, t2 - t1, graphs, dict(session.per_variant_s), session.peak, summary,
                               warmup_peak, session.direct, session.copied, session.restores, session.detached)
    log(f"[slotmem] {summary}; {graphs} graphs, arenas {mem.backing / 2**20:.1f} MiB, capture {t2 - t1:.2f}s, "
        f"{session.direct} tensors written into arenas directly, {session.copied} copied")
    return owner


def capture_plan(
    layers: Sequence[Sequence[Any]],
    sample_args: SampleFn,
    plan: SlotPlan,
    **kwargs: Any,
) -> SlotGraphs:
    """:func:`make_graphed_callables` from the planner's per-rank ``SlotPlan``: validates the plan,
    captures its order and records, and checks liveness over every reachable order under the
    plan's pipeline size (the planner's rule)."""
    plan.validate()
    extra = tuple(o for _, o in plan.reachable_orders())
    return make_graphed_callables(layers, sample_args, plan.order, plan.records, extra_orders=extra, pp=plan.pp,
                                  **kwargs)


__all__ = [
    "CaptureError",
    "CaptureOptions",
    "capture_plan",
    "make_graphed_callables",
]
