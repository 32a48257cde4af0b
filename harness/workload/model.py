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

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from harness.spec.schema import GraphScope, ResolvedModel
from harness.workload.attention import Attention, AttentionContext
from harness.workload.comm import GroupHandle
from harness.workload.data import keyed_generator
from harness.workload.moe import MoE, MoEContext
from harness.workload.norm import RMSNorm

INIT_STD = 0.02

# A layer block's call: (block, (chunk, layer), inputs) -> its outputs. Eager arms call the block;
# graph arms replay its captured graph (harness.workload.graphed).
BlockRunner = Callable[["GraphableBlock", tuple[int, int], tuple[torch.Tensor, ...]], Any]


@dataclass(frozen=True)
class StaticContext:
    """Per-microbatch inputs of every layer on this rank in static-shape mode (device tensors)."""

    meta: tuple[torch.Tensor, ...]  # StaticLayout.metadata(): positions, call A, call B
    valid: torch.Tensor  # [T] bool
    moe_scalars: torch.Tensor  # [2] fp32 (moe.moe_scalars)
    cp: Optional[GroupHandle]  # the microbatch's CP group
    cp_size: int
    microbatch: int  # logical microbatch of the step (its graphs: microbatch % physical slots)
    scope: GraphScope
    run: BlockRunner
    aux_sink: list = field(default_factory=list)  # (T/N) * aux pieces of full-scope layers


@dataclass(frozen=True)
class LayerContext:
    attn: Optional[AttentionContext]
    moe: MoEContext
    static: Optional[StaticContext] = None


def _amp(device: torch.device, dtype: Optional[torch.dtype]) -> Any:
    # cache_enabled=False: a captured graph must cast the weights itself on every replay
    # (torch.cuda.make_graphed_callables' rule for autocast); eager static arms do the same.
    # On the meta device (the memory planner's stand-in for the GPU, harness.memplan) the planner
    # applies the device's autocast casts itself: torch has no autocast for meta tensors.
    if dtype is None or device.type == "meta":
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


class GraphableBlock(nn.Module):
    """A part of a decoder layer that a CUDA graph can capture: tensors in, tensors out, no host
    reads. ``cp`` is the CP group its attention all-gathers over (set per microbatch, or by the
    capture's variant hook); ``autocast`` the compute dtype of the case."""

    def __init__(self, autocast: Optional[torch.dtype]) -> None:
        super().__init__()
        self.autocast = autocast
        self.cp: Optional[GroupHandle] = None


class AttentionBlock(GraphableBlock):
    """``h -> h + attention(input_norm(h))`` over a static layout (Megatron's ``attn`` scope)."""

    def __init__(self, norm: RMSNorm, attn: Attention, autocast: Optional[torch.dtype]) -> None:
        super().__init__(autocast)
        self.norm, self.attn = norm, attn

    def forward(self, h: torch.Tensor, *meta: torch.Tensor) -> torch.Tensor:
        with _amp(h.device, self.autocast):
            return h + self.attn.forward_static(self.norm(h), meta, self.cp)


class FullLayerBlock(GraphableBlock):
    """The whole layer with static MoE (scope ``full``): ``(h, *meta, valid, moe_scalars) ->
    (h_out, aux piece)``."""

    def __init__(self, layer: "DecoderLayer", autocast: Optional[torch.dtype]) -> None:
        super().__init__(autocast)
        self.attn_block = AttentionBlock(layer.input_norm, layer.attn, autocast)
        self.norm, self.moe = layer.post_attn_norm, layer.moe

    def forward(self, h: torch.Tensor, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        *meta, valid, scalars = args
        self.attn_block.cp = self.cp
        h = self.attn_block(h, *meta)
        with _amp(h.device, self.autocast):
            y, piece = self.moe.forward_static(self.norm(h), valid, scalars, self.cp)
            return h + y, piece


class DecoderLayer(nn.Module):
    def __init__(self, m: ResolvedModel, ep_size: int = 1, ep_rank: int = 0) -> None:
        super().__init__()
        self.input_norm = RMSNorm(m.hidden, m.norm_eps)
        self.attn = Attention(m.hidden, m.heads, m.kv_heads, m.head_dim, m.rope_theta, m.norm_eps)
        self.post_attn_norm = RMSNorm(m.hidden, m.norm_eps)
        self.moe = MoE(
            m.hidden, m.experts, m.experts_per_token, m.moe_ffn, m.aux_loss_coeff, ep_size, ep_rank
        )
        self._block: Optional[GraphableBlock] = None  # static-shape mode (make_block)

    def make_block(self, scope: GraphScope, autocast: Optional[torch.dtype]) -> GraphableBlock:
        """The graphable part of this layer for ``scope``; kept outside the module tree (its
        parameters are this layer's, so state dicts and parameter lists do not change)."""
        block: GraphableBlock = (AttentionBlock(self.input_norm, self.attn, autocast)
                                 if scope is GraphScope.ATTN else FullLayerBlock(self, autocast))
        object.__setattr__(self, "_block", block)
        return block

    @property
    def block(self) -> GraphableBlock:
        if self._block is None:
            raise RuntimeError("static-shape mode: call make_block(scope, autocast) first")
        return self._block

    def forward(self, h: torch.Tensor, ctx: LayerContext, key: tuple[int, int] = (0, 0)) -> torch.Tensor:
        st = ctx.static
        if st is None:
            h = h + self.attn(self.input_norm(h), ctx.attn)
            return h + self.moe(self.post_attn_norm(h), ctx.moe)
        if st.scope is GraphScope.ATTN:
            h = st.run(self.block, key, (h, *st.meta))
            return h + self.moe(self.post_attn_norm(h), ctx.moe)  # eager MoE between graphs
        h, piece = st.run(self.block, key, (h, *st.meta, st.valid, st.moe_scalars))
        st.aux_sink.append(piece)
        return h


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
        index: int = 0,
    ) -> None:
        super().__init__()
        self.index = index  # this PP rank's chunk number (0-based)
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
        for i, layer in enumerate(self.layers):
            h = layer(h, ctx, (self.index, i))
        if self.head is not None:
            assert self.final_norm is not None
            h = self.head(self.final_norm(h))
        return h


