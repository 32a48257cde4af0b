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


def test_fixed_cp_arm_layout_problems_say_which_rule_at_the_pair_field() -> None:
    pair = {"dcp_vs_fixed_cp": {"fixed_cp": 2}}
    odd = {**DCP4, "train": {"max_seqlen_per_rank": 64, "global_batch": 5, "seq_length": 126},
           "data": {"lengths": {"min": 8, "max": 126}}}
    got = preflight(build_case(compare=pair, **odd))
    arm = "the fixed-CP arm (compare.dcp_vs_fixed_cp.fixed_cp 2, dp=2): "
    assert [(p.field, p.message) for p in got] == [
        ("compare.dcp_vs_fixed_cp.fixed_cp", arm + "train.seq_length: seq_length 126 must be "
                                                  "divisible by 2*cp = 4"),
        ("compare.dcp_vs_fixed_cp.fixed_cp", arm + "train.global_batch: global_batch 5 is not "
                                                  "divisible by dp=2")]
    # a problem of the case's own layout is reported once, at its own field
    ep3 = {**DCP4, "parallel": {"dynamic_cp": [1, 2], "ep": 3}, "model": {"experts": 6}}
    assert fields(compare=pair, **ep3) == ["parallel.ep"]


def test_exact_repeat_needs_determinism() -> None:
    assert fields(compare={"repeat": {"loss": "exact"}}) == []
    assert fields(compare={"repeat": {"loss": "exact"}}, train={"deterministic": False}) == [
        "compare.repeat.loss"]
    assert fields(compare={"repeat": {"loss": {"max_rel": 0.01}}},
                  train={"deterministic": False}) == []


def test_graph_pairs_need_a_graphs_section() -> None:
    assert fields(compare={"graph_vs_eager": {"loss": "exact"}}) == ["compare.graph_vs_eager"]


def test_qwen3_preset_on_a_real_layout() -> None:
    got = fields(model={"preset": "qwen3-30b-a3b", "layers": None},
                 parallel={"pp": 4, "vpp": 3, "ep": 8, "dynamic_cp": [1, 2, 4, 8]},
                 train={"seq_length": 8192, "max_seqlen_per_rank": 1024, "global_batch": 64},
                 data={"lengths": {"max": 8192}},
                 resources={"nodes": 4, "gpus_per_node": 8})
    assert got == []


# ----------------------------------------------------------------- microbatch fill (packing)
def fill_case(gbs: int, *, dp: int = 1, vpp: int = 2, group: Any = None, m: Any = None,
              distribution: str = "fixed", min_len: int = 8, max_len: int = 64,
              seq_length: int = 64, **extra: Any) -> Any:
    """A fixed-CP PP2 case on ``2 * dp`` ranks (cp 1)."""
    return build_case(parallel={"pp": 2, "vpp": vpp, "microbatch_group": group},
                      train={"global_batch": gbs, "microbatches": m, "seq_length": seq_length},
                      data={"lengths": {"distribution": distribution, "min": min_len,
                                        "max": max_len}},
                      model={"layers": 4}, resources={"gpus_per_node": 2 * dp}, **extra)


def fill_fields(gbs: int, **kw: Any) -> list[str]:
    return [p.field for p in preflight(fill_case(gbs, **kw))]


def test_vpp_global_batch_below_smallest_microbatch_count() -> None:
    assert fill_fields(1, distribution="uniform") == ["train.global_batch"]
    msg = preflight(fill_case(2, dp=2, distribution="uniform"))[0].message
    assert "gives 1 sequence(s) per DP rank (dp=2)" in msg
    assert "needs at least 2 microbatches; use train.global_batch >= 4" in msg
    assert fill_fields(2, group=3, distribution="uniform") == ["train.global_batch"]
    assert "global_batch >= 3" in preflight(fill_case(1, group=3))[0].message


def test_vpp_global_batch_near_misses_pass() -> None:
    assert fill_fields(2, distribution="uniform") == []  # 2 microbatches of 1 sequence
    assert fill_fields(4, dp=2, distribution="uniform") == []
    assert fill_fields(1, vpp=1, distribution="uniform") == []  # no VPP: 1 microbatch runs
    assert fill_fields(6, group=3, distribution="uniform") == []


def test_fixed_lengths_forcing_a_rejected_count() -> None:
    # 5 full-length sequences need 5 bins; PP2 x VPP2 rejects 5 and 6 bins leave one empty
    problems = preflight(fill_case(5))
    assert [p.field for p in problems] == ["data.lengths"]
    msg = problems[0].message
    assert "needs at least 5 microbatches; the schedule rejects 5" in msg
    assert "next accepted count, 6, is more than the 5 sequences" in msg
    assert "use train.global_batch: 4 or 6" in msg
    assert fill_fields(10, dp=2) == ["data.lengths"]


def test_fixed_lengths_near_misses_pass() -> None:
    assert fill_fields(4) == [] and fill_fields(6) == []
    assert fill_fields(5, max_len=32) == []  # two per bin: 3 needed, 4 accepted, 4 <= 5
    assert fill_fields(5, vpp=1) == []  # no VPP: 5 microbatches run
    assert fill_fields(5, distribution="uniform") == []  # random lengths may pack in fewer


