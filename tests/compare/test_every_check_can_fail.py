"""Every check can fail. For every contract of the registry (``CONTRACTS``) and the checks every
arm gets (``arm_checks``, ``packing``, the sanity checks, through ``evaluate_case``) there is a
clean input on which every check passes, and for every check it produces at least one fault
(``tests.compare.scenarios``) that fails it; two-sided checks fail on both sides. A contract or a
check added without such inputs fails here. A value without a bound is a figure
(``Check.figure``), never a passed check."""

from __future__ import annotations

from harness.results import AttentionWork

import dataclasses

from typing import Any, Callable

import pytest

from harness.compare import CONTRACTS, Check, PackingRule, evaluate_case
from harness.results import ArmOutcome, read_typed, record_json
from harness.spec.layout import ParallelLayout

from tests.compare import scenarios as sc
from tests.compare.scenarios import AFTER, Fault, at, bump, every, nested, params, scaled
from tests.records import changed

Make = Callable[[], sc.Scenario]

CLEAN: dict[str, Make] = {
    "repeat": sc.repeat, "graph_vs_eager": sc.graph_vs_eager, "dcp_vs_fixed_cp": sc.dcp_vs_fixed_cp,
    "graph_pools": sc.graph_pools, "reference": sc.reference, "golden": sc.golden_gpu,
    "resume": sc.resume, "slot_ring": sc.slot_ring, "slot_ring_plan": sc.slot_ring_plan,
    "oracle": sc.oracle,
}
# Values each contract reports without a bound (figures, never checks).
# bounded as declared (graph_vs_eager's are bounded by default)
STEP_MEMORY_FIGURES = {"allocated_delta_pct", "max_allocated_delta_pct"}
FIGURES: dict[str, set[str]] = {
    "graph_vs_eager": {"capture", "graph_pool_bytes", "device_delta_pct"},
    "dcp_vs_fixed_cp": {"graph_pool_bytes", *STEP_MEMORY_FIGURES}}


def oracle_at(step: int, **fields: Any) -> Fault:
    """The oracle's entry of ``step`` with ``fields`` changed (the oracle saw otherwise)."""
    def fault(pair, data):
        recs = {r: [dataclasses.replace(x, oracle=dataclasses.replace(x.oracle, **fields))
                    if x.step == step else x for x in rs] for r, rs in data["oracle"].items()}
        return pair, {**data, "oracle": recs}
    return fault


def _worse_and_better(name: str, scale: Callable[[float], Fault]) -> list[tuple[str, Fault]]:
    return [(f"{name}-worse", scale(1.5)), (f"{name}-better", scale(0.5))]


def _memory_faults() -> dict[str, list[tuple[str, Fault]]]:
    per_step = {"mem_allocated_bytes": "allocated_bytes",
                "mem_max_allocated_bytes": "max_allocated_bytes",
                "mem_reserved_bytes": "reserved_bytes"}
    out = {check: _worse_and_better(check, lambda f, k=field: scaled("graph", f, k))
           for check, field in per_step.items()}
    out["mem_graph_pool_bytes"] = _worse_and_better(
        "pool", lambda f: nested("graph", "graph_stats", f, "pool_reserved_bytes"))
    out["mem_device_used_bytes"] = _worse_and_better(
        "device", lambda f: nested("graph", "memory_probe", f, "device_used_bytes"))
    return out


def _growth_faults(cand: str, ref: str) -> list[tuple[str, Fault]]:
    """A leak in either arm of a pair (allocated bytes up 10 % at the last step), and a CUDA arm
    that recorded no allocated bytes at all."""
    return [(f"{cand}-leaks", at(cand, sc.STEPS, allocated_bytes=int(4.4 * sc.GIB))),
            (f"{ref}-leaks", at(ref, sc.STEPS, allocated_bytes=int(4.4 * sc.GIB))),
            ("none-on-cuda", every(cand, allocated_bytes=None))]


