"""Reference, golden and sanity checks, grad norm in every pair, per-arm expected ranks (hand-made
step records; no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.compare import Pair, regroup_step, sanity_checks
from harness.golden import (GoldenError, golden_file, golden_values, platform_key, platform_of,
                            read_golden, snapshot_golden, write_golden)
from harness.compare.contracts.reference import ReferenceContract
from harness.spec.schema import SanitySpec

from harness.results import ArmOutcome, PackedGroup, PackedMicrobatch

from tests.records import changed, record
from tests.test_compare import LOSS, OK, by_name, one, run

GRAD = [0.9, 0.8, 0.7, 0.6]


def reference_pair(same: bool, coeff: float = 0.01, regroup_reason=None, static_bins=None,
                   **bounds) -> Pair:
    params = {**ReferenceContract(**bounds).model_dump(mode="json"), "groups_like_reference": same,
              "aux_loss_coeff": coeff, "regroup_reason": regroup_reason,
              "static_bins": static_bins}
    return Pair("reference", "reference", ("cand", "reference"), params)


def ref_data(cand: dict, ref: dict) -> dict:
    return {"cand": (OK, cand), "reference": (OK, ref)}


def ranks(**kw) -> dict:
    return {"expected_ranks": {"cand": 2, "reference": 1}, **kw}


def with_mbs(data: dict, counts: list[int]) -> dict:
    return changed(data, {step: {"microbatches": n} for step, n in enumerate(counts, start=1)})


# --------------------------------------------------------------------------- reference
def test_same_grouping_compares_every_metric_on_every_step_tightly() -> None:
    cand, ref = run(LOSS, grad=GRAD), run(LOSS, ranks=1, grad=GRAD)
    v = one([reference_pair(True)], ref_data(cand, ref), **ranks())
    assert v.status == "pass"
    checks = by_name(v.pairs[0])
    assert {"loss", "grad_norm", "aux_loss"} <= set(checks)
    assert "loss_regrouped" not in checks
    assert "every step" in checks["loss"].detail
    # A grad-norm drift of 1e-5 (10x the default bound) is a regression.
    drift = run(LOSS, grad=[GRAD[0], GRAD[1] * (1 + 1e-5), *GRAD[2:]])
    bad = one([reference_pair(True)], ref_data(drift, ref), **ranks())
    assert bad.status == "fail"
    assert [c.name for c in bad.pairs[0].failed_checks] == ["grad_norm"]


def test_regrouped_layout_with_aux_loss_is_exact_on_step_one_then_loose() -> None:
    ref = run(LOSS, ranks=1, grad=GRAD, aux=[1.0, 1.0, 1.0, 1.0])
    later = [LOSS[0], LOSS[1] * (1 + 5e-4), LOSS[2], LOSS[3]]  # within regrouped_loss 1e-3
    cand = run(later, grad=[g * (1 + 1e-4) for g in GRAD], aux=[1.01, 1.02, 1.0, 1.0])
    v = one([reference_pair(False)], ref_data(cand, ref), **ranks())
    assert v.status == "pass"
    checks = by_name(v.pairs[0])
    assert checks["loss"].value == 0 and "up to the regrouping" in checks["loss"].detail
    assert not checks["aux_loss"].applicable and not checks["grad_norm"].applicable
    assert checks["loss_regrouped"].bound == pytest.approx(1e-3)
    assert checks["grad_norm_regrouped"].passed
    # Step 1 differing at all beyond 1e-6 (a dropped or duplicated token) fails.
    first = run([LOSS[0] * (1 + 1e-5), *LOSS[1:]], grad=GRAD)
    bad = one([reference_pair(False)], ref_data(first, ref), **ranks())
    assert [c.name for c in bad.pairs[0].failed_checks] == ["loss"]


def test_regrouped_layout_without_aux_loss_is_exact_everywhere_but_aux() -> None:
    ref = run(LOSS, ranks=1, grad=GRAD)
    cand = run([LOSS[0], LOSS[1] * (1 + 5e-4), *LOSS[2:]], grad=GRAD, aux=[0.5] * 4)
    v = one([reference_pair(False, coeff=0.0)], ref_data(cand, ref), **ranks())
    checks = by_name(v.pairs[0])
    assert v.status == "fail" and not checks["loss"].passed and "aux loss off" in checks["loss"].detail
    assert checks["grad_norm"].passed and not checks["aux_loss"].applicable
    assert "loss_regrouped" not in checks


def packed(*microbatches: list, cp: int = 1, tokens: int = 10) -> tuple[PackedMicrobatch, ...]:
    """``StepRecord.packed``: each microbatch a list of groups, each group a list of sequence
    indices (``tokens`` real tokens per sequence)."""
    return tuple(PackedMicrobatch(tuple(PackedGroup(cp, tuple(g), tokens * len(g)) for g in mb))
                 for mb in microbatches)


def with_packing(data: dict, steps: list[tuple[PackedMicrobatch, ...]]) -> dict:
    """Every record of ``data`` gets its step's microbatches (and their count and tokens)."""
    return changed(data, {i: {"packed": mbs, "microbatches": len(mbs),
                              "tokens": sum(mb.tokens for mb in mbs)}
                          for i, mbs in enumerate(steps, start=1)})


