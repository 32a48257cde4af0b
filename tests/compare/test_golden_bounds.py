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

KERNELS = (("aten_cpu_capability", "AVX512"), ("blas", "mkl 2024.2"), ("blas_isa", "7"),
           ("float32_matmul_precision", "highest"), ("intra_op_threads", "2"),
           ("torch", "2.13.0+cpu"), ("torch_git", "cf30153c4c13"))
HERE = RunEnvironment("2.13.0+cpu", device_name="Xeon X, AVX512, flags 1a2b3c4d",
                      settings=(("OMP_NUM_THREADS", "2"),), device_id="vm", kernels=KERNELS)
# An environment recorded before the kernel identity was (the committed files of 2026-12-01).
OLD = dataclasses.replace(HERE, kernels=())


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


def kernels(**changes) -> RunEnvironment:
    return dataclasses.replace(HERE, kernels=tuple(sorted({**dict(KERNELS), **changes}.items())))


def test_a_deterministic_fp32_cpu_arm_is_held_to_its_golden_values_bitwise() -> None:
    run = cpu_run()
    pair = golden_pair(run, deterministic_fp32=True)
    got = judge(pair, run)
    for name in ("loss", "aux_loss", "grad_norm"):
        assert got[name].passed and got[name].bound == 0.0
        assert ("(bound: bitwise: a deterministic run repeats its golden values with the kernels "
                "they were recorded with (ATen CPU capability AVX512, BLAS mkl 2024.2, BLAS ISA "
                "branch 7, ") in got[name].detail
        assert "intra-op threads 2, torch version 2.13.0+cpu" in got[name].detail
    moved = judge(pair, ulp(run))["loss"]
    assert not moved.passed and "exact: 1 of 4 steps out of bound; worst step 2" in moved.detail


def test_another_host_with_the_same_kernels_is_still_bitwise() -> None:
    # Issue 41: a host whose CPU flag list differs (another digest, another model string) ran
    # the committed golden values to the last bit; the flag list does not decide the kernels.
    other_host = dataclasses.replace(HERE, device_name="Xeon X @ 2.80GHz, AVX512, flags 38378261",
                                     device_id="other")
    pair = golden_pair(cpu_run(), deterministic_fp32=True)
    assert judge(pair, cpu_run(other_host))["loss"].bound == 0.0
    assert not judge(pair, ulp(cpu_run(other_host)))["loss"].passed  # 2e-7 would have passed


@pytest.mark.parametrize("ran, why", [
    (kernels(intra_op_threads="1"), "other kernels than the golden file's (intra-op threads 2 -> 1)"),
    (kernels(aten_cpu_capability="DEFAULT"), "(ATen CPU capability AVX512 -> DEFAULT)"),
    (kernels(blas_isa="5"), "(BLAS ISA branch 7 -> 5)"),
    (kernels(torch="2.14.0+cpu", torch_git="0123456789ab"),
     "(torch version 2.13.0+cpu -> 2.14.0+cpu; torch build cf30153c4c13 -> 0123456789ab)"),
])
def test_other_kernels_fall_back_and_say_which_part_differs(ran, why) -> None:
    pair = golden_pair(cpu_run(), deterministic_fp32=True)
    loss = judge(pair, ulp(cpu_run(ran)))["loss"]
    assert loss.passed and loss.bound == LOSS_DEFAULTS["lm loss"].max_rel
    assert why in loss.detail and "`dcp-harness golden record <sweep> --case c1" in loss.detail


def test_a_file_recorded_before_the_kernel_identity_is_judged_on_what_it_kept() -> None:
    # The torch version, the ATen capability its CPU name carried, OMP_NUM_THREADS.
    pair = golden_pair(cpu_run(OLD), deterministic_fp32=True)
    loss = judge(pair, cpu_run())["loss"]
    assert loss.bound == 0.0 and "the file predates BLAS, BLAS ISA branch" in loss.detail
    threads = judge(pair, ulp(cpu_run(kernels(intra_op_threads="1"))))["loss"]
    assert threads.passed and "intra-op threads 2 -> 1" in threads.detail
    other = dataclasses.replace(OLD, device_name="Xeon Y, AVX2, flags 5e6f7a8b")
    legacy = judge(golden_pair(cpu_run(other), deterministic_fp32=True), cpu_run())["loss"]
    assert legacy.bound > 0 and "ATen CPU capability AVX2 -> AVX512" in legacy.detail


@pytest.mark.parametrize("recorded, ran, why", [
    (None, HERE, "the golden file names no environment"),
    (HERE, None, "the arm's records name no environment"),
])
def test_no_environment_no_bitwise_bound(recorded, ran, why) -> None:
    pair = golden_pair(cpu_run(recorded), deterministic_fp32=True)
    loss = judge(pair, ulp(cpu_run(ran)))["loss"]
    assert loss.passed and loss.bound == LOSS_DEFAULTS["lm loss"].max_rel and why in loss.detail
    if ran is None:  # a command's TensorBoard metrics: re-recording would not help; say what does
        assert "record API" in loss.detail and "--repeats" not in loss.detail


def on(platform: str, run):
    return {r: [dataclasses.replace(x, platform=platform) for x in recs] for r, recs in run.items()}


