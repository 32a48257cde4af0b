"""`dcp-harness report DIR` and `dcp-harness gate DIR`: summaries and the merge gate."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.run_cmd import LATEST, RESULTS_ROOT
from harness.cli.history_cmd import add_drift_options, add_history_option, drift_report
from harness.cli.skips import add_allow_skip_argument, allowed_skips
from harness.errors import ConfigError
from harness.history import record_sweep
from harness.report import gate, show_table, write_reports
from harness.report.load import is_case_dir
from harness.results import MANIFEST_FILE, sweep_lock
from harness.trust.stored_plan import check_stored_plan

DEFAULT_SWEEP = RESULTS_ROOT / LATEST  # where `dcp-harness run` points its newest sweep


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="(re)write summary.md, junit.xml, index.json, index.html and plots of a sweep folder",
        description="Judge every case of a sweep folder from its files (each verdict.json is "
        "checked against the step records and outcomes it was made from) and (re)write "
        "summary.md, junit.xml, index.json, index.html (the page to open in a browser) and "
        "plots/<case>.png; print the table. Exit 0, or 2 "
        "for a missing folder or one a `dcp-harness run` is still writing.",
    )
    _add_sweep_arguments(p)
    p.set_defaults(func=run_report)

    g = subparsers.add_parser(
        "gate",
        help="merge gate: exit 0 all pass, 1 a check failed, 2 errors without failures",
        description="The merge gate. Every case is judged from what its files prove: the pairs "
        "are evaluated again from the step records and compared with verdict.json. Exit 0 when "
        "every check passed; 1 when a check failed on recorded values (a regression); 2 for an "
        "error without regressions: a crashed, hung or killed arm, unreadable or inconsistent "
        "results, a case or arm the sweep's manifest lists and the folder lacks, a skip of a "
        "kind not accepted (--allow-skip), a sweep still being written, or nothing run.",
    )
    _add_sweep_arguments(g)
    g.add_argument("--as-is", action="store_true", dest="as_is",
                   help="judge a sweep that a `dcp-harness run` is still writing as it stands now "
                        "(its unfinished cases are errors); without it such a sweep is an error")
    g.add_argument("--history", action="store_true", dest="drift",
                   help="also judge the sweep's cases across the history's sweeps: the sweep is "
                        "added to the history (a no-op when `run` added it already), then "
                        "`dcp-harness history check` of its cases (docs/history.md)")
    add_history_option(g, "--history-url")
    add_drift_options(g)
    g.set_defaults(func=run_gate)


def _add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """DIR (the sweep folder, default the newest run's) and the skips accepted: report and gate."""
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    add_allow_skip_argument(p)


def _sweep_dir(path: Path) -> Path:
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise ConfigError(
            f"sweep folder {path} {what}; pass the --out folder of `dcp-harness run` "
            f"(default {DEFAULT_SWEEP})"
        )
    return path.resolve()


def _is_sweep(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file() or any(is_case_dir(c) for c in path.iterdir())


def run_report(args: argparse.Namespace) -> int:
    sweep = _sweep_dir(args.dir)
    if not _is_sweep(sweep):
        raise ConfigError(f"{sweep} is not a sweep folder (no {MANIFEST_FILE}, no case folders); "
                          f"pass the --out folder of `dcp-harness run` (default {DEFAULT_SWEEP})")
    skips = allowed_skips(args)
    # A running `dcp-harness run` writes the reports itself when it ends; one written now would
    # describe half a sweep (and be overwritten). The gate only reads: it may judge it meanwhile.
    with sweep_lock(sweep, busy=f"it writes its reports when it ends; `dcp-harness gate {sweep}` "
                                "judges it as it stands now"):
        files = write_reports(sweep, check_plan=check_stored_plan, allowed_skips=skips)
    show_table(files)
    print(f"wrote {files.summary}, {files.junit}, {files.index}, {files.page}"
          + (f" and {len(files.plots)} plot(s)" if files.plots else ""))
    for note in files.notes:
        print(note)
    return 0


def run_gate(args: argparse.Namespace) -> int:
    if args.history is not None and not args.drift:
        raise ConfigError("--history-url names the database of the drift check, which only "
                          "--history runs: add --history (docs/history.md)")
    sweep = _sweep_dir(args.dir)
    code = gate(sweep, check_plan=check_stored_plan, allowed_skips=allowed_skips(args),
                as_is=args.as_is)
    if not args.drift:
        return code
    if code == 2:
        # A sweep the gate cannot judge (a case or arm missing, records cut) would put its partial
        # figures into every later sweep's trend: it is kept out, and its drift is not judged.
        print("history: not added, drift not judged: the gate could not judge this sweep (exit 2; "
              "fix or re-run it, then `dcp-harness gate --history` again)")
        return code
    recorded = record_sweep(sweep, url=args.history)
    print(recorded.line())
    cases = [c.name for c in sweep.iterdir() if is_case_dir(c)]
    # The sweep is judged against the series it joined (its own label), unless --label asks.
    asked = vars(args) | {"label": args.label or recorded.label}
    report = drift_report(argparse.Namespace(**asked, case=None, metric=None, platform=None),
                          cases=cases)
    if report.exit_code == 2 and not report.drifted:
        # A new series (the first nights of a case): nothing to judge is not an error of the sweep.
        print(f"history check: nothing judged yet: none of the {len(report.judged)} figure(s) of "
              "this sweep's cases is in enough sweeps for a trend; the gate's verdict stands "
              "(`dcp-harness history check -v` lists them)")
        return code
    print("\n".join(report.lines()))
    return combined_code(code, report.exit_code)


def combined_code(*codes: int) -> int:
    """The gate's rule for several verdicts: a failure (1) beats an error (2) beats a pass."""
    return 1 if 1 in codes else max(codes)
