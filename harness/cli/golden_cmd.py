"""`dcp-harness golden record DIR`: keep a sweep's trusted values as golden files.

For every case of the sweep folder whose plan has a ``golden`` pair, the golden arm's records are
written (atomically) to ``<golden dir>/<case id>/golden_values_<platform>.json``
(``harness.golden``): the golden folder the plan resolved when the sweep ran (the case file's
``compare.golden.dir``, absolute), or ``--into DIR`` (``DIR/<case id>/...``, e.g. to copy them
back from another machine). The platform is ``--platform``, else ``compare.golden.platform``,
else the platform the arm ran on (its records: ``cpu``, ``h200``, ...). The arm must have
finished ok with every step on every rank it records on; a case whose arm did not is reported
and makes the command exit 2 (the other cases are still written).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.cli.report_cmd import DEFAULT_SWEEP, _sweep_dir
from harness.compare import GoldenPairParams
from harness.errors import ConfigError
from harness.golden import golden_file, platform_of, write_golden
from harness.launch.sweep import arm_is_complete, load_plan
from harness.results import CASE_FILE, read_steps
from harness.spec.schema import NAME_PATTERN


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("golden", help="golden values (Megatron-style goldens per case and platform)")
    sub = p.add_subparsers(dest="golden_command", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("record", help="write the golden files of a sweep's cases that declare "
                                      "compare.golden, from their golden arm's records",
                       description="Write golden_values_<platform>.json of every case of the "
                       "sweep that declares compare.golden, from its golden arm's records, into "
                       "the case's golden folder (as resolved when the sweep ran) or --into DIR.")
    r.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    r.add_argument("--platform", default=None,
                   help="platform name of the files (default: compare.golden.platform, else the "
                        "platform the arm ran on: cpu, h200, gb200, ...)")
    r.add_argument("--case", action="append", default=None, metavar="ID",
                   help="only this case id (repeatable)")
    r.add_argument("--into", type=Path, default=None, metavar="DIR",
                   help="write DIR/<case id>/golden_values_<platform>.json instead of into each "
                        "case's golden folder")
    r.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    sweep = _sweep_dir(args.dir)
    if args.platform is not None and not re.match(NAME_PATTERN, args.platform):
        raise ConfigError(f"--platform {args.platform!r}: use lower-case letters, digits, '.', '_' "
                          "or '-' (e.g. h200)")
    case_dirs = sorted(p.parent for p in sweep.glob(f"*/{CASE_FILE}"))
    if args.case:
        unknown = sorted(set(args.case) - {d.name for d in case_dirs})
        if unknown:
            raise ConfigError(f"{sweep} has no case(s) {', '.join(unknown)}")
        case_dirs = [d for d in case_dirs if d.name in args.case]
    if not case_dirs:
        raise ConfigError(f"{sweep} holds no case folders (no */{CASE_FILE})")
    problems = written = 0
    for case_dir in case_dirs:
        plan = load_plan(case_dir)
        pair = next((p for p in plan.pairs if p.contract == "golden"), None)
        if pair is None:
            print(f"skip  {plan.case_id}: declares no compare.golden")
            continue
        if pair.skipped is not None:  # e.g. emulated ranks: their losses are not the model's
            print(f"skip  {plan.title}: its golden pair is not judged here ({pair.skipped})")
            continue
        params: GoldenPairParams = pair.params
        arm = plan.arm(pair.arms[0])
        arm_dir = case_dir / arm.name
        if not arm_is_complete(arm, arm_dir):
            print(f"ERROR {plan.case_id}: arm '{arm.name}' did not finish ok with all "
                  f"{plan.steps} steps on every rank ({arm_dir}); not recorded")
            problems += 1
            continue
        steps = read_steps(arm_dir)
        platform = args.platform or params.platform or platform_of(steps)
        folder = args.into if args.into is not None else Path(params.golden_dir)
        if args.into is None and not folder.parent.is_dir():
            print(f"ERROR {plan.case_id}: the golden folder {folder} (where the case file's "
                  "compare.golden.dir pointed when the sweep ran) is not on this machine; pass "
                  "--into DIR and copy the file there")
            problems += 1
            continue
        path = write_golden(golden_file(folder, plan.case_id, platform), steps)
        print(f"wrote {path} (arm {arm.name}, platform {platform}, {plan.steps} steps)")
        written += 1
    print(f"{written} golden file(s) written, {problems} case(s) not recorded")
    return 2 if problems else 0
