"""``train_arm``: the training loop of one arm on one rank (see docs/internals.md)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from harness.errors import ConfigError
from harness.results import AttentionWork, GraphStats, MemoryProbe, StateDigest, StepRecord, record_json
from harness.spec.layout import ParallelLayout
from harness.spec.schema import Case, DType, Pools
from harness.workload import checkpoint as ckpt
from harness.workload.attention import AttentionContext, attention_plan, causal_work
from harness.workload.batch import local_batch, static_batch
from harness.workload.comm import all_reduce_
from harness.workload.data import Table, successor_table
from harness.workload.graphed import LayerGraphs, capture
from harness.graphplan.layout import case_graph_layout
from harness.workload.model import (
    GraphableBlock,
    LayerContext,
    ModelChunk,
    StaticContext,
    build_chunks,
    is_expert_param,
)
from harness.workload.moe import MoEContext, moe_scalars
from harness.workload.optim import (all_reduce_grads, clip_grads_, global_grad_norm, make_optimizer,
                                    scheduled_lr, set_lr)
from harness.workload.packing import StepPlan, plan_step
from harness.workload.pipeline import MicrobatchInput, StepTotals, run_step
from harness.workload.state_digest import optimizer_digest, restore_rng, rng_digest, rng_state
from harness.workload.runtime import ProcessGroups, RankContext, build_groups, communicator_for
from harness.workload.transfer import to_device

StepCallback = Callable[[StepRecord], None]
# build_chunks' signature: (model, seed, pp, vpp, pp_rank, ep_size, ep_rank, device) -> this rank's chunks
ChunkBuilder = Callable[..., list[ModelChunk]]


@contextmanager
def _determinism(enabled: bool, seed: int) -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@dataclass(frozen=True)
class _Setup:
    layout: ParallelLayout
    groups: ProcessGroups
    chunks: list[ModelChunk]
    dense: list[torch.nn.Parameter]
    expert: list[torch.nn.Parameter]
    device: torch.device


def _autocast(case: Case) -> Optional[torch.dtype]:
    return torch.bfloat16 if case.train.dtype is DType.BF16 else None


def _setup(case: Case, ctx: RankContext, build: ChunkBuilder = build_chunks) -> _Setup:
    layout = case.layout  # preflight checked it (harness.arms derives and checks every arm case)
    if ctx.world_size != layout.world:
        raise ConfigError(
            f"case {case.id} needs {layout.world} ranks (nodes x gpus_per_node) but this run has "
            f"{ctx.world_size}"
        )
    par = case.parallel
    device = ctx.torch_device
    groups = build_groups(layout, ctx.rank, device, communicator_for(ctx, case.train.seed))
    chunks = build(
        case.model, case.train.seed, par.pp, par.vpp, groups.pp_rank, par.ep, groups.ep.rank, device
    )
    scope = case.static_scope
    if scope is not None:  # static shapes: every layer gets its graphable block
        for chunk in chunks:
            for layer in chunk.layers:
                layer.make_block(scope, _autocast(case))
    dense, expert = [], []
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            (expert if is_expert_param(name) else dense).append(p)
    return _Setup(layout, groups, chunks, dense, expert, device)


class _GraphSlot:
    """The graphs of a graph arm once captured (None before: eager warmup steps)."""

    def __init__(self) -> None:
        self.graphs: Optional[LayerGraphs] = None


def _microbatch_input(
    case: Case, plan: StepPlan, m: int, s: _Setup, table: Table, slot: _GraphSlot,
    works: dict[int, AttentionWork],
) -> MicrobatchInput:
    group = plan.microbatches[m].group_of(s.groups.pool_rank)
    if case.static_shapes:
        return _static_input(case, plan, m, s, table, slot, works)
    b = local_batch(group, s.groups.pool_rank, case.train.seed, plan.step, case.model.vocab, table)
    works[m] = AttentionWork(m, group.start, group.size, causal_work(b.segments, b.positions))
    dev = s.device
    positions = b.positions.to(dev)
    attn = AttentionContext(
        positions=positions,
        plan=attention_plan(b.segments, b.positions, b.key_segments, b.key_positions, dev),
        cp=s.groups.cp_group(group.size),
    )
    valid = b.valid.to(dev)
    moe = MoEContext(
        valid=valid,
        unit_tokens=b.unit_tokens,
        step_tokens=plan.total_tokens,
        cp=s.groups.cp_group(group.size),
        ep=s.groups.ep,
    )
    return MicrobatchInput(b.inputs.to(dev), b.targets.to(dev), valid, LayerContext(attn, moe))


def _static_input(
    case: Case, plan: StepPlan, m: int, s: _Setup, table: Table, slot: _GraphSlot,
    works: dict[int, AttentionWork],
) -> MicrobatchInput:
    """A static-shape microbatch: fixed token buffer, metadata tensors, the block runner (eager
    call, or graph replay once captured)."""
    scope = case.static_scope
    assert scope is not None and case.train.max_seqs_per_microbatch is not None
    group = plan.microbatches[m].group_of(s.groups.pool_rank)
    b = static_batch(group, s.groups.pool_rank, case.train.seed, plan.step, case.model.vocab, table,
                     case.layout.tokens_per_rank, case.train.max_seqs_per_microbatch)
    works[m] = AttentionWork(m, group.start, group.size,
                             causal_work(b.layout.segments, b.layout.positions))
    cp = s.groups.cp_group(group.size)
    host_scalars = moe_scalars(b.unit_tokens, plan.total_tokens, case.model.experts,
                               case.model.experts_per_token)
    ids, targets, valid, scalars, *meta = to_device(
        (b.inputs, b.targets, b.valid, host_scalars, *b.layout.metadata()), s.device)  # one upload
    moe = MoEContext(valid=valid, unit_tokens=b.unit_tokens, step_tokens=plan.total_tokens, cp=cp,
                     ep=s.groups.ep, static_shapes=True)

    def run(block: GraphableBlock, key: tuple[int, int], inputs: tuple[torch.Tensor, ...]) -> object:
        if slot.graphs is not None:
            return slot.graphs.call(key[0], key[1], inputs, group.size, m, cp)
        block.cp = cp
        return block(*inputs)

    static = StaticContext(tuple(meta), valid, scalars, cp, group.size, m, scope, run,
                           aux_sink=moe.aux_sink)
    return MicrobatchInput(ids, targets, valid, LayerContext(None, moe, static))


def _capture(case: Case, s: _Setup) -> LayerGraphs:
    """Capture this rank's blocks (every rank at the same step: warmup runs CP collectives)."""
    assert case.graphs is not None and case.train.max_seqs_per_microbatch is not None
    lay = s.layout
    layout = case_graph_layout(case, s.groups.pp_rank)
    assert layout.layers_per_chunk == tuple(len(c.layers) for c in s.chunks)
    handles = {c: s.groups.cp_group(c) for c in lay.cp_sizes}
    return capture(
        s.chunks, layout, handles, lambda c: s.groups.pool_rank % c,
        scope=case.graphs.scope, separate=case.execution.pools is Pools.SEPARATE,
        tokens=lay.tokens_per_rank, hidden=case.model.hidden,
        max_seqs=case.train.max_seqs_per_microbatch, experts=case.model.experts,
        top_k=case.model.experts_per_token, warmup_iters=case.graphs.capture_warmup_iters,
        seed=case.train.seed, log=lambda line: print(line, flush=True),
    )