FOUR = packed([[0, 1]], [[2]], [[3]], [[4, 5]])  # 4 microbatches of sequences 0-5
THREE = packed([[0, 1, 2]], [[3]], [[4, 5]])  # the same sequences in 3


def test_layout_that_must_pack_the_single_ranks_microbatches_fails_when_it_does_not() -> None:
    # The scenario: a fixed-CP arm of a PP/VPP case packs 4 microbatches where the single
    # rank packs 3 (train.microbatches not honoured), and a second, slight fault (grad norm rel
    # 2e-6 at step 4) hides behind it when the regrouped bounds (2e-4) take over.
    ref = with_packing(run(LOSS, ranks=1, grad=GRAD), [FOUR, FOUR, THREE, THREE])
    cand = with_packing(run(LOSS, grad=[*GRAD[:3], GRAD[3] * (1 + 2e-6)]),
                        [FOUR, FOUR, FOUR, FOUR])
    assert regroup_step(True, cand, ref) is None  # never explained: the exact checks stay on
    v = one([reference_pair(True)], ref_data(cand, ref), **ranks())
    checks = by_name(v.pairs[0])
    assert v.status == "fail"
    assert [c.name for c in v.pairs[0].failed_checks] == ["microbatches", "grad_norm"]
    mb = checks["microbatches"]
    assert mb.value == 2 and "must pack the single rank's microbatches" in mb.detail
    assert "at step(s) 3-4" in mb.detail and "step 3: 4 vs 3, step 4: 4 vs 3" in mb.detail
    assert "cand 4 microbatches: CP1 [0 1] 20 | CP1 [2] 10" in mb.detail
    assert "reference 3 microbatches: CP1 [0 1 2] 30" in mb.detail
    assert "every step" in checks["grad_norm"].detail and "loss_regrouped" not in checks
    # Same count, other sequences: a failure too (composition, not only counts).
    other = packed([[0, 2]], [[1]], [[3]], [[4, 5]])
    swapped = with_packing(run(LOSS, grad=GRAD), [FOUR, other, THREE, THREE])
    ref2 = with_packing(run(LOSS, ranks=1, grad=GRAD), [FOUR, FOUR, THREE, THREE])
    bad = one([reference_pair(True)], ref_data(swapped, ref2), **ranks())
    assert [c.name for c in bad.pairs[0].failed_checks] == ["microbatches"]
    assert "at step(s) 2: microbatches cand vs reference: step 2: 4 vs 4" in \
        by_name(bad.pairs[0])["microbatches"].detail
    # Packing them all: passes, saying so.
    good = one([reference_pair(True)], ref_data(with_packing(run(LOSS, grad=GRAD), [FOUR] * 4),
                                                 with_packing(run(LOSS, ranks=1, grad=GRAD), [FOUR] * 4)),
               **ranks())
    assert good.status == "pass"
    assert "it does on all 4 steps" in by_name(good.pairs[0])["microbatches"].detail


