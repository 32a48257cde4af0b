"""`dcp-harness run PATHS...`: run cases on this machine, judge them, report, gate.

Everything that can be wrong with the input (case files, selection, arms, ``--out`` holding other
results, ``--timeout-min``) is checked before anything is written (exit 2). The exit code is then
the gate's: 0 all pass, 1 a check failed, 2 errors (crash, timeout) without failures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from harness.cli.selection import (add_selection_arguments, emulated_on_too_few_gpus,
                                    selected_plans)
from harness.cli.sinks import add_history_arguments, add_label_argument, sweep_sinks
from harness.cli.skips import add_allow_skip_argument, allowed_skips
from harness.errors import ConfigError
from harness.launch.local.launcher import LocalLauncher
from harness.launch.local.backend import run_sweep
from harness.launch.local.cpu_lane import cpu_cores
from harness.launch.local.gpu_lane import gpu_setting
from harness.launch.local.progress import make_progress
from harness.launch.ranks.placement import runs_beside_gpu_arms
from harness.launch.ranks.processes import cuda_device_count
from harness.launch.sweep_folder import check_resumable, sweep_start
from harness.report import gate_result, show_table

RESULTS_ROOT = Path("results")
LATEST = "latest"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run cases on this machine (one process per rank), compare, report and gate",
        description="Run every arm of the selected cases on this machine, one process per rank "
        "(CUDA/NCCL when there are enough GPUs, else CPU/gloo), evaluate the pairs, write "
        "summary.md, junit.xml and index.json, and exit with the gate's code (0 pass, 1 a check "
        "failed, 2 errors without failures). Re-running into the same --out resumes.",
    )
    add_selection_arguments(p)
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"sweep folder (default: {RESULTS_ROOT}/<UTC timestamp>); either way "
                        f"{RESULTS_ROOT}/{LATEST} here points at it, so `report` and `gate` "
                        "without DIR judge it")
    p.add_argument("--no-latest", action="store_true", dest="no_latest",
                   help=f"leave {RESULTS_ROOT}/{LATEST} as it is (e.g. a bisect step's sweep)")
    p.add_argument("--timeout-min", type=float, default=None, metavar="M",
                   help="per-arm time limit in minutes (default: each case's resources.time_min)")
    p.add_argument("--cold-start", action="store_true",
                   help="start every rank process afresh instead of forking it from a warm process "
                        "that imported torch and the workload once (slower; the records are the "
                        "same: docs/design.md)")
    p.add_argument("--gpu-jobs", type=int, default=None, metavar="N",
                   help="at most N arms at once on the GPUs (1: one after another); default: as "
                        "many as the GPU's memory holds by their predicted peaks (plan --memory), "
                        "up to 8; an arm whose judged step time or whole-device memory a "
                        "neighbour would move runs alone (placement.json records where each arm "
                        "ran); on a machine without GPUs, arms side by side within the CPU "
                        "cores (a rank a core; --gpu-jobs 1: one after another)")
    add_allow_skip_argument(p)
    add_history_arguments(p)
    add_label_argument(p)
    p.set_defaults(func=run)


def default_out_dir(root: Path, now: datetime) -> Path:
    """``root/<UTC timestamp>``, suffixed ``-2``, ``-3`` ... when that folder exists."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    candidate = root / stamp
    n = 2
    while candidate.exists():
        candidate = root / f"{stamp}-{n}"
        n += 1
    return candidate


def check_latest(root: Path) -> None:
    """ConfigError when ``root/latest`` exists and is not a symlink (it could not be re-pointed)."""
    link = root / LATEST
    if link.exists() and not link.is_symlink():
        raise ConfigError(f"{link} exists and is not a symlink; move it away so `latest` can be set")


