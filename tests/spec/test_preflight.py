"""Preflight rules: each one passes on a good layout and names the field on a bad one."""

from __future__ import annotations

from typing import Any

import pytest

from harness.spec.preflight import preflight

from .conftest import build_case


def fields(**sections: Any) -> list[str]:
    return [p.field for p in preflight(build_case(**sections))]


def messages(**sections: Any) -> str:
    return " | ".join(p.message for p in preflight(build_case(**sections)))


def test_default_case_passes() -> None:
    assert fields() == []


# ----------------------------------------------------------------- layout
def test_fixed_cp_world_must_be_pp_dp_cp() -> None:
    assert fields(parallel={"cp": 2}, resources={"gpus_per_node": 4}) == []
    assert fields(parallel={"cp": 4}, resources={"gpus_per_node": 2}) == ["parallel.cp"]
    assert fields(parallel={"pp": 2, "cp": 2}, resources={"gpus_per_node": 6},
                  model={"layers": 4}) == ["parallel.cp"]
    assert fields(parallel={"pp": 3}, resources={"gpus_per_node": 4},
                  model={"layers": 6}) == ["parallel.pp"]
    assert "world size 6 (resources.nodes 1 x resources.gpus_per_node 6)" in messages(
        parallel={"pp": 2, "cp": 2}, resources={"gpus_per_node": 6})


def test_nodes_count_in_world() -> None:
    assert fields(parallel={"cp": 4}, resources={"nodes": 2, "gpus_per_node": 2}) == []


def test_dynamic_cp_sizes_power_of_two_dividing_dp_cp() -> None:
    dcp = {"train": {"max_seqlen_per_rank": 64}, "resources": {"gpus_per_node": 4}}
    assert fields(parallel={"dynamic_cp": [1, 2, 4]}, **dcp) == []
    assert fields(parallel={"dynamic_cp": [1, 3]}, **dcp) == ["parallel.dynamic_cp"]
    assert fields(parallel={"pp": 2, "dynamic_cp": [1, 4]}, **dcp) == ["parallel.dynamic_cp"]
    assert "[3]" in messages(parallel={"dynamic_cp": [1, 3]}, **dcp)


def test_vpp_needs_pp() -> None:
    assert fields(parallel={"vpp": 2}) == ["parallel.vpp"]


# ----------------------------------------------------------------- model shape
def test_layers_divisible_by_pp_vpp() -> None:
    two = {"resources": {"gpus_per_node": 2}}
    assert fields(parallel={"pp": 2, "vpp": 2}, **two) == []
    assert fields(parallel={"pp": 2, "vpp": 2}, model={"layers": 6}, **two) == ["model.layers"]
    assert fields(parallel={"pp": 2}, model={"layers": 3}, **two) == ["model.layers"]


def test_experts_and_ep() -> None:
    four = {"resources": {"gpus_per_node": 4}, "train": {"global_batch": 4}}
    assert fields(parallel={"ep": 4}, **four) == []
    assert fields(parallel={"ep": 3}, **four) == ["parallel.ep", "parallel.ep"]
    assert fields(parallel={"ep": 4}, model={"experts": 12}, **four) == []
    assert fields(parallel={"ep": 8}, model={"experts": 16}, **four) == ["parallel.ep"]
    assert fields(model={"experts_per_token": 9}) == ["model.experts_per_token"]


def test_heads_and_head_dim() -> None:
    assert fields(model={"kv_heads": 3}) == ["model.kv_heads"]
    assert fields(model={"head_dim": 15}) == ["model.head_dim"]


# ----------------------------------------------------------------- sequences and data
def test_fixed_cp_seq_length_divisible_by_2cp() -> None:
    two = {"resources": {"gpus_per_node": 2}, "data": {"lengths": {"max": 100}}}
    assert fields(parallel={"cp": 2}, train={"seq_length": 100}, **two) == []
    assert fields(parallel={"cp": 2}, train={"seq_length": 102}, **two) == ["train.seq_length"]
    assert fields(train={"seq_length": 101}, data={"lengths": {"max": 100}}) == []  # cp 1


def test_fixed_cp_rejects_max_seqlen_per_rank() -> None:
    assert fields(train={"max_seqlen_per_rank": 64}) == ["train.max_seqlen_per_rank"]


@pytest.mark.parametrize(
    ("max_seqlen", "ok"), [(None, False), (63, False), (62, False), (64, True), (128, True)]
)
def test_dcp_max_seqlen_per_rank(max_seqlen: Any, ok: bool) -> None:
    got = fields(parallel={"dynamic_cp": [1, 2]}, resources={"gpus_per_node": 2},
                 train={"max_seqlen_per_rank": max_seqlen})
    assert got == ([] if ok else ["train.max_seqlen_per_rank"])


def test_data_lengths_fit_seq_length() -> None:
    assert fields(data={"lengths": {"max": 129}}) == ["data.lengths.max"]


