"""Optimizer construction (Megatron's weight-decay split), the learning-rate schedule, gradient
reduction over DP x CP / expert-DP, global norm and clipping."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from harness.spec.schema import LrDecay, OptimizerName, TrainSpec
from harness.workload.comm import GroupHandle, all_reduce_


def decays(param: torch.nn.Parameter) -> bool:
    """Megatron's rule (``no_weight_decay_cond`` unset): biases and 1-D parameters (the norms'
    weights) do not decay; every matrix does, the embedding, the head, the router and the stacked
    expert weights included."""
    return param.dim() > 1


def make_optimizer(params: Iterable[torch.nn.Parameter], train: TrainSpec) -> torch.optim.Optimizer:
    """Adam / AdamW over ``params`` in two groups: those that decay (:func:`decays`) with
    ``train.optimizer.weight_decay``, the others with none."""
    o = train.optimizer
    cls = torch.optim.AdamW if o.name is OptimizerName.ADAMW else torch.optim.Adam
    params = list(params)
    groups = [{"params": [p for p in params if decays(p)], "weight_decay": o.weight_decay},
              {"params": [p for p in params if not decays(p)], "weight_decay": 0.0}]
    return cls([g for g in groups if g["params"]], lr=train.lr, betas=(o.beta1, o.beta2),
               eps=o.eps, foreach=False)


def scheduled_lr(train: TrainSpec, step: int) -> float:
    """The learning rate of step ``step`` (1-based): Megatron's ``OptimizerParamScheduler.get_lr``
    after ``step - 1`` steps, with ``lr_decay_iters`` = ``train.steps``."""
    sched, max_lr = train.lr_schedule, train.lr
    done, warmup = step - 1, sched.warmup_steps
    if warmup > 0 and done <= warmup:
        return max_lr * float(done) / float(warmup)
    if sched.decay is LrDecay.CONSTANT:
        return max_lr
    if done > train.steps:
        return sched.min_lr
    ratio = float(done - warmup) / float(train.steps - warmup)
    coeff = 1.0 - ratio if sched.decay is LrDecay.LINEAR else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return sched.min_lr + coeff * (max_lr - sched.min_lr)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


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
