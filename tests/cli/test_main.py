"""The `dcp-harness` entry point: dispatch, exit codes, and the issue's done-means end to end."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
DIVERGING = REPO / "tests" / "workload" / "fixtures" / "diverging.yaml"


def test_every_documented_command_is_registered():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) >= {"validate", "plan", "run", "submit", "status", "collect", "report", "gate"}


def test_module_entry_point_prints_help():
    proc = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "validate" in proc.stdout and "gate" in proc.stdout


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run"])  # PATH is required
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_validate_focused_cases(capsys):
    assert main(["validate", str(REPO / "cases" / "focused")]) == 0
    assert "valid case" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, expect",
    [
        ("name: x\ntrain: {steps: 1, global_batch: 2, seq_length: 8, lr: 1.0\n", "invalid YAML"),
        ("name: x\nbogus: 1\ntrain: {steps: 1, global_batch: 2, seq_length: 8, lr: 1.0}\n", "bogus"),
        ("name: x\ntrain: {steps: two, global_batch: 2, seq_length: 8, lr: 1.0}\n", "train.steps"),
        ("name: x\nparallel: {pp: 3}\ntrain: {steps: 1, global_batch: 2, seq_length: 8, lr: 1.0}\n",
         "parallel"),
    ],
    ids=["syntax", "unknown-key", "bad-type", "impossible-layout"],
)
def test_broken_case_files_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch, text, expect):
    case = tmp_path / "broken.yaml"
    case.write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(case)]) == 2
    assert main(["run", str(case), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 2 and all("broken.yaml" in l and expect in l for l in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yaml"]  # no out/, no results/


def test_report_and_gate_on_missing_folder_exit_2(tmp_path, capsys):
    assert main(["gate", str(tmp_path / "nope")]) == 2
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_diverging_training_fails_the_gate_naming_the_check(tmp_path, capsys):
    """Issue 2 done-means: real NaN/Inf divergence -> gate exits 1 with the failing check named."""
    case = tmp_path / "diverging.yaml"
    shutil.copy(DIVERGING, case)
    out = tmp_path / "sweep"
    assert main(["run", str(case), "--out", str(out)]) == 1
    capsys.readouterr()
    assert main(["gate", str(out)]) == 1
    printed = capsys.readouterr()
    assert "no_nan_inf" in printed.out + printed.err
    verdict = json.loads((out / "diverging-lr" / "verdict.json").read_text())
    failed = {c["name"] for p in verdict["pairs"] for c in p["checks"] if not c["passed"]}
    assert "eager.no_nan_inf" in failed
    junit = (out / "junit.xml").read_text()
    assert "<failure" in junit and "no_nan_inf" in junit
