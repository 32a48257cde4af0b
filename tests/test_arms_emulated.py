"""The plan of a case of emulated ranks: arms on the emulated ranks of the world, and what the
pairs judge, decided when the plan is made (and kept in plan.json)."""

import json

import pytest

from harness.arms import EMULATED_LOSSES, plan_case
from harness.caseplan import (
    PLAN_VERSION,
    CasePlan,
    PlanError,
    PlannedArm,
    plan_from_files,
    read_plan,
)
from harness.compare import ARM_CHECKS_PAIR, Pair, StoredPair
from harness.errors import CaseError
from harness.results import ResultsError, read_typed, record_json
from harness.launch.sweep_folder import prepare_case_dir
from harness.spec.derive import as_emulated
from harness.spec.schema import Case

from tests.test_arms import GRAPHS, make_case


def emulated(case: Case, ranks=(0, 3)) -> Case:
    return as_emulated(case, list(ranks))


FULL = {"graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2}, "graph_pools": {},
        "reference": {}, "golden": {}}


def test_every_arm_runs_the_emulated_ranks_of_the_whole_world():
    plan = plan_case(emulated(make_case(compare=FULL, graphs=GRAPHS), (3, 0)))
    assert plan.emulated and plan.title == "c (emulated rank 0 of 4, emulated rank 3 of 4)"
    assert [a.name for a in plan.arms] == ["graph", "dcp", "graph-fixed-cp2", "graph-separate-pools"]
    for arm in plan.arms:
        assert arm.emulated and arm.ranks == (0, 3) and arm.world_size == 4
        assert arm.case.emulated_ranks == (0, 3)
        assert arm.labels == ("emulated rank 0 of 4 (PP stage 0 of 1, pool rank 0)",
                              "emulated rank 3 of 4 (PP stage 0 of 1, pool rank 3)")
    assert plan.expected_ranks["graph"] == (0, 3)
    real = plan_case(make_case(compare=FULL, graphs=GRAPHS))
    assert not real.emulated and real.arm("reference").ranks == (0,)
    assert all(a.ranks == (0, 1, 2, 3) for a in real.arms if a.name != "reference")


def test_reference_and_golden_are_skipped_with_the_reason_and_their_arm_is_not_run():
    plan = plan_case(emulated(make_case(compare=FULL, graphs=GRAPHS)))
    pairs = {p.name: p for p in plan.pairs}
    assert "reference" not in plan.arm_names
    for name in ("reference", "reference-graph-fixed-cp2", "golden"):
        assert pairs[name].skipped.startswith("not run for emulated ranks: " + EMULATED_LOSSES)
    assert "single-rank reference arm trains the real model" in pairs["reference"].skipped
    assert "golden values are the model's losses" in pairs["golden"].skipped


def test_loss_checks_between_layouts_and_loss_sanity_are_not_applicable():
    plan = plan_case(emulated(make_case(compare=FULL, graphs=GRAPHS)))
    pairs = {p.name: p for p in plan.pairs}
    dcp = pairs["dcp_vs_fixed_cp"].not_applicable_checks
    assert {"loss", "aux_loss", "grad_norm"} <= set(dcp)
    assert "lay the tokens over other ranks" in dcp["loss"]
    gve = pairs["graph_vs_eager"]
    assert "loss" not in gve.not_applicable_checks  # graph vs eager stays bitwise, per rank
    assert {"graph.loss_moves", "graph.loss_spike", "dcp.loss_moves", "dcp.loss_spike"} == set(
        gve.not_applicable_checks)
    assert all(p.emulated == 4 for p in plan.pairs)
    assert all(p.emulated is None and not p.not_applicable and p.skipped is None
               for p in plan_case(make_case(compare=FULL, graphs=GRAPHS)).pairs)


def test_a_case_without_pairs_gets_its_arm_checks_entry_with_the_loss_sanity_not_applicable():
    plan = plan_case(emulated(make_case()))
    (pair,) = plan.pairs
    assert pair.name == ARM_CHECKS_PAIR and pair.arms == ("dcp",)
    assert set(pair.not_applicable_checks) == {"dcp.loss_moves", "dcp.loss_spike"}
    assert plan_case(make_case()).pairs == ()


