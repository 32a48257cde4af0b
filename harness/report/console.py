"""The end-of-run table of a sweep: a rich table on a terminal, as wide as the terminal allows;
one plain line per pair in a log (``show_table``).

Every cell is shown whole: the columns that fit the console's width are chosen by priority
(case, pair, checks, verdict; then final loss, worst loss delta, step time, peak memory, each
only where some entry has a figure), the
``why`` column (failed checks or the reason, with the cause of an arm that ended badly:
``text.entry_why``) takes what is left and wraps; when even the first
four do not fit, each entry becomes one wrapped line (``VERDICT case / pair (checks): why``).

Written to a file, pipe or CI log (not a terminal), the table is one line per pair
(``log_lines``: verdict, case / pair, checks, the key figures, why) cut to ``$COLUMNS`` (else
``LINE_WIDTH``) with ``…``; summary.md holds every cell whole.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.results import PathLike

from .load import CaseView, SweepView, load_sweep
from .text import (DASH, checks_cell, entry_why, final_loss_cell, loss_delta_cell, peak_mem_cell,
                   step_time_cell)

_STYLE = {"pass": "green", "fail": "bold red", "error": "yellow", "skipped": "dim"}
# Width of tables written to a file, pipe or CI log: rich would assume 80 columns there and
# elide case ids or fold cells into one character per line.
LOG_WIDTH = 240
LINE_WIDTH = 120  # the end-of-run table in a log: one line per pair within this ($COLUMNS wins)
WHY_MIN = 24  # the narrowest the wrapped `why` column may get
_BOX = box.HEAVY_HEAD

Cell = Callable[[CaseView, Any], str]
_REQUIRED: tuple[tuple[str, Cell], ...] = (
    ("case", lambda c, p: c.title),  # with "(emulated rank r of N, ...)" for emulated ranks
    ("pair", lambda c, p: p.pair),
    ("checks", lambda c, p: checks_cell(p)),
    ("verdict", lambda c, p: c.entry_label(p.status)),
)
_FIGURES: tuple[tuple[str, Cell], ...] = (
    ("final loss", final_loss_cell),
    ("max Δloss", loss_delta_cell),
    ("step s", lambda c, p: step_time_cell(c, p, unit=False)),
    ("peak GiB", lambda c, p: peak_mem_cell(c, p, unit=False)),
)

# The same figures in a log line, each with its unit: ``step 0.048 / 0.047 s``.
_LOG_FIGURES: tuple[tuple[str, Cell], ...] = (
    ("loss", final_loss_cell),
    ("Δloss", loss_delta_cell),
    ("step", step_time_cell),
    ("peak", peak_mem_cell),
)


def _style(case: CaseView, p: Any) -> str:
    """A parked case's entries are not counted by the gate: shown in magenta, not red."""
    return "magenta" if case.parked is not None and case.parked.counted is None else _STYLE[p.status]


