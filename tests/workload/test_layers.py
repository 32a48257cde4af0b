import torch

from harness.workload.attention import Attention, AttentionContext, attention_plan, rope
from harness.workload.ep import dispatch_and_compute
from harness.workload.moe import MoE, MoEContext
from harness.workload.pipeline import _ordered_sum


def _ctx(lengths):
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    return AttentionContext(pos, attention_plan(seg, pos, seg, pos), None)


def test_packed_attention_equals_each_sequence_alone():
    torch.manual_seed(0)
    attn = Attention(32, 4, 2, 8, 10000.0, 1e-6)
    lengths = [5, 9, 3]
    x = torch.randn(sum(lengths), 32)
    packed = attn(x, _ctx(lengths))
    alone = torch.cat([attn(part, _ctx([len(part)])) for part in x.split(lengths)])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-6)
    # Changing the second sequence must not move the first or third one's outputs.
    x2 = x.clone()
    x2[5:14] += 1.0
    out2 = attn(x2, _ctx(lengths))
    torch.testing.assert_close(out2[:5], packed[:5])
    torch.testing.assert_close(out2[14:], packed[14:])
    assert not torch.allclose(out2[5:14], packed[5:14])


def test_rope_is_relative():
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    def score(pq, pk):
        return (rope(q, torch.tensor([pq]), 1e4) * rope(k, torch.tensor([pk]), 1e4)).sum()
    torch.testing.assert_close(score(7, 3), score(14, 10))


def test_dispatch_equals_a_per_token_loop():
    torch.manual_seed(2)
    t, e, k, h = 11, 4, 2, 6
    x = torch.randn(t, h)
    w = torch.randn(e, h, h)
    top_i = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    weights = torch.rand(t, k)

    def experts(rows, counts):
        return torch.cat([r @ w[i] for i, r in enumerate(rows.split(counts))])

    got = dispatch_and_compute(x, top_i, weights, experts, e, None)
    expect = torch.stack([sum(weights[i, j] * (x[i] @ w[top_i[i, j]]) for j in range(k)) for i in range(t)])
    torch.testing.assert_close(got, expect)


def test_aux_loss_value_and_injected_gradient_match_autograd():
    torch.manual_seed(3)
    moe = MoE(16, 4, 2, 16, aux_loss_coeff=0.5)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(10, 16)
    valid = torch.ones(10, dtype=torch.bool)
    valid[-2:] = False  # padding is excluded from the aux loss

    def ctx():
        return MoEContext(valid=valid, unit_tokens=8, step_tokens=16, cp=None, ep=None)

    c = ctx()
    y = moe(x, c)
    y.sum().backward()
    g_injected = moe.router.weight.grad.clone()
    # Reference: explicit aux loss added to the objective.
    moe.zero_grad()
    moe.coeff = 0.0
    c2 = ctx()
    y2 = moe(x, c2)
    probs = torch.softmax(x @ moe.router.weight.T, -1)[:8]
    top = torch.softmax(x @ moe.router.weight.T, -1).topk(2, -1).indices[:8]
    counts = torch.nn.functional.one_hot(top, 4).sum((0, 1)).float()
    aux = 4 / (8 * 8 * 2) * (probs.sum(0) * counts).sum()
    (y2.sum() + 0.5 * (8 / 16) * aux).backward()
    torch.testing.assert_close(moe.router.weight.grad, g_injected)
    torch.testing.assert_close(c.aux_sink[0], aux.detach() * 0.5)


def test_device_sum_of_aux_pieces_equals_the_host_sum_bitwise():
    g = torch.Generator().manual_seed(9)
    pieces = [torch.rand((), generator=g) * 10 ** int(e) for e in torch.randint(-6, 3, (13,), generator=g)]
    host = 0.0
    host += float(sum(p.item() for p in pieces))
    assert float(_ordered_sum(pieces, torch.device("cpu"))) == host
    assert float(_ordered_sum([], torch.device("cpu"))) == 0.0
