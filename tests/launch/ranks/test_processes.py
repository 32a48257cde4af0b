"""The local launcher's process management, with small stand-in rank programs.

The rank programs here are plain Python scripts (no training), so these tests exercise exactly
the launcher: spawning, log merging, failure detection, stack dumps, killing, port retries.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.launch.ranks.failures import classify_failure
from harness.launch.ranks.processes import RankCommand, device_env, rank_env, run_ranks
from harness.results import LOG_FILE

PRELUDE = """
import os, sys, time, subprocess
from pathlib import Path
from harness.launch.ranks.rank_main import register_stack_dump, stacks_path, start_orphan_watchdog
start_orphan_watchdog()
rank = int(os.environ["RANK"])
arm_dir = Path(sys.argv[1])
(arm_dir / f"pid.rank{rank}").write_text(str(os.getpid()))
stacks = register_stack_dump(stacks_path(arm_dir, rank))
print(f"up {rank} of {os.environ['WORLD_SIZE']} port {os.environ['MASTER_PORT']}", flush=True)
"""


def _cmd(tmp_path: Path, body: str, world: int = 2, timeout_s: float = 30.0) -> RankCommand:
    script = tmp_path / "rank.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    arm_dir = tmp_path / "arm"
    arm_dir.mkdir(exist_ok=True)
    return RankCommand(argv=(sys.executable, str(script), str(arm_dir)), world_size=world,
                       arm_dir=arm_dir, timeout_s=timeout_s, repro="echo repro")


def _eventually_gone(pid: int, within_s: float = 5.0) -> bool:
    """SIGKILL is delivered asynchronously: give a killed process a moment to disappear."""
    deadline = time.monotonic() + within_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" in status.read_text()  # zombie: dead, not reaped


def _pid(arm_dir: Path, name: str) -> int:
    return int((arm_dir / name).read_text())


def test_all_ranks_ok_and_logs_merged_with_rank_prefix(tmp_path):
    cmd = _cmd(tmp_path, 'print(f"hello from {rank}")\n')
    out = run_ranks(cmd)
    assert out.status == "ok" and out.returncode == 0 and out.restarts == 0
    assert out.repro == "echo repro"
    log = (cmd.arm_dir / LOG_FILE).read_text()
    assert "[rank 0] hello from 0" in log and "[rank 1] hello from 1" in log
    assert "[rank 1] up 1 of 2" in log


def test_crashing_rank_fails_arm_and_kills_siblings(tmp_path):
    cmd = _cmd(tmp_path, """
        child = subprocess.Popen(["sleep", "600"])       # a grandchild in the rank's group
        (arm_dir / f"child.rank{rank}").write_text(str(child.pid))
        if rank == 1:
            time.sleep(0.5)
            raise SystemExit("rank 1 lost its mind")
        time.sleep(600)
    """)
    started = time.monotonic()
    out = run_ranks(cmd, stack_wait_s=2.0, kill_grace_s=2.0)
    assert time.monotonic() - started < 20
    assert out.status == "failed" and out.returncode == 1
    assert "rank 1 exited with exit code 1" in out.detail
    assert "stopped rank(s) 0" in out.detail
    assert "rank 1 lost its mind" in out.log_tail
    for name in ("pid.rank0", "pid.rank1", "child.rank0", "child.rank1"):
        assert _eventually_gone(_pid(cmd.arm_dir, name)), name


def test_the_cause_is_the_first_failing_ranks_exception(tmp_path):
    cmd = _cmd(tmp_path, """
        if rank == 1:
            raise ValueError("bad microbatch\\nsecond line of the message")
        time.sleep(1.0)  # rank 0 raises later: its peer vanished
        raise RuntimeError("Connection closed by peer")
    """)
    out = run_ranks(cmd, stack_wait_s=1.0, kill_grace_s=1.0)
    assert out.status == "failed" and "rank 1 exited with exit code 1" in out.detail
    assert out.cause == "ValueError: bad microbatch"
    assert out.describe().endswith("; cause: ValueError: bad microbatch")


def test_a_rank_that_exits_without_a_traceback_has_no_cause(tmp_path):
    out = run_ranks(_cmd(tmp_path, "os._exit(3)\n"), stack_wait_s=1.0, kill_grace_s=1.0)
    assert out.status == "failed" and out.cause == "" and "cause" not in out.describe()


def test_hung_rank_times_out_with_python_stacks(tmp_path):
    cmd = _cmd(tmp_path, """
        def wait_for_peer_that_never_comes():
            time.sleep(600)
        if rank == 1:
            wait_for_peer_that_never_comes()
    """, timeout_s=3.0)
    out = run_ranks(cmd, stack_wait_s=3.0, kill_grace_s=2.0)
    assert out.status == "timeout" and out.returncode is None
    assert "rank(s) 1 still running" in out.detail
    assert "Python stacks" in out.log_tail
    assert "wait_for_peer_that_never_comes" in out.log_tail
    assert "[rank 1]" in out.log_tail
    assert _eventually_gone(_pid(cmd.arm_dir, "pid.rank1"))
    assert out.wall_s >= 3.0


@pytest.mark.parametrize("sig, status, words, slurm_code", [
    ("SIGKILL", "infra", "killed by SIGKILL", "0:9"),  # locally this was `failed`, Slurm `infra`
    ("SIGSEGV", "failed", "signal 11", "139:0"),
])
def test_rank_killed_by_a_signal_is_classified_as_under_slurm(tmp_path, sig, status, words,
                                                               slurm_code):
    cmd = _cmd(tmp_path, f"""
        import signal
        if rank == 0:
            os.kill(os.getpid(), signal.{sig})
        time.sleep(600)
    """)
    out = run_ranks(cmd, stack_wait_s=1.0, kill_grace_s=1.0)
    assert out.status == status and "rank 0 exited with signal" in out.detail
    assert words in out.detail
    assert classify_failure("FAILED", slurm_code).status == out.status  # one taxonomy


def test_sigkill_of_one_rank_names_it_and_says_the_others_were_stopped(tmp_path):
    cmd = _cmd(tmp_path, """
        import signal
        if rank == 2:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    """, world=4)
    out = run_ranks(cmd, stack_wait_s=2.0, kill_grace_s=1.0)
    assert out.status == "infra"
    # The reason belongs to the killed rank; the ranks still running were stopped afterwards.
    assert out.detail.startswith("rank 2 exited with signal 9: killed by SIGKILL")
    assert out.detail.endswith("; the launcher then stopped rank(s) 0, 1, 3, still running")
    # Their stacks were dumped (SIGUSR1) and kept; no empty stack file is left behind.
    left = sorted(p.name for p in cmd.arm_dir.glob("stacks.rank*.txt"))
    assert left == ["stacks.rank0.txt", "stacks.rank1.txt", "stacks.rank3.txt"]
    assert all(p.stat().st_size > 0 for p in cmd.arm_dir.glob("stacks.rank*.txt"))


def test_ctrl_c_of_the_launcher_leaves_no_empty_stack_files(tmp_path):
    import signal

    cmd = _cmd(tmp_path, "time.sleep(600)\n")
    # SIGINT handled as in a terminal's foreground job: a shell without job control (a CI script
    # run in the background, nohup) starts its children with SIGINT ignored, which Python keeps.
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from harness.launch.ranks.processes import RankCommand, run_ranks
        run_ranks(RankCommand(argv={cmd.argv!r}, world_size=2, arm_dir=Path({str(cmd.arm_dir)!r}),
                              timeout_s=600), kill_grace_s=2.0)
    """)], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not all((cmd.arm_dir / f"stacks.rank{k}.txt").exists() for k in (0, 1)):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)  # Ctrl-C of `dcp-harness run`
    assert launcher.wait(timeout=30) != 0
    assert not list(cmd.arm_dir.glob("stacks.rank*.txt"))  # the ranks' empty files are gone


