"""GQA self-attention with QK-norm and RoPE over packed variable-length sequences.

A rank holds ``T`` query tokens (its CP shard of a packed microbatch). Keys/values of the whole CP
group are all-gathered (``T * cp`` rows, in CP-rank order). Attention is exact: a query sees a key
iff both belong to the same packed sequence and the key's position is not after the query's.

No ``[Tq, Tk]`` mask or score matrix is built. :func:`attention_plan` turns the token layout into
index groups once per microbatch: the gathered keys are put in (sequence, position) order, and the
local queries are cut into *runs* (consecutive positions of one sequence, e.g. one CP chunk). A run
starting at position ``p0`` with ``n`` queries attends the first ``Lk = p0 + n`` keys of its
sequence with bottom-right aligned causality, so it is one SDPA call with ``is_causal=True`` (when
``p0 == 0``) or ``causal_lower_right(n, Lk)``; runs with the same ``(n, Lk)`` are batched into one
call. On CUDA this lets SDPA use the flash / memory-efficient kernels (memory linear in tokens).
GQA: K/V heads go to SDPA unrepeated (``enable_gqa``) when the flash kernel takes them (CUDA,
fp16/bf16), else they are repeated to the query heads so the memory-efficient kernel still applies.

Determinism (PyTorch's randomness notes, "CUDA Scaled Dot Product Attention"): under
``torch.use_deterministic_algorithms(True)`` (``train.deterministic``) the flash and
memory-efficient forward passes are deterministic and their backward passes run in deterministic
mode; cuDNN attention is excluded. The CPU kernels are deterministic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from harness.workload.comm import GroupHandle, all_gather_rows
from harness.workload.norm import RMSNorm


@dataclass(frozen=True)
class QueryGroup:
    """``batch`` query runs of ``q_len`` tokens, each attending the first ``k_len`` keys of its
    sequence. Rows are given by ``q_rows`` / ``k_rows`` ``[batch, len]`` (local query rows / rows of
    the sorted keys), or, for one contiguous run (``batch == 1``), by ``q_start`` / ``k_start``."""

    q_len: int
    k_len: int
    batch: int
    q_start: int
    k_start: int
    q_rows: torch.Tensor | None
    k_rows: torch.Tensor | None


@dataclass(frozen=True)
class AttentionPlan:
    """How one rank's packed attention is computed for one microbatch (shared by all layers)."""

    num_queries: int
    num_keys: int
    key_order: torch.Tensor | None  # [Tk] gathered row of each sorted key; None: already sorted
    groups: tuple[QueryGroup, ...]
    inverse: torch.Tensor | None  # [Tq] row of the concatenated group outputs; None: identity


@dataclass(frozen=True)
class AttentionContext:
    """Per-microbatch inputs of every attention layer on this rank."""

    positions: torch.Tensor  # [T] int64, position of each local token within its sequence
    plan: AttentionPlan  # from attention_plan(local layout, gathered key layout)
    cp: GroupHandle | None  # the microbatch's CP group (None or size 1: no CP)


