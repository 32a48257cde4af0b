"""Eager warmup in schedule order: initialise libraries and observe each forward's plan.

Warmup replays the rank's order ``iters`` times on the current stream (like Transformer Engine's
ordered warmup): forwards and backwards interleaved as at run time, layers ascending in a forward
event and descending in a backward event. The CP variants are warmed **one at a time**, largest CP
first (by warmup group): each variant replays the whole order before the next starts. A forward's
inputs, outputs and saved tensors are held until the matching backward and released there (TE PR
#3427: an ordered warmup that keeps consumed outputs runs out of memory at scale), so warmup holds
the microbatches in flight of ONE variant: no more than the capture's arenas, which hold the
frames in flight once, sized for the largest variant (variants in lockstep would hold the sum).

:func:`warmup_steps` is the pure event sequence; :func:`ordered_warmup` runs it and returns one
:class:`~.arenas.ForwardPlan` per (cp_size, chunk, layer), checked identical over every microbatch
and iteration. Each forward is traced (:class:`~.direct.OpTracer`) to find the ops that can write
its saved tensors and outputs straight into the arena; a callable whose op calls differ between
forwards gets no direct writes (it is still captured, with copies).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import torch

from .arenas import ForwardPlan, Producer, TensorMeta, component_spans
from .direct import OpTracer, find_producers
from .protocol import events
from .saved import SaveObserver
from .tensors import WarmupError, check_inputs, external_storage_keys

SampleFn = Callable[[int, int, int], Sequence[torch.Tensor]]  # (cp_size, chunk 0-based, layer) -> inputs



@dataclass(frozen=True)
class WarmupStep:
    """One eager call of warmup: the forward or backward of one variant of one layer."""

    iteration: int
    forward: bool
    chunk: int  # 0-based
    layer: int
    microbatch: int  # the chunk's logical microbatch in the order
    cp_size: int

    @property
    def frame(self) -> tuple[int, int, int, int]:
        """``(cp_size, chunk, layer, microbatch)``: what a forward holds until its backward."""
        return (self.cp_size, self.chunk, self.layer, self.microbatch)


def warmup_steps(
    order: Sequence[int],
    layers_per_chunk: Sequence[int],
    variants: Sequence[int],
    iters: int,
    group: Mapping[tuple[int, int, int], int] | None = None,
) -> tuple[WarmupStep, ...]:
    """The warmup's calls, one variant at a time: for each variant, ``iters`` passes over
    ``order`` (which must drain), forward layers ascending and backward layers descending.
    Variants are ordered by their lowest ``group[(cp_size, chunk, layer)]`` (the plan's warmup
    group: largest CP first), then by their position in ``variants``. Zero-layer chunks make no
    calls."""
    if iters < 1:
        raise WarmupError("num_warmup_iters must be >= 1 (cuBLAS and autograd need a warm backward before capture)")
    if not variants or len(set(variants)) != len(variants):
        raise WarmupError(f"variants must be distinct CP sizes, got {list(variants)}")
    rank = {v: i for i, v in enumerate(variants)}
    groups = group or {}
    evs = events(order, len(layers_per_chunk))
    callables = [(c, l) for c, n in enumerate(layers_per_chunk) for l in range(n)]

    def first_group(v: int) -> tuple[int, int]:
        return (min((groups.get((v, c, l), 0) for c, l in callables), default=0), rank[v])

    steps: list[WarmupStep] = []
    for v in sorted(variants, key=first_group):
        for it in range(iters):
            for ev in evs:
                n = layers_per_chunk[ev.chunk]
                for layer in (range(n) if ev.forward else range(n - 1, -1, -1)):
                    steps.append(WarmupStep(it, ev.forward, ev.chunk, layer, ev.microbatch, v))
    return tuple(steps)


def as_tuple(out: object) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return tuple(out)
    raise WarmupError(f"a graphed callable must return a tensor or a tuple of tensors, got {type(out).__name__}")


def trainable_params(module: Callable[..., object]) -> tuple[torch.nn.Parameter, ...]:
    if isinstance(module, torch.nn.Module):
        return tuple(p for p in module.parameters() if p.requires_grad)
    return ()


def external_storages(module: Callable[..., object]) -> set[int]:
    """Storage pointers of the callable's parameters and buffers (saved and returned as they are);
    a wrapper-subclass parameter or buffer (e.g. FP8) contributes its inner tensors' storages."""
    if not isinstance(module, torch.nn.Module):
        return set()
    return external_storage_keys([*module.parameters(), *module.buffers()])


def sample_inputs(sample: SampleFn, cp_size: int, chunk: int, layer: int, require_cuda: bool = True
                  ) -> tuple[torch.Tensor, ...]:
    """``sample(cp_size, chunk, layer)``, checked to be plain (CUDA) tensors (see :func:`.tensors.check_inputs`)."""
    return check_inputs(sample(cp_size, chunk, layer), f"sample_args(cp_size={cp_size}, chunk={chunk}, layer={layer})",
                        require_cuda)


def check_output(t: torch.Tensor, name: str, require_cuda: bool = True) -> None:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        raise WarmupError(f"{name}: tensor subclass outputs ({type(t).__name__}) cannot be graphed")
    if require_cuda and not t.is_cuda:
        raise WarmupError(f"{name}: output on {t.device}; graphed callables must return CUDA tensors")