def _probe(device: torch.device) -> Optional[MemoryProbe]:
    """Memory after emptying the allocator cache (the dcp_vs_fixed_cp figures; CUDA only): the
    record API's probe (``harness.metrics.memory_probe``: the whole device as this process alone
    would leave it)."""
    if device.type != "cuda":
        return None
    from harness.metrics.recorder import memory_probe

    return memory_probe(device)


def _memory(device: torch.device) -> dict[str, Optional[int]]:
    if device.type != "cuda":
        return {k: None for k in ("allocated_bytes", "reserved_bytes", "active_bytes", "max_allocated_bytes")}
    st = torch.cuda.memory_stats(device)
    return {
        "allocated_bytes": int(st.get("allocated_bytes.all.current", 0)),
        "reserved_bytes": int(st.get("reserved_bytes.all.current", 0)),
        "active_bytes": int(st.get("active_bytes.all.current", 0)),
        "max_allocated_bytes": int(st.get("allocated_bytes.all.peak", 0)),
    }


def _state(s: _Setup, opt: torch.optim.Optimizer, case: Case, step: int, rank: int) -> dict[str, Any]:
    return {
        **record_json(ckpt.CheckpointMeta(step, case.id, rank, s.layout.world)),
        "chunks": [c.state_dict() for c in s.chunks],
        "optimizer": opt.state_dict(),
        "rng": rng_state(s.device),
    }


