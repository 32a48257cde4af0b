"""Token dispatch to experts and combine back, locally or over an expert-parallel group.

Rows are ordered by expert (stable sort of the ``T * k`` (token, expert) pairs), sent to the EP rank
owning the expert with an all-to-all, regrouped by local expert, run through the experts, and
brought back the same way. Every step is a permutation or a split, so the result equals the local
computation row for row; the combine is a gather plus a weighted sum over the ``k`` choices
(deterministic, no scatter-add).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from harness.workload.comm import GroupHandle, all_to_all_counts, all_to_all_rows


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    """The inverse permutation (as a sort, whose result a captured graph can write in place)."""
    return torch.argsort(perm, stable=True)


def _sort_key(top_i: torch.Tensor, num_experts: int, valid: Optional[torch.Tensor]) -> torch.Tensor:
    """The ``T * k`` (token, expert) pairs' expert ids; with ``valid``, a padding token's pairs
    get ``num_experts`` (past every expert), so a stable sort puts them last and no expert's rows
    include them (the real pairs keep their order)."""
    t, k = top_i.shape
    flat = top_i.reshape(-1)
    if valid is None:
        return flat
    return torch.where(valid[:, None].expand(t, k).reshape(-1), flat, num_experts)


def _pad_rows(out: torch.Tensor, rows: int) -> torch.Tensor:
    """``out`` (the real pairs' rows) followed by zero rows up to ``rows``: the padding pairs."""
    if out.shape[0] == rows:
        return out
    return torch.cat([out, out.new_zeros((rows - out.shape[0],) + tuple(out.shape[1:]))])


def dispatch_and_compute(
    x: torch.Tensor,
    top_i: torch.Tensor,
    weights: torch.Tensor,
    experts: Callable[[torch.Tensor, list[int]], torch.Tensor],
    num_experts: int,
    ep: Optional[GroupHandle],
    valid: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``sum_j weights[t, j] * expert_{top_i[t, j]}(x[t])`` for every token ``t``; with ``valid``
    (``[T]`` bool) the tokens outside it (static-shape padding) are not dispatched and get 0. The
    real pairs' counts come from the same host read of the device-side counts the dispatch makes
    anyway (no extra sync)."""
    t, k = top_i.shape
    key = _sort_key(top_i, num_experts, valid)
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=num_experts + (valid is not None))  # per global expert
    if ep is None or not ep.active:
        per = counts.tolist()[:num_experts]
        out = experts(x[order[: sum(per)] // k], per)  # the real pairs' rows, grouped by expert
    else:
        rows = x[order // k]  # [T*k, H], grouped by expert (padding pairs last)
        out = _ep_compute(rows, counts[:num_experts], experts, num_experts, ep)
    unsorted = _pad_rows(out, t * k)[_inverse(order)].view(t, k, -1)
    return (unsorted * weights[:, :, None]).sum(dim=1)


def _ep_compute(
    rows: torch.Tensor,
    counts: torch.Tensor,
    experts: Callable[[torch.Tensor, list[int]], torch.Tensor],
    num_experts: int,
    ep: GroupHandle,
) -> torch.Tensor:
    local = num_experts // ep.size
    recv_counts = all_to_all_counts(counts, ep).view(ep.size, local)  # [source, local expert]
    send = counts.view(ep.size, local).sum(dim=1).tolist()
    recv = recv_counts.sum(dim=1).tolist()
    got = all_to_all_rows(rows[: sum(send)], send, recv, ep)  # rows past the counts: padding  # by source, then by expert within source
    expert_of_row = torch.repeat_interleave(
        torch.arange(local, device=rows.device).repeat(ep.size), recv_counts.reshape(-1)
    )
    regroup = torch.sort(expert_of_row, stable=True).indices
    out_local = experts(got[regroup], recv_counts.sum(dim=0).tolist())
    back = out_local[_inverse(regroup)]
    return all_to_all_rows(back, recv, send, ep)


# ------------------------------------------------------------------ static shapes (no EP)
def _gpu_like(x: torch.Tensor) -> bool:
    """``x`` runs the GPU's path: a CUDA tensor, or a meta tensor (the memory planner runs the
    GPU's path on meta, under CUDA's autocast state: ``harness.memplan.autocast``)."""
    return x.is_cuda or x.is_meta


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``x`` rows grouped by expert (group ``e`` ends at ``offsets[e]``) times ``w[e]``: one
    grouped GEMM over device-side offsets on CUDA in bf16 (capturable), a loop elsewhere. Rows
    past the last offset belong to no group: unspecified on CUDA, zero in the loop. Meta tensors
    (the memory planner's stand-in for the GPU, ``harness.memplan``) take the GPU's path: the loop
    reads the offsets on the host, which meta tensors do not have."""
    if _gpu_like(x) and x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, w.to(x.dtype), offs=offsets)
    ends = offsets.tolist()
    outs, start = [], 0
    for e, end in enumerate(ends):
        outs.append(x[start:end] @ w[e].to(x.dtype))
        start = end
    out = torch.cat(outs, dim=0) if outs else x[:0] @ w[0].to(x.dtype)
    return _pad_rows(out, x.shape[0])


def grouped_dispatch(x: torch.Tensor, top_i: torch.Tensor, weights: torch.Tensor,
                     experts: torch.nn.Module, num_experts: int,
                     valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`dispatch_and_compute` with every shape fixed (``T * k`` rows) and the expert
    boundaries on the device: sorts the (token, expert) pairs by expert, runs SwiGLU experts as
    grouped GEMMs, and combines back (a gather plus a weighted sum; deterministic). With ``valid``
    the padding tokens' pairs sort past the last expert's offset, so no grouped GEMM computes
    them; their rows are masked to 0 on the way in (so no gradient leaves them) and out (so the
    combine gives the padding tokens 0)."""
    t, k = top_i.shape
    key = _sort_key(top_i, num_experts, valid)
    order = torch.sort(key, stable=True).indices
    rows = x[order // k]
    ids = torch.arange(num_experts, device=x.device)
    counts = (key[:, None] == ids).sum(dim=0)
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    dtype = torch.bfloat16 if _gpu_like(x) and torch.is_autocast_enabled("cuda") else x.dtype
    r = rows.to(dtype)
    real = None
    if valid is not None:
        real = (torch.arange(t * k, device=x.device) < offsets[-1])[:, None]
        r = torch.where(real, r, 0.0)
    h = F.silu(grouped_mm(r, experts.gate, offsets)) * grouped_mm(r, experts.up, offsets)
    out = grouped_mm(h, experts.down, offsets)
    if real is not None:
        out = torch.where(real, out, 0.0)
    unsorted = out[_inverse(order)].view(t, k, -1)
    return (unsorted * weights[:, :, None]).sum(dim=1)
