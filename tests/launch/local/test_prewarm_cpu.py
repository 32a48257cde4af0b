"""The CPU ranks' warm server started before preflight packs the planned cases' steps
(``LocalLauncher.prewarm_cpu``) is the one their arms fork from, none is started where no arm
would fork from it, and a machine without a GPU's device file counts no GPU
without importing torch (``processes.cuda_device_count``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.launch.local import launcher as launcher_module
from harness.launch.local.launcher import LocalLauncher
from harness.launch.ranks.processes import gpu_device_files
from harness.spec.loader import load_cases
from tests.launch.local.key_recorder import KeyRecorder

REPO = Path(__file__).resolve().parents[3]


def _first_keys(launcher, plan, tmp_path):
    """The server key of every arm's first rank, as the sweep's own prewarm computes it."""
    return {arm.name: launcher.starter.key(cmd.env_of(os.environ, cmd.started[0], 0))
            for arm in plan.arms
            for cmd in launcher._first_commands(plan, arm, tmp_path / plan.case_id, 0)}


def _plans(*paths):
    return [plan_case(c) for c in load_cases(list(paths))]


def test_the_server_started_before_the_packing_is_the_one_every_unvaried_cpu_arm_forks_from(
        tmp_path, write_case, monkeypatch):
    monkeypatch.setattr(launcher_module, "cuda_device_count", lambda: 0)
    launcher = LocalLauncher(starter=KeyRecorder())
    plans = _plans(write_case("one", compare={"repeat": {}}),
                   write_case("two", parallel={"cp": 2}, resources={"gpus_per_node": 2}))
    assert launcher.prewarm_cpu(plans) == 1
    (early,) = launcher.starter.keys
    keys = {}
    for plan in plans:
        keys.update({(plan.case_id, a): k for a, k in _first_keys(launcher, plan, tmp_path).items()})
    unvaried = {name: k for name, k in keys.items() if name[1] != "eager-repeat"}
    assert len(unvaried) >= 2 and set(unvaried.values()) == {early}
    assert keys[("one", "eager-repeat")] != early  # a varied start has a server of its own


def test_no_server_ahead_with_gpus_without_warm_starts_or_without_an_arm_to_fork(
        write_case, monkeypatch):
    cpu = _plans(write_case("cpu"))
    monkeypatch.setattr(launcher_module, "cuda_device_count", lambda: 1)
    launcher = LocalLauncher(starter=KeyRecorder())
    assert launcher.prewarm_cpu(cpu) == 0 and launcher.starter.keys == []
    monkeypatch.setattr(launcher_module, "cuda_device_count", lambda: 0)
    assert LocalLauncher(warm=False).prewarm_cpu(cpu) == 0
    nothing_here = _plans(write_case("gpu", resources={"device": "cuda"}))  # skipped on the CPU
    assert launcher.prewarm_cpu(nothing_here) == 0 and launcher.starter.keys == []
    assert launcher.prewarm_cpu(nothing_here + cpu) == 1


@pytest.mark.parametrize("name, found", [("nvidia0", True), ("nvidiactl", True), ("kfd", True),
                                         ("dxg", True), ("null", False), (None, False)])
def test_gpu_device_files(tmp_path, name, found):
    if name is not None:
        (tmp_path / name).touch()
    assert gpu_device_files(tmp_path) is found


@pytest.mark.skipif(not sys.platform.startswith("linux") or gpu_device_files(),
                    reason="needs Linux without a GPU's device file")
def test_no_gpu_device_file_counts_no_gpu_without_importing_torch():
    code = ("import sys; from harness.launch.ranks.processes import cuda_device_count; "
            "print(cuda_device_count(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["0", "False"], out.stderr
