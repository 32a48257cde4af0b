"""Pair contracts and arm checks on hand-made step records."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Optional

import pytest

from harness.compare import (
    CONTRACTS,
    CaseVerdict,
    Check,
    Pair,
    PairVerdict,
    StoredPair,
    arm_checks,
    evaluate_case,
    read_verdict,
    write_verdict,
)
from harness.results import (ArmOutcome, FrameReplays, ResultsError, StepRecord, read_typed,
                             record_json)
from tests.records import GIB, changed, graph_stats, probe, record

OK = ArmOutcome(status="ok", returncode=0, wall_s=1.0)


def run(losses: list[float], ranks: int = 2, *, grad: Optional[list[float]] = None,
        aux: Optional[list[float]] = None, mem: Optional[float] = None,
        reserved: Optional[float] = None, at: Optional[dict[int, dict]] = None,
        ) -> dict[int, list[StepRecord]]:
    """Step records of one arm: the same global loss on every rank; ``at``: step -> fields
    changed on that step."""
    n = len(losses)
    recs = [record(i + 1, loss, aux_loss=(aux or [0.01] * n)[i], grad_norm=(grad or [1.0] * n)[i],
                   nan=not math.isfinite(loss), step_time_s=0.1, device="cpu",
                   reserved_bytes=None if reserved is None else int(reserved),
                   max_allocated_bytes=None if mem is None else int(mem),
                   # the memory probe after the last step
                   memory_probe=probe(mem, reserved=reserved or 0) if mem is not None and i == n - 1
                   else None)
            for i, loss in enumerate(losses)]
    return changed({rank: list(recs) for rank in range(ranks)}, at or {})


LOSS = [2.5, 2.31, 2.2, 2.1]


def by_name(v: PairVerdict) -> dict[str, Check]:
    return {c.name: c for c in v.checks}


def one(case_pairs: list[Pair], data: dict, **kw: int) -> CaseVerdict:
    kw.setdefault("expected_steps", len(LOSS))
    kw.setdefault("expected_ranks", 2)
    return evaluate_case("c1", case_pairs, data, **kw)


REPEAT = Pair("repeat", "repeat", ("eager", "eager-repeat"), {"arm": "eager", "loss": "exact"})


# --------------------------------------------------------------------------- arm checks
def test_arm_checks_pass_on_clean_run() -> None:
    checks = arm_checks("eager", run(LOSS), expected_steps=4, expected_ranks=2)
    assert [c.name for c in checks] == ["eager.steps_complete", "eager.no_nan_inf", "eager.no_skipped_step"]
    assert all(c.passed and c.value == 0 and c.bound == 0 for c in checks)


def test_missing_steps_and_ranks_are_named() -> None:
    data = run(LOSS[:2], ranks=1)
    c = arm_checks("eager", data, expected_steps=4, expected_ranks=2)[0]
    assert not c.passed and c.value == 6
    assert "rank 0: 3-4" in c.detail and "rank 1: 1-4" in c.detail


def test_duplicated_step_fails_completeness() -> None:
    data = run(LOSS, ranks=1)
    data[0].append(data[0][-1])
    c = arm_checks("eager", data, expected_steps=4, expected_ranks=1)[0]
    assert not c.passed and "duplicated rank 0: 4" in c.detail


@pytest.mark.parametrize("field,value", [("loss", math.nan), ("grad_norm", math.inf), ("loss", None)])
def test_nan_inf_detected_and_named(field: str, value: Optional[float]) -> None:
    data = run(LOSS, at={3: {field: value}})
    verdict = one([REPEAT], {"eager": (OK, data), "eager-repeat": (OK, run(LOSS))})
    assert verdict.status == "fail"
    failed = [c for c in verdict.pairs[0].checks if not c.passed]
    names = [c.name for c in failed]
    assert "eager.no_nan_inf" in names
    nan_check = by_name(verdict.pairs[0])["eager.no_nan_inf"]
    assert nan_check.value == 2  # two ranks
    assert f"rank 0 step 3: {field}=" in nan_check.detail


def test_nan_flag_alone_fails() -> None:
    c = arm_checks("eager", run(LOSS, at={2: {"nan": True}}), 4, 2)[1]
    assert not c.passed and "nan=true" in c.detail


def test_skipped_step_fails() -> None:
    c = arm_checks("eager", run(LOSS, at={4: {"skipped": True}}), 4, 2)[2]
    assert not c.passed and c.value == 2 and "rank 0 step 4" in c.detail


def test_inferred_expectations_without_case_figures() -> None:
    data = run(LOSS, ranks=3)
    del data[1]
    c = arm_checks("eager", data)[0]
    assert not c.passed and "rank 1: 1-4" in c.detail


# --------------------------------------------------------------------------- repeat
def test_repeat_exact_pass_and_fail() -> None:
    good = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run(LOSS))})
    assert good.status == "pass" and good.pairs[0].status == "pass"
    assert by_name(good.pairs[0])["loss"].value == 0.0
    drift = [*LOSS[:2], LOSS[2] + 1e-12, LOSS[3]]
    bad = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run(drift))})
    loss = by_name(bad.pairs[0])["loss"]
    assert bad.status == "fail" and not loss.passed and loss.bound == 0.0
    assert "step 3" in loss.detail and "1 of 4 steps" in loss.detail
    assert by_name(bad.pairs[0])["grad_norm"].passed


def test_repeat_exact_checks_grad_norm_bitwise() -> None:
    bad = one([REPEAT], {"eager": (OK, run(LOSS)),
                         "eager-repeat": (OK, run(LOSS, grad=[1.0, 1.0, 1.0 + 2 ** -52, 1.0]))})
    assert [c.name for c in bad.pairs[0].failed_checks] == ["grad_norm"]


def test_repeat_with_tolerance() -> None:
    pair = Pair("repeat", "repeat", ("eager", "eager-repeat"), {"loss": {"max_rel": 1e-3}})
    close = [x * (1 + 5e-4) for x in LOSS]
    far = [*LOSS[:3], LOSS[3] * 1.01]
    ok = one([pair], {"eager": (OK, run(close)), "eager-repeat": (OK, run(LOSS))})
    loss = by_name(ok.pairs[0])["loss"]
    assert ok.status == "pass" and loss.bound == 1e-3 and 4e-4 < loss.value < 6e-4
    bad = one([pair], {"eager": (OK, run(far)), "eager-repeat": (OK, run(LOSS))})
    loss = by_name(bad.pairs[0])["loss"]
    assert bad.status == "fail" and loss.value == pytest.approx(0.01) and "step 4" in loss.detail


# --------------------------------------------------------------------------- dcp vs fixed cp
DCP = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("dcp", "fixed-cp2"),
           {"fixed_cp": 2, "loss": {"max_rel": 0.02}, "aux_loss": {"max_rel": 0.1},
            "device_delta_pct": 1.0, "reserved_delta_pct": 5.0})


def test_dcp_vs_fixed_cp_pass_records_worst_step_and_na_memory_on_cpu() -> None:
    dcp = [2.5, 2.3104, 2.2, 2.1]
    fixed = [2.5, 2.3110, 2.2, 2.1]
    v = one([DCP], {"dcp": (OK, run(dcp)), "fixed-cp2": (OK, run(fixed))})
    assert v.status == "pass"
    checks = by_name(v.pairs[0])
    assert "step 2: 2.3104 (dcp) vs 2.311 (fixed-cp2)" in checks["loss"].detail
    assert checks["loss"].value == pytest.approx(0.0006 / 2.311)
    for name in ("device_delta_pct", "reserved_delta_pct"):
        assert checks[name].passed and not checks[name].applicable
        assert "not applicable" in checks[name].detail


def test_dcp_vs_fixed_cp_loss_and_aux_failures() -> None:
    v = one([DCP], {"dcp": (OK, run([2.5, 2.49, 2.2, 2.1], aux=[0.01, 0.02, 0.01, 0.01])),
                    "fixed-cp2": (OK, run(LOSS))})
    assert v.status == "fail"
    assert {c.name for c in v.pairs[0].failed_checks} == {"loss", "aux_loss"}
    assert "step 2" in by_name(v.pairs[0])["aux_loss"].detail


def test_aux_loss_zero_on_both_arms_passes() -> None:
    v = one([DCP], {"dcp": (OK, run(LOSS, aux=[0.0] * 4)), "fixed-cp2": (OK, run(LOSS, aux=[0.0] * 4))})
    assert by_name(v.pairs[0])["aux_loss"].passed


def test_dcp_vs_fixed_cp_memory_deltas() -> None:
    ok = one([DCP], {"dcp": (OK, run(LOSS, mem=10.05 * GIB, reserved=12 * GIB)),
                     "fixed-cp2": (OK, run(LOSS, mem=10 * GIB, reserved=12 * GIB))})
    checks = by_name(ok.pairs[0])
    assert ok.status == "pass" and checks["device_delta_pct"].applicable
    assert checks["device_delta_pct"].value == pytest.approx(0.05)  # % of the 100 GiB device
    assert "+51 MiB (+0.05%)" in checks["device_delta_pct"].detail
    assert checks["active_delta_pct"].value == pytest.approx(0.5)  # % of the fixed-CP arm's
    assert checks["reserved_delta_pct"].value == pytest.approx(0.0)
    bad = one([DCP], {"dcp": (OK, run(LOSS, mem=10 * GIB, reserved=13 * GIB)),
                      "fixed-cp2": (OK, run(LOSS, mem=10 * GIB, reserved=12 * GIB))})
    res = by_name(bad.pairs[0])["reserved_delta_pct"]
    assert bad.status == "fail" and not res.passed and res.value == pytest.approx(100 / 12)
    assert "+8.33%" in res.detail


def test_dcp_memory_check_is_one_sided() -> None:
    less = one([DCP], {"dcp": (OK, run(LOSS, mem=5 * GIB, reserved=6 * GIB)),
                       "fixed-cp2": (OK, run(LOSS, mem=10 * GIB, reserved=12 * GIB))})
    assert less.status == "pass"


def test_absolute_plus_relative_tolerance_is_isclose() -> None:
    pair = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("dcp", "fixed-cp2"),
                {"fixed_cp": 2, "loss": {"max_abs": 0.01, "max_rel": 0.0}, "aux_loss": "exact"})
    v = one([pair], {"dcp": (OK, run([x + 0.009 for x in LOSS])), "fixed-cp2": (OK, run(LOSS))})
    loss = by_name(v.pairs[0])["loss"]
    assert loss.passed and loss.bound == pytest.approx(0.01)
    v = one([pair], {"dcp": (OK, run([x + 0.011 for x in LOSS])), "fixed-cp2": (OK, run(LOSS))})
    assert not by_name(v.pairs[0])["loss"].passed


# --------------------------------------------------------------------------- graph vs eager
def captured(data: dict) -> dict:
    """A graph arm's records: capture statistics (2 variants) on step 1, both replayed."""
    frames = (FrameReplays(1, 0, 4), FrameReplays(2, 1, 4))
    at = {s: {"graphed": True, "replays": frames} for s in range(1, 5)}
    at[1]["graph_stats"] = graph_stats(100.0, 100.0, 1)
    return changed(data, at)


