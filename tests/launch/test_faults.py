"""The test-only rank faults of ``tests/launch/faults.py`` (production code has none)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.faults import FAULT_EXIT_CODE, Fault, fault_env, parse_fault

REPO = Path(__file__).resolve().parents[2]


def test_parse_fault():
    assert parse_fault(None) is None
    assert parse_fault("") is None
    assert parse_fault("crash@3") == Fault("crash", 3, None)
    assert parse_fault("hang@2:1") == Fault("hang", 2, 1)
    assert parse_fault("exit@1") == Fault("exit", 1, None)
    for bad in ("boom@1", "crash@0", "crash", "crash@2:x"):
        with pytest.raises(ValueError, match="KIND@STEP"):
            parse_fault(bad)


def test_fault_applies_to_its_step_and_rank():
    fault = Fault("hang", 2, 1)
    assert fault.applies(rank=1, step=2)
    assert not fault.applies(rank=0, step=2)
    assert not fault.applies(rank=1, step=3)
    assert Fault("crash", 2).applies(rank=5, step=2)


@pytest.mark.parametrize("kind, code, text", [
    ("exit", FAULT_EXIT_CODE, "injected fault exit@2"),
    ("crash", 1, "RuntimeError: injected fault: crash at step 2 on rank 0"),
])
def test_trigger_fault_in_a_process(kind, code, text):
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.launch.faults import Fault, trigger_fault; "
         f"trigger_fault(Fault({kind!r}, 2), rank=0, step=2)"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert proc.returncode == code
    assert text in proc.stdout + proc.stderr


def test_a_process_started_with_fault_env_trains_with_the_fault():
    probe = ("import harness.workload as w; t = vars(w).get('train_arm'); "
             "print(t.__module__ if t else 'lazy', 'torch' in __import__('sys').modules)")

    def started(env):
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin", **env})
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    # installed at start-up, without importing torch; nothing without the fault variable
    faulty = fault_env("crash@2", {"PYTHONPATH": str(REPO)})
    assert started(faulty) == ["tests.launch.faults", "False"]
    assert started({"PYTHONPATH": str(REPO)}) == ["lazy", "False"]
