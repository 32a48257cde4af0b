import pytest

from harness.arms import arm_by_name, arm_case, arms_for_case, pairs_for_case
from harness.errors import CaseError
from harness.spec.presets import resolve_model
from harness.spec.schema import Case, ModelSpec

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
    assert a.case.execution == b.case.execution and a.case.parallel == b.case.parallel


def test_fixed_cp_arm_is_a_derived_fixed_cp_case():
    case = make_case(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}})
    dcp, fixed = arms_for_case(case)
    assert (dcp.name, fixed.name) == ("dcp", "fixed-cp2")
    assert dcp.case.parallel.dynamic_cp == [1, 2]
    assert fixed.case.parallel.cp == 2 and fixed.case.parallel.dynamic_cp is None
    assert fixed.case.train.max_seqlen_per_rank is None  # fixed CP must not set it
    assert fixed.case.compare.dcp_vs_fixed_cp is None and fixed.case.arm == "fixed-cp2"
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
    assert fixed.execution.graphed and fixed.parallel.cp == 2 and fixed.tokens_per_rank == 32


def test_graph_arm_without_graphs_section_names_the_field():
    with pytest.raises(CaseError) as err:
        arm_case(make_case(), "graph")
    assert err.value.field == "graphs" and "graphs:" in str(err.value)


def test_derived_arm_goes_through_preflight():
    # fixed CP 4 does not divide the 2-rank DP x CP pool: the arm case fails preflight by name.
    case = make_case(gpus=2)
    with pytest.raises(CaseError) as err:
        arm_case(case, "fixed-cp4")
    assert "fixed-cp4" in str(err.value) and "parallel.cp" in str(err.value)


def test_unknown_arm_and_lookup():
    case = make_case(compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}})
    with pytest.raises(CaseError):
        arm_case(case, "bogus")
    with pytest.raises(CaseError) as err:
        arm_by_name(case, "graph")
    assert "dcp, fixed-cp2" in str(err.value)
    assert arm_case(case, "fixed-cp2-repeat").parallel.cp == 2
    with pytest.raises(CaseError):
        arm_case(make_case(parallel={"cp": 2}), "dcp")
