"""The workload's communication seam: one :class:`Communicator` interface, two implementations.

Every collective and point-to-point call of the workload goes through the communicator of the
group it runs on (``GroupHandle.comm``; ``ProcessGroups.comm`` for pipeline sends and receives):

* :data:`DISTRIBUTED` (this module): ``torch.distributed`` (NCCL on CUDA, gloo on CPU), the real
  multi-rank path;
* :class:`harness.workload.loopback.Loopback`: one process stands in for rank ``r`` of an
  ``N``-rank layout; every call keeps its real shapes and dtypes and fills its outputs with
  deterministic local values (``emulate.py``).

The model calls the module-level functions (:func:`all_gather_rows`, :func:`all_to_all_rows`,
:func:`all_to_all_counts`, :func:`all_reduce_`); a one-rank group (``handle is None`` or size 1)
is an identity there, so the single-rank model runs the same code path with either communicator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Protocol, Sequence

import torch
import torch.distributed as dist

ReduceOp = Literal["sum", "min"]


class Work(Protocol):
    """A pending point-to-point send (``torch.distributed.Work``'s two methods the pipeline uses)."""

    def is_completed(self) -> bool: ...

    def wait(self) -> Any: ...


class Communicator(Protocol):
    """What the workload asks of its communication layer (see the module docstring)."""

    name: str
    # True: this process is the only rank that takes part (the loopback layer: peers are
    # emulated, their contributions to a sum are nothing); a figure that each rank counts once
    # over all ranks (the global grad norm's replicated parameters) is then counted whole here.
    alone: bool

    def new_group(self, ranks: tuple[int, ...], purpose: str) -> Optional[object]:
        """The group object of ``ranks`` (called by every rank for every group, in one global
        order); ``purpose`` names it (``pp``, ``cp2``, ``p2p 0->1 act``, ...)."""
        ...

    def world_group(self, size: int) -> Optional[object]: ...

    def warm_up(self, handles: Sequence["GroupHandle"], channels: Sequence[tuple[object, int, bool]],
                device: torch.device) -> None:
        """Make every communicator ready before training (and before any graph capture):
        ``handles`` this rank's groups, ``channels`` its pipeline channels as (group, peer global
        rank, this rank sends)."""
        ...

    def all_gather_rows(self, x: torch.Tensor, handle: "GroupHandle") -> torch.Tensor:
        """``[size * rows, ...]``: every rank's ``x`` in group order (autograd-aware)."""
        ...

    def all_to_all_rows(self, x: torch.Tensor, send: list[int], recv: list[int],
                        handle: "GroupHandle") -> torch.Tensor:
        """Rows of ``x`` split by ``send`` go to each rank; ``recv`` rows come back (autograd)."""
        ...

    def all_to_all_counts(self, counts: torch.Tensor, handle: "GroupHandle") -> torch.Tensor: ...

    def all_reduce_(self, x: torch.Tensor, handle: "GroupHandle", op: ReduceOp = "sum") -> torch.Tensor: ...

    def min_int(self, value: int, handle: "GroupHandle") -> int:
        """The smallest ``value`` over the group (host integers: the agreed resume step)."""
        ...

    def isend(self, tensor: torch.Tensor, dst: int, group: Optional[object], tag: int) -> Work: ...

    def recv(self, buf: torch.Tensor, src: int, group: Optional[object], tag: int) -> torch.Tensor:
        """Fill ``buf`` with the message from ``src`` on ``group`` (returns ``buf``)."""
        ...


# ----------------------------------------------------------------------------- torch.distributed
class _AllGather(torch.autograd.Function):
    """Concatenate every rank's equally-sized ``x`` along dim 0; backward sums and slices."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: "GroupHandle") -> torch.Tensor:  # type: ignore[override]
        ctx.handle = handle
        ctx.rows = x.shape[0]
        x = x.contiguous()
        if _fused(handle):
            out = x.new_empty((handle.size * x.shape[0],) + tuple(x.shape[1:]))
            dist.all_gather_into_tensor(out, x, group=handle.group)
            return out
        parts = [torch.empty_like(x) for _ in range(handle.size)]
        dist.all_gather(parts, x, group=handle.group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        handle: GroupHandle = ctx.handle
        grad = grad.contiguous()
        if _fused(handle):
            out = grad.new_empty((ctx.rows,) + tuple(grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, group=handle.group)
            return out, None
        grad = grad.clone()
        dist.all_reduce(grad, group=handle.group)
        start = handle.rank * ctx.rows
        return grad[start : start + ctx.rows].contiguous(), None


def _fused(handle: "GroupHandle") -> bool:
    """NCCL has the flat all-gather / reduce-scatter; gloo gets the list / all-reduce forms."""
    return dist.get_backend(handle.group) == "nccl"


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` split by ``send`` go to each rank; ``recv`` rows come back from each rank."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], handle: "GroupHandle"
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.handle = send, recv, handle
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=handle.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        handle: GroupHandle = ctx.handle
        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=handle.group)
        return out, None, None, None


class Distributed:
    """:class:`Communicator` over ``torch.distributed`` (the default process group's backend)."""

    name = "distributed"
    alone = False

    def new_group(self, ranks: tuple[int, ...], purpose: str) -> Optional[object]:
        if not dist.is_initialized():
            return None
        return dist.new_group(list(ranks))

    def world_group(self, size: int) -> Optional[object]:
        return dist.group.WORLD if dist.is_initialized() and size > 1 else None

    def warm_up(self, handles: Sequence["GroupHandle"], channels: Sequence[tuple[object, int, bool]],
                device: torch.device) -> None:
        if not dist.is_initialized():
            return
        # Same global order on every rank (a rank skips groups it is not in): no deadlock.
        probe = torch.ones(1, device=device)
        for h in handles:
            if h.active:
                dist.all_reduce(probe, group=h.group)
        for group, peer, sends in channels:  # every channel once, in its direction
            if sends:
                dist.send(probe, dst=peer, group=group)
            else:
                dist.recv(probe, src=peer, group=group)
        dist.barrier()

    def all_gather_rows(self, x: torch.Tensor, handle: "GroupHandle") -> torch.Tensor:
        return _AllGather.apply(x, handle)

    def all_to_all_rows(self, x: torch.Tensor, send: list[int], recv: list[int],
                        handle: "GroupHandle") -> torch.Tensor:
        return _AllToAll.apply(x, send, recv, handle)

    def all_to_all_counts(self, counts: torch.Tensor, handle: "GroupHandle") -> torch.Tensor:
        out = torch.empty_like(counts)
        dist.all_to_all_single(out, counts.contiguous(), group=handle.group)
        return out

    def all_reduce_(self, x: torch.Tensor, handle: "GroupHandle", op: ReduceOp = "sum") -> torch.Tensor:
        dist.all_reduce(x, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN, group=handle.group)
        return x

    def min_int(self, value: int, handle: "GroupHandle") -> int:
        t = torch.tensor([value], dtype=torch.int64)
        if dist.get_backend(handle.group) == "nccl":
            t = t.cuda()
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=handle.group)
        return int(t.item())

    def isend(self, tensor: torch.Tensor, dst: int, group: Optional[object], tag: int) -> Work:
        return dist.isend(tensor, dst=dst, group=group, tag=tag)  # type: ignore[return-value]

    def recv(self, buf: torch.Tensor, src: int, group: Optional[object], tag: int) -> torch.Tensor:
        dist.recv(buf, src=src, group=group, tag=tag)
        return buf


DISTRIBUTED = Distributed()


@dataclass(frozen=True)
class GroupHandle:
    """A process group plus this rank's place in it (``group`` None for a one-rank group) and
    the communicator its calls go through."""

    group: Optional[Any]
    size: int
    rank: int
    ranks: tuple[int, ...]  # global ranks, in group order
    comm: Communicator = field(default=DISTRIBUTED, compare=False, repr=False)

    @property
    def active(self) -> bool:
        return self.size > 1


def all_gather_rows(x: torch.Tensor, handle: Optional[GroupHandle]) -> torch.Tensor:
    if handle is None or not handle.active:
        return x
    return handle.comm.all_gather_rows(x, handle)


def all_to_all_rows(
    x: torch.Tensor, send: list[int], recv: list[int], handle: Optional[GroupHandle]
) -> torch.Tensor:
    if handle is None or not handle.active:
        return x
    return handle.comm.all_to_all_rows(x, send, recv, handle)


def all_to_all_counts(counts: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """Exchange an int64 ``[size * k]`` tensor in equal blocks of ``k`` (no autograd)."""
    return handle.comm.all_to_all_counts(counts, handle)


def all_reduce_(x: torch.Tensor, handle: Optional[GroupHandle], op: ReduceOp = "sum") -> torch.Tensor:
    """In-place reduction over the group (no autograd); identity for a one-rank group."""
    if handle is not None and handle.active:
        handle.comm.all_reduce_(x, handle, op)
    return x


def all_reduce_sum_(x: torch.Tensor, handle: Optional[GroupHandle]) -> torch.Tensor:
    """In-place sum over the group (no autograd); identity for a one-rank group."""
    return all_reduce_(x, handle, "sum")
