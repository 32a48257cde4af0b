"""`dcp-harness submit | collect`: run a sweep on Slurm through submitit (``launch.slurm``), and
collect a sweep of any backend (`dcp-harness status DIR` follows it: ``status_cmd``).

    dcp-harness submit PATHS... [--profile P] [--out DIR] [--dry-run] [--wait] [--retry-infra N]
    dcp-harness collect DIR [--wait] [--retry-infra N]      then: dcp-harness gate DIR

Both are the sweep pipeline (``launch.pipeline``): ``submit`` its ``run_to_end`` on the Slurm
backend, ``collect`` its ``finish`` on the backend that runs DIR (``launch.backends``). The
verdicts, reports and gate come from the pipeline's collection: nothing is judged here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

from harness.cli.run_cmd import RESULTS_ROOT
from harness.cli.selection import add_selection_arguments, selected_plans
from harness.cli.sinks import add_history_arguments, add_label_argument, sweep_sinks
from harness.cli.skips import add_allow_skip_argument, allowed_skips
from harness.errors import ConfigError
from harness.launch.backends import backend_of
from harness.launch.case_status import CaseStatus
from harness.launch.pipeline import finish, run_to_end
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.slurm.poll import SchedulerUnavailable
from harness.launch.slurm.submit import round_folder
from harness.launch.sweep_backend import Collection, FollowOptions, Queued
from harness.launch.sweep_folder import sweep_start
from harness.report import EXIT_ERROR, gate_result, show_table

def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "submit", help="submit cases to Slurm (one job per case, arrays per resource shape)",
        description="Submit cases to Slurm through submitit: one job per case (its arms run one "
        "after another in one allocation), cases of one resource shape in one job array. "
        "--dry-run prints the plan and the sbatch scripts and touches no Slurm.")
    add_selection_arguments(p)
    p.add_argument("--profile", default=None, metavar="P",
                   help="cluster profile name (slurm/profiles/P.yaml) or YAML path; "
                        "default: each case's resources.profile")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="sweep folder on a filesystem the nodes share "
                        "(default: results/slurm-<date>-<time>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan of jobs and the sbatch scripts; submit nothing")
    _add_job_args(p, "jobs of one array running at once (default: the profile's "
                     "array_parallelism)")
    p.set_defaults(func=run_submit)

    c = subparsers.add_parser(
        "collect", help="judge the cases of a sweep that ended, write its reports (then "
                        "`dcp-harness gate DIR`)",
        description="For every case of the sweep that ended without a verdict, judge it once: "
        "for a sweep of `dcp-harness submit`, after giving the arms its Slurm job left without "
        "an outcome one (infra for node failures, cancellations, kills and NCCL timeouts; "
        "timeout; failed) and removing the checkpoints of complete arms; for a sweep of "
        "`dcp-harness run`, the cases an interrupted run left unjudged. Then write summary.md, "
        "junit.xml, index.json and index.html. Cases still queued or running are left alone. "
        "--wait waits for them (a run still writing the folder too); --retry-infra N "
        "re-submits infrastructure failures (Slurm).")
    c.add_argument("dir", type=Path, metavar="DIR",
                   help="the --out folder of `dcp-harness submit` or `dcp-harness run`")
    _add_job_args(c, "array concurrency of --retry-infra submissions")
    c.set_defaults(func=run_collect)


def _add_job_args(p: argparse.ArgumentParser, max_parallel_help: str) -> None:
    """What submit and collect share: the array concurrency, waiting for the jobs (and
    re-submitting infrastructure failures), the skips the gate accepts, the history."""
    p.add_argument("--max-parallel", type=int, default=None, metavar="N", help=max_parallel_help)
    p.add_argument("--wait", action="store_true",
                   help="wait until every job has ended, then collect (exit code: the gate's)")
    p.add_argument("--timeout-min", type=float, default=None, metavar="M",
                   help="with --wait: stop waiting after M minutes (the jobs' own time limits "
                        "come from resources.time_min and the profile)")
    p.add_argument("--retry-infra", type=int, default=0, metavar="N",
                   help="re-submit cases that ended with an infrastructure failure (node fail, "
                        "NCCL timeout, OOM kill, cancelled) up to N times; implies --wait")
    p.add_argument("--poll-s", type=float, default=5.0, metavar="S", help=argparse.SUPPRESS)
    add_allow_skip_argument(p)
    add_history_arguments(p)
    add_label_argument(p)


def check_wait_args(args: argparse.Namespace) -> None:
    """ConfigError for a --wait/--retry-infra/--timeout-min/--max-parallel value that cannot work."""
    if args.retry_infra < 0:
        raise ConfigError(f"--retry-infra must be >= 0 (re-submissions per case), got {args.retry_infra}")
    if args.timeout_min is not None:
        if not args.timeout_min > 0:
            raise ConfigError(f"--timeout-min must be a positive number of minutes, got {args.timeout_min}")
        if not (args.wait or args.retry_infra):
            raise ConfigError("--timeout-min limits --wait (how long to wait for the jobs); add --wait. "
                              "A job's own time limit is the case's resources.time_min")
    if not args.poll_s > 0:
        raise ConfigError(f"--poll-s must be positive, got {args.poll_s}")
    if args.max_parallel is not None and args.max_parallel < 1:
        raise ConfigError(f"--max-parallel must be >= 1, got {args.max_parallel}")


# --------------------------------------------------------------------------- what both print
class _Lines:
    """What ``submit`` / ``collect`` print as the pipeline goes: one line per case state change
    while waiting (CI-friendly), the jobs queued, each collection's problems and re-submissions."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def on_poll(self, statuses: list[CaseStatus]) -> None:
        for s in statuses:
            if self.last.get(s.case_id) != s.state:
                self.last[s.case_id] = s.state
                where = f" (job {s.job_id}, {s.scheduler_state})" if s.job_id else ""
                print(f"  {s.case_id}: {s.state}{where}", flush=True)

    @staticmethod
    def on_submit(queued: tuple[Queued, ...]) -> None:
        for q in queued:
            print(f"  {q.line()}", flush=True)

    def on_collect(self, collection: Collection) -> None:
        for p in collection.problems:
            print(f"warning: {p}")
        if collection.still_active:
            print(f"{len(collection.still_active)} case(s) still queued or running, not collected: "
                  f"{', '.join(collection.still_active)}")
        if collection.resubmitted and not collection.still_active:
            print(f"retrying {len(collection.resubmitted)} case(s) after infrastructure failures: "
                  + ", ".join(q.line() for q in collection.resubmitted), flush=True)
            self.last.clear()


