"""Waiting for a submitted sweep: poll its status with backoff until every case has ended.

The poll interval starts at ``poll_s`` and grows (x1.5, at most ``max_poll_s``) while nothing
changes; jobs that have ended are not asked about again (``SchedulerPoller``). When squeue has not
answered for ``scheduler_down_s`` seconds the wait ends with
:class:`~harness.launch.slurm.poll.SchedulerUnavailable`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from harness.launch.slurm.poll import Backoff, Runner, SchedulerPoller, SchedulerUnavailable, \
    run_command
from harness.launch.slurm.status import CaseStatus, sweep_status


def wait_for_sweep(sweep_dir: Path, timeout_s: Optional[float] = None, poll_s: float = 2.0,
                   runner: Runner = run_command,
                   on_poll: Optional[Callable[[list[CaseStatus]], None]] = None,
                   scheduler_down_s: float = 600.0, max_poll_s: float = 60.0,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[CaseStatus]:
    """Poll until every case is terminal (or ``timeout_s`` passes); returns the last status."""
    deadline = None if timeout_s is None else clock() + timeout_s
    poller = SchedulerPoller(runner)
    backoff = Backoff(poll_s, max_poll_s)
    down_since: Optional[float] = None
    seen: Optional[list[tuple[str, str, str, int]]] = None
    while True:
        statuses = sweep_status(sweep_dir, poller=poller)
        if on_poll is not None:
            on_poll(statuses)
        if all(s.terminal for s in statuses):
            return statuses
        now = clock()
        if any(s.scheduler_state == "unknown" for s in statuses if not s.terminal):
            down_since = now if down_since is None else down_since
            if now - down_since >= scheduler_down_s:
                raise SchedulerUnavailable(
                    f"squeue has not answered for {scheduler_down_s:.0f}s; is slurmctld "
                    f"reachable from here? (`scontrol ping`). The jobs may still be running: "
                    f"`dcp-harness status {sweep_dir}` once it answers again")
        else:
            down_since = None
        if deadline is not None and now >= deadline:
            return statuses
        state = [(s.case_id, s.state, s.arm, s.step) for s in statuses]
        wait = backoff.next(changed=state != seen)
        seen = state
        sleep(wait if deadline is None else max(0.0, min(wait, deadline - now)))
