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

from contextlib import AbstractContextManager, nullcontext
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


@dataclass(frozen=True)
class _Links:
    """This PP rank's point-to-point messages: which rank, channel and tag carry chunk ``c``'s
    activations (to virtual stage ``v+1``) and gradients (to ``v-1``)."""

    groups: ProcessGroups
    pp: int
    stages: int
    hidden: int
    device: torch.device

    def _neighbour(self, c: int, step: int) -> tuple[int, int]:
        """(global rank, PP stage) of virtual stage ``v + step``, ``v`` that of chunk ``c``."""
        s = (c * self.pp + self.groups.pp_rank + step) % self.pp
        return self.groups.pp.ranks[s], s

    def recv(self, c: int, m: int, tokens: int, backward: bool) -> torch.Tensor:
        """Chunk ``c``'s input activation of microbatch ``m`` (from ``v-1``), or the gradient of
        its output (from ``v+1``); blocks."""
        kind, step = ("grad", 1) if backward else ("act", -1)
        src, src_stage = self._neighbour(c, step)
        buf = torch.empty(tokens, self.hidden, dtype=torch.float32, device=self.device)
        me = self.groups.pp_rank
        channel = self.groups.p2p[(src_stage, me, kind)]
        self.groups.comm.recv(buf, src, channel, _tag(m, c * self.pp + me, self.stages, backward))
        return buf

    def send(self, c: int, m: int, tensor: torch.Tensor, backward: bool) -> Work:
        """Chunk ``c``'s output of microbatch ``m`` to ``v+1``, or its input gradient to ``v-1``;
        non-blocking."""
        kind, step = ("grad", -1) if backward else ("act", 1)
        dst, dst_stage = self._neighbour(c, step)
        me = self.groups.pp_rank
        channel = self.groups.p2p[(me, dst_stage, kind)]
        tag = _tag(m, c * self.pp + me + step, self.stages, backward)
        return self.groups.comm.isend(tensor, dst, channel, tag)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def _masked_loss(out: torch.Tensor, mb: MicrobatchInput, step_tokens: int) -> torch.Tensor:
    """The microbatch's cross-entropy over its real tokens, divided by the step's tokens."""
    ce = F.cross_entropy(out.float(), mb.targets, reduction="none")
    ce_sum = (ce * mb.valid.to(ce.dtype)).sum()
    return ce_sum / step_tokens


class _StepRun:
    """One step's forwards and backwards on this rank, and what is in flight between them.

    Loss and aux pieces add up on the device (fp64, in the order a host sum would take them: the
    same bits) and are read once, in :meth:`finish`: no host sync per microbatch."""

    def __init__(self, chunks: list[ModelChunk], links: _Links, get_input: Callable[[int], MicrobatchInput],
                 step_tokens: int, autocast_dtype: torch.dtype | None, microbatches: int) -> None:
        self.chunks, self.links, self.get_input = chunks, links, get_input
        self.step_tokens, self.autocast_dtype = step_tokens, autocast_dtype
        self.loss_acc = torch.zeros((), dtype=torch.float64, device=links.device)
        self.aux_acc = torch.zeros((), dtype=torch.float64, device=links.device)
        self.inputs: dict[int, MicrobatchInput] = {}
        self.saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        self.backwards_left = {m: len(chunks) for m in range(microbatches)}
        self.pending: list[tuple[Work, torch.Tensor]] = []

    def _input(self, m: int) -> MicrobatchInput:
        if m not in self.inputs:
            self.inputs[m] = self.get_input(m)
        return self.inputs[m]

    def forward(self, c: int, m: int) -> None:
        chunk, mb = self.chunks[c], self._input(m)
        if chunk.first:
            x_in, x = None, mb.inputs
        else:
            x_in = self.links.recv(c, m, mb.inputs.shape[0], backward=False).requires_grad_()
            x = x_in
        with _autocast(self.links.device, self.autocast_dtype):
            out = chunk(x, mb.ctx)
        if chunk.last:
            loss = _masked_loss(out, mb, self.step_tokens)
            self.loss_acc += loss.detach().double()
            self.saved[(c, m)] = (x_in, loss)
        else:
            send = out.detach().float().contiguous()
            self.pending.append((self.links.send(c, m, send, backward=False), send))
            self.saved[(c, m)] = (x_in, out)

    def backward(self, c: int, m: int) -> None:
        mb = self._input(m)
        x_in, out = self.saved.pop((c, m))
        if self.chunks[c].last:
            out.backward()
        else:
            grad = self.links.recv(c, m, mb.inputs.shape[0], backward=True)
            out.backward(grad.to(out.dtype))
        if x_in is not None:
            g = x_in.grad.detach().float().contiguous()
            self.pending.append((self.links.send(c, m, g, backward=True), g))
        # Drop the buffers of sends that already completed (the rest wait at the step's end).
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
        self.backwards_left[m] -= 1
        if self.backwards_left[m] == 0:
            self.aux_acc += _ordered_sum(self.inputs[m].ctx.moe.aux_sink, self.links.device)
            del self.inputs[m]

    def finish(self) -> StepTotals:
        """Wait for the sends still in flight; this rank's totals (one host read)."""
        for work, _ in self.pending:
            work.wait()
        if self.saved or self.inputs:
            raise RuntimeError(f"pipeline order left work behind: saved {sorted(self.saved)}, "
                               f"inputs {sorted(self.inputs)}")
        loss_sum, aux_sum = torch.stack([self.loss_acc, self.aux_acc]).tolist()
        return StepTotals(loss_sum=loss_sum, aux_sum=aux_sum)


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
    order = pipeline_order(pp, vpp, group, groups.pp_rank, microbatches)
    links = _Links(groups, pp, pp * vpp, hidden, device)
    run = _StepRun(chunks, links, get_input, step_tokens, autocast_dtype, microbatches)
    for ev in order_events(order, vpp):
        (run.forward if ev.forward else run.backward)(ev.chunk, ev.microbatch)
    return run.finish()


def _ordered_sum(pieces: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``0.0 + p0 + p1 + ...`` in fp64, one piece after another (what ``sum`` of the host values
    gives, bit for bit)."""
    acc = torch.zeros((), dtype=torch.float64, device=device)
    for p in pieces:
        acc += p.detach().reshape(()).double()
    return acc