def test_given_microbatches_must_hold_every_sequence() -> None:
    problems = preflight(fill_case(6, m=4))
    assert [p.field for p in problems] == ["train.microbatches"]
    assert "hold at most 4 of the 6 sequences" in problems[0].message
    assert "use train.microbatches: 6" in problems[0].message
    assert fill_fields(6, m=6) == []
    assert fill_fields(6, m=4, max_len=32) == []  # two per bin
    # check_microbatches already reports counts the schedule rejects: one problem, not two
    assert fill_fields(6, m=5) == ["train.microbatches"]


def test_dcp_global_batch_below_smallest_microbatch_count() -> None:
    dcp = {"parallel": {"pp": 2, "vpp": 2, "microbatch_group": 4, "dynamic_cp": [1, 2]},
           "model": {"layers": 4}, "resources": {"gpus_per_node": 4}}
    assert fields(train={"global_batch": 4, "max_seqlen_per_rank": 64}, **dcp) == []
    assert fields(train={"global_batch": 3, "max_seqlen_per_rank": 64}, **dcp) == [
        "train.global_batch"]
    # the fixed-CP2 arm has dp 1: its 4 sequences of 128 tokens need 4 bins, the schedule accepts 4
    pair = {"compare": {"dcp_vs_fixed_cp": {"fixed_cp": 2}}}
    full = {"distribution": "fixed", "max": 128}
    assert fields(train={"global_batch": 4, "max_seqlen_per_rank": 64},
                  data={"lengths": full}, **pair, **dcp) == []
    got = preflight(build_case(train={"global_batch": 5, "max_seqlen_per_rank": 64},
                               data={"lengths": full}, **pair, **dcp))
    assert [p.field for p in got] == ["data.lengths"]
    assert got[0].message.startswith("the fixed-CP arm (compare.dcp_vs_fixed_cp.fixed_cp 2, dp=1)")


def _plan_fails(case: Any) -> bool:
    from harness.errors import ConfigError
    from harness.workload.packing import plan_step

    try:
        plan_step(case, 1)
    except ConfigError:
        return True
    return False


FILL_FIELDS = {"train.global_batch", "train.microbatches", "data.lengths"}


@pytest.mark.parametrize("distribution", ["fixed", "uniform"])
def test_preflight_agrees_with_the_runtime_packing(distribution: str) -> None:
    """Fixed lengths: preflight passes exactly when plan_step packs step 1. Random lengths:
    whatever preflight rejects, plan_step rejects too (preflight catches the certain failures)."""
    checked = rejected = 0
    for dp in (1, 2):
        for vpp, group in ((1, None), (2, None), (2, 3)):
            for m in (None, 2, 3, 4, 6):
                for max_len in (64, 32, 24):
                    for per_rank in range(1, 8):
                        case = fill_case(per_rank * dp, dp=dp, vpp=vpp, group=group, m=m,
                                         distribution=distribution, min_len=20, max_len=max_len)
                        found = {p.field for p in preflight(case)}
                        assert found <= FILL_FIELDS
                        fails = _plan_fails(case)
                        if distribution == "fixed":
                            assert bool(found) == fails, (case.parallel, case.train, found)
                        elif found:
                            assert fails, (case.parallel, case.train, found)
                        checked += 1
                        rejected += bool(found)
    assert checked == 630 and 0 < rejected < checked


@pytest.mark.parametrize(("gbs", "dp"), [(5, 1), (10, 2), (7, 1)])
def test_suggested_global_batches_pack(gbs: int, dp: int) -> None:
    problems = preflight(fill_case(gbs, dp=dp))
    assert [p.field for p in problems] == ["data.lengths"]
    suggested = problems[0].message.split("use train.global_batch: ")[1].split(",")[0]
    for value in suggested.split(" or "):
        good = fill_case(int(value), dp=dp)
        assert preflight(good) == [] and not _plan_fails(good)


GRAPH_TRAIN = {"steps": 4, "dtype": "bf16", "max_seqs_per_microbatch": 8}


def test_a_valid_graph_case_passes() -> None:
    assert fields(graphs={"scope": "attn"}, train=GRAPH_TRAIN, compare={"graph_vs_eager": {}}) == []
    assert fields(graphs={"scope": "full"}, train=GRAPH_TRAIN) == []


@pytest.mark.parametrize(("sections", "field", "words"), [
    ({"train": {**GRAPH_TRAIN, "max_seqs_per_microbatch": None}}, "train.max_seqs_per_microbatch",
     "cu_seqlens"),
    ({"train": {**GRAPH_TRAIN, "dtype": "fp32"}}, "train.dtype", "bf16"),
    ({"train": {**GRAPH_TRAIN, "steps": 2}}, "graphs.warmup_steps", "leave none"),
    ({"train": GRAPH_TRAIN, "graphs": {"scope": "full"}, "parallel": {"ep": 2},
      "resources": {"gpus_per_node": 2}, "model": {"experts": 4}}, "graphs.scope", "fixed-size all-to-all"),
    ({"train": GRAPH_TRAIN, "compare": {"graph_pools": {}}}, "compare.graph_pools", "two or more"),
    ({"train": {**GRAPH_TRAIN, "memory_probe_step": 9}}, "train.memory_probe_step", "after the last"),
])
def test_graph_case_problems_name_their_field(sections, field, words) -> None:
    sections = {"graphs": {"scope": "attn", "warmup_steps": 2}, **sections}
    assert field in fields(**sections)
    assert words in messages(**sections)