def _sorted_keys(
    k_segments: torch.Tensor, k_positions: torch.Tensor
) -> tuple[torch.Tensor, dict[int, tuple[int, int]]]:
    """Order of the keys by (sequence, position) and each sequence's ``(start, length)`` in it."""
    if k_positions.numel() and int(k_positions.min()) < 0:
        raise ValueError("key positions must be >= 0")
    span = int(k_positions.max()) + 1 if k_positions.numel() else 1
    order = torch.argsort(k_segments * span + k_positions, stable=True)
    segs = k_segments[order]
    ids, counts = torch.unique_consecutive(segs, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    expect = torch.arange(segs.numel()) - torch.repeat_interleave(starts, counts)
    if not torch.equal(k_positions[order], expect):
        raise ValueError(
            "the gathered keys must hold every position 0..L-1 of each sequence exactly once; "
            "build the key layout from the same shard_layout as the queries"
        )
    spans = {int(s): (int(a), int(n)) for s, a, n in zip(ids.tolist(), starts.tolist(), counts.tolist())}
    return order, spans


def _query_runs(q_segments: torch.Tensor, q_positions: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """``(row, length, segment, first position)`` of each run of consecutive positions."""
    t = q_segments.numel()
    if t == 0:
        return []
    brk = torch.ones(t, dtype=torch.bool)
    brk[1:] = (q_segments[1:] != q_segments[:-1]) | (q_positions[1:] != q_positions[:-1] + 1)
    starts = torch.nonzero(brk).flatten()
    lengths = torch.diff(starts, append=torch.tensor([t]))
    return list(
        zip(starts.tolist(), lengths.tolist(), q_segments[starts].tolist(), q_positions[starts].tolist())
    )


def causal_work(segments: torch.Tensor, positions: torch.Tensor) -> int:
    """The query-key pairs causal attention computes for queries ``(segments, positions)`` (rows
    with a negative segment are padding of a static buffer, not queries): a query at position
    ``p`` of its sequence sees ``p + 1`` keys, so a run of ``n`` queries from ``p0`` costs
    ``n * p0 + n (n + 1) / 2``. The measure ``<arm>.cp_balance`` compares across a CP group."""
    keep = segments.cpu() >= 0
    total = 0
    for _, n, _, p0 in _query_runs(segments.cpu()[keep], positions.cpu()[keep]):
        total += n * p0 + n * (n + 1) // 2
    return total


def attention_plan(
    q_segments: torch.Tensor,
    q_positions: torch.Tensor,
    k_segments: torch.Tensor,
    k_positions: torch.Tensor,
    device: torch.device | None = None,
) -> AttentionPlan:
    """The plan for local queries ``(q_segments, q_positions)`` ``[Tq]`` over gathered keys
    ``(k_segments, k_positions)`` ``[Tk]`` (sequence ordinal and position of each row); the index
    tensors are put on ``device``. Every sequence's keys must be complete (positions 0..L-1)."""
    qs, qp = q_segments.cpu(), q_positions.cpu()
    order, spans = _sorted_keys(k_segments.cpu(), k_positions.cpu())
    by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for row, n, seg, p0 in _query_runs(qs, qp):
        if seg not in spans or p0 + n > spans[seg][1]:
            raise ValueError(
                f"queries of sequence {seg} at positions {p0}..{p0 + n - 1} have no complete key "
                f"prefix (keys hold {spans.get(seg, (0, 0))[1]} positions of it)"
            )
        by_shape.setdefault((n, p0 + n), []).append((row, spans[seg][0]))
    groups, q_order = [], []
    for (n, lk), runs in by_shape.items():
        q_rows = torch.tensor([r for r, _ in runs])[:, None] + torch.arange(n)
        q_order.append(q_rows.flatten())
        if len(runs) == 1:
            groups.append(QueryGroup(n, lk, 1, runs[0][0], runs[0][1], None, None))
            continue
        k_rows = torch.tensor([k for _, k in runs])[:, None] + torch.arange(lk)
        groups.append(QueryGroup(n, lk, len(runs), 0, 0, q_rows.to(device), k_rows.to(device)))
    tq = int(qs.numel())
    inverse: torch.Tensor | None = None
    if q_order:
        perm = torch.cat(q_order)
        if not torch.equal(perm, torch.arange(tq)):
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(tq)
            inverse = inverse.to(device)
    key_order = None if torch.equal(order, torch.arange(order.numel())) else order.to(device)
    return AttentionPlan(tq, int(k_segments.numel()), key_order, tuple(groups), inverse)


def _flash_takes_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the CUDA flash kernel runs ``[B, H, L, D]`` inputs with fewer K/V heads.

    Only flash (and cuDNN) take GQA natively; the memory-efficient kernel needs equal head counts,
    and ``causal_lower_right`` reaches only flash or memory-efficient (else it materialises the
    mask), so K/V heads are repeated whenever flash is out (CPU, fp32, unsupported head dim)."""
    if not q.is_cuda:
        return False
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, True)
    return bool(torch.backends.cuda.can_use_flash_attention(params))


def packed_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: AttentionPlan,
    native_gqa: bool | None = None,
) -> torch.Tensor:
    """Exact packed causal attention: ``q`` ``[Tq, H, D]``, gathered ``k``/``v`` ``[Tk, Hkv, D]``
    (``H`` a multiple of ``Hkv``; query head ``h`` uses key head ``h // (H / Hkv)``) -> ``[Tq, H, D]``.

    ``native_gqa``: pass the K/V heads to SDPA with ``enable_gqa`` (True) or repeat them first
    (False); None picks native GQA exactly when the CUDA flash kernel accepts it."""
    if q.shape[0] != plan.num_queries or k.shape[0] != plan.num_keys or v.shape[0] != plan.num_keys:
        raise ValueError(
            f"attention got {q.shape[0]} queries / {k.shape[0]} keys, but the plan was built for "
            f"{plan.num_queries} / {plan.num_keys}; rebuild it from this microbatch's layout"
        )
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    if not plan.groups:
        return q.new_zeros(q.shape)
    rep = heads // kv_heads
    if plan.key_order is not None:
        k, v = k[plan.key_order], v[plan.key_order]
    outs = []
    for g in plan.groups:
        if g.q_rows is None:
            qg = q[g.q_start : g.q_start + g.q_len].unsqueeze(0)
            kg = k[g.k_start : g.k_start + g.k_len].unsqueeze(0)
            vg = v[g.k_start : g.k_start + g.k_len].unsqueeze(0)
        else:
            qg, kg, vg = q[g.q_rows], k[g.k_rows], v[g.k_rows]
        qg, kg, vg = qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2)  # [B, h, L, D]
        if rep > 1 and native_gqa is None:
            native_gqa = _flash_takes_gqa(qg, kg, vg)
        gqa = rep > 1 and bool(native_gqa)
        if rep > 1 and not gqa:
            kg, vg = kg.repeat_interleave(rep, dim=1), vg.repeat_interleave(rep, dim=1)
        if g.q_len == g.k_len:
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=gqa)
        else:
            mask = causal_lower_right(g.q_len, g.k_len)
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, enable_gqa=gqa)
        outs.append(o.transpose(1, 2).reshape(g.batch * g.q_len, heads, q.shape[2]))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out if plan.inverse is None else out[plan.inverse]


# ------------------------------------------------------------------ static shapes (graph cases)
@functools.cache
def _varlen_takes_gqa() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - torch < 2.10
        return False
    import inspect

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                       cu_k: torch.Tensor) -> torch.Tensor:
    """The semantics of flash varlen with bottom-right causality, one SDPA call per segment
    (reads the offsets on the host: the CPU / fp32 implementation; never captured)."""
    heads, kv = q.shape[1], k.shape[1]
    rep = heads // kv
    out = q.new_zeros(q.shape)
    qo, ko = cu_q.tolist(), cu_k.tolist()
    for i in range(len(qo) - 1):
        q0, q1, k0, k1 = qo[i], qo[i + 1], ko[i], ko[i + 1]
        if q1 == q0:
            continue
        qg = q[q0:q1].transpose(0, 1).unsqueeze(0)
        kg = k[k0:k1].transpose(0, 1).unsqueeze(0)
        vg = v[k0:k1].transpose(0, 1).unsqueeze(0)
        if rep > 1:
            kg, vg = kg.repeat_interleave(rep, dim=1), vg.repeat_interleave(rep, dim=1)
        n, lk = q1 - q0, k1 - k0
        if n == lk:
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=causal_lower_right(n, lk))
        out[q0:q1] = o.squeeze(0).transpose(0, 1)
    return out


class _CoveredRows(torch.autograd.Function):
    """Identity on ``x``; backward zeroes the gradient of the rows at or after ``cu[-1]``.

    Flash varlen's backward allocates dQ/dK/dV with ``empty`` and writes only the rows its
    segments cover; the rest stay uninitialised (NaN or stale values). With CP > 1 the gathered
    keys of a call (``c*T`` rows) are never all covered, and those rows' gradients flow back into
    real keys through the gather (measured on an H200: non-finite gradient norms from the first
    CP2 microbatch, and eager runs that differ run to run)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(cu)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (cu,) = ctx.saved_tensors
        rows = torch.arange(grad.shape[0], device=grad.device)
        keep = (rows < cu[-1]).view((-1,) + (1,) * (grad.dim() - 1))
        return torch.where(keep, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)), None


def varlen_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                  cu_k: torch.Tensor, max_q: int, max_k: int,
                  native_gqa: bool | None = None) -> torch.Tensor:
    """Causal (bottom-right aligned) attention of the query segments ``cu_q`` over the key
    segments ``cu_k``: flash varlen on CUDA in fp16/bf16 (offsets read on the device: capturable),
    one SDPA call per segment elsewhere. ``q`` ``[Tq, H, D]``, ``k``/``v`` ``[Tk, Hkv, D]``.
    ``native_gqa``: hand fewer K/V heads to varlen (None: exactly when this torch's varlen takes
    them; the memory planner sets it to plan for another torch's path)."""
    # meta tensors stand for the GPU (harness.memplan plans memory on them): the flash path
    if (q.is_cuda or q.is_meta) and q.dtype in (torch.float16, torch.bfloat16):
        from torch.nn.attention.varlen import varlen_attn

        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            k, v = _CoveredRows.apply(k, cu_k), _CoveredRows.apply(v, cu_k)
        heads, kv = q.shape[1], k.shape[1]
        native = _varlen_takes_gqa() if native_gqa is None else native_gqa
        if heads != kv and not native:
            k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        extra = {"enable_gqa": True} if heads != kv and native else {}
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0), **extra)
    return _segment_attention(q, k, v, cu_q, cu_k)


