"""The end-of-run table where CI reads it (stdout not a terminal): one line per pair within
`$COLUMNS`, else 120 columns; on a terminal a rich table that fits the terminal's width."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.text import Text

from harness.cli import main
from harness.report import show_table, write_reports
from harness.report.console import LINE_WIDTH, log_lines
from tests.test_report import crashing, failing, passing

LONG = "gpu4-dcp12-pp2-vpp2-ep2-graphs-long-case-id"  # a long id, whole in every line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    passing(tmp_path, LONG)
    failing(tmp_path)
    crashing(tmp_path)
    write_reports(tmp_path, plots=False)
    return tmp_path


def _pair_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.split(" ")[0] in ("PASS", "FAIL", "ERROR")]


def test_a_log_gets_one_line_per_pair_within_120_columns(sweep, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    show_table(sweep, out)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= LINE_WIDTH == 120
    assert lines[0].startswith(f"sweep {sweep.name}: 3 case(s); 2 pass, 1 fail, 1 error")
    pairs = _pair_lines(out.getvalue())
    assert len(lines) == 1 + len(pairs) == 5  # the title, then exactly one line per pair
    passed = next(p for p in pairs if p.startswith(f"PASS {LONG} / repeat "))
    assert "loss 2.1 / 2.1" in passed
    failed = next(p for p in pairs if p.startswith("FAIL b-nan / repeat "))
    assert "(6 n/a): eager-repeat.no_nan_inf" in failed  # why it failed before the figures
    crash = next(p for p in pairs if p.startswith("ERROR c-crash / repeat "))
    assert len(crash) == 120 and crash.endswith("…")  # cut where it is too long: summary.md has it
    assert "┃" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_log_respects_columns(sweep, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    out = io.StringIO()
    show_table(sweep, out)
    assert max(len(line) for line in out.getvalue().splitlines()) == 72
    assert len(_pair_lines(out.getvalue())) == 4
    assert max(len(line) for line in log_lines(sweep, 200)) > 120  # nothing cut that fits


def test_a_terminal_keeps_the_rich_table_at_its_width(sweep, monkeypatch):
    monkeypatch.setenv("COLUMNS", "170")  # what rich reads for a terminal it cannot measure
    out = Terminal()
    show_table(sweep, out)
    text = Text.from_ansi(out.getvalue()).plain  # a terminal gets colours
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 170
    header = next(line for line in lines if "┃" in line)
    assert all(name in header for name in ("case", "pair", "checks", "verdict", "why"))
    assert LONG in text and "…" not in text  # the rich table wraps, never cuts


def test_report_through_the_cli_in_a_log(sweep, monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["report", str(sweep)]) == 0
    out = capsys.readouterr().out
    table = out.split("\nwrote ")[0].splitlines()
    assert max(len(line) for line in table) <= 120
    assert len(table) == 1 + len(_pair_lines(out)) >= 4  # the title and one line per entry
