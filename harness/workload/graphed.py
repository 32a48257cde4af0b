"""Graph arms: capture this rank's layer blocks with the core (``harness.slotmem``) and replay them.

After ``graphs.warmup_steps`` eager steps, :func:`capture` builds the rank's slot plan (its PP/VPP
order over every microbatch count the case can reach, the arm's CP sizes), and captures every
graphable block (:class:`~harness.workload.model.GraphableBlock`, one per layer: the attention
block for scope ``attn``, the whole layer for ``full``) with ``capture_plan``: every CP variant in
ONE MemPool (``pools: shared``), or one capture and pool per CP size (``separate``, the sum
baseline). The core's variant hook points the blocks at each variant's CP process group, whose
communicators were created and warmed when the groups were built.

At run time :class:`LayerGraphs` replays a block's graphs by (the microbatch's CP size,
microbatch % physical slots). Invariants checked on every call: the CP size was captured; the
microbatch's CP group is the very group object captured for that size (a graph's collectives are
bound to the communicator it was captured on); the plan's counts include the step's count. It counts
the replays of every (CP size, physical slot) frame; :meth:`LayerGraphs.take_replays` hands a
step's counts to its record.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from harness.results import FrameReplays, GraphStats
from harness.spec.schema import GraphScope
from harness.workload.comm import GroupHandle
from harness.graphplan.layout import GraphLayout, rank_plans
from harness.workload.model import GraphableBlock, ModelChunk
from harness.workload.moe import moe_scalars
from harness.workload.static import static_layout


class LayerGraphs:
    """Replays captured blocks: ``call(chunk, layer, inputs, cp_size, microbatch, cp)``."""

    def __init__(self, graphs: Mapping[int, Any], handles: Mapping[int, Optional[GroupHandle]],
                 counts: Sequence[int], stats: GraphStats) -> None:
        self._graphs = dict(graphs)  # CP size -> the SlotGraphs holding its variant
        self._handles = dict(handles)
        self._counts = frozenset(counts)
        self.stats = stats
        self._replays: dict[tuple[int, int], int] = {}  # (CP size, slot) -> forward replays

    def check_step(self, microbatches: int) -> None:
        if microbatches not in self._counts:
            raise RuntimeError(
                f"this step has {microbatches} microbatches but the graphs were planned for "
                f"{sorted(self._counts)}; the slot ring may be too short for it")

    def call(self, chunk: int, layer: int, inputs: Sequence[torch.Tensor], cp_size: int,
             microbatch: int, cp: Optional[GroupHandle]) -> Any:
        if cp_size not in self._graphs:
            raise RuntimeError(f"no graphs for CP size {cp_size}; captured CP sizes {sorted(self._graphs)}")
        if cp is not self._handles[cp_size]:
            raise RuntimeError(
                f"microbatch {microbatch} runs CP size {cp_size} on group "
                f"{getattr(cp, 'ranks', None)}, but its graphs were captured on group "
                f"{getattr(self._handles[cp_size], 'ranks', None)}; a graph's collectives are "
                "bound to the communicator it was captured with")
        graphed = self._graphs[cp_size].layer(chunk, layer)
        frame = (cp_size, microbatch % self.stats.physical_slots)
        self._replays[frame] = self._replays.get(frame, 0) + 1
        return graphed(*inputs, cp_size=cp_size, microbatch=microbatch)

    def take_replays(self) -> tuple[FrameReplays, ...]:
        """The replays per (CP size, physical slot) since the last call, in that order."""
        out = tuple(FrameReplays(c, s, n) for (c, s), n in sorted(self._replays.items()))
        self._replays.clear()
        return out

    def close(self) -> None:
        for g in {id(g): g for g in self._graphs.values()}.values():
            g.close()


def sample_inputs(scope: GraphScope, cp_size: int, cp_rank: int, tokens: int, hidden: int,
                  max_seqs: int, experts: int, top_k: int, device: torch.device,
                  seed: int) -> tuple[torch.Tensor, ...]:
    """Capture-time inputs of ``scope``'s block for CP size ``cp_size``: one sequence filling the
    group's buffers (real metadata, so warmup runs real attention), hidden states drawn from a
    fixed generator."""
    layout = static_layout([cp_size * tokens], cp_size, cp_rank, tokens, max_seqs)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    h = (torch.randn(tokens, hidden, generator=g) * 0.02).to(device).requires_grad_()
    meta = tuple(t.to(device) for t in layout.metadata())
    if scope is GraphScope.ATTN:
        return (h, *meta)
    scalars = moe_scalars(layout.real_tokens * cp_size, layout.real_tokens * cp_size, experts, top_k)
    return (h, *meta, layout.valid.to(device), scalars.to(device))


def capture(
    chunks: Sequence[ModelChunk],
    layout: GraphLayout,
    handles: Mapping[int, Optional[GroupHandle]],
    cp_rank_of: Callable[[int], int],
    *,
    scope: GraphScope,
    separate: bool,
    tokens: int,
    hidden: int,
    max_seqs: int,
    experts: int,
    top_k: int,
    warmup_iters: int,
    seed: int,
    log: Callable[[str], None] = print,
) -> LayerGraphs:
    """Capture every block of this rank's ``chunks`` (see the module docstring)."""
    from harness.slotmem import capture_plan

    blocks: list[list[GraphableBlock]] = [[layer.block for layer in c.layers] for c in chunks]
    every = [b for chunk in blocks for b in chunk]
    # Fused wgrad accumulation: each block's graph adds its parameter gradients into the
    # parameter's own .grad (the training loop keeps those tensors for the whole arm: zero_grad
    # with set_to_none=False, in-place reduction and clipping), as eager AccumulateGrad would.
    for b in every:
        for p in b.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.main_grad = p.grad  # type: ignore[attr-defined]

    def point_at(cp_size: int) -> None:  # the core's variant hook: never replayed
        for b in every:
            b.cp = handles[cp_size]

    device = next(chunks[0].parameters()).device
    samples: dict[int, tuple[torch.Tensor, ...]] = {}

    def sample(cp_size: int, chunk: int, layer: int) -> tuple[torch.Tensor, ...]:
        if cp_size not in samples:
            samples[cp_size] = sample_inputs(scope, cp_size, cp_rank_of(cp_size), tokens, hidden,
                                             max_seqs, experts, top_k, device, seed)
        return samples[cp_size]

    t0 = time.perf_counter()
    captured: dict[int, Any] = {}
    plans = rank_plans(layout, separate)
    for plan in plans:
        g = capture_plan(blocks, sample, plan, num_warmup_iters=warmup_iters, variant_hook=point_at,
                         chain_layers=scope is GraphScope.FULL, fuse_wgrad_accumulation=True,
                         fused_grad_hooks=False, log=log)
        for c in plan.cp_sizes:
            captured[c] = g
    wall = time.perf_counter() - t0
    unique = list({id(g): g for g in captured.values()}.values())
    mems = [g.memory() for g in unique]
    st = [g.stats for g in unique]
    stats = GraphStats(
        summary="; ".join(s.summary for s in st),
        variants=len(layout.cp_sizes),
        physical_slots=max(p.physical_slots for p in plans),
        graphs=sum(s.graphs for s in st),
        pool_reserved_bytes=sum(m.pool_reserved for m in mems),
        pool_allocated_bytes=sum(m.pool_allocated for m in mems),
        arena_bytes=sum(m.backing for m in mems),
        largest_pool_bytes=max(m.pool_reserved for m in mems),
        pools=len(unique),
        capture_s=sum(s.capture_s for s in st),
        warmup_s=sum(s.warmup_s for s in st),
        capture_peak_bytes=max(s.peak_allocated_during_capture for s in st),
        warmup_peak_bytes=max(s.peak_allocated_during_warmup for s in st),
    )
    log(f"[graphs] captured {stats.graphs} graphs in {stats.pools} pool(s) in {wall:.1f}s: pool "
        f"{stats.pool_reserved_bytes / 2**20:.0f} MiB (largest {stats.largest_pool_bytes / 2**20:.0f} "
        f"MiB), arenas {stats.arena_bytes / 2**20:.0f} MiB")
    return LayerGraphs(captured, handles, layout.microbatch_counts, stats)
