"""The in-allocation side of a Slurm job, exercised without Slurm (a TaskIdentity by hand)."""

import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.launch.ranks.completion import arm_needs_run
from harness.launch.slurm.events import ArmStart, TaskStart, read_events
from harness.launch.slurm.job import (
    CaseJob,
    TaskIdentity,
    TaskLauncher,
    _TeeLines,
    arm_port,
    distributed_env,
    run_case_arms,
)
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import ArmOutcome, read_outcome, write_outcome
from tests.launch.cases import REPEAT, UNIFORM, load_case_file
from tests.launch.faults import Fault, fault_env, with_fault

REPO = Path(__file__).resolve().parents[3]


def make_case(tmp_path, time_min=5):
    case = load_case_file(tmp_path, "job", train={"steps": 2, "lr": 3.0e-3}, data=UNIFORM,
                          compare=REPEAT, resources={"time_min": time_min})
    plan = plan_case(case)
    return plan, prepare_case_dir(plan, tmp_path / "sweep")


def test_distributed_env_leaves_cuda_visible_devices_alone():
    ident = TaskIdentity("77", rank=5, local_rank=1, world_size=8, master_addr="gpu001", restarts=0)
    env = distributed_env(ident, 23456)
    assert env == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu001",
                   "MASTER_PORT": "23456"}


def test_arm_port_same_on_every_task_and_new_per_arm_and_restart():
    assert arm_port("77", "eager", 0) == arm_port("77", "eager", 0)
    ports = {arm_port("77", arm, r) for arm in ("eager", "eager-repeat") for r in (0, 1)}
    assert len(ports) == 4 and all(20000 <= p < 60000 for p in ports)
    # below Linux's ephemeral range (32768-), where outgoing connections could hold the port
    assert all(arm_port(str(job), "eager", 0) < 32768 for job in range(500))


def test_tee_prefixes_complete_lines(tmp_path, capsys):
    tee = _TeeLines(sys.stdout, tmp_path / "log.txt", "[rank 3] ")
    tee.write("a\nb")
    tee.write("c\n")
    tee.write("tail")
    tee.close()
    tee.close()  # closing twice is harmless
    assert (tmp_path / "log.txt").read_text() == "[rank 3] a\n[rank 3] bc\n[rank 3] tail\n"
    assert capsys.readouterr().out == "a\nbc\ntail"


def test_a_task_beyond_an_arms_ranks_sits_it_out_and_gets_the_outcome_task_0_wrote(tmp_path):
    plan, case_dir = make_case(tmp_path)
    arm = plan.arm("eager")  # one rank
    second = TaskLauncher(TaskIdentity("9", 1, 1, 2, "127.0.0.1", restarts=0))
    assert not second.takes_part(plan, arm)
    assert TaskLauncher(TaskIdentity("9", 0, 0, 2, "127.0.0.1", restarts=0)).takes_part(plan, arm)
    written = ArmOutcome(status="ok", returncode=0, detail="slurm job 9")
    write_outcome(case_dir / "eager", written)
    assert second.run_arm(plan, arm, case_dir / "eager", case_dir / "case.json") == written
    assert not (case_dir / "eager" / "log.txt").exists()  # nothing of its own ran


def test_case_job_pickles_and_checkpoints_itself(tmp_path):
    plan, case_dir = make_case(tmp_path)
    job = CaseJob(str(case_dir), retry_round=1)
    assert pickle.loads(pickle.dumps(job)) == job
    delayed = job.checkpoint()
    assert delayed.function == job and delayed.args == ()


def test_crashing_arm_gets_a_failed_outcome_and_ends_the_job(tmp_path, monkeypatch):
    import harness.workload

    plan, case_dir = make_case(tmp_path)
    monkeypatch.setattr(harness.workload, "train_arm", with_fault(Fault("crash", 2)), raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset-after-the-test")  # run_rank exports these; undo restores
        monkeypatch.delenv(key)
    ident = TaskIdentity("9", 0, 0, 1, "127.0.0.1", restarts=2)
    with pytest.raises(RuntimeError, match="injected fault"):
        run_case_arms(plan, case_dir, ident, retry_round=1)
    outcome = read_outcome(case_dir / "eager")
    assert outcome.status == "failed" and outcome.restarts == 3
    assert outcome.detail == "rank 0 raised RuntimeError (slurm job 9)"
    # the cause, where every reader looks: the exception line of the traceback
    assert outcome.cause == ("RuntimeError: injected fault: crash at step 2 on rank 0 "
                             "(HARNESS_TEST_FAULT)")
    assert outcome.describe().endswith("; cause: " + outcome.cause)
    assert "Traceback" in (case_dir / "eager" / "log.txt").read_text()
    assert read_outcome(case_dir / "eager-repeat") is None  # never started
    task, start = read_events(case_dir)
    assert isinstance(start, ArmStart)
    assert (start.arm, start.restarts, start.resumed_after_step) == ("eager", 3, 0)
    # where the task ran (a job of several nodes: which host each rank was on)
    assert isinstance(task, TaskStart)
    assert (task.arm, task.task, task.node, task.host) == ("eager", 0, 0, socket.gethostname())


@pytest.mark.parametrize("error, status", [
    # a peer rank vanished (node failure, OOM kill): gloo's and NCCL's words for it
    ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4242", "infra"),
    ("NCCL error: remote process exited or there was a network error", "infra"),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "failed"),  # may be a regression
])
def test_raising_rank_is_classified_and_an_infra_arm_runs_again(tmp_path, monkeypatch, error,
                                                                 status):
    import harness.launch.ranks.rank_main as rank_main

    plan, case_dir = make_case(tmp_path)

    def raising_rank(*args, **kwargs):
        raise RuntimeError(error)

    monkeypatch.setattr(rank_main, "run_rank", raising_rank)
    with pytest.raises(RuntimeError):
        run_case_arms(plan, case_dir, TaskIdentity("9", 0, 0, 1, "127.0.0.1", restarts=0))
    outcome = read_outcome(case_dir / "eager")
    assert outcome.status == status and "slurm job 9" in outcome.detail
    assert outcome.cause == f"RuntimeError: {error}"
    # a requeued job runs an infra arm again and skips a failed one
    assert arm_needs_run(plan.arm("eager"), case_dir / "eager",
                         retry_final=False) is (status == "infra")


