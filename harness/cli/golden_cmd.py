"""`dcp-harness golden record DIR` and `dcp-harness golden diff OLD NEW`: keep a sweep's trusted
values as golden files, and review a refresh. This module parses the arguments, calls the golden
package and prints; what the commands do is there.

``record`` (``harness.golden.record``): for every case of the sweep folder whose plan has a
``golden`` pair, the golden arm's records are written to the case's golden folder as the sweep
resolved it, or ``--into DIR``; ``--repeats N`` runs the arm N - 1 more times through the local
launcher (``launch.local.lanes.run_arm_into``, passed in) and keeps the spread and the bounds it
gives, or refuses (``--max-cv``). Exit 2 when a case is not recorded (the other cases are still
written); a case whose arm this sweep skipped is listed as skipped, not an error. After writing
into the cases' golden folders, the command prints the ``dcp-harness run`` that judges the sweep
again with the new values.

``diff`` (``harness.golden.diff``): per metric the signed mean and the largest relative difference
of NEW against OLD; two folders: every golden file either holds (``--platform``: those of one
platform). ``--metrics`` chooses the metrics. Exit 0, or 1 with ``--max-rel`` when a difference is
larger, or a file, metric or step is on one side only; 2 when OLD or NEW does not exist.
"""

from __future__ import annotations

import argparse
import re
from functools import partial
from pathlib import Path

from harness.cli.report_cmd import DEFAULT_SWEEP, _sweep_dir
from harness.errors import ConfigError
from harness.golden import MAX_CV, METRIC
from harness.golden.diff import diff_files, render_diff
from harness.golden.record import (MAX_REPEATS, NOT_RECORDED, SKIPPED, WRITTEN, ArmRuns, Recording,
                                   case_dirs, record_sweep, rerun_note)
