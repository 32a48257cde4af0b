"""The gate trusts only what the files prove: corrupt records, cut records and a verdict.json
that contradicts itself or the records are errors (exit 2), never a pass."""

from __future__ import annotations

import io
import json
from pathlib import Path

from harness.report import gate, gate_result, load_sweep, write_reports

from .test_report import LOSS, REPEAT, make_case, passing


def _cut(path: Path, keep_lines: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:keep_lines]))


def test_garbage_line_in_the_middle_of_a_rank_file_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    rank = d / "eager" / "rank1.jsonl"
    lines = rank.read_text().splitlines(keepends=True)
    rank.write_text("".join(lines[:2] + ["}{ garbage\n"] + lines[2:]))
    out = io.StringIO()
    assert gate(tmp_path, out) == 2
    assert "rank1.jsonl:3" in out.getvalue() and "corrupt step record" in out.getvalue()


def test_records_cut_after_step_two_are_an_error_not_a_pass(tmp_path: Path) -> None:
    d = passing(tmp_path)
    for rank in (0, 1):
        _cut(d / "eager-repeat" / f"rank{rank}.jsonl", 2)
    out = io.StringIO()
    assert gate(tmp_path, out) == 2
    text = out.getvalue()
    assert "a-pass / repeat" in text and "disagrees with the step records" in text
    assert "eager-repeat.steps_complete says passed" in text
    files = write_reports(tmp_path, plots=False)
    summary = files.summary.read_text()
    row = next(line for line in summary.splitlines() if line.startswith("| a-pass | repeat"))
    assert "| ERROR |" in row and "2.1 / 2.31" in row  # the final losses the records hold


def test_a_verdict_whose_checks_fail_but_says_pass_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    data = json.loads((d / "verdict.json").read_text())
    for pair in data["pairs"]:
        for check in pair["checks"]:
            check["passed"] = False
    (d / "verdict.json").write_text(json.dumps(data))
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2
    assert "status 'pass' but its own checks give 'fail'" in result.message


def test_a_check_value_the_records_do_not_give_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    data = json.loads((d / "verdict.json").read_text())
    loss = next(c for c in data["pairs"][1]["checks"] if c["name"] == "loss")
    loss["value"] = 0.0
    (d / "verdict.json").write_text(json.dumps(data))
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2 and "check loss says value 0.0" in result.message


def test_a_regression_in_the_records_fails_even_when_the_verdict_says_pass(tmp_path: Path) -> None:
    d = passing(tmp_path)
    rank0 = d / "eager-repeat" / "rank0.jsonl"
    records = [json.loads(line) for line in rank0.read_text().splitlines()]
    records[3]["loss"] = 9.0  # edited after the verdict was written
    rank0.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 1 and "a-pass / repeat:" in result.message and "loss" in result.message


def test_case_status_that_contradicts_its_entries_is_an_error(tmp_path: Path) -> None:
    d = make_case(tmp_path, "c", [REPEAT], {"eager": (LOSS,), "eager-repeat": (LOSS,)})
    data = json.loads((d / "verdict.json").read_text())
    data["status"] = "fail"
    (d / "verdict.json").write_text(json.dumps(data))
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2 and "verdict.json says 'fail'" in result.message


def test_an_untouched_passing_sweep_still_passes(tmp_path: Path) -> None:
    passing(tmp_path)
    assert gate(tmp_path, io.StringIO()) == 0


def test_a_record_of_a_step_the_case_does_not_have_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    with open(d / "dcp" / "rank0.jsonl", "a") as fh:  # step 10**23: building range() would OOM
        fh.write(json.dumps({"step": 10 ** 23, "loss": 2.0}) + "\n")
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2 and "record of step 100000000000000000000000" in result.message


def test_a_case_json_with_an_absurd_step_count_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    data = json.loads((d / "case.json").read_text())
    data["train"]["steps"] = 10 ** 23
    (d / "case.json").write_text(json.dumps(data))
    result = gate_result(load_sweep(tmp_path))  # judged by its plan, never by the edited file
    assert result.code == 2 and "is not the case this sweep ran: its content hash" in result.message