def test_plan_json_says_each_arm_is_emulated_and_reads_back(tmp_path):
    plan = plan_case(emulated(make_case(compare=FULL, graphs=GRAPHS)))
    case_dir = prepare_case_dir(plan, tmp_path)
    stored = json.loads((case_dir / "plan.json").read_text())
    assert stored["version"] == PLAN_VERSION == 3
    arm = stored["arms"][0]
    assert arm["ranks"] == [0, 3] and arm["world_size"] == 4
    assert arm["emulated"] == ["emulated rank 0 of 4 (PP stage 0 of 1, pool rank 0)",
                               "emulated rank 3 of 4 (PP stage 0 of 1, pool rank 3)"]
    ref = next(p for p in stored["pairs"] if p["name"] == "reference")
    assert ref["skipped"].startswith("not run for emulated ranks") and ref["emulated"] == 4
    again = read_plan(case_dir)
    assert again.arms == plan.arms and again.pairs == plan.pairs
    # a plan.json whose 'emulated' disagrees with its arm's case is refused
    arm["emulated"] = None
    with pytest.raises(Exception, match="'emulated' None is not what its case emulates"):
        plan_from_files(json.loads((case_dir / "case.json").read_text()), stored, case_dir)


@pytest.mark.parametrize("damage, field, message", [
    (lambda d: d["arms"][0].update(gpus=1), "arms.0.gpus", "unknown key 'gpus'"),
    (lambda d: d["arms"][1].update(world_size="4"), "arms.1.world_size", "valid integer"),
    (lambda d: d["arms"][0].update(kind="eagre"), "arms.0.kind", "'eager'"),
    (lambda d: d["pairs"][0].update(arms="graph"), "pairs.0.arms", "valid tuple"),
    (lambda d: d["pairs"][1].update(skip="x"), "pairs.1.skip", "unknown key 'skip'"),
    (lambda d: d["pairs"][0]["not_applicable"].update(x=1), "pairs.0.not_applicable.x",
     "valid string"),
    (lambda d: d.pop("case_id"), "case_id", "required field is missing"),
])
def test_a_damaged_plan_json_is_an_error_naming_the_field(tmp_path, damage, field, message):
    """plan.json is read through pydantic: an unknown key or a mistyped field of a real plan is
    a PlanError naming the file and the field."""
    case_dir = prepare_case_dir(plan_case(emulated(make_case(compare=FULL, graphs=GRAPHS))),
                                tmp_path)
    stored = json.loads((case_dir / "plan.json").read_text())
    damage(stored)
    with pytest.raises(PlanError) as err:
        plan_from_files(json.loads((case_dir / "case.json").read_text()), stored, case_dir)
    text = str(err.value)
    assert text.startswith(f"{case_dir / 'plan.json'}: bad plan.json: field '{field}': ")
    assert message in text, text


def test_planned_arm_ranks_must_be_the_emulated_ones():
    arm = plan_case(emulated(make_case())).arms[0]
    with pytest.raises(ValueError, match="are not the emulated ranks"):
        PlannedArm(arm.name, arm.kind, arm.case, 4, (0, 1, 2, 3))


def test_pairs_keep_their_plan_decisions_through_plan_json():
    pair = Pair("p", "repeat", ("a", "b"), {}, skipped="why", not_applicable={"x": "y"},
                emulated=8)
    again = _read_pair(json.loads(json.dumps(record_json(StoredPair.of(pair)))))
    assert again == pair and again.rank_name(7) == "emulated rank 7 of 8"
    assert record_json(StoredPair.of(Pair("p", "repeat", ("a", "b")))).keys() == {
        "name", "contract", "arms", "params"}
    assert Pair("p", "repeat", ("a", "b")).rank_name(3) == "r3"


def _read_pair(data):
    return read_typed(StoredPair, data, "pair", nonfinite=False).pair()


def test_a_damaged_pair_is_an_error_naming_each_field():
    stored = {**record_json(StoredPair.of(Pair("p", "repeat", ("a", "b"), {}))), "emulated": "8",
              "extra": 1}
    with pytest.raises(ResultsError, match=r"bad pair: field 'emulated': .*valid integer.*; also "
                                           r"field 'extra': unknown key 'extra'"):
        _read_pair(stored)


def test_a_plan_rejects_arms_of_mixed_kinds():
    plan = plan_case(emulated(make_case()))
    real = plan_case(make_case()).arms[0]
    with pytest.raises(ValueError, match="are not emulated, the case is"):
        CasePlan(plan.case, plan.case_hash, plan.source, (real,), ())


def test_an_arm_name_the_case_cannot_have_is_still_a_case_error():
    with pytest.raises(CaseError, match="unknown arm"):
        plan_case(emulated(make_case(compare={"golden": {"arm": "nope"}})))
