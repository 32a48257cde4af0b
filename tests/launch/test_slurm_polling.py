"""Slurm polling with backoff and a cache of final states, an outage as an infrastructure error,
the wall time of an arm a job left unfinished, and checkpoints of complete Slurm arms removed."""

from __future__ import annotations

import os
import time

import pytest

from harness.cli import main, submit_cmd
from harness.errors import ConfigError
from harness.launch.slurm_collect import arm_wall_s, collect, outcomes_for_ended_job
from harness.launch.slurm_job import append_event
from harness.launch.slurm_poll import Backoff, SchedulerPoller, SchedulerUnavailable
from harness.launch.rank_main import CHECKPOINT_DIR
from harness.launch.slurm_wait import wait_for_sweep
from harness.results import ArmOutcome, write_outcome

from .test_slurm_track import Scheduler, steps, sweep  # noqa: F401  (sweep is a fixture)


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


def test_backoff_grows_while_nothing_changes_and_resets_on_change() -> None:
    b = Backoff(2.0, 60.0)
    waits = [b.next(changed=False) for _ in range(12)]
    assert waits[0] == 3.0 and waits == sorted(waits) and waits[-1] == 60.0
    assert b.next(changed=True) == 2.0


def test_poller_never_asks_again_about_a_job_that_ended() -> None:
    sched = Scheduler(squeue="41|COMPLETED|None\n", sacct="41|COMPLETED|0:0\n")
    poller = SchedulerPoller(sched)
    first = poller.view(["41"])
    assert first.get("41").state == "COMPLETED" and len(sched.calls) == 2
    for _ in range(5):
        assert poller.view(["41"]).get("41").exit_code == "0:0"
    assert len(sched.calls) == 2  # cached: no squeue, no sacct


def test_poller_keeps_asking_about_active_jobs_and_trusts_no_stale_accounting() -> None:
    running = Scheduler(squeue="41|RUNNING|None\n")
    poller = SchedulerPoller(running)
    poller.view(["41"])
    poller.view(["41"])
    assert [c[0] for c in running.calls] == ["squeue", "sacct"] * 2
    down = SchedulerPoller(Scheduler(squeue_rc=1, sacct="41|PREEMPTED|0:0\n"))
    down.view(["41"])
    assert down.final == {}  # squeue did not answer: the job may have been requeued since


def test_waiting_polls_with_backoff_not_every_two_seconds(sweep) -> None:  # noqa: F811
    out, case, ref = sweep
    clock = FakeClock()
    sched = EndsAt(clock, end=600.0)  # a job that runs ten minutes
    statuses = wait_for_sweep(out, poll_s=2.0, runner=sched, clock=clock, sleep=clock.sleep)
    assert statuses[0].terminal
    squeue_calls = sum(1 for c in sched.calls if c[0] == "squeue")
    assert squeue_calls < 30  # every 2 s it was 300 squeue and 300 sacct calls
    assert max(clock.sleeps) == 60.0 and clock.sleeps[0] == 2.0


def test_scheduler_outage_is_an_infrastructure_error_not_bad_input(sweep) -> None:  # noqa: F811
    out, case, ref = sweep
    clock = FakeClock()
    with pytest.raises(SchedulerUnavailable, match="squeue has not answered for 600s") as exc:
        wait_for_sweep(out, poll_s=2.0, runner=Scheduler(squeue_rc=1), clock=clock,
                       sleep=clock.sleep)
    assert not isinstance(exc.value, ConfigError)
    assert 600.0 <= clock.now < 700.0


def test_submit_wait_on_an_outage_exits_2(sweep, monkeypatch, capsys) -> None:  # noqa: F811
    out, case, ref = sweep

    def down(*args, **kwargs):
        raise SchedulerUnavailable("squeue has not answered for 600s")

    monkeypatch.setattr(submit_cmd, "wait_for_sweep", down)
    assert main(["collect", str(out), "--wait"]) == 2
    assert "error: squeue has not answered" in capsys.readouterr().err


def test_a_cancelled_arm_reports_the_time_it_ran(sweep) -> None:  # noqa: F811
    out, case, ref = sweep
    case_dir = out / "t"
    started = time.time() - 10.0
    append_event(case_dir, {"event": "arm_start", "arm": "eager", "job_id": "41", "restarts": 0,
                            "time": started})
    steps(case_dir / "eager", 2)
    outs = outcomes_for_ended_job(case_dir, ref, None)
    assert 9.0 <= outs["eager"].wall_s <= 12.0
    assert "after 0.0 s" not in outs["eager"].describe()
    assert outs["eager-repeat"].wall_s == 0.0  # never started


def test_wall_time_runs_to_the_arms_last_sign_of_life(tmp_path) -> None:
    arm = tmp_path / "eager"
    arm.mkdir()
    (arm / "log.txt").write_text("x")
    os.utime(arm / "log.txt", (1000.0, 1000.0))
    events = [{"event": "arm_start", "arm": "eager", "time": 900.0},
              {"event": "arm_start", "arm": "other", "time": 10.0},
              {"event": "arm_start", "arm": "eager", "time": 990.0}]  # a requeue: the last start
    assert arm_wall_s(arm, "eager", events) == 10.0
    assert arm_wall_s(arm, "eager", []) == 0.0


def test_collect_removes_checkpoints_of_complete_arms_only(sweep) -> None:  # noqa: F811
    out, case, ref = sweep
    case_dir = out / "t"
    for arm, n in (("eager", 3), ("eager-repeat", 2)):
        steps(case_dir / arm, n)
        (case_dir / arm / CHECKPOINT_DIR / "rank0").mkdir(parents=True)
        (case_dir / arm / CHECKPOINT_DIR / "rank0" / "step00000002.pt").write_bytes(b"x" * 64)
        write_outcome(case_dir / arm, ArmOutcome(status="ok", returncode=0))
    collect(out, runner=Scheduler(squeue="", sacct="41|COMPLETED|0:0\n"), reports=False)
    assert not (case_dir / "eager" / CHECKPOINT_DIR).exists()  # complete: like a local sweep
    assert (case_dir / "eager-repeat" / CHECKPOINT_DIR).exists()  # incomplete: kept to resume
