"""The memory plan of a case (:func:`predict_case`): per PP rank and CP size, from the case file
alone, on the CPU.

What each figure is and where it comes from:

* **weights, gradients, optimizer state**: the rank's parameters counted on the workload's model
  built on meta (:mod:`.params`), fp32 weights (the model trains in fp32 under autocast), fp32
  gradients (kept for the whole arm), Adam's two fp32 moments;
* **one block forward** (:mod:`.blocks`): the graphed block's forward and backward on meta
  tensors of the case's shapes through the capture's own warmup, saved-tensor hooks and producer
  tracing: the capture's ``ForwardPlan`` per CP size;
* **arenas**: ``slotmem.arenas.plan_arenas`` over those plans with the rank's slot plan (its
  liveness colours): the backing allocation capture makes, byte for byte;
* **graph pool**: the caching allocator's segments (:mod:`.cachesim`) after the backing and every
  graph's own allocations in the capture's order (:func:`pool_bytes`: what the ops return, as
  the capture keeps or writes them, and the kernels' own buffers, :mod:`.kernels`; in scope
  ``full`` the static MoE's grouped GEMMs run as on the GPU, ``torch._grouped_mm`` on bf16 rows); shared: one
  plan over every CP size; separate: the sum of one plan per CP size;
* **expected peak**: static bytes plus the larger of the optimizer step's transient
  (:func:`step_transient_bytes`, over the graph pool in the graph arm) and what the rank holds for
  backwards at its fullest moment of the interleaved order (:mod:`.schedule`): in the eager arms every layer-microbatch's attention
  block (its frame, as measured above) and eager MoE (:func:`eager_moe_bytes`, from the shapes),
  in the graph arm the graph pool plus the eager MoE parts; on the last stage its last chunk's
  microbatches also hold the head's bf16 weight copy and the fp32 log-softmax of the logits, and
  its loss's logits (low precision and their fp32 copy) live beside them.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from harness.graphplan.layout import case_graph_layout, pipeline_plans
from harness.memplan.megatron import megatron_estimate
from harness.memplan.records import CaseMemory, MemoryTarget, RankMemory, VariantMemory
from harness.memplan.schedule import held_in_flight
from harness.slotmem import build_slot_map
from harness.spec.schema import Case, GraphScope

class MemoryPlanError(ValueError):
    """The case cannot be planned (no static-shape blocks, or a target this torch cannot stand in for)."""


def pool_bytes(plan, backing: int, blocks) -> int:  # noqa: ANN001 - a SlotPlan, {cp: BlockMemory}
    """The pool one capture of ``plan`` reserves: the caching allocator (:mod:`.cachesim`) given
    the backing allocation, then each graph's allocations and frees (:class:`~.blocks.PoolEvents`)
    in the capture's order (``slotmem.capture_steps``: every (direction, chunk, slot, layer), its
    CP variants in lockstep). Every graph of one direction and CP size makes the same requests, so
    a graph is replayed only while the segments it starts from are new to it."""
    from harness.memplan.cachesim import PoolSim
    from harness.slotmem.protocol import capture_steps

    sim = PoolSim()
    sim.alloc("backing", backing)
    smap = build_slot_map(plan.records, plan.layers_per_chunk)
    seen: set[tuple[bool, int, int]] = set()
    for step in capture_steps(plan.order, smap):
        for c in smap.variants:
            state = (step.forward, c, len(sim.segments))
            if state in seen:
                continue
            seen.add(state)
            b = blocks[c]
            for ev in (b.forward_events if step.forward else b.backward_events):
                if ev[0] == "a":
                    sim.alloc((state, ev[1]), ev[2])
                else:
                    sim.free((state, ev[1]))
    return sim.reserved


def eager_moe_bytes(case: Case, dtype_bytes: int = 2) -> int:
    """What one eager MoE layer (with its norm) keeps for its backward per microbatch, from the
    shapes of ``harness.workload.moe`` / ``ep``, tokens routed evenly (``T * k`` rows on this
    rank's experts, as the loopback's all-to-all and a balanced router give): the norm's fp32
    input and output, the router's probabilities, the top-k indices and weights, the sort and
    regroup indices, the low-precision copies of the rank's stacked expert weights (cast once per
    microbatch and saved by every expert's products), per routed row the two input casts and four
    ``[F]`` activations, and the unsorted ``[T, k, H]`` expert outputs."""
    m, t = case.model, case.layout.tokens_per_rank
    h, f, e, k = m.hidden, m.moe_ffn, m.experts, m.experts_per_token
    local = e // case.layout.ep
    rows = t * k
    norm = 2 * t * h * 4 + t * 4
    router = t * e * 4 + t * k * (8 + 4 + dtype_bytes) + t * 4
    indices = 3 * rows * 8
    weights = 3 * local * h * f * dtype_bytes
    experts = rows * (2 * h * dtype_bytes + 4 * f * dtype_bytes)
    combine = rows * h * dtype_bytes
    return norm + router + indices + weights + experts + combine


def head_bytes(case: Case, dtype_bytes: int = 2) -> int:
    """What the last chunk's final norm, head and loss keep per microbatch: the norm's fp32
    tensors, the head's low-precision weight copy and input, the fp32 log-softmax of the logits."""
    m, t = case.model, case.layout.tokens_per_rank
    return 2 * t * m.hidden * 4 + m.vocab * m.hidden * dtype_bytes + t * m.hidden * dtype_bytes + t * m.vocab * 4