STATIC_TRAIN = {"steps": 2, "max_seqs_per_microbatch": 8}


def test_static_shapes_without_graphs_run_eagerly_in_fp32_and_keep_a_reference() -> None:
    for scope in ("attn", "full"):
        case = build_case(shapes={"mode": "static", "scope": scope}, train=STATIC_TRAIN,
                          compare={"reference": {}})
        assert preflight(case) == [] and case.static_shapes and case.static_scope.value == scope
        assert not case.needs_cuda  # no graphs: CPU ranks can run it
    dynamic = build_case(shapes={"mode": "dynamic"}, train=STATIC_TRAIN)
    assert not dynamic.static_shapes and dynamic.static_scope is None
    # One rule: a graph case is static with its graphs' scope.
    graph = build_case(graphs={"scope": "full"}, train=GRAPH_TRAIN)
    assert graph.static_scope.value == "full" and graph.needs_cuda
    # A single-rank dynamic case has no reference of its own; a static one does.
    assert "compare.reference" in fields(compare={"reference": {}})


@pytest.mark.parametrize(("sections", "field", "words"), [
    ({"shapes": {"mode": "static"}, "train": {"steps": 2}}, "train.max_seqs_per_microbatch",
     "static shapes (shapes.mode: static) needs"),
    ({"shapes": {"mode": "static", "scope": "full"}, "train": STATIC_TRAIN, "parallel": {"ep": 2},
      "resources": {"gpus_per_node": 2}, "model": {"experts": 4}}, "shapes.scope",
     "scope full runs the static MoE"),
    ({"shapes": {"mode": "static"}, "graphs": {"scope": "attn"}, "train": GRAPH_TRAIN}, "shapes",
     "graphs: implies them"),
])
def test_static_shape_problems_name_their_field(sections, field, words) -> None:
    assert field in fields(**sections)
    assert words in messages(**sections)


def test_the_reference_arm_of_a_static_case_runs_dynamic_shapes() -> None:
    from harness.spec.derive import as_reference

    case = build_case(shapes={"mode": "static", "scope": "full"}, train=STATIC_TRAIN,
                      parallel={"cp": 2}, resources={"gpus_per_node": 2},
                      compare={"reference": {}})
    ref = as_reference(case)
    assert ref.shapes is None and not ref.static_shapes and ref.layout.single_rank


TRAIN12 = {"steps": 12, "deterministic": True}


def test_resume_exact_without_determinism_names_the_exact_field() -> None:
    train = {"steps": 12, "deterministic": False}
    assert fields(train=train, compare={"resume": {}}) == ["compare.resume.loss"]
    bound = {"max_rel": 1e-3}
    assert fields(train=train, compare={"resume": {"loss": bound, "grad_norm": "exact"}}) == [
        "compare.resume.grad_norm"]
    assert fields(train=train, compare={"resume": {"loss": bound, "aux_loss": bound,
                                                    "grad_norm": bound}}) == []


def test_resume_of_a_graph_arm_must_stop_after_the_capture() -> None:
    graphs = {"scope": "attn", "warmup_steps": 2}
    train = {**TRAIN12, "max_seqs_per_microbatch": 8, "dtype": "bf16"}
    resources = {"device": "cuda"}
    early = fields(train=train, graphs=graphs, resources=resources, compare={"resume": {"at_step": 2}})
    assert early == ["compare.resume.at_step"]
    assert "after its 2 eager warmup steps" in messages(
        train=train, graphs=graphs, resources=resources, compare={"resume": {"at_step": 2}})
    # Only the eager arm resumed: no capture to re-test, so stopping early is fine.
    assert fields(train=train, graphs=graphs, resources=resources,
                  compare={"resume": {"at_step": 2, "arms": ["eager"]}}) == []
    assert fields(train=train, graphs=graphs, resources=resources, compare={"resume": {"at_step": 3}}) == []


def test_resume_needs_at_least_one_arm() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="at least 1 item"):
        build_case(train=TRAIN12, compare={"resume": {"arms": []}})


@pytest.mark.parametrize("window, ok", [([5, 12], True), ([2, 3], True), ([5, 13], False),
                                        ([20, 30], False)])
def test_golden_step_time_window_lies_within_the_steps(window: Any, ok: bool) -> None:
    found = fields(train=TRAIN12, compare={"golden": {"step_time": {"window": window}}})
    assert found == ([] if ok else ["compare.golden.step_time.window"])
    if not ok:
        assert "run past the last of the 12 train.steps" in messages(
            train=TRAIN12, compare={"golden": {"step_time": {"window": window}}})
