"""Packed causal attention without a dense mask equals the old dense-mask computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.workload.attention import attention_plan, packed_causal_attention
from harness.workload.batch import shard_layout


def packed_causal_mask(q_seg, q_pos, k_seg, k_pos):
    """Test-only reference: ``[Tq, Tk]`` mask, same sequence and key position <= query position."""
    return (q_seg[:, None] == k_seg[None, :]) & (k_pos[None, :] <= q_pos[:, None])


def dense_reference(q, k, v, q_seg, q_pos, k_seg, k_pos):
    """The previous implementation: one SDPA call with the explicit mask (math kernel)."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=packed_causal_mask(q_seg, q_pos, k_seg, k_pos),
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)


def cp_layout(lengths, cp, rank):
    """Local (segments, positions) of ``rank`` and the gathered key layout of its CP group."""
    q_seg, q_pos = shard_layout(lengths, cp, rank)
    parts = [shard_layout(lengths, cp, r) for r in range(cp)]
    return q_seg, q_pos, torch.cat([s for s, _ in parts]), torch.cat([p for _, p in parts])


def _compare(
    lengths, cp, rank, heads=4, kv_heads=2, dim=8, seed=0, dtype=torch.float64, tol=None, native_gqa=None
):
    q_seg, q_pos, k_seg, k_pos = cp_layout(lengths, cp, rank)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_seg.numel(), heads, dim, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(k_seg.numel(), kv_heads, dim, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(k_seg.numel(), kv_heads, dim, generator=g, dtype=dtype, requires_grad=True)
    grad = torch.randn(q.shape, generator=g, dtype=dtype)
    plan = attention_plan(q_seg, q_pos, k_seg, k_pos)
    got = packed_causal_attention(q, k, v, plan, native_gqa)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    ref = dense_reference(q, k, v, q_seg, q_pos, k_seg, k_pos)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    kw = {} if tol is None else {"rtol": tol, "atol": tol}
    torch.testing.assert_close(got, ref, **kw)
    for a, b, name in zip(got_grads, ref_grads, ("dq", "dk", "dv")):
        torch.testing.assert_close(a, b, **kw, msg=f"{name} differs from the dense-mask reference")
    return plan


@pytest.mark.parametrize("native_gqa", [False, True])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_equals_dense_mask_for_random_packed_lengths_on_every_cp_rank(cp, native_gqa):
    gen = torch.Generator().manual_seed(cp)
    for trial in range(3):
        n = int(torch.randint(1, 7, (1,), generator=gen))
        lengths = torch.randint(1, 40, (n,), generator=gen).tolist()
        for rank in range(cp):  # rank r holds chunks r and 2cp-1-r: every chunk position
            _compare(lengths, cp, rank, seed=trial, native_gqa=native_gqa)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_equal_lengths_are_batched_into_one_call_per_chunk_shape(cp):
    lengths = [16, 16, 16, 5, 16]
    plan = _compare(lengths, cp, rank=0)
    batched = [g for g in plan.groups if g.batch > 1]
    assert batched and all(g.batch == 4 for g in batched)
    assert len(plan.groups) == (1 if cp == 1 else 2) * 2


def test_mha_without_gqa_and_fp32_tolerance():
    _compare([7, 3, 12], 2, 1, heads=3, kv_heads=3, dtype=torch.float32, tol=1e-5)


def test_single_rank_plan_needs_no_reordering():
    q_seg, q_pos, k_seg, k_pos = cp_layout([5, 9], 1, 0)
    plan = attention_plan(q_seg, q_pos, k_seg, k_pos)
    assert plan.key_order is None and plan.inverse is None


def test_reference_mask_is_block_causal():
    seg = torch.tensor([0, 0, 0, 1, 1])
    pos = torch.tensor([0, 1, 2, 0, 1])
    expect = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(packed_causal_mask(seg, pos, seg, pos), expect)


def test_plan_rejects_incomplete_keys_and_mismatched_inputs():
    q_seg, q_pos, k_seg, k_pos = cp_layout([8, 4], 2, 0)
    with pytest.raises(ValueError, match="exactly once"):
        attention_plan(q_seg, q_pos, k_seg[1:], k_pos[1:])
    with pytest.raises(ValueError, match="no complete key prefix"):
        attention_plan(q_seg, q_pos + 20, k_seg, k_pos)
    plan = attention_plan(q_seg, q_pos, k_seg, k_pos)
    q = torch.zeros(q_seg.numel() + 1, 2, 4)
    k = torch.zeros(k_seg.numel(), 1, 4)
    with pytest.raises(ValueError, match="rebuild it"):
        packed_causal_attention(q, k, k, plan)


def test_deterministic_mode_runs_and_repeats_bitwise():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        q_seg, q_pos, k_seg, k_pos = cp_layout([9, 14, 6], 2, 1)
        plan = attention_plan(q_seg, q_pos, k_seg, k_pos)
        results = []
        for _ in range(2):
            torch.manual_seed(4)
            q = torch.randn(q_seg.numel(), 4, 8, requires_grad=True)
            k = torch.randn(k_seg.numel(), 2, 8, requires_grad=True)
            out = packed_causal_attention(q, k, k, plan)
            out.square().sum().backward()
            results.append((out.detach(), q.grad, k.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)
    finally:
        torch.use_deterministic_algorithms(previous)


# --------------------------------------------------------------------------- GPU
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda_inputs(lengths, cp, rank, heads, kv_heads, dim, dtype):
    q_seg, q_pos, k_seg, k_pos = cp_layout(lengths, cp, rank)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(q_seg.numel(), heads, dim, device=dev, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(k_seg.numel(), kv_heads, dim, device=dev, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(k_seg.numel(), kv_heads, dim, device=dev, dtype=dtype, generator=g, requires_grad=True)
    return (q_seg, q_pos, k_seg, k_pos), (q, k, v)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("cp,rank", [(1, 0), (2, 0), (2, 1), (4, 3)])
def test_cuda_8k_packed_microbatch_memory_stays_far_below_the_score_matrix(cp, rank):
    heads, kv_heads, dim = 32, 4, 128
    # 8192 tokens on this CP rank: long and short sequences, two of equal length.
    lengths = [x * cp for x in (4096, 2048, 1000, 512, 512, 20, 4)]
    layout, (q, k, v) = _cuda_inputs(lengths, cp, rank, heads, kv_heads, dim, torch.bfloat16)
    assert q.shape[0] == 8192
    plan = attention_plan(*layout, device=q.device)
    grad = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = packed_causal_attention(q, k, v, plan)
    out.backward(grad)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    score_matrix = q.shape[0] * k.shape[0] * heads * 4  # fp32 scores of the old dense-mask path
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert extra < 2**30, f"attention fwd+bwd used {extra / 2**20:.0f} MiB over its inputs"
    assert extra < score_matrix / 8


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("native_gqa", [None, False])
@pytest.mark.parametrize("cp,rank", [(1, 0), (2, 1), (4, 0)])
def test_cuda_bf16_matches_the_fp32_math_reference(cp, rank, native_gqa):
    layout, (q, k, v) = _cuda_inputs([300, 64, 64, 17, 640], cp, rank, 8, 2, 128, torch.bfloat16)
    plan = attention_plan(*layout, device=q.device)
    grad = torch.randn_like(q)
    out = packed_causal_attention(q, k, v, plan, native_gqa)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = dense_reference(q32, k32, v32, *(t.cuda() for t in layout))
    want = (ref, *torch.autograd.grad(ref, (q32, k32, v32), grad.float()))
    for a, b, name in zip(got, want, ("out", "dq", "dk", "dv")):
        assert _rel_err(a, b) < 1e-2, f"{name}: relative error {_rel_err(a, b):.2e}"


def test_rows_no_varlen_segment_covers_get_a_zero_gradient():
    from harness.workload.attention import _CoveredRows

    x = torch.randn(6, 2, 3, requires_grad=True)
    cu = torch.tensor([0, 2, 4, 4], dtype=torch.int32)  # rows 4 and 5 are in no segment
    y = _CoveredRows.apply(x, cu)
    assert torch.equal(y, x)
    grad = torch.randn(6, 2, 3)
    grad[4:] = float("nan")  # what flash varlen's backward leaves in rows it never wrote
    y.backward(grad)
    assert torch.equal(x.grad[:4], grad[:4]) and torch.equal(x.grad[4:], torch.zeros(2, 2, 3))