def test_older_records_without_microbatches_compare_counts() -> None:
    ref = with_mbs(run(LOSS, ranks=1, grad=GRAD), [4, 4, 3, 3])
    cand = with_mbs(run(LOSS, grad=GRAD), [4, 4, 4, 4])
    v = one([reference_pair(True)], ref_data(cand, ref), **ranks())
    mb = by_name(v.pairs[0])["microbatches"]
    assert v.status == "fail" and not mb.passed and "only counts compared" in mb.detail
    assert regroup_step(False, cand, ref) == 1  # a regrouping layout: from step 1, as before


def test_regrouping_layout_says_why_from_which_step_and_shows_both_groupings() -> None:
    dp2 = packed([[0, 1], [2]], [[3], [4, 5]])  # two DP groups per microbatch
    ref = with_packing(run(LOSS, ranks=1, grad=GRAD), [THREE] * 4)
    cand = with_packing(run(LOSS, grad=GRAD), [THREE, dp2, dp2, dp2])
    pair = reference_pair(False, regroup_reason="DP 2: each microbatch packs one bin per DP group")
    assert regroup_step(False, cand, ref) == 2
    v = one([pair], ref_data(cand, ref), **ranks())
    checks = by_name(v.pairs[0])
    assert v.status == "pass", v.pairs[0].failed_checks
    mb = checks["microbatches"]
    assert ("regroups tokens into other microbatches (DP 2: each microbatch packs one bin per DP "
            "group), from step 2") in mb.detail
    assert "the same sequences every step; 3 of 4 steps grouped otherwise" in mb.detail
    assert "step 2: cand 2 microbatches: CP1 [0 1] 20 + CP1 [2] 10 | CP1 [3] 10 + CP1 [4 5] 20" in mb.detail
    assert "from step 2" in checks["loss"].detail and "all 2 steps" in checks["loss"].detail
    # A regrouping that loses a sequence is no regrouping: it fails, naming the step.
    lost = packed([[0, 1], [2]], [[3], [4]])
    bad = one([pair], ref_data(with_packing(run(LOSS, grad=GRAD), [THREE, lost, dp2, dp2]),
                               with_packing(run(LOSS, ranks=1, grad=GRAD), [THREE] * 4)), **ranks())
    assert "microbatches" in [c.name for c in bad.pairs[0].failed_checks]
    assert "at step(s) 2 its microbatches do not hold the single rank's sequences" in \
        by_name(bad.pairs[0])["microbatches"].detail


def test_static_bins_explain_a_grouping_only_where_the_single_ranks_do_not_fit_them() -> None:
    bins = {"cp": 2, "seq_length": 40, "max_seqs": 2}
    ref = with_packing(run(LOSS, ranks=1, grad=GRAD), [FOUR, FOUR, THREE, FOUR])
    cand = with_packing(run(LOSS, grad=GRAD), [FOUR] * 4)
    # Step 3: the single rank's first microbatch holds 3 sequences, above max_seqs 2: explained.
    v = one([reference_pair(True, static_bins=bins)], ref_data(cand, ref), **ranks())
    checks = by_name(v.pairs[0])
    assert v.status == "pass", v.pairs[0].failed_checks
    assert "where the single rank's microbatches exceed its static bins (step 3: 3 sequences, " \
           "above max_seqs_per_microbatch 2)" in checks["microbatches"].detail
    assert "from step 3 (static bins)" in checks["loss"].detail and "loss_regrouped" in checks
    # Where the single rank's microbatches fit the bins, another grouping is a failure.
    loose = {"cp": 2, "seq_length": 400, "max_seqs": 8}
    bad = one([reference_pair(True, static_bins=loose)], ref_data(cand, ref), **ranks())
    assert [c.name for c in bad.pairs[0].failed_checks] == ["microbatches"]


