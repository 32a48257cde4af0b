"""Rank context, the rank layout and the process groups (PP, DP x CP, CP per size, EP, expert-DP).

Rank layout (Megatron's ``tp-cp-ep-dp-pp`` order without TP): global rank = ``pp_rank * pool +
pool_rank`` where the pool is the DP x CP ranks of one stage. CP groups of size ``c`` are the
contiguous, aligned blocks ``[k*c, (k+1)*c)`` of the pool (fixed CP uses one size, dynamic CP one
group per allowed size, as Megatron's ``create_dynamic_dp_cp_groups``). EP groups are contiguous
blocks of ``ep`` pool ranks; expert-DP groups join the pool ranks with the same EP rank. All groups
are created up front in one global order and warmed with a collective before training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from harness.errors import ConfigError
from harness.spec.layout import cp_divides_problem
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
class Layout:
    """Pure rank arithmetic of one case (no process groups)."""

    world: int
    pp: int
    ep: int

    def __post_init__(self) -> None:
        if self.world % self.pp:
            raise ConfigError(f"world size {self.world} is not divisible by pp={self.pp}")
        if self.pool % self.ep:
            raise ConfigError(f"EP size {self.ep} does not divide the DP x CP ranks of a stage ({self.pool})")

    @property
    def pool(self) -> int:
        return self.world // self.pp

    def pp_rank(self, rank: int) -> int:
        return rank // self.pool

    def pool_rank(self, rank: int) -> int:
        return rank % self.pool

    def global_rank(self, pp_rank: int, pool_rank: int) -> int:
        return pp_rank * self.pool + pool_rank

    def ep_rank(self, rank: int) -> int:
        return self.pool_rank(rank) % self.ep

    def pp_ranks(self, rank: int) -> tuple[int, ...]:
        return tuple(self.global_rank(s, self.pool_rank(rank)) for s in range(self.pp))

    def pool_ranks(self, pp_rank: int) -> tuple[int, ...]:
        return tuple(self.global_rank(pp_rank, i) for i in range(self.pool))

    def cp_blocks(self, pp_rank: int, size: int) -> list[tuple[int, ...]]:
        base = self.pool_ranks(pp_rank)
        return [base[k : k + size] for k in range(0, self.pool - size + 1, size)]

    def ep_blocks(self, pp_rank: int) -> list[tuple[int, ...]]:
        return self.cp_blocks(pp_rank, self.ep)

    def expert_dp_groups(self, pp_rank: int) -> list[tuple[int, ...]]:
        base = self.pool_ranks(pp_rank)
        return [tuple(base[j :: self.ep]) for j in range(self.ep)]


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's groups. Handles of one-rank groups carry ``group=None``."""

    layout: Layout
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


def build_groups(layout: Layout, rank: int, cp_sizes: tuple[int, ...], device: torch.device,
                 comm: Communicator = DISTRIBUTED) -> ProcessGroups:
    """Create every group (all ranks call this identically) and warm this rank's communicators."""
    cp: dict[int, GroupHandle] = {}
    mine: dict[str, GroupHandle] = {}
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
    mine["pp"] = visit("pp", [tuple(layout.global_rank(s, i) for s in range(layout.pp)) for i in range(layout.pool)])
    stages = range(layout.pp)
    mine["pool"] = visit("pool", [layout.pool_ranks(s) for s in stages])
    mine["ep"] = visit("ep", [b for s in stages for b in layout.ep_blocks(s)])
    mine["expert_dp"] = visit("expert_dp", [g for s in stages for g in layout.expert_dp_groups(s)])
    for size in sorted(set(cp_sizes)):
        why = cp_divides_problem(size, layout.pool)
        if why is not None:
            raise ConfigError(why)
        cp[size] = visit(f"cp{size}", [b for s in stages for b in layout.cp_blocks(s, size)])
    # One group per one-way (stage pair, kind) channel: activations flow s -> s+1 (and the VPP wrap
    # pp-1 -> 0), grads the other way. Each channel then carries one FIFO stream in one direction,
    # so in-order matching (NCCL ignores tags) can neither confuse messages nor deadlock.
    p2p: dict[tuple[int, int, str], Optional[object]] = {}
    channels = pipeline_channels(layout.pp)
    my_pool = layout.pool_rank(rank)
    for i in range(layout.pool):
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
