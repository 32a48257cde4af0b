"""`dcp-harness report DIR` and `dcp-harness gate DIR`: summaries and the merge gate."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.run_cmd import LATEST, RESULTS_ROOT
from harness.errors import ConfigError
from harness.launch.rules import case_rules
from harness.launch.sweep import sweep_lock
from harness.report import console_table, gate, make_console, write_reports

DEFAULT_SWEEP = RESULTS_ROOT / LATEST  # where `dcp-harness run` points its newest sweep


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="(re)write summary.md, junit.xml, index.json and plots of a sweep folder",
        description="Judge every case of a sweep folder from its files (each verdict.json is "
        "checked against the step records and outcomes it was made from) and (re)write "
        "summary.md, junit.xml, index.json and plots/<case>.png; print the table. Exit 0, or 2 "
        "for a missing folder or one a `dcp-harness run` is still writing.",
    )
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    p.set_defaults(func=run_report)

    g = subparsers.add_parser(
        "gate",
        help="merge gate: exit 0 all pass, 1 a check failed, 2 errors without failures",
        description="The merge gate. Every case is judged from what its files prove: the pairs "
        "are evaluated again from the step records and compared with verdict.json. Exit 0 when "
        "every check passed; 1 when a check failed on recorded values (a regression); 2 for an "
        "error without regressions: a crashed, hung or killed arm, unreadable or inconsistent "
        "results, or nothing run.",
    )
    g.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    g.set_defaults(func=run_gate)


def _sweep_dir(path: Path) -> Path:
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise ConfigError(
            f"sweep folder {path} {what}; pass the --out folder of `dcp-harness run` "
            f"(default {DEFAULT_SWEEP})"
        )
    return path.resolve()


def run_report(args: argparse.Namespace) -> int:
    sweep = _sweep_dir(args.dir)
    # A running `dcp-harness run` writes the reports itself when it ends; one written now would
    # describe half a sweep (and be overwritten). The gate only reads: it may judge it meanwhile.
    with sweep_lock(sweep, busy=f"it writes its reports when it ends; `dcp-harness gate {sweep}` "
                                "judges it as it stands now"):
        files = write_reports(sweep, rules=case_rules)
    console_table(files, make_console())
    print(f"wrote {files.summary}, {files.junit}, {files.index}"
          + (f" and {len(files.plots)} plot(s)" if files.plots else ""))
    for note in files.notes:
        print(note)
    return 0


def run_gate(args: argparse.Namespace) -> int:
    return gate(_sweep_dir(args.dir), rules=case_rules)