@dataclass
class _Held:
    """A warmed forward waiting for its backward (released there)."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    observer: SaveObserver
    producers: tuple[Producer, ...]
    widen: dict[int, tuple[int, int]]  # components widened to their producer's output


def _run_forward(module: Callable[..., object], sample: Sequence[torch.Tensor], external: set[int],
                 name: str, require_cuda: bool) -> _Held:
    inputs = tuple(s.detach().clone().requires_grad_(s.requires_grad) for s in sample)
    obs = SaveObserver(external, inputs)
    tracer = OpTracer()
    with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack), tracer:
        outs = as_tuple(module(*inputs))
    for o in outs:
        check_output(o, name, require_cuda)
    obs.observe_outputs(outs)
    producers, widen = find_producers(tracer.traced, component_spans(obs.raw, obs.outputs))
    return _Held(inputs, outs, obs, producers, widen)


def _run_backward(held: _Held, params: tuple[torch.nn.Parameter, ...]) -> ForwardPlan:
    """Gradients via ``torch.autograd.grad`` (no ``.grad`` is touched); returns the observed plan."""
    inputs, outs = held.inputs, held.outputs
    diff = [o for o in outs if o.requires_grad]
    wrt = [t for t in inputs if t.requires_grad] + list(params)
    grads: Sequence[torch.Tensor | None] = ()
    if diff and wrt:
        grads = torch.autograd.grad(diff, wrt, grad_outputs=[torch.ones_like(o) for o in diff], allow_unused=True)
    n_in = sum(t.requires_grad for t in inputs)
    in_grads = iter(grads[:n_in])
    input_grads = tuple(bool(t.requires_grad and next(in_grads) is not None) for t in inputs)
    params_used = tuple(g is not None for g in grads[n_in:]) if grads else tuple(False for _ in params)
    groups = held.observer.groups(held.widen)
    return ForwardPlan(
        inputs=tuple(TensorMeta.of(t) for t in inputs),
        outputs=tuple(TensorMeta.of(o) for o in outs),
        saved=groups.saved,
        components=groups.components,
        input_grads=input_grads,
        params_used=params_used,
        param_grad_bytes=sum(p.numel() * p.element_size() for p, u in zip(params, params_used) if u),
        producers=held.producers,
        output_places=groups.outputs,
    )


def ordered_warmup(
    modules: Mapping[tuple[int, int], Callable[..., object]],
    sample: SampleFn,
    steps: Sequence[WarmupStep],
    variant_hook: Callable[[int], None] = lambda cp_size: None,
    *,
    require_cuda: bool = True,
    on_step: Callable[[WarmupStep, int], None] | None = None,
) -> dict[tuple[int, int, int], ForwardPlan]:
    """Run ``steps`` (from :func:`warmup_steps`) eagerly on the current stream.

    ``modules[(chunk, layer)]`` is called on fresh copies of ``sample(cp_size, chunk, layer)`` at
    each forward step; ``variant_hook(cp_size)`` runs before every call. Each forward is held until
    its backward step, which takes the gradients and drops it. ``on_step(step, frames held)`` is
    called after each step. Raises :class:`WarmupError` when a callable saves or returns different
    tensors for different microbatches or iterations, or when a frame is never released.
    """
    params = {k: trainable_params(m) for k, m in modules.items()}
    external = {k: external_storages(m) for k, m in modules.items()}
    held: dict[tuple[int, int, int, int, int], _Held] = {}
    plans: dict[tuple[int, int, int], ForwardPlan] = {}
    first: dict[tuple[int, int, int], tuple[int, int]] = {}  # where each plan was first observed
    unstable: set[tuple[int, int, int]] = set()  # callables whose op calls differ between forwards
    for step in steps:
        v, c, l, m = step.frame
        key = (step.iteration, v, c, l, m)
        name = f"cp{v}/chunk{c}/layer{l}"
        variant_hook(v)
        if step.forward:
            if key in held:
                raise WarmupError(f"{name}: microbatch {m} of warmup iteration {step.iteration} ran forward twice")
            held[key] = _run_forward(modules[(c, l)], sample_inputs(sample, v, c, l, require_cuda), external[(c, l)],
                                     name, require_cuda)
        else:
            if key not in held:
                raise WarmupError(f"{name}: backward of microbatch {m} (iteration {step.iteration}) before its forward")
            plan = _run_backward(held.pop(key), params[(c, l)])
            ref = plans.setdefault((v, c, l), plan)
            first.setdefault((v, c, l), (step.iteration, m))
            if (v, c, l) in unstable or plan.producers != ref.producers:
                unstable.add((v, c, l))  # op calls vary between forwards: no direct writes for this callable
                ref = plans[(v, c, l)] = replace(ref, producers=())
                plan = replace(plan, producers=())
            if plan != ref:
                it0, m0 = first[(v, c, l)]
                raise WarmupError(
                    f"{name}: warmup iteration {step.iteration} microbatch {m} saved/returned different tensors "
                    f"than iteration {it0} microbatch {m0}; graphed callables must be deterministic in what they save"
                )
        if on_step is not None:
            on_step(step, len(held))
    if held:
        raise WarmupError(f"warmup left {len(held)} forward(s) without a backward, e.g. {sorted(held)[0]}; "
                          "the order must drain")
    return plans