def test_graph_vs_eager_exact_and_separate_grad_norm_tolerance() -> None:
    pair = Pair("graph_vs_eager", "graph_vs_eager", ("graph", "eager"),
                {"loss": "exact", "grad_norm": {"max_rel": 1e-6}})
    v = one([pair], {"graph": (OK, captured(run(LOSS, grad=[1.0, 1.0, 1.0 + 1e-9, 1.0]))),
                     "eager": (OK, run(LOSS))})
    assert v.status == "pass"
    capture = by_name(v.pairs[0])["capture"]
    assert capture.figure and capture.bound is None and "2 dynamic-CP variants" in capture.detail
    v = one([pair], {"graph": (OK, captured(run([2.5, 2.31, 2.2, 2.1000001]))),
                     "eager": (OK, run(LOSS))})
    assert [c.name for c in v.pairs[0].failed_checks] == ["loss"]
    # A graph arm that never captured: nothing replayed, variants_replayed fails.
    v = one([pair], {"graph": (OK, run(LOSS)), "eager": (OK, run(LOSS))})
    assert [c.name for c in v.pairs[0].failed_checks] == ["variants_replayed"]
    assert "never captured its graphs" in v.pairs[0].failed_checks[0].detail


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("status", ["failed", "timeout", "infra"])
def test_crashed_arm_makes_the_pair_an_error_not_a_fail(status: str) -> None:
    crashed = ArmOutcome(status=status, returncode=1 if status == "failed" else None,
                         wall_s=3.0, detail="rank 1 exited 1")
    v = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (crashed, run(LOSS[:2]))})
    p = v.pairs[0]
    assert v.status == "error" and p.status == "error"
    assert "eager-repeat" in p.error and "rank 1 exited 1" in p.error
    assert [c.name for c in p.failed_checks] == ["eager-repeat.steps_complete"]


