"""The MoE of static-shape microbatches (CPU): padding left out of the dispatch, the experts'
stacked weights, and the grouped dispatch the static path runs without EP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.workload.ep import dispatch_and_compute, grouped_dispatch
from harness.workload.moe import Experts, MoE, MoEContext

T, H, E, K, FFN = 40, 16, 4, 2, 12


def _experts(seed: int = 0) -> Experts:
    torch.manual_seed(seed)
    ex = Experts(E, H, FFN)
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return ex


def _routing(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    top_i = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    valid = torch.zeros(T, dtype=torch.bool)
    valid[:29] = True  # the static layout's padding rows at the end (CP 1)
    valid[31] = True  # and a real row among them (CP > 1 interleaves padding)
    return x, top_i, weights, valid


def _run(kind: str, ex: Experts, x0: torch.Tensor, top_i: torch.Tensor, w: torch.Tensor,
         valid: torch.Tensor | None, gy: torch.Tensor):
    x = x0.clone().requires_grad_()
    for p in ex.parameters():
        p.grad = None
    if kind == "grouped":
        y = grouped_dispatch(x, top_i, w, ex, E, valid)
    else:
        y = dispatch_and_compute(x, top_i, w, ex, E, None, valid)
    y.backward(gy)
    return y.detach(), x.grad, [p.grad.clone() for p in ex.parameters()]


@pytest.mark.parametrize("kind", ["eager", "grouped"])
def test_leaving_out_padding_equals_the_padded_computation_on_the_real_rows(kind: str) -> None:
    ex = _experts()
    x, top_i, w, valid = _routing()
    gy = torch.randn(T, H, generator=torch.Generator().manual_seed(2))
    gy[~valid] = 0  # the loss masks padding, so no gradient reaches it
    y0, gx0, pg0 = _run(kind, ex, x, top_i, w, None, gy)
    y1, gx1, pg1 = _run(kind, ex, x, top_i, w, valid, gy)
    torch.testing.assert_close(y1[valid], y0[valid], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(gx1[valid], gx0[valid], rtol=1e-6, atol=1e-7)
    for a, b in zip(pg1, pg0):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(y1[~valid], torch.zeros_like(y1[~valid]))  # padding gets 0 ...
    assert torch.equal(gx1[~valid], torch.zeros_like(gx1[~valid]))  # ... and passes no gradient back
    assert y0[~valid].abs().sum() > 0  # (the padded computation does compute those rows)


def test_padding_rows_are_not_given_to_the_experts() -> None:
    ex = _experts()
    x, top_i, w, valid = _routing()
    seen: list[int] = []
    calls = ex.forward

    def counting(rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        seen.append(rows.shape[0])
        return calls(rows, counts)

    dispatch_and_compute(x, top_i, w, counting, E, None, valid)
    dispatch_and_compute(x, top_i, w, counting, E, None, None)
    assert seen == [int(valid.sum()) * K, T * K]


def _select_experts(ex: Experts, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The former per-expert form (``w[e]`` indexed and cast one expert at a time)."""
    outs = []
    for e, rows in enumerate(torch.split(x, counts, dim=0)):
        h = F.silu(rows @ ex.gate[e].to(rows.dtype)) * (rows @ ex.up[e].to(rows.dtype))
        outs.append(h @ ex.down[e].to(rows.dtype))
    return torch.cat(outs, dim=0)


@pytest.mark.parametrize("autocast", [False, True])
def test_experts_with_stacked_weights_equal_the_per_expert_form_bitwise(autocast: bool) -> None:
    ex = _experts(3)
    counts = [11, 0, 17, 6]
    results = []
    for fn in (_select_experts, Experts.forward):
        x = torch.randn(sum(counts), H, generator=torch.Generator().manual_seed(4)).requires_grad_()
        for p in ex.parameters():
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = fn(ex, x, counts)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=y.dtype))
        results.append((y, x.grad, [p.grad for p in ex.parameters()]))
    (y0, g0, p0), (y1, g1, p1) = results
    assert y1.dtype == (torch.bfloat16 if autocast else torch.float32)
    assert torch.equal(y0, y1) and torch.equal(g0, g1)
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))


def test_a_static_microbatch_without_ep_runs_the_grouped_dispatch() -> None:
    torch.manual_seed(6)
    moe = MoE(H, E, K, FFN, aux_loss_coeff=0.1)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x, _, _, valid = _routing()
    outs = {}
    for static in (False, True):
        ctx = MoEContext(valid=valid, unit_tokens=int(valid.sum()), step_tokens=64, cp=None, ep=None,
                         static_shapes=static)
        outs[static] = moe(x, ctx)
        assert len(ctx.aux_sink) == 1
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-5, atol=1e-6)
    logits = F.linear(x, moe.router.weight)
    top_p, top_i = torch.softmax(logits, -1).topk(K, -1)
    ref = grouped_dispatch(x, top_i, top_p / top_p.sum(-1, keepdim=True), moe.experts, E)
    assert torch.equal(outs[True], ref)