def _digest(opt: torch.optim.Optimizer, device: torch.device) -> StateDigest:
    return StateDigest(optimizer=optimizer_digest(opt), rng=rng_digest(device))


def _restore(s: _Setup, opt: torch.optim.Optimizer, state: dict[str, Any], case: Case, rank: int,
             where: Path) -> None:
    meta = ckpt.read_meta(state, where)
    if (meta.case_id, meta.rank, meta.world_size) != (case.id, rank, s.layout.world):
        raise RuntimeError(
            f"{where}: checkpoint is of case {meta.case_id} rank {meta.rank}/{meta.world_size}, "
            f"not case {case.id} rank {rank}/{s.layout.world}; use a fresh checkpoint folder"
        )
    for chunk, sd in zip(s.chunks, state["chunks"]):
        chunk.load_state_dict(sd)
    opt.load_state_dict(state["optimizer"])
    if "rng" in state:  # checkpoints written before the RNG state was kept have none
        restore_rng(state["rng"], s.device)


def _reduce_and_update(case: Case, s: _Setup, opt: torch.optim.Optimizer,
                       totals: StepTotals, lr: float) -> tuple[float, float, float, bool]:
    """After the microbatches: gradients reduced, the global grad norm, the loss and aux loss
    summed over the world, and the optimizer step at ``lr`` (clipped; skipped when the norm is
    not finite). Returns (loss, aux loss, grad norm, skipped)."""
    train, pool_rank = case.train, s.groups.pool_rank
    all_reduce_grads(s.dense, s.groups.pool)
    all_reduce_grads(s.expert, s.groups.expert_dp)
    # Each replica counted once over the world; an emulated rank (alone) counts all it
    # holds, else a rank holding only replicas counted elsewhere would report 0.
    alone = s.groups.world.comm.alone
    norm = global_grad_norm(
        s.dense, s.expert, alone or pool_rank == 0, alone or pool_rank < case.parallel.ep,
        s.groups.world, s.device,
    )
    sums = torch.tensor([totals.loss_sum, totals.aux_sum], dtype=torch.float64, device=s.device)
    all_reduce_(sums, s.groups.world)
    loss, aux = float(sums[0]), float(sums[1]) / case.model.layers
    skipped = not math.isfinite(norm)
    if not skipped:
        clip = train.optimizer.grad_clip
        if clip is not None:
            clip_grads_(s.dense + s.expert, norm, clip)
        set_lr(opt, lr)
        opt.step()
    return loss, aux, norm, skipped


def _train_step(case: Case, ctx: RankContext, s: _Setup, opt: torch.optim.Optimizer, step: int,
                table: Table, slot: _GraphSlot, autocast: Optional[torch.dtype], *,
                memory_probe: bool, graph_stats: Optional[GraphStats],
                resumed_from: int) -> StepRecord:
    """One training step of this rank (packed, run through the pipeline, reduced, the optimizer
    stepped) and its record."""
    if s.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(s.device)
    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_step(case, step)
    if slot.graphs is not None:
        slot.graphs.check_step(len(plan.microbatches))
    opt.zero_grad(set_to_none=False)
    works: dict[int, AttentionWork] = {}  # microbatch -> this rank's attention work
    totals = run_step(
        s.chunks,
        s.groups,
        s.layout.pp,
        s.layout.group,
        len(plan.microbatches),
        lambda m: _microbatch_input(case, plan, m, s, table, slot, works),
        plan.total_tokens,
        case.model.hidden,
        autocast,
        s.device,
    )
    lr = scheduled_lr(case.train, step)
    loss, aux, norm, skipped = _reduce_and_update(case, s, opt, totals, lr)
    finite = math.isfinite(loss) and math.isfinite(norm)
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return StepRecord(
        step=step,
        loss=loss,
        aux_loss=aux,
        grad_norm=norm,
        nan=not finite,
        skipped=skipped,
        tokens=plan.total_tokens,
        microbatches=len(plan.microbatches),
        cp_sizes=tuple(mb.group_of(s.groups.pool_rank).size for mb in plan.microbatches),
        attention_work=tuple(works[m] for m in sorted(works)),
        lr=lr,
        step_time_s=elapsed,
        cpu_time_s=cpu,
        device=ctx.device,
        graphed=slot.graphs is not None,
        memory_probe=_probe(s.device) if memory_probe else None,
        graph_stats=graph_stats,
        replays=slot.graphs.take_replays() if slot.graphs is not None else (),
        packed=plan.packed(),
        resumed_from=resumed_from or None,
        **_memory(s.device),
    )


