"""`dcp-harness submit | collect`: run a sweep on Slurm through submitit (the Slurm backend of
``launch.pipeline``; `dcp-harness status DIR` follows it: ``status_cmd``).

    dcp-harness submit PATHS... [--profile P] [--out DIR] [--dry-run] [--wait] [--retry-infra N]
    dcp-harness collect DIR [--wait] [--retry-infra N]      then: dcp-harness gate DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.cli.run_cmd import RESULTS_ROOT
from harness.cli.selection import add_selection_arguments, selected_plans
from harness.cli.sinks import add_history_arguments, add_label_argument, sweep_sinks
from harness.cli.skips import add_allow_skip_argument, allowed_skips
from harness.errors import ConfigError
from harness.launch.pipeline import finish
from harness.launch.sweep_backend import Collection
from harness.launch.slurm.backend import SlurmBackend
from harness.launch.slurm.poll import SchedulerUnavailable
from harness.launch.slurm.submit import describe_plan, render_sbatch, round_folder, slurm_dir
from harness.launch.sweep_folder import sweep_start
from harness.report import EXIT_ERROR, gate, load_sweep, show_table, write_reports
from harness.trust.stored_plan import check_stored_plan

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
        "collect", help="classify ended jobs, write verdicts and reports (then `dcp-harness "
                        "gate DIR`)",
        description="For every case whose Slurm job has ended: give the arms it left without an "
        "outcome one (infra for node failures, cancellations, kills and NCCL timeouts; timeout; "
        "failed), write verdict.json, remove the checkpoints of complete arms, and write "
        "summary.md, junit.xml and index.json. Cases still queued or running are left alone. "
        "--wait waits for them; --retry-infra N re-submits infrastructure failures.")
    c.add_argument("dir", type=Path, metavar="DIR", help="the --out folder of `dcp-harness submit`")
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


# --------------------------------------------------------------------------- submit
def _default_out() -> Path:
    return RESULTS_ROOT / time.strftime("slurm-%Y%m%d-%H%M%S")


def _backend(args: argparse.Namespace, on_poll=None) -> SlurmBackend:
    return SlurmBackend(profile=getattr(args, "profile", None), max_parallel=args.max_parallel,
                        retry_infra=args.retry_infra, allowed_skips=allowed_skips(args),
                        poll_s=args.poll_s, on_poll=on_poll)


def memory_preflight(plans, profiles, profile_of) -> list[str]:
    """Each queued case's predicted peak per rank on its profile's GPUs (``harness.memplan``):
    the lines ``submit`` prints; a ConfigError with the bytes by part when a case does not fit
    (nothing is submitted). Profiles that request no GPUs are not checked."""
    from harness.memplan.fit import device_target, job_memory, rank_peaks_text, refusal

    lines, refused = [], []
    for plan in plans:
        profile = profiles[profile_of[plan.case_id]]
        if not profile.gpus:
            continue
        target = device_target(profile.gpu_memory_gib, profile.torch_version)
        cm = job_memory(plan.case, target)
        if cm is None:
            lines.append(f"  memory of {plan.case_id}: no memory plan (dynamic shapes or fp32)")
            continue
        of = (f" of {target.device_bytes / 2**20:,.0f} MiB" if target.device_bytes is not None
              else " (the profile sets no gpu_memory_gib: not checked)")
        lines.append(f"  memory of {plan.case_id}: predicted peak {rank_peaks_text(plan.case, cm)}{of}")
        why = refusal(plan.case, cm, profile.name)
        if why is not None:
            refused.append(why)
    if refused:
        raise ConfigError("refused before submission, the predicted memory does not fit: "
                          + "; ".join(refused))
    return lines


def run_submit(args: argparse.Namespace) -> int:
    check_wait_args(args)
    # each case planned once, its steps packed (an arm or a step it cannot have: a CaseError)
    plans = selected_plans(args.paths, k=args.k, tags=args.tags, emulate_ranks=args.emulate_ranks)
    cases = [p.case for p in plans]
    backend = _backend(args)
    todo = backend.plan(plans)
    out = args.out = (args.out or _default_out()).resolve()  # (a bug's traceback goes there)
    queued = [p for p in plans if p.case_id not in todo.skips]
    memory = memory_preflight(queued, todo.profiles, todo.profile_of)
    print(describe_plan(todo.groups))
    for cid, why in todo.skips.items():
        print(f"  skipped {cid}: {why}")
    for line in memory:
        print(line)
    if args.dry_run:
        folder = round_folder(out, 0)
        for g in todo.groups:
            print(f"\n# ---- sbatch script of {g.name} ({folder}) ----")
            print(render_sbatch(g, todo.profiles[g.shape.profile], folder))
        print(f"\ndry run: nothing submitted (sweep folder would be {out})")
        return 0
    gpus = max((p.gpus_per_node if p.gpus else 0 for p in todo.profiles.values()), default=0)
    backend.submit(plans, out, sweep_start("submit", cases, gpus, paths=args.paths, k=args.k,
                                           tags=args.tags, emulate_ranks=args.emulate_ranks,
                                           label=args.label))
    refs = backend.submitted
    for ref in refs:
        print(f"  {ref.case_id}: job {ref.job_id}")
    if refs:
        print(f"submitted {len(refs)} job(s); logs in {round_folder(out, refs[0].round)}\n"
              f"follow: dcp-harness status {out}    then: dcp-harness collect {out} && "
              f"dcp-harness gate {out}")
    else:
        write_reports(out, check_plan=check_stored_plan, allowed_skips=allowed_skips(args))
        print(f"submitted nothing: no case can run on the profile's nodes; reports in {out}")
    if args.wait or args.retry_infra:
        return _wait_collect_gate(out, args)
    return 0


# --------------------------------------------------------------------------- collect
def _sweep(path: Path) -> Path:
    if not (slurm_dir(path) / "jobs.json").is_file():
        raise ConfigError(f"{path} holds no submitted sweep (slurm/jobs.json); pass the --out "
                          "folder of `dcp-harness submit`")
    return path.resolve()


def _print_collect(result, out=sys.stdout) -> None:
    for p in result.problems:
        print(f"warning: {p}", file=out)
    if result.still_active:
        print(f"{len(result.still_active)} case(s) still queued or running, not collected: "
              f"{', '.join(result.still_active)}", file=out)


def _wait_collect_gate(sweep: Path, args: argparse.Namespace) -> int:
    """Wait for the jobs, collect (again after each --retry-infra round), hand the finished sweep
    to the sinks (``pipeline.finish``), then gate."""
    last: dict[str, str] = {}

    def on_poll(statuses) -> None:  # one line per case state change (CI-friendly)
        for s in statuses:
            if last.get(s.case_id) != s.state:
                last[s.case_id] = s.state
                print(f"  {s.case_id}: {s.state} (job {s.job_id}, {s.scheduler_state})", flush=True)

    backend = _backend(args, on_poll)

    def on_collect(collection: Collection) -> None:
        _print_collect(collection)
        if collection.resubmitted and not collection.still_active:
            print(f"retrying {len(collection.resubmitted)} case(s) after infrastructure failures: "
                  + ", ".join(q.line() for q in collection.resubmitted), flush=True)
            last.clear()

    try:
        done = finish(backend, sweep, sweep_sinks(args), on_collect=on_collect,
                      timeout_s=None if args.timeout_min is None else 60 * args.timeout_min)
    except SchedulerUnavailable as exc:  # an infrastructure error, not the user's input
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if done.still_active:
        print(f"gave up waiting after {args.timeout_min} min", file=sys.stderr)
        return EXIT_ERROR
    return gate(sweep, check_plan=check_stored_plan, allowed_skips=allowed_skips(args))


def run_collect(args: argparse.Namespace) -> int:
    check_wait_args(args)
    sweep = _sweep(args.dir)
    if args.wait or args.retry_infra:
        return _wait_collect_gate(sweep, args)
    _print_collect(finish(_backend(args), sweep, sweep_sinks(args), wait=False))
    show_table(load_sweep(sweep, check_stored_plan, allowed_skips=allowed_skips(args)))
    print(f"wrote {sweep / 'summary.md'}, {sweep / 'junit.xml'}, {sweep / 'index.json'}\n"
          f"next: dcp-harness gate {sweep}")
    return 0
