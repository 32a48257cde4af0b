"""Top-k MoE: softmax router, Megatron-style load-balancing loss, dropless SwiGLU experts.

Experts may be sharded over an expert-parallel (EP) group: EP rank ``j`` owns the contiguous experts
``[j * E/ep, (j + 1) * E/ep)`` and tokens travel there and back by all-to-all (``ep.py``).

Load-balancing (aux) loss, per *unit* (one CP group's share of a microbatch, i.e. the tokens that one
Megatron microbatch on one DP rank routes): ``E / (T^2 k) * sum_e P_e * n_e`` with ``T`` the unit's
real tokens, ``P_e`` the summed router probability of expert ``e`` and ``n_e`` the tokens routed to
it (both over the whole unit: ``n_e`` is all-reduced over the CP group, ``P_e`` stays local so the
CP ranks' pieces sum to the unit's loss). A perfectly balanced router gives 1. The training objective
adds ``aux_loss_coeff * (T / N) * aux`` per unit and layer (``N`` = real tokens of the step), whose
gradient is injected in backward as Megatron's ``MoEAuxLossAutoScaler`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from harness.workload.comm import GroupHandle, all_reduce_sum_
from harness.workload.ep import dispatch_and_compute, grouped_dispatch


@dataclass(frozen=True)
class MoEContext:
    """Per-microbatch inputs of every MoE layer on this rank."""

    valid: torch.Tensor  # [T] bool: real (not padding) tokens
    unit_tokens: int  # real tokens of this rank's unit (its CP group's share of the microbatch)
    step_tokens: int  # real tokens of the whole step (all microbatches, all ranks)
    cp: Optional[GroupHandle]  # group over which the unit is sharded (expert counts are summed)
    ep: Optional[GroupHandle]  # expert-parallel group (None: all experts local)
    # Detached aux-loss pieces, (T/N) * aux_local per layer call, collected for reporting.
    aux_sink: list = field(default_factory=list)
    # A static-shape microbatch: without EP the experts run as grouped GEMMs over device-side
    # offsets (``ep.grouped_dispatch``, no host read); with EP the tokens outside ``valid`` (buffer
    # padding) are not dispatched (``ep.dispatch_and_compute``).
    static_shapes: bool = False


class _AuxLossScaler(torch.autograd.Function):
    """As :class:`_AuxLossInjector` with the scale in a device tensor (static shapes: the scale
    changes per microbatch, so a captured graph reads it from a buffer)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, aux: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(scale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        (scale,) = ctx.saved_tensors
        return grad, scale.to(torch.float32).reshape(()), None


class _AuxLossInjector(torch.autograd.Function):
    """Identity on ``x``; in backward gives ``aux`` the gradient ``scale`` (MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        ctx.aux_shape = aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        return grad, torch.full(ctx.aux_shape, ctx.scale, dtype=torch.float32, device=grad.device), None


class Experts(nn.Module):
    """``local`` SwiGLU experts stored as stacked weights."""

    def __init__(self, local: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.empty(local, hidden, ffn))
        self.up = nn.Parameter(torch.empty(local, hidden, ffn))
        self.down = nn.Parameter(torch.empty(local, ffn, hidden))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``x`` rows grouped by local expert (``counts[e]`` rows for expert ``e``).

        Each stacked weight is cast once (to autocast's dtype when it is on, as the matmuls would
        cast it) and unbound: the backward stacks the experts' gradients into one tensor, where
        indexing ``w[e]`` would give every expert a zero-filled gradient of the whole stack."""
        dev = x.device.type
        wdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        gate, up, down = (w.to(wdt).unbind(0) for w in (self.gate, self.up, self.down))
        outs = []
        for e, rows in enumerate(torch.split(x, counts, dim=0)):
            h = F.silu(rows @ gate[e]) * (rows @ up[e])
            outs.append(h @ down[e])
        return torch.cat(outs, dim=0) if outs else x[:0]


class MoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        experts: int,
        top_k: int,
        ffn: int,
        aux_loss_coeff: float,
        ep_size: int = 1,
        ep_rank: int = 0,
    ) -> None:
        super().__init__()
        if experts % ep_size:
            raise ValueError(f"experts ({experts}) must be divisible by the EP size ({ep_size})")
        if not 1 <= top_k <= experts:
            raise ValueError(f"experts_per_token ({top_k}) must be in [1, experts={experts}]")
        self.num_experts, self.top_k, self.coeff = experts, top_k, aux_loss_coeff
        self.local_experts = experts // ep_size
        self.first_expert = ep_rank * self.local_experts
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(self.local_experts, hidden, ffn)

    def forward(self, x: torch.Tensor, ctx: MoEContext) -> torch.Tensor:
        e, k = self.num_experts, self.top_k
        logits = F.linear(x.float(), self.router.weight.float())
        probs = torch.softmax(logits, dim=-1)  # [T, E] fp32
        top_p, top_i = probs.topk(k, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True)

        valid = ctx.valid.to(probs.dtype)[:, None]
        # one_hot + sum rather than index_add_: deterministic on every device.
        counts = (F.one_hot(top_i, e).to(torch.float32) * valid[:, :, None]).sum(dim=(0, 1))
        all_reduce_sum_(counts, ctx.cp)
        prob_sum = (probs * valid).sum(dim=0)
        unit = max(ctx.unit_tokens, 1)
        aux_local = (prob_sum * counts).sum() * (e / (unit * unit * k))
        weight = ctx.unit_tokens / ctx.step_tokens
        ctx.aux_sink.append(aux_local.detach() * weight)

        if ctx.static_shapes and (ctx.ep is None or not ctx.ep.active):
            y = grouped_dispatch(x, top_i, weights.to(x.dtype), self.experts, e)
        else:
            y = dispatch_and_compute(x, top_i, weights.to(x.dtype), self.experts, e, ctx.ep,
                                     ctx.valid if ctx.static_shapes else None)
        if self.coeff > 0 and torch.is_grad_enabled():
            y = _AuxLossInjector.apply(y, aux_local, self.coeff * weight)
        return y

    def forward_static(self, x: torch.Tensor, valid: torch.Tensor, scalars: torch.Tensor,
                       cp: Optional[GroupHandle]) -> tuple[torch.Tensor, torch.Tensor]:
        """The MoE block with static shapes and no host reads (capturable; experts local):
        ``valid`` ``[T]`` bool, ``scalars`` ``[2]`` fp32 = (``E / (T_unit^2 k)``, ``T_unit / N``)
        of the microbatch (:func:`moe_scalars`). Returns ``(y, aux piece)``, the aux piece being
        ``(T_unit/N) * aux_local`` (what the eager path appends to its sink)."""
        e, k = self.num_experts, self.top_k
        logits = F.linear(x.float(), self.router.weight.float())
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True)
        vf = valid.to(probs.dtype)[:, None]
        experts = torch.arange(e, device=x.device)
        hits = (top_i[:, :, None] == experts).to(torch.float32)  # one-hot, no host sync
        counts = (hits * vf[:, :, None]).sum(dim=(0, 1))
        all_reduce_sum_(counts, cp)
        prob_sum = (probs * vf).sum(dim=0)
        aux_local = (prob_sum * counts).sum() * scalars[0]
        piece = aux_local.detach() * scalars[1]
        y = grouped_dispatch(x, top_i, weights.to(x.dtype), self.experts, e)
        if self.coeff > 0 and torch.is_grad_enabled():
            y = _AuxLossScaler.apply(y, aux_local, scalars[1:2] * self.coeff)
        return y, piece


def moe_scalars(unit_tokens: int, step_tokens: int, experts: int, top_k: int) -> torch.Tensor:
    """The per-microbatch scalars of :meth:`MoE.forward_static` (host tensor, fp32)."""
    unit = max(unit_tokens, 1)
    return torch.tensor([experts / (unit * unit * top_k), unit_tokens / step_tokens],
                        dtype=torch.float32)
