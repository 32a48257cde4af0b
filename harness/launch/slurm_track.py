"""Tracking a submitted sweep: scheduler state, failure classification, status, collect, retry.

State comes from the case folders first (an arm's ``outcome.json`` is final), then from the
scheduler: ``squeue -t all`` (works without accounting, and shows finished jobs for MinJobAge),
then ``sacct`` when accounting exists. A job that neither knows any more and that left no result is
*gone*: it counts as ended (an infrastructure error), so nothing ever waits on it forever.

When a job ended without an outcome for some arm, ``classify_failure`` (``failures.py``) decides
why from the Slurm state and the logs: node failure, cancellation, preemption, host OOM kill, NCCL timeouts,
GPU faults and SIGKILL are ``infra`` (an error, never a regression; ``--retry-infra`` re-runs
them), a time limit is ``timeout``, anything else is ``failed``.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from harness.errors import ConfigError
from harness.launch.failures import classify_failure, tail_text
from harness.launch.slurm import JobRef, latest_jobs, read_jobs
from harness.launch.slurm_job import arm_needs_run, read_events, repro_line
from harness.results import LOG_FILE, OUTCOME_FILE, VERDICT_FILE, ArmOutcome, read_json, \
    read_outcome, read_steps, write_outcome

Runner = Callable[[Sequence[str]], "CommandResult"]

ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
    "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT",
})
_PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                             "RESV_DEL_HOLD", "SPECIAL_EXIT"})
_PROGRESS_ORDER = ("pending", "running", "done", "failed", "error")


# --------------------------------------------------------------------------- scheduler
@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: Sequence[str], timeout_s: float = 60.0) -> CommandResult:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as exc:
        return CommandResult(127, "", str(exc))
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]} did not answer within {timeout_s:.0f}s")
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class SchedState:
    """The scheduler's word on one job (array element): state, exit code ``code:signal``."""

    job_id: str
    state: str
    exit_code: str = ""
    reason: str = ""
    source: str = "squeue"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES or (self.state == "PREEMPTED" and self.source == "squeue")


def _expand_ids(job_field: str) -> list[str]:
    """``123``, ``123_4``, ``123_[0-3,7%2]`` -> the element ids."""
    m = re.match(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$", job_field)
    if not m:
        return [job_field]
    base, spec = m.groups()
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_squeue(text: str) -> dict[str, SchedState]:
    """Lines ``JOBID|STATE|REASON`` (``squeue -h -r -t all -o '%i|%T|%r'``)."""
    out: dict[str, SchedState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        for jid in _expand_ids(parts[0]):
            out[jid] = SchedState(jid, parts[1].split()[0].upper(),
                                  reason=parts[2] if len(parts) > 2 else "", source="squeue")
    return out


def parse_sacct(text: str) -> dict[str, SchedState]:
    """Lines ``JOBID|STATE|EXITCODE`` (``sacct -n -P -X -o JobID,State,ExitCode``)."""
    out: dict[str, SchedState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0] or "." in parts[0]:
            continue
        state = parts[1].split()[0].upper() if parts[1].strip() else "UNKNOWN"
        for jid in _expand_ids(parts[0]):
            out[jid] = SchedState(jid, state, exit_code=parts[2] if len(parts) > 2 else "",
                                  source="sacct")
    return out


@dataclass(frozen=True)
class SchedulerView:
    """What the scheduler said in one poll. ``squeue_ok``: squeue answered (so an id it does not
    list has left the queue); ``accounting``: sacct answered."""

    states: Mapping[str, SchedState]
    squeue_ok: bool
    accounting: bool

    def get(self, job_id: str) -> Optional[SchedState]:
        return self.states.get(job_id)


def query_scheduler(job_ids: Iterable[str], runner: Runner = run_command) -> SchedulerView:
    ids = sorted(set(job_ids))
    sq = runner(["squeue", "-h", "-r", "-t", "all", "--me", "-o", "%i|%T|%r"])
    states = parse_squeue(sq.stdout) if sq.returncode == 0 else {}
    masters = sorted({jid.split("_")[0] for jid in ids})
    accounting = False
    if masters:
        sa = runner(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode",
                     "-j", ",".join(masters)])
        accounting = sa.returncode == 0
        if accounting:
            for jid, st in parse_sacct(sa.stdout).items():
                live = states.get(jid)
                if live is None:
                    states[jid] = st
                elif not live.active and not live.exit_code:  # keep squeue's state, add the code
                    states[jid] = SchedState(jid, live.state, st.exit_code, live.reason, "squeue")
    return SchedulerView({k: v for k, v in states.items() if k in set(ids)},
                         squeue_ok=sq.returncode == 0, accounting=accounting)


def job_log_text(ref: JobRef, lines: int = 80) -> str:
    """Tails of the job's submitit logs (every task's stderr, then stdout)."""
    folder = Path(ref.folder)
    parts = []
    for suffix in ("err", "out"):
        for path in sorted(folder.glob(f"{ref.job_id}_*_log.{suffix}")):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(text))
    return "\n".join(parts)


