"""A rich table of a sweep for the terminal."""

from __future__ import annotations

from typing import Any, Optional, TextIO

from rich.console import Console
from rich.table import Table

from harness.results import PathLike

from .load import SweepView, load_sweep
from .text import checks_cell, failed_names, final_loss_cell, loss_delta_cell, peak_mem_cell, step_time_cell

_STYLE = {"pass": "green", "fail": "bold red", "error": "yellow", "skipped": "dim"}
# Width of tables written to a file, pipe or CI log: rich would assume 80 columns there and
# elide case ids or fold cells into one character per line.
LOG_WIDTH = 240


def make_console(file: Optional[TextIO] = None) -> Console:
    """A console for command output: the terminal's width on a terminal, else ``LOG_WIDTH``."""
    console = Console(file=file)
    return console if console.is_terminal else Console(file=file, width=LOG_WIDTH)


def console_table(sweep: Any, console: Optional[Console] = None) -> Table:
    """Case, pair, checks, verdict and key figures; failed checks or the error in the last column.

    ``sweep``: a SweepView, anything with a ``.sweep`` SweepView (what ``write_reports``
    returns) or a sweep folder path. Printed on ``console`` when one is given; returned always.
    """
    view = _view(sweep)
    counts = view.counts()
    table = Table(title=f"sweep {view.name}: {counts['cases']} case(s); {counts['pass']} pass, "
                        f"{counts['fail']} fail, {counts['error']} error, "
                        f"{counts['skipped']} skipped")
    show_why = any(p.status != "pass" for _, p in view.rows)
    for col in ("case", "pair", "checks", "verdict"):
        table.add_column(col, no_wrap=True)
    for col in ("final loss", "max Δloss", "peak GiB", "step s") + (("why",) if show_why else ()):
        table.add_column(col, overflow="fold")
    for case, p in view.rows:
        cells = [case.case_id, p.pair, checks_cell(p), f"[{_STYLE[p.status]}]{p.status.upper()}[/]",
                 final_loss_cell(case, p), loss_delta_cell(case, p),
                 peak_mem_cell(case, p, unit=False), step_time_cell(case, p, unit=False)]
        if show_why:
            cells.append(", ".join(failed_names(p)) if p.status == "fail" else (p.error or ""))
        table.add_row(*cells)
    if console is not None:
        console.print(table)
    return table


def _view(sweep: Any) -> SweepView:
    if isinstance(sweep, SweepView):
        return sweep
    inner = getattr(sweep, "sweep", None)
    if isinstance(inner, SweepView):
        return inner
    path: PathLike = sweep
    return load_sweep(path)
