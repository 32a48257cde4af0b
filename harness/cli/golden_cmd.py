"""`dcp-harness golden record DIR` and `dcp-harness golden diff OLD NEW`: keep a sweep's trusted
values as golden files, and review a refresh.

``record``: for every case of the sweep folder whose plan has a ``golden`` pair, the golden arm's
records are written (atomically) to ``<golden dir>/<case id>/golden_values_<key>.json``
(``harness.golden``): the golden folder the plan resolved when the sweep ran (the case file's
``compare.golden.dir``, absolute), or ``--into DIR`` (``DIR/<case id>/...``, e.g. to copy them
back from another machine). The key is the platform (``--platform``, else
``compare.golden.platform``, else the platform the arm ran on: ``cpu``, ``h200``, ...), prefixed
with ``compare.golden.environment`` (``auto``: the records' torch/CUDA versions) when set. The
arm must have finished ok with every step on every rank it records on; a case whose arm did not
is reported and makes the command exit 2 (the other cases are still written). A case whose arm
this sweep skipped (not run here: a GPU case of a CPU sweep) is listed as skipped, not an error.
The sweep judged the golden values as they were when it ran (its copy, ``harness.golden``): after
writing into the cases' golden folders, the command prints the ``dcp-harness run`` that judges
the sweep again with the new ones.

``--repeats N`` (Megatron-LM's ``compute_golden_statistics.py``): the arm runs N - 1 more times
through the local launcher, into ``<sweep>/golden-repeats/<case>/repeat<k>/<arm>`` (a re-run of
the command resumes them), and the file keeps the per-step median with the spread (``min``,
``max``, ``cv``) and, for step time and memory, the bound the verdict then uses (``rtol``: the
largest relative deviation x 1.5, at least 0.1 %). It refuses to write a file (exit 2, naming
the metric and why) when the repeats disagree by more than the golden check's own loss bounds,
or when a step-time or memory metric the verdict checks varies by more than ``--max-cv``
(std/mean, default 2 %, Megatron's MoE performance check).

``diff``: per metric the signed mean and the largest relative difference of NEW against OLD
(``harness.golden_diff``); two folders: every golden file either holds (``--platform``: those of
one platform). ``--metrics`` chooses the metrics. Exit 0, or 1 with ``--max-rel`` when a
difference is larger, or a file, metric or step is on one side only; 2 when OLD or NEW does not
exist.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Optional

from harness.caseplan import CasePlan, PlannedArm
from harness.cli.report_cmd import DEFAULT_SWEEP, _sweep_dir
from harness.compare import GoldenPairParams
from harness.errors import ConfigError
from harness.golden import (
    MAX_CV,
    MEMORY,
    METRIC,
    METRICS,
    TIME,
    VARIANT_SEP,
    GoldenError,
    environment_of,
    golden_file,
    golden_key,
    platform_of,
    read_golden,
    refusals,
    resolve_environment,
    same_kernels,
    variant_name,
    write_golden,
)
from harness.golden_diff import diff_golden, on_platform, render_diff
from harness.launch.local.lanes import run_arm_into
from harness.launch.ranks.completion import arm_is_complete
from harness.launch.sweep_folder import load_plan
from harness.results import (CASE_FILE, RunEnvironment, read_arm_env, read_outcome, read_steps,
                             sweep_lock)
from harness.spec.names import GOLDEN
from harness.spec.schema import NAME_PATTERN

REPEATS_DIR = "golden-repeats"
CASE_HASH_FILE = "case.hash"  # the plan's case_hash the repeats ran
MAX_REPEATS = 20
# What ``golden record`` did with a case.
WRITTEN, NOT_RECORDED, SKIPPED, NO_GOLDEN = "written", "not recorded", "skipped", "no golden"


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


def _checked(params: GoldenPairParams, platform: str) -> set[str]:
    """The step-time and memory metrics the verdict checks on ``platform``."""
    out: set[str] = set()
    for m in METRICS:
        if m.kind == TIME and params.step_time is not None and (platform != "cpu"
                                                                or params.step_time.on_cpu):
            out.add(m.name)
        elif m.kind == MEMORY and params.memory is not None:
            out.add(m.name)
    return out


def _run_repeats(plan: CasePlan, arm: PlannedArm, case_dir: Path, repeats: int
                 ) -> tuple[list[Path], Optional[str]]:
    """The arm folders of repeats 2..N (run now through the local launcher unless complete),
    or the reason one did not finish. Repeats of another definition of the case (their
    ``case.hash`` is not the plan's ``case_hash``) are removed and run again."""
    from harness.launch.local.launcher import LocalLauncher

    root = case_dir.parent / REPEATS_DIR / plan.case_id
    hash_file = root / CASE_HASH_FILE
    stored = hash_file.read_text().strip() if hash_file.is_file() else None
    if repeats > 1 and stored != plan.case_hash:
        if root.is_dir() and any(root.glob("repeat*")):
            was = f"case hash {stored[:12]}" if stored else "no case hash stored"
            print(f"      {plan.case_id}: the repeats in {root} ran another definition of the case "
                  f"({was}, now {plan.case_hash[:12]}); running them again", flush=True)
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        hash_file.write_text(plan.case_hash + "\n")
    folders = []
    with LocalLauncher() as launcher:
        for k in range(2, repeats + 1):
            arm_dir = root / f"repeat{k}" / arm.name
            folders.append(arm_dir)
            if arm_is_complete(arm, arm_dir):
                print(f"      {plan.case_id}: repeat {k}/{repeats} of arm '{arm.name}' already complete "
                      f"({arm_dir})")
                continue
            print(f"      {plan.case_id}: repeat {k}/{repeats} of arm '{arm.name}' -> {arm_dir}", flush=True)
            outcome = run_arm_into(launcher, plan, arm, arm_dir, case_dir / CASE_FILE)
            if not outcome.ok or not arm_is_complete(arm, arm_dir):
                return folders, f"repeat {k} of arm '{arm.name}' {outcome.describe()} (log: {arm_dir / 'log.txt'})"
    return folders, None


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
    case_dirs = sorted(p.parent for p in sweep.glob(f"*/{CASE_FILE}"))
    if args.case:
        unknown = sorted(set(args.case) - {d.name for d in case_dirs})
        if unknown:
            raise ConfigError(f"{sweep} has no case(s) {', '.join(unknown)}")
        case_dirs = [d for d in case_dirs if d.name in args.case]
    if not case_dirs:
        raise ConfigError(f"{sweep} holds no case folders (no */{CASE_FILE})")
    with sweep_lock(sweep, busy="wait for the sweep to end before recording its golden values"):
        results = {case_dir.name: _record_case(args, case_dir) for case_dir in case_dirs}
    written = [c for c, r in results.items() if r == WRITTEN]
    problems = [c for c, r in results.items() if r == NOT_RECORDED]
    skipped = [c for c, r in results.items() if r == SKIPPED]
    print(f"{len(written)} golden file(s) written, {len(problems)} case(s) not recorded"
          + (f", {len(skipped)} case(s) skipped (their golden arm did not run in this sweep): "
             f"{', '.join(skipped)}" if skipped else ""))
    if written and args.into is None:
        print(rerun_note(sweep, [load_plan(sweep / c).source for c in written]))
    return 2 if problems else 0


def rerun_note(sweep: Path, sources: list[str]) -> str:
    """What to run so that ``sweep`` is judged with the golden values just written: it judged
    the copy taken when it ran."""
    files = [os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd()) else f
             for f in dict.fromkeys(sources)]
    return (f"the sweep {sweep} judged the copy taken when it ran; re-run `dcp-harness run "
            f"{shlex.join(files)} --out {shlex.quote(str(sweep))}` to judge with the new values")


