"""Stand-ins for Slurm in the tracking tests: a scheduler answering squeue/sacct from scripted
text, a fake clock, and a sweep of one tiny case submitted as job 41 an hour ago (the ``sweep``
fixture of ``conftest.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from harness.arms import plan_case
from harness.caseplan import CasePlan
from harness.launch.slurm.poll import CommandResult
from harness.launch.slurm.submit import JobRef, record_jobs
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import StepWriter
from tests.launch.cases import REPEAT, UNIFORM, load_case_file
from tests.records import record


class Scheduler:
    """Answers squeue/sacct like Slurm would, from scripted text."""

    def __init__(self, squeue="", sacct=None, squeue_rc=0):
        self.squeue, self.sacct, self.squeue_rc = squeue, sacct, squeue_rc
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            return CommandResult(self.squeue_rc, self.squeue, "")
        if self.sacct is None:
            return CommandResult(1, "", "sacct: error: Slurm accounting storage is disabled")
        return CommandResult(0, self.sacct, "")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class EndsAt(Scheduler):
    """squeue says RUNNING until the fake clock reaches ``end``, then COMPLETED (and forgets)."""

    def __init__(self, clock: FakeClock, end: float) -> None:
        super().__init__(squeue="41|RUNNING|None\n", sacct="41|RUNNING|\n")
        self.clock, self.end = clock, end

    def __call__(self, argv):
        if self.clock.now >= self.end:
            self.squeue, self.sacct = "41|COMPLETED|None\n", "41|COMPLETED|0:0\n"
        return super().__call__(argv)


def submitted_sweep(tmp_path: Path) -> tuple[Path, CasePlan, JobRef]:
    """(sweep folder, plan, job) of case ``t`` (repeat, 3 steps) submitted an hour ago."""
    case = load_case_file(tmp_path, "t", data=UNIFORM, compare=REPEAT,
                          resources={"time_min": 5, "profile": "local"})
    out = tmp_path / "sweep"
    plan = plan_case(case)
    prepare_case_dir(plan, out)
    logs = out / "slurm" / "logs" / "round-0"
    logs.mkdir(parents=True)
    ref = JobRef("t", "41", 0, "dcp-g0", str(logs), time.time() - 3600)
    record_jobs(out, [ref], [])
    return out, plan, ref


def steps(arm_dir, n, rank=0):
    w = StepWriter(arm_dir, rank)
    for s in range(1, n + 1):
        w.append(record(s, 1.0 / s))