def step_transient_bytes(largest: int, dense: int) -> int:
    """The most the optimizer step adds for a moment, after the backward freed the activations
    (``harness.workload.optim``): the gradient norm's fp64 copy and square of the largest
    parameter's gradient (16 bytes an element), or the flat fp32 bucket of the dense gradients
    that the data-parallel reduction builds; Adam's per-parameter temporaries (8 bytes an element
    of the largest) are below the first."""
    return max(16 * largest, 4 * dense)


def _static(case: Case, params: int) -> tuple[int, int, int]:
    return params * 4, params * 4, params * 8


def predict_case(case: Case, target: MemoryTarget = MemoryTarget(),
                 pp_ranks: Optional[Sequence[int]] = None) -> CaseMemory:
    """The memory plan of ``case`` for every PP rank (or ``pp_ranks``) on ``target``."""
    from harness.memplan.blocks import block_memory
    from harness.memplan.params import rank_params
    from harness.slotmem.arenas import dense_bytes, frame_layout, plan_arenas

    t0 = time.perf_counter()
    scope = case.static_scope
    if scope is None:
        raise MemoryPlanError(f"case {case.id}: the memory plan covers static-shape cases (a graphs: or "
                              "shapes: {mode: static} section); this case runs dynamic shapes")
    if case.train.dtype.value == "fp32":
        raise MemoryPlanError(f"case {case.id}: the memory plan follows the GPU's flash path, which "
                              "runs in bf16; an fp32 case attends on the host path that no graph "
                              "captures (set train.dtype: bf16)")
    _check_target(target)
    lay = case.layout
    blocks = block_memory(case, lay.cp_sizes, target.varlen_native_gqa)
    dtype_bytes = 2 if case.train.dtype.value != "fp32" else 4
    moe = eager_moe_bytes(case, dtype_bytes) if scope is GraphScope.ATTN else 0
    head = head_bytes(case, dtype_bytes)
    graphed = case.graphs is not None
    meg = megatron_estimate(hidden=case.model.hidden, heads=case.model.heads, kv_heads=case.model.kv_heads,
                            head_dim=case.model.head_dim, layers=case.model.layers,
                            experts=case.model.experts, moe_ffn=case.model.moe_ffn, vocab=case.model.vocab,
                            seq_length=case.train.seq_length, pp=lay.pp, vpp=lay.vpp, ep=lay.ep)
    shared_all = pipeline_plans(case_graph_layout(case, 0), separate=False)[0]
    separate_all = pipeline_plans(case_graph_layout(case, 0), separate=True)
    out = []
    for r in (range(lay.pp) if pp_ranks is None else pp_ranks):
        glay = case_graph_layout(case, r)

        def arenas_of(plan) -> int:  # noqa: ANN001 - a SlotPlan
            smap = build_slot_map(plan.records, plan.layers_per_chunk)
            plans = {(v, c, l): blocks[v].plan for v in plan.cp_sizes
                     for c, n in enumerate(plan.layers_per_chunk) for l in range(n)}
            layout = plan_arenas(plans, smap.layers, smap.variants, smap.saved_colour, smap.grad_colour,
                                 scope is GraphScope.FULL, {k: 0 for k in plans})
            return layout.backing.nbytes

        def pool_of(plan, backing: int) -> int:  # noqa: ANN001
            return pool_bytes(plan, backing, blocks)

        shared = shared_all.ranks[r]
        separate = [p.ranks[r] for p in separate_all]
        arena = arenas_of(shared)
        variants = []
        sep_pools = 0
        for plan in separate:
            c = plan.cp_sizes[0]
            b = blocks[c]
            backing = arenas_of(plan)
            pool = pool_of(plan, backing)
            sep_pools += pool
            frame = frame_layout(b.plan).nbytes
            variants.append(VariantMemory(
                cp_size=c, block_saved_bytes=sum(b.plan.components),
                block_output_bytes=sum(dense_bytes(o) for o in b.plan.outputs), frame_bytes=frame,
                arena_bytes=backing, pool_bytes=pool,
                transient_bytes=max(b.forward_transient, b.backward_transient),
                eager_layer_bytes=frame + moe))
        pool_shared = pool_of(shared, arena)
        counts_ = rank_params(case, r)
        params = counts_.total
        w, g, o = _static(case, params)
        static = w + g + o
        step = step_transient_bytes(counts_.largest, counts_.dense)
        per = glay.layers_per_chunk
        last = [lay.pp * (c + 1) - 1 == lay.pp * lay.vpp - 1 and r == lay.pp - 1 for c in range(lay.vpp)]
        eager_layer = max(v.eager_layer_bytes for v in variants)
        eager_chunk = [n * eager_layer + (head if is_last else 0) for n, is_last in zip(per, last)]
        graph_chunk = [n * moe + (head if is_last else 0) for n, is_last in zip(per, last)]
        counts = glay.microbatch_counts
        in_flight = held_in_flight(lay.pp, lay.vpp, r, lay.group, counts, list(per))
        # the loss of the last stage: its bf16 logits and their fp32 copy live beside what is held
        loss = case.layout.tokens_per_rank * case.model.vocab * (dtype_bytes + 4) if any(last) else 0
        eager_peak = static + max(loss + held_in_flight(lay.pp, lay.vpp, r, lay.group, counts, eager_chunk),
                                  step)
        graph_peak = (static + pool_shared
                      + max(loss + held_in_flight(lay.pp, lay.vpp, r, lay.group, counts, graph_chunk), step)
                      if graphed else 0)
        out.append(RankMemory(
            pp_rank=r, ranks=lay.pool_ranks(r), params=params, weight_bytes=w, grad_bytes=g,
            optimizer_bytes=o, variants=tuple(variants), arena_bytes=arena,
            pool_shared_bytes=pool_shared if graphed else 0, pool_separate_bytes=sep_pools if graphed else 0,
            in_flight=in_flight, step_transient_bytes=step, eager_peak_bytes=eager_peak, graph_peak_bytes=graph_peak, megatron=meg))
    return CaseMemory(case.id, target, tuple(out), time.perf_counter() - t0)


def _check_target(target: MemoryTarget) -> None:
    if target.varlen_native_gqa:
        from harness.workload.attention import _varlen_takes_gqa

        if not _varlen_takes_gqa():
            raise MemoryPlanError("the target's torch passes fewer K/V heads to flash varlen (enable_gqa), "
                                  "but this torch's varlen_attn has no enable_gqa to plan it with: plan on "
                                  "torch >= 2.12, or for a target that repeats K/V heads")
