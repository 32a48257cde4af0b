"""Autograd-aware collectives used inside the model (CP all-gather, EP all-to-all).

Each takes an explicit process group; with ``group is None`` (one rank) they are identities, so the
single-rank model runs the same code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupHandle:
    """A process group plus this rank's place in it (``group`` None for a one-rank group)."""

    group: Optional[Any]
    size: int
    rank: int
    ranks: tuple[int, ...]  # global ranks, in group order

    @property
    def active(self) -> bool:
        return self.size > 1


class _AllGather(torch.autograd.Function):
    """Concatenate every rank's equally-sized ``x`` along dim 0; backward sums and slices."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: GroupHandle) -> torch.Tensor:  # type: ignore[override]
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


def _fused(handle: GroupHandle) -> bool:
    """NCCL has the flat all-gather / reduce-scatter; gloo gets the list / all-reduce forms."""
    return dist.get_backend(handle.group) == "nccl"


def all_gather_rows(x: torch.Tensor, handle: Optional[GroupHandle]) -> torch.Tensor:
    if handle is None or not handle.active:
        return x
    return _AllGather.apply(x, handle)


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` split by ``send`` go to each rank; ``recv`` rows come back from each rank."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], handle: GroupHandle
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


def all_to_all_rows(
    x: torch.Tensor, send: list[int], recv: list[int], handle: Optional[GroupHandle]
) -> torch.Tensor:
    if handle is None or not handle.active:
        return x
    return _AllToAll.apply(x, send, recv, handle)


def all_to_all_counts(counts: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
    """Exchange an int64 ``[size * k]`` tensor in equal blocks of ``k`` (no autograd)."""
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=handle.group)
    return out


def all_reduce_sum_(x: torch.Tensor, handle: Optional[GroupHandle]) -> torch.Tensor:
    """In-place sum over the group (no autograd); identity for a one-rank group."""
    if handle is not None and handle.active:
        dist.all_reduce(x, group=handle.group)
    return x