# contract -> check -> (fault id, fault) that fail it
FAULTS: dict[str, dict[str, list[tuple[str, Fault]]]] = {
    "repeat": {"loss": [("ulp", bump("eager-repeat", 2, "loss", 1e-12))],
               "grad_norm": [("ulp", bump("eager-repeat", 2, "grad_norm", 1e-12))]},
    "graph_vs_eager": {
        "loss": [("ulp", bump("graph", 2, "loss", 1e-12))],
        "aux_loss": [("ulp", bump("graph", 2, "aux_loss", 1e-12))],
        "grad_norm": [("ulp", bump("graph", 2, "grad_norm", 1e-12))],
        "variants_replayed": [("cp2-never", every("graph", replays=sc.BOTH[:1])),
                              ("never-captured", at("graph", 1, graph_stats=None))],
        "allocated_growth_pct": _growth_faults("graph", "eager"),
        # bounded by default: a graph arm holding 44 times the eager arm's memory
        "allocated_delta_pct": [("44x", every("graph", allocated_bytes=176 * sc.GIB))],
        "max_allocated_delta_pct": [("44x", every("graph", max_allocated_bytes=220 * sc.GIB))]},
    "dcp_vs_fixed_cp": {
        "loss": [("1e-2", bump("graph", 2, "loss", 1e-2))],
        "aux_loss": [("1e-1", bump("graph", 2, "aux_loss", 1e-1))],
        "grad_norm": [("1e-3", bump("graph", 2, "grad_norm", 1e-3))],
        "device_delta_pct": [("te3353", nested("graph", "memory_probe", 1.05, "device_used_bytes")),
                             ("no-probe-on-cuda", at("graph", 4, memory_probe=None))],
        "active_delta_pct": [("10pct", nested("graph", "memory_probe", 1.1, "active_bytes"))],
        "reserved_delta_pct": [("10pct", nested("graph", "memory_probe", 1.1, "reserved_bytes"))],
        "allocated_growth_pct": _growth_faults("graph", "graph-fixed-cp2")},
    "graph_pools": {
        "pool_ratio": [("1.1", nested("graph", "graph_stats", 1.1, "pool_reserved_bytes"))],
        "loss": [("ulp", bump("graph", 3, "loss", 1e-12))],
        "grad_norm": [("ulp", bump("graph", 3, "grad_norm", 1e-12))]},
    "reference": {
        "microbatches": [("lost-sequence", at("dcp", 4, packed=(
            sc.packed((0, 2)), sc.packed((1, 1)))))],
        "loss": [("step1", bump("dcp", 1, "loss", 1e-5)), ("at-regroup", bump("dcp", 3, "loss", 1e-5))],
        "grad_norm": [("step2", bump("dcp", 2, "grad_norm", 1e-5))],
        "aux_loss": [("step1", bump("dcp", 1, "aux_loss", 1e-5))],
        "loss_regrouped": [("1e-2", bump("dcp", 4, "loss", 1e-2))],
        "grad_norm_regrouped": [("1e-3", bump("dcp", 3, "grad_norm", 1e-3))]},
    "golden": {
        "loss": [("1e-3", bump("graph", 2, "loss", 1e-3))],
        "aux_loss": [("1e-3", bump("graph", 2, "aux_loss", 1e-3))],
        "grad_norm": [("1e-3", bump("graph", 2, "grad_norm", 1e-3))],
        "step_time": _worse_and_better("time", lambda f: scaled("graph", f, "step_time_s")),
        **_memory_faults()},
    "oracle": {
        "loss": [("off", oracle_at(2, loss=sc.LOSS[1] * (1 + 1e-4)))],
        "logits": [("off", oracle_at(3, logits_rel=1e-2))],
        "grads": [("off", oracle_at(1, grads_rel=0.2))],
        "grad_norm": [("off", oracle_at(4, grad_norm=sc.GRAD[3] * 1.01))],
        "params": [("off", oracle_at(2, params_rel=1e-3)), ("none", oracle_at(2, params_rel=None))],
        "aux_loss": [("off", oracle_at(1, aux_loss=sc.AUX[0] * 1.001))],
        "lr": [("warmup-ahead", oracle_at(1, lr=sc.LR)), ("none", oracle_at(3, lr=None))]},
    "resume": {
        "resumed_after": [("from-scratch", at("graph-resumed", AFTER + 1, resumed_from=None))],
        "loaded_checkpoint": [("metadata", at("graph-resumed", AFTER + 1, checkpoint_step=1))],
        "optimizer_state": [
            ("moments-lost", at("graph-resumed", AFTER + 1, loaded_state=dataclasses.replace(
                sc.STATE, optimizer="0000000000000000"))),
            ("none-after-load", at("graph-resumed", AFTER + 1, loaded_state=None))],
        "rng_state": [("rng-not-restored", at("graph-resumed", AFTER + 1, loaded_state=(
            dataclasses.replace(sc.STATE, rng="0000000000000000"))))],
        "recaptured": [("no-capture", at("graph-resumed", AFTER + 1, graph_stats=None))],
        "loss_before_stop": [("ulp", bump("graph-resumed", 1, "loss", 1e-12))],
        "loss": [("ulp", bump("graph-resumed", 4, "loss", 1e-12))],
        "aux_loss": [("ulp", bump("graph-resumed", 4, "aux_loss", 1e-12))],
        "grad_norm": [("ulp", bump("graph-resumed", 4, "grad_norm", 1e-12))],
        # the warmup started again after the load: the first step after the stop at half rate
        "lr": [("warmup-restarted", at("graph-resumed", AFTER + 1, lr=1.5e-3))],
        # memory only the loaded run holds (a state dict kept alive)
        "allocated_after_load_pct": [
            ("leak-after-load", at("graph-resumed", sc.STEPS, allocated_bytes=int(4.4 * sc.GIB))),
            ("none-on-cuda", every("graph-resumed", allocated_bytes=None))]},
    "slot_ring": {
        "physical_slots_flat": [("slot", sc.ring_arm("graph-mb8", slots=3))],
        "graph_pool_flat": [("10pct", sc.ring_arm("graph-mb8", pool_mib=110.0))],
        "arena_bytes_flat": [("10pct", sc.ring_arm("graph-mb8", arena_mib=88.0))]},
    "slot_ring_plan": {
        "physical_slots_flat": [("slot", sc.planned_at(8, physical_slots=3))],
        "saved_arenas_flat": [("arena", sc.planned_at(8, saved_arenas=4))],
        "grad_arenas_flat": [("arena", sc.planned_at(8, grad_arenas=3))]},
}