def test_data_lengths_message_says_how_to_fix_and_marks_the_default() -> None:
    given = preflight(build_case(data={"lengths": {"max": 129}}))[0].message
    assert "longest sequence 129 exceeds" in given
    assert "set data.lengths.max <= 128 or raise train.seq_length" in given
    default = preflight(build_case(data={"lengths": {}}, train={"seq_length": 64}))[0].message
    assert default.startswith("longest sequence 256 (the default) exceeds train.seq_length 64")


# ----------------------------------------------------------------- batch
def test_global_batch_fixed_cp_divisible_by_dp() -> None:
    four = {"resources": {"gpus_per_node": 4}}
    assert fields(train={"global_batch": 6}, parallel={"cp": 2}, **four) == []
    assert fields(train={"global_batch": 6}, **four) == ["train.global_batch"]


def test_global_batch_dcp_at_least_dp_cp() -> None:
    dcp = {"parallel": {"dynamic_cp": [1, 2, 4]}, "resources": {"gpus_per_node": 4}}
    assert fields(train={"global_batch": 4, "max_seqlen_per_rank": 32}, **dcp) == []
    assert fields(train={"global_batch": 3, "max_seqlen_per_rank": 32}, **dcp) == [
        "train.global_batch"]


# ----------------------------------------------------------------- microbatches
def pp_case(pp: int, vpp: int = 1, m: Any = None, group: Any = None, gbs: int = 64) -> list[str]:
    return fields(parallel={"pp": pp, "vpp": vpp, "microbatch_group": group},
                  train={"microbatches": m, "global_batch": gbs},
                  model={"layers": 8}, resources={"gpus_per_node": pp})


def test_microbatches_at_least_pp() -> None:
    assert pp_case(4, m=4) == []
    assert pp_case(4, m=3) == ["train.microbatches"]
    assert pp_case(4) == []  # derived from the packing: nothing to check


def test_vpp_group_at_least_pp() -> None:
    assert pp_case(2, vpp=2, group=2) == []
    assert pp_case(4, vpp=2, group=2) == ["parallel.microbatch_group"]
    assert pp_case(2, vpp=1, group=1) == []  # group is ignored without vpp


@pytest.mark.parametrize(
    ("m", "ok"),
    [(4, True), (8, True), (6, True), (5, False), (9, False), (3, False)],
)
def test_vpp_microbatches_fill_groups(m: int, ok: bool) -> None:
    # pp 2, group 4: M >= 4, and M % 4 is 0 or >= 2 (Megatron's interleaved-schedule rule)
    assert pp_case(2, vpp=2, m=m, group=4) == ([] if ok else ["train.microbatches"])


def test_microbatches_at_most_sequences_per_dp_rank() -> None:
    assert fields(train={"microbatches": 4, "global_batch": 4}) == []
    assert fields(train={"microbatches": 5, "global_batch": 4}) == ["train.microbatches"]


# ----------------------------------------------------------------- compare
DCP4 = {"parallel": {"dynamic_cp": [1, 2]}, "resources": {"gpus_per_node": 4},
        "train": {"max_seqlen_per_rank": 64}}


def test_dcp_vs_fixed_cp() -> None:
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}}, **DCP4) == []
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 4}}, **DCP4) == []
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 8}}, **DCP4) == [
        "compare.dcp_vs_fixed_cp.fixed_cp"]
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 3}}, **DCP4) == [
        "compare.dcp_vs_fixed_cp.fixed_cp"]
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}}) == ["compare.dcp_vs_fixed_cp"]


def test_dcp_vs_fixed_cp_fixed_arm_layout() -> None:
    odd_batch = {**DCP4, "train": {"max_seqlen_per_rank": 64, "global_batch": 5}}
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}}, **odd_batch) == [
        "compare.dcp_vs_fixed_cp.fixed_cp"]
    assert fields(compare={"dcp_vs_fixed_cp": {"fixed_cp": 4}}, **odd_batch) == []


def test_exact_repeat_needs_determinism() -> None:
    assert fields(compare={"repeat": {"loss": "exact"}}) == []
    assert fields(compare={"repeat": {"loss": "exact"}}, train={"deterministic": False}) == [
        "compare.repeat.loss"]
    assert fields(compare={"repeat": {"loss": {"max_rel": 0.01}}},
                  train={"deterministic": False}) == []


def test_graph_vs_eager_is_not_a_preflight_error() -> None:
    assert fields(compare={"graph_vs_eager": {"loss": "exact"}}) == []


def test_qwen3_preset_on_a_real_layout() -> None:
    got = fields(model={"preset": "qwen3-30b-a3b", "layers": None},
                 parallel={"pp": 4, "vpp": 3, "ep": 8, "dynamic_cp": [1, 2, 4, 8]},
                 train={"seq_length": 8192, "max_seqlen_per_rank": 1024, "global_batch": 64},
                 data={"lengths": {"max": 8192}},
                 resources={"nodes": 4, "gpus_per_node": 8})
    assert got == []