def test_divergence_before_a_crash_is_still_a_failure() -> None:
    crashed = ArmOutcome(status="failed", returncode=1)
    v = one([REPEAT], {"eager": (OK, run(LOSS)),
                       "eager-repeat": (crashed, run([2.5, math.nan]))})
    assert v.status == "fail" and "eager-repeat.no_nan_inf" in [c.name for c in v.pairs[0].failed_checks]


def test_missing_arm_and_missing_outcome_are_errors() -> None:
    v = one([REPEAT], {"eager": (OK, run(LOSS))})
    assert v.status == "error" and "'eager-repeat' has no results" in v.pairs[0].error
    v = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (None, run(LOSS))})
    assert v.status == "error" and "never finished" in v.pairs[0].error


def _again(pair: Pair) -> Pair:
    """``pair`` written as plan.json keeps it and read back."""
    return read_typed(StoredPair, record_json(StoredPair.of(pair)), "pair").pair()


def test_unknown_contract_is_an_error_and_bad_settings_are_refused_when_made() -> None:
    data = {"a": (OK, run(LOSS)), "b": (OK, run(LOSS))}
    v = one([Pair("x", "nope", ("a", "b"))], data)
    assert v.status == "error" and "unknown contract 'nope'" in v.pairs[0].error
    # Typed settings: a bad one is refused when the pair is made (at plan time, before any run).
    with pytest.raises(ValueError, match="pair 'r': bad repeat settings: loss"):
        Pair("r", "repeat", ("a", "b"), {"loss": "close-enough"})
    pair = Pair("r", "repeat", ("a", "b"), {"loss": {"max_rel": 1e-3}})
    assert pair.params.loss.max_rel == 1e-3 and _again(pair) == pair