def _options(args: argparse.Namespace, lines: _Lines) -> FollowOptions:
    return FollowOptions(allowed_skips=tuple(allowed_skips(args)), retry_infra=args.retry_infra,
                         max_parallel=args.max_parallel, poll_s=args.poll_s, on_poll=lines.on_poll)


def _waits(args: argparse.Namespace) -> bool:
    return bool(args.wait or args.retry_infra)


def _timeout_s(args: argparse.Namespace) -> Optional[float]:
    return None if args.timeout_min is None else 60 * args.timeout_min


def _gate(done: Collection, args: argparse.Namespace) -> int:
    """The exit code of a waited-for sweep: the gate's, on the collection's own sweep view."""
    if done.still_active:
        print(f"gave up waiting after {args.timeout_min} min", file=sys.stderr)
        return EXIT_ERROR
    result = gate_result(done.sweep)  # the verdicts the collection judged: nothing judged again
    print(result.message)
    return result.code


# --------------------------------------------------------------------------- submit
def _default_out() -> Path:
    return RESULTS_ROOT / time.strftime("slurm-%Y%m%d-%H%M%S")


def run_submit(args: argparse.Namespace) -> int:
    check_wait_args(args)
    # each case planned once, its steps packed (an arm or a step it cannot have: a CaseError)
    plans = selected_plans(args.paths, k=args.k, tags=args.tags, emulate_ranks=args.emulate_ranks)
    lines = _Lines()
    options = _options(args, lines)
    backend = SlurmBackend(profile=args.profile, max_parallel=options.max_parallel,
                           retry_infra=options.retry_infra, allowed_skips=options.allowed_skips,
                           poll_s=options.poll_s, on_poll=options.on_poll)
    out = args.out = (args.out or _default_out()).resolve()  # (a bug's traceback goes there)
    print(backend.describe(plans, out, scripts=args.dry_run))
    if args.dry_run:
        print(f"\ndry run: nothing submitted (sweep folder would be {out})")
        return 0
    start = sweep_start("submit", [p.case for p in plans], 0, paths=args.paths, k=args.k,
                        tags=args.tags, emulate_ranks=args.emulate_ranks, label=args.label)
    queued: list[Queued] = []

    def on_submit(jobs: tuple[Queued, ...]) -> None:
        queued.extend(jobs)
        lines.on_submit(jobs)
        if jobs:
            print(f"submitted {len(jobs)} job(s); logs in {round_folder(out, 0)}\nfollow: "
                  f"dcp-harness status {out}    then: dcp-harness collect {out} && "
                  f"dcp-harness gate {out}", flush=True)

    try:
        done = run_to_end(backend, plans, out, start, sweep_sinks(args), wait=_waits(args),
                          timeout_s=_timeout_s(args), on_submit=on_submit,
                          on_collect=lines.on_collect)
    except SchedulerUnavailable as exc:  # an infrastructure error, not the user's input
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not queued:
        print(f"submitted nothing: no case can run on the profile's nodes; reports in {out}")
    return _gate(done, args) if _waits(args) else 0


# --------------------------------------------------------------------------- collect
def run_collect(args: argparse.Namespace) -> int:
    check_wait_args(args)
    sweep = Path(args.dir).resolve()
    lines = _Lines()
    backend = backend_of(sweep, _options(args, lines))
    try:
        done = finish(backend, sweep, sweep_sinks(args), wait=_waits(args),
                      timeout_s=_timeout_s(args), on_collect=lines.on_collect)
    except SchedulerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if _waits(args):
        return _gate(done, args)
    show_table(done.sweep)
    files = done.reports
    print(f"wrote {files.summary}, {files.junit}, {files.index}\nnext: dcp-harness gate {sweep}")
    return 0