def point_latest(root: Path, target: Path) -> Path:
    """Make ``root/latest`` a symlink to ``target`` (replaced atomically): relative for a sweep
    inside ``root`` (the tree can move), absolute for one elsewhere (``run --out /scratch/x``)."""
    check_latest(root)
    root.mkdir(parents=True, exist_ok=True)
    link = root / LATEST
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    sweep, where = target.resolve(), root.resolve()
    tmp.symlink_to(os.path.relpath(sweep, where) if sweep.is_relative_to(where) else sweep)
    os.replace(tmp, link)
    return link


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM (``timeout``, ``scancel``, ``kill``) raises KeyboardInterrupt, so it
    takes Ctrl-C's path: the launcher stops its rank process groups (their own sessions, which a
    signal to the harness does not reach), the sweep stays resumable, and ``main`` says
    ``interrupted`` and exits 130. A further SIGTERM while that cleanup runs is ignored (SIGKILL
    still ends it). The previous handler is restored on the way out. Only the main thread can
    install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    with sigterm_as_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.timeout_min is not None and not args.timeout_min > 0:
        raise ConfigError(f"--timeout-min must be a positive number of minutes, got {args.timeout_min}")
    if args.gpu_jobs is not None and args.gpu_jobs < 1:
        raise ConfigError(f"--gpu-jobs must be at least 1 (1: one arm after another), got {args.gpu_jobs}")
    allowed = allowed_skips(args)
    gpus = cuda_device_count()  # without torch on a machine without GPUs
    with LocalLauncher(timeout_min=args.timeout_min, warm=not args.cold_start) as launcher:
        return _plan_and_run(args, allowed, gpus, launcher)


def _plan_and_run(args: argparse.Namespace, allowed: tuple[str, ...], gpus: int,
                  launcher: LocalLauncher) -> int:
    # LocalLauncher, no GPU: the CPU ranks' warm server imports beside the preflight's packing
    prewarm_cpu = getattr(launcher, "prewarm_cpu", lambda plans: 0)
    # each case planned once, its steps packed (an arm or a step it cannot have: a CaseError)
    plans = selected_plans(args.paths, k=args.k, tags=args.tags, emulate_ranks=args.emulate_ranks,
                           planned=prewarm_cpu)
    plans, notes = emulated_on_too_few_gpus(plans, gpus)
    for note in notes:
        print(note)
    cases = [p.case for p in plans]
    now = datetime.now(timezone.utc)
    out: Path = args.out if args.out is not None else default_out_dir(RESULTS_ROOT, now)
    args.out = out  # the sweep's folder from here on: a dcp-harness bug's traceback goes there
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder")
    check_resumable(cases, out)
    if not args.no_latest:
        check_latest(RESULTS_ROOT)

    gpu = gpu_setting(args.gpu_jobs, gpus) if gpus else None
    if gpu is not None:
        print(f"GPU arms: {gpu.note}; an arm whose judged step time or whole-device memory a "
              "neighbour would move runs alone")
    start = sweep_start("run", cases, gpus, paths=args.paths, k=args.k,
                        tags=args.tags, emulate_ranks=args.emulate_ranks, label=args.label)
    result = run_sweep(plans, out, launcher,
                       progress=make_progress(sys.stderr, plans, RESULTS_ROOT / LATEST),
                       start=start, allowed_skips=allowed,
                       beside=lambda plan: runs_beside_gpu_arms(plan, gpus),
                       sinks=sweep_sinks(args), gpu=gpu, gpus=gpus,
                       cores=1 if gpus or args.gpu_jobs == 1 else cpu_cores())
    if not args.no_latest:
        point_latest(RESULTS_ROOT, out)
    files = result.reports  # the sweep's reports, from the verdicts it judged once
    show_table(files)
    shown = "summary.md, junit.xml, index.json, index.html" + (", plots/" if files.plots else "")
    print(f"results: {out}  ({shown})")
    for note in files.notes:
        print(note)
    verdict = gate_result(result.sweep)  # the same verdicts: nothing is judged twice
    print(verdict.message)
    return verdict.code
