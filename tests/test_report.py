"""Reports and the gate, built from hand-made sweep folders (no training, no torch)."""

from __future__ import annotations

import io
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import pytest
from rich.console import Console

from harness.compare import Pair, evaluate_case, write_verdict
from harness.errors import ConfigError
from harness.report import console_table, gate, gate_result, load_sweep, write_reports
from harness.results import ArmOutcome, StepWriter, write_json_atomic, write_outcome
from tests.records import probe, record
from tests.sweeps import hand_case
from harness.launch.sweep_folder import finalize_case

LOSS = [2.5, 2.31, 2.2, 2.1]
REPEAT = Pair("repeat", "repeat", ("eager", "eager-repeat"), {"arm": "eager", "loss": "exact"})
DCP = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("dcp", "fixed-cp2"),
           {"fixed_cp": 2, "device_delta_pct": 1.0, "reserved_delta_pct": 5.0})
OK = ArmOutcome(status="ok", returncode=0, wall_s=2.0, repro="dcp-harness run cases/focused -k c")


def write_arm(case_dir: Path, arm: str, losses: list[float], outcome: Optional[ArmOutcome] = OK,
              ranks: int = 2, mem: Optional[float] = None) -> None:
    for rank in range(ranks):
        w = StepWriter(case_dir / arm, rank)
        for i, loss in enumerate(losses):
            w.append(record(i + 1, loss, aux_loss=0.01, nan=not math.isfinite(loss),
                            step_time_s=0.1 * (i + 1), device="cpu",
                            max_allocated_bytes=None if mem is None else int(mem),
                            reserved_bytes=None if mem is None else int(mem)))
    if outcome is not None:
        write_outcome(case_dir / arm, outcome)


def make_case(sweep: Path, case_id: str, pairs: list[Pair], arms: dict[str, tuple],
              finished: bool = True) -> Path:
    d = hand_case(sweep, case_id, pairs, list(dict.fromkeys([*arms, *(a for p in pairs for a in p.arms)])))
    for arm, spec in arms.items():
        write_arm(d, arm, *spec)
    if finished:
        finalize_case(d)  # the judge a sweep uses
    return d


def passing(sweep: Path, case_id: str = "a-pass") -> Path:
    return make_case(sweep, case_id, [REPEAT, DCP], {
        "eager": (LOSS,), "eager-repeat": (LOSS,), "dcp": (LOSS,), "fixed-cp2": ([*LOSS[:3], 2.1001],)})


def failing(sweep: Path, case_id: str = "b-nan") -> Path:
    return make_case(sweep, case_id, [REPEAT], {
        "eager": (LOSS,), "eager-repeat": ([2.5, math.nan, math.nan, math.nan],)})


CRASH = ArmOutcome(status="failed", returncode=1, wall_s=3.5,
                   log_tail="Traceback...\n\x1b[31mRuntimeError: boom\x1b[0m \x00\x07",
                   repro="dcp-harness run cases/focused/c.yaml -k c-crash", detail="rank 1 exited 1")


def crashing(sweep: Path, case_id: str = "c-crash") -> Path:
    return make_case(sweep, case_id, [REPEAT], {"eager": (LOSS,), "eager-repeat": (LOSS[:1], CRASH)})


def junit(sweep: Path) -> ET.Element:
    return ET.parse(sweep / "junit.xml").getroot()


# --------------------------------------------------------------------------- gate
def test_gate_all_pass(tmp_path: Path) -> None:
    passing(tmp_path)
    out = io.StringIO()
    assert gate(tmp_path, out) == 0
    assert "PASS" in out.getvalue()


def test_gate_failure_names_the_check(tmp_path: Path) -> None:
    passing(tmp_path)
    failing(tmp_path)
    out = io.StringIO()
    assert gate(tmp_path, out) == 1
    assert "b-nan / repeat" in out.getvalue() and "eager-repeat.no_nan_inf" in out.getvalue()


def test_gate_error_without_failure(tmp_path: Path) -> None:
    passing(tmp_path)
    crashing(tmp_path)
    out = io.StringIO()
    assert gate(tmp_path, out) == 2
    assert "rank 1 exited 1" in out.getvalue()


