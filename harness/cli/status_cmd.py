"""`dcp-harness status`: where every case of a sweep stands, whichever backend runs it.

    dcp-harness status DIR [--watch S]

The table comes from the sweep's backend (``launch.sweep_backend.SweepBackend.state``), the one
that runs the folder (``launch.backends.backend_of``): the Slurm backend for a folder of
``dcp-harness submit`` (its ``slurm/jobs.json``), the local backend for a folder of
``dcp-harness run`` (its manifest). Reads only.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from harness.errors import ConfigError
from harness.launch.backends import backend_of
from harness.launch.case_status import CaseStatus, counts
from harness.report import make_console

_STATE_STYLE = {"pending": "yellow", "running": "cyan", "done": "green", "failed": "red",
                "error": "magenta", "skipped": "dim"}


def register(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser(
        "status", help="table of a sweep (run or submitted): pending / running / done / failed / "
                       "error, with a progress bar",
        description="Show where every case of a sweep stands, with a progress line: pending, "
        "running (arm and step), done, failed or error. A sweep of `dcp-harness submit`: from "
        "its case folders and the scheduler (squeue, and sacct when accounting exists); a sweep "
        "of `dcp-harness run`: from its case folders and whether a run is writing the folder. "
        "--watch S refreshes until every case has ended. Reads only; changes nothing.")
    s.add_argument("dir", type=Path, metavar="DIR",
                   help="the --out folder of `dcp-harness submit` or `dcp-harness run`")
    s.add_argument("--watch", type=float, default=None, metavar="S",
                   help="refresh every S seconds until every case has ended")
    s.set_defaults(func=run_status)


def status_renderable(statuses: Sequence[CaseStatus], sweep_dir: Path) -> Group:
    """The table (a row per case) and :func:`progress_line`; the job and scheduler columns where
    the backend has jobs (Slurm)."""
    jobs = any(s.job_id for s in statuses)
    table = Table(title=f"sweep {sweep_dir}", show_lines=False)
    for col in ("case", "job", "slurm", "state", "arms", "progress", "detail"):
        if jobs or col not in ("job", "slurm"):
            table.add_column(col)
    for s in statuses:
        prog = f"{s.arm} {s.step}/{s.steps}" if s.arm else ""
        where = (s.job_id, s.scheduler_state) if jobs else ()
        table.add_row(s.case_id, *where, Text(s.state, style=_STATE_STYLE.get(s.state, "")),
                      f"{s.arms_done}/{s.arms_total}", prog, s.verdict or s.detail)
    return Group(table, progress_line(statuses))


def progress_line(statuses: Sequence[CaseStatus], width: int = 30) -> Text:
    """``[#######.......] 3/7 ended: 1 pending, 2 running, 3 done, 0 failed, 1 error``."""
    ended = sum(1 for s in statuses if s.terminal)
    filled = round(width * ended / len(statuses)) if statuses else width
    line = Text("[")
    line.append("#" * filled, style="green")
    line.append("." * (width - filled))
    line.append(f"] {ended}/{len(statuses)} ended: ")
    n = counts(statuses)
    line.append(", ".join(f"{v} {k}" for k, v in n.items()))
    return line


def run_status(args: argparse.Namespace) -> int:
    backend = backend_of(args.dir)
    sweep = Path(args.dir).resolve()
    if args.watch is not None and not args.watch > 0:
        raise ConfigError(f"--watch must be a positive number of seconds, got {args.watch}")
    console = make_console()
    if args.watch is None:
        console.print(status_renderable(list(backend.state(sweep).values()), sweep))
        return 0
    with Live(console=console, auto_refresh=False) as live:  # one backend: ended jobs asked once
        while True:
            statuses = list(backend.state(sweep).values())
            live.update(status_renderable(statuses, sweep), refresh=True)
            if all(s.terminal for s in statuses):
                return 0
            time.sleep(max(0.5, args.watch))
