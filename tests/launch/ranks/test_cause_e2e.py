"""The cause of a failed arm where the user looks: a real CPU sweep (two arms, ``compare.repeat``)
whose rank 1 raises at step 2 (``tests/launch/faults.py``) shows ``RuntimeError: injected fault
...`` in the run's console table, the gate's output, ``summary.md`` and the JUnit message, also
where a damaged record makes the entry a failure; a sweep written before the cause was kept (its
``outcome.json`` without one) is judged as before."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import read_outcome

from tests.launch.cases import REPEAT, write_case_file
from tests.launch.faults import fault_env

CAUSE = "RuntimeError: injected fault: crash at step 2 on rank 1 (HARNESS_TEST_FAULT)"


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(sweep folder, stdout, stderr of `dcp-harness run`) of a 2-rank case whose rank 1 crashes
    in both arms."""
    root = tmp_path_factory.mktemp("cause")
    case = write_case_file(root / "cases", "crashing", resources={"gpus_per_node": 2},
                           compare=REPEAT)
    out = root / "sweep"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**fault_env("crash@2:1"), "OMP_NUM_THREADS": "1"}.items():
            mp.setenv(key, value)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            assert main(["run", str(case), "--out", str(out)]) == 2
    return out, stdout.getvalue(), stderr.getvalue()


def test_the_outcomes_keep_the_failing_ranks_cause(crashed) -> None:
    out = crashed[0]
    for arm in ("eager", "eager-repeat"):
        outcome = read_outcome(out / "crashing" / arm)
        assert outcome is not None and outcome.status == "failed" and outcome.cause == CAUSE


def _describe(out: Path, arm: str) -> str:
    outcome = read_outcome(out / "crashing" / arm)
    assert outcome is not None
    return f"arm '{arm}' {outcome.describe()}"


def test_the_run_and_the_gate_print_the_cause(crashed, capsys) -> None:
    out, printed, progress = crashed
    assert f"crashing / eager: {read_outcome(out / 'crashing' / 'eager').describe()}" in progress
    table, _, after = printed.partition("results: ")  # the console table, then the gate's lines
    # The table (not a terminal): one line per pair within 120 columns; the gate's lines under it
    # give each entry that did not pass whole, with both arms' cause.
    (row,) = [line for line in table.splitlines() if line.startswith("ERROR crashing / repeat")]
    assert len(row) <= 120 and "arm 'eager' failed" in row
    assert after.count(f"cause: {CAUSE}") == 2
    assert main(["gate", str(out)]) == 2
    (error,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ERROR")]
    both = f"{_describe(out, 'eager')}; {_describe(out, 'eager-repeat')}"
    assert error == f"  ERROR crashing / repeat: {both}"
    assert error.endswith(f"; cause: {CAUSE}")


def test_summary_and_junit_name_the_cause(crashed) -> None:
    out = crashed[0]
    summary = (out / "summary.md").read_text()
    errors = summary.split("## Errors", 1)[1]
    assert errors.count(f"cause: {CAUSE}") == 2
    (error,) = ET.parse(out / "junit.xml").getroot().iter("error")
    assert error.get("message") == (f"arm 'eager' failed: {CAUSE}; "
                                    f"arm 'eager-repeat' failed: {CAUSE}")
    assert (error.text or "").count(f"cause: {CAUSE}") == 2


def test_a_failure_with_a_crashed_arm_names_the_cause_too(crashed, tmp_path, capsys) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(crashed[0], damaged)
    records = damaged / "crashing" / "eager" / "rank0.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    lines[0]["loss"] += 0.5  # step 1 no longer repeats bitwise: a failed check with a value
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    main(["report", str(damaged)])  # the reports of the damaged copy, judged from its records
    # its table off a terminal: one line per pair (within 120 columns), the why cut there; the
    # whole why is in summary.md, junit.xml and the gate's line
    (row,) = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("FAIL crashing / repeat")]
    assert len(row) <= 120 and "eager-repeat.steps_complete, loss" in row
    (failure,) = ET.parse(damaged / "junit.xml").getroot().iter("failure")
    assert failure.get("message", "").endswith(f"loss; arm 'eager' failed: {CAUSE}; "
                                                f"arm 'eager-repeat' failed: {CAUSE}")
    failures = (damaged / "summary.md").read_text().split("## Failures", 1)[1]
    assert f"{_describe(damaged, 'eager')}; {_describe(damaged, 'eager-repeat')}" in failures
    assert main(["gate", str(damaged)]) == 1  # the gate's FAIL line names the cause too
    (fail,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  FAIL")]
    assert fail.endswith(f"loss; arm 'eager' failed: {CAUSE}; arm 'eager-repeat' failed: {CAUSE}")


def test_a_sweep_from_before_the_cause_is_judged_as_before(crashed, tmp_path, capsys) -> None:
    old = tmp_path / "old"
    shutil.copytree(crashed[0], old)
    for arm in ("eager", "eager-repeat"):
        path = old / "crashing" / arm / "outcome.json"
        data = json.loads(path.read_text())
        del data["cause"]
        path.write_text(json.dumps(data))
    verdict = old / "crashing" / "verdict.json"
    verdict.write_text(verdict.read_text().replace(f"; cause: {CAUSE}", ""))
    assert main(["gate", str(old)]) == 2
    (error,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ERROR")]
    both = f"{_describe(old, 'eager')}; {_describe(old, 'eager-repeat')}"
    assert error == f"  ERROR crashing / repeat: {both}"
    assert "cause" not in error and "rank 1 exited with exit code 1" in error