def test_gate_mixed_failure_and_error_is_one(tmp_path: Path) -> None:
    failing(tmp_path)
    crashing(tmp_path)
    assert gate(tmp_path, io.StringIO()) == 1


def test_unfinished_case_counts_as_error(tmp_path: Path) -> None:
    passing(tmp_path)
    make_case(tmp_path, "d-unfinished", [REPEAT], {"eager": (LOSS[:2], None)}, finished=False)
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2 and "never finished" in result.message


def test_gate_missing_and_empty_sweeps(tmp_path: Path) -> None:
    out = io.StringIO()
    assert gate(tmp_path / "absent", out) == 2
    assert "no sweep folder" in out.getvalue()
    out = io.StringIO()
    (tmp_path / "empty").mkdir()
    assert gate(tmp_path / "empty", out) == 2
    assert "no case folders" in out.getvalue()


def test_corrupt_verdict_is_an_error(tmp_path: Path) -> None:
    d = passing(tmp_path)
    (d / "verdict.json").write_text("{not json")
    result = gate_result(load_sweep(tmp_path))
    assert result.code == 2 and "verdict.json" in result.message


# --------------------------------------------------------------------------- files
def test_write_reports_junit_counts_and_attributes(tmp_path: Path) -> None:
    passing(tmp_path)
    failing(tmp_path)
    crashing(tmp_path)
    make_case(tmp_path, "d-unfinished", [REPEAT], {"eager": (LOSS[:2], None)}, finished=False)
    files = write_reports(tmp_path, plots=False)
    assert files.exit_code == 1
    root = junit(tmp_path)
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    # a-pass: repeat + dcp; b-nan: repeat; c-crash: repeat; d-unfinished: checks
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("a-pass", "repeat"), ("a-pass", "dcp_vs_fixed_cp"), ("b-nan", "repeat"),
        ("c-crash", "repeat"), ("d-unfinished", "checks")]
    for el in (root, suite):
        assert (el.get("tests"), el.get("failures"), el.get("errors")) == ("5", "1", "2")
    by = {(c.get("classname"), c.get("name")): c for c in cases}
    assert by[("a-pass", "repeat")].find("failure") is None and by[("a-pass", "repeat")].find("error") is None
    failure = by[("b-nan", "repeat")].find("failure")
    assert failure is not None and "eager-repeat.no_nan_inf" in failure.get("message", "")
    error = by[("c-crash", "repeat")].find("error")
    assert error is not None and "rank 1 exited 1" in error.get("message", "")
    out = by[("c-crash", "repeat")].findtext("system-out") or ""
    assert "repro: dcp-harness run cases/focused/c.yaml -k c-crash" in out
    assert "RuntimeError: boom" in out and "\x1b" not in out and "\x00" not in out
    assert float(by[("c-crash", "repeat")].get("time", "0")) == pytest.approx(5.5)
    # Element order (JUnit XSD): failure/error before system-out; suite: properties first,
    # testcases, then system-out and system-err.
    assert [e.tag for e in by[("c-crash", "repeat")]] == ["error", "system-out"]
    assert [e.tag for e in by[("b-nan", "repeat")]] == ["failure", "system-out"]
    tags = [e.tag for e in suite]
    assert tags == ["properties"] + ["testcase"] * 5 + ["system-out", "system-err"]
    for c in cases:
        assert set(c.attrib) == {"classname", "name", "time"}
        assert len([e for e in c if e.tag in ("failure", "error", "skipped")]) <= 1
    assert {"name", "tests", "failures", "errors", "skipped", "time", "timestamp"} <= set(suite.attrib)


def test_junit_suite_time_counts_an_arm_shared_by_pairs_once(tmp_path: Path) -> None:
    # eager runs in both pairs of a-pass: the entries show it in both, the suite once.
    shared = Pair("golden-like", "repeat", ("eager", "dcp"), {"loss": {"max_rel": 1.0}})
    make_case(tmp_path, "a-pass", [REPEAT, shared], {"eager": (LOSS,), "eager-repeat": (LOSS,),
                                                     "dcp": (LOSS,)})
    write_reports(tmp_path, plots=False)
    root = junit(tmp_path)
    times = [float(c.get("time")) for c in root.iter("testcase")]
    assert times == [4.0, 4.0]  # each entry: its two arms of 2.0 s
    for el in (root, root.find("testsuite")):
        assert float(el.get("time")) == pytest.approx(6.0)  # three arms of 2.0 s, not 8.0


