"""A job Slurm ended for an infrastructure reason (``NODE_FAIL``; ``CANCELLED`` as its daemons
stopped: the dev cluster's stop cancels every job) while an arm ran: the rank that died by
Slurm's signal made the job record the arm ``failed``; ``collect`` records it ``infra``
(``failures.ended_with_job``), so ``--retry-infra`` runs it again; a start of a job that Slurm
requeued runs such an arm again itself (``slurm.job.killed_before_requeue``). A failure of the code under
test (an exit code, a traceback), or a signal in a job that ended on its own, stays ``failed``.
Against a scripted scheduler (``tests.launch.slurm_fakes``); no Slurm."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from harness.launch.ranks.completion import arm_needs_run
from harness.launch.ranks.failures import ended_with_job
from harness.launch.slurm.collect import collect
from harness.launch.slurm.events import ProcessEnd, append_event
from harness.launch.slurm.job import TaskIdentity, killed_before_requeue, set_aside_killed
from harness.launch.slurm.retry import infra_cases, reset_infra
from harness.results import ArmOutcome, read_outcome, write_outcome

from tests.launch.slurm_fakes import Scheduler, steps

KILLED = ArmOutcome(status="failed", returncode=-15, detail="rank 0 exited with signal 15")


@pytest.mark.parametrize("state, code, returncode, infra", [
    ("NODE_FAIL", "0:0", -15, True), ("NODE_FAIL", "", -9, True),
    ("CANCELLED", "0:15", -15, True), ("CANCELLED", "0:15", 143, True),  # through a shell
    ("PREEMPTED", "", -15, True),
    ("NODE_FAIL", "0:0", 1, False),  # the rank's own exit code: its failure stands
    ("FAILED", "1:0", -15, False), ("COMPLETED", "0:0", -15, False),  # not Slurm's ending
    ("CANCELLED", "0:15", -11, False),  # a segfault is the code's, whatever ended the job
    ("NODE_FAIL", "", None, False)])
def test_which_failures_slurm_s_ending_of_the_job_caused(state, code, returncode, infra):
    got = ended_with_job(returncode, state, code)
    assert (got is not None) == infra
    if infra:
        assert got.status == "infra" and f"Slurm state {state}" in got.reason


def test_an_arm_killed_by_a_node_failure_is_infra_and_retried(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 1)
    write_outcome(case_dir / "eager", KILLED)  # what the job wrote as its ranks died
    result = collect(out, runner=Scheduler(squeue="", sacct="41|NODE_FAIL|0:0\n"))
    assert result.finalized == ("t",), result
    eager = read_outcome(case_dir / "eager")
    assert eager.status == "infra" and eager.returncode == -15
    assert eager.detail == ("slurm job 41: node failure (Slurm state NODE_FAIL, "
                            "exit code 0:0) while the arm ran: its rank died by signal 15 as "
                            "Slurm ended the job (the job had recorded: failed, rank 0 exited "
                            "with signal 15)")
    repeat = read_outcome(case_dir / "eager-repeat")
    assert repeat.status == "infra" and repeat.detail.startswith("not run: arm 'eager' infra")
    assert json.loads((case_dir / "verdict.json").read_text())["status"] == "error"
    assert infra_cases(out) == ["t"]  # --retry-infra picks it up
    assert sorted(reset_infra(case_dir)) == ["eager", "eager-repeat"]


def test_a_verdict_the_cancelled_job_wrote_is_judged_again(sweep):
    """The job's task outlives SIGTERM (submitit bypasses it) and may judge the case with the
    killed arm failed before SIGKILL: collect judges it again with that arm infra."""
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 3)
    write_outcome(case_dir / "eager", ArmOutcome(status="ok", returncode=0))
    steps(case_dir / "eager-repeat", 1)
    write_outcome(case_dir / "eager-repeat", KILLED)
    (case_dir / "verdict.json").write_text(json.dumps({"status": "fail"}))
    result = collect(out, runner=Scheduler(squeue="", sacct="41|CANCELLED by 0|0:15\n"))
    assert result.finalized == ("t",), result
    assert read_outcome(case_dir / "eager-repeat").status == "infra"
    assert read_outcome(case_dir / "eager").ok
    assert json.loads((case_dir / "verdict.json").read_text())["status"] == "error"
    assert infra_cases(out) == ["t"]


def test_a_signal_in_a_job_that_ended_on_its_own_stays_failed(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 1)
    write_outcome(case_dir / "eager", KILLED)
    collect(out, runner=Scheduler(squeue="", sacct="41|FAILED|1:0\n"), reports=False)
    assert read_outcome(case_dir / "eager").status == "failed"
    assert reset_infra(case_dir) == ["eager-repeat"]  # only the arm it never started is retried


def test_a_requeued_job_runs_again_the_arm_its_first_start_lost_to_slurm(sweep):
    """Slurm requeues a job it ended for a node failure (the harness submits with --requeue):
    its next start finds the arm ``failed`` (the process died by Slurm's SIGTERM); that start
    runs it again, the old outcome kept as ``outcome.infra-0.json``. A retry job (another job
    id), a first start, or a failure of the code (an exit code) leaves the outcome standing."""
    out, case, ref = sweep
    case_dir = out / "t"
    eager = case.arm("eager")
    steps(case_dir / "eager", 1)
    write_outcome(case_dir / "eager", dataclasses.replace(KILLED, detail=f"{KILLED.detail} "
                                                          "(slurm job 41)"))
    append_event(case_dir, ProcessEnd(arm="eager", job_id="41", restarts=0, time=time.time(),
                                      process=0, status="failed"))  # the first start's last word
    start = TaskIdentity("41", 0, 0, 1, "127.0.0.1", restarts=1)
    assert killed_before_requeue(case_dir, eager, start, 1) == read_outcome(case_dir / "eager")
    assert killed_before_requeue(case_dir, eager, dataclasses.replace(start, restarts=0), 0) is None
    retry = dataclasses.replace(start, job_id="42")  # --retry-infra: a job of its own
    assert killed_before_requeue(case_dir, eager, retry, 1) is None
    write_outcome(case_dir / "eager", dataclasses.replace(KILLED, returncode=1))
    assert killed_before_requeue(case_dir, eager, start, 1) is None
    write_outcome(case_dir / "eager", KILLED)

    set_aside_killed(case_dir / "eager", killed_before_requeue(case_dir, eager, start, 1))
    assert read_outcome(case_dir / "eager") is None
    assert arm_needs_run(eager, case_dir / "eager", retry_final=False)
    kept = json.loads((case_dir / "eager" / "outcome.infra-0.json").read_text())
    assert kept["status"] == "infra" and kept["returncode"] == -15
    assert kept["detail"] == ("Slurm ended and requeued the job while the arm ran: rank 0 exited "
                              "with signal 15")
    assert ("Slurm requeued the job after ending it while this arm ran (its process died by "
            "signal 15: rank 0 exited with signal 15); running it again") in \
        (case_dir / "eager" / "log.txt").read_text()
