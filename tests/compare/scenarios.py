"""A clean input of every contract (a pair and its arms' step records, on which every check
passes) and faults that change one thing in it: what ``test_every_check_can_fail`` judges.

A fault is a function of (pair, arm -> records) to the same, made by :func:`bump`, :func:`at`,
:func:`every` or :func:`params`. Records are hand-made (``tests.records``); no training."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from harness.compare import Pair
from harness.compare.contracts.golden import GoldenPairParams
from harness.golden import GoldenCopy, golden_values
from harness.results import (FrameReplays, OracleStep, PackedGroup, PackedMicrobatch, StateDigest,
                             StepRecord)

from tests.records import GIB, changed, graph_stats, probe, record

Steps = dict[int, list[StepRecord]]
Data = dict[str, Steps]
Scenario = tuple[Pair, Data]
Fault = Callable[[Pair, Data], Scenario]

STEPS = 4
LOSS = (2.5, 2.31, 2.2, 2.1)
GRAD = (0.9, 0.8, 0.7, 0.6)
AUX = (1.02, 1.01, 1.0, 1.0)


def arm(ranks: int = 2, **at_step: Mapping[str, Any]) -> Steps:
    """An arm's records on ``ranks`` ranks: LOSS, GRAD, AUX on CPU, then the fields of ``every``
    step (``every={...}``) and of single steps (``s3={...}``: on step 3)."""
    def fields(s: int) -> dict[str, Any]:
        return {"grad_norm": GRAD[s - 1], "aux_loss": AUX[s - 1], "step_time_s": 0.2,
                "device": "cpu", "platform": "cpu", **at_step.get("every", {}),
                **at_step.get(f"s{s}", {})}

    recs = [record(s, **{"loss": LOSS[s - 1], **fields(s)}) for s in range(1, STEPS + 1)]
    return {r: list(recs) for r in range(ranks)}


# --------------------------------------------------------------------------- faults
def _each(data: Data, name: str, fn: Callable[[StepRecord], StepRecord]) -> Data:
    return {**data, name: {r: [fn(rec) for rec in recs] for r, recs in data[name].items()}}


def bump(name: str, step: int, field: str, rel: float) -> Fault:
    """``field`` of arm ``name``'s step ``step`` times ``1 + rel`` on every rank."""
    def fault(pair: Pair, data: Data) -> Scenario:
        return pair, _each(data, name, lambda r: dataclasses.replace(
            r, **{field: getattr(r, field) * (1 + rel)}) if r.step == step else r)
    return fault


def on_rank(name: str, rank: int, step: int, **fields: Any) -> Fault:
    """``fields`` set on arm ``name``'s step ``step`` of rank ``rank`` alone (the other ranks
    keep theirs: values every rank must share disagree)."""
    def fault(pair: Pair, data: Data) -> Scenario:
        recs = {r: [dataclasses.replace(x, **fields) if r == rank and x.step == step else x
                    for x in rs] for r, rs in data[name].items()}
        return pair, {**data, name: recs}
    return fault


def at(name: str, step: int, **fields: Any) -> Fault:
    """``fields`` set on arm ``name``'s step ``step`` on every rank."""
    def fault(pair: Pair, data: Data) -> Scenario:
        return pair, {**data, name: changed(data[name], {step: fields})}
    return fault


def every(name: str, **fields: Any) -> Fault:
    """``fields`` set on every step of arm ``name``."""
    def fault(pair: Pair, data: Data) -> Scenario:
        return pair, {**data, name: changed(data[name], {s: fields for s in range(1, STEPS + 1)})}
    return fault


def scaled(name: str, factor: float, *fields: str) -> Fault:
    """``fields`` (numbers) of every record of arm ``name`` times ``factor``."""
    def fault(pair: Pair, data: Data) -> Scenario:
        return pair, _each(data, name, lambda r: dataclasses.replace(r, **{
            f: type(getattr(r, f))(getattr(r, f) * factor) for f in fields
            if getattr(r, f) is not None}))
    return fault


def nested(name: str, field: str, factor: float, *keys: str) -> Fault:
    """``keys`` of arm ``name``'s ``field`` (a memory probe or capture statistics) times
    ``factor`` wherever it is recorded."""
    def fault(pair: Pair, data: Data) -> Scenario:
        def one(r: StepRecord) -> StepRecord:
            inner = getattr(r, field)
            if inner is None:
                return r
            return dataclasses.replace(r, **{field: dataclasses.replace(
                inner, **{k: int(getattr(inner, k) * factor) for k in keys})})
        return pair, _each(data, name, one)
    return fault