def _record_case(args: argparse.Namespace, case_dir: Path) -> str:
    """Record one case (module doc); what it did, reported as it goes."""
    plan = load_plan(case_dir)
    pair = next((p for p in plan.pairs if p.contract == GOLDEN), None)
    if pair is None:
        print(f"skip  {plan.case_id}: declares no compare.golden")
        return NO_GOLDEN
    if pair.skipped is not None:  # e.g. emulated ranks: their losses are not the model's
        print(f"skip  {plan.title}: its golden pair is not judged here ({pair.skipped})")
        return NO_GOLDEN
    params: GoldenPairParams = pair.params
    arm = plan.arm(pair.arms[0])
    arm_dir = case_dir / arm.name
    outcome = read_outcome(arm_dir)
    if outcome is not None and outcome.status == "skipped":  # e.g. a GPU case of a CPU sweep
        print(f"skip  {plan.case_id}: arm '{arm.name}' did not run in this sweep "
              f"({outcome.detail}); record it from a sweep where it ran")
        return SKIPPED
    if not arm_is_complete(arm, arm_dir):
        print(f"ERROR {plan.case_id}: arm '{arm.name}' did not finish ok with all "
              f"{plan.steps} steps on every rank ({arm_dir}); not recorded")
        return NOT_RECORDED
    folder = args.into if args.into is not None else Path(params.golden_dir)
    if args.into is None and not folder.parent.is_dir():
        print(f"ERROR {plan.case_id}: the golden folder {folder} (where the case file's "
              "compare.golden.dir pointed when the sweep ran) is not on this machine; pass "
              "--into DIR and copy the file there")
        return NOT_RECORDED
    first = read_steps(arm_dir)
    platform = args.platform or params.platform or platform_of(first)
    try:  # needs only the sweep's run: checked before any repeat runs
        environment = resolve_environment(args.environment or params.environment, first)
    except ValueError as exc:
        print(f"ERROR {plan.case_id}: {exc}; not recorded")
        return NOT_RECORDED
    repeat_dirs, failed = _run_repeats(plan, arm, case_dir, args.repeats)
    if failed is not None:
        print(f"ERROR {plan.case_id}: {failed}; not recorded")
        return NOT_RECORDED
    runs = [first] + [read_steps(d) for d in repeat_dirs]
    window = params.step_time.window if params.step_time is not None else None
    why = refusals(runs, loss_bounds={"lm loss": params.loss, "aux loss": params.aux_loss,
                                      "grad norm": params.grad_norm},
                   checked=_checked(params, platform_of(runs[0])), window=window,
                   max_cv=args.max_cv)
    if why:
        for line in why:
            print(f"REFUSED {plan.case_id}: {line}")
        print(f"ERROR {plan.case_id}: the {len(runs)} repeats are too unsteady to keep as golden "
              "values; not recorded")
        return NOT_RECORDED
    try:
        path = write_golden(target_file(folder, plan.case_id, golden_key(platform, environment),
                                        environment_of(first), args.beside), runs,
                            window=window, arm=arm.name, inherited_env=read_arm_env(arm_dir))
    except (GoldenError, OSError) as exc:
        print(f"ERROR {plan.case_id}: {exc}; not recorded")
        return NOT_RECORDED
    bounds = _bounds_line(path) if len(runs) > 1 else ""
    print(f"wrote {path} (arm {arm.name}, platform {platform}"
          f"{f', environment {environment}' if environment else ''}, {plan.steps} steps, "
          f"{len(runs)} run(s){bounds})")
    return WRITTEN


