"""Emulated ranks on the CPU: each rank of a layout, run alone on the loopback communicator, gets
the place, groups, data shard, packing and CP choice the real multi-rank (gloo) run gives it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from harness.errors import ConfigError
from harness.spec.places import stage_ranks
from harness.spec.schema import Case
from harness.workload.emulate import WeightCache, emulate_rank, emulated_context, rank_place
from harness.workload.model import build_chunks

from tests.workload.factories import eager_arm, make_case
from tests.workload.spawn import job_case, run_spawned

PARALLEL = {"pp": 2, "vpp": 2, "dynamic_cp": [1, 2], "ep": 2}
TRAIN = dict(steps=2, global_batch=8, seq_length=64, max_seqlen_per_rank=32, lr=3e-3)


def _case(static: bool) -> Case:
    case = make_case(world=4, parallel=PARALLEL, train=TRAIN)
    return job_case(case.model_dump(mode="json"),
                    {"static": {"scope": "attn", "max_seqs": 16}} if static else {})


def trace(ctx, case_json: dict) -> dict:
    """Train ``case_json`` on ``ctx`` (a real or an emulated rank) and report what this rank got:
    its groups, each microbatch's token shard (sums of ids, targets, real tokens) and its records."""
    import harness.workload.train as train

    case = Case.model_validate(case_json)
    seen: dict = {"inputs": [], "groups": None}
    setup, make_input = train._setup, train._microbatch_input

    def traced_setup(*a, **k):
        s = setup(*a, **k)
        g = s.groups
        seen["groups"] = {
            "pp_rank": g.pp_rank, "pool_rank": g.pool_rank,
            "pp": list(g.pp.ranks), "pool": list(g.pool.ranks), "ep": list(g.ep.ranks),
            "ep_rank": g.ep.rank, "expert_dp": list(g.expert_dp.ranks),
            "cp": {str(c): [list(h.ranks), h.rank] for c, h in g.cp.items()},
            "p2p": sorted("%d-%d-%s" % key for key in g.p2p),
            "layers": [list(c.layer_ids) for c in s.chunks],
        }
        return s

    def traced_input(case_, plan, m, *rest):  # rest: the setup, table, slot, attention work
        mb = make_input(case_, plan, m, *rest)
        seen["inputs"].append([plan.step, m, int(mb.inputs.sum()), int(mb.targets.sum()),
                               int(mb.valid.sum()), int(mb.inputs.numel())])
        return mb

    train._setup, train._microbatch_input = traced_setup, traced_input
    records: list = []
    try:
        train.train_arm(eager_arm(case), ctx, records.append)
    finally:
        train._setup, train._microbatch_input = setup, make_input
    seen["records"] = [[r.step, r.microbatches, list(r.cp_sizes), r.tokens, r.nan, r.skipped,
                        math.isfinite(r.loss) and math.isfinite(r.grad_norm)] for r in records]
    return seen


def traces(ctx, cases: list[dict]) -> list[dict]:
    return [trace(ctx, c) for c in cases]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Each rank's traces from the real 4-rank gloo run (one spawn): eager, static shapes."""
    cases = [_case(static).model_dump(mode="json") for static in (False, True)]
    per_rank = run_spawned(4, traces, (cases,), tmp_path_factory.mktemp("real"))
    return {static: [per_rank[r][i] for r in range(4)] for i, static in enumerate((False, True))}


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_an_emulated_rank_gets_what_the_real_run_gives_that_rank(real, static):
    case = _case(static)
    for rank in range(4):
        got = trace(emulated_context(case, rank, "cpu"), case.model_dump(mode="json"))
        want = real[static][rank]
        assert got["groups"] == want["groups"], f"rank {rank}"
        assert got["inputs"] == want["inputs"], f"rank {rank}"
        # same microbatches and CP choice; losses are local figures, but finite
        assert [r[:4] for r in got["records"]] == [r[:4] for r in want["records"]], f"rank {rank}"
        assert all(r[4:] == [False, False, True] for r in got["records"])
    assert not dist.is_initialized()


def test_rank_place_names_the_stage_and_refuses_ranks_outside_the_world():
    case = make_case(world=16, parallel={"pp": 4, "vpp": 2, "dynamic_cp": [1, 2, 4], "ep": 2},
                     model={"layers": 8}, train=dict(TRAIN, max_seqlen_per_rank=16))
    place = rank_place(case, 14)
    assert (place.pp_rank, place.pool_rank, place.ep_rank) == (3, 2, 0)
    assert place.last_stage and not place.first_stage
    assert place.cp_blocks == ((1, (14,)), (2, (14, 15)), (4, (12, 13, 14, 15)))
    assert place.label() == "emulated rank 14 of 16 (PP stage 3 of 4, pool rank 2)"
    assert stage_ranks(case) == (0, 15) and rank_place(case, 0).first_stage
    with pytest.raises(ConfigError, match="rank 16 is not in its world of 16 ranks"):
        emulated_context(case, 16, "cpu")


def test_the_weight_cache_gives_bitwise_the_weights_of_build_chunks():
    case = make_case(world=4, parallel=PARALLEL, train=TRAIN)
    cache = WeightCache(threads=2)
    for pp_rank, ep_rank in ((0, 1), (1, 0)):
        args = (case.model, case.train.seed, 2, 2, pp_rank, 2, ep_rank)
        ref = build_chunks(*args)
        for _ in range(2):  # a second build is fresh tensors with the same values
            got = cache.build(*args)
            assert len(got) == len(ref)
            for a, b in zip(got, ref):
                sa, sb = a.state_dict(), b.state_dict()
                assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
                assert (a.first, a.last, a.index, list(a.layer_ids)) == (b.first, b.last, b.index, list(b.layer_ids))
        assert got[0].state_dict()["layers.0.attn.q_proj.weight"].data_ptr() != \
            cache.build(*args)[0].state_dict()["layers.0.attn.q_proj.weight"].data_ptr()


def test_emulate_rank_runs_without_a_process_group():
    case = _case(static=True)
    records: list = []
    out = emulate_rank(eager_arm(case), 3, records.append, device="cpu", weights=WeightCache(threads=1), sites=True)
    assert out.sites is None  # sites need CUDA
    assert [r.step for r in records] == [1, 2] and not any(r.nan or r.skipped for r in records)
    assert all(r.replays == () for r in records)  # an eager arm replays nothing
    assert not dist.is_initialized()


def test_an_emulated_rank_counts_every_gradient_it_holds_in_its_grad_norm(monkeypatch):
    # PP2 without EP: rank 3 is pool rank 1 of stage 1 and holds only replicas that pool rank 0
    # counts in the real run; alone, it must count them itself (else its grad norm reads 0).
    import harness.workload.train as train

    case = make_case(world=4, parallel={"pp": 2, "dynamic_cp": [1, 2]}, train=TRAIN)
    seen: list[float] = []
    norm = train.global_grad_norm

    def spy(dense, expert, count_dense, count_expert, world, device):
        assert count_dense and count_expert
        own = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in [*dense, *expert]))
        got = norm(dense, expert, count_dense, count_expert, world, device)
        seen.append(own)
        assert got == pytest.approx(own, rel=1e-12)
        return got

    monkeypatch.setattr(train, "global_grad_norm", spy)
    records: list = []
    emulate_rank(eager_arm(case), 3, records.append, device="cpu", weights=WeightCache(threads=1))
    assert len(seen) == 2 and all(s > 0 for s in seen)
    assert [r.grad_norm for r in records] == pytest.approx(seen, rel=1e-12)
