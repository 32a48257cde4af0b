"""Parked cases (``expect:``): every report shows them, the gate does not count them, an xfail that
passes is an XPASS (a gate failure only with ``strict``), an ``until`` in the past warns."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.report import console_table, gate_result, load_sweep, write_reports
from harness.report.gate import gate
from harness.results import read_json, write_json_atomic
from harness.spec.schema import Expectation

from tests.sweeps import edit_case
from tests.test_report import failing, passing

TODAY = date(2026, 12, 1)


def park(case_dir: Path, **expect) -> Path:
    edit_case(case_dir, expect={"reason": "hangs at step 3: issue 99", **expect})
    return case_dir


def test_expect_needs_a_status_and_a_reason() -> None:
    e = Expectation.model_validate({"status": "xfail", "reason": " NCCL hang, #513 ", "until": "2027-01-31"})
    assert str(e.status) == "xfail" and e.reason == "NCCL hang, #513" and e.until == date(2027, 1, 31)
    with pytest.raises(ValidationError, match="status"):
        Expectation.model_validate({"status": "skip", "reason": "x"})
    with pytest.raises(ValidationError, match="give the reason"):
        Expectation.model_validate({"status": "broken", "reason": "  "})
    with pytest.raises(ValidationError):
        Expectation.model_validate({"status": "flaky", "reason": "x", "until": "soon"})


def test_a_parked_failure_does_not_fail_the_gate_but_is_shown(tmp_path: Path) -> None:
    passing(tmp_path)
    park(failing(tmp_path), status="broken")
    view = load_sweep(tmp_path, today=TODAY)
    result = gate_result(view)
    assert result.code == 0, result.message
    assert "1 parked (not counted)" in result.message.splitlines()[0]
    assert ("  PARKED b-nan: fail (broken: hangs at step 3: issue 99); not counted"
            in result.message.splitlines())
    assert "FAIL  b-nan" not in result.message
    files = write_reports(tmp_path, plots=False)
    summary = files.summary.read_text()
    assert "| b-nan | repeat (eager vs eager-repeat) | 18/20 (6 n/a) | FAIL (broken) |" in summary
    assert "## Parked (not counted by the gate)" in summary and "### b-nan: BROKEN" in summary
    assert "- repeat: FAIL: eager-repeat.no_nan_inf" in summary
    assert "## Failures" not in summary  # a parked case's failures are under Parked
    tc = ET.parse(files.junit).getroot().find(".//testcase[@classname='b-nan']")
    skipped = tc.find("skipped")
    assert skipped is not None and skipped.get("type") == "broken" and tc.find("failure") is None
    assert "FAIL (broken): hangs at step 3" in skipped.get("message")
    suite = ET.parse(files.junit).getroot()
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    index = json.loads(files.index.read_text())
    case = next(c for c in index["cases"] if c["id"] == "b-nan")
    assert case["status"] == "fail" and case["parked"]["status"] == "broken"
    assert case["parked"]["counted"] is None and index["exit_code"] == 0
    assert index["counts"]["parked"] == 1 and index["counts"]["fail"] == 0
    table = io.StringIO()
    from rich.console import Console
    console_table(view, Console(file=table, width=200))
    assert "FAIL (broken)" in table.getvalue() and "1 parked" in table.getvalue()


def test_an_unparked_failure_still_fails_beside_a_parked_one(tmp_path: Path) -> None:
    park(failing(tmp_path, "b-parked"), status="flaky")
    failing(tmp_path, "c-real")
    result = gate_result(load_sweep(tmp_path, today=TODAY))
    assert result.code == 1 and "FAIL  c-real / repeat" in result.message
    assert "PARKED b-parked: fail (flaky" in result.message


def test_xfail_that_fails_is_xfail_and_one_that_passes_is_xpass(tmp_path: Path) -> None:
    park(failing(tmp_path), status="xfail")
    park(passing(tmp_path, "a-fixed"), status="xfail")
    view = load_sweep(tmp_path, today=TODAY)
    result = gate_result(view)
    assert result.code == 0, result.message
    lines = result.message.splitlines()
    # entries are counted as parked (a-fixed has two, b-nan one); XPASS counts cases
    assert "0 pass, 0 fail, 0 error, 0 skipped, 3 parked (not counted; 1 case(s) XPASS)" in lines[0]
    assert "  XFAIL b-nan: fail as expected (xfail: hangs at step 3: issue 99); not counted" in lines
    assert any(x.startswith("  XPASS a-fixed: expected to fail (xfail: hangs at step 3: issue 99) "
                            "but passed; not counted (the known problem is gone") for x in lines)
    files = write_reports(tmp_path, plots=False)
    summary = files.summary.read_text()
    assert "| XPASS |" in summary and "| XFAIL |" in summary
    root = ET.parse(files.junit).getroot()
    xfail = root.find(".//testcase[@classname='b-nan']/skipped")
    assert xfail is not None and xfail.get("type") == "xfail"
    assert root.find(".//testcase[@classname='a-fixed']/failure") is None  # a non-strict XPASS
    index = json.loads(files.index.read_text())
    outcomes = {c["id"]: c["parked"]["outcome"] for c in index["cases"]}
    assert outcomes == {"a-fixed": "XPASS", "b-nan": "XFAIL"}


def test_a_strict_xpass_fails_the_gate(tmp_path: Path) -> None:
    park(passing(tmp_path, "a-fixed"), status="xfail", strict=True)
    out = io.StringIO()
    assert gate(tmp_path, out) == 1
    text = out.getvalue()
    assert "fails the gate (expect.strict: true): remove the case's expect: block" in text
    files = write_reports(tmp_path, plots=False)
    failure = ET.parse(files.junit).getroot().find(".//testcase[@classname='a-fixed']/failure")
    assert failure is not None and failure.get("type") == "XPASS"


def test_an_until_in_the_past_warns_naming_the_case(tmp_path: Path) -> None:
    park(failing(tmp_path), status="broken", until="2026-11-30")
    park(failing(tmp_path, "c-later"), status="broken", until="2026-12-01")
    view = load_sweep(tmp_path, today=TODAY)
    assert view.warnings() == ("  WARN  b-nan: parked (broken) until 2026-11-30, which has passed: "
                               "fix it and remove expect:, or move expect.until",)
    result = gate_result(view)
    assert result.code == 0 and result.message.splitlines()[-1].startswith("  WARN  b-nan")
    files = write_reports(tmp_path, plots=False)
    assert "> **warning**: b-nan: parked (broken) until 2026-11-30" in files.summary.read_text()
    assert json.loads(files.index.read_text())["warnings"][0].startswith("WARN  b-nan")


def test_only_parked_cases_pass_the_gate(tmp_path: Path) -> None:
    park(failing(tmp_path), status="broken")
    assert gate_result(load_sweep(tmp_path, today=TODAY)).code == 0


def test_strict_is_for_xfail_only() -> None:
    assert Expectation.model_validate({"status": "xfail", "reason": "x", "strict": True}).strict
    for status in ("broken", "flaky"):
        with pytest.raises(ValidationError, match="strict applies to status xfail only"):
            Expectation.model_validate({"status": status, "reason": "x", "strict": True})