def dropped(name: str, rank: int, step: int) -> Fault:
    """Arm ``name``'s rank ``rank`` without its record of ``step``."""
    def fault(pair: Pair, data: Data) -> Scenario:
        steps = {r: [rec for rec in recs if (r, rec.step) != (rank, step)]
                 for r, recs in data[name].items()}
        return pair, {**data, name: steps}
    return fault


def duplicated(name: str, rank: int) -> Fault:
    """Arm ``name``'s rank ``rank`` with its last record written twice."""
    def fault(pair: Pair, data: Data) -> Scenario:
        recs = data[name][rank]
        return pair, {**data, name: {**data[name], rank: recs + recs[-1:]}}
    return fault


def params(**update: Any) -> Fault:
    """The pair with ``update`` in its settings."""
    def fault(pair: Pair, data: Data) -> Scenario:
        typed = type(pair.params).model_validate({**pair.params.model_dump(), **update})
        return dataclasses.replace(pair, params=typed), data
    return fault


# --------------------------------------------------------------------------- clean inputs
BOTH = (FrameReplays(1, 0, 4), FrameReplays(2, 1, 4))
STATS = graph_stats(100 * 2**20, 100 * 2**20, 1, arena_bytes=80 * 2**20)


def graph_arm(**at_step: Mapping[str, Any]) -> Steps:
    """A graph arm on CUDA: captured on step 1 (both CP variants replayed on every step), CUDA
    memory per step and the memory probe after the last step; ``at_step`` as :func:`arm`'s."""
    base: dict[str, dict[str, Any]] = {
        "every": {"device": "cuda:0", "platform": "h200", "graphed": True, "replays": BOTH,
                  "allocated_bytes": 4 * GIB, "max_allocated_bytes": 5 * GIB,
                  "reserved_bytes": 6 * GIB},
        "s1": {"graph_stats": STATS},
        "s4": {"memory_probe": probe(7 * GIB, total=140 * GIB, allocated=4 * GIB,
                                     reserved=6 * GIB)}}
    keys = set(base) | set(at_step)
    return arm(**{k: {**base.get(k, {}), **at_step.get(k, {})} for k in keys})


def repeat() -> Scenario:
    return Pair("repeat", "repeat", ("eager", "eager-repeat"), {}), \
        {"eager": arm(), "eager-repeat": arm()}


def eager_cuda_arm() -> Steps:
    """The eager arm of :func:`graph_arm` on CUDA: its memory, no graphs."""
    return graph_arm(every={"graphed": False, "replays": ()}, s1={"graph_stats": None})


def graph_vs_eager() -> Scenario:
    return Pair("graph_vs_eager", "graph_vs_eager", ("graph", "eager"), {}), \
        {"graph": graph_arm(), "eager": eager_cuda_arm()}


def dcp_vs_fixed_cp() -> Scenario:
    # active and reserved deltas declared (checks); the device delta by its default for graph arms
    pair = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("graph", "graph-fixed-cp2"),
                {"fixed_cp": 2, "active_delta_pct": 5.0, "reserved_delta_pct": 5.0})
    return pair, {"graph": graph_arm(), "graph-fixed-cp2": graph_arm()}


def graph_pools() -> Scenario:
    separate = graph_stats(170 * 2**20, 100 * 2**20, 2)
    return Pair("graph_pools", "graph_pools", ("graph", "graph-separate-pools"), {}), \
        {"graph": graph_arm(), "graph-separate-pools": graph_arm(s1={"graph_stats": separate})}


def packed(*groups: tuple[int, ...], lengths: int = 10, cp: int = 1) -> PackedMicrobatch:
    """One microbatch of CP ``cp`` groups of the given sequences, ``lengths`` tokens each."""
    return PackedMicrobatch(tuple(PackedGroup(cp, g, lengths * len(g), (lengths,) * len(g))
                                  for g in groups))


SINGLE = (packed((0, 1)), packed((2, 3)))  # the single rank's microbatches of every step
REGROUPED = (packed((0, 2)), packed((1, 3)))  # the DCP arm's from step 3 on: the same sequences


def reference() -> Scenario:
    """A DCP arm (aux loss on) that groups like the single rank on steps 1-2 and regroups from
    step 3: exact bounds up to the regrouping, the regrouped bounds after it."""
    pair = Pair("reference", "reference", ("dcp", "reference"),
                {"groups_like_reference": False, "aux_loss_coeff": 0.01,
                 "regroup_reason": "dynamic CP"})
    cand = arm(every={"packed": SINGLE, "microbatches": 2, "tokens": 40},
               s3={"packed": REGROUPED}, s4={"packed": REGROUPED, "loss": LOSS[3] * (1 + 5e-4),
                                             "aux_loss": 1.3})
    cand = changed(cand, {3: {"grad_norm": GRAD[2] * (1 + 1e-4)}})
    ref = arm(ranks=1, every={"packed": SINGLE, "microbatches": 2, "tokens": 40})
    return pair, {"dcp": cand, "reference": ref}


