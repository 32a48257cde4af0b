"""Graph arms on one CUDA GPU: the static kernels against their reference semantics, and a graph
arm against its eager arm, bitwise (deterministic bf16)."""

from __future__ import annotations

import pytest
import torch

from harness.arms import plan_case
from harness.spec.schema import Case
from harness.workload import RankContext, train_arm
from harness.workload.attention import _segment_attention, static_packed_attention
from harness.workload.ep import grouped_dispatch
from harness.workload.static import static_layout

pytestmark = pytest.mark.cuda

MODEL = dict(preset="tiny", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=4,
             experts_per_token=2, moe_ffn=128, vocab=512, rope_theta=1e6, norm_eps=1e-6,
             aux_loss_coeff=1e-2)


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_varlen_static_attention_matches_per_segment_attention(cp):
    dev = _cuda()
    torch.manual_seed(0)
    lengths, t, heads, kv, d = [100, 37, 256, 1, 64], 512, 8, 2, 64
    layouts = [static_layout(lengths, cp, r, t, max_seqs=8) for r in range(cp)]
    q = [torch.randn(t, heads, d, device=dev, dtype=torch.bfloat16) for _ in range(cp)]
    k = torch.randn(cp * t, kv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(cp * t, kv, d, device=dev, dtype=torch.bfloat16)
    for r, lay in enumerate(layouts):
        meta = tuple(m.to(dev) for m in lay.metadata()[1:])
        got = static_packed_attention(q[r], k, v, cp, meta)
        ka, cqa, cka, kb, cqb, ckb = meta
        if cp == 1:
            ref = _segment_attention(q[r].float(), k.float(), v.float(), cqa, cka)
        else:
            half = t // 2
            ref = torch.cat([_segment_attention(q[r][:half].float(), k[ka].float(), v[ka].float(), cqa, cka),
                             _segment_attention(q[r][half:].float(), k[kb].float(), v[kb].float(), cqb, ckb)])
        real = lay.valid.to(dev)
        assert (got.float() - ref)[real].abs().max() < 2e-2


def test_cp2_static_attention_gradients_are_finite_over_a_poisoned_allocator():
    """Flash varlen leaves the dK/dV rows no segment covers uninitialised; with CP 2 the gathered
    keys always have such rows, and their gradients must not reach real keys."""
    dev = _cuda()
    torch.manual_seed(0)
    lengths, t, heads, kv, d = [100, 37, 60], 512, 8, 2, 64
    lay = static_layout(lengths, 2, 0, t, max_seqs=8)
    meta = tuple(m.to(dev) for m in lay.metadata()[1:])
    # cached blocks full of NaN (small and large pool), as a long run leaves them
    poison = [torch.full((n,), float("nan"), device=dev, dtype=torch.bfloat16)
              for n in (2**17, 2**18, 2**19, 2**20, 2**22) for _ in range(8)]
    del poison
    q = torch.randn(t, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2 * t, kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2 * t, kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    out = static_packed_attention(q, k, v, 2, meta)
    out[lay.valid.to(dev)].float().sum().backward()
    for name, g in (("q", q.grad), ("k", k.grad), ("v", v.grad)):
        assert torch.isfinite(g.float()).all(), name


def test_grouped_dispatch_matches_the_per_expert_loop():
    dev = _cuda()
    from torch import nn

    torch.manual_seed(0)
    experts = nn.Module()
    experts.gate = nn.Parameter(torch.randn(4, 256, 128, device=dev) * 0.05)
    experts.up = nn.Parameter(torch.randn(4, 256, 128, device=dev) * 0.05)
    experts.down = nn.Parameter(torch.randn(4, 128, 256, device=dev) * 0.05)
    x = torch.randn(512, 256, device=dev)
    top_i = torch.randint(0, 4, (512, 2), device=dev)
    top_i[:, 1] = (top_i[:, 0] + 1) % 4
    top_i[:300, 0] = 3  # skewed counts
    w = torch.softmax(torch.randn(512, 2, device=dev), -1)
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        got = grouped_dispatch(x, top_i, w, experts, 4)
    ref = torch.zeros(512, 256, device=dev)
    for j in range(2):
        for e in range(4):
            rows = top_i[:, j] == e
            xb = x[rows].bfloat16()
            h = torch.nn.functional.silu(xb @ experts.gate[e].bfloat16()) * (xb @ experts.up[e].bfloat16())
            ref[rows] += (h @ experts.down[e].bfloat16()).float() * w[rows, j:j + 1]
    assert (got.float() - ref).abs().max() < 2e-2


def _graph_case(scope: str) -> Case:
    return Case.model_validate(dict(
        id=f"g-{scope}", name="g", source="<test>", model=MODEL, parallel={},
        train=dict(steps=6, global_batch=8, seq_length=512, lr=1e-3, seed=3, deterministic=True,
                   dtype="bf16", max_seqs_per_microbatch=8, checkpoint_every=0),
        data={"lengths": {"distribution": "lognormal", "min": 16, "max": 512}},
        compare={"graph_vs_eager": {}}, graphs={"scope": scope, "warmup_steps": 2},
        resources={"gpus_per_node": 1, "device": "cuda"},
    ))


@pytest.mark.parametrize("scope", ["attn", "full"])
def test_graph_arm_replays_bitwise_equal_to_its_eager_arm(scope, capsys):
    dev = _cuda()
    case = _graph_case(scope)
    ctx = RankContext(0, 1, 0, str(dev), "none")
    eager, graph = [], []
    plan = plan_case(case)
    train_arm(plan.arm("eager").case, ctx, eager.append)
    train_arm(plan.arm("graph").case, ctx, graph.append)
    printed = capsys.readouterr().out
    assert "1 dynamic-CP variants over 1 slot-aliased physical pool slots" in printed
    assert [r.graphed for r in graph] == [False, False, True, True, True, True]
    assert not any(r.graphed for r in eager)
    stats = graph[2].graph_stats
    assert stats is not None and stats.graphs == 2 * MODEL["layers"] and stats.pool_reserved_bytes > 0
    assert graph[-1].memory_probe is not None and graph[-1].memory_probe.device_used_bytes > 0
    for key in ("loss", "aux_loss", "grad_norm"):
        assert [getattr(r, key) for r in graph] == [getattr(r, key) for r in eager], key
    assert graph[-1].loss < graph[0].loss
