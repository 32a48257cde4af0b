"""Loopback communicator: one process stands in for rank ``r`` of an ``N``-rank layout.

Emulated ranks (``emulate.py``) run the real layout, groups (handles with the real global ranks and
sizes), data shard, schedule, slot plan, capture and replay; only the values other ranks would send
are stood in for, locally. Every call keeps the real call's shapes and dtypes, runs on the device
without a host synchronisation the real call does not have, can be captured in a CUDA graph, and
fills its outputs with deterministic finite values:

* **all-gather** (CP K/V): every peer holds what this rank holds, so the output is the local rows
  repeated ``size`` times; backward is its exact adjoint (the sum of the ``size`` row blocks), the
  real reduce-scatter's shape.
* **all-to-all** (EP dispatch and combine): every peer routed like this rank. The counts exchange
  gives this rank's own counts from every peer; row block ``s`` of the output is the block this
  rank sends to itself (truncated or zero-padded to the block's length when the lengths differ,
  which happens only on the combine trip's blocks of other ranks); backward is the exact adjoint.
* **reductions** (DP / expert-DP gradients, norms, loss and aux sums, the resume step) leave the
  local value; the real call's tensors (e.g. the flat gradient bucket) are still built, so memory
  and time are the real path's.
* **pipeline**: a send completes at once; a receive fills its buffer from a fixed bank of
  ``BANK_ROWS`` rows drawn once per (row shape, dtype, device, kind) from a seeded generator, rows
  chosen by the message tag (so a message's values do not depend on the order of the calls, and a
  graph arm receives exactly what its eager arm does). Activations are drawn at unit scale (hidden
  states), input gradients at ``GRAD_SCALE`` (a loss averaged over ~1e5 tokens).

No NCCL or gloo communicator is created and ``torch.distributed`` is never initialised. Values are
not the model's: losses and gradient norms of an emulated rank are its local figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from harness.workload.comm import GroupHandle, ReduceOp, Work

BACKEND = "loopback"
BANK_ROWS = 1021  # prime: a tag's rows start anywhere in the bank
GRAD_SCALE = 1e-5
_SCALES = {"act": 1.0, "grad": GRAD_SCALE}


@dataclass(frozen=True)
class LoopbackGroup:
    """The stand-in of a process group: its global ranks and what it is for."""

    ranks: tuple[int, ...]
    purpose: str

    @property
    def kind(self) -> str:
        """``act`` or ``grad`` for a pipeline channel (its purpose's last word), else ``act``."""
        last = self.purpose.rsplit(" ", 1)[-1]
        return last if last in _SCALES else "act"


class _Sent:
    """A loopback send: complete as soon as it is issued."""

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True


def _fit(rows: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` rows of ``rows``, zero-padded when it has fewer."""
    have = rows.shape[0]
    if have >= n:
        return rows[:n]
    return torch.cat([rows, rows.new_zeros((n - have,) + tuple(rows.shape[1:]))], dim=0)


class _Gather(torch.autograd.Function):
    """``x`` repeated ``size`` times along dim 0; backward sums the ``size`` row blocks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, size: int) -> torch.Tensor:  # type: ignore[override]
        ctx.size = size
        return x.repeat((size,) + (1,) * (x.dim() - 1))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        rows = grad.shape[0] // ctx.size
        return grad.reshape((ctx.size, rows) + tuple(grad.shape[1:])).sum(dim=0), None


def own_block(x: torch.Tensor, send: Sequence[int], me: int) -> torch.Tensor:
    """The rows of ``x`` that a rank at group position ``me`` sends to itself."""
    start = sum(send[:me])
    return x[start : start + send[me]]


class _Exchange(torch.autograd.Function):
    """Output block ``s`` (``recv[s]`` rows) = the block this rank sends itself, fitted."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], me: int) -> torch.Tensor:  # type: ignore[override]
        ctx.send, ctx.recv, ctx.me = list(send), list(recv), me
        own = own_block(x, send, me)
        if all(n == own.shape[0] for n in recv):
            return own.repeat((len(recv),) + (1,) * (x.dim() - 1))
        return torch.cat([_fit(own, n) for n in recv], dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        send, recv, me = ctx.send, ctx.recv, ctx.me
        rows = send[me]
        pieces = grad.split(recv, dim=0)
        acc = _fit(pieces[0], rows)
        for piece in pieces[1:]:  # fixed order: deterministic
            acc = acc + _fit(piece, rows)
        out = grad.new_zeros((sum(send),) + tuple(grad.shape[1:]))
        start = sum(send[:me])
        out[start : start + rows] = acc
        return out, None, None, None


class Loopback:
    """:class:`~harness.workload.comm.Communicator` for an emulated rank (module docstring).
    ``seed`` keys the pipeline receive bank (the case's ``train.seed``)."""

    name = BACKEND
    alone = True  # peers contribute nothing to a sum: counted-once figures are counted here

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._banks: dict[tuple[Any, ...], torch.Tensor] = {}

    # -- groups
    def new_group(self, ranks: tuple[int, ...], purpose: str) -> Optional[object]:
        return LoopbackGroup(tuple(ranks), purpose)

    def world_group(self, size: int) -> Optional[object]:
        return LoopbackGroup(tuple(range(size)), "world") if size > 1 else None

    def warm_up(self, handles: Sequence[GroupHandle], channels: Sequence[tuple[object, int, bool]],
                device: torch.device) -> None:
        """Nothing to connect; checks that every group is a loopback group."""
        for h in handles:
            if h.active and not isinstance(h.group, LoopbackGroup):
                raise RuntimeError(f"group {h.ranks} of an emulated rank is not a loopback group")

    # -- collectives
    def all_gather_rows(self, x: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
        return _Gather.apply(x, handle.size)

    def all_to_all_rows(self, x: torch.Tensor, send: list[int], recv: list[int],
                        handle: GroupHandle) -> torch.Tensor:
        return _Exchange.apply(x, send, recv, handle.rank)

    def all_to_all_counts(self, counts: torch.Tensor, handle: GroupHandle) -> torch.Tensor:
        mine = counts.reshape(handle.size, -1)[handle.rank]
        return mine.repeat(handle.size)

    def all_reduce_(self, x: torch.Tensor, handle: GroupHandle, op: ReduceOp = "sum") -> torch.Tensor:
        return x

    def min_int(self, value: int, handle: GroupHandle) -> int:
        return int(value)

    # -- pipeline
    def isend(self, tensor: torch.Tensor, dst: int, group: Optional[object], tag: int) -> Work:
        return _Sent()

    def recv(self, buf: torch.Tensor, src: int, group: Optional[object], tag: int) -> torch.Tensor:
        kind = group.kind if isinstance(group, LoopbackGroup) else "act"
        n = buf.shape[0]
        flat = buf.view(n, -1)
        bank = self.bank(tuple(flat.shape[1:]), buf.dtype, buf.device, kind)
        start = (int(tag) * 2654435761) % BANK_ROWS
        rows = torch.arange(n, device=buf.device).add_(start).remainder_(BANK_ROWS)
        torch.index_select(bank, 0, rows, out=flat)
        return buf

    def bank(self, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
             kind: str) -> torch.Tensor:
        """The receive bank for rows of ``row_shape`` (drawn on first use, on the device)."""
        key = (row_shape, dtype, str(device), kind)
        if key not in self._banks:
            g = torch.Generator(device=device)
            g.manual_seed((self.seed * 1_000_003 + (1 if kind == "grad" else 0)) % (2**61 - 1))
            draw = torch.randn((BANK_ROWS,) + row_shape, generator=g, device=device, dtype=torch.float32)
            self._banks[key] = (draw * _SCALES[kind]).to(dtype)
        return self._banks[key]
