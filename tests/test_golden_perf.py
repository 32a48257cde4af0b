"""Step time and memory against golden values: two-sided bounds, where they come from, the
refresh command, switches, and the CPU default (hand-made step records; no training)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.compare import Check, Pair, write_verdict, read_verdict
from harness.compare.golden_perf import CPU_STEP_TIME, MEMORY_DEFAULT, STEP_TIME_DEFAULT
from harness.golden import (
    STEP_TIME_RTOL_FLOOR,
    golden_file,
    snapshot_golden,
    steady_window,
    window_median,
    write_golden,
)
from harness.judge import pair_differences
from harness.results import RunEnvironment, record_json

from tests.records import changed, probe
from tests.test_compare import OK, by_name, one, run

GIB = 2.0 ** 30
STEPS = 12
LOSSES = [2.5 - 0.05 * i for i in range(STEPS)]


def gpu_run(time_s: float = 0.2, mem: float = 4 * GIB, slow_from: int = 99, grow: float = 0.0,
            env: RunEnvironment | None = None, platform: str = "h200") -> dict:
    """An arm's records on a GPU: step time ``time_s`` (x 1.1 from step ``slow_from``), memory
    ``mem`` growing by ``grow`` bytes a step, the memory probe after the last step, ``env`` on
    the first record."""
    at = {s: {"platform": platform, "device": "cuda:0",
              "step_time_s": time_s * (1.1 if s >= slow_from else 1.0),
              "allocated_bytes": int(mem + grow * s),
              "max_allocated_bytes": int(mem + grow * s + GIB),
              "reserved_bytes": int(2 * mem)}
          for s in range(1, STEPS + 1)}
    at[STEPS]["memory_probe"] = probe(3 * mem, total=140 * GIB, allocated=mem, reserved=2 * mem)
    if env is not None:
        at[1]["environment"] = env
    return run(LOSSES, at=at)


def golden_pair(where: Path, **params) -> Pair:
    return Pair("golden", "golden", ("eager",), {**params, "golden_dir": str(where), "case_id": "c1",
                                                 "steps": STEPS, "files": snapshot_golden(where, "c1")})


def judge(where: Path, data: dict, sweep_dir: str | None = None, **params):
    return one([golden_pair(where, **params)], {"eager": (OK, data)}, expected_steps=STEPS,
               sweep_dir=sweep_dir).pairs[0]


def test_steady_window_is_megatrons_cut_to_the_run() -> None:
    assert steady_window(20) == (5, 20) and steady_window(25) == (5, 20)
    assert steady_window(50) == (30, 45) and steady_window(12) == (5, 12)
    assert steady_window(4) == (2, 4) and steady_window(1) == (1, 1)  # short runs: after warm-up
    assert steady_window(12, (3, 8)) == (3, 8) and steady_window(6, (3, 8)) == (3, 6)
    assert window_median({1: 9.0, 5: 1.0, 6: 3.0, 7: 2.0}, (5, 7)) == 2.0
    assert window_median({1: 9.0}, (5, 7)) is None


def test_same_step_time_and_memory_pass_and_record_their_figures(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    entry = judge(tmp_path, gpu_run())
    assert entry.status == "pass"
    checks = by_name(entry)
    assert {"step_time", "mem_allocated_bytes", "mem_max_allocated_bytes", "mem_reserved_bytes",
            "mem_graph_pool_bytes", "mem_device_used_bytes"} <= set(checks)
    st = checks["step_time"]
    assert st.value == 0 and st.bound == STEP_TIME_DEFAULT and st.lower == -STEP_TIME_DEFAULT
    assert "median step time over steps 5..12" in st.detail
    assert f"the default {STEP_TIME_DEFAULT:g}" in st.detail
    mem = checks["mem_allocated_bytes"]
    assert mem.value == 0 and mem.bound == MEMORY_DEFAULT and mem.lower == -MEMORY_DEFAULT
    pool = checks["mem_graph_pool_bytes"]
    assert not pool.applicable and "an eager arm has no graph pool" in pool.detail


def test_slower_fails_as_a_regression_and_faster_asks_for_a_refresh(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    # 10 % slower over the whole window, under an explicit 5 % bound: a regression.
    slow = judge(tmp_path, gpu_run(time_s=0.22), step_time={"worse": 0.05})
    check = by_name(slow)["step_time"]
    assert slow.status == "fail" and [c.name for c in slow.failed_checks] == ["step_time"]
    assert check.value == pytest.approx(0.1) and check.bound == 0.05
    assert "a regression" in check.detail
    # A slowdown of the steps outside the window (warm-up) is not what the window measures.
    assert judge(tmp_path, gpu_run(slow_from=13), step_time={"worse": 0.05}).status == "pass"
    # 40 % faster than the golden values, beyond the default: fails, with the exact command.
    fast = judge(tmp_path, gpu_run(time_s=0.12), sweep_dir="/sw")
    check = by_name(fast)["step_time"]
    assert fast.status == "fail" and check.value == pytest.approx(-0.4)
    assert check.lower == -STEP_TIME_DEFAULT
    assert "better than the golden values" in check.detail
    assert "`dcp-harness golden record /sw --case c1 --platform h200 --repeats 3`" in check.detail
    # better: a wider bound on that side lets it pass.
    assert judge(tmp_path, gpu_run(time_s=0.12), step_time={"better": 0.5}).status == "pass"


def test_memory_is_two_sided_per_step(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    # A leak of 64 MiB a step: 1 % of 4 GiB after 8 steps (the default bound), worst at step 12.
    leak = judge(tmp_path, gpu_run(grow=64 * 2**20))
    failed = [c.name for c in leak.failed_checks]
    assert leak.status == "fail" and "mem_allocated_bytes" in failed
    check = by_name(leak)["mem_allocated_bytes"]
    assert "worst step 12" in check.detail and check.value == pytest.approx(12 * 64 / 4096)
    # Much less memory than the golden values: fails on the lower side, asks for a refresh.
    less = judge(tmp_path, gpu_run(mem=3 * GIB), sweep_dir="/sw")
    check = by_name(less)["mem_allocated_bytes"]
    assert less.status == "fail" and check.value == pytest.approx(-0.25)
    assert "refresh the golden values" in check.detail
    # Bounds of the case: the leak passes a 20 % bound, and memory: null switches every one off.
    assert judge(tmp_path, gpu_run(grow=64 * 2**20), memory={"worse": 0.2}).status == "pass"
    off = judge(tmp_path, gpu_run(mem=3 * GIB), memory=None)
    assert off.status == "pass" and "compare.golden.memory is null" in by_name(off)["mem_reserved_bytes"].detail


def test_a_step_under_the_lower_bound_fails_though_another_is_further_off_within_its_bound(
        tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    # allocated -5 % at step 1, +10 % at step 12: the upper bound (20 %) holds, the lower (1 %) not.
    g = 0.15 * 4 * GIB / 11
    entry = judge(tmp_path, gpu_run(mem=0.95 * 4 * GIB - g, grow=g), memory={"worse": 0.2})
    check = by_name(entry)["mem_allocated_bytes"]
    assert not check.passed and "worst step 1:" in check.detail
    assert check.value == pytest.approx(-0.05)


def on_device(device: str, **kw) -> dict:
    """gpu_run on the GPU ``device`` (its ``device_id`` in the environment of every rank)."""
    return gpu_run(env=RunEnvironment("2.11.0+cu130", "13.0", "2.27.3", "NVIDIA H200",
                                      device_id=device), **kw)


def test_bounds_come_from_the_case_then_the_golden_rtol_then_the_default(tmp_path: Path) -> None:
    runs = [on_device("GPU-a", time_s=t) for t in (0.200, 0.210, 0.190)]  # +-5 % -> rtol 7.5 %
    write_golden(golden_file(tmp_path, "c1", "h200"), runs)
    entry = judge(tmp_path, on_device("GPU-a", time_s=0.22))  # +10 % of the median 0.2
    check = by_name(entry)["step_time"]
    assert check.bound == pytest.approx(0.075) and check.lower == pytest.approx(-0.075)
    assert ("rtol 0.075 of 3 repeats in the golden file, on the device(s) this run used"
            in check.detail and entry.status == "fail")
    explicit = by_name(judge(tmp_path, on_device("GPU-a", time_s=0.22),
                             step_time={"worse": 0.15}))["step_time"]
    assert explicit.passed and explicit.bound == 0.15 and explicit.lower == pytest.approx(-0.075)
    # Memory repeated to the byte: the floor, 0.1 %.
    assert by_name(entry)["mem_allocated_bytes"].bound == pytest.approx(1e-3)


def test_a_repeats_rtol_holds_on_the_devices_the_repeats_ran_on(tmp_path: Path) -> None:
    """Repeats measure one machine's noise; another GPU of the same kind moved step time by 17 %
    with bitwise-equal numerics (bench/RESULTS-log.md, 2026-12-03). There the bound is the default,
    and the detail names both sides and the command that gives a tight bound."""
    runs = [on_device("GPU-a", time_s=t) for t in (0.200, 0.210, 0.190)]
    write_golden(golden_file(tmp_path, "c1", "h200"), runs)
    moved = judge(tmp_path, on_device("GPU-b", time_s=0.22), sweep_dir="/sw")  # +10 %, another GPU
    check = by_name(moved)["step_time"]
    assert moved.status == "pass" and check.bound == STEP_TIME_DEFAULT
    assert check.lower == -STEP_TIME_DEFAULT
    assert ("not the rtol 0.075 of 3 repeats in the golden file: the repeats ran on GPU-a, this "
            "run on GPU-b") in check.detail
    assert ("(`dcp-harness golden record /sw --case c1 --platform h200 --repeats 3` on this "
            "machine") in check.detail
    # The same +10 % on the repeats' own GPU is a regression.
    assert judge(tmp_path, on_device("GPU-a", time_s=0.22)).status == "fail"
    # A slowdown beyond the default fails on any GPU.
    beyond = 0.2 * (1.01 + STEP_TIME_DEFAULT)
    assert judge(tmp_path, on_device("GPU-b", time_s=beyond)).status == "fail"
    # Records that name no device (an older run) cannot claim the repeats' machine either.
    assert by_name(judge(tmp_path, gpu_run(time_s=0.22)))["step_time"].bound == STEP_TIME_DEFAULT
    # A golden file that does not name its repeats' devices (an older one): the default, said so.
    path = golden_file(tmp_path, "c1", "h200")
    doc = json.loads(path.read_text())
    assert doc["iteration-time"]["devices"] == ["GPU-a"]
    del doc["iteration-time"]["devices"]
    path.write_text(json.dumps(doc))
    old = by_name(judge(tmp_path, on_device("GPU-a", time_s=0.22)))["step_time"]
    assert old.passed and old.bound == STEP_TIME_DEFAULT
    assert "the golden file does not name the devices its repeats ran on" in old.detail
    # A file of an older dcp-harness with an rtol under today's floor: the floor, 5 %.
    doc["iteration-time"]["rtol"], doc["iteration-time"]["devices"] = 0.0167, ["GPU-a"]
    path.write_text(json.dumps(doc))
    floor = by_name(judge(tmp_path, on_device("GPU-a", time_s=0.208)))["step_time"]
    assert floor.passed and floor.bound == STEP_TIME_RTOL_FLOOR
    assert ("rtol 0.0167 of 3 repeats in the golden file, raised to step time's floor 0.05"
            in floor.detail)
    # Memory keeps the file's rtol on any device (it repeated to the byte between sessions).
    mem = by_name(judge(tmp_path, on_device("GPU-b")))["mem_allocated_bytes"]
    assert mem.bound == pytest.approx(1e-3)


def test_a_multi_rank_run_needs_every_rank_on_the_repeats_devices(tmp_path: Path) -> None:
    env = RunEnvironment("2.11.0+cu130", "13.0", "2.27.3", "NVIDIA H200")
    def two(devs: tuple[str, str], **kw) -> dict:
        data = gpu_run(**kw)
        for rank, dev in enumerate(devs):
            recs = data[rank]
            mine = dataclasses.replace(env, device_id=dev)
            recs[0] = dataclasses.replace(recs[0], environment=mine)
        return data
    write_golden(golden_file(tmp_path, "c1", "h200"), [two(("GPU-a", "GPU-b"), time_s=t)
                                                       for t in (0.200, 0.202, 0.198)])
    assert json.loads(golden_file(tmp_path, "c1", "h200").read_text())["iteration-time"][
        "devices"] == ["GPU-a", "GPU-b"]
    # +-1 % over the repeats: Megatron's 5 % floor
    same = by_name(judge(tmp_path, two(("GPU-b", "GPU-a"))))["step_time"]
    assert same.bound == STEP_TIME_RTOL_FLOOR
    assert by_name(judge(tmp_path, two(("GPU-a", "GPU-c"))))["step_time"].bound == STEP_TIME_DEFAULT


def test_step_time_is_off_on_cpu_unless_switched_on(tmp_path: Path) -> None:
    cpu = run(LOSSES)
    write_golden(golden_file(tmp_path, "c1", "cpu"), cpu)
    check = by_name(judge(tmp_path, cpu))["step_time"]
    assert not check.applicable and check.detail == f"not applicable: {CPU_STEP_TIME}"
    slow = run(LOSSES, at={s: {"step_time_s": 0.5} for s in range(1, STEPS + 1)})  # 5x the 0.1 s
    assert judge(tmp_path, slow).status == "pass"
    on = judge(tmp_path, slow, step_time={"on_cpu": True})
    assert on.status == "fail" and by_name(on)["step_time"].value == pytest.approx(4.0)
    off = by_name(judge(tmp_path, slow, step_time=None))["step_time"]
    assert not off.applicable and "step_time is null" in off.detail


def test_a_golden_file_without_step_time_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    path = write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    doc = json.loads(path.read_text())
    del doc["iteration-time"]
    path.write_text(json.dumps(doc))
    entry = judge(tmp_path, gpu_run())
    assert entry.status == "error" and "no metric 'iteration-time'" in entry.error
    assert "re-record it" in entry.error


def test_the_detail_says_what_changed_in_the_environment(tmp_path: Path) -> None:
    old = RunEnvironment("2.11.0+cu130", "13.0", "2.27.3", "NVIDIA H200")
    new = RunEnvironment("2.13.0+cu130", "13.0", "2.27.3", "NVIDIA H200",
                         (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),))
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run(env=old))
    detail = by_name(judge(tmp_path, gpu_run(env=new)))["step_time"].detail
    assert "the environment changed since the golden values were recorded: torch 2.11.0+cu130 -> " \
           "2.13.0+cu130, PYTORCH_CUDA_ALLOC_CONF (unset) -> expandable_segments:True" in detail
    same = by_name(judge(tmp_path, gpu_run(env=old)))["step_time"].detail
    assert "same environment as the golden values (torch 2.11.0+cu130, CUDA 13.0" in same


def test_the_lower_bound_round_trips_and_an_edited_one_is_caught(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    v = one([golden_pair(tmp_path)], {"eager": (OK, gpu_run())}, expected_steps=STEPS)
    write_verdict(tmp_path, v)
    back = read_verdict(tmp_path)
    assert back is not None and by_name(back.pairs[0])["step_time"].lower == -STEP_TIME_DEFAULT
    entry = v.pairs[0]
    checks = tuple(Check(c.name, c.value, c.bound, c.passed, c.detail, c.applicable,
                         -0.9 if c.name == "step_time" else c.lower) for c in entry.checks)
    edited = type(entry)(entry.case_id, entry.pair, entry.contract, entry.arms, checks, entry.status)
    diff = pair_differences(edited, entry)
    said = f"check step_time says value 0.0 (bound {STEP_TIME_DEFAULT:g}, lower -0.9)"
    assert diff and said in diff[0]
    # A one-sided check (no lower bound) writes no 'lower' key: old verdict files stay the same.
    assert "lower" not in record_json(by_name(entry)["loss"])


def test_losses_are_still_checked_beside_time_and_memory(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    moved = changed(gpu_run(), {4: {"loss": LOSSES[3] * 1.001}})
    entry = judge(tmp_path, moved)
    assert [c.name for c in entry.failed_checks] == ["loss"]


def test_an_environment_in_the_key_picks_its_own_file(tmp_path: Path) -> None:
    env = RunEnvironment("2.11.0+cu130", "13.0", "2.27.3", "NVIDIA H200")
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run(time_s=0.5))  # today's file
    entry = judge(tmp_path, gpu_run(env=env), sweep_dir="/sw", environment="auto")
    assert entry.status == "skipped"
    assert ("no golden values for key 'torch2.11-cu13.0_h200' (environment 'torch2.11-cu13.0', "
            "platform 'h200')") in entry.error
    write_golden(golden_file(tmp_path, "c1", "h200", "torch2.11-cu13.0"), gpu_run(env=env))
    assert judge(tmp_path, gpu_run(env=env), environment="auto").status == "pass"
    # A name of one's own, as Megatron's dev / lts.
    write_golden(golden_file(tmp_path, "c1", "h200", "dev"), gpu_run(env=env))
    assert judge(tmp_path, gpu_run(env=env), environment="dev").status == "pass"
    # Without an environment today's file is judged (and its step time is 2.5x this run's).
    assert judge(tmp_path, gpu_run(env=env)).status == "fail"
    # auto on records that name no environment: an error saying why.
    old = judge(tmp_path, gpu_run(), environment="auto")
    assert old.status == "error" and "records name no environment" in old.error