def test_arm_past_its_limit_times_out_with_stacks(tmp_path):
    plan, case_dir = make_case(tmp_path, time_min=0.05)  # 3 s
    script = textwrap.dedent(f"""
        from harness.caseplan import read_plan
        from harness.launch.slurm.job import TaskIdentity, run_case_arms
        plan = read_plan({str(case_dir)!r})
        run_case_arms(plan, {str(case_dir)!r}, TaskIdentity("5", 0, 0, 1, "127.0.0.1", 0))
    """)
    # The task process starts as a Slurm job's does, with the fault a profile's setup would export.
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           **fault_env("hang@1", {"PYTHONPATH": str(REPO)})}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 124, proc.stderr[-2000:]
    outcome = read_outcome(case_dir / "eager")
    assert outcome.status == "timeout" and "arm limit of 3s" in outcome.detail
    assert "trigger_fault" in outcome.log_tail  # the hung frame is in the stacks


def test_a_task_beyond_an_arms_ranks_sits_it_out_until_rank_0_finishes(tmp_path):
    import threading
    import time

    from harness.launch.slurm.job import _sit_out

    arm_dir = tmp_path / "reference"
    arm_dir.mkdir()
    threading.Timer(0.3, lambda: (arm_dir / "outcome.json").write_text("{}")).start()
    start = time.monotonic()
    _sit_out(arm_dir, limit_s=10, poll_s=0.05)
    assert 0.25 < time.monotonic() - start < 5
    with pytest.raises(TimeoutError, match="did not finish"):
        _sit_out(tmp_path / "never", limit_s=0.2, poll_s=0.05)


def test_an_interrupted_arm_runs_in_two_legs_on_their_own_ports(tmp_path, monkeypatch):
    import harness.launch.ranks.rank_main as rank_main

    case = load_case_file(tmp_path, "job", train={"steps": 2, "lr": 3.0e-3}, data=UNIFORM,
                          compare={"resume": {}}, resources={"time_min": 5})
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, tmp_path / "sweep")
    calls = []

    def fake_rank(arm, arm_dir, resume=True, stop_after=None):
        import os
        calls.append((arm.name, stop_after, os.environ["MASTER_PORT"]))

    monkeypatch.setattr(rank_main, "run_rank", fake_rank)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset-after-the-test")
    run_case_arms(plan, case_dir, TaskIdentity("9", 0, 0, 1, "127.0.0.1", restarts=0))
    assert [(a, s) for a, s, _ in calls] == [("eager-resumed", 1), ("eager-resumed", None),
                                             ("eager", None)]
    assert calls[0][2] != calls[1][2]  # a fresh rendezvous for the second leg


TASK_SCRIPT = """
import sys
from harness.launch.slurm.job import TaskIdentity, run_case_arms
from harness.launch.sweep_folder import load_plan
case_dir = sys.argv[1]
print(run_case_arms(load_plan(case_dir), case_dir, TaskIdentity("9", 0, 0, 1, "127.0.0.1",
                                                                restarts=0)))
"""


def test_a_varied_arm_runs_in_a_varied_process_of_its_own_inside_the_task(tmp_path):
    """A Slurm task runs the first arm in its own process; the repeat arm in a process started as
    ``launch.ranks.variation`` varies it, so a grad norm that follows the hash seed differs."""
    from harness.results import read_steps
    from tests.launch.faults import patch_env

    plan, case_dir = make_case(tmp_path)
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           **patch_env("hash-order-grad-norm")}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    done = subprocess.run([sys.executable, "-c", TASK_SCRIPT, str(case_dir)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    first, repeat = (read_steps(case_dir / arm)[0] for arm in ("eager", "eager-repeat"))
    assert len(first) == len(repeat) == 2
    assert [s.grad_norm for s in first] != [s.grad_norm for s in repeat]
    log = (case_dir / "eager-repeat" / "log.txt").read_text()
    assert ("varied start: PYTHONHASHSEED=1, own working and temporary folders (proc/), "
            "environment reversed, cold start") in log
    assert (case_dir / "eager-repeat" / "proc" / "cwd").is_dir()
    assert "varied start" not in (case_dir / "eager" / "log.txt").read_text()


def test_a_task_without_gpus_pins_what_local_cpu_ranks_pin():
    from harness.launch.ranks.processes import CPU_RANK_SETTINGS
    from harness.launch.slurm.job import pin_cpu_task

    cpu = {"PATH": "/usr/bin"}
    pin_cpu_task(cpu)
    assert cpu == {"PATH": "/usr/bin", **CPU_RANK_SETTINGS}
    own = {"OMP_NUM_THREADS": "4"}  # the job's own setting stays
    pin_cpu_task(own)
    assert own["OMP_NUM_THREADS"] == "4" and own["MKL_CBWR"] == CPU_RANK_SETTINGS["MKL_CBWR"]
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE"):  # a task given GPUs: untouched
        gpu = {var: "0"}
        pin_cpu_task(gpu)
        assert gpu == {var: "0"}
