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
from harness.spec.schema import Tolerance

from tests.compare import scenarios as sc
from tests.compare.scenarios import bump, scaled


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
    run = sc.arm()
    pair = golden_pair(run, deterministic_fp32=True)
    got = judge(pair, run)
    for name in ("loss", "aux_loss", "grad_norm"):
        assert got[name].passed and got[name].bound == 0.0
        assert "(bound: bitwise: a deterministic fp32 run on CPU repeats exactly)" in got[name].detail
    moved = judge(pair, ulp(run))["loss"]
    assert not moved.passed and "exact: 1 of 4 steps out of bound; worst step 2" in moved.detail


def on(platform: str, run):
    return {r: [dataclasses.replace(x, platform=platform) for x in recs] for r, recs in run.items()}


@pytest.mark.parametrize("platform, deterministic_fp32", [("cpu", False), ("h200", True)])
def test_elsewhere_the_fixed_tolerances_hold(platform: str, deterministic_fp32: bool) -> None:
    run = on(platform, sc.arm())
    pair = golden_pair(run, platform=platform, deterministic_fp32=deterministic_fp32)
    got = judge(pair, ulp(run))
    assert got["loss"].passed and got["loss"].bound == LOSS_DEFAULTS["lm loss"].max_rel
    assert "the default for a run that may not repeat bitwise" in got["loss"].detail
    assert got["grad_norm"].bound == LOSS_DEFAULTS["grad norm"].max_rel


def test_a_declared_bound_wins() -> None:
    run = sc.arm()
    got = judge(golden_pair(run, deterministic_fp32=True, loss={"max_rel": 1e-3}), ulp(run))
    assert got["loss"].passed and "(bound: compare.golden.loss)" in got["loss"].detail
    assert got["grad_norm"].bound == 0.0  # the metrics the case left out stay bitwise


def test_repeats_that_did_not_agree_bitwise_give_their_spread_as_the_bound() -> None:
    base = sc.arm()
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