@dataclass(frozen=True)
class ChunkLayout:
    """Which layers one virtual stage holds, and whether it is the first or the last."""

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
        out.append(ChunkLayout(range(v * per, (v + 1) * per), v == 0, v == stages - 1))
    return out


_WEIGHT_SALT = 0x51ED27


def _normal_(p: torch.Tensor, std: float, *key: int) -> None:
    with torch.no_grad():
        p.copy_(torch.randn(p.shape, generator=keyed_generator(_WEIGHT_SALT, *key), dtype=torch.float32) * std)


def _ones_(p: torch.Tensor) -> None:
    with torch.no_grad():
        p.fill_(1.0)


def init_threads() -> int:
    """Threads for the keyed initialisation: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def init_chunk(chunk: ModelChunk, m: ResolvedModel, seed: int, first_expert: int = 0,
               threads: int = 1) -> None:
    """Deterministic, layout-independent initialisation of every parameter of ``chunk``: each
    weight from its own keyed generator, the RMSNorm weights 1. Every parameter is written (a
    chunk built on the meta device and ``to_empty`` holds garbage until then): one left out is a
    ``RuntimeError`` naming it. ``threads`` > 1 runs the independent draws in that many threads
    (torch releases the GIL in them): the same bits in any order."""
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    done: set[int] = set()

    def normal(p: torch.Tensor, std: float, *key: int, whole: Optional[nn.Parameter] = None) -> None:
        jobs.append((_normal_, (p, std, *key)))
        done.add(id(whole if whole is not None else p))

    if chunk.embed is not None:
        normal(chunk.embed.weight, 1.0, seed, -1, 0)
    if chunk.head is not None:
        normal(chunk.head.weight, INIT_STD, seed, -2, 0)
    out_std = INIT_STD / (2.0 * m.layers) ** 0.5
    for layer_id, layer in zip(chunk.layer_ids, chunk.layers):
        a = layer.attn
        normal(a.q_proj.weight, INIT_STD, seed, layer_id, 1)
        normal(a.k_proj.weight, INIT_STD, seed, layer_id, 2)
        normal(a.v_proj.weight, INIT_STD, seed, layer_id, 3)
        normal(a.o_proj.weight, out_std, seed, layer_id, 4)
        normal(layer.moe.router.weight, INIT_STD, seed, layer_id, 5)
        ex = layer.moe.experts
        for j in range(ex.gate.shape[0]):
            e = first_expert + j
            normal(ex.gate[j], INIT_STD, seed, layer_id, 100 + 3 * e, whole=ex.gate)
            normal(ex.up[j], INIT_STD, seed, layer_id, 101 + 3 * e, whole=ex.up)
            normal(ex.down[j], out_std, seed, layer_id, 102 + 3 * e, whole=ex.down)
    for module in chunk.modules():
        if isinstance(module, RMSNorm):
            jobs.append((_ones_, (module.weight,)))
            done.add(id(module.weight))
    left = [name for name, p in chunk.named_parameters() if id(p) not in done]
    if left:
        raise RuntimeError(f"init_chunk leaves parameter(s) {left} uninitialised: give each one "
                           "its keyed draw (or a constant) in harness.workload.model.init_chunk")
    if threads > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for f in [pool.submit(fn, *args) for fn, args in jobs]:
                f.result()
    else:
        for fn, args in jobs:
            fn(*args)


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
    for index, lay in enumerate(chunk_layouts(m.layers, pp, vpp, pp_rank)):
        chunk = build_chunk(m, seed, lay, index, ep_size, ep_rank)
        chunks.append(chunk.to(device) if device is not None else chunk)
    return chunks


def build_chunk(m: ResolvedModel, seed: int, lay: ChunkLayout, index: int, ep_size: int = 1,
                ep_rank: int = 0) -> ModelChunk:
    """Chunk ``index`` of a PP rank (``chunk_layouts``), initialised, on the CPU. Built on the meta
    device and then given CPU storage, so no default initialisation runs only to be overwritten
    (about 40 % of the build of a billion-parameter chunk); ``init_chunk`` writes every weight."""
    with torch.device("meta"):
        chunk = ModelChunk(m, lay.layers, lay.first, lay.last, ep_size, ep_rank, index)
    chunk.to_empty(device="cpu")
    init_chunk(chunk, m, seed, first_expert=ep_rank * (m.experts // ep_size), threads=init_threads())
    return chunk


def is_expert_param(name: str) -> bool:
    """Expert weights are sharded over EP (their grads reduce over expert-DP, not all of DP x CP)."""
    return ".experts." in name or name.startswith("experts.")