def test_reference_pair_without_its_layout_params_is_refused_when_made() -> None:
    # Typed at plan time: a pair whose settings lack what the planner adds never gets to a run.
    with pytest.raises(ValueError, match="pair 'reference': bad reference settings: "
                                         "groups_like_reference"):
        Pair("reference", "reference", ("cand", "reference"), {})


def test_expected_ranks_per_arm() -> None:
    data = ref_data(run(LOSS), run(LOSS, ranks=1))
    assert one([reference_pair(True)], data, **ranks()).status == "pass"
    # With the case's world size for every arm, the one-rank reference arm misses rank 1.
    v = one([reference_pair(True)], data, expected_ranks=2)
    assert v.status == "fail"
    assert by_name(v.pairs[0])["reference.steps_complete"].detail == "missing rank 1: 1-4"


# --------------------------------------------------------------------------- grad norm in pairs
def test_dcp_vs_fixed_cp_compares_grad_norm() -> None:
    pair = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("dcp", "fixed-cp2"), {"fixed_cp": 2})
    bad = one([pair], {"dcp": (OK, run(LOSS, grad=[g * 1.001 for g in GRAD])),
                       "fixed-cp2": (OK, run(LOSS, grad=GRAD))})
    assert [c.name for c in bad.pairs[0].failed_checks] == ["grad_norm"]
    assert by_name(bad.pairs[0])["grad_norm"].bound == pytest.approx(2e-4)


def test_graph_pools_compares_loss_and_grad_norm_bitwise() -> None:
    pair = Pair("graph_pools", "graph_pools", ("graph", "graph-separate-pools"), {})
    v = one([pair], {"graph": (OK, run(LOSS, grad=GRAD)),
                     "graph-separate-pools": (OK, run(LOSS, grad=[*GRAD[:3], GRAD[3] + 1e-9]))})
    checks = by_name(v.pairs[0])
    assert checks["loss"].passed and not checks["grad_norm"].passed


# --------------------------------------------------------------------------- sanity
def names_failed(v) -> list[str]:
    return sorted(c.name for p in v.pairs for c in p.failed_checks)


def test_dead_model_fails_zero_grad_and_stuck_loss() -> None:
    vocab = math.log(256)
    dead = run([5.9, vocab, vocab, vocab], grad=[3.0, 0.0, 0.0, 0.0])
    v = one([], {"eager": (OK, dead)})
    assert v.status == "fail"
    assert names_failed(v) == ["eager.grad_norm_nonzero", "eager.loss_moves"]
    checks = by_name(v.pairs[0])
    assert checks["eager.grad_norm_nonzero"].value == 6  # steps 2-4 on 2 ranks
    assert "step(s) 3-4" in checks["eager.loss_moves"].detail


def test_loss_spike_beyond_the_factor_fails() -> None:
    v = one([], {"eager": (OK, run([2.5, 2.0, 3.1, 2.0]))})
    assert names_failed(v) == ["eager.loss_spike"]
    spike = by_name(v.pairs[0])["eager.loss_spike"]
    assert spike.value == pytest.approx(3.1 / 2.0) and spike.bound == 1.5
    assert one([], {"eager": (OK, run([2.5, 2.0, 2.9, 2.0]))}).status == "pass"


def test_sanity_checks_switch_off_one_by_one() -> None:
    dead = run([5.9, 5.5, 5.5, 9.0], grad=[3.0, 0.0, 0.0, 0.0])
    off = SanitySpec(grad_norm_nonzero=False, loss_moves=False, loss_spike_factor=None,
                     cp_balance=None)
    assert sanity_checks("eager", dead, off) == ()
    assert one([], {"eager": (OK, dead)}, sanity=off).status == "pass"
    only_spike = SanitySpec(grad_norm_nonzero=False, loss_moves=False, cp_balance=None)
    assert [c.name for c in sanity_checks("eager", dead, only_spike)] == ["eager.loss_spike"]