def test_summary_and_index(tmp_path: Path) -> None:
    passing(tmp_path)
    failing(tmp_path)
    crashing(tmp_path)
    write_reports(tmp_path, plots=False)
    summary = (tmp_path / "summary.md").read_text()
    assert "**FAIL** (gate exit 1)" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| a-pass | dcp_vs_fixed_cp"))
    assert "| PASS |" in row and "2.1 / 2.1001" in row and "rel 4.8e-05, step 4" in row
    # memory deltas (probe and per step) and packing on CPU, CP balance without attention work
    assert "(11 n/a)" in row and "0.300 / 0.300 s" in row
    assert "## Failures" in summary and "eager-repeat.no_nan_inf: FAILED" in summary
    assert "## Errors" in summary and "`dcp-harness run cases/focused/c.yaml -k c-crash`" in summary
    assert "\n\n\n" not in summary  # one blank line between sections, also Failures -> Errors
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["status"] == "fail" and index["exit_code"] == 1
    assert index["counts"] == {"cases": 3, "entries": 4, "pass": 2, "fail": 1, "error": 1, "skipped": 0,
                               "parked": 0, "xpass": 0}
    case = {c["id"]: c for c in index["cases"]}
    assert case["b-nan"]["pairs"][0]["failed_checks"] == ["eager-repeat.no_nan_inf", "loss"]
    assert case["c-crash"]["arms"]["eager-repeat"]["status"] == "failed"
    assert case["c-crash"]["arms"]["eager-repeat"]["ranks"] == {
        "0": "c-crash/eager-repeat/rank0.jsonl", "1": "c-crash/eager-repeat/rank1.jsonl"}
    assert case["a-pass"]["verdict_json"] == "a-pass/verdict.json"
    assert case["a-pass"]["pairs"][1]["not_applicable"] == [
        "dcp.packing", "dcp.cp_balance", "fixed-cp2.packing", "fixed-cp2.cp_balance",
        "device_delta_pct", "active_delta_pct", "reserved_delta_pct", "graph_pool_bytes",
        "allocated_delta_pct", "max_allocated_delta_pct", "allocated_growth_pct"]


def test_memory_figures_in_summary(tmp_path: Path) -> None:
    make_case(tmp_path, "gpu", [DCP], {"dcp": (LOSS, OK, 2, 2.0 * 1024 ** 3),
                                       "fixed-cp2": (LOSS, OK, 2, 2.5 * 1024 ** 3)})
    write_reports(tmp_path, plots=False)
    summary = (tmp_path / "summary.md").read_text()
    assert "2.00 / 2.50 GiB" in summary