def columns(env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """``$COLUMNS`` as a width, None where it is not set to a positive number."""
    value = (os.environ if env is None else env).get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def make_console(file: Optional[TextIO] = None) -> Console:
    """A console for command output: the terminal's width on a terminal, else ``$COLUMNS``,
    else ``LOG_WIDTH``."""
    console = Console(file=file)
    return console if console.is_terminal else Console(file=file, width=columns() or LOG_WIDTH)


def show_table(sweep: Any, file: Optional[TextIO] = None) -> None:
    """The end-of-run table of ``sweep`` on ``file`` (stdout): :func:`console_table` on a
    terminal; else :func:`log_lines`, within ``$COLUMNS`` or ``LINE_WIDTH``."""
    console = Console(file=file)
    if console.is_terminal:
        console_table(sweep, console)
        return
    for line in log_lines(sweep, columns() or LINE_WIDTH):
        print(line, file=console.file)


def _cut(line: str, width: int) -> str:
    return line if Text(line).cell_len <= width else _fit(line, width - 1) + "…"


def _fit(line: str, width: int) -> str:
    """The longest start of ``line`` that fills at most ``width`` cells."""
    text = Text(line)
    text.truncate(width)
    return text.plain


def log_lines(sweep: Any, width: int = LINE_WIDTH) -> list[str]:
    """The sweep's title, then one line per pair, ``VERDICT case / pair  checks`` and why it did
    not pass (failed checks, the reason), then the key figures that fit whole; a line still too
    long (a long reason) is cut to ``width`` cells."""
    view = _view(sweep)
    rows = list(view.rows)
    figures = [(name, cell) for name, cell in _LOG_FIGURES
               if any(cell(c, p) != DASH for c, p in rows)]
    heads = [f"{c.entry_label(p.status)} {c.title} / {p.pair}" for c, p in rows]
    pad = min(max((Text(h).cell_len for h in heads), default=0), width // 2)
    lines = [_title(view)]
    for head, (case, p) in zip(heads, rows):
        why = entry_why(case, p)
        line = f"{head.ljust(pad)}  {checks_cell(p)}" + (f": {why}" if why else "")
        for name, cell in figures:  # each figure whole, where it fits
            value = cell(case, p)
            more = f"{line}  {name} {value}"
            if value != DASH and Text(more).cell_len <= width:
                line = more
        lines.append(line)
    return [_cut(line, width) for line in lines]


def _title(view: SweepView) -> str:
    counts = view.counts()
    return (f"sweep {view.name}: {counts['cases']} case(s); {counts['pass']} pass, "
            f"{counts['fail']} fail, {counts['error']} error, {counts['skipped']} skipped"
            + (f", {counts['parked']} parked" if counts["parked"] else ""))


def _table_width(widths: list[int]) -> int:
    """Width of a boxed table whose columns hold ``widths`` characters (1 padding each side)."""
    return sum(widths) + 3 * len(widths) + 1


def console_table(sweep: Any, console: Optional[Console] = None) -> Table:
    """Case, pair, checks, verdict and the key figures that fit (module doc); failed checks or
    the reason in the last column.

    ``sweep``: a SweepView, anything with a ``.sweep`` SweepView (what ``write_reports``
    returns) or a sweep folder path. Sized for ``console`` (``LOG_WIDTH`` without one) and printed
    there when one is given; returned always."""
    view = _view(sweep)
    width = console.width if console is not None else LOG_WIDTH
    counts = view.counts()
    title = (f"sweep {view.name}: {counts['cases']} case(s); {counts['pass']} pass, "
             f"{counts['fail']} fail, {counts['error']} error, {counts['skipped']} skipped"
             + (f", {counts['parked']} parked" if counts["parked"] else ""))
    rows = list(view.rows)
    show_why = any(p.status != "pass" for _, p in rows)

    def natural(name: str, cell: Cell) -> int:
        return max([Text(name).cell_len] + [Text(cell(c, p)).cell_len for c, p in rows])

    columns = list(_REQUIRED)
    widths = [natural(n, f) for n, f in columns]
    reserve = [WHY_MIN] if show_why else []
    if _table_width(widths + reserve) > width:
        table = _entry_list(title, rows)
    else:
        for name, cell in _FIGURES:
            if all(cell(c, p) == DASH for c, p in rows):
                continue  # nothing recorded (e.g. memory on CPU): no column of dashes
            w = natural(name, cell)
            if _table_width(widths + [w] + reserve) <= width:
                columns.append((name, cell))
                widths.append(w)
        table = Table(title=title, box=_BOX)
        for (name, _), w in zip(columns, widths):
            table.add_column(name, no_wrap=True, min_width=w)
        if show_why:
            table.add_column("why", overflow="fold", ratio=1)
        for case, p in rows:
            cells = [cell(case, p) for _, cell in columns]
            cells[3] = f"[{_style(case, p)}]{cells[3]}[/]"
            table.add_row(*cells, *([entry_why(case, p)] if show_why else []))
    if console is not None:
        console.print(table)
    return table


def _entry_list(title: str, rows: list) -> Table:
    """One wrapped line per entry, for a console too narrow for the columns."""
    table = Table(title=title, box=None, show_header=False, pad_edge=False)
    table.add_column("entry", overflow="fold")
    for case, p in rows:
        why = entry_why(case, p)
        table.add_row(f"[{_style(case, p)}]{case.entry_label(p.status)}[/] {case.title} / {p.pair} "
                      f"({checks_cell(p)})" + (f": {why}" if why else ""))
    return table


def _view(sweep: Any) -> SweepView:
    if isinstance(sweep, SweepView):
        return sweep
    inner = getattr(sweep, "sweep", None)
    if isinstance(inner, SweepView):
        return inner
    path: PathLike = sweep
    return load_sweep(path)