def test_one_step_run_has_nothing_to_move() -> None:
    checks = {c.name: c for c in sanity_checks("eager", run([2.0]), SanitySpec())}
    assert not checks["eager.loss_moves"].applicable and not checks["eager.loss_spike"].applicable
    assert checks["eager.grad_norm_nonzero"].passed


# --------------------------------------------------------------------------- golden
def golden_pair(where: Path, steps: int = 4, **params) -> Pair:
    """The golden pair the planner makes: the files of ``where`` as they are now, copied."""
    return Pair("golden", "golden", ("eager",), {**params, "golden_dir": str(where),
                                                 "case_id": "c1", "steps": steps,
                                                 "files": snapshot_golden(where, "c1")})


def test_golden_file_layout_is_megatrons(tmp_path: Path) -> None:
    data = run(LOSS, grad=GRAD)
    path = write_golden(golden_file(tmp_path, "c1", "cpu"), data)
    assert path == tmp_path / "c1" / "golden_values_cpu.json"
    doc = json.loads(path.read_text())
    # step time on every platform, no memory on CPU
    assert sorted(doc) == ["aux loss", "grad norm", "iteration-time", "lm loss"]
    assert doc["lm loss"] == {"start_step": 1, "end_step": 4, "step_interval": 1,
                              "values": {"1": 2.5, "2": 2.31, "3": 2.2, "4": 2.1}}
    assert read_golden(path).series("grad norm") == {1: 0.9, 2: 0.8, 3: 0.7, 4: 0.6}
    assert platform_of(data) == "cpu" and platform_of({0: [record(1, device="cuda:3")]}) == "cuda"
    # records name the GPU they ran on (rank_main): goldens are kept per GPU generation
    assert platform_of({0: [record(1, device="cuda:0", platform="h200")]}) == "h200"
    mem = run(LOSS, mem=4.0 * 2**30)
    assert golden_values(mem)["mem-max-allocated-bytes"]["values"]["4"] == 4.0 * 2**30


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"), ("NVIDIA GB200", "gb200"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA L40S", "l40s"), ("Tesla V100-SXM2-16GB", "v100"),
])
def test_platform_key_names_the_gpu_generation(name: str, key: str) -> None:
    assert platform_key(name) == key


def test_a_platform_without_golden_values_is_skipped_with_the_record_command(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS, grad=GRAD))
    h200 = run(LOSS, grad=GRAD, at={s: {"platform": "h200"} for s in range(1, 5)})
    v = one([golden_pair(tmp_path)], {"eager": (OK, h200)}, sweep_dir="/sw")
    (entry, arm_checks) = v.pairs
    assert entry.status == "skipped" and v.status == "pass"  # the arm's own checks still ran
    assert f"no golden values for platform 'h200' at {tmp_path}/c1/golden_values_h200.json" in entry.error
    assert "(recorded platforms: cpu)" in entry.error
    assert "`dcp-harness golden record /sw --case c1 --platform h200`" in entry.error
    assert arm_checks.pair == "checks" and arm_checks.status == "pass" and arm_checks.arms == ("eager",)
    # A case that requires golden values: the same reason is an error.
    required = one([golden_pair(tmp_path, required=True)], {"eager": (OK, h200)})
    assert required.status == "error" and "compare.golden.required" in required.pairs[0].error


def test_judging_reads_the_copy_made_when_planned_not_the_file(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS, grad=GRAD))
    pair = golden_pair(tmp_path)  # copied now
    golden_file(tmp_path, "c1", "cpu").unlink()
    data = {"eager": (OK, run(LOSS, grad=GRAD))}
    assert one([pair], data).status == "pass"
    copy = pair.params.files["cpu"]
    assert copy.path == str(golden_file(tmp_path, "c1", "cpu")) and len(copy.sha256) == 64


