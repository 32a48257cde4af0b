"""Warm rank processes (``harness.launch.ranks.warm``, ``harness.launch.ranks.forkserver``).

The process-management tests run a small stand-in rank module (written per test) from a server
whose preload is light (``json``), so they test exactly the fork server and its launcher side:
the environment, output, exit codes, signals, time-outs, refusals and clean-up. The last test
trains the real workload warm and cold and compares every record.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.arms import plan_cases
from harness.launch.local.launcher import LocalLauncher
from harness.launch.ranks.processes import RankCommand, run_ranks
from harness.launch.ranks.warm import WarmProcess, WarmStarter
from harness.launch.local.backend import run_sweep
from harness.results import LOG_FILE, read_steps
from harness.spec import load_cases

PROBE = '''
import json, os, signal, sys, threading, time
from pathlib import Path
from harness.launch.ranks.rank_main import register_stack_dump, stacks_path, start_orphan_watchdog

def start_thread():  # a preload that leaves a thread running: a server must refuse it
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()

if __name__ == "__main__":
    start_orphan_watchdog()
    rank = int(os.environ["RANK"])
    arm_dir, what = Path(sys.argv[1]), sys.argv[2]
    (arm_dir / f"pid.rank{rank}").write_text(str(os.getpid()))
    report = {"ppid": os.getppid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "rank": rank,
              "port": os.environ["MASTER_PORT"], "preloaded": "json" in sys.modules,
              "stdin": os.path.realpath(f"/proc/self/fd/0"), "sid": os.getsid(0) == os.getpid(),
              "launcher_pid": os.environ.get("DCP_HARNESS_LAUNCHER_PID")}
    (arm_dir / f"report.rank{rank}.json").write_text(json.dumps(report))
    stacks = register_stack_dump(stacks_path(arm_dir, rank))
    print(f"up {rank}", flush=True)
    print(f"to stderr {rank}", file=sys.stderr, flush=True)
    if what == "exit3" and rank == 1:
        sys.exit(3)
    if what == "sigterm" and rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    if what == "raise" and rank == 0:
        raise RuntimeError("boom from the probe")
    if what == "sleep":
        time.sleep(600)
'''


@pytest.fixture
def probe(tmp_path: Path):
    """(starter with a light preload, RankCommand maker) for the module above."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "warm_rank_probe.py").write_text(textwrap.dedent(PROBE))
    starter = WarmStarter(preload="json", modules=("warm_rank_probe",))
    repo = Path(__file__).resolve().parents[3]

    def cmd(what: str, world: int = 2, timeout_s: float = 30.0, name: str = "arm") -> RankCommand:
        arm_dir = tmp_path / name
        arm_dir.mkdir(exist_ok=True)
        return RankCommand(argv=(sys.executable, "-u", "-m", "warm_rank_probe", str(arm_dir), what),
                           world_size=world, arm_dir=arm_dir, timeout_s=timeout_s,
                           env={"PYTHONPATH": f"{mods}{os.pathsep}{repo}"}, repro="echo repro")

    yield starter, cmd
    starter.close()


def _report(arm_dir: Path, rank: int) -> dict:
    return json.loads((arm_dir / f"report.rank{rank}.json").read_text())


def _server_pids(starter: WarmStarter) -> list[int]:
    return [slot.server.proc.pid for slot in starter._slots.values() if slot.server is not None]


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        status = Path(f"/proc/{pid}/status")
        if status.exists() and "\nState:\tZ" in status.read_text():
            return True
        time.sleep(0.05)
    return False


