"""The sweep's bookkeeping (resume, verdicts, errors) with a launcher that runs no processes.

``RecordingLauncher`` writes step records through the real results store, as the ranks would;
the tests then check what the sweep runs, skips and concludes.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.arms import plan_cases
from harness.errors import ConfigError
from harness.launch.local.backend import run_sweep
from harness.launch.sweep_folder import check_resumable, finalize_case, prepare_case_dir
from harness.report import gate
from harness.results import ArmOutcome, StepWriter, read_outcome, sweep_lock
from tests.records import record
from harness.spec import load_cases


@dataclass
class RecordingLauncher:
    """Writes ``steps`` records per rank (loss depends only on the step) and returns ``status``;
    ``fail`` maps arm names to statuses to return instead, ``boom`` arm names to raise for."""

    fail: dict = field(default_factory=dict)
    boom: tuple = ()
    calls: list = field(default_factory=list)

    def run_arm(self, plan, arm, arm_dir, case_json):
        self.calls.append((plan.case_id, arm.name))
        assert json.loads(Path(case_json).read_text())["id"] == plan.case_id
        if arm.name in self.boom:
            raise OSError("cannot spawn")
        status = self.fail.get(arm.name, "ok")
        steps = plan.steps if status == "ok" else 1
        for rank in arm.ranks:
            w = StepWriter(arm_dir, rank)
            for s in range(1, steps + 1):
                w.append(record(s, 5.0 - 0.1 * s, aux_loss=1.0))
        return ArmOutcome(status=status, returncode=0 if status == "ok" else 1,
                          detail="" if status == "ok" else "rank 0 exited with exit code 1")


def plans(paths):
    return plan_cases(load_cases(paths))


def test_resume_skips_finished_arms(write_case, tmp_path):
    cases = plans([write_case("a", compare={"repeat": {}}), write_case("b")])
    out = tmp_path / "out"
    first = RecordingLauncher(fail={"eager-repeat": "failed"})
    r1 = run_sweep(cases, out, first)
    assert first.calls == [("a", "eager"), ("a", "eager-repeat"), ("b", "eager")]
    assert [v.status for v in r1.verdicts] == ["error", "pass"]
    assert gate(out) == 2

    second = RecordingLauncher()
    r2 = run_sweep(cases, out, second)
    assert second.calls == [("a", "eager-repeat")]  # only the arm that did not finish
    assert [v.status for v in r2.verdicts] == ["pass", "pass"]
    assert gate(out) == 0

    third = RecordingLauncher()
    run_sweep(cases, out, third)
    assert third.calls == []


def test_arm_missing_steps_is_rerun_even_if_ok(write_case, tmp_path):
    cases = plans([write_case("a")])
    out = tmp_path / "out"
    run_sweep(cases, out, RecordingLauncher())
    (out / "a" / "eager" / "rank0.jsonl").write_text("")  # steps lost
    again = RecordingLauncher()
    run_sweep(cases, out, again)
    assert again.calls == [("a", "eager")]


def test_launcher_exception_is_infra_and_sweep_continues(write_case, tmp_path):
    cases = plans([write_case("a"), write_case("b", compare={"repeat": {}})])
    launcher = RecordingLauncher(boom=("eager",))
    result = run_sweep(cases, tmp_path / "out", launcher)
    assert launcher.calls == [("a", "eager"), ("b", "eager"), ("b", "eager-repeat")]
    outcome = read_outcome(tmp_path / "out" / "a" / "eager")
    assert outcome.status == "infra" and "OSError: cannot spawn" in outcome.detail
    assert [v.status for v in result.verdicts] == ["error", "error"]
    assert gate(tmp_path / "out") == 2


def test_changed_case_definition_is_refused_before_writing(write_case, tmp_path):
    out = tmp_path / "out"
    run_sweep(plans([write_case("a")]), out, RecordingLauncher())
    changed = plans([write_case("a", train={"steps": 4})])
    before = sorted(p.name for p in (out / "a").iterdir())
    with pytest.raises(ConfigError, match="different definition"):
        check_resumable([p.case for p in changed], out)
    with pytest.raises(ConfigError, match="different definition"):
        run_sweep(changed, out, RecordingLauncher())
    assert sorted(p.name for p in (out / "a").iterdir()) == before


def test_finalize_case_from_folder_alone(write_case, tmp_path):
    (plan,) = plans([write_case("a", compare={"repeat": {}})])
    out = tmp_path / "out"
    case_dir = prepare_case_dir(plan, out)
    launcher = RecordingLauncher()
    for arm in plan.arms:
        launcher.run_arm(plan, arm, case_dir / arm.name, case_dir / "case.json")
    verdict = finalize_case(case_dir)
    # No outcome.json was written: the arms never finished as far as the folder knows.
    assert verdict.status == "error"
    assert json.loads((case_dir / "verdict.json").read_text())["status"] == "error"


def test_nan_loss_fails_the_case(write_case, tmp_path):
    @dataclass
    class Diverging(RecordingLauncher):
        def run_arm(self, plan, arm, arm_dir, case_json):
            w = StepWriter(arm_dir, 0)
            for s in range(1, plan.steps + 1):
                w.append(record(s, math.nan if s == 2 else 1.0, aux_loss=1.0, nan=s == 2))
            return ArmOutcome(status="ok", returncode=0)

    result = run_sweep(plans([write_case("a")]), tmp_path / "out", Diverging())
    assert result.verdicts[0].status == "fail"
    assert gate(tmp_path / "out") == 1


def test_a_second_sweep_into_a_folder_in_use_is_refused(write_case, tmp_path):
    cases = plans([write_case("a")])
    out = tmp_path / "out"
    launcher = RecordingLauncher()
    with sweep_lock(out):  # another `dcp-harness run` is writing there
        with pytest.raises(ConfigError, match="being written by another sweep \\(pid \\d+ on "):
            run_sweep(cases, out, launcher)
        assert launcher.calls == [] and not (out / "a").exists()
    run_sweep(cases, out, launcher)
    assert launcher.calls == [("a", "eager")]  # free again once it ended
