"""`dcp-harness gate|report|run` judge from what the files prove, with the harness's own arms and
pairs (``harness.trust.stored_plan.check_stored_plan``); unusable results exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.cli import main
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import ArmOutcome, StepRecord, StepWriter, write_outcome
from harness.spec.loader import cases_from_text

from .test_report_cmd import CASE_ID, CASE_YAML, _sweep, case_json


def test_gate_flags_an_entry_the_case_does_not_define(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.5])
    path = sweep / CASE_ID / "verdict.json"
    data = json.loads(path.read_text())
    data["pairs"].append({**data["pairs"][0], "pair": "graph_vs_eager",
                          "contract": "graph_vs_eager", "arms": ["graph", "eager"]})
    path.write_text(json.dumps(data))
    assert main(["gate", str(sweep)]) == 2
    assert "entry 'graph_vs_eager' that the case does not define" in capsys.readouterr().out


def test_gate_flags_a_missing_pair(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.5])
    path = sweep / CASE_ID / "verdict.json"
    data = json.loads(path.read_text())
    data["pairs"] = []  # a verdict with nothing in it must not pass
    path.write_text(json.dumps(data))
    assert main(["gate", str(sweep)]) == 2
    assert "the entry is missing" in capsys.readouterr().out


def test_gate_and_report_say_why_records_cut_short_do_not_pass(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.5])
    rank = sweep / CASE_ID / "eager-repeat" / "rank0.jsonl"
    rank.write_text(rank.read_text().splitlines(keepends=True)[0])
    assert main(["report", str(sweep)]) == 0
    assert main(["gate", str(sweep)]) == 2
    out = capsys.readouterr().out
    assert "steps_complete says passed, the records say it fails" in out
    summary = (sweep / "summary.md").read_text()
    assert "**ERROR** (gate exit 2)" in summary


def test_gate_on_an_unreadable_case_json_is_an_error(tmp_path: Path, capsys) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.5])
    (sweep / CASE_ID / "case.json").write_text(json.dumps({**case_json(), "train": {"steps": 0}}))
    assert main(["gate", str(sweep)]) == 2
    out = capsys.readouterr().out
    assert "is not the case this sweep ran" in out and "content hash" in out


def test_run_that_meets_a_corrupt_results_file_exits_2(tmp_path: Path, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "case.yaml"
    source.write_text(CASE_YAML)
    (loaded,) = cases_from_text(source.read_text(), str(source))
    out = tmp_path / "sweep"
    case_dir = prepare_case_dir(plan_case(loaded.case), out)
    writer = StepWriter(case_dir / "eager", 0)
    writer.append(StepRecord(step=1, loss=2.0))
    writer.append(StepRecord(step=2, loss=1.5))
    rank = case_dir / "eager" / "rank0.jsonl"
    rank.write_text("not json\n" + rank.read_text())
    write_outcome(case_dir / "eager", ArmOutcome(status="ok", returncode=0))
    assert main(["run", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error: unusable results" in err and "rank0.jsonl:1" in err
