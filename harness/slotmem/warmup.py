"""Eager warmup on the capture stream: initialise libraries and observe each forward's plan."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .arenas import ForwardPlan, TensorMeta
from .saved import SaveObserver


class WarmupError(RuntimeError):
    """The callable does something capture cannot handle, or behaves differently between warmups."""


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
    """Storage pointers of the callable's parameters and buffers (saved as they are)."""
    if not isinstance(module, torch.nn.Module):
        return set()
    out = {p.untyped_storage().data_ptr() for p in module.parameters()}
    out |= {b.untyped_storage().data_ptr() for b in module.buffers()}
    return out


def check_output(t: torch.Tensor, name: str) -> None:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        raise WarmupError(f"{name}: tensor subclass outputs ({type(t).__name__}) cannot be graphed")
    if not t.is_cuda:
        raise WarmupError(f"{name}: output on {t.device}; graphed callables must return CUDA tensors")


def observe(
    name: str,
    module: Callable[..., object],
    sample: Sequence[torch.Tensor],
    iters: int,
) -> ForwardPlan:
    """Run forward+backward ``iters`` times on the current stream and return the observed plan.

    Gradients are taken with ``torch.autograd.grad`` so no ``.grad`` is touched; every output is
    released before the next iteration. The plan must be identical across iterations.
    """
    if iters < 1:
        raise WarmupError("num_warmup_iters must be >= 1 (cuBLAS and autograd need a warm backward before capture)")
    params = trainable_params(module)
    external = external_storages(module)
    plan: ForwardPlan | None = None
    for it in range(iters):
        inputs = tuple(s.detach().clone().requires_grad_(s.requires_grad) for s in sample)
        obs = SaveObserver(external, inputs)
        with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack):
            outs = as_tuple(module(*inputs))
        for o in outs:
            check_output(o, name)
        diff = [o for o in outs if o.requires_grad]
        wrt = [t for t in inputs if t.requires_grad] + list(params)
        grads: Sequence[torch.Tensor | None] = ()
        if diff and wrt:
            grads = torch.autograd.grad(
                diff, wrt, grad_outputs=[torch.ones_like(o) for o in diff], allow_unused=True
            )
        n_in = sum(t.requires_grad for t in inputs)
        in_grads = iter(grads[:n_in])
        input_grads = tuple(bool(t.requires_grad and next(in_grads) is not None) for t in inputs)
        params_used = tuple(g is not None for g in grads[n_in:]) if grads else tuple(False for _ in params)
        param_bytes = sum(p.numel() * p.element_size() for p, u in zip(params, params_used) if u)
        saved, components = obs.plan()
        this = ForwardPlan(
            inputs=tuple(TensorMeta.of(t) for t in inputs),
            outputs=tuple(TensorMeta.of(o) for o in outs),
            saved=saved,
            components=components,
            input_grads=input_grads,
            params_used=params_used,
            param_grad_bytes=param_bytes,
        )
        if plan is not None and this != plan:
            raise WarmupError(f"{name}: warmup iteration {it} saved/returned different tensors than iteration 0; "
                              "graphed callables must be deterministic in what they save")
        plan = this
        del outs, diff, grads, inputs, obs
    assert plan is not None
    return plan

