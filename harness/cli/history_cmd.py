"""`dcp-harness history add|rebuild|show|check|dashboard`: the history of sweeps (docs/history.md).

Every subcommand takes ``--history URL`` (default ``$DCP_HARNESS_HISTORY``, else
``results/history.sqlite`` under the current directory). ``check`` exits as the gate does: 0 no
figure drifted, 1 a figure drifted, 2 nothing could be judged or the database cannot be used.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Optional, Sequence

from harness.errors import ConfigError
from harness.history import (
    DEFAULT_PATH,
    DEFAULT_WINDOW,
    ENV_VAR,
    DriftReport,
    check,
    open_history,
    rebuild,
    series,
)
from harness.history.dashboard import DEFAULT_PAGE, write_dashboard
from harness.history.drift import MIN_POINTS
from harness.history.labels import followed
from harness.history.query import case_ids, labels
from harness.history.plot import write_series_png
from harness.history.query import SeriesKey
from harness.history.schema import ARM, PAIR
from harness.history.store import add

DEFAULT_PLOT = Path("results") / "history-show.png"


def add_history_option(p: argparse.ArgumentParser, name: str = "--history") -> None:
    p.add_argument(name, dest="history", metavar="URL", default=None,
                   help=f"history database: a SQLite file or a URL such as "
                        f"postgresql+psycopg://user@host:5432/db (default: ${ENV_VAR}, else "
                        f"{DEFAULT_PATH} under the current directory)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _pct(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a percentage above 0, got {text}")
    return value


def _window(text: str) -> int:
    value = int(text)
    if value < MIN_POINTS:
        raise argparse.ArgumentTypeError(
            f"a trend needs {MIN_POINTS} sweeps (a level and a move that stayed), got {value}; "
            f"give --window {MIN_POINTS} or more (default {DEFAULT_WINDOW})")
    return value


def add_label_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label", default=None, metavar="L",
                   help="follow the sweeps of this label (default: nightly where the history "
                        "holds nightly sweeps, else adhoc; docs/history.md, Labels)")


def add_drift_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", type=_window, default=DEFAULT_WINDOW, metavar="N",
                   help=f"judge each figure over its last N sweeps ({MIN_POINTS} or more; "
                        f"default {DEFAULT_WINDOW})")
    p.add_argument("--max-drift", type=_pct, default=None, metavar="PCT",
                   dest="max_drift", help="fail a figure that moved the bad way by more than PCT "
                   "percent (and more than 3 x its noise; default per kind of figure: 5 for step "
                   "time, 3 for memory, 0.5 for the loss)")
    add_label_option(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    h = subparsers.add_parser(
        "history", help="the history of sweeps: add, rebuild, show trends, check drift",
        description="Keep every sweep's figures in a history database (the sweep folders stay "
        "the source of truth) and judge figures across sweeps. docs/history.md.")
    sub = h.add_subparsers(dest="history_command", metavar="SUBCOMMAND")
    sub.required = True

    a = sub.add_parser("add", help="add sweep folders to the history (the same one again: no-op)")
    a.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP")
    add_history_option(a)
    a.set_defaults(func=run_add)

    r = sub.add_parser("rebuild", help="re-import every sweep folder under DIR... (e.g. results/)")
    r.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    add_history_option(r)
    r.set_defaults(func=run_rebuild)

    s = sub.add_parser("show", help="print the series of figures over sweeps and plot them")
    s.add_argument("case", nargs="?", default=None, metavar="CASE",
                   help="a case id (* and ? wildcards); default every case")
    s.add_argument("--metric", default=None, metavar="M",
                   help="a figure (e.g. step_time_median_s, peak_allocated_bytes, final_loss; a "
                        "pair's check name with --pairs); * and ? wildcards")
    s.add_argument("--platform", default=None, metavar="P", help="only this platform (cpu, h100)")
    s.add_argument("--last", type=_positive, default=20, metavar="N",
                   help="the last N sweeps of each series (default 20)")
    s.add_argument("--pairs", action="store_true", help="the pairs' check values too")
    s.add_argument("--ranks", action="store_true", help="each rank's figures too")
    s.add_argument("--plot", type=Path, default=DEFAULT_PLOT, metavar="FILE",
                   help=f"where the PNG goes (default {DEFAULT_PLOT})")
    s.add_argument("--no-plot", action="store_true", dest="no_plot",
                   help="print the series only (no PNG)")
    add_label_option(s)
    add_history_option(s)
    s.set_defaults(func=run_show)

    c = sub.add_parser("check", help="fail figures that drifted across sweeps (exit 0/1/2)")
    c.add_argument("case", nargs="?", default=None, metavar="CASE",
                   help="a case id (* and ? wildcards); default every case")
    c.add_argument("--metric", default=None, metavar="M", help="only this figure")
    c.add_argument("--platform", default=None, metavar="P", help="only this platform")
    add_drift_options(c)
    c.add_argument("-v", "--verbose", action="store_true",
                   help="list every figure (steady, too few, shown only) too")
    add_history_option(c)
    c.set_defaults(func=run_check)

    d = sub.add_parser("dashboard", help="write the history's HTML page (self-contained)")
    d.add_argument("--out", type=Path, default=DEFAULT_PAGE, metavar="FILE",
                   help=f"the page (default {DEFAULT_PAGE})")
    d.add_argument("--last", type=_positive, default=30, metavar="N",
                   help="the last N sweeps of each trend (default 30)")
    add_drift_options(d)
    add_history_option(d)
    d.set_defaults(func=run_dashboard)


def run_add(args: argparse.Namespace) -> int:
    history = open_history(args.history)
    try:
        for sweep in args.sweeps:
            print(add(history, sweep).line())
    finally:
        history.close()
    return 0


def run_rebuild(args: argparse.Namespace) -> int:
    history = open_history(args.history)
    try:
        results = rebuild(history, args.dirs)
    finally:
        history.close()
    for item in results:
        print(item if isinstance(item, str) else item.line())
    left_out = sum(isinstance(i, str) for i in results)
    print(f"history rebuild: {len(results) - left_out} sweep(s) in {history.shown}, "
          f"{left_out} left out")
    return 2 if left_out else 0


@dataclass(frozen=True)
class Found:
    """The series a reading command asked for, the label followed and the others there."""

    series: dict[SeriesKey, list]
    where: str
    label: str
    others: tuple[tuple[str, int], ...]


def _series(args: argparse.Namespace, kinds: tuple[str, ...], last: int, ranks: bool = False,
            cases: Optional[Sequence[str]] = None) -> Found:
    """The series of the followed label; a ConfigError naming the cases there are when the
    CASE asked for matches none."""
    history = open_history(args.history, create=False)
    try:
        with history.read() as conn:
            counts = labels(conn)
            label = followed(getattr(args, "label", None), counts)
            found = series(conn, case=args.case, metric=args.metric, platform=args.platform,
                           last=last, kinds=kinds, ranks=ranks, label=label)
            known = case_ids(conn) if args.case is not None and not found else []
    finally:
        history.close()
    if args.case is not None and not found and counts:
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        there = f"its cases: {listed}" if known else "it holds no cases"
        if any(args.case == k or fnmatch(k, args.case) for k in known):
            there = f"no sweep labelled '{label}' holds it; labels there: " + ", ".join(counts)
        raise ConfigError(f"no case matching '{args.case}' in {history.shown} ({there})")
    if cases is not None:
        found = {k: v for k, v in found.items() if k.case_id in cases}
    others = tuple((name, n) for name, n in counts.items() if name != label)
    return Found(found, history.shown, label, others)


def _value(v: float) -> str:
    return f"{v:.6g}"


def run_show(args: argparse.Namespace) -> int:
    kinds = (ARM, PAIR) if args.pairs else (ARM,)
    got = _series(args, kinds, args.last, ranks=args.ranks)
    found, where = got.series, got.where
    if not found:
        raise ConfigError(f"no figures in {where} match (case {args.case or '*'}, metric "
                          f"{args.metric or '*'}, platform {args.platform or '*'}); `dcp-harness "
                          "history show` without filters lists what there is")
    for key in sorted(found):
        pts = found[key]
        print(f"{key.label}: " + " ".join(_value(p.value) for p in pts))
        print(f"    sweeps {pts[0].short} .. {pts[-1].short} ({len(pts)}, label {got.label}), "
              f"newest {pts[-1].started} {pts[-1].commit_label}")
    if args.no_plot:
        return 0
    path, left = write_series_png(found, args.plot)
    print(f"wrote {path}" + (f" ({left} series not plotted; narrow with CASE or --metric)"
                             if left else ""))
    return 0


def drift_report(args: argparse.Namespace, cases: Optional[Sequence[str]] = None) -> DriftReport:
    got = _series(args, (ARM,), args.window, cases=cases)
    max_drift = args.max_drift / 100 if args.max_drift is not None else None
    return check(got.series, window=args.window, max_drift=max_drift, label=got.label,
                 others=got.others)


def run_check(args: argparse.Namespace) -> int:
    report = drift_report(args)
    print("\n".join(report.lines(verbose=args.verbose)))
    return report.exit_code


def run_dashboard(args: argparse.Namespace) -> int:
    history = open_history(args.history, create=False)
    try:
        page = write_dashboard(history, args.out, last=args.last, window=args.window,
                               max_drift=args.max_drift / 100 if args.max_drift is not None
                               else None, label=args.label)
    finally:
        history.close()
    print(f"wrote {page}")
    return 0