def test_rank_whose_output_shows_an_nccl_timeout_is_infra(tmp_path):
    cmd = _cmd(tmp_path, """
        if rank == 1:
            print("[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)", flush=True)
            raise SystemExit(1)
        time.sleep(600)
    """)
    out = run_ranks(cmd, stack_wait_s=1.0, kill_grace_s=1.0)
    assert out.status == "infra" and "NCCL timeout" in out.detail


def test_port_taken_is_retried_on_a_fresh_port(tmp_path):
    # The first attempt reports EADDRINUSE (as torch's TCPStore does); the second succeeds.
    cmd = _cmd(tmp_path, """
        marker = arm_dir / "first_try_done"
        if rank == 0 and not marker.exists():
            marker.write_text("x")
            raise SystemExit("RuntimeError: ... name: EADDRINUSE, message: address already in use")
        if not marker.exists():
            time.sleep(600)
    """)
    out = run_ranks(cmd, stack_wait_s=0.5, kill_grace_s=1.0)
    assert out.status == "ok" and out.restarts == 1
    log = (cmd.arm_dir / LOG_FILE).read_text()
    assert "retrying on a fresh port" in log
    ports = {line.split("port ")[1] for line in log.splitlines() if "] up " in line}
    assert len(ports) >= 2


def test_port_retry_gives_up(tmp_path):
    cmd = _cmd(tmp_path, 'raise SystemExit("Address already in use")\n', world=1)
    out = run_ranks(cmd, port_retries=2, stack_wait_s=0.5, kill_grace_s=1.0)
    assert out.status == "failed" and out.restarts == 2


