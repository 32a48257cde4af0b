"""index.html in a real browser (headless Chromium, ``tests/browser.py``) over a real sweep: a
tiny CPU sweep run through the CLI, and a copy whose records were edited after the run so that
one entry fails (the gate finds the regression in the records, as the integrity tests do).

Every case and entry row is there with its status; the failing row is marked and its failed
checks listed with value, bound and step; skips are grouped by kind; each plotted series has one
point per step its arm recorded (counted from the rank files, not from the page's code); the
links to logs and files resolve inside the sweep; the page loads nothing from outside.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Optional

import pytest

from harness.cli import main
from harness.compare import read_verdict
from harness.report import PAGE_FILE
from harness.report.pair_figures import METRICS, series_key
from harness.report.render import series_id
from harness.results import read_steps
from tests.launch.cases import REPEAT, write_case_file

pytestmark = pytest.mark.slow  # two real CPU runs of a tiny case (about 10-20 s)

STEPS = 4


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a passing sweep, a copy where the repeat arm's loss at step 3 was changed)."""
    root = tmp_path_factory.mktemp("page")
    cases = root / "cases"
    write_case_file(cases, "page-cpu", train={"steps": STEPS}, compare={**REPEAT, "golden": {}})
    write_case_file(cases, "page-gpu", resources={"device": "cuda"}, compare=REPEAT)
    good = root / "good"
    assert main(["run", str(cases), "--out", str(good)]) == 0
    bad = root / "bad"
    shutil.copytree(good, bad)
    rank0 = bad / "page-cpu" / "eager-repeat" / "rank0.jsonl"
    records = [json.loads(line) for line in rank0.read_text().splitlines()]
    records[2]["loss"] += 0.5  # step 3, edited after the verdict was written
    rank0.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(bad)]) == 0
    return good, bad


def _finite_steps(arm_dir: Path, field: str) -> dict[int, float]:
    steps = read_steps(arm_dir)
    first = min(r for r in steps if steps[r])
    return {rec.step: float(v) for rec in steps[first]
            if (v := getattr(rec, field)) is not None and math.isfinite(v)}


def expected_points(sweep: Path) -> dict[str, int]:
    """Series id -> points, from the records: each arm's finite values per metric (lowest rank)
    and, for a two-arm entry, the steps both arms have."""
    out: dict[str, int] = {}
    for case_dir in sorted(p for p in sweep.iterdir() if (p / "verdict.json").is_file()):
        verdict = read_verdict(case_dir)
        assert verdict is not None
        for pair in verdict.pairs:
            arms = [a for a in pair.arms if (case_dir / a / "rank0.jsonl").is_file()]
            for m in METRICS:
                values = {a: _finite_steps(case_dir / a, m.field) for a in arms}
                for a, v in values.items():
                    if v:
                        out[series_id(series_key(verdict.case_id, pair.pair, m.field, a))] = len(v)
                if len(arms) == 2 and len(pair.arms) == 2:
                    both = set(values[arms[0]]) & set(values[arms[1]])
                    if both:
                        out[series_id(series_key(verdict.case_id, pair.pair, m.field, "diff"))] = len(both)
    return out


def _rows(browser) -> dict[tuple[str, Optional[str]], str]:  # type: ignore[no-untyped-def]
    """(case, pair or None for the case's row) -> the row's class list."""
    return {(r.get_attribute("data-case"), r.get_attribute("data-pair")): r.get_attribute("class")
            for r in browser.all("#entry-table tr[data-case]")}


def _entries(sweep: Path) -> dict[tuple[str, str], str]:
    out = {}
    for case_dir in sweep.iterdir():
        verdict = read_verdict(case_dir) if (case_dir / "verdict.json").is_file() else None
        for p in verdict.pairs if verdict else ():
            out[(verdict.case_id, p.pair)] = p.status
    return out


def _check_common(browser, sweep: Path) -> None:  # type: ignore[no-untyped-def]
    browser.open(sweep / PAGE_FILE)
    # Nothing fetched from anywhere: no resource entries at all (inline CSS and SVG only).
    assert browser.js("return performance.getEntriesByType('resource').length") == 0
    rows = _rows(browser)
    assert {c for c, p in rows if p is None} == {"page-cpu", "page-gpu"}
    entries = _entries(sweep)
    assert {k for k in rows if k[1] is not None} == set(entries)
    # Every plotted series, each with the records' number of points.
    found = browser.js("""
        const out = {};
        for (const g of document.querySelectorAll('.figure g[id^="series-"]'))
            out[g.id] = g.querySelectorAll('use').length;
        return out;""")
    expected = expected_points(sweep)
    assert found == expected and len(expected) >= 6
    assert set(expected.values()) == {STEPS}
    # Relative links resolve inside the sweep folder (an artifact or a shared filesystem).
    hrefs = [a.get_attribute("href") for a in browser.all("a[href]")]
    files = [h for h in hrefs if not h.split("/")[-1].startswith("index.html#")]
    assert any(h.endswith("/log.txt") for h in files)
    for href in files:
        assert href.startswith(sweep.resolve().as_uri() + "/"), href
        assert Path(href[len("file://"):]).exists(), href
    # The skip of each kind is listed under its kind.
    kinds = {e.get_attribute("data-kind") for e in browser.all("#skipped .skip-kind")}
    assert kinds == {"needs-gpu", "golden-platform"}


def test_the_page_of_a_passing_sweep(browser, sweeps) -> None:
    good, _ = sweeps
    _check_common(browser, good)
    gate = browser.all("#gate")[0].text
    assert gate.startswith("gate: PASS (exit 0): 2 case(s)")
    assert browser.count("#entry-table tr.entry.fail") == 0
    assert browser.count("#failures .failure") == 0
    browser.screenshot("report-page-pass")


def test_the_page_of_a_failing_sweep_marks_the_row_and_lists_its_checks(browser, sweeps) -> None:
    _, bad = sweeps
    _check_common(browser, bad)
    assert browser.all("#gate")[0].text.startswith("gate: FAIL (exit 1)")
    rows = _rows(browser)
    failing = {k for k, cls in rows.items() if k[1] is not None and "fail" in cls.split()}
    assert failing == {("page-cpu", "repeat")}
    assert "fail" in rows[("page-cpu", None)].split()
    row = browser.all('#entry-table tr.entry[data-pair="repeat"][data-case="page-cpu"]')[0]
    assert "FAIL" in row.text and "loss" in row.text
    block = browser.all('#failures .failure[data-case="page-cpu"][data-pair="repeat"]')
    assert len(block) == 1
    checks = {c.get_attribute("data-check"): [td.text for td in c.find_elements("css selector", "td")]
              for c in block[0].find_elements("css selector", "tr.check")}
    assert "loss" in checks
    name, state, value, bound, step, detail = checks["loss"]
    assert state == "FAILED" and step == "3" and value == "0.5" and bound == "0"
    assert "step 3" in detail
    text = block[0].text  # the arms' repro lines, with their logs
    assert "repro eager-repeat:" in text and "--arm eager-repeat" in text
    # The entry's own section keeps every check, the failing ones marked and open.
    section = browser.all('div.pair[data-pair="repeat"] details[open] tr.check.failed')
    assert [s.get_attribute("data-check") for s in section] == list(checks)
    shot = browser.screenshot("report-page-fail")
    assert shot.stat().st_size > 10_000
