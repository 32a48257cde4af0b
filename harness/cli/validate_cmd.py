"""`dcp-harness validate PATHS...`: load, expand and preflight case files; run nothing."""

from __future__ import annotations

import argparse

from rich.table import Table

from harness.cli.selection import selected_cases
from harness.report import make_console
from harness.spec import Case


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check case files (schema, matrix, preflight) without running anything",
        description="Load case files or folders, expand matrices and run the preflight checks. "
        "Exit 0 when every case is valid, 2 with one clear error otherwise.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="case file or folder of case files")
    p.add_argument("-k", dest="k", default=None, metavar="EXPR", help="select case ids (pytest -k style)")
    p.add_argument("--tags", nargs="+", default=None, metavar="TAG", help="keep cases with any of these tags")
    p.set_defaults(func=run)


def layout(case: Case) -> str:
    """``pp2 vpp2 dcp1/2 ep2 dp2``: the parallel layout of a case in one word list."""
    lay = case.layout
    cp = "dcp" + "/".join(str(c) for c in lay.cp_sizes) if lay.dynamic else f"cp{lay.max_cp}"
    return f"pp{lay.pp} vpp{lay.vpp} {cp} ep{lay.ep} dp{lay.dp}"


def run(args: argparse.Namespace) -> int:
    cases = selected_cases(args.paths, k=args.k, tags=args.tags)
    table = Table(title=f"{len(cases)} valid case(s)")
    for col in ("case", "layout", "ranks", "steps", "pairs", "source"):
        table.add_column(col)
    for case in cases:
        pairs = [name for name, v in case.compare if v is not None] or ["(arm checks only)"]
        table.add_row(case.id, layout(case), str(case.layout.world), str(case.train.steps),
                      ", ".join(pairs), case.source)
    make_console().print(table)
    return 0
