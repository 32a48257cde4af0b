"""Reports of a sweep folder: summary.md, junit.xml, index.json, index.html, plots, console
table, gate.

Everything is built from the folder alone (``*/case.json``, ``*/verdict.json``,
``*/<arm>/outcome.json``, ``*/<arm>/rank<k>.jsonl``); a case folder without a verdict counts
as an error. A leaf package: no torch, no workload, no launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict

from harness.errors import ConfigError
from harness.results import (
    INDEX_FILE,
    JUNIT_FILE,
    SUMMARY_FILE,
    PathLike,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)

from .console import console_table, make_console, show_table
from .figures_ahead import FiguresAhead
from .gate import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, GateResult, exit_code, gate, gate_result
from .index import build_index
from .junit import render_junit
from .load import (EVERY_CASE_UP_TO, ArmView, CaseView, PlanCheck, SweepView, load_sweep,
                   shown_in_full)
from .page import PAGE_FILE, render_page
from .pair_figures import entry_svg
from .plots import NO_MATPLOTLIB, matplotlib_available, write_plots
from .summary import render_summary

__all__ = [
    "ArmView", "CaseView", "EVERY_CASE_UP_TO", "EXIT_ERROR", "EXIT_FAIL", "EXIT_PASS",
    "FiguresAhead", "GateResult", "PAGE_FILE", "PlanCheck",
    "ReportFiles", "SweepView", "console_table", "gate", "gate_result", "load_sweep",
    "make_console", "show_table", "shown_in_full", "write_reports",
]


@dataclass(frozen=True)
class ReportFiles:
    summary: Path
    junit: Path
    index: Path
    plots: tuple[Path, ...]
    exit_code: int
    sweep: SweepView
    notes: tuple[str, ...] = ()  # what the reports lack and why (e.g. no plots without matplotlib)
    page: Optional[Path] = None  # index.html


def write_reports(sweep_dir: PathLike, *, plots: bool = True, passing_plots: bool = True,
                  check_plan: Optional[PlanCheck] = None,
                  judged: Optional[Mapping[str, CaseVerdict]] = None,
                  allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
                  every_case_up_to: int = EVERY_CASE_UP_TO,
                  ahead: Optional[FiguresAhead] = None) -> ReportFiles:
    """Write summary.md, junit.xml, index.json, index.html (and plots/<case>.png and the page's
    figures with matplotlib; ``passing_plots`` False: plots/ only of the cases that did not
    pass, ``plots.write_plots``) into the sweep folder, atomically, from what the records prove
    (``load_sweep``: ``judged`` are the verdicts this process made already, the other cases are
    judged here). A sweep of more than ``every_case_up_to`` cases has only the cases that did not
    pass drawn and shown in full (``shown_in_full``); the page holds the others collapsed.
    ``ahead``: the page's figures drawn while the sweep ran (``figures_ahead``), used where
    they are the page's. Raises ConfigError when the folder does not exist."""
    sweep = load_sweep(sweep_dir, check_plan, judged=judged, allowed_skips=allowed_skips)
    if not sweep.exists:
        raise ConfigError(f"no sweep folder at {sweep_dir}: give the --out folder of a "
                          "`dcp-harness run`")
    root = sweep.sweep_dir
    now = datetime.now(timezone.utc)
    code = exit_code(sweep)
    full = shown_in_full(sweep, every_case_up_to)
    # `run` (passing_plots False) draws plots/ of the cases that did not pass only; the page
    # still draws every case of ``full``
    drawn = full if passing_plots else frozenset(
        c.case_id for c in sweep.cases if c.case_id in full and c.verdict.status != "pass")
    if ahead is not None:
        ahead.finish()  # nothing else draws while its thread does
    plot_paths = write_plots(sweep, drawn) if plots else ()
    notes = (NO_MATPLOTLIB,) if plots and not matplotlib_available() else ()
    figures = (ahead.figure if ahead is not None else entry_svg) if plots and not notes else None
    page_note = (notes[0] if notes else None if plots
                 else "figures left out (reports written without plots)")
    write_text_atomic(root / SUMMARY_FILE, render_summary(sweep, code))
    write_bytes_atomic(root / JUNIT_FILE, render_junit(sweep, now))
    write_json_atomic(root / INDEX_FILE, build_index(sweep, code, now, plot_paths))
    write_text_atomic(root / PAGE_FILE, render_page(sweep, now, figures, page_note, full))
    return ReportFiles(root / SUMMARY_FILE, root / JUNIT_FILE, root / INDEX_FILE, plot_paths, code,
                       sweep, notes, root / PAGE_FILE)
