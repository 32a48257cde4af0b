"""Graph arms without a GPU: per-rank plans, graph selection, group checks, static layouts."""

from __future__ import annotations

import pytest
import torch

from harness.results import FrameReplays, GraphStats
from harness.spec.schema import GraphScope
from harness.workload.attention import static_packed_attention
from harness.workload.comm import GroupHandle
from harness.workload.graphed import LayerGraphs
from harness.graphplan.layout import GraphLayout, rank_plans, reachable_microbatch_counts
from harness.workload.static import StaticLayoutError, static_layout

STATS = GraphStats("s", 2, 4, 8, 1, 1, 1, 1, 1, 0.0, 0.0, 0, 0)


def test_every_pp_rank_plans_its_own_order_over_every_reachable_count():
    counts = reachable_microbatch_counts(2, 2, 2, 16)
    assert counts == tuple(range(2, 17, 2))  # PP2 x VPP2, group 2: the last group must fill PP
    assert reachable_microbatch_counts(2, 2, 3, 16) == (3, 5, 6, 8, 9, 11, 12, 14, 15)
    plans = [rank_plans(GraphLayout(2, 2, 2, r, (1, 1), (1, 2), counts), separate=False)
             for r in range(2)]
    (p0,), (p1,) = plans
    assert p0.order != p1.order  # the warmup count differs by PP rank
    assert p0.physical_slots == p1.physical_slots  # one ring for every rank
    assert p0.cp_sizes == (1, 2)
    assert {r.variant for r in p0.records} == {0, 1}
    # separate pools: one single-variant plan per CP size, same ring
    sep = rank_plans(GraphLayout(2, 2, 2, 0, (1, 1), (1, 2), counts), separate=True)
    assert [p.cp_sizes for p in sep] == [(1,), (2,)]
    assert all(p.physical_slots == p0.physical_slots for p in sep)


def test_headline_layout_needs_eight_slots():
    counts = reachable_microbatch_counts(4, 4, 4, 64)
    (plan,) = rank_plans(GraphLayout(4, 4, 4, 0, (3, 3, 3, 3), (1, 2), counts), separate=False)
    assert plan.physical_slots == 8


class FakeGraphs:
    def __init__(self):
        self.calls = []

    def layer(self, chunk, layer):
        return lambda *inputs, cp_size, microbatch: self.calls.append((chunk, layer, cp_size, microbatch))

    def close(self):
        self.calls.append("closed")


def test_replay_selects_by_cp_size_and_checks_the_group():
    g1, g2 = GroupHandle(None, 1, 0, (0,)), GroupHandle(object(), 2, 0, (0, 1))
    shared = FakeGraphs()
    graphs = LayerGraphs({1: shared, 2: shared}, {1: g1, 2: g2}, (4, 6), STATS)
    graphs.call(0, 1, (), 2, 5, g2)
    assert shared.calls == [(0, 1, 2, 5)]
    with pytest.raises(RuntimeError, match="captured on group"):
        graphs.call(0, 1, (), 2, 5, GroupHandle(object(), 2, 0, (0, 1)))  # another communicator
    with pytest.raises(RuntimeError, match="no graphs for CP size 4"):
        graphs.call(0, 0, (), 4, 0, g2)
    graphs.call(0, 0, (), 2, 1, g2)
    graphs.call(0, 1, (), 1, 1, g1)
    # replays per (CP size, slot): slot = microbatch % the ring's 4 physical slots
    assert graphs.take_replays() == (FrameReplays(1, 1, 1), FrameReplays(2, 1, 2))
    assert graphs.take_replays() == ()  # counted per step
    graphs.check_step(6)
    with pytest.raises(RuntimeError, match="planned for"):
        graphs.check_step(5)
    graphs.close()
    assert shared.calls[-1] == "closed" and shared.calls.count("closed") == 1


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_static_layouts_cover_every_position_once_and_attention_is_exact(cp):
    torch.manual_seed(0)
    lengths, t = [5, 12, 3, 9], 32
    layouts = [static_layout(lengths, cp, r, t, max_seqs=6) for r in range(cp)]
    seen = {(int(s), int(p)) for lay in layouts for s, p in zip(lay.segments, lay.positions)
            if s >= 0 and p < lengths[s]}
    assert seen == {(i, p) for i, n in enumerate(lengths) for p in range(n)}
    # attention over the static layout equals per-sequence causal attention
    heads, kv, d = 4, 2, 8
    per_seq = [torch.randn(n + 2 * cp * 2, heads + 2 * kv, d) for n in lengths]  # ample rows

    def rows(lay):
        out = torch.zeros(t, heads + 2 * kv, d)
        for j in range(t):
            s, p = int(lay.segments[j]), int(lay.positions[j])
            if s >= 0:
                out[j] = per_seq[s][p]
        return out

    local = [rows(lay) for lay in layouts]
    k_all = torch.cat([x[:, heads:heads + kv] for x in local])
    v_all = torch.cat([x[:, heads + kv:] for x in local])
    for lay, x in zip(layouts, local):
        out = static_packed_attention(x[:, :heads], k_all, v_all, cp, lay.metadata()[1:])
        for j in range(t):
            s, p = int(lay.segments[j]), int(lay.positions[j])
            if s < 0 or p >= lengths[s]:
                continue
            q = per_seq[s][p, :heads]
            k = per_seq[s][: p + 1, heads:heads + kv].repeat_interleave(heads // kv, dim=1)
            v = per_seq[s][: p + 1, heads + kv:].repeat_interleave(heads // kv, dim=1)
            att = torch.softmax((k * q).sum(-1) / d ** 0.5, dim=0)  # [p+1, heads]
            ref = (att[:, :, None] * v).sum(0)
            assert torch.allclose(out[j], ref, atol=1e-5), (cp, j)


def test_static_layout_refuses_what_does_not_fit():
    with pytest.raises(StaticLayoutError, match="max_seqs_per_microbatch"):
        static_layout([4] * 5, 1, 0, 32, max_seqs=4)
    with pytest.raises(StaticLayoutError, match="static buffer has 16"):
        static_layout([20], 1, 0, 16, max_seqs=4)
    with pytest.raises(StaticLayoutError, match="static buffer has 8"):
        static_layout([17], 2, 0, 8, max_seqs=4)  # padded to 20 -> 10 per rank


@pytest.mark.parametrize("scope", list(GraphScope))
def test_capture_samples_of_every_cp_variant_have_one_signature(scope):
    """The core requires the CP variants of a slot to take the same tensor count, ranks, dtypes
    and requires_grad (shapes may differ): CP 1 has no call B but keeps its placeholders."""
    from harness.workload.graphed import sample_inputs

    sigs = []
    for cp in (1, 2, 4):
        args = sample_inputs(scope, cp, cp - 1, 32, 16, 4, 4, 2, torch.device("cpu"), seed=1)
        sigs.append(tuple((t.dim(), t.dtype, t.requires_grad) for t in args))
        assert args[0].shape == (32, 16) and args[0].requires_grad
    assert len(set(sigs)) == 1
