import pytest

from harness.arms import Arm, arm_by_name, arms_for_case, options_for_arm, pairs_for_case
from harness.errors import CaseError
from harness.spec.presets import resolve_model
from harness.spec.schema import Case, ModelSpec
from harness.workload import TrainOptions


def make_case(compare=None, parallel=None, gpus=4):
    return Case.model_validate({
        "id": "c", "name": "c", "source": "cases/c.yaml",
        "model": resolve_model(ModelSpec()).model_dump(),
        "parallel": parallel or {"dynamic_cp": [1, 2]},
        "train": {"steps": 2, "global_batch": 8, "seq_length": 64, "max_seqlen_per_rank": 64,
                  "lr": 1e-3},
        "data": {}, "compare": compare or {}, "resources": {"gpus_per_node": gpus},
    })


def names(arms):
    return [a.name for a in arms]


def test_no_pairs_runs_one_eager_arm():
    case = make_case(parallel={"cp": 2})
    assert pairs_for_case(case) == ()
    assert arms_for_case(case) == (Arm("eager", TrainOptions(graphs=False, fixed_cp=None)),)
    # In a dynamic-CP case the eager arm is the dynamic-CP arm, named dcp.
    assert arms_for_case(make_case()) == (Arm("dcp", TrainOptions(graphs=False, fixed_cp=None)),)


def test_repeat_runs_the_same_options_twice():
    case = make_case({"repeat": {}}, parallel={"cp": 2})
    (pair,) = pairs_for_case(case)
    assert (pair.name, pair.contract, pair.arms) == ("repeat", "repeat", ("eager", "eager-repeat"))
    assert pair.params == {"arm": "eager", "loss": "exact"}
    a, b = arms_for_case(case)
    assert a.options == b.options == TrainOptions(graphs=False, fixed_cp=None)


def test_repeat_of_graph_arm():
    arms = arms_for_case(make_case({"repeat": {"arm": "graph"}}))
    assert names(arms) == ["graph", "graph-repeat"]
    assert all(a.options.graphs for a in arms)


def test_dcp_vs_fixed_cp_arms():
    case = make_case({"dcp_vs_fixed_cp": {"fixed_cp": 2}})
    (pair,) = pairs_for_case(case)
    assert pair.arms == ("dcp", "fixed-cp2")
    assert pair.params["fixed_cp"] == 2
    dcp, fixed = arms_for_case(case)
    assert dcp.options.fixed_cp is None and fixed.options.fixed_cp == 2
    assert not dcp.options.graphs and not fixed.options.graphs


def test_eager_arm_shared_by_two_pairs():
    case = make_case({"repeat": {}, "graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 1}})
    assert [p.contract for p in pairs_for_case(case)] == ["repeat", "graph_vs_eager", "dcp_vs_fixed_cp"]
    # eager == dcp in a dynamic-CP case: one arm serves repeat, graph_vs_eager and dcp_vs_fixed_cp.
    assert [p.arms for p in pairs_for_case(case)] == [
        ("dcp", "dcp-repeat"), ("graph", "dcp"), ("dcp", "fixed-cp1")]
    assert names(arms_for_case(case)) == ["dcp", "dcp-repeat", "graph", "fixed-cp1"]
    fixed = make_case({"repeat": {}, "graph_vs_eager": {}}, parallel={"cp": 2})
    assert names(arms_for_case(fixed)) == ["eager", "eager-repeat", "graph"]
    graph = arm_by_name(case, "graph")
    assert graph.options == TrainOptions(graphs=True, fixed_cp=None)


def test_dcp_vs_fixed_cp_needs_dynamic_cp():
    case = make_case({"dcp_vs_fixed_cp": {"fixed_cp": 2}}, parallel={"cp": 2})
    with pytest.raises(CaseError, match="compare.dcp_vs_fixed_cp.*dynamic"):
        arms_for_case(case)


def test_unknown_repeat_arm_is_a_case_error():
    with pytest.raises(CaseError, match="unknown arm 'turbo'"):
        arms_for_case(make_case({"repeat": {"arm": "turbo"}}))


def test_arm_by_name_lists_valid_arms():
    with pytest.raises(CaseError, match="its arms: eager, eager-repeat"):
        arm_by_name(make_case({"repeat": {}}, parallel={"cp": 2}), "graph")


def test_fixed_cp_options_from_name():
    assert options_for_arm(make_case(), "fixed-cp4").fixed_cp == 4
    assert options_for_arm(make_case(), "fixed-cp4-repeat").fixed_cp == 4
