"""Waiting for a submitted sweep (``harness.launch.slurm.wait``): a job that vanished ends, polls
back off, a scheduler outage is an infrastructure error, against a scripted scheduler (no Slurm)."""

from __future__ import annotations

import time

import pytest

import harness.launch.slurm.backend as backend_mod
from harness.cli import main
from harness.errors import ConfigError
from harness.launch.slurm.poll import SchedulerUnavailable, query_scheduler
from harness.launch.slurm.status import case_status
from harness.launch.slurm.submit import JobRef
from harness.launch.slurm.wait import wait_for_sweep

from tests.launch.slurm_fakes import EndsAt, FakeClock, Scheduler


def test_a_job_that_vanished_ends_instead_of_waiting_forever(sweep):
    out, case, ref = sweep
    no_accounting = Scheduler(squeue="")  # squeue answers, does not know job 41; no sacct
    statuses = wait_for_sweep(out, timeout_s=None, poll_s=0.01, runner=no_accounting)
    assert [(s.state, s.scheduler_state, s.terminal) for s in statuses] == [("error", "gone", True)]
    fresh = JobRef("t", "41", 0, "g", ref.folder, time.time())
    view = query_scheduler(["41"], no_accounting)
    assert case_status(out / "t", fresh, view).state == "pending"  # just submitted: grace
    broken = query_scheduler(["41"], Scheduler(squeue_rc=1))
    assert not case_status(out / "t", ref, broken).terminal  # squeue down: unknown, not dead
    with pytest.raises(SchedulerUnavailable, match="squeue has not answered"):
        wait_for_sweep(out, poll_s=0.01, runner=Scheduler(squeue_rc=1), scheduler_down_s=0.05)


def test_waiting_polls_with_backoff_not_every_two_seconds(sweep) -> None:
    out, case, ref = sweep
    clock = FakeClock()
    sched = EndsAt(clock, end=600.0)  # a job that runs ten minutes
    statuses = wait_for_sweep(out, poll_s=2.0, runner=sched, clock=clock, sleep=clock.sleep)
    assert statuses[0].terminal
    squeue_calls = sum(1 for c in sched.calls if c[0] == "squeue")
    assert squeue_calls < 30  # every 2 s it was 300 squeue and 300 sacct calls
    assert max(clock.sleeps) == 60.0 and clock.sleeps[0] == 2.0


def test_scheduler_outage_is_an_infrastructure_error_not_bad_input(sweep) -> None:
    out, case, ref = sweep
    clock = FakeClock()
    with pytest.raises(SchedulerUnavailable, match="squeue has not answered for 600s") as exc:
        wait_for_sweep(out, poll_s=2.0, runner=Scheduler(squeue_rc=1), clock=clock,
                       sleep=clock.sleep)
    assert not isinstance(exc.value, ConfigError)
    assert 600.0 <= clock.now < 700.0


def test_submit_wait_on_an_outage_exits_2(sweep, monkeypatch, capsys) -> None:
    out, case, ref = sweep

    def down(*args, **kwargs):
        raise SchedulerUnavailable("squeue has not answered for 600s")

    monkeypatch.setattr(backend_mod, "wait_for_sweep", down)
    assert main(["collect", str(out), "--wait"]) == 2
    assert "error: squeue has not answered" in capsys.readouterr().err