def train_arm(
    case: Case,
    ctx: RankContext,
    on_step: StepCallback,
    checkpoint_dir: Optional[Path] = None,
    *,
    chunk_builder: ChunkBuilder = build_chunks,
    stop_after: Optional[int] = None,
) -> None:
    """Train ``case.train.steps`` steps of an arm case (``harness.arms``: its layout, static
    shapes, eager or graphed), calling ``on_step(record)`` after each (docs/internals.md).
    ``chunk_builder`` makes this rank's initialised chunks (default :func:`build_chunks`; the arms
    of one emulated rank share one initialisation, ``emulate.WeightCache``). ``stop_after=K``
    (Megatron's ``--exit-interval``) ends the run after step K with a checkpoint of step K,
    whatever ``train.checkpoint_every`` says (nothing to do when the arm is already past K), so
    a later call resumes from exactly there."""
    train = case.train
    graphed = case.execution.graphed
    if graphed and ctx.torch_device.type != "cuda":
        raise ConfigError(f"arm '{case.arm}' replays CUDA graphs and needs a CUDA GPU per rank "
                          f"(this rank runs on {ctx.device})")
    if stop_after is not None and (checkpoint_dir is None or not 1 <= stop_after < train.steps):
        raise ValueError(f"stop_after={stop_after} needs a checkpoint folder and a step in "
                         f"1..{train.steps - 1}")
    with _determinism(train.deterministic, train.seed):
        s = _setup(case, ctx, chunk_builder)
        opt = make_optimizer(s.dense + s.expert, train)
        start = ckpt.agreed_resume_step(checkpoint_dir, ctx.rank, s.groups.world)
        if start > 0:
            assert checkpoint_dir is not None
            restore_started = time.monotonic()
            _restore(s, opt, ckpt.load(checkpoint_dir, ctx.rank, start), case, ctx.rank,
                     ckpt.step_file(checkpoint_dir, ctx.rank, start))
            took = time.monotonic() - restore_started
            if took >= ckpt.SLOW_S:
                print(f"[checkpoint r{ctx.rank}] step {start}: restored in {took:.1f}s", flush=True)
        # The state right after the load, for compare.resume (on the first record written).
        loaded = _digest(opt, s.device) if start > 0 else None
        last = train.steps if stop_after is None else min(stop_after, train.steps)
        table = successor_table(train.seed, case.model.vocab).tolist()  # read once, not per sequence
        autocast = _autocast(case)
        slot = _GraphSlot()
        probe_step = train.memory_probe_step or train.steps
        if case.execution.oracle:  # the one-rank arm beside Hugging Face's (compare.oracle)
            from harness.workload.oracle import train_oracle

            def inputs_of(plan: StepPlan) -> Callable[[int], MicrobatchInput]:
                return lambda m: _microbatch_input(case, plan, m, s, table, slot, {})

            train_oracle(case, ctx, on_step, lambda step: _train_step(
                case, ctx, s, opt, step, table, slot, autocast, memory_probe=step == probe_step,
                graph_stats=None, resumed_from=start), s, opt, inputs_of, start, last)
            return
        try:
            for step in range(start + 1, last + 1):
                stats: Optional[GraphStats] = None
                if graphed and slot.graphs is None and step > case.graphs.warmup_steps:  # type: ignore[union-attr]
                    slot.graphs = _capture(case, s)
                    stats = slot.graphs.stats
                record = _train_step(case, ctx, s, opt, step, table, slot, autocast,
                                     memory_probe=step == probe_step, graph_stats=stats,
                                     resumed_from=start)
                if loaded is not None:
                    record, loaded = dataclasses.replace(record, loaded_state=loaded), None
                if step == stop_after:  # the state the resumed process must get back
                    record = dataclasses.replace(record, stop_state=_digest(opt, s.device))
                # Record first, then checkpoint: a rank stopped in between re-runs this step on
                # resume (same values; the results store drops the duplicate record), whereas the
                # other order could resume after a step that was never recorded.
                on_step(record)
                every = train.checkpoint_every
                if checkpoint_dir is not None and ((every and step % every == 0) or step == stop_after):
                    # The harness's own stop resumes at once on this machine: no fsync needed.
                    ckpt.save(checkpoint_dir, ctx.rank, step, _state(s, opt, case, step, ctx.rank),
                              durable=step != stop_after)
        finally:
            if slot.graphs is not None:
                slot.graphs.close()
