from pathlib import Path

import pytest

from harness.arms import arm_spec, derive_arm_case, plan_case
from harness.errors import CaseError, ConfigError
from harness.spec.presets import resolve_model
from harness.spec.schema import ArmCase, Case, ModelSpec

GRAPHS = {"scope": "attn", "warmup_steps": 1}


def make_case(compare=None, parallel=None, gpus=4, graphs=None, train=None):
    tr = {"steps": 2, "global_batch": 8, "seq_length": 64, "max_seqlen_per_rank": 64, "lr": 1e-3}
    if graphs is not None:
        tr.update(dtype="bf16", max_seqs_per_microbatch=8)
    tr.update(train or {})
    par = parallel or {"dynamic_cp": [1, 2]}
    if "cp" in par:
        tr.pop("max_seqlen_per_rank")
    return Case.model_validate({
        "id": "c", "name": "c", "source": "cases/c.yaml",
        "model": resolve_model(ModelSpec()).model_dump(),
        "parallel": par, "train": tr, "data": {"lengths": {"max": 64}}, "compare": compare or {},
        "resources": {"gpus_per_node": gpus}, "graphs": graphs,
    })


def names(arms):
    return [a.name for a in arms]


def arms_for_case(case):
    return plan_case(case).arms


def pairs_for_case(case):
    return plan_case(case).pairs


def arm_case(case, name):
    """The derived case of arm ``name`` (looked up among the arms the case can have)."""
    return derive_arm_case(case, arm_spec(case, name))


def test_no_pairs_runs_one_eager_arm_whose_case_is_the_case_itself():
    case = make_case(parallel={"cp": 2})
    assert pairs_for_case(case) == ()
    (arm,) = arms_for_case(case)
    assert arm.name == "eager" and arm.case.arm == "eager" and not arm.case.execution.graphed
    assert arm.case.parallel == case.parallel and arm.case.train == case.train
    # In a dynamic-CP case the eager arm is the dynamic-CP arm, named dcp.
    assert names(arms_for_case(make_case())) == ["dcp"]


def test_repeat_pair_shares_one_configuration():
    case = make_case(parallel={"cp": 2}, compare={"repeat": {}})
    a, b = arms_for_case(case)
    assert (a.name, b.name) == ("eager", "eager-repeat")
    assert a.case.parallel == b.case.parallel
    # the same execution, but the repeat's processes start otherwise (variation.py)
    assert not a.case.execution.vary_processes and b.case.execution.vary_processes
    assert a.case.execution == b.case.execution.model_copy(update={"vary_processes": False})


def test_fixed_cp_arm_is_a_derived_fixed_cp_case():
    case = make_case(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}})
    dcp, fixed = arms_for_case(case)
    assert (dcp.name, fixed.name) == ("dcp", "fixed-cp2")
    assert dcp.case.parallel.dynamic_cp == [1, 2]
    assert fixed.case.parallel.cp == 2 and fixed.case.parallel.dynamic_cp is None
    assert fixed.case.train.max_seqlen_per_rank is None  # fixed CP must not set it
    assert isinstance(fixed.case, ArmCase) and fixed.case.arm == "fixed-cp2"
    assert not hasattr(fixed.case, "compare")  # the pairs are the user's case's
    assert fixed.case.id == case.id


def test_graph_case_pairs_use_graph_arms_on_both_sides():
    case = make_case(graphs=GRAPHS, compare={"graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2},
                                             "graph_pools": {}})
    pairs = {p.contract: p.arms for p in pairs_for_case(case)}
    assert pairs == {"graph_vs_eager": ("graph", "dcp"),
                     "dcp_vs_fixed_cp": ("graph", "graph-fixed-cp2"),
                     "graph_pools": ("graph", "graph-separate-pools")}
    arms = {a.name: a.case for a in arms_for_case(case)}
    assert sorted(arms) == ["dcp", "graph", "graph-fixed-cp2", "graph-separate-pools"]
    assert arms["graph"].execution.graphed and arms["graph"].execution.pools == "shared"
    assert arms["graph-separate-pools"].execution.pools == "separate"
    assert not arms["dcp"].execution.graphed and arms["dcp"].static_shapes  # like with like
    fixed = arms["graph-fixed-cp2"]
    assert fixed.execution.graphed and fixed.parallel.cp == 2 and fixed.layout.tokens_per_rank == 32


def test_graph_arm_without_graphs_section_names_the_field():
    with pytest.raises(CaseError) as err:
        arm_case(make_case(), "graph")
    assert err.value.field == "graphs" and "graphs:" in str(err.value)


def test_derived_arm_goes_through_preflight():
    # fixed CP 4 does not divide the 2-rank DP x CP pool: the arm case fails preflight by name.
    case = make_case(gpus=2, compare={"dcp_vs_fixed_cp": {"fixed_cp": 4}})
    with pytest.raises(CaseError) as err:
        plan_case(case)
    assert "fixed-cp4" in str(err.value) and "parallel.cp" in str(err.value)


