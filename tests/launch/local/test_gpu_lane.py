"""The GPU lane (``launch.local.gpu_lane``) with a launcher that runs no processes: arms side by
side where the rule lets them, a judged step time alone, ``--gpu-jobs 1`` one after another, the
placement recorded in ``placement.json`` and said in ``summary.md``, the verdicts those of a
serial run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.arms import plan_cases
from harness.errors import ConfigError
from harness.launch.local.backend import run_sweep
from harness.launch.local.gpu_demand import moved_figures
from harness.launch.local.gpu_jobs import DEVICE_USED, STEP_TIME
from harness.launch.local import launcher as launcher_module
from harness.launch.local.gpu_lane import GpuSetting, gpu_setting, lane_ranks_at_once, ranks_at_once
from harness.launch.local.launcher import LocalLauncher
from harness.results.placement import PLACEMENT_FILE, read_placement
from harness.spec import load_cases
from tests.launch.local.key_recorder import KeyRecorder
from tests.launch.local.test_lanes import TimedLauncher, overlap

GIB = 2**30
EMULATED = Path(__file__).resolve().parents[3] / "cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml"


@pytest.fixture
def cases(write_case):
    paths = [write_case("judged", compare={"repeat": {}, "golden": {}}),
             write_case("plain-a", compare={"repeat": {}}),
             write_case("plain-b", compare={"repeat": {}})]
    return plan_cases(load_cases(paths))


def packed(jobs: int, per_process: bool = True) -> GpuSetting:
    return GpuSetting(jobs, 100 * GIB, per_process, f"test: {jobs} at once")


def verdicts_of(result) -> dict:
    return {v.case_id: [(p.arms, p.status) for p in v.pairs] for v in result.verdicts}


def test_the_figures_a_neighbour_moves_come_from_the_pairs(cases):
    judged = moved_figures(cases[0])
    assert judged["eager"] == frozenset({STEP_TIME, DEVICE_USED})  # the golden pair's arm
    assert judged["eager-repeat"] == frozenset()
    assert all(not f for f in moved_figures(cases[1]).values())


def test_arms_share_the_gpu_but_a_judged_step_time_runs_alone(cases, tmp_path):
    launcher = TimedLauncher(hold_s=0.4)
    result = run_sweep(cases, tmp_path / "out", launcher, gpu=packed(4), gpus=1)
    spans = launcher.spans
    assert len(spans) == 6
    timed = [s for s in spans if (s[0], s[1]) == ("judged", "eager")]
    others = [s for s in spans if s not in timed]
    assert not any(overlap(timed[0], o) for o in others)
    assert any(overlap(a, b) for a in others for b in others if a is not b)
    placement = read_placement(tmp_path / "out")
    assert placement is not None and placement.gpu_jobs == 4 and len(placement.arms) == 6
    by = {(a.case_id, a.arm): a for a in placement.arms}
    assert "step time" in by[("judged", "eager")].alone and by[("judged", "eager")].beside == ()
    assert any(a.beside for a in placement.arms)
    assert placement.most_at_once() >= 2
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "**placement**: GPU arms placed by predicted memory: up to 4 at once" in summary
    assert all(v.status == "pass" for v in result.verdicts)


def test_gpu_jobs_1_runs_one_arm_after_another_with_the_same_verdicts(cases, tmp_path):
    serial_launcher = TimedLauncher(hold_s=0.05)
    serial = run_sweep(cases, tmp_path / "serial", serial_launcher, gpu=packed(1), gpus=1)
    spans = serial_launcher.spans
    assert not any(overlap(a, b) for a in spans for b in spans if a is not b)
    placement = read_placement(tmp_path / "serial")
    assert placement.gpu_jobs == 1 and all(a.alone and not a.beside for a in placement.arms)
    assert "one after another (--gpu-jobs 1)" in (tmp_path / "serial" / "summary.md").read_text()
    both = run_sweep(cases, tmp_path / "packed", TimedLauncher(hold_s=0.05), gpu=packed(4), gpus=1)
    assert verdicts_of(both) == verdicts_of(serial)


def test_whole_device_memory_runs_alone_without_per_process_accounting(cases, tmp_path):
    launcher = TimedLauncher(hold_s=0.2)
    run_sweep(cases, tmp_path / "out", launcher, gpu=packed(4, per_process=False), gpus=1)
    placement = json.loads((tmp_path / "out" / PLACEMENT_FILE).read_text())
    assert placement["per_process_memory"] is False
    timed = [s for s in launcher.spans if (s[0], s[1]) == ("judged", "eager")]
    assert not any(overlap(timed[0], o) for o in launcher.spans if o is not timed[0])


def test_gpu_jobs_must_be_at_least_one():
    with pytest.raises(ConfigError, match="--gpu-jobs must be at least 1"):
        gpu_setting(0, 1)


def test_no_gpu_no_packing():
    assert gpu_setting(None, 0).jobs == 1


def test_the_sweep_starts_ahead_the_warm_server_of_every_arm_the_gpu_lane_runs(monkeypatch,
                                                                                tmp_path):
    """The emulated ranks of an arm that shares the GPU run side by side, with fewer CPU threads
    each (``ranks.emulated``): another environment, so another warm server. Measured on one H100
    (2026-12-07): five arms waited 12.4 s for that server's imports when the sweep had started
    only the one of ranks run one at a time."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launch tests' pin hides the threads
    monkeypatch.setattr(launcher_module, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    plans = plan_cases(load_cases([EMULATED]))
    setting = packed(8, per_process=False)
    per_gpu = lane_ranks_at_once(setting, 1)

    def used() -> set[tuple]:  # the servers the lane's arms fork their first rank from
        keys = set()
        launcher = LocalLauncher(starter=KeyRecorder())
        for plan in plans:
            for arm in plan.arms:
                runner = launcher.with_ranks_per_gpu(per_gpu(plan, arm))
                for cmd in runner._first_commands(plan, arm, tmp_path / plan.case_id, 1):
                    keys.add(launcher.starter.key(cmd.env_of(os.environ, cmd.started[0], 0)))
        return keys

    def prewarmed(**kwargs) -> set[tuple]:
        starter = KeyRecorder()
        LocalLauncher(starter=starter).prewarm(plans, tmp_path, lambda arm, d: True, **kwargs)
        return set(starter.keys)

    moved = moved_figures(plans[0])
    assert {per_gpu(plans[0], a) for a in plans[0].arms} == {1, 2}  # alone: 1; shared: 2 at once
    assert {ranks_at_once(plans[0], a, moved[a.name], packed(1), 1) for a in plans[0].arms} == {1}
    assert used() - prewarmed() != set()  # what the sweep started before: one server missing
    assert used() <= prewarmed(ranks_per_gpu=per_gpu)


def test_the_order_counts_an_interrupted_arms_two_legs_and_a_cold_start():
    """Longest first: the resumed arm (two processes one after another) and the reference arm
    (imports torch itself) before the graph arm of as many steps."""
    from harness.launch.local.gpu_lane import _seconds

    (plan, _) = plan_cases(load_cases([EMULATED.with_name("gpu1-qwen3-graphs.yaml")]))
    seconds = {a.name: _seconds(a) for a in plan.arms}
    assert seconds["graph-resumed"] == 2 * seconds["graph"]
    assert seconds["graph"] < seconds["reference"] < seconds["graph-resumed"]
    assert seconds["eager"] == seconds["graph"]