def _fork_problem_in_a_fresh_process(code: str) -> str:
    import subprocess

    out = subprocess.run([sys.executable, "-c", code + "; from harness.launch.ranks.forkserver import "
                          "fork_problem; print(fork_problem())"], capture_output=True, text=True,
                         check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    return out.stdout.strip()


def test_the_server_of_this_machine_is_safe_to_fork_after_the_real_preload():
    assert _fork_problem_in_a_fresh_process(
        "from harness.launch.ranks import rank_main; rank_main.preload()") == "None"


def test_a_preload_that_leaves_a_thread_is_refused_and_one_that_ends_it_is_not():
    start = "import threading, time; t = threading.Thread(target=time.sleep, args=(30,)); t.start()"
    assert "thread" in _fork_problem_in_a_fresh_process(start + "; t.daemon")
    assert _fork_problem_in_a_fresh_process(
        "import threading; t = threading.Thread(target=int); t.start(); t.join()") == "None"
    # an OpenMP pool (torch's intra-op threads) survives a fork: refused
    assert "thread" in _fork_problem_in_a_fresh_process(
        "import torch; torch.set_num_threads(2); (torch.randn(256, 256) @ torch.randn(256, 256))")


def test_warm_ranks_are_forked_by_one_server_with_their_own_environment(probe):
    starter, cmd = probe
    first = cmd("ok")
    outcome = run_ranks(first, starter=starter)
    assert outcome.ok, outcome.log_tail
    second = cmd("ok", name="arm2")
    assert run_ranks(second, starter=starter).ok
    servers = _server_pids(starter)
    assert len(servers) == 1  # both arms, all four ranks: one server
    for arm in (first, second):
        reports = [_report(arm.arm_dir, k) for k in (0, 1)]
        assert [r["rank"] for r in reports] == [0, 1]
        assert all(r["ppid"] == servers[0] and r["preloaded"] and r["sid"] for r in reports)
        assert all(r["launcher_pid"] == str(servers[0]) for r in reports)  # the watchdog's parent
        assert all(r["stdin"] == "/dev/null" and r["cwd"] == os.getcwd() for r in reports)
        assert all(r["argv"] == [str(arm.arm_dir), "ok"] for r in reports)
        assert reports[0]["port"] == reports[1]["port"]
        log = (arm.arm_dir / LOG_FILE).read_text()
        for k in (0, 1):
            assert f"[rank {k}] up {k}" in log and f"[rank {k}] to stderr {k}" in log


def test_exit_codes_signals_and_tracebacks_reach_the_launcher(probe):
    starter, cmd = probe
    failed = run_ranks(cmd("exit3", name="exit"), starter=starter)
    assert failed.status == "failed" and "rank 1 exited with exit code 3" in failed.detail
    killed = run_ranks(cmd("sigterm", name="sig"), starter=starter)
    assert killed.status == "failed" and "rank 0 exited with signal 15" in killed.detail
    raised = run_ranks(cmd("raise", name="raise"), starter=starter)
    assert raised.status == "failed" and "exit code 1" in raised.detail
    assert raised.cause == "RuntimeError: boom from the probe"
    assert "Traceback" in raised.log_tail


def test_a_hung_warm_rank_is_timed_out_with_its_stacks_then_killed(probe):
    starter, cmd = probe
    arm = cmd("sleep", timeout_s=4.0)
    outcome = run_ranks(arm, starter=starter, stack_wait_s=3.0, kill_grace_s=1.0)
    assert outcome.status == "timeout"
    stacks = outcome.log_tail.split("Python stacks of the ranks still running")[1]
    for k in (0, 1):  # each forked rank answered SIGUSR1 with its own stack, in the probe's sleep
        assert f"[rank {k}]" in stacks
    assert stacks.count('warm_rank_probe.py", line') >= 2
    for k in (0, 1):
        assert _gone(int((arm.arm_dir / f"pid.rank{k}").read_text()))


def test_a_refused_server_starts_the_ranks_cold_and_the_log_says_why(probe):
    _starter, cmd = probe
    starter = WarmStarter(preload="warm_rank_probe:start_thread", modules=("warm_rank_probe",))
    try:
        arm = cmd("ok")
        assert run_ranks(arm, starter=starter).ok
        log = (arm.arm_dir / LOG_FILE).read_text()
        assert "rank 0 started cold: warm start refused: the preload left 2 OS thread(s)" in log
        assert all(_report(arm.arm_dir, k)["ppid"] == os.getpid() for k in (0, 1))
    finally:
        starter.close()


def test_other_programs_start_cold(probe):
    starter, _cmd = probe
    assert starter.start([sys.executable, "-c", "pass"], {}) == (None, None)
    assert starter.start([sys.executable, "-m", "another_module"], {}) == (None, None)
    assert starter.start([sys.executable, "-X", "dev", "-m", "warm_rank_probe"], {}) == (None, None)
    assert not starter._slots


def _sleeping_rank(starter: WarmStarter, cmd) -> tuple[WarmProcess, Path]:
    arm = cmd("sleep", world=1)
    env = arm.env_of(os.environ, 0, 12345)
    proc, why = starter.start(arm.argv_of(0), env)
    assert why is None and isinstance(proc, WarmProcess)
    pid_file = arm.arm_dir / "pid.rank0"
    deadline = time.monotonic() + 20
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, pid_file


def test_closing_the_starter_ends_its_servers_and_their_ranks(probe):
    starter, cmd = probe
    proc, pid_file = _sleeping_rank(starter, cmd)
    (server,) = [slot.server for slot in starter._slots.values()]
    starter.close()
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert _gone(int(pid_file.read_text())) and _gone(server.proc.pid)
    # It saw the hang-up and exited by itself (0), not killed by close() after its wait (-9):
    # a hang-up the server never sees costs the sweep that wait per server at its end.
    assert server.proc.returncode == 0
    assert starter.start(cmd("ok").argv_of(0), {})[1].startswith("warm start failed")


def test_a_prewarmed_server_is_the_one_its_ranks_fork_from(probe):
    starter, cmd = probe
    arm = cmd("ok", world=2)
    argv, env = arm.argv_of(0), arm.env_of(os.environ, 0, 0)
    assert starter.prewarm(argv, env) == 1
    assert starter.prewarm(argv, arm.env_of(os.environ, 1, 0)) == 0  # rank 1: the same server
    assert starter.prewarm([sys.executable, "-c", "pass"], env) == 0  # not a warm program
    (server,) = [slot.server for slot in starter._slots.values()]
    assert run_ranks(arm, starter=starter).ok
    assert [slot.server for slot in starter._slots.values()] == [server]
    assert {_report(arm.arm_dir, r)["ppid"] for r in (0, 1)} == {server.proc.pid}


def test_a_prewarmed_server_never_used_ends_with_the_starter(probe):
    starter, cmd = probe
    arm = cmd("ok")
    assert starter.prewarm(arm.argv_of(0), arm.env_of(os.environ, 0, 0)) == 1
    (server,) = [slot.server for slot in starter._slots.values()]
    starter.close()  # at once, while it may still be importing
    assert server.proc.returncode is not None and _gone(server.proc.pid)


def test_a_dead_server_ends_its_ranks_as_killed_and_leaves_no_orphan(probe):
    starter, cmd = probe
    proc, pid_file = _sleeping_rank(starter, cmd)
    os.kill(_server_pids(starter)[0], signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert _gone(int(pid_file.read_text()), within_s=5.0)  # its watchdog saw its parent go


def test_a_dropped_starter_ends_its_servers(probe):
    _starter, cmd = probe
    starter = WarmStarter(preload="json", modules=("warm_rank_probe",))
    assert run_ranks(cmd("ok"), starter=starter).ok
    server = _server_pids(starter)[0]
    del starter
    gc.collect()
    assert _gone(server)


def _without_timings(value):
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items()
                if not (isinstance(k, str) and (k.endswith("_s") or k.endswith("_at")))}
    if isinstance(value, (list, tuple)):
        return [_without_timings(v) for v in value]
    return value


def test_warm_and_cold_ranks_train_to_the_same_records(write_case, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launcher's own thread count
    case = write_case("warm-cold", train={"steps": 3, "global_batch": 12, "seq_length": 128,
                                          "max_seqlen_per_rank": 64},
                      data={"lengths": {"min": 8, "max": 128}},
                      resources={"gpus_per_node": 2}, parallel={"ep": 2, "dynamic_cp": [1, 2]},
                      compare={"dcp_vs_fixed_cp": {"fixed_cp": 2}, "reference": {}})
    plans = plan_cases(load_cases([case]))
    prewarmed = []
    prewarm = LocalLauncher.prewarm
    monkeypatch.setattr(LocalLauncher, "prewarm",
                        lambda self, *a: prewarmed.append(prewarm(self, *a)) or prewarmed[-1])
    records = {}
    for warm in (False, True):
        out = tmp_path / ("warm" if warm else "cold")
        with LocalLauncher(warm=warm) as launcher:
            result = run_sweep(plans, out, launcher)
            servers = [slot.server for slot in launcher.starter._slots.values()] if warm else []
        assert [v.status for v in result.verdicts] == ["pass"]
        # The sweep started every server its arms forked from before the first arm (one per
        # rank environment: the 2-rank arms'; the reference arm starts cold, variation.py), and
        # each one served.
        assert prewarmed[-1] == (len(servers) if warm else 0)
        assert all(server is not None and server._serving for server in servers)
        records[warm] = {arm.name: read_steps(out / "warm-cold" / arm.name)
                         for arm in plans[0].arms}
        log = (out / "warm-cold" / plans[0].arms[0].name / LOG_FILE).read_text()
        assert ("started cold" in log) is False
    assert records[True].keys() == records[False].keys()
    for arm, ranks in records[False].items():
        assert _without_timings(ranks) == _without_timings(records[True][arm]), arm
