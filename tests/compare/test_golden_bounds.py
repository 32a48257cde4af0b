"""The golden check's loss bounds where the case gives none: bitwise for a deterministic fp32
arm against a CPU golden file (the spread of the file's repeats where they did not agree
bitwise), Megatron's fixed tolerances elsewhere; and a CUDA arm that measured no memory fails
the memory checks (hand-made records; no training)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.compare import CONTRACTS, Check, Pair
from harness.compare.contracts.golden import GoldenPairParams
from harness.golden import LOSS_DEFAULTS, GoldenCopy, golden_values, refusals
from harness.results import RunEnvironment
from harness.spec.schema import Tolerance

from tests.compare import scenarios as sc
from tests.compare.scenarios import bump, scaled
from tests.records import changed

HERE = RunEnvironment("2.13.0+cpu", device_name="Xeon X, AVX512, flags 1a2b3c4d",
                      settings=(("OMP_NUM_THREADS", "2"),), device_id="vm")


def cpu_run(env=HERE):
    """A CPU arm whose first record names the environment ``env``."""
    return changed(sc.arm(), {1: {"environment": env}})


def golden_pair(runs, platform: str = "cpu", **settings) -> Pair:
    copy = GoldenCopy(path=f"golden/c1/golden_values_{platform}.json", sha256="0" * 64,
                      document=golden_values(runs))
    return Pair("golden", "golden", ("eager",),
                GoldenPairParams(case_id="c1", golden_dir="golden", steps=sc.STEPS,
                                 files={platform: copy}, **settings))


def judge(pair: Pair, run) -> dict[str, Check]:
    return {c.name: c for c in CONTRACTS["golden"](pair, {"eager": run})}


ULP = bump("eager", 2, "loss", 1e-15)  # a few ulps: no fixed tolerance sees them


def ulp(run):
    return ULP(None, {"eager": run})[1]["eager"]


def test_a_deterministic_fp32_cpu_arm_is_held_to_its_golden_values_bitwise() -> None:
    run = cpu_run()
    pair = golden_pair(run, deterministic_fp32=True)
    got = judge(pair, run)
    for name in ("loss", "aux_loss", "grad_norm"):
        assert got[name].passed and got[name].bound == 0.0
        assert ("(bound: bitwise: a deterministic fp32 run on CPU repeats its golden values in "
                "the environment they were recorded in)") in got[name].detail
    moved = judge(pair, ulp(run))["loss"]
    assert not moved.passed and "exact: 1 of 4 steps out of bound; worst step 2" in moved.detail


@pytest.mark.parametrize("recorded, ran, why", [
    (HERE, dataclasses.replace(HERE, device_name="Xeon Y, AVX2, flags 5e6f7a8b"),
     "recorded in another environment (device Xeon X, AVX512, flags 1a2b3c4d -> Xeon Y, AVX2"),
    (HERE, dataclasses.replace(HERE, settings=(("OMP_NUM_THREADS", "1"),)),
     "recorded in another environment (OMP_NUM_THREADS 2 -> 1)"),
    (None, HERE, "the golden file names no environment"),
])
def test_bitwise_holds_only_in_the_environment_the_values_were_recorded_in(recorded, ran,
                                                                          why) -> None:
    # The same code and data on another CPU rounds its fp32 kernels otherwise (measured: every
    # committed CPU golden file of 2026-12-01 differs from this machine's runs by 1e-9..5e-8).
    pair = golden_pair(cpu_run(recorded), deterministic_fp32=True)
    loss = judge(pair, ulp(cpu_run(ran)))["loss"]
    assert loss.passed and loss.bound == LOSS_DEFAULTS["lm loss"].max_rel
    assert why in loss.detail and "`dcp-harness golden record <sweep> --case c1" in loss.detail


def on(platform: str, run):
    return {r: [dataclasses.replace(x, platform=platform) for x in recs] for r, recs in run.items()}


@pytest.mark.parametrize("platform, deterministic_fp32", [("cpu", False), ("h200", True)])
def test_elsewhere_the_fixed_tolerances_hold(platform: str, deterministic_fp32: bool) -> None:
    run = on(platform, cpu_run())
    pair = golden_pair(run, platform=platform, deterministic_fp32=deterministic_fp32)
    got = judge(pair, ulp(run))
    assert got["loss"].passed and got["loss"].bound == LOSS_DEFAULTS["lm loss"].max_rel
    assert "the default: not a deterministic fp32 run on CPU" in got["loss"].detail
    assert got["grad_norm"].bound == LOSS_DEFAULTS["grad norm"].max_rel


def test_a_declared_bound_wins() -> None:
    run = cpu_run()
    got = judge(golden_pair(run, deterministic_fp32=True, loss={"max_rel": 1e-3}), ulp(run))
    assert got["loss"].passed and "(bound: compare.golden.loss)" in got["loss"].detail
    assert got["grad_norm"].bound == 0.0  # the metrics the case left out stay bitwise


def test_repeats_that_did_not_agree_bitwise_give_their_spread_as_the_bound() -> None:
    base = cpu_run()
    runs = [base, scaled("eager", 1 + 2e-7, "loss")(None, {"eager": base})[1]["eager"], base]
    pair = golden_pair(runs, deterministic_fp32=True)
    got = judge(pair, base)  # the median: the recorded values
    loss = got["loss"]
    assert loss.passed and loss.bound == pytest.approx(1.5 * 2e-7)
    assert "1.5 x the spread 2e-07 of the golden file's 3 repeats" in loss.detail
    assert got["grad_norm"].bound == 0.0  # repeats that agreed bitwise: still exact
    assert "the golden file's 3 repeats agreed bitwise" in got["grad_norm"].detail
    far = scaled("eager", 1 + 1e-6, "loss")(None, {"eager": base})[1]["eager"]
    assert not judge(pair, far)["loss"].passed


def test_recording_refuses_repeats_the_default_bounds_would_not_pass() -> None:
    base = sc.arm()
    apart = scaled("eager", 1 + 1e-4, "loss")(None, {"eager": base})[1]["eager"]
    why = refusals([base, apart], loss_bounds={"lm loss": None}, checked=())
    assert len(why) == 1 and "'lm loss' differs between the 2 repeats" in why[0]
    assert str(Tolerance(max_rel=1e-5)) in why[0]
    assert refusals([base, apart], loss_bounds={"lm loss": {"max_rel": 1e-3}}, checked=()) == []
    assert refusals([base, apart], loss_bounds={}, checked=()) == []  # not asked: not checked


def test_a_cuda_arm_without_memory_figures_fails_the_memory_checks_not_skips_them() -> None:
    pair, data = sc.golden_gpu()
    bare = {r: [dataclasses.replace(x, allocated_bytes=None, memory_probe=None, graph_stats=None)
                for x in recs] for r, recs in data["graph"].items()}
    got = {c.name: c for c in CONTRACTS["golden"](pair, {"graph": bare})}
    for name in ("mem_allocated_bytes", "mem_device_used_bytes", "mem_graph_pool_bytes"):
        assert not got[name].passed and got[name].applicable, got[name]
        assert "ran on CUDA but recorded no" in got[name].detail
    assert got["mem_reserved_bytes"].passed  # still recorded
    eager = {r: [dataclasses.replace(x, graphed=False) for x in recs] for r, recs in bare.items()}
    pool = {c.name: c for c in CONTRACTS["golden"](pair, {"graph": eager})}["mem_graph_pool_bytes"]
    assert not pool.applicable and "an eager arm has no graph pool" in pool.detail