def test_unknown_arm_and_lookup():
    case = make_case(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}})
    with pytest.raises(CaseError) as err:
        arm_case(case, "bogus")
    assert "unknown arm 'bogus'" in str(err.value) and "fixed-cp2" in str(err.value)
    with pytest.raises(ConfigError) as err:
        plan_case(case).arm("graph")
    assert "dcp, fixed-cp2" in str(err.value)
    assert arm_case(case, "fixed-cp2-repeat").parallel.cp == 2
    with pytest.raises(CaseError, match="dcp needs dynamic CP"):
        arm_case(make_case(parallel={"cp": 2}), "dcp")


def test_a_planned_arm_carries_its_kind_world_and_recording_ranks():
    case = make_case(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}, "reference": {}}, gpus=2)
    plan = plan_case(case)
    got = {a.name: (a.kind, a.world_size, a.ranks, a.repeat) for a in plan.arms}
    assert got == {"dcp": ("dcp", 2, (0, 1), False), "fixed-cp2": ("fixed-cp", 2, (0, 1), False),
                   "reference": ("reference", 1, (0,), False)}
    assert plan.expected_ranks["reference"] == (0,)
    # The pairs carry their typed contracts, validated when the plan is made.
    ref = {p.name: p for p in plan.pairs}["reference"]
    assert ref.params.groups_like_reference is False and ref.params.loss.max_rel == 1e-6
    repeat = plan_case(make_case(parallel={"cp": 2}, compare={"repeat": {"arm": "eager"}}))
    assert [(a.name, a.repeat) for a in repeat.arms] == [("eager", False), ("eager-repeat", True)]


# --------------------------------------------------------------------------- reference / golden
def test_reference_arm_is_the_case_on_one_rank():
    case = make_case(parallel={"pp": 2, "vpp": 2, "ep": 2, "dynamic_cp": [1, 2]},
                     compare={"reference": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2}},
                     train={"microbatches": 4})
    ref = arm_case(case, "reference")
    assert ref.layout.world == 1 and ref.arm == "reference" and ref.id == case.id
    assert (ref.parallel.pp, ref.parallel.vpp, ref.parallel.ep, ref.parallel.cp) == (1, 1, 1, None)
    assert ref.parallel.dynamic_cp is None and ref.train.max_seqlen_per_rank is None
    assert ref.model == case.model and ref.data == case.data and ref.train.seed == case.train.seed
    assert ref.train.global_batch == case.train.global_batch and ref.train.microbatches == 4
    assert not ref.execution.graphed and not hasattr(ref, "compare")


def test_reference_pairs_name_each_candidate_and_its_grouping():
    case = make_case(compare={"reference": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2}}, gpus=2)
    pairs = {p.name: p for p in pairs_for_case(case)}
    assert pairs["reference"].arms == ("dcp", "reference")
    assert pairs["reference-fixed-cp2"].arms == ("fixed-cp2", "reference")
    assert pairs["reference"].params.groups_like_reference is False  # dynamic CP regroups
    assert pairs["reference-fixed-cp2"].params.groups_like_reference is True  # dp 1
    assert pairs["reference"].params.aux_loss_coeff == case.model.aux_loss_coeff
    assert names(arms_for_case(case)) == ["dcp", "fixed-cp2", "reference"]
    dp2 = make_case(parallel={"cp": 1}, compare={"reference": {"arms": ["eager"]}}, gpus=2)
    (pair,) = pairs_for_case(dp2)
    assert pair.arms == ("eager", "reference") and pair.params.groups_like_reference is False


def test_reference_candidates_are_checked():
    case = make_case(compare={"reference": {"arms": ["reference"]}}, gpus=2)
    with pytest.raises(CaseError) as err:
        pairs_for_case(case)
    assert err.value.field == "compare.reference.arms"
    with pytest.raises(CaseError) as err:
        pairs_for_case(make_case(compare={"reference": {"arms": ["graph"]}}, gpus=2))
    assert err.value.field == "compare.reference.arms" and "`graphs:` section" in str(err.value)


def test_single_rank_case_has_no_reference_of_its_own():
    from harness.spec.preflight import preflight

    case = make_case(parallel={"cp": 1}, gpus=1, compare={"reference": {}})
    assert [p.field for p in preflight(case)] == ["compare.reference"]
    with pytest.raises(CaseError) as err:
        arm_case(case, "reference")
    assert "single-rank reference layout" in str(err.value)


def test_golden_pair_points_at_the_folder_next_to_the_case_file():
    case = make_case(compare={"golden": {"dir": "gold"}}, gpus=2)
    (pair,) = pairs_for_case(case)
    assert pair.contract == "golden" and pair.arms == ("dcp",)  # eager of a DCP case is dcp
    # resolved when planned (the case file's folder from here), so judging needs no cwd
    assert pair.params.golden_dir == str(Path("cases/gold").resolve())
    assert pair.params.case_id == "c" and pair.params.steps == 2 and pair.params.files == {}
    from harness.spec.preflight import preflight

    absolute = make_case(compare={"golden": {"dir": "/abs"}}, gpus=2)
    assert [p.field for p in preflight(absolute)] == ["compare.golden.dir"]