def judge(contract: str, fault: Fault = lambda pair, data: (pair, data)) -> dict[str, Check]:
    pair, data = fault(*CLEAN[contract]())
    checks = CONTRACTS[pair.contract](pair, data)
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), f"{contract}: a check named twice: {names}"
    return {c.name: c for c in checks}


def test_every_contract_of_the_registry_has_a_clean_input_and_faults() -> None:
    assert set(CONTRACTS) == set(CLEAN) == set(FAULTS), (
        "a contract needs a clean input (CLEAN) and a fault for each of its checks (FAULTS)")


@pytest.mark.parametrize("contract", sorted(CLEAN))
def test_the_clean_input_passes_every_check_and_a_figure_is_no_check(contract: str) -> None:
    checks = judge(contract)
    figures = FIGURES.get(contract, set())
    assert set(checks) == set(FAULTS[contract]) | figures, (
        f"{contract}: every check it produces needs a fault here (figures: FIGURES)")
    for name, c in checks.items():
        if name in figures:
            assert c.figure and c.passed and c.bound is None, c
        else:
            assert c.passed and c.applicable and not c.figure and c.bound is not None, c


CASES = [(contract, check, fid, fault) for contract, checks in FAULTS.items()
         for check, faults in checks.items() for fid, fault in faults]


@pytest.mark.parametrize("contract, check, fid, fault", CASES,
                         ids=[f"{c}-{k}-{f}" for c, k, f, _ in CASES])
def test_each_check_fails_on_its_fault(contract: str, check: str, fid: str, fault: Fault) -> None:
    assert FAULTS[contract][check], f"{contract}.{check} has no fault"
    got = judge(contract, fault)[check]
    assert not got.passed and got.applicable and not got.figure, got


# --------------------------------------------------------------------------- every arm's checks
LAYOUT = ParallelLayout(nodes=1, gpus_per_node=2, seq_length=64, global_batch=4, cp_sizes=(2,))
ONE = (sc.packed((0, 1, 2, 3), cp=2),)  # one microbatch: a CP2 group of the 4 sequences


def arm_entry(fault: Fault = lambda pair, data: (pair, data)) -> dict[str, Check]:
    """The ``checks`` entry of a case whose only arm is ``eager`` (2 ranks, 4 steps)."""
    clean = sc.arm(every={"packed": ONE, "microbatches": 1, "tokens": 40,
                          "attention_work": (AttentionWork(0, 0, 2, 420),)})
    _, data = fault(None, {"eager": clean})  # type: ignore[arg-type]
    ok = ArmOutcome(status="ok", returncode=0)
    v = evaluate_case("c", [], {"eager": (ok, data["eager"])}, expected_steps=sc.STEPS,
                      expected_ranks=2, packing={"eager": PackingRule(LAYOUT)})
    (entry,) = v.pairs
    return {c.name: c for c in entry.checks}