# --------------------------------------------------------------------------- status
@dataclass(frozen=True)
class CaseStatus:
    """Where one case of a submitted sweep stands."""

    case_id: str
    job_id: str
    state: str  # pending | running | done | failed | error
    slurm_state: str
    arms_done: int
    arms_total: int
    terminal: bool
    arm: str = ""  # the arm in flight
    step: int = 0
    steps: int = 0
    detail: str = ""
    verdict: str = ""


def _load_case(case_dir: Path) -> Any:
    from harness.launch.sweep import load_case

    return load_case(case_dir)


def _arms(case: Any) -> list[str]:
    from harness.arms import arms_for_case

    return [a.name for a in arms_for_case(case)]


def _outcome_state(outcomes: Sequence[Optional[ArmOutcome]]) -> str:
    statuses = {o.status for o in outcomes if o is not None}
    if statuses & {"infra", "timeout"}:
        return "error"
    if "failed" in statuses:
        return "failed"
    return "done"


def case_status(case_dir: Path, ref: JobRef, view: SchedulerView, now: Optional[float] = None,
                grace_s: float = 60.0) -> CaseStatus:
    """Status of one case from its folder and the scheduler (reads files, runs nothing)."""
    now = time.time() if now is None else now
    case = _load_case(case_dir)
    arms = _arms(case)
    outcomes = [read_outcome(case_dir / a) for a in arms]
    pending_arms = [a for a in arms if arm_needs_run(case, case_dir / a)]
    sched = view.get(ref.job_id)
    slurm_state = sched.state if sched else ("gone" if view.squeue_ok else "unknown")
    base = dict(case_id=case.id, job_id=ref.job_id, slurm_state=slurm_state,
                arms_done=len(arms) - len(pending_arms), arms_total=len(arms),
                steps=case.train.steps)
    verdict_path = case_dir / VERDICT_FILE
    if verdict_path.is_file():
        verdict = str(read_json(verdict_path).get("status", "error"))
        state = {"pass": "done", "fail": "failed"}.get(verdict, "error")
        return CaseStatus(state=state, terminal=True, verdict=verdict, **base)
    if sched is not None and sched.active:
        if sched.state in _PENDING_STATES:
            return CaseStatus(state="pending", terminal=False, detail=sched.reason, **base)
        arm = pending_arms[0] if pending_arms else ""
        ranks = read_steps(case_dir / arm) if arm else {}
        step = max((len(r) for r in ranks.values()), default=0)
        return CaseStatus(state="running", terminal=False, arm=arm, step=step, **base)
    if not pending_arms:
        return CaseStatus(state=_outcome_state(outcomes), terminal=True,
                          detail="not collected yet", **base)
    if sched is None and (not view.squeue_ok or now - ref.submitted_at < grace_s):
        return CaseStatus(state="pending", terminal=False,
                          detail="the scheduler does not list the job yet", **base)
    return CaseStatus(state="error", terminal=True,
                      detail=f"job ended ({slurm_state}) before arm(s) {', '.join(pending_arms)} "
                             "finished; `collect` classifies it", **base)


def sweep_status(sweep_dir: Path, runner: Runner = run_command) -> list[CaseStatus]:
    refs = latest_jobs(sweep_dir)
    view = query_scheduler([r.job_id for r in refs.values()], runner)
    return [case_status(Path(sweep_dir) / cid, ref, view) for cid, ref in sorted(refs.items())]


