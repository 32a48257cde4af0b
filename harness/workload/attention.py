"""GQA self-attention with QK-norm and RoPE over packed variable-length sequences.

A rank holds ``T`` query tokens (its CP shard of a packed microbatch). Keys/values of the whole CP
group are all-gathered (``T * cp`` rows, in CP-rank order) and an explicit boolean mask keeps the
attention exact: a query sees a key iff both belong to the same packed sequence and the key's
position is not after the query's. With ``cp == 1`` the same code is plain packed causal attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from harness.workload.comm import GroupHandle, all_gather_rows
from harness.workload.norm import RMSNorm


@dataclass(frozen=True)
class AttentionContext:
    """Per-microbatch inputs of every attention layer on this rank."""

    positions: torch.Tensor  # [T] int64, position of each local token within its sequence
    mask: torch.Tensor  # [T, T * cp] bool, True where the query may attend the key
    cp: Optional[GroupHandle]  # the microbatch's CP group (None or size 1: no CP)


def packed_causal_mask(
    q_segments: torch.Tensor,
    q_positions: torch.Tensor,
    k_segments: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """``[Tq, Tk]`` mask: same sequence and key position <= query position."""
    same = q_segments[:, None] == k_segments[None, :]
    causal = k_positions[None, :] <= q_positions[:, None]
    return same & causal


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` ``[T, heads, head_dim]`` at ``positions``."""
    dim = x.shape[-1]
    half = dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, half]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1)[:, None, :]
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float, eps: float
    ) -> None:
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, rope_theta
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        q = rope(q, ctx.positions, self.theta)
        k = rope(k, ctx.positions, self.theta)
        k = all_gather_rows(k, ctx.cp)
        v = all_gather_rows(v, ctx.cp)
        if ctx.mask.shape != (t, k.shape[0]):
            raise ValueError(
                f"attention mask has shape {tuple(ctx.mask.shape)}, expected {(t, k.shape[0])}"
            )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=ctx.mask,
            enable_gqa=self.heads != self.kv_heads,
        )  # [1, H, T, D]
        return self.o_proj(out.squeeze(0).transpose(0, 1).reshape(t, self.heads * self.head_dim))
