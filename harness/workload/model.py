"""The Qwen3-MoE-shaped decoder, built as model chunks of pure layers.

The model is a list of *virtual stages* (Megatron's interleaved layout): with ``pp`` stages and
``vpp`` chunks per stage, virtual stage ``v = chunk * pp + pp_rank`` holds layers
``[v * L/(pp*vpp), (v + 1) * L/(pp*vpp))``; virtual stage 0 also holds the embedding, the last one
the final norm and the LM head (untied, as Qwen3-30B-A3B). A layer's output depends only on its
input and the per-microbatch :class:`LayerContext` (positions, masks, CP/EP groups), so the same
layer runs unchanged on one rank or under PP/CP/EP/DP.

Parameters are initialised from generators keyed by (seed, global layer, parameter, expert), so
every layout of a case starts from bit-identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from harness.spec.schema import ResolvedModel
from harness.workload.attention import Attention, AttentionContext
from harness.workload.data import keyed_generator
from harness.workload.moe import MoE, MoEContext
from harness.workload.norm import RMSNorm

INIT_STD = 0.02


@dataclass(frozen=True)
class LayerContext:
    attn: AttentionContext
    moe: MoEContext


class DecoderLayer(nn.Module):
    def __init__(self, m: ResolvedModel, ep_size: int = 1, ep_rank: int = 0) -> None:
        super().__init__()
        self.input_norm = RMSNorm(m.hidden, m.norm_eps)
        self.attn = Attention(m.hidden, m.heads, m.kv_heads, m.head_dim, m.rope_theta, m.norm_eps)
        self.post_attn_norm = RMSNorm(m.hidden, m.norm_eps)
        self.moe = MoE(
            m.hidden, m.experts, m.experts_per_token, m.moe_ffn, m.aux_loss_coeff, ep_size, ep_rank
        )

    def forward(self, h: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), ctx.attn)
        return h + self.moe(self.post_attn_norm(h), ctx.moe)


class ModelChunk(nn.Module):
    """One virtual stage: optional embedding, a run of layers, optional final norm + LM head."""

    def __init__(
        self,
        m: ResolvedModel,
        layer_ids: range,
        first: bool,
        last: bool,
        ep_size: int = 1,
        ep_rank: int = 0,
    ) -> None:
        super().__init__()
        self.layer_ids = layer_ids
        self.first, self.last = first, last
        self.embed = nn.Embedding(m.vocab, m.hidden) if first else None
        self.layers = nn.ModuleList(DecoderLayer(m, ep_size, ep_rank) for _ in layer_ids)
        self.final_norm = RMSNorm(m.hidden, m.norm_eps) if last else None
        self.head = nn.Linear(m.hidden, m.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x``: token ids ``[T]`` on the first chunk, else hidden ``[T, H]``. Returns hidden,
        or logits ``[T, vocab]`` on the last chunk."""
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers:
            h = layer(h, ctx)
        if self.head is not None:
            assert self.final_norm is not None
            h = self.head(self.final_norm(h))
        return h


@dataclass(frozen=True)
class ChunkLayout:
    """Which layers virtual stage ``virtual`` holds."""

    virtual: int
    layers: range
    first: bool
    last: bool


def chunk_layouts(layers: int, pp: int, vpp: int, pp_rank: int) -> list[ChunkLayout]:
    """The ``vpp`` chunks of PP rank ``pp_rank`` (chunk ``c`` is virtual stage ``c*pp + pp_rank``)."""
    stages = pp * vpp
    if layers % stages:
        raise ValueError(f"model.layers ({layers}) must be divisible by pp*vpp ({stages})")
    per = layers // stages
    out = []
    for c in range(vpp):
        v = c * pp + pp_rank
        out.append(ChunkLayout(v, range(v * per, (v + 1) * per), v == 0, v == stages - 1))
    return out


_WEIGHT_SALT = 0x51ED27


def _normal_(p: torch.Tensor, std: float, *key: int) -> None:
    with torch.no_grad():
        p.copy_(torch.randn(p.shape, generator=keyed_generator(_WEIGHT_SALT, *key), dtype=torch.float32) * std)


def init_chunk(chunk: ModelChunk, m: ResolvedModel, seed: int, first_expert: int = 0) -> None:
    """Deterministic, layout-independent initialisation of every parameter of ``chunk``."""
    if chunk.embed is not None:
        _normal_(chunk.embed.weight, 1.0, seed, -1, 0)
    if chunk.head is not None:
        _normal_(chunk.head.weight, INIT_STD, seed, -2, 0)
    out_std = INIT_STD / (2.0 * m.layers) ** 0.5
    for layer_id, layer in zip(chunk.layer_ids, chunk.layers):
        a = layer.attn
        _normal_(a.q_proj.weight, INIT_STD, seed, layer_id, 1)
        _normal_(a.k_proj.weight, INIT_STD, seed, layer_id, 2)
        _normal_(a.v_proj.weight, INIT_STD, seed, layer_id, 3)
        _normal_(a.o_proj.weight, out_std, seed, layer_id, 4)
        _normal_(layer.moe.router.weight, INIT_STD, seed, layer_id, 5)
        ex = layer.moe.experts
        for j in range(ex.gate.shape[0]):
            e = first_expert + j
            _normal_(ex.gate[j], INIT_STD, seed, layer_id, 100 + 3 * e)
            _normal_(ex.up[j], INIT_STD, seed, layer_id, 101 + 3 * e)
            _normal_(ex.down[j], out_std, seed, layer_id, 102 + 3 * e)


def build_chunks(
    m: ResolvedModel,
    seed: int,
    pp: int = 1,
    vpp: int = 1,
    pp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    device: Optional[torch.device] = None,
) -> list[ModelChunk]:
    """This PP rank's model chunks, initialised, on ``device``."""
    chunks = []
    for lay in chunk_layouts(m.layers, pp, vpp, pp_rank):
        chunk = ModelChunk(m, lay.layers, lay.first, lay.last, ep_size, ep_rank)
        init_chunk(chunk, m, seed, first_expert=ep_rank * (m.experts // ep_size))
        chunks.append(chunk.to(device) if device is not None else chunk)
    return chunks


def is_expert_param(name: str) -> bool:
    """Expert weights are sharded over EP (their grads reduce over expert-DP, not all of DP x CP)."""
    return ".experts." in name or name.startswith("experts.")