from harness.launch.local.lanes import run_arm_into
from harness.launch.ranks.completion import arm_is_complete
from harness.spec.schema import NAME_PATTERN


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("golden", help="golden values (Megatron-style goldens per case and platform)")
    sub = p.add_subparsers(dest="golden_command", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("record", help="write the golden files of a sweep's cases that declare "
                                      "compare.golden, from their golden arm's records",
                       description="Write golden_values_<key>.json of every case of the sweep "
                       "that declares compare.golden, from its golden arm's records (and N - 1 "
                       "more runs of it with --repeats N), into the case's golden folder (as "
                       "resolved when the sweep ran) or --into DIR.")
    r.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    r.add_argument("--platform", default=None,
                   help="platform name of the files (default: compare.golden.platform, else the "
                        "platform the arm ran on: cpu, h200, gb200, ...)")
    r.add_argument("--environment", default=None, metavar="NAME",
                   help="environment part of the key (golden_values_<NAME>_<platform>.json; "
                        "default: compare.golden.environment, 'auto' = the records' versions)")
    r.add_argument("--case", action="append", default=None, metavar="ID",
                   help="only this case id (repeatable)")
    r.add_argument("--into", type=Path, default=None, metavar="DIR",
                   help="write DIR/<case id>/golden_values_<key>.json instead of into each "
                        "case's golden folder")
    r.add_argument("--beside", action="store_true",
                   help="keep the key's file of other kernels and write beside it, "
                        "golden_values_<key>.<variant>.json named by this run's kernel identity "
                        "(cpu.avx2); the sweep judges each run against the file of its kernels. "
                        "Without it a file of the same kernels is refreshed, else the key's own")
    r.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run the golden arm N times in all (the sweep's run and N-1 more, through "
                        "the local launcher) and keep the spread and the bounds it gives "
                        f"(1..{MAX_REPEATS}; default 1)")
    r.add_argument("--max-cv", type=float, default=MAX_CV, metavar="X",
                   help="refuse to record when a checked step-time or memory metric's std/mean "
                        f"over the repeats is above X (default {MAX_CV:g}, Megatron's 2%%)")
    r.set_defaults(func=run_record)
    d = sub.add_parser("diff", help="compare a new golden file with the committed one, per metric",
                       description="Per metric the signed mean and the largest relative difference "
                       "of NEW against OLD over their common steps (step time also over the "
                       "steady window), the metrics and steps only one holds, and what changed in "
                       "the recorded environment. OLD and NEW are two golden files, or two "
                       "folders (every */golden_values_*.json either holds).")
    d.add_argument("old", type=Path, metavar="OLD")
    d.add_argument("new", type=Path, metavar="NEW")
    d.add_argument("--max-rel", type=float, default=None, metavar="X",
                   help="exit 1 when a relative difference is larger than X (e.g. 1e-5), or a "
                        "file, metric or step is on one side only")
    d.add_argument("--metrics", nargs="+", default=None, metavar="METRIC",
                   help=f"only these metrics (of: {', '.join(METRIC)}; quote names with spaces)")
    d.add_argument("--platform", default=None, metavar="NAME",
                   help="with two folders: only their golden files of this platform "
                        "(golden_values_[<environment>_]<NAME>.json)")
    d.set_defaults(func=run_diff)


def _say(line: str) -> None:
    print(line, flush=True)


def run_record(args: argparse.Namespace) -> int:
    sweep = _sweep_dir(args.dir)
    for flag, value in (("--platform", args.platform), ("--environment", args.environment)):
        if value is not None and not re.match(NAME_PATTERN, value):
            raise ConfigError(f"{flag} {value!r}: use lower-case letters, digits, '.', '_' or '-' "
                              "(e.g. h200)")
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise ConfigError(f"--repeats {args.repeats}: give 1..{MAX_REPEATS} runs")
    if not 0 < args.max_cv < 1:
        raise ConfigError(f"--max-cv {args.max_cv}: give a fraction in (0, 1), e.g. 0.02")
    if args.into is not None and args.into.exists() and not args.into.is_dir():
        raise ConfigError(f"--into {args.into}: exists and is not a folder; give a folder "
                          "(golden files go to DIR/<case>/golden_values_<platform>.json)")
    folders = case_dirs(sweep, args.case)
    recording = Recording(platform=args.platform, environment=args.environment, into=args.into,
                          beside=args.beside, repeats=args.repeats, max_cv=args.max_cv)
    from harness.launch.local.launcher import LocalLauncher

    with LocalLauncher() as launcher:
        runs = ArmRuns(run=partial(run_arm_into, launcher), complete=arm_is_complete)
        cases = record_sweep(sweep, folders, recording, runs, _say)
    written = [c for c in cases if c.result == WRITTEN]
    problems = [c for c in cases if c.result == NOT_RECORDED]
    skipped = [c.case_id for c in cases if c.result == SKIPPED]
    print(f"{len(written)} golden file(s) written, {len(problems)} case(s) not recorded"
          + (f", {len(skipped)} case(s) skipped (their golden arm did not run in this sweep): "
             f"{', '.join(skipped)}" if skipped else ""))
    if written and args.into is None:
        print(rerun_note(sweep, [c.source for c in written]))
    return 2 if problems else 0


def run_diff(args: argparse.Namespace) -> int:
    if args.max_rel is not None and not args.max_rel >= 0:
        raise ConfigError(f"--max-rel {args.max_rel}: give a relative difference >= 0")
    unknown = [m for m in args.metrics or () if m not in METRIC]
    if unknown:
        raise ConfigError(f"--metrics: no golden metric {', '.join(map(repr, unknown))}; the "
                          f"metrics are {', '.join(METRIC)}")
    worst, unmatched = 0.0, 0
    for pair in diff_files(args.old, args.new, args.platform, args.metrics):
        if pair.diff is None:
            print(f"golden diff: {pair.missing} is missing "
                  f"({'added' if pair.missing == pair.old else 'removed'} in NEW)\n")
            unmatched += 1
            continue
        print(render_diff(pair.diff))
        worst = max(worst, pair.diff.largest())
        unmatched += int(pair.diff.coverage_changed())
    if args.max_rel is not None and worst > args.max_rel:
        print(f"golden diff: largest relative difference {worst:.3g} > --max-rel {args.max_rel:g}")
        return 1
    if args.max_rel is not None and unmatched:
        print(f"golden diff: {unmatched} file(s) added, removed or holding other metrics or steps "
              "than the other side: a difference under --max-rel")
        return 1
    return 0