def target_file(folder: Path, case_id: str, key: str, env: Optional[RunEnvironment],
                beside: bool) -> Path:
    """Where ``golden record`` writes a run of kernels ``env``: the file of ``key`` (its own or
    one beside it, ``harness.golden.keys_of``) recorded with the same kernels; else, with
    ``beside``, ``golden_values_<key>.<variant>.json`` (``harness.golden.variant_name``); else
    the key's own file."""
    own = golden_file(folder, case_id, key)
    for path in [own] + sorted(own.parent.glob(f"golden_values_{key}{VARIANT_SEP}*.json")):
        if path.is_file():
            try:
                if same_kernels(read_golden(path), env):
                    return path
            except GoldenError:
                continue
    if beside:
        return own.with_name(f"golden_values_{key}{VARIANT_SEP}{variant_name(env)}.json")
    return own


def _bounds_line(path: Path) -> str:
    golden = read_golden(path)
    parts = [f"{m} rtol {golden.rtol(m):.3g}" for m in golden.metrics if golden.rtol(m) is not None]
    return ("; " + ", ".join(parts)) if parts else ""


def _pairs(old: Path, new: Path, platform: Optional[str]) -> list[tuple[Path, Path]]:
    """(old file, new file) to compare: the two files, or every golden file of two folders (of
    ``platform`` only, when given)."""
    for side, path in (("OLD", old), ("NEW", new)):
        if not path.exists():
            raise ConfigError(f"golden diff: {side} {path} does not exist; give two golden files "
                              "or two folders of them")
    if old.is_dir() and new.is_dir():
        names = sorted({p.relative_to(old) for p in old.glob("*/golden_values_*.json")}
                       | {p.relative_to(new) for p in new.glob("*/golden_values_*.json")})
        if platform is not None:
            names = [n for n in names if on_platform(n, platform)]
        if not names:
            raise ConfigError(f"neither {old} nor {new} holds */golden_values_*.json files"
                              + (f" of platform '{platform}'" if platform is not None else ""))
        return [(old / n, new / n) for n in names]
    if old.is_dir() or new.is_dir():
        raise ConfigError(f"give two golden files or two folders, not a file and a folder "
                          f"({old}, {new})")
    if platform is not None:
        raise ConfigError(f"--platform {platform} chooses the files of two folders; two files "
                          "are compared as they are (drop --platform)")
    return [(old, new)]


def run_diff(args: argparse.Namespace) -> int:
    if args.max_rel is not None and not args.max_rel >= 0:
        raise ConfigError(f"--max-rel {args.max_rel}: give a relative difference >= 0")
    unknown = [m for m in args.metrics or () if m not in METRIC]
    if unknown:
        raise ConfigError(f"--metrics: no golden metric {', '.join(map(repr, unknown))}; the "
                          f"metrics are {', '.join(METRIC)}")
    worst, unmatched = 0.0, 0
    for old_path, new_path in _pairs(args.old, args.new, args.platform):
        if not old_path.is_file() or not new_path.is_file():
            print(f"golden diff: {old_path if not old_path.is_file() else new_path} is missing "
                  f"({'added' if not old_path.is_file() else 'removed'} in NEW)\n")
            unmatched += 1
            continue
        try:
            diff = diff_golden(read_golden(old_path), read_golden(new_path), args.metrics)
        except GoldenError as exc:
            raise ConfigError(str(exc)) from None
        print(render_diff(diff))
        worst = max(worst, diff.largest())
        unmatched += int(diff.coverage_changed())
    if args.max_rel is not None and worst > args.max_rel:
        print(f"golden diff: largest relative difference {worst:.3g} > --max-rel {args.max_rel:g}")
        return 1
    if args.max_rel is not None and unmatched:
        print(f"golden diff: {unmatched} file(s) added, removed or holding other metrics or steps "
              "than the other side: a difference under --max-rel")
        return 1
    return 0
