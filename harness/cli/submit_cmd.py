"""`dcp-harness submit | status | collect`: run a sweep on Slurm through submitit.

    dcp-harness submit PATHS... [--profile P] [--out DIR] [--dry-run] [--wait] [--retry-infra N]
    dcp-harness status DIR [--watch S]
    dcp-harness collect DIR [--wait] [--retry-infra N]      then: dcp-harness gate DIR
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from harness.caseplan import CasePlan
from harness.cli.run_cmd import RESULTS_ROOT
from harness.cli.selection import add_emulate_argument, selected_plans
from harness.cli.skips import add_allow_skip_argument, allowed_skips
from harness.errors import ConfigError
from harness.launch.ranks.placement import profile_skip_reason
from harness.launch.slurm.collect import collect
from harness.launch.slurm.poll import SchedulerPoller, SchedulerUnavailable
from harness.launch.slurm.profiles import find_profile, load_profile
from harness.launch.slurm.retry import retry_infra
from harness.launch.slurm.status import counts, sweep_status
from harness.launch.slurm.submit import (describe_plan, plan_jobs, record_skipped, render_sbatch,
                                         round_folder, slurm_dir, submit_groups)
from harness.launch.slurm.wait import wait_for_sweep
from harness.launch.sweep import (
    check_resumable,
    finalize_case,
    prepare_case_dir,
    record_manifest,
    sweep_start,
)
from harness.report import EXIT_ERROR, console_table, gate, load_sweep, make_console, write_reports
from harness.results import MANIFEST_FILE, ArmOutcome, write_outcome
from harness.trust.stored_plan import check_stored_plan

_STATE_STYLE = {"pending": "yellow", "running": "cyan", "done": "green", "failed": "red",
                "error": "magenta", "skipped": "dim"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "submit", help="submit cases to Slurm (one job per case, arrays per resource shape)",
        description="Submit cases to Slurm through submitit: one job per case (its arms run one "
        "after another in one allocation), cases of one resource shape in one job array. "
        "--dry-run prints the plan and the sbatch scripts and touches no Slurm.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="case file or folder of case files")
    p.add_argument("--profile", default=None, metavar="P",
                   help="cluster profile name (slurm/profiles/P.yaml) or YAML path; "
                        "default: each case's resources.profile")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="sweep folder on a filesystem the nodes share "
                        "(default: results/slurm-<date>-<time>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan of jobs and the sbatch scripts; submit nothing")
    p.add_argument("-k", dest="k", default=None, metavar="EXPR", help="select case ids (pytest -k style)")
    p.add_argument("--tags", nargs="+", default=None, metavar="TAG", help="keep cases with any of these tags")
    add_emulate_argument(p)
    p.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="jobs of one array running at once (default: the profile's array_parallelism)")
    _add_wait_args(p)
    add_allow_skip_argument(p)
    p.set_defaults(func=run_submit)

    s = subparsers.add_parser(
        "status", help="table of a submitted sweep: pending / running / done / failed / error, "
                       "with a progress bar",
        description="Show where every case of a submitted sweep stands (from its case folders "
        "and the scheduler: squeue, and sacct when accounting exists): pending, running (arm and "
        "step), done, failed or error, with a progress line. --watch S refreshes until every "
        "case has ended. Reads only; changes nothing.")
    s.add_argument("dir", type=Path, metavar="DIR", help="the --out folder of `dcp-harness submit`")
    s.add_argument("--watch", type=float, default=None, metavar="S",
                   help="refresh every S seconds until every case has ended")
    s.set_defaults(func=run_status)

    c = subparsers.add_parser(
        "collect", help="classify ended jobs, write verdicts and reports (then `dcp-harness "
                        "gate DIR`)",
        description="For every case whose Slurm job has ended: give the arms it left without an "
        "outcome one (infra for node failures, cancellations, kills and NCCL timeouts; timeout; "
        "failed), write verdict.json, remove the checkpoints of complete arms, and write "
        "summary.md, junit.xml and index.json. Cases still queued or running are left alone. "
        "--wait waits for them; --retry-infra N re-submits infrastructure failures.")
    c.add_argument("dir", type=Path, metavar="DIR", help="the --out folder of `dcp-harness submit`")
    c.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="array concurrency of --retry-infra submissions")
    _add_wait_args(c)
    add_allow_skip_argument(c)
    c.set_defaults(func=run_collect)


def _add_wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true",
                   help="wait until every job has ended, then collect (exit code: the gate's)")
    p.add_argument("--timeout-min", type=float, default=None, metavar="M",
                   help="with --wait: stop waiting after M minutes (the jobs' own time limits "
                        "come from resources.time_min and the profile)")
    p.add_argument("--retry-infra", type=int, default=0, metavar="N",
                   help="re-submit cases that ended with an infrastructure failure (node fail, "
                        "NCCL timeout, OOM kill, cancelled) up to N times; implies --wait")
    p.add_argument("--poll-s", type=float, default=5.0, metavar="S", help=argparse.SUPPRESS)


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


def _load_profiles(cases, override: Optional[str]):
    names = sorted({override} if override else {c.resources.profile for c in cases})
    profiles, files = {}, {}
    for name in names:
        profile = load_profile(name)
        profiles[profile.name] = profile
        files[profile.name] = str(find_profile(name).resolve())
    only = next(iter(profiles)) if override else None
    profile_of = {c.id: only or c.resources.profile for c in cases}
    return profiles, files, profile_of


def submit_skip_reasons(plans, profiles, profile_of) -> dict[str, str]:
    """Case id -> why the profile's nodes cannot run it (``placement.profile_skip_reason``): not
    queued, every arm ``skipped`` with that reason, as a local run on such a machine does."""
    out = {}
    for plan in plans:
        profile = profiles[profile_of[plan.case_id]]
        why = profile_skip_reason(plan, profile.name, profile.gpus_per_node if profile.gpus else 0)
        if why is not None:
            out[plan.case_id] = why
    return out


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


def _skip_at_submit(plan: CasePlan, reason: str, out: Path) -> None:
    """Every arm of a case the profile cannot run gets a ``skipped`` outcome and the case its
    verdict, now (no job is queued for it)."""
    case_dir = out / plan.case_id
    for arm in plan.arms:
        (case_dir / arm.name).mkdir(parents=True, exist_ok=True)
        write_outcome(case_dir / arm.name, ArmOutcome(status="skipped", detail=reason))
    finalize_case(case_dir)


def _created_paths(out: Path, plans) -> list[Path]:
    """What a submission into ``out`` creates: the folder itself when it is new, else the case
    folders and the manifest it adds (removed again when sbatch refuses the first job)."""
    if not out.exists():
        return [out]
    made = [out / p.case_id for p in plans] + [out / MANIFEST_FILE, slurm_dir(out)]
    return [path for path in made if not path.exists()]


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def run_submit(args: argparse.Namespace) -> int:
    check_wait_args(args)
    # each case planned once, its steps packed (an arm or a step it cannot have: a CaseError)
    plans = selected_plans(args.paths, k=args.k, tags=args.tags, emulate_ranks=args.emulate_ranks)
    cases = [p.case for p in plans]
    profiles, files, profile_of = _load_profiles(cases, args.profile)
    skips = submit_skip_reasons(plans, profiles, profile_of)
    queued = [p for p in plans if p.case_id not in skips]
    groups = plan_jobs([p.case for p in queued], {p.case_id: len(p.arms) for p in queued},
                       profiles, profile_of, args.max_parallel)
    out = (args.out or _default_out()).resolve()
    memory = memory_preflight(queued, profiles, profile_of)
    print(describe_plan(groups))
    for cid, why in skips.items():
        print(f"  skipped {cid}: {why}")
    for line in memory:
        print(line)
    if args.dry_run:
        folder = round_folder(out, 0)
        for g in groups:
            print(f"\n# ---- sbatch script of {g.name} ({folder}) ----")
            print(render_sbatch(g, profiles[g.shape.profile], folder))
        print(f"\ndry run: nothing submitted (sweep folder would be {out})")
        return 0
    if groups and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run on a Slurm login node, start the dev cluster "
                          "(slurm/devcluster/start.sh), or use --dry-run")
    if (slurm_dir(out) / "jobs.json").is_file():
        raise ConfigError(f"{out} already holds a submitted sweep; follow it with `dcp-harness "
                          f"status {out}` / `dcp-harness collect {out}`, re-run its infrastructure "
                          f"failures with `dcp-harness collect {out} --retry-infra N`, or pass a "
                          "fresh --out")
    check_resumable(cases, out)
    gpus = max((p.gpus_per_node if p.gpus else 0 for p in profiles.values()), default=0)
    created = _created_paths(out, plans)
    record_manifest(plans, out, sweep_start("submit", cases, gpus, paths=args.paths, k=args.k,
                                            tags=args.tags, emulate_ranks=args.emulate_ranks))
    for plan in plans:
        prepare_case_dir(plan, out)
    if skips:
        record_skipped(out, skips)
        for plan in plans:
            if plan.case_id in skips:
                _skip_at_submit(plan, skips[plan.case_id], out)
    try:
        refs = submit_groups(groups, profiles, out, files)
    except ConfigError:
        if not (slurm_dir(out) / "jobs.json").is_file():  # nothing queued: leave nothing behind
            _remove(created)
        raise
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


# --------------------------------------------------------------------------- status
def status_renderable(statuses, sweep_dir: Path):
    table = Table(title=f"sweep {sweep_dir}", show_lines=False)
    for col in ("case", "job", "slurm", "state", "arms", "progress", "detail"):
        table.add_column(col)
    for s in statuses:
        prog = f"{s.arm} {s.step}/{s.steps}" if s.arm else ""
        table.add_row(s.case_id, s.job_id, s.slurm_state,
                      Text(s.state, style=_STATE_STYLE.get(s.state, "")),
                      f"{s.arms_done}/{s.arms_total}", prog, s.verdict or s.detail)
    return Group(table, progress_line(statuses))


def progress_line(statuses, width: int = 30) -> Text:
    """``[#######.......] 3/7 ended: 1 pending, 2 running, 3 done, 0 failed, 1 error``."""
    ended = sum(1 for s in statuses if s.terminal)
    filled = round(width * ended / len(statuses)) if statuses else width
    line = Text("[")
    line.append("#" * filled, style="green")
    line.append("." * (width - filled))
    line.append(f"] {ended}/{len(statuses)} ended: ")
    n = counts(statuses)
    line.append(", ".join(f"{v} {k}" for k, v in n.items()))
    return line


def run_status(args: argparse.Namespace) -> int:
    sweep = _sweep(args.dir)
    if args.watch is not None and not args.watch > 0:
        raise ConfigError(f"--watch must be a positive number of seconds, got {args.watch}")
    console = make_console()
    if args.watch is None:
        console.print(status_renderable(sweep_status(sweep), sweep))
        return 0
    poller = SchedulerPoller()  # ended jobs are not asked about again
    with Live(console=console, auto_refresh=False) as live:
        while True:
            statuses = sweep_status(sweep, poller=poller)
            live.update(status_renderable(statuses, sweep), refresh=True)
            if all(s.terminal for s in statuses):
                return 0
            time.sleep(max(0.5, args.watch))


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
    deadline = None if args.timeout_min is None else time.monotonic() + 60 * args.timeout_min
    last: dict[str, str] = {}

    def on_poll(statuses) -> None:  # one line per case state change (CI-friendly)
        for s in statuses:
            if last.get(s.case_id) != s.state:
                last[s.case_id] = s.state
                print(f"  {s.case_id}: {s.state} (job {s.job_id}, {s.slurm_state})", flush=True)

    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            wait_for_sweep(sweep, timeout_s=left, poll_s=args.poll_s, on_poll=on_poll)
        except SchedulerUnavailable as exc:  # an infrastructure error, not the user's input
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        result = collect(sweep, allowed_skips=allowed_skips(args))
        _print_collect(result)
        if result.still_active:
            print(f"gave up waiting after {args.timeout_min} min", file=sys.stderr)
            return EXIT_ERROR
        new = retry_infra(sweep, args.retry_infra, args.max_parallel) if args.retry_infra else []
        if not new:
            break
        print(f"retrying {len(new)} case(s) after infrastructure failures: "
              + ", ".join(f"{r.case_id} (job {r.job_id})" for r in new), flush=True)
        last.clear()
    return gate(sweep, check_plan=check_stored_plan, allowed_skips=allowed_skips(args))


def run_collect(args: argparse.Namespace) -> int:
    check_wait_args(args)
    sweep = _sweep(args.dir)
    if args.wait or args.retry_infra:
        return _wait_collect_gate(sweep, args)
    result = collect(sweep, allowed_skips=allowed_skips(args))
    _print_collect(result)
    console_table(load_sweep(sweep, check_stored_plan, allowed_skips=allowed_skips(args)),
                  make_console())
    print(f"wrote {sweep / 'summary.md'}, {sweep / 'junit.xml'}, {sweep / 'index.json'}\n"
          f"next: dcp-harness gate {sweep}")
    return 0