def counts(statuses: Sequence[CaseStatus]) -> dict[str, int]:
    out = {k: 0 for k in _PROGRESS_ORDER}
    for s in statuses:
        out[s.state] = out.get(s.state, 0) + 1
    return out


def wait_for_sweep(sweep_dir: Path, timeout_s: Optional[float] = None, poll_s: float = 2.0,
                   runner: Runner = run_command,
                   on_poll: Optional[Callable[[list[CaseStatus]], None]] = None,
                   scheduler_down_s: float = 600.0) -> list[CaseStatus]:
    """Poll until every case is terminal (or ``timeout_s`` passes); returns the last status.
    Raises ConfigError when squeue has not answered for ``scheduler_down_s`` seconds."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    down_since: Optional[float] = None
    while True:
        statuses = sweep_status(sweep_dir, runner)
        if on_poll is not None:
            on_poll(statuses)
        if all(s.terminal for s in statuses):
            return statuses
        now = time.monotonic()
        if any(s.slurm_state == "unknown" for s in statuses if not s.terminal):
            down_since = now if down_since is None else down_since
            if now - down_since >= scheduler_down_s:
                raise ConfigError(f"squeue has not answered for {scheduler_down_s:.0f}s; is "
                                  "slurmctld reachable from here? (`scontrol ping`)")
        else:
            down_since = None
        if deadline is not None and now >= deadline:
            return statuses
        time.sleep(poll_s)


# --------------------------------------------------------------------------- collect
def _arm_started(case_dir: Path, arm: str, events: Sequence[dict]) -> bool:
    return (any(e.get("event") == "arm_start" and e.get("arm") == arm for e in events)
            or bool(read_steps(case_dir / arm)))


def outcomes_for_ended_job(case_dir: Path, ref: JobRef, sched: Optional[SchedState]
                           ) -> dict[str, ArmOutcome]:
    """Outcomes for the arms a finished job left without one: the arm in flight gets the
    classified status, arms that never started ``infra`` ("not run")."""
    case = _load_case(case_dir)
    events = read_events(case_dir)
    restarts = max((int(e.get("restarts", 0)) for e in events), default=0)
    logs = job_log_text(ref)
    state = sched.state if sched else "GONE"
    code = sched.exit_code if sched else ""
    out: dict[str, ArmOutcome] = {}
    blame = None
    for arm in _arms(case):
        arm_dir = case_dir / arm
        if not arm_needs_run(case, arm_dir):
            prior = read_outcome(arm_dir)
            if prior is not None and not prior.ok:
                blame = blame or f"arm '{arm}' {prior.status}"
            continue
        if blame is None and _arm_started(case_dir, arm, events):
            arm_log = tail_text(arm_dir / LOG_FILE, 60)
            how = classify_failure(state, code, f"{arm_log}\n{logs}")
            out[arm] = ArmOutcome(
                status=how.status, returncode=None, log_tail=f"{arm_log}\n{logs}".strip()[-12000:],
                repro=repro_line(case_dir, arm), restarts=restarts,
                detail=f"slurm job {ref.job_id} ended ({state}"
                       f"{', exit ' + code if code else ''}): {how.reason}")
            blame = f"arm '{arm}' {how.status}: {how.reason}"
        else:
            why = blame or f"slurm job {ref.job_id} ended ({state}) before it started"
            out[arm] = ArmOutcome(status="infra", repro=repro_line(case_dir, arm),
                                  restarts=restarts, detail=f"not run: {why}",
                                  log_tail=logs[-4000:])
    return out


@dataclass(frozen=True)
class CollectResult:
    statuses: tuple[CaseStatus, ...]
    finalized: tuple[str, ...]
    still_active: tuple[str, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)


def collect(sweep_dir: Path, runner: Runner = run_command, reports: bool = True) -> CollectResult:
    """Give every ended case its missing outcomes and a verdict; write the reports. Cases whose
    job is still queued or running are left alone (listed in ``still_active``)."""
    from harness.launch.sweep import finalize_case

    sweep_dir = Path(sweep_dir)
    refs = latest_jobs(sweep_dir)
    view = query_scheduler([r.job_id for r in refs.values()], runner)
    finalized, active, problems = [], [], []
    for cid, ref in sorted(refs.items()):
        case_dir = sweep_dir / cid
        status = case_status(case_dir, ref, view)
        if not status.terminal:
            active.append(cid)
            continue
        if status.verdict:
            continue
        for arm, outcome in outcomes_for_ended_job(case_dir, ref, view.get(ref.job_id)).items():
            write_outcome(case_dir / arm, outcome)
        try:
            finalize_case(case_dir)
            finalized.append(cid)
        except Exception as exc:  # unreadable results: the report counts the case as an error
            problems.append(f"{cid}: could not evaluate: {type(exc).__name__}: {exc}")
    if reports:
        from harness.report import write_reports

        write_reports(sweep_dir)
    statuses = [case_status(sweep_dir / cid, ref, view) for cid, ref in sorted(refs.items())]
    return CollectResult(tuple(statuses), tuple(finalized), tuple(active), tuple(problems))


# --------------------------------------------------------------------------- retry
def infra_cases(sweep_dir: Path) -> list[str]:
    """Cases of the sweep with an arm whose outcome is ``infra``."""
    out = []
    for cid in sorted(latest_jobs(sweep_dir)):
        case_dir = Path(sweep_dir) / cid
        case = _load_case(case_dir)
        if any((o := read_outcome(case_dir / a)) is not None and o.status == "infra"
               for a in _arms(case)):
            out.append(cid)
    return out


def attempts(sweep_dir: Path) -> dict[str, int]:
    """Case id -> how many jobs it has had."""
    return {cid: len(refs) for cid, refs in read_jobs(sweep_dir).items()}


def reset_infra(case_dir: Path) -> list[str]:
    """Move the ``infra`` outcomes of a case aside (``outcome.infra-<n>.json``) and drop its
    verdict, so a re-submitted job runs those arms again (resuming their steps)."""
    case = _load_case(case_dir)
    moved = []
    for arm in _arms(case):
        arm_dir = Path(case_dir) / arm
        outcome = read_outcome(arm_dir)
        if outcome is None or outcome.status != "infra":
            continue
        n = len(list(arm_dir.glob("outcome.infra-*.json")))
        (arm_dir / OUTCOME_FILE).rename(arm_dir / f"outcome.infra-{n}.json")
        moved.append(arm)
    (Path(case_dir) / VERDICT_FILE).unlink(missing_ok=True)
    return moved


def resubmit(sweep_dir: Path, case_ids: Sequence[str], max_parallel: Optional[int] = None
             ) -> list[JobRef]:
    """Submit ``case_ids`` of a sweep again, each on the profile it was submitted with."""
    from harness.arms import arms_for_case
    from harness.launch.profiles import load_profile
    from harness.launch.slurm import plan_jobs, submit_groups

    sweep_dir = Path(sweep_dir).resolve()
    refs = latest_jobs(sweep_dir)
    tries = attempts(sweep_dir)
    cases = {cid: _load_case(sweep_dir / cid) for cid in case_ids}
    profiles, profile_of, files = {}, {}, {}
    for cid, case in cases.items():
        source = refs[cid].profile_file or case.resources.profile
        profile = load_profile(source)
        profiles[profile.name] = profile
        profile_of[cid] = profile.name
        files[profile.name] = source
    groups = plan_jobs(list(cases.values()), {cid: len(arms_for_case(c)) for cid, c in cases.items()},
                       profiles, profile_of, max_parallel)
    return submit_groups(cases, groups, profiles, sweep_dir, files,
                         retry_rounds={cid: tries.get(cid, 0) for cid in case_ids})


def retry_infra(sweep_dir: Path, max_retries: int, max_parallel: Optional[int] = None
                ) -> list[JobRef]:
    """Re-submit the cases with ``infra`` arms that have had at most ``max_retries`` retries;
    only their infra arms run again (resuming). Returns the new jobs (none: nothing to retry)."""
    tries = attempts(sweep_dir)
    todo = [cid for cid in infra_cases(sweep_dir) if tries.get(cid, 1) - 1 < max_retries]
    for cid in todo:
        reset_infra(Path(sweep_dir) / cid)
    return resubmit(sweep_dir, todo, max_parallel) if todo else []
