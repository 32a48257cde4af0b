"""The page's figures drawn while the sweep runs (``harness.report.figures_ahead``): the page a
run writes holds the figures that drawing everything at the end gives; a figure drawn ahead is
used only for the pair and records the page shows; a large sweep draws ahead only what its page
draws."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

from harness.compare import read_verdict
from harness.report import PAGE_FILE, load_sweep, write_reports
from harness.report import figures_ahead as ahead_module
from harness.report.figures_ahead import FiguresAhead
from harness.report.plots import matplotlib_available
from tests.quick_sweep import quick_case, run_quick

pytestmark = pytest.mark.skipif(not matplotlib_available(), reason="needs matplotlib")
_SVG = re.compile(r"<svg\b.*?</svg>", re.S)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ahead")
    out = root / "out"
    run_quick(quick_case(root / "cases"), ["--out", str(out), "--no-latest", "--no-history"],
              cwd=root)
    return out


def test_the_run_s_page_holds_the_figures_drawn_at_the_end(sweep, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(sweep, again)
    write_reports(again)  # every figure drawn now
    ran, drawn_now = (_SVG.findall((d / PAGE_FILE).read_text()) for d in (sweep, again))
    assert ran and ran == drawn_now


def test_a_figure_drawn_ahead_is_used_only_for_the_pair_and_records_the_page_shows(
        sweep, monkeypatch):
    verdict = read_verdict(sweep / "quick")
    ahead = FiguresAhead(sweep, total_cases=1)
    ahead.case_judged(verdict)
    ahead.finish()
    (case,) = load_sweep(sweep).cases
    (pair,) = case.verdict.pairs
    assert ahead.drawn() == {("quick", pair.pair)}
    monkeypatch.setattr(ahead_module, "entry_svg", lambda case, pair: "drawn again")
    assert ahead.figure(case, pair).startswith("<svg")  # drawn ahead
    other = dataclasses.replace(pair, status="fail")
    assert ahead.figure(case, other) == "drawn again"
    arms = dict(case.arms)
    arms.pop(next(iter(arms)))
    assert ahead.figure(dataclasses.replace(case, arms=arms), pair) == "drawn again"


def test_a_large_sweep_draws_ahead_only_the_cases_that_did_not_pass(sweep):
    verdict = read_verdict(sweep / "quick")
    assert verdict.status == "pass"
    ahead = FiguresAhead(sweep, total_cases=3, every_case_up_to=2)
    ahead.case_judged(verdict)
    ahead.finish()
    assert ahead.drawn() == frozenset()
    failing = FiguresAhead(sweep, total_cases=3, every_case_up_to=2)
    failing.case_judged(dataclasses.replace(verdict, status="fail"))
    failing.finish()
    assert len(failing.drawn()) == 1


def test_nothing_is_drawn_or_imported_before_a_case_is_judged(tmp_path):
    import subprocess
    import sys
    code = ("import sys; from harness.report.figures_ahead import FiguresAhead; "
            f"FiguresAhead({str(tmp_path)!r}, 3); print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr  # not on the way to the first arm


def test_nothing_is_drawn_while_an_arm_that_runs_alone_runs(sweep, monkeypatch):
    import threading
    import time
    verdict = read_verdict(sweep / "quick")
    drawing = threading.Event()
    drawn_at: list[float] = []

    def slow_svg(case, pair):
        drawing.set()
        time.sleep(0.3)
        drawn_at.append(time.monotonic())
        return "<svg/>"

    monkeypatch.setattr(ahead_module, "entry_svg", slow_svg)
    ahead = FiguresAhead(sweep, total_cases=1)
    ahead.case_judged(verdict)
    assert drawing.wait(10)
    ahead.hold("alone-arm")  # waits for the figure being drawn
    held_at = time.monotonic()
    assert len(drawn_at) == 1 and drawn_at[0] <= held_at
    ahead.case_judged(verdict)  # asked while held: not drawn until released
    time.sleep(0.5)
    assert len(drawn_at) == 1
    released_at = time.monotonic()
    ahead.release("alone-arm")
    ahead.finish()
    assert len(drawn_at) == 2 and drawn_at[1] > released_at