def static_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp_size: int,
                            meta: tuple[torch.Tensor, ...],
                            native_gqa: bool | None = None) -> torch.Tensor:
    """Exact packed causal attention over a static layout (``harness.workload.static``): local
    queries ``q`` ``[T, H, D]``, all-gathered ``k``/``v`` ``[cp*T, Hkv, D]``; ``meta`` is
    ``StaticLayout.metadata()`` without positions (k_index, cu_q, cu_k of call A, then of B)."""
    t = q.shape[0]
    ka, cqa, cka, kb, cqb, ckb = meta
    if cp_size == 1:
        return varlen_causal(q, k, v, cqa, cka, t, t, native_gqa)
    half, cap = t // 2, cp_size * t
    out_a = varlen_causal(q[:half], k[ka], v[ka], cqa, cka, half, cap, native_gqa)
    out_b = varlen_causal(q[half:], k[kb], v[kb], cqb, ckb, half, cap, native_gqa)
    return torch.cat([out_a, out_b])


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` ``[T, heads, head_dim]`` at ``positions``."""
    dim = x.shape[-1]
    half = dim // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, half]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1)[:, None, :]
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float, eps: float
    ) -> None:
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, rope_theta
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        # flash varlen with fewer K/V heads (None: when this torch's varlen takes them); the
        # memory planner sets it to plan for the torch of the machine a case runs on
        self.varlen_gqa: bool | None = None

    def forward_static(self, x: torch.Tensor, meta: tuple[torch.Tensor, ...],
                       cp: GroupHandle | None) -> torch.Tensor:
        """Attention over a static layout: ``meta`` = ``StaticLayout.metadata()`` as device
        tensors (positions first); the K/V all-gather runs on ``cp`` (inside a graph: the variant's
        communicator)."""
        t = x.shape[0]
        positions = meta[0]
        q = self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        q = rope(q, positions, self.theta)
        k = rope(k, positions, self.theta)
        k = all_gather_rows(k, cp)
        v = all_gather_rows(v, cp)
        out = static_packed_attention(q, k, v, cp.size if cp is not None else 1, meta[1:],
                                      self.varlen_gqa)
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        q = rope(q, ctx.positions, self.theta)
        k = rope(k, ctx.positions, self.theta)
        k = all_gather_rows(k, ctx.cp)
        v = all_gather_rows(v, ctx.cp)
        out = packed_causal_attention(q, k, v, ctx.plan)  # [T, H, D]
        return self.o_proj(out.reshape(t, self.heads * self.head_dim))