ARM_FAULTS: dict[str, list[tuple[str, Fault]]] = {
    "eager.steps_complete": [("missing", sc.dropped("eager", 1, 3)),
                             ("duplicated", sc.duplicated("eager", 0))],
    "eager.no_nan_inf": [("nan-loss", at("eager", 2, loss=float("nan"), nan=True)),
                         ("inf-grad", at("eager", 2, grad_norm=float("inf")))],
    "eager.no_skipped_step": [("skipped", at("eager", 3, skipped=True))],
    "eager.ranks_agree": [("rank1-loss", sc.on_rank("eager", 1, 2, loss=sc.LOSS[1] * (1 + 1e-15))),
                          ("rank1-skipped", sc.on_rank("eager", 1, 3, skipped=True)),
                          ("rank0-microbatches", sc.on_rank("eager", 0, 4, microbatches=2))],
    "eager.packing": [("twice", at("eager", 2, packed=(sc.packed((0, 1, 2, 3, 3), cp=2),)))],
    "eager.cp_balance": [("contiguous-split", sc.on_rank("eager", 1, 2, attention_work=(
        AttentionWork(0, 0, 2, 620),)))],
    "eager.grad_norm_nonzero": [("zero", at("eager", 2, grad_norm=0.0))],
    "eager.loss_moves": [("stuck", at("eager", 3, loss=sc.LOSS[1]))],
    "eager.loss_spike": [("spike", at("eager", 4, loss=10.0))],
}


def test_the_clean_arm_passes_every_check_every_arm_gets() -> None:
    checks = arm_entry()
    assert set(checks) == set(ARM_FAULTS), "every check an arm gets needs a fault in ARM_FAULTS"
    for c in checks.values():
        assert c.passed and c.applicable and not c.figure and c.bound is not None, c


ARM_CASES = [(check, fid, fault) for check, faults in ARM_FAULTS.items() for fid, fault in faults]


@pytest.mark.parametrize("check, fid, fault", ARM_CASES, ids=[f"{c}-{f}" for c, f, _ in ARM_CASES])
def test_each_arm_check_fails_on_its_fault(check: str, fid: str, fault: Fault) -> None:
    got = arm_entry(fault)[check]
    assert not got.passed and got.applicable, got


# --------------------------------------------------------------------------- figures
def test_a_memory_delta_without_a_bound_is_a_figure_and_graph_arms_get_te3353s() -> None:
    pair, data = sc.dcp_vs_fixed_cp()
    bare = params(active_delta_pct=None, reserved_delta_pct=None)(pair, data)
    checks = CONTRACTS["dcp_vs_fixed_cp"](*bare)
    by = {c.name: c for c in checks}
    for name in ("active_delta_pct", "reserved_delta_pct"):
        assert by[name].figure and by[name].bound is None and "a figure" in by[name].detail
    device = by["device_delta_pct"]
    assert not device.figure and device.bound == 0.10 and "TE PR #3353" in device.detail
    # Eager arms: no measured bound for the device delta either: a figure.
    eager = {a: changed(d, {s: {"graphed": False, "replays": (), "graph_stats": None}
                               for s in range(1, sc.STEPS + 1)}) for a, d in data.items()}
    by = {c.name: c for c in CONTRACTS["dcp_vs_fixed_cp"](bare[0], eager)}
    assert by["device_delta_pct"].figure and by["device_delta_pct"].bound is None
    assert not by["graph_pool_bytes"].applicable
    # A declared bound wins over the default, and says where it comes from.
    declared = params(device_delta_pct=1.0)(pair, data)
    device = {c.name: c for c in CONTRACTS["dcp_vs_fixed_cp"](*declared)}["device_delta_pct"]
    assert device.bound == 1.0 and "compare.dcp_vs_fixed_cp.device_delta_pct" in device.detail


def test_a_figure_round_trips_through_the_verdict_file() -> None:
    figure = Check.figure_of("capture", None, "r0: 2 variants")
    assert record_json(figure)["figure"] is True and read_typed(Check, record_json(figure), "check") == figure
    assert "figure" not in record_json(Check("loss", 0.0, 0.0, True))