def test_ok_outcome_with_missing_steps_is_a_fail() -> None:
    v = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run(LOSS[:3]))})
    assert v.status == "fail"


# --------------------------------------------------------------------------- cases, round-trip
def test_case_without_pairs_gets_a_checks_entry() -> None:
    v = one([], {"eager": (OK, run(LOSS))})
    assert [p.pair for p in v.pairs] == ["checks"] and v.status == "pass"
    assert [c.name for c in v.pairs[0].checks] == [
        "eager.steps_complete", "eager.no_nan_inf", "eager.no_skipped_step", "eager.ranks_agree",
        "eager.cp_balance", "eager.grad_norm_nonzero", "eager.loss_moves", "eager.loss_spike"]
    v = one([], {"eager": (OK, run(LOSS, at={2: {"skipped": True}}))})
    assert v.status == "fail"
    v = one([], {})
    assert v.status == "error"


def test_arms_outside_pairs_get_checked_too() -> None:
    v = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run(LOSS)),
                       "extra": (OK, run(LOSS[:1]))})
    assert [p.pair for p in v.pairs] == ["repeat", "checks"]
    assert v.pairs[1].arms == ("extra",) and v.status == "fail"


def test_fail_beats_error_at_case_level() -> None:
    crashed = ArmOutcome(status="timeout")
    v = one([REPEAT, DCP], {"eager": (OK, run(LOSS)), "eager-repeat": (crashed, {}),
                            "dcp": (OK, run([3.0] * 4)), "fixed-cp2": (OK, run(LOSS))})
    assert [p.status for p in v.pairs] == ["error", "fail"] and v.status == "fail"


def test_verdict_json_round_trip(tmp_path: Path) -> None:
    v = one([REPEAT, DCP], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run([math.nan] * 4)),
                            "dcp": (OK, run(LOSS)), "fixed-cp2": (OK, run(LOSS))})
    write_verdict(tmp_path, v)
    back = read_verdict(tmp_path)
    assert back is not None
    # NaN-valued checks: compare through the JSON form (NaN != NaN).
    assert record_json(back) == record_json(read_typed(CaseVerdict, record_json(v), "verdict"))
    assert [c.name for c in back.pairs[0].checks] == [c.name for c in v.pairs[0].checks]
    assert back.pairs[1] == v.pairs[1]
    assert read_verdict(tmp_path / "none") is None
    assert _again(DCP) == DCP


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["pairs"][0]["checks"][0].update(colour=1), "field 'pairs.0.checks.0.colour'"),
    (lambda d: d["pairs"][0]["checks"][0].update(passed="yes"), "field 'pairs.0.checks.0.passed'"),
    (lambda d: d["pairs"][0].update(status="passed"), "field 'pairs.0.status'"),
    (lambda d: d["pairs"][0].pop("contract"), "field 'pairs.0.contract'"),
    (lambda d: d.update(status="skipped", pairs=[{**d["pairs"][0], "status": "skipped"}]),
     "names its skip kind"),
])
def test_a_damaged_verdict_file_is_an_error_naming_the_field(tmp_path: Path, edit, named) -> None:
    v = one([REPEAT], {"eager": (OK, run(LOSS)), "eager-repeat": (OK, run(LOSS))})
    data = record_json(v)
    edit(data)
    (tmp_path / "verdict.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=re.escape(named)):
        read_verdict(tmp_path)


def test_contract_registry_is_read_only() -> None:
    assert set(CONTRACTS) >= {"repeat", "dcp_vs_fixed_cp", "graph_vs_eager"}
    with pytest.raises(TypeError):
        CONTRACTS["x"] = CONTRACTS["repeat"]  # type: ignore[index]
