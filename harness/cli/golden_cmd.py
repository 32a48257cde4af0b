"""`dcp-harness golden record DIR`: keep a sweep's trusted values as golden files.

For every case of the sweep folder that declares ``compare.golden``, the golden arm's records are
written (atomically) to ``<case file folder>/<compare.golden.dir>/<case id>/golden_values_<platform>.json``
(``harness.golden``). The arm must have finished ok with every step on every rank; a case whose
arm did not is reported and makes the command exit 2 (the other cases are still written).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.arms import arm_by_name, canonical_arm_name, golden_dir
from harness.cli.report_cmd import DEFAULT_SWEEP, _sweep_dir
from harness.errors import ConfigError
from harness.golden import golden_file, platform_of, write_golden
from harness.launch.sweep import arm_is_complete, load_case
from harness.results import CASE_FILE, read_steps


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("golden", help="golden values (Megatron-style goldens per case and platform)")
    sub = p.add_subparsers(dest="golden_command", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("record", help="write the golden files of a sweep's cases that declare "
                                      "compare.golden, from their golden arm's records")
    r.add_argument("dir", nargs="?", type=Path, default=DEFAULT_SWEEP, metavar="DIR",
                   help=f"sweep folder (default: {DEFAULT_SWEEP})")
    r.add_argument("--platform", default=None,
                   help="platform name of the files (default: compare.golden.platform, else "
                        "cpu/cuda from the records)")
    r.add_argument("--case", action="append", default=None, metavar="ID",
                   help="only this case id (repeatable)")
    r.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    sweep = _sweep_dir(args.dir)
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
        case = load_case(case_dir)
        spec = case.compare.golden
        if spec is None:
            print(f"skip  {case.id}: declares no compare.golden")
            continue
        arm = arm_by_name(case, canonical_arm_name(case, spec.arm))
        arm_dir = case_dir / arm.name
        if not arm_is_complete(arm.case, arm_dir):
            print(f"ERROR {case.id}: arm '{arm.name}' did not finish ok with all "
                  f"{case.train.steps} steps on every rank ({arm_dir}); not recorded")
            problems += 1
            continue
        steps = read_steps(arm_dir)
        platform = args.platform or spec.platform or platform_of(steps)
        path = write_golden(golden_file(golden_dir(case), case.id, platform), steps)
        print(f"wrote {path} (arm {arm.name}, {case.train.steps} steps)")
        written += 1
    print(f"{written} golden file(s) written, {problems} case(s) not recorded")
    return 2 if problems else 0
