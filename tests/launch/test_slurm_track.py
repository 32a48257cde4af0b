"""Status tracking, failure classification and collect, against a scripted scheduler (no Slurm)."""

import time

import pytest

from harness.launch.failures import classify_failure
from harness.launch.slurm import JobRef, latest_jobs, read_jobs, record_jobs
from harness.launch.slurm_collect import collect, outcomes_for_ended_job
from harness.launch.slurm_job import append_event, arm_needs_run
from harness.launch.slurm_poll import (
    CommandResult,
    SchedState,
    SchedulerUnavailable,
    parse_sacct,
    parse_squeue,
    query_scheduler,
)
from harness.launch.slurm_retry import infra_cases, reset_infra
from harness.launch.slurm_status import case_status
from harness.launch.slurm_wait import wait_for_sweep
from harness.arms import plan_case
from harness.launch.sweep import prepare_case_dir
from harness.results import ArmOutcome, StepWriter, read_outcome, write_outcome
from tests.records import record
from harness.spec import load_cases

CASE = """\
name: t
model: {preset: tiny, layers: 2}
train: {steps: 3, global_batch: 4, seq_length: 64, lr: 1.0e-3}
data: {lengths: {distribution: uniform, min: 8, max: 64}}
compare: {repeat: {loss: exact}}
resources: {nodes: 1, gpus_per_node: 1, time_min: 5, profile: local}
"""


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


@pytest.fixture
def sweep(tmp_path):
    (tmp_path / "t.yaml").write_text(CASE)
    (case,) = load_cases([tmp_path / "t.yaml"])
    out = tmp_path / "sweep"
    case = plan_case(case)
    prepare_case_dir(case, out)
    logs = out / "slurm" / "logs" / "round-0"
    logs.mkdir(parents=True)
    ref = JobRef("t", "41", 0, "dcp-g0", str(logs), time.time() - 3600)
    record_jobs(out, [ref], [])
    return out, case, ref


def steps(arm_dir, n, rank=0):
    w = StepWriter(arm_dir, rank)
    for s in range(1, n + 1):
        w.append(record(s, 1.0 / s))


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


@pytest.mark.parametrize("state, code, log, status, words", [
    ("NODE_FAIL", "", "", "infra", "node failure"),
    ("CANCELLED", "0:15", "", "infra", "cancelled"),
    ("OUT_OF_MEMORY", "0:125", "", "infra", "out-of-memory"),
    ("PREEMPTED", "", "", "infra", "preempted"),
    ("TIMEOUT", "0:0", "", "timeout", "time limit"),
    ("FAILED", "1:0", "[rank 1] Watchdog caught collective operation timeout: WorkNCCL", "infra",
     "NCCL timeout"),
    ("FAILED", "1:0", "slurmstepd: error: Detected 1 oom-kill event(s)", "infra", "out-of-memory"),
    ("FAILED", "0:9", "", "infra", "SIGKILL"),
    ("FAILED", "1:0", "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:5", "infra",
     "peer rank's connection dropped"),
    ("FAILED", "137:0", "srun: error: localhost: task 0: Killed", "infra", "SIGKILL"),
    ("FAILED", "1:0", "torch.OutOfMemoryError: CUDA out of memory", "failed", "without a Python"),
    ("FAILED", "139:0", "Segmentation fault", "failed", "exit code 139:0"),
    (None, "", "", "infra", "left the queue"),
])
def test_classify_failure(state, code, log, status, words):
    got = classify_failure(state, code, log)
    assert got.status == status
    assert words in got.reason


def test_running_then_cancelled_arm_is_infra_and_next_arm_not_run(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    append_event(case_dir, {"event": "arm_start", "arm": "eager", "job_id": "41", "restarts": 1})
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
    assert not arm_needs_run(case.arm("eager"), case_dir / "eager")


def test_a_job_that_vanished_ends_instead_of_waiting_forever(sweep):
    out, case, ref = sweep
    no_accounting = Scheduler(squeue="")  # squeue answers, does not know job 41; no sacct
    statuses = wait_for_sweep(out, timeout_s=None, poll_s=0.01, runner=no_accounting)
    assert [(s.state, s.slurm_state, s.terminal) for s in statuses] == [("error", "gone", True)]
    fresh = JobRef("t", "41", 0, "g", ref.folder, time.time())
    view = query_scheduler(["41"], no_accounting)
    assert case_status(out / "t", fresh, view).state == "pending"  # just submitted: grace
    broken = query_scheduler(["41"], Scheduler(squeue_rc=1))
    assert not case_status(out / "t", ref, broken).terminal  # squeue down: unknown, not dead
    with pytest.raises(SchedulerUnavailable, match="squeue has not answered"):
        wait_for_sweep(out, poll_s=0.01, runner=Scheduler(squeue_rc=1), scheduler_down_s=0.05)


def test_collect_writes_outcomes_verdict_and_reports(sweep):
    out, case, ref = sweep
    case_dir = out / "t"
    steps(case_dir / "eager", 3)
    write_outcome(case_dir / "eager", ArmOutcome(status="ok", returncode=0))
    append_event(case_dir, {"event": "arm_start", "arm": "eager-repeat", "job_id": "41",
                            "restarts": 0})
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


def test_job_record_keeps_every_round(sweep):
    out, case, ref = sweep
    record_jobs(out, [JobRef("t", "50_0", 1, "dcp-g0", ref.folder, time.time())], [])
    assert [r.job_id for r in read_jobs(out)["t"]] == ["41", "50_0"]
    assert latest_jobs(out)["t"].job_id == "50_0"


def test_sched_state_preempted_counts_active_only_while_queued():
    assert SchedState("1", "PREEMPTED", source="squeue").active
    assert not SchedState("1", "PREEMPTED", source="sacct").active
