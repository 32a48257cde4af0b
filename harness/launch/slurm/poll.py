"""Asking Slurm about jobs: squeue/sacct queries, their parsing, a cache of final states, backoff.

``query_scheduler`` asks once: ``squeue -t all`` (works without accounting, and lists finished
jobs for MinJobAge), then ``sacct`` when accounting exists. :class:`SchedulerPoller` asks only
about jobs whose state can still change: a job that has ended keeps its state, so it is cached and
never queried again (as submitit's watcher does), and when every job has ended nothing is run at
all. :class:`Backoff` spaces polls out while nothing changes. An outage (squeue not answering) is a
:class:`SchedulerUnavailable`, an infrastructure error, not a user's mistake.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
    "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT",
})
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                            "RESV_DEL_HOLD", "SPECIAL_EXIT"})


class SchedulerUnavailable(RuntimeError):
    """The scheduler has not answered for too long (slurmctld down or unreachable): an
    infrastructure error (exit 2), not bad input."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]


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
    """One squeue call (and one sacct call for the jobs, when accounting exists)."""
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


class SchedulerPoller:
    """Repeated queries that skip jobs whose state is final (see module doc)."""

    def __init__(self, runner: Runner = run_command) -> None:
        self._runner = runner
        self._final: dict[str, SchedState] = {}

    @property
    def final(self) -> Mapping[str, SchedState]:
        """The cached states of jobs that have ended."""
        return dict(self._final)

    def view(self, job_ids: Iterable[str]) -> SchedulerView:
        ids = sorted(set(job_ids))
        open_ids = [j for j in ids if j not in self._final]
        if not open_ids:  # every job has ended: nothing to ask
            return SchedulerView({j: self._final[j] for j in ids}, squeue_ok=True, accounting=True)
        live = query_scheduler(open_ids, self._runner)
        if live.squeue_ok:  # without squeue's word a state from accounting alone may be stale
            self._final.update({j: st for j, st in live.states.items() if not st.active})
        states = {j: self._final[j] for j in ids if j in self._final}
        states.update(live.states)
        return SchedulerView(states, live.squeue_ok, live.accounting)


@dataclass
class Backoff:
    """Poll interval: ``first`` seconds, times ``factor`` after every poll that saw no change,
    at most ``most``; back to ``first`` on a change."""

    first: float
    most: float
    factor: float = 1.5

    def __post_init__(self) -> None:
        self.most = max(self.most, self.first)
        self._now = self.first

    def next(self, changed: bool) -> float:
        """The interval to wait after a poll (``changed``: it saw something new)."""
        self._now = self.first if changed else min(self.most, self._now * self.factor)
        return self._now
