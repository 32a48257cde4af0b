"""Every case-file section reaches the judge: it survives ``case.json`` and ``plan.json`` (what
``collect``, ``gate`` and ``report`` judge by), the case hash covers it, and ``memory_model``
bounds what it says it bounds.

The sections are declared once (``harness.spec.schema.CaseSections``); the tests are
parametrized over ``CaseFile``'s fields, so a section added there is tested here without a line
changed: its example is the first file of ``tests/data/case_sections/`` then ``cases/`` that sets
it (none: the test fails, asking for one).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from harness.arms import plan_case
from harness.caseplan import case_hash, read_plan
from harness.judge import judge, read_arms
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import CASE_FILE, OUTCOME_FILE, PredictedMemory, StepWriter, read_json, read_steps
from harness.spec.loader import cases_from_text, load_cases
from harness.spec.schema import ArmCase, BaseCase, Case, CaseFile, CaseSections

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((Path(__file__).parent / "data" / "case_sections").glob("*.yaml"))
CASES = sorted(REPO.glob("cases/*/*.yaml"))
RUN = Path(__file__).parent / "data" / "records_written" / "run" / "tiny-moe-eager"
# The one case-file field matrix expansion consumes: a case holds the values it gave.
EXPANDED = {"matrix": "matrix_values"}


def _example(field: str) -> Path:
    for path in EXAMPLES + CASES:
        if field in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
            return path
    pytest.fail(f"no case file sets '{field}': add one to tests/data/case_sections/ that sets it "
                "away from its default")


def test_a_case_holds_every_field_of_its_file() -> None:
    """What the loader copies by name (``Case.of_file``): every field of a case file but the
    matrix, which expansion turns into ``matrix_values``; the sections once, in both."""
    assert set(CaseFile.model_fields) - set(Case.model_fields) == set(EXPANDED)
    assert set(CaseSections.model_fields) <= set(BaseCase.model_fields) & set(CaseFile.model_fields)
    assert list(ArmCase.model_fields)[:len(BaseCase.model_fields)] == list(BaseCase.model_fields)


@pytest.mark.parametrize("field", list(CaseFile.model_fields))
def test_every_section_survives_case_json_and_plan_json(tmp_path: Path, field: str) -> None:
    source = _example(field)
    case = load_cases([source])[0]
    key = EXPANDED.get(field, field)
    default = Case.model_fields[key].get_default(call_default_factory=True)
    assert getattr(case, key) != default, f"{source} leaves '{field}' at its default"
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, tmp_path)
    stored = read_json(case_dir / CASE_FILE)
    assert key in stored
    back = read_plan(case_dir)  # what collect, gate and report judge by
    assert back.case == case and getattr(back.case, key) == getattr(case, key)
    assert [a.case for a in back.arms] == [a.case for a in plan.arms]
    if key in CaseSections.model_fields:  # an arm runs the case's sections
        assert all(getattr(a.case, key) == getattr(case, key) for a in back.arms)
    without = {k: v for k, v in stored.items() if k != key}
    assert case_hash(without) != case_hash(stored) == back.case_hash


# --------------------------------------------------------------------------- memory_model
CASE = """\
name: bounded-memory
model: {preset: tiny, layers: 2}
train: {steps: 12, global_batch: 8, seq_length: 128, lr: 3.0e-3, seed: 1234}
data: {lengths: {distribution: uniform, min: 16, max: 96}}
compare: {repeat: {loss: exact}}
resources: {gpus_per_node: 1, time_min: 5}
"""
MIB = 2**20


def _sweep(tmp_path: Path, section: str, predicted_peak_mib: int) -> Path:
    """A case folder of the case (with ``section``) whose two arms recorded the real CPU run's
    steps of ``tests/data/records_written/run`` plus a memory plan beside a measured peak of
    1000 MiB (as a CUDA rank records them)."""
    (case,) = [c.case for c in cases_from_text(CASE + section, str(tmp_path / "case.yaml"))]
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, tmp_path / "sweep")
    pred = PredictedMemory(None, None, predicted_peak_mib * MIB, 900 * MIB)
    for arm in plan.arm_names:
        (case_dir / arm).mkdir()
        shutil.copy(RUN / "eager" / OUTCOME_FILE, case_dir / arm / OUTCOME_FILE)
        writer = StepWriter(case_dir / arm, 0)
        for rec in read_steps(RUN / "eager")[0]:
            writer.append(dataclasses.replace(rec, max_allocated_bytes=1000 * MIB,
                                              memory_predicted=pred if rec.step == 1 else None))
    return case_dir


def _verdict(case_dir: Path):  # noqa: ANN202
    plan = read_plan(case_dir)  # the bound as case.json keeps it
    return judge(plan, read_arms(case_dir, plan))


def _memory_checks(verdict) -> list:  # noqa: ANN001
    return [c for p in verdict.pairs for c in p.checks if c.name.endswith(".memory_model")]


def test_a_memory_model_bound_exceeded_fails(tmp_path: Path) -> None:
    verdict = _verdict(_sweep(tmp_path, "memory_model: {max_rel: 0.05}\n", 1100))
    checks = _memory_checks(verdict)
    assert [c.name for c in checks] == ["eager.memory_model", "eager-repeat.memory_model"]
    assert all(not c.passed and not c.figure and c.bound == 0.05 for c in checks)
    assert abs(checks[0].value - 0.1) < 1e-9 and "rank 0: peak 1.100" in checks[0].detail
    assert verdict.status == "fail"
    failed = {c.name for p in verdict.pairs for c in p.checks if not c.passed}
    assert failed == {c.name for c in checks}  # the bound, nothing else


def test_a_memory_model_bound_held_passes(tmp_path: Path) -> None:
    verdict = _verdict(_sweep(tmp_path, "memory_model: {max_rel: 0.05}\n", 1040))
    assert verdict.status == "pass"
    assert all(c.passed and not c.figure for c in _memory_checks(verdict))


def test_without_memory_model_the_ratio_is_a_figure(tmp_path: Path) -> None:
    verdict = _verdict(_sweep(tmp_path, "", 1100))
    assert verdict.status == "pass"
    assert all(c.figure and c.bound is None for c in _memory_checks(verdict))
