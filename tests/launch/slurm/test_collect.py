"""Collecting a Slurm sweep (``harness.launch.slurm.collect``): outcomes of the arms a job ended
or left unfinished (classified, with the time they ran), verdicts and reports, checkpoints of
complete arms removed; and the case's status meanwhile (``slurm.status``), against a scripted
scheduler (no Slurm)."""

from __future__ import annotations

import os
import time

from harness.launch.ranks.completion import arm_needs_run
from harness.launch.ranks.rank_main import CHECKPOINT_DIR
from harness.launch.slurm.collect import arm_wall_s, collect, outcomes_for_ended_job
from harness.launch.slurm.events import ArmStart, append_event
from harness.launch.slurm.poll import query_scheduler
from harness.launch.slurm.retry import infra_cases, reset_infra
from harness.launch.slurm.status import case_status
from harness.results import ArmOutcome, read_outcome, write_outcome

from tests.launch.slurm_fakes import Scheduler, steps


def test_running_then_cancelled_arm_is_infra_and_next_arm_not_run(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    append_event(case_dir, ArmStart(arm="eager", job_id="41", restarts=1, time=time.time()))
    steps(case_dir / "eager", 2)
    running = query_scheduler(["41"], Scheduler(squeue="41|RUNNING|None\n"))
    st = case_status(case_dir, ref, running)
    assert (st.state, st.arm, st.step, st.terminal) == ("running", "eager", 2, False)

    ended = Scheduler(squeue="41|CANCELLED|None\n", sacct="41|CANCELLED by 0|0:15\n")
    view = query_scheduler(["41"], ended)
    st = case_status(case_dir, ref, view)
    assert st.terminal and st.state == "error" and "eager, eager-repeat" in st.detail
    outs = outcomes_for_ended_job(case_dir, ref, view.get("41"))
    assert outs["eager"].status == "infra" and "cancelled" in outs["eager"].detail
    assert outs["eager"].restarts == 1
    assert outs["eager-repeat"].status == "infra"
    assert outs["eager-repeat"].detail.startswith("not run: arm 'eager' infra")


def test_arm_that_failed_in_the_job_keeps_its_outcome(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 1)
    write_outcome(case_dir / "eager", ArmOutcome(status="failed", returncode=1, detail="boom"))
    view = query_scheduler(["41"], Scheduler(squeue="41|FAILED|NonZeroExitCode\n"))
    outs = outcomes_for_ended_job(case_dir, ref, view.get("41"))
    assert set(outs) == {"eager-repeat"}
    assert outs["eager-repeat"].detail == "not run: arm 'eager' failed"
    assert not arm_needs_run(case.arm("eager"), case_dir / "eager", retry_final=False)


def test_collect_writes_outcomes_verdict_and_reports(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 3)
    write_outcome(case_dir / "eager", ArmOutcome(status="ok", returncode=0))
    append_event(case_dir, ArmStart(arm="eager-repeat", job_id="41", restarts=0, time=time.time()))
    steps(case_dir / "eager-repeat", 1)
    (out / "slurm" / "logs" / "round-0" / "41_0_log.err").write_text(
        "srun: error: localhost: task 0: Killed\n")
    result = collect(out, runner=Scheduler(squeue="", sacct="41|FAILED|0:9\n"))
    assert result.finalized == ("t",) and not result.still_active
    repeat = read_outcome(case_dir / "eager-repeat")
    assert repeat.status == "infra" and "SIGKILL" in repeat.detail
    assert "task 0: Killed" in repeat.log_tail
    assert (case_dir / "verdict.json").is_file() and (out / "junit.xml").is_file()
    assert result.statuses[0].state == "error" and result.statuses[0].verdict == "error"
    assert infra_cases(out) == ["t"]
    assert reset_infra(case_dir) == ["eager-repeat"]
    assert read_outcome(case_dir / "eager-repeat") is None
    assert (case_dir / "eager-repeat" / "outcome.infra-0.json").is_file()
    assert not (case_dir / "verdict.json").exists()
    assert read_outcome(case_dir / "eager").ok  # the finished arm is kept


def test_collect_leaves_running_cases_alone(sweep):
    out, case, ref = sweep
    result = collect(out, runner=Scheduler(squeue="41|RUNNING|None\n"), reports=False)
    assert result.still_active == ("t",) and result.finalized == ()
    assert not (out / "t" / "verdict.json").exists()


def test_a_cancelled_arm_reports_the_time_it_ran(sweep) -> None:
    out, case, ref = sweep
    case_dir = out / "t"
    started = time.time() - 10.0
    append_event(case_dir, ArmStart(arm="eager", job_id="41", restarts=0, time=started))
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
    events = [ArmStart(arm="eager", job_id="41", restarts=0, time=900.0),
              ArmStart(arm="other", job_id="41", restarts=0, time=10.0),
              ArmStart(arm="eager", job_id="41", restarts=1, time=990.0)]  # requeued: the last
    assert arm_wall_s(arm, "eager", events) == 10.0
    assert arm_wall_s(arm, "eager", []) == 0.0


def test_collect_removes_checkpoints_of_complete_arms_only(sweep) -> None:
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