def test_ranks_stop_when_the_launcher_is_killed(tmp_path):
    cmd = _cmd(tmp_path, """
        child = subprocess.Popen(["sleep", "600"])
        (arm_dir / f"child.rank{rank}").write_text(str(child.pid))
        time.sleep(600)
    """)
    # SIGINT handled as in a terminal's foreground job: a shell without job control (a CI script
    # run in the background, nohup) starts its children with SIGINT ignored, which Python keeps.
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from harness.launch.ranks.processes import RankCommand, run_ranks
        run_ranks(RankCommand(argv={cmd.argv!r}, world_size=2, arm_dir=Path({str(cmd.arm_dir)!r}),
                              timeout_s=600))
    """)], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    names = ("pid.rank0", "pid.rank1", "child.rank0", "child.rank1")
    deadline = time.monotonic() + 30
    while not all((cmd.arm_dir / n).exists() for n in names):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    launcher.kill()  # SIGKILL: no cleanup code of the launcher runs
    launcher.wait()
    deadline = time.monotonic() + 10
    while not all(_gone(_pid(cmd.arm_dir, n)) for n in names):
        assert time.monotonic() < deadline, "ranks outlived their launcher"
        time.sleep(0.1)


def test_rank_environment(tmp_path):
    env = rank_env({"PATH": "/bin", "OMP_NUM_THREADS": "3"}, 1, 4, 29555,
                   {"CUDA_VISIBLE_DEVICES": ""})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "4", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29555")
    assert env["OMP_NUM_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PYTHONPATH"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"  # CPU ranks: idle OpenMP threads sleep
    assert "OMP_WAIT_POLICY" not in rank_env({"PATH": "/bin"}, 0, 1, 29555, {})  # CUDA ranks
    mine = rank_env({"OMP_WAIT_POLICY": "ACTIVE"}, 0, 1, 29555, {"CUDA_VISIBLE_DEVICES": ""})
    assert mine["OMP_WAIT_POLICY"] == "ACTIVE"  # a user's own setting stands


def test_device_choice():
    assert device_env(2, 4)[0] == {}
    # Every arm of a case on one kind of device: the one-rank arm of a case whose largest arm
    # has 2 ranks runs on CPU on a one-GPU machine, like the others.
    extra, why = device_env(1, 1, case_world=2)
    assert extra == {"CUDA_VISIBLE_DEVICES": ""} and "largest arm" in why
    assert device_env(1, 2, case_world=2)[0] == {}
    extra, why = device_env(2, 1)
    assert extra == {"CUDA_VISIBLE_DEVICES": ""} and "gloo" in why
    assert device_env(1, 0)[0] == {"CUDA_VISIBLE_DEVICES": ""}


def test_repro_entry_point_reports_user_mistakes_without_a_traceback(tmp_path, capsys):
    from harness.launch.local.launcher import main as local_main
    from harness.spec.schema import Case

    from harness.arms import plan_case
    from harness.launch.sweep_folder import prepare_case_dir

    out = str(tmp_path / "arm")
    assert local_main(["--case", str(tmp_path / "gone.json"), "--arm", "eager", "--out", out]) == 2
    assert "no such file; pass the case.json" in capsys.readouterr().err
    bad = tmp_path / "bad" / "case.json"
    bad.parent.mkdir()
    bad.write_text('{"name": 3}')
    assert local_main(["--case", str(bad), "--arm", "eager", "--out", out]) == 2
    assert "has no plan.json" in capsys.readouterr().err  # not a sweep's case folder
    from tests.workload.factories import make_case

    case_dir = prepare_case_dir(plan_case(make_case()), tmp_path / "sweep")
    case_json = case_dir / "case.json"
    assert Case.model_validate_json(case_json.read_text()).id == "t"
    assert local_main(["--case", str(case_json), "--arm", "graph", "--out", out]) == 2
    assert "case 't' has no arm 'graph' (its arms: eager)" in capsys.readouterr().err
    (case_dir / "plan.json").write_text("{not json")
    assert local_main(["--case", str(case_json), "--arm", "eager", "--out", out]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "arm").exists()


def test_a_stop_from_another_thread_ends_the_ranks_and_raises_keyboard_interrupt(tmp_path):
    """The CPU lane of a sweep runs in a thread Ctrl-C does not reach: the sweep sets the
    launcher's stop event, and the ranks are ended there too."""
    import dataclasses
    import threading

    cmd = _cmd(tmp_path, "time.sleep(120)\n", timeout_s=600)
    stop = threading.Event()
    cmd = dataclasses.replace(cmd, stop=stop)
    threading.Timer(2.0, stop.set).start()
    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_ranks(cmd, kill_grace_s=2.0)
    assert time.monotonic() - begun < 30
    pids = [int((cmd.arm_dir / f"pid.rank{k}").read_text()) for k in (0, 1)]
    assert all(_eventually_gone(pid) for pid in pids)