def test_not_deterministic_on_cpu_is_the_fixed_tolerances() -> None:
    run = cpu_run()
    got = judge(golden_pair(run), ulp(run))
    assert got["loss"].passed and got["loss"].bound == LOSS_DEFAULTS["lm loss"].max_rel
    assert "not a deterministic fp32 arm" in got["loss"].detail
    assert got["grad_norm"].bound == LOSS_DEFAULTS["grad norm"].max_rel


GPU = RunEnvironment("2.13.0+cu130", "13.0", "2.27.3", "NVIDIA H100 80GB HBM3",
                     device_id="GPU-a", kernels=(
                         ("allow_tf32", "False"), ("capability", "sm_90"), ("cublas", "13.1.0.3"),
                         ("cuda", "13.0"), ("cudnn", "91300"), ("cudnn_allow_tf32", "True"),
                         ("device", "NVIDIA H100 80GB HBM3"), ("float32_matmul_precision", "highest"),
                         ("torch", "2.13.0+cu130"), ("torch_git", "cf30153c4c13")))


def test_a_deterministic_gpu_arm_is_bitwise_with_the_whole_identity_only() -> None:
    run = on("h100", cpu_run(GPU))
    pair = golden_pair(run, platform="h100", deterministic=True)
    assert judge(pair, run)["loss"].bound == 0.0
    other_card = dataclasses.replace(GPU, device_id="GPU-b")  # another H100, the same kernels
    assert not judge(pair, ulp(on("h100", cpu_run(other_card))))["loss"].passed
    cudnn = dataclasses.replace(GPU, kernels=tuple((k, "91400" if k == "cudnn" else v)
                                                   for k, v in GPU.kernels))
    moved = judge(pair, ulp(on("h100", cpu_run(cudnn))))["loss"]
    assert moved.passed and "cuDNN 91300 -> 91400" in moved.detail
    old = on("h200", cpu_run(dataclasses.replace(GPU, kernels=())))  # an h200 file of 2026-12-02
    legacy = judge(golden_pair(old, platform="h200", deterministic=True), ulp(old))["loss"]
    assert legacy.passed and "predates the kernel identity: on h200" in legacy.detail
    not_det = judge(golden_pair(run, platform="h100"), ulp(run))["loss"]
    assert not_det.passed and "not a deterministic arm (train.deterministic)" in not_det.detail


def test_a_command_is_bitwise_once_its_repeats_agreed_bitwise() -> None:
    # Issue 40: a command's arm is not known to be deterministic; N repeats that agree bitwise,
    # with the kernels they name, show it (golden record --repeats N).
    run = cpu_run()
    once = judge(golden_pair(run), ulp(run))["loss"]
    assert once.passed and "--repeats 3` to show it" in once.detail
    thrice = golden_pair([run, run, run])
    got = judge(thrice, ulp(run))["loss"]
    assert not got.passed and got.bound == 0.0
    assert "the golden file's 3 repeats agreed bitwise" in got.detail


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


def side_by_side(*runs) -> Pair:
    """One CPU key with a file per kernel identity: ``golden_values_cpu.json`` (the first run's)
    and ``golden_values_cpu.<variant>.json`` beside it (the others')."""
    from harness.golden import environment_of, variant_name

    files = {}
    for i, run in enumerate(runs):
        key = "cpu" if i == 0 else f"cpu.{variant_name(environment_of(run))}"
        files[key] = GoldenCopy(path=f"golden/c1/golden_values_{key}.json", sha256="0" * 64,
                                document=golden_values(run))
    return Pair("golden", "golden", ("eager",),
                GoldenPairParams(case_id="c1", golden_dir="golden", steps=sc.STEPS, files=files,
                                 deterministic_fp32=True))


def test_files_of_other_kernels_live_side_by_side_and_the_matching_one_is_judged() -> None:
    avx512 = cpu_run()
    avx2 = ulp(cpu_run(kernels(aten_cpu_capability="AVX2")))  # other kernels, other last bits
    pair = side_by_side(avx512, avx2)
    assert sorted(pair.params.files) == ["cpu", "cpu.avx2-mkl7-t2"]
    for run, name in ((avx512, "golden_values_cpu.json"),
                      (avx2, "golden_values_cpu.avx2-mkl7-t2.json")):
        loss = judge(pair, run)["loss"]
        assert loss.passed and loss.bound == 0.0 and loss.bound_kind == "bitwise", loss.detail
        assert name in loss.detail
    # kernels no file was recorded with: the key's own file, at the fallback bound, saying so
    other = judge(pair, cpu_run(kernels(aten_cpu_capability="DEFAULT")))["loss"]
    assert other.bound_kind == "fallback" and "golden_values_cpu.json" in other.detail
    assert "(bound: fallback to the default rel 1e-05: other kernels" in other.detail


def test_every_golden_loss_check_names_its_bound_kind() -> None:
    run = cpu_run()
    kinds = {n: c.bound_kind for n, c in judge(golden_pair(run, deterministic_fp32=True),
                                               run).items()}
    assert kinds["loss"] == kinds["aux_loss"] == kinds["grad_norm"] == "bitwise"
    declared = judge(golden_pair(run, deterministic_fp32=True,
                                 loss=Tolerance(max_rel=1e-3)), run)
    assert declared["loss"].bound_kind == "declared" and declared["grad_norm"].bound_kind == "bitwise"
    assert judge(golden_pair(run), run)["loss"].bound_kind == "fallback"  # not deterministic fp32
