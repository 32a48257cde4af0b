"""``train_arm``: the training loop of one arm on one rank (see docs/internals.md)."""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from harness.errors import ConfigError
from harness.spec.schema import Case
from harness.workload import checkpoint as ckpt
from harness.workload.attention import AttentionContext, attention_plan
from harness.workload.batch import local_batch
from harness.workload.data import successor_table
from harness.workload.model import LayerContext, ModelChunk, build_chunks, is_expert_param
from harness.workload.moe import MoEContext
from harness.workload.optim import all_reduce_grads, clip_grads_, global_grad_norm, make_optimizer
from harness.workload.options import TrainOptions
from harness.workload.packing import StepPlan, plan_step
from harness.workload.pipeline import MicrobatchInput, run_step
from harness.workload.runtime import Layout, ProcessGroups, RankContext, build_groups

StepCallback = Callable[[dict], None]


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
    layout: Layout
    groups: ProcessGroups
    chunks: list[ModelChunk]
    dense: list[torch.nn.Parameter]
    expert: list[torch.nn.Parameter]
    device: torch.device


def cp_sizes_for(case: Case, options: TrainOptions) -> tuple[int, ...]:
    if options.fixed_cp is not None:
        return (options.fixed_cp,)
    return case.parallel.cp_sizes


def _setup(case: Case, options: TrainOptions, ctx: RankContext) -> _Setup:
    if ctx.world_size != case.world_size:
        raise ConfigError(
            f"case {case.id} needs {case.world_size} ranks (nodes x gpus_per_node) but this run has "
            f"{ctx.world_size}"
        )
    par = case.parallel
    if par.vpp > 1 and par.pp == 1:
        raise ConfigError("parallel.vpp > 1 needs parallel.pp > 1 (virtual stages interleave over PP ranks)")
    layout = Layout(ctx.world_size, par.pp, par.ep)
    device = ctx.torch_device
    groups = build_groups(layout, ctx.rank, cp_sizes_for(case, options), device)
    chunks = build_chunks(
        case.model, case.train.seed, par.pp, par.vpp, groups.pp_rank, par.ep, groups.ep.rank, device
    )
    dense, expert = [], []
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            (expert if is_expert_param(name) else dense).append(p)
    return _Setup(layout, groups, chunks, dense, expert, device)


def _microbatch_input(
    case: Case, plan: StepPlan, m: int, s: _Setup, table: torch.Tensor
) -> MicrobatchInput:
    group = plan.microbatches[m].group_of(s.groups.pool_rank)
    b = local_batch(group, s.groups.pool_rank, case.train.seed, plan.step, case.model.vocab, table)
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


def _break_backward(params: list[torch.nn.Parameter], seed: int, step: int) -> None:
    """Fault ``broken_backward``: replace every gradient by seeded noise of the same norm."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 7919 + step)
    for p in params:
        noise = torch.randn(p.shape, generator=g).to(p.grad.device, p.grad.dtype)
        p.grad.copy_(noise * (p.grad.norm() / (noise.norm() + 1e-12)))


def _state(s: _Setup, opt: torch.optim.Optimizer, case: Case, step: int, rank: int) -> dict[str, Any]:
    return {
        "step": step,
        "case_id": case.id,
        "rank": rank,
        "world_size": s.layout.world,
        "chunks": [c.state_dict() for c in s.chunks],
        "optimizer": opt.state_dict(),
    }


def _restore(s: _Setup, opt: torch.optim.Optimizer, state: dict[str, Any], case: Case, rank: int) -> None:
    if (state.get("case_id"), state.get("rank"), state.get("world_size")) != (case.id, rank, s.layout.world):
        raise RuntimeError(
            f"checkpoint is of case {state.get('case_id')} rank {state.get('rank')}/"
            f"{state.get('world_size')}, not case {case.id} rank {rank}/{s.layout.world}; "
            "use a fresh checkpoint folder"
        )
    for chunk, sd in zip(s.chunks, state["chunks"]):
        chunk.load_state_dict(sd)
    opt.load_state_dict(state["optimizer"])


def train_arm(
    case: Case,
    options: TrainOptions,
    ctx: RankContext,
    on_step: StepCallback,
    checkpoint_dir: Optional[Path] = None,
) -> None:
    """Train ``case.train.steps`` steps, calling ``on_step(record)`` after each (docs/internals.md)."""
    if options.graphs:
        raise ConfigError(
            "CUDA-graph arms (TrainOptions.graphs) are not available in the eager workload yet; "
            "run the eager arm"
        )
    train = case.train
    with _determinism(train.deterministic, train.seed):
        s = _setup(case, options, ctx)
        params = s.dense + s.expert
        opt = make_optimizer(params, train)
        start = ckpt.agreed_resume_step(checkpoint_dir, ctx.rank, s.groups.world)
        if start > 0:
            assert checkpoint_dir is not None
            _restore(s, opt, ckpt.load(checkpoint_dir, ctx.rank, start), case, ctx.rank)
        table = successor_table(train.seed, case.model.vocab)
        autocast = torch.bfloat16 if train.dtype == "bf16" else None
        pool_rank = s.groups.pool_rank
        for step in range(start + 1, train.steps + 1):
            if s.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(s.device)
            t0 = time.perf_counter()
            plan = plan_step(case, step, options.fixed_cp)
            opt.zero_grad(set_to_none=False)
            totals = run_step(
                s.chunks,
                s.groups,
                case.parallel.pp,
                case.parallel.group_size,
                len(plan.microbatches),
                lambda m: _microbatch_input(case, plan, m, s, table),
                plan.total_tokens,
                case.model.hidden,
                autocast,
                s.device,
            )
            all_reduce_grads(s.dense, s.groups.pool)
            all_reduce_grads(s.expert, s.groups.expert_dp)
            if options.fault == "broken_backward":
                _break_backward(params, train.seed, step)
            norm = global_grad_norm(
                s.dense, s.expert, pool_rank == 0, pool_rank < case.parallel.ep, s.groups.world, s.device
            )
            sums = torch.tensor([totals.loss_sum, totals.aux_sum], dtype=torch.float64, device=s.device)
            if s.groups.world.active:
                dist.all_reduce(sums, group=s.groups.world.group)
            loss, aux = float(sums[0]), float(sums[1]) / case.model.layers
            finite = math.isfinite(loss) and math.isfinite(norm)
            skipped = not math.isfinite(norm)
            if not skipped:
                clip = train.optimizer.grad_clip
                if clip is not None:
                    clip_grads_(params, norm, clip)
                opt.step()
            if s.device.type == "cuda":
                torch.cuda.synchronize(s.device)
            elapsed = time.perf_counter() - t0
            mb_sizes = [mb.group_of(pool_rank).size for mb in plan.microbatches]
            record = {
                "step": step,
                "loss": loss,
                "aux_loss": aux,
                "grad_norm": norm,
                "nan": not finite,
                "skipped": skipped,
                "tokens": plan.total_tokens,
                "microbatches": len(plan.microbatches),
                "cp_sizes": mb_sizes,
                "lr": train.lr,
                "step_time_s": elapsed,
                "device": ctx.device,
                **_memory(s.device),
            }
            # Record first, then checkpoint: a rank stopped in between re-runs this step on
            # resume (same values; the results store drops the duplicate record), whereas the
            # other order could resume after a step that was never recorded.
            on_step(record)
            every = train.checkpoint_every
            if checkpoint_dir is not None and every and step % every == 0:
                ckpt.save(checkpoint_dir, ctx.rank, step, _state(s, opt, case, step, ctx.rank))
