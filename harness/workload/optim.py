"""Optimizer construction, gradient reduction over DP x CP / expert-DP, global norm and clipping."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from harness.spec.schema import OptimizerName, TrainSpec
from harness.workload.comm import GroupHandle, all_reduce_


def make_optimizer(params: Iterable[torch.nn.Parameter], train: TrainSpec) -> torch.optim.Optimizer:
    o = train.optimizer
    cls = torch.optim.AdamW if o.name is OptimizerName.ADAMW else torch.optim.Adam
    return cls(
        list(params), lr=train.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
        foreach=False,
    )


def _grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    out = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        out.append(p.grad)
    return out


def all_reduce_grads(params: list[torch.nn.Parameter], handle: GroupHandle) -> None:
    """Sum the gradients of ``params`` over ``handle`` (one flat bucket)."""
    if not params or not handle.active:
        _grads(params)
        return
    grads = _grads(params)
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_(flat, handle)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def global_grad_norm(
    dense: list[torch.nn.Parameter],
    expert: list[torch.nn.Parameter],
    count_dense: bool,
    count_expert: bool,
    world: GroupHandle,
    device: torch.device,
) -> float:
    """L2 norm over every parameter of the model, each counted once across all ranks."""
    sq = torch.zeros(1, dtype=torch.float64, device=device)
    if count_dense:
        for p in dense:
            sq += p.grad.detach().double().pow(2).sum()
    if count_expert:
        for p in expert:
            sq += p.grad.detach().double().pow(2).sum()
    all_reduce_(sq, world)
    return math.sqrt(float(sq)) if math.isfinite(float(sq)) else float("nan")


def clip_grads_(params: list[torch.nn.Parameter], norm: float, max_norm: float) -> None:
    """Scale gradients so the global norm is at most ``max_norm`` (torch's clip_grad_norm_ rule)."""
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
