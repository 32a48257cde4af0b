"""Asking Slurm: squeue/sacct parsing and merging, polling with backoff and a cache of final
states (``harness.launch.slurm.poll``), against a scripted scheduler (no Slurm)."""

from __future__ import annotations

from harness.launch.slurm.poll import (
    Backoff,
    SchedState,
    SchedulerPoller,
    parse_sacct,
    parse_squeue,
    query_scheduler,
)

from tests.launch.slurm_fakes import Scheduler


def test_parse_squeue_expands_array_ranges():
    out = parse_squeue("12_[2-3,5%2]|PENDING|JobArrayTaskLimit\n12_0|RUNNING|None\n"
                       "13|COMPLETED|None\n")
    assert {k: v.state for k, v in out.items()} == {
        "12_2": "PENDING", "12_3": "PENDING", "12_5": "PENDING", "12_0": "RUNNING",
        "13": "COMPLETED"}
    assert out["12_2"].reason == "JobArrayTaskLimit" and out["12_0"].active
    assert not out["13"].active


def test_parse_sacct_skips_steps_and_reads_cancelled_by():
    out = parse_sacct("7|CANCELLED by 0|0:15\n7.batch|CANCELLED|0:15\n8_1|NODE_FAIL|0:0\n")
    assert set(out) == {"7", "8_1"}
    assert (out["7"].state, out["7"].exit_code, out["7"].source) == ("CANCELLED", "0:15", "sacct")


def test_query_without_accounting_uses_squeue_only():
    sched = Scheduler(squeue="5|RUNNING|None\n")
    view = query_scheduler(["5", "6"], sched)
    assert view.squeue_ok and not view.accounting
    assert view.get("5").state == "RUNNING" and view.get("6") is None


def test_query_merges_exit_code_from_sacct():
    sched = Scheduler(squeue="5|FAILED|NonZeroExitCode\n", sacct="5|FAILED|1:0\n9|TIMEOUT|0:0\n")
    view = query_scheduler(["5", "9"], sched)
    assert view.accounting
    assert (view.get("5").state, view.get("5").exit_code) == ("FAILED", "1:0")
    assert view.get("9").source == "sacct"
    assert ["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode", "-j", "5,9"] in sched.calls


def test_sched_state_preempted_counts_active_only_while_queued():
    assert SchedState("1", "PREEMPTED", source="squeue").active
    assert not SchedState("1", "PREEMPTED", source="sacct").active


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