def test_a_crashed_arm_is_not_blamed_on_the_golden_values(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS, grad=GRAD))
    crashed = ArmOutcome(status="failed", returncode=1, detail="rank 0 exited with signal 9")
    v = one([golden_pair(tmp_path)], {"eager": (crashed, run(LOSS[:2], grad=GRAD[:2]))})
    entry = v.pairs[0]
    assert entry.status == "error" and "train.steps changed" not in entry.error
    assert "arm 'eager' failed" in entry.error
    assert by_name(entry)["loss"].passed  # the two steps it made match
    assert not by_name(entry)["eager.steps_complete"].passed


def test_golden_check_passes_fails_and_errors(tmp_path: Path) -> None:
    data = {"eager": (OK, run(LOSS, grad=GRAD))}
    missing = one([golden_pair(tmp_path)], data)
    assert missing.pairs[0].status == "skipped" and "no golden values for platform 'cpu'" in missing.pairs[0].error
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS, grad=GRAD))
    good = one([golden_pair(tmp_path)], data)
    assert good.status == "pass"
    checks = by_name(good.pairs[0])
    assert checks["loss"].value == 0 and not checks["mem_max_allocated_bytes"].applicable
    moved = {"eager": (OK, run(LOSS, grad=GRAD, aux=[0.01, 0.0101, 0.01, 0.01]))}
    bad = one([golden_pair(tmp_path)], moved)
    assert bad.status == "fail" and [c.name for c in bad.pairs[0].failed_checks] == ["aux_loss"]
    # A declared platform picks another file, which is missing: skipped (never a pass), an
    # error when the case requires golden values.
    other = one([golden_pair(tmp_path, platform="h200")], data)
    assert other.pairs[0].status == "skipped" and "golden_values_h200.json" in other.pairs[0].error
    other = one([golden_pair(tmp_path, platform="h200", required=True)], data)
    assert other.status == "error" and "golden_values_h200.json" in other.pairs[0].error


def test_golden_that_does_not_cover_the_run_is_an_error(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS[:3]))
    v = one([golden_pair(tmp_path)], {"eager": (OK, run(LOSS))})
    assert v.status == "error" and "runs to step 3, the case to train.steps 4" in v.pairs[0].error
    path = golden_file(tmp_path, "c1", "cpu")
    doc = json.loads(path.read_text())
    del doc["lm loss"]["values"]["2"]
    path.write_text(json.dumps(doc))
    v = one([golden_pair(tmp_path, steps=3)], {"eager": (OK, run(LOSS[:3]))}, expected_steps=3)
    assert v.status == "error" and "no value for step(s) 2" in v.pairs[0].error
    doc["lm loss"]["values"]["2"] = LOSS[1]
    del doc["grad norm"]
    path.write_text(json.dumps(doc))
    v = one([golden_pair(tmp_path, steps=3)], {"eager": (OK, run(LOSS[:3]))}, expected_steps=3)
    assert v.status == "error" and "no metric 'grad norm'" in v.pairs[0].error
    path.write_text("{not json")
    with pytest.raises(GoldenError, match="unreadable"):
        read_golden(path)
    v = one([golden_pair(tmp_path, steps=3)], {"eager": (OK, run(LOSS[:3]))}, expected_steps=3)
    assert v.status == "error" and "unreadable golden values" in v.pairs[0].error


def test_golden_memory_is_checked_where_cuda_recorded_it(tmp_path: Path) -> None:
    write_golden(golden_file(tmp_path, "c1", "cpu"), run(LOSS, mem=1000.0))
    grown = {"eager": (OK, run(LOSS, mem=1100.0))}  # +10% > the default 1%
    v = one([golden_pair(tmp_path)], grown)
    failed = [c.name for c in v.pairs[0].failed_checks]
    # peak allocated per step, and the device used at the memory probe (the last step)
    assert failed == ["mem_max_allocated_bytes", "mem_device_used_bytes"]
    assert one([golden_pair(tmp_path, memory=None)], grown).status == "pass"