def test_plots_written_when_matplotlib_is_present(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    passing(tmp_path)
    files = write_reports(tmp_path)
    assert files.plots == (tmp_path / "plots" / "a-pass.png",)
    assert (tmp_path / "plots" / "a-pass.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "index.json").read_text())["cases"][0]["plot"] == "plots/a-pass.png"


def test_run_draws_plots_of_the_cases_that_did_not_pass_only(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    passing(tmp_path)
    failing(tmp_path)
    every = write_reports(tmp_path)  # `dcp-harness report`: every case
    assert [p.name for p in every.plots] == ["a-pass.png", "b-nan.png"]
    files = write_reports(tmp_path, passing_plots=False)  # `dcp-harness run`
    assert files.plots == (tmp_path / "plots" / "b-nan.png",)
    assert not (tmp_path / "plots" / "a-pass.png").exists()  # no stale PNG of a passing case
    cases = {c["id"]: c for c in json.loads((tmp_path / "index.json").read_text())["cases"]}
    assert cases["a-pass"]["plot"] is None and cases["b-nan"]["plot"] == "plots/b-nan.png"
    assert 'id="series-a-pass_repeat_loss_eager"' in (tmp_path / "index.html").read_text()  # the page still draws it


def test_plot_legends_cover_no_data_and_steps_are_whole(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from harness.report.plots import case_figure

    make_case(tmp_path, "short", [REPEAT], {"eager": ([2.5, 2.31],), "eager-repeat": ([2.5, 2.3],)})
    (case,) = load_sweep(tmp_path).cases
    fig = case_figure(case)
    fig.canvas.draw()
    ax_loss, ax_gn, twin = fig.axes  # loss, grad norm, and the loss axis' |a - b| twin
    (legend,) = fig.legends  # one legend of the arms and the |a - b| line, below the curves
    assert [t.get_text() for t in legend.get_texts()] == ["eager", "eager-repeat",
                                                          "|eager - eager-repeat|"]
    assert all(ax.get_legend() is None for ax in (ax_loss, ax_gn, twin))
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    for ax in (ax_loss, ax_gn):
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # two steps: no 1.5


def test_the_memory_bars_legend_sits_above_the_bars() -> None:
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from harness.report.plots import _memory_bars

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    gib = 2.0 ** 30
    probes = {arm: {r: probe(used * gib, total=140 * gib) for r in (0, 1)}
              for arm, used in (("eager", 17.0), ("graph", 23.0), ("graph-resumed", 23.0),
                                ("reference", 20.0), ("graph-separate-pools", 25.0))}
    _memory_bars(probes, ax, SimpleNamespace(emulated=False, world=2))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = ax.get_legend().get_window_extent(renderer)
    assert len(ax.patches) == 10
    assert not any(box.overlaps(bar.get_window_extent(renderer)) for bar in ax.patches)


def test_reports_of_empty_and_missing_sweeps(tmp_path: Path) -> None:
    files = write_reports(tmp_path)
    assert files.exit_code == 2
    assert junit(tmp_path).get("tests") == "0"
    with pytest.raises(ConfigError, match="no sweep folder"):
        write_reports(tmp_path / "absent")


def test_rewriting_reports_is_idempotent_and_leaves_no_temp_files(tmp_path: Path) -> None:
    passing(tmp_path)
    write_reports(tmp_path, plots=False)
    first = (tmp_path / "summary.md").read_text()
    write_reports(tmp_path, plots=False)
    assert (tmp_path / "summary.md").read_text() == first
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_console_table_renders(tmp_path: Path) -> None:
    passing(tmp_path)
    failing(tmp_path)
    files = write_reports(tmp_path, plots=False)
    buf = io.StringIO()
    table = console_table(files, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert table.row_count == 3
    assert "a-pass" in text and "FAIL" in text and "eager-repeat.no_nan_inf" in text
    assert console_table(tmp_path).row_count == 3


def _render(sweep: Path, width: int) -> str:
    buf = io.StringIO()
    console_table(sweep, Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


def test_console_table_fits_80_and_120_columns_without_cutting_cells(tmp_path: Path) -> None:
    passing(tmp_path, "gpu4-dcp12-pp2-vpp2-ep2-graphs")
    failing(tmp_path)
    crashing(tmp_path)
    write_reports(tmp_path, plots=False)
    for width in (80, 120, 160, 240):
        text = _render(tmp_path, width)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width
        assert "…" not in text, width  # no cell elided ...
        assert "gpu4-dcp12-pp2-vpp2-ep2-graphs" in text  # ... ids whole
        assert "eager-repeat.no_nan_inf" in text and "exited 1" in text  # why: wrapped, whole
    narrow = _render(tmp_path, 80)  # too narrow for the columns: one wrapped line per entry
    assert "FAIL b-nan / repeat (" in narrow and "┃" not in narrow
    mid = _render(tmp_path, 120)
    header = next(line for line in mid.splitlines() if "┃" in line)
    assert all(name in header for name in ("case", "pair", "checks", "verdict", "why"))
    assert sum("┃" in line for line in mid.splitlines()) == 1  # headers on one line
    wide = _render(tmp_path, 240)
    header = next(line for line in wide.splitlines() if "┃" in line)
    assert all(name in header for name in ("final loss", "max Δloss", "step s", "why"))
    assert "peak GiB" not in header  # no memory recorded on CPU: no column of dashes


def test_results_compare_report_are_leaves() -> None:
    """They must import without torch, the workload or the launchers (fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys, harness.results, harness.compare, harness.report; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('harness.workload', "
            "'harness.launch', 'harness.arms', 'harness.cli'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr
