"""Rank context and the process groups (PP, DP x CP, CP per size, EP, expert-DP).

The rank arithmetic is the case's ``ParallelLayout`` (``harness.spec.layout``: global rank =
``pp_rank * dp_cp + pool_rank``, CP groups the aligned contiguous blocks of a stage's DP x CP pool,
one set per allowed CP size, EP groups contiguous blocks of ``ep`` pool ranks, expert-DP groups the
pool ranks with the same EP rank); preflight has checked it. All groups are created up front in one
global order and warmed with a collective before training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from harness.errors import ConfigError
from harness.spec.layout import ParallelLayout
from harness.workload.comm import DISTRIBUTED, Communicator, GroupHandle
from harness.workload.loopback import BACKEND as LOOPBACK
from harness.workload.loopback import Loopback


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: str  # "cpu" or "cuda:N"
    backend: str  # "gloo" or "nccl" ("none" for a single rank without a process group)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def init_distributed(timeout_s: float = 600.0) -> RankContext:
    """Build the rank context from RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT.

    With more than one rank the default process group is initialised (NCCL on CUDA, else gloo).
    Without the variables (or WORLD_SIZE=1) it is a single rank with no process group.
    """
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    if torch.cuda.is_available():
        index = cuda_device_index(local, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device, backend = f"cuda:{index}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    if world > 1:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise ConfigError(f"{var} is not set; a multi-rank run needs the rendezvous address")
        if not dist.is_initialized():
            kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
            dist.init_process_group(
                backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s), **kwargs
            )
    else:
        backend = "none"
    return RankContext(rank, world, local, device, backend)


def cuda_device_index(local_rank: int, visible: int) -> int:
    """This rank's GPU: ``cuda:LOCAL_RANK``, or ``cuda:0`` when the process sees one GPU (Slurm
    binding one GPU per task). A rank without a GPU of its own is a ConfigError, not two ranks
    on one GPU (NCCL would fail later with an obscure "duplicate GPU" error)."""
    if visible == 1:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise ConfigError(
        f"LOCAL_RANK={local_rank} but this process sees only {visible} CUDA GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); run one rank "
        "per GPU: resources.gpus_per_node must not exceed the GPUs of a node"
    )


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's groups. Handles of one-rank groups carry ``group=None``."""

    layout: ParallelLayout
    rank: int
    world: GroupHandle
    pp: GroupHandle
    pool: GroupHandle  # DP x CP of this stage: dense-grad all-reduce
    ep: GroupHandle
    expert_dp: GroupHandle  # expert-grad all-reduce
    cp: dict[int, GroupHandle] = field(default_factory=dict)  # CP size -> this rank's block
    # (src PP stage, dst PP stage, kind) -> group for one-way pipeline traffic of one kind
    # ("act" activations, "grad" input grads) between two stages of this rank's pipeline.
    p2p: dict[tuple[int, int, str], Optional[object]] = field(default_factory=dict)
    comm: Communicator = DISTRIBUTED  # pipeline sends and receives go through it

    @property
    def pp_rank(self) -> int:
        return self.layout.pp_rank(self.rank)

    @property
    def pool_rank(self) -> int:
        return self.layout.pool_rank(self.rank)

    def cp_group(self, size: int) -> GroupHandle:
        if size not in self.cp:
            raise ValueError(f"no CP group of size {size} was created (have {sorted(self.cp)})")
        return self.cp[size]


def _handle(ranks: tuple[int, ...], rank: int, group: object, comm: Communicator) -> GroupHandle:
    return GroupHandle(group if len(ranks) > 1 else None, len(ranks), ranks.index(rank), ranks, comm)


def communicator_for(ctx: RankContext, seed: int) -> Communicator:
    """The communicator of a rank context: the loopback stand-in for an emulated rank (backend
    ``loopback``), else ``torch.distributed``."""
    if ctx.backend == LOOPBACK:
        return Loopback(seed)
    return DISTRIBUTED


def build_groups(layout: ParallelLayout, rank: int, device: torch.device,
                 comm: Communicator = DISTRIBUTED) -> ProcessGroups:
    """Create every group of ``layout`` (one CP group set per CP size; all ranks call this
    identically) on ``comm`` and warm this rank's communicators."""
    mine: dict[str, GroupHandle] = {}
    cp: dict[int, GroupHandle] = {}
    warm: list[GroupHandle] = []

    def make(ranks: tuple[int, ...], purpose: str) -> Optional[object]:
        # new_group must be called by every rank, in the same order, for every group.
        return None if len(ranks) == 1 else comm.new_group(ranks, purpose)

    def visit(key: str, candidates: list[tuple[int, ...]]) -> GroupHandle:
        found = None
        for ranks in candidates:
            g = make(ranks, key)
            if rank in ranks:
                found = _handle(ranks, rank, g, comm)
        assert found is not None, f"rank {rank} is in no {key} group"
        warm.append(found)
        return found

    world_ranks = tuple(range(layout.world))
    world = GroupHandle(comm.world_group(layout.world), layout.world, rank, world_ranks, comm)
    mine["pp"] = visit("pp", [layout.pp_ranks(i) for i in range(layout.dp_cp)])
    stages = range(layout.pp)
    mine["pool"] = visit("pool", [layout.pool_ranks(s) for s in stages])
    mine["ep"] = visit("ep", [b for s in stages for b in layout.ep_blocks(s)])
    mine["expert_dp"] = visit("expert_dp", [g for s in stages for g in layout.expert_dp_groups(s)])
    for size in sorted(set(layout.cp_sizes)):
        cp[size] = visit(f"cp{size}", [b for s in stages for b in layout.cp_blocks(s, size)])
    # One group per one-way (stage pair, kind) channel: activations flow s -> s+1 (and the VPP wrap
    # pp-1 -> 0), grads the other way. Each channel then carries one FIFO stream in one direction,
    # so in-order matching (NCCL ignores tags) can neither confuse messages nor deadlock.
    p2p: dict[tuple[int, int, str], Optional[object]] = {}
    channels = pipeline_channels(layout.pp)
    my_pool = layout.pool_rank(rank)
    for i in range(layout.dp_cp):
        for src, dst, kind in channels:
            ranks = (layout.global_rank(src, i), layout.global_rank(dst, i))
            g = make(ranks, f"p2p {src}->{dst} {kind}") if src != dst else None
            if i == my_pool:
                p2p[(src, dst, kind)] = g
    me = layout.pp_rank(rank)
    warm_channels = [  # every channel of this rank once, in its direction, in the global order
        (p2p[(src, dst, kind)], layout.global_rank(dst if me == src else src, my_pool), me == src)
        for src, dst, kind in channels
        if p2p[(src, dst, kind)] is not None and me in (src, dst)
    ]
    if layout.world > 1:
        comm.warm_up(warm, warm_channels, device)
    return ProcessGroups(layout, rank, world, mine["pp"], mine["pool"], mine["ep"], mine["expert_dp"], cp, p2p,
                         comm)


def pipeline_channels(pp: int) -> list[tuple[int, int, str]]:
    """Every one-way pipeline channel ``(src stage, dst stage, kind)``, in a fixed global order."""
    if pp == 1:
        return []
    out = []
    for s in range(pp):
        nxt = (s + 1) % pp
        out.append((s, nxt, "act"))
        out.append((nxt, s, "grad"))
    return out
