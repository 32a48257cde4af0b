"""Execute one step's forwards and backwards in this PP rank's order (interleaved 1F1B).

The order comes from :mod:`harness.slotmem.schedule` (Megatron's ``_order``: ``+c`` forward,
``-c`` backward of 1-based chunk ``c``; the logical microbatch of every event is FIFO per chunk).
Chunk ``c`` of PP rank ``r`` is virtual stage ``v = c*pp + r``: its input comes from virtual stage
``v-1`` (PP rank ``r-1``, or the last PP rank's chunk ``c-1`` when ``r == 0``) and its output goes to
``v+1``; gradients flow back the same way. Sends are non-blocking (waited at the end of the step),
receives block, and every message carries a tag naming (microbatch, receiving virtual stage,
direction), so the interleaving of activation and gradient messages between two ranks cannot be
confused. Each one-way (stage pair, kind) channel also has its own process group
(``ProcessGroups.p2p``), so backends that match point-to-point messages in issue order (NCCL)
see one FIFO stream per group. Sends and receives go through ``ProcessGroups.comm``
(``torch.distributed``, or the loopback stand-in of an emulated rank). With PP=1 and VPP=1 the
order is forward, backward, ... on one rank.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from harness.errors import ConfigError
from harness.slotmem.schedule import microbatch_count_problem, order_events, rank_order
from harness.workload.comm import Work
from harness.workload.model import LayerContext, ModelChunk
from harness.workload.runtime import ProcessGroups


@dataclass(frozen=True)
class MicrobatchInput:
    """What a rank needs to run microbatch ``m``: its token ids, targets, loss mask, context."""

    inputs: torch.Tensor  # [T] int64
    targets: torch.Tensor  # [T] int64
    valid: torch.Tensor  # [T] bool
    ctx: LayerContext


@dataclass
class StepTotals:
    """This rank's contributions to the step (summed over ranks by the caller)."""

    loss_sum: float = 0.0  # sum of per-token CE over real tokens, divided by the step's tokens
    aux_sum: float = 0.0  # sum over layers and units of (T/N) * aux piece


def pipeline_order(pp: int, vpp: int, group: int, pp_rank: int, microbatches: int) -> tuple[int, ...]:
    problem = microbatch_count_problem(pp, vpp, group, microbatches)
    if problem is not None:
        raise ConfigError(f"pipeline schedule (pp={pp}, vpp={vpp}, group={group}): {problem}")
    return rank_order(pp, pp_rank, microbatches, vpp, group)


def _tag(microbatch: int, virtual: int, stages: int, backward: bool) -> int:
    return (microbatch * stages + virtual) * 2 + int(backward)


def run_step(
    chunks: list[ModelChunk],
    groups: ProcessGroups,
    pp: int,
    group: int,
    microbatches: int,
    get_input: Callable[[int], MicrobatchInput],
    step_tokens: int,
    hidden: int,
    autocast_dtype: torch.dtype | None,
    device: torch.device,
) -> StepTotals:
    """Run every forward and backward of the step on this rank; gradients accumulate in place."""
    vpp = len(chunks)
    stages = pp * vpp
    pp_rank = groups.pp_rank
    order = pipeline_order(pp, vpp, group, pp_rank, microbatches)
    # Loss and aux pieces add up on the device (fp64, in the order a host sum would take them:
    # the same bits) and are read once, at the end: no host sync per microbatch.
    loss_acc = torch.zeros((), dtype=torch.float64, device=device)
    aux_acc = torch.zeros((), dtype=torch.float64, device=device)
    inputs: dict[int, MicrobatchInput] = {}
    saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
    backwards_left = {m: vpp for m in range(microbatches)}
    pending: list[tuple[Work, torch.Tensor]] = []
    comm = groups.comm

    def prev_of(c: int) -> tuple[int, int]:  # (global rank, PP stage) of virtual stage v-1
        s = (c * pp + pp_rank - 1) % pp
        return groups.pp.ranks[s], s

    def next_of(c: int) -> tuple[int, int]:  # (global rank, PP stage) of virtual stage v+1
        s = (c * pp + pp_rank + 1) % pp
        return groups.pp.ranks[s], s

    def channel(src: int, dst: int, kind: str) -> object:
        return groups.p2p[(src, dst, kind)]

    def mb_input(m: int) -> MicrobatchInput:
        if m not in inputs:
            inputs[m] = get_input(m)
        return inputs[m]

    for ev in order_events(order, vpp):
        c, m = ev.chunk, ev.microbatch
        v = c * pp + pp_rank
        chunk = chunks[c]
        mb = mb_input(m)
        tokens = mb.inputs.shape[0]
        if ev.forward:
            if chunk.first:
                x_in, x = None, mb.inputs
            else:
                src, src_stage = prev_of(c)
                buf = torch.empty(tokens, hidden, dtype=torch.float32, device=device)
                comm.recv(buf, src, channel(src_stage, pp_rank, "act"), _tag(m, v, stages, False))
                x_in = buf.requires_grad_()
                x = x_in
            amp = (
                torch.autocast(device.type, dtype=autocast_dtype)
                if autocast_dtype is not None
                else nullcontext()
            )
            with amp:
                out = chunk(x, mb.ctx)
            if chunk.last:
                ce = F.cross_entropy(out.float(), mb.targets, reduction="none")
                ce_sum = (ce * mb.valid.to(ce.dtype)).sum()
                loss = ce_sum / step_tokens
                loss_acc += loss.detach().double()
                saved[(c, m)] = (x_in, loss)
            else:
                send = out.detach().float().contiguous()
                dst, dst_stage = next_of(c)
                work = comm.isend(send, dst, channel(pp_rank, dst_stage, "act"), _tag(m, v + 1, stages, False))
                pending.append((work, send))
                saved[(c, m)] = (x_in, out)
        else:
            x_in, out = saved.pop((c, m))
            if chunk.last:
                out.backward()
            else:
                grad = torch.empty(tokens, hidden, dtype=torch.float32, device=device)
                src, src_stage = next_of(c)
                comm.recv(grad, src, channel(src_stage, pp_rank, "grad"), _tag(m, v, stages, True))
                out.backward(grad.to(out.dtype))
            if x_in is not None:
                dst, dst_stage = prev_of(c)
                g = x_in.grad.detach().float().contiguous()
                work = comm.isend(g, dst, channel(pp_rank, dst_stage, "grad"), _tag(m, v - 1, stages, True))
                pending.append((work, g))
            # Drop the buffers of sends that already completed (the rest wait at the step's end).
            pending = [(w, t) for w, t in pending if not w.is_completed()]
            backwards_left[m] -= 1
            if backwards_left[m] == 0:
                aux_acc += _ordered_sum(inputs[m].ctx.moe.aux_sink, device)
                del inputs[m]
    for work, _ in pending:
        work.wait()
    if saved or inputs:
        raise RuntimeError(f"pipeline order left work behind: saved {sorted(saved)}, inputs {sorted(inputs)}")
    loss_sum, aux_sum = torch.stack([loss_acc, aux_acc]).tolist()
    return StepTotals(loss_sum=loss_sum, aux_sum=aux_sum)


def _ordered_sum(pieces: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``0.0 + p0 + p1 + ...`` in fp64, one piece after another (what ``sum`` of the host values
    gives, bit for bit)."""
    acc = torch.zeros((), dtype=torch.float64, device=device)
    for p in pieces:
        acc += p.detach().reshape(()).double()
    return acc