def test_ending_a_rank_whose_popen_lock_a_ctrl_c_left_held_does_not_hang():
    """A Ctrl-C that lands inside ``Popen.poll`` between its lock's acquire and its ``try`` (a
    CPython race) leaves the Popen's wait lock held; the launcher's clean-up must still end."""
    import threading

    from harness.launch.ranks.processes import _Rank, _terminate

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True)
    assert proc._waitpid_lock.acquire(False)  # the state that race leaves behind
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_terminate([_Rank(0, proc)], 0.2), done.set()),
                              daemon=True)
    worker.start()
    assert done.wait(60), "the clean-up blocked on the Popen's wait lock"
    assert _eventually_gone(proc.pid)  # killed all the same
    proc._waitpid_lock.release()
    proc.wait(timeout=10)


def test_built_in_cpu_ranks_pin_what_need_not_vary() -> None:
    from harness.launch.ranks.processes import CPU_RANK_SETTINGS, cpu_pinned

    cpu = cpu_pinned({"CUDA_VISIBLE_DEVICES": ""}, base={"OMP_NUM_THREADS": "4"})
    assert cpu["MKL_CBWR"] == CPU_RANK_SETTINGS["MKL_CBWR"] == "COMPATIBLE"
    assert "OMP_NUM_THREADS" not in cpu  # the launcher's own setting wins
    assert cpu_pinned({"CUDA_VISIBLE_DEVICES": ""}, base={})["OMP_NUM_THREADS"] == "1"
    assert cpu_pinned({}, base={}) == {}  # a CUDA rank