def golden_gpu() -> Scenario:
    """A graph arm on an H200 against golden values recorded from the same records."""
    run = graph_arm()
    copy = GoldenCopy(path="golden/c1/golden_values_h200.json", sha256="0" * 64,
                      document=golden_values(run))
    params_ = GoldenPairParams(arm="graph", case_id="c1", golden_dir="golden", steps=STEPS,
                               files={"h200": copy})
    return Pair("golden", "golden", ("graph",), params_), {"graph": run}


AFTER = 2  # the resume pair's stop


LR = 3e-3
ORACLE = OracleStep(loss=LOSS[0], aux_loss=AUX[0], grad_norm=GRAD[0], logits_rel=1e-6,
                    grads_rel=3e-6, params_rel=3e-6)


def oracle() -> Scenario:
    """The oracle arm whose every step the oracle matched to rounding."""
    def steps(s: int) -> dict[str, Any]:
        lr = LR * min(s, 2) / 2  # a warmup over two steps
        return {"lr": lr, "oracle": OracleStep(loss=LOSS[s - 1] * (1 + 5e-8), aux_loss=AUX[s - 1],
                                               grad_norm=GRAD[s - 1], logits_rel=1e-6,
                                               grads_rel=3e-6, params_rel=3e-6, lr=lr)}
    return (Pair("oracle", "oracle", ("oracle",), {}),
            {"oracle": arm(1, **{f"s{s}": steps(s) for s in range(1, STEPS + 1)})})


STATE = StateDigest(optimizer="0123456789abcdef", rng="fedcba9876543210")


def resume() -> Scenario:
    """A graph arm stopped after step 2 and resumed from that step's checkpoint (it captured
    again on step 3) against the same arm run straight through."""
    resumed = {"resumed_from": AFTER, "checkpoint_step": AFTER}
    lr = {"lr": 3.0e-3}
    straight = graph_arm(every=lr)
    again = graph_arm(every=lr, s2={"stop_state": STATE}, s3={**resumed, "graph_stats": STATS,
                                                               "loaded_state": STATE}, s4=resumed)
    return Pair("resume", "resume", ("graph-resumed", "graph"), {"after": AFTER}), \
        {"graph-resumed": again, "graph": straight}


RING_COUNTS = (2, 4, 8)  # 2 physical slots each: the ring wraps from 4 on


def _ring_arm(slots: int = 2, pool_mib: float = 100.0, arena_mib: float = 80.0) -> Steps:
    stats = graph_stats(pool_mib * 2**20, pool_mib * 2**20, 1, physical_slots=slots,
                        variants=1, arena_bytes=int(arena_mib * 2**20))
    return graph_arm(s1={"graph_stats": stats})


def slot_ring() -> Scenario:
    names = tuple(f"graph-mb{m}" for m in RING_COUNTS)
    pair = Pair("slot_ring", "slot_ring", names,
                {"microbatches": list(RING_COUNTS), "counts": list(RING_COUNTS)})
    return pair, {n: _ring_arm() for n in names}


def ring_arm(name: str, **figures: float) -> Fault:
    """Arm ``name`` of the slot ring with other capture figures (``_ring_arm``'s)."""
    def fault(pair: Pair, data: Data) -> Scenario:
        return pair, {**data, name: _ring_arm(**figures)}
    return fault


def slot_ring_plan() -> Scenario:
    planned = [{"microbatches": m, "ranks": [{"physical_slots": 2, "saved_arenas": 3,
                                              "grad_arenas": 2}] * 2} for m in RING_COUNTS]
    return Pair("slot_ring-plan", "slot_ring_plan", (),
                {"microbatches": list(RING_COUNTS), "planned": planned}), {}


def planned_at(count: int, **rank0: int) -> Fault:
    """The slot plan of rank 0 at ``count`` microbatches with ``rank0``'s figures."""
    def fault(pair: Pair, data: Data) -> Scenario:
        planned = [c.model_dump() for c in pair.params.planned]
        for c in planned:
            if c["microbatches"] == count:
                c["ranks"][0] = {**c["ranks"][0], **rank0}
        return params(planned=planned)(pair, data)
    return fault
