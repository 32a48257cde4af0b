"""The parallel layout: derived sizes, its rules (with their fields) and the rank arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from harness.spec.derive import as_fixed_cp
from harness.spec.layout import ParallelLayout, sequence_multiple

from .conftest import build_case


def layout(**kw: object) -> ParallelLayout:
    base: dict = dict(nodes=1, gpus_per_node=1, seq_length=64, global_batch=8)
    return ParallelLayout(**{**base, **kw})  # type: ignore[arg-type]


def fields(lay: ParallelLayout) -> list[str]:
    return [p.field for p in lay.problems()]


def test_case_layout_holds_the_case_sizes() -> None:
    case = build_case(parallel={"pp": 2, "ep": 2, "dynamic_cp": [2, 1]}, model={"layers": 4},
                      train={"max_seqlen_per_rank": 32, "seq_length": 64, "global_batch": 8},
                      resources={"nodes": 2, "gpus_per_node": 4})
    lay = case.layout
    assert (lay.world, lay.pp, lay.dp_cp, lay.dp, lay.ep) == (8, 2, 4, 4, 2)
    assert lay.dynamic and lay.cp_sizes == (1, 2) and lay.max_cp == 2
    assert (lay.group, lay.model_chunks, lay.tokens_per_rank) == (2, 2, 32)
    assert lay.problems() == []
    fixed = build_case(parallel={"cp": 2}, resources={"gpus_per_node": 4}).layout
    assert (fixed.dp_cp, fixed.dp, fixed.tokens_per_rank, fixed.cp_sizes) == (4, 2, 64, (2,))
    assert build_case().layout.single_rank and not fixed.single_rank


def test_the_fixed_cp_arm_layout_is_the_derived_arm_cases() -> None:
    case = build_case(parallel={"dynamic_cp": [1, 2]}, train={"max_seqlen_per_rank": 64},
                      resources={"gpus_per_node": 4})
    arm = as_fixed_cp(case, 2, "fixed-cp2")
    assert case.layout.at_fixed_cp(2) == arm.layout
    assert (arm.layout.dp, arm.layout.dynamic, arm.layout.max_seqlen_per_rank) == (2, False, None)


def test_sequence_multiple_is_two_cp() -> None:
    assert [sequence_multiple(c) for c in (1, 2, 4)] == [1, 4, 8]
    assert fields(layout(cp_sizes=(2,), gpus_per_node=2, seq_length=66)) == ["train.seq_length"]
    assert fields(layout(cp_sizes=(2,), gpus_per_node=2, seq_length=68, global_batch=4)) == []


@pytest.mark.parametrize(("kw", "field", "words"), [
    (dict(pp=3, gpus_per_node=4), "parallel.pp", "pp=3 does not divide the world size 4"),
    (dict(cp_sizes=(4,), gpus_per_node=2), "parallel.cp", "world must equal pp*dp*cp"),
    (dict(cp_sizes=(1, 3), dynamic=True, gpus_per_node=4, max_seqlen_per_rank=64),
     "parallel.dynamic_cp", "[3]"),
    (dict(vpp=2), "parallel.vpp", "needs pp > 1"),
    (dict(pp=4, vpp=2, microbatch_group=2, gpus_per_node=4), "parallel.microbatch_group",
     "smaller than PP=4"),
    (dict(ep=3, gpus_per_node=4), "parallel.ep", "ep=3 does not divide the 4 DP x CP ranks"),
    (dict(dynamic=True), "train.max_seqlen_per_rank", "needs max_seqlen_per_rank"),
    (dict(dynamic=True, max_seqlen_per_rank=33), "train.max_seqlen_per_rank", "even"),
    (dict(dynamic=True, cp_sizes=(1, 2), gpus_per_node=2, max_seqlen_per_rank=16),
     "train.max_seqlen_per_rank", "cannot hold a sequence of seq_length 64"),
    (dict(max_seqlen_per_rank=32), "train.max_seqlen_per_rank", "only applies to dynamic CP"),
    (dict(gpus_per_node=2, global_batch=5), "train.global_batch", "not divisible by dp=2"),
    (dict(dynamic=True, gpus_per_node=4, max_seqlen_per_rank=64, global_batch=3),
     "train.global_batch", "every rank needs data"),
])
def test_each_rule_names_its_field(kw: dict, field: str, words: str) -> None:
    lay = layout(**kw)
    assert [p.field for p in lay.problems()] == [field]
    assert words in lay.problems()[0].message


def test_sizes_are_exact_only_when_the_world_splits() -> None:
    assert layout(gpus_per_node=4, cp_sizes=(2,), global_batch=4).exact
    assert not layout(gpus_per_node=6, pp=4).exact  # no batch rule without an exact dp
    assert fields(layout(gpus_per_node=6, pp=4, global_batch=5)) == ["parallel.pp"]


def test_microbatch_counts_follow_the_schedule() -> None:
    lay = layout(pp=2, vpp=2, gpus_per_node=2)
    assert lay.microbatch_count_problem(4) is None and lay.microbatch_count_problem(2) is None
    assert "fewer than the microbatch group" in (lay.microbatch_count_problem(1) or "")
    assert "last group of 1" in (dataclasses.replace(lay, microbatch_group=4)
                                 .microbatch_count_problem(5) or "")
    assert layout(pp=2, gpus_per_node=2).microbatch_count_problem(3) is None  # no VPP: any count


def test_rank_arithmetic_places_pp_outermost_and_blocks_contiguously() -> None:
    lay = layout(gpus_per_node=8, pp=2, ep=2)
    assert lay.dp_cp == 4
    assert lay.pp_rank(5) == 1 and lay.pool_rank(5) == 1 and lay.global_rank(1, 1) == 5
    assert lay.pp_ranks(5) == (1, 5)
    assert lay.pool_ranks(1) == (4, 5, 6, 7)
    assert lay.cp_blocks(0, 2) == [(0, 1), (2, 3)]
    assert lay.cp_blocks(1, 4) == [(4, 5, 6, 7)]
    assert lay.ep_blocks(1) == [(4, 5), (6, 7)]
    assert lay.expert_dp_groups(0) == [(0, 2), (1, 3)]
    assert lay.ep_rank(7) == 1


def test_sequences_per_dp_rank_and_most_microbatches() -> None:
    fixed = layout(gpus_per_node=8, pp=2, cp_sizes=(2,), global_batch=12)  # dp 2
    assert (fixed.dp, fixed.sequences_per_dp_rank, fixed.most_microbatches) == (2, 6, 6)
    dynamic = layout(gpus_per_node=8, pp=2, cp_sizes=(1, 2), dynamic=True, global_batch=12,
                     max_seqlen_per_rank=32)  # dp 4: the whole DP x CP pool
    assert (dynamic.sequences_per_dp_rank, dynamic.most_microbatches) == (3, 12)
    uneven = layout(gpus_per_node=6, pp=2, cp_sizes=(2,), global_batch=12)  # 6 % (2 * 2) != 0
    assert not uneven.exact and uneven.most_microbatches == 12
