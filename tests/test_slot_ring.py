"""compare.slot_ring: graph memory flat in the microbatch count, from the slot planner (any
machine) and from the graph arms' capture statistics (CUDA; hand-made records here)."""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.compare.contracts.slot_ring as slot_ring
from harness.arms import plan_case
from harness.compare import Pair, evaluate_case
from harness.compare.ring import growth, wrapping_from
from harness.errors import CaseError
from harness.results import ArmOutcome
from harness.spec.loader import load_cases
from tests.records import graph_stats, record

REPO = Path(__file__).resolve().parents[1]
RING = REPO / "cases/focused/gpu2-slot-ring-pp2-vpp2.yaml"
OK = ArmOutcome(status="ok", returncode=0)
MIB = 2 ** 20


def test_the_fill_rule() -> None:
    assert wrapping_from({2: 2, 4: 4, 6: 4, 8: 4}) == 6
    assert wrapping_from({2: 2, 4: 4}) is None
    assert growth({6: 4.0, 8: 4.0, 12: 5.0}, 6, relative=False) == (1.0, 12)
    assert growth({6: 100.0, 8: 110.0}, 6, relative=True) == (pytest.approx(0.1), 8)


def test_the_focused_case_plans_flat_figures_and_one_graph_arm_per_count() -> None:
    (case,) = load_cases([RING])
    plan = plan_case(case)
    assert plan.arm_names == ("graph-mb4", "graph-mb8", "graph-mb12", "graph-mb16")
    assert [a.case.train.microbatches for a in plan.arms] == [4, 8, 12, 16]
    assert all(a.kind == "graph" and a.case.execution.graphed for a in plan.arms)
    ring_plan, ring = plan.pairs
    assert (ring_plan.name, ring_plan.arms, ring.name) == ("slot_ring-plan", (), "slot_ring")
    assert ring.params.counts == [4, 8, 12, 16]
    by = {c.microbatches: c.ranks for c in ring_plan.params.planned}
    assert [r.physical_slots for r in by[16]] == [4, 4]  # the ring: 4 slots, not 16
    v = evaluate_case(case.id, plan.pairs, {}, expected_steps=case.train.steps)
    entry = v.pairs[0]
    assert entry.status == "pass"
    checks = {c.name: c for c in entry.checks}
    assert set(checks) == {"physical_slots_flat", "saved_arenas_flat", "grad_arenas_flat"}
    # 4 microbatches fit the 4-slot ring; from 8 on the ring wraps and nothing grows (6 saved
    # arenas on rank 0 at 8, 12, 16; 5 at 4, before the ring is full).
    assert "the ring wraps from 8 microbatches on" in checks["saved_arenas_flat"].detail
    assert "r0: 5 at 4, 6 at 8, 6 at 12, 6 at 16" in checks["saved_arenas_flat"].detail


def test_a_planner_that_grows_with_the_count_fails(monkeypatch) -> None:
    real = slot_ring.ring_figures

    def per_microbatch(case):  # one slot (and saved arena) per microbatch: the old problem
        out = real(case)
        m = case.train.microbatches
        return [{**r, "saved_arenas": r["saved_arenas"] + m} for r in out]

    monkeypatch.setattr(slot_ring, "ring_figures", per_microbatch)
    (case,) = load_cases([RING])
    plan = plan_case(case)
    v = evaluate_case(case.id, plan.pairs[:1], {}, expected_steps=case.train.steps)
    entry = v.pairs[0]
    assert entry.status == "fail" and [c.name for c in entry.failed_checks] == ["saved_arenas_flat"]
    check = entry.failed_checks[0]
    assert check.value == 8 and "rank 0 has +8 at 16 against 8" in check.detail


def _arm(slots: int, pool: float, arena: float) -> dict:
    stats = graph_stats(pool * MIB, pool * MIB, 1, physical_slots=slots, variants=1,
                        arena_bytes=int(arena * MIB))
    recs = [record(s, 2.0 - 0.1 * s, graphed=s > 2, graph_stats=stats if s == 3 else None)
            for s in range(1, 6)]
    return {0: recs, 1: list(recs)}


def _bytes_pair(counts: list[int]) -> Pair:
    return Pair("slot_ring", "slot_ring", tuple(f"graph-mb{m}" for m in counts),
                {"microbatches": counts, "counts": counts})


def test_graph_pool_bytes_flat_once_the_ring_wraps() -> None:
    counts = [4, 8, 12, 16]
    flat = {f"graph-mb{m}": (OK, _arm(4, 100.0 if m > 4 else 80.0, 60.0)) for m in counts}
    v = evaluate_case("r", [_bytes_pair(counts)], flat, expected_steps=5, expected_ranks=2)
    assert v.pairs[0].status == "pass", v.pairs[0]
    checks = {c.name: c for c in v.pairs[0].checks}
    assert checks["graph_pool_flat"].value == 0 and checks["graph_pool_flat"].bound == 0.01
    assert "from 8 microbatches on (the ring wraps there" in checks["graph_pool_flat"].detail
    # One buffer set per microbatch: the pool grows with the count and fails.
    grows = {f"graph-mb{m}": (OK, _arm(4, 10.0 * m, 60.0)) for m in counts}
    bad = evaluate_case("r", [_bytes_pair(counts)], grows, expected_steps=5, expected_ranks=2)
    assert [c.name for c in bad.pairs[0].failed_checks] == ["graph_pool_flat"]
    assert bad.pairs[0].failed_checks[0].value == pytest.approx(1.0)  # 160 MiB vs 80 MiB
    # Fewer than two counts past the ring: not applicable, with what to add.
    few = {f"graph-mb{m}": (OK, _arm(8, 100.0, 60.0)) for m in (4, 8)}
    na = evaluate_case("r", [_bytes_pair([4, 8])], few, expected_steps=5, expected_ranks=2)
    assert all(not c.applicable for c in na.pairs[0].checks if not c.name.startswith("graph-mb"))
    assert "add larger counts" in na.pairs[0].checks[-1].detail


@pytest.mark.parametrize("change, field, message", [
    ({"graphs": None}, "compare.slot_ring", "add a `graphs:` section"),
    ({"parallel": {"pp": 2, "vpp": 2, "dynamic_cp": [1, 2]}}, "compare.slot_ring", "fixed CP"),
    ({"parallel": {"pp": 1}, "model": {"preset": "tiny", "layers": 2},
      "resources": {"gpus_per_node": 1}}, "compare.slot_ring", "parallel.pp >= 2"),
    ({"compare": {"slot_ring": {"microbatches": [4, 32]}}}, "compare.slot_ring.microbatches",
     "count 32: more microbatches than sequences"),
])
def test_preflight_names_what_a_slot_ring_case_needs(tmp_path: Path, change, field, message) -> None:
    import yaml

    data = yaml.safe_load(RING.read_text())
    data.update(change)
    if data.get("graphs") is None:
        data.pop("graphs")
    if "dynamic_cp" in data["parallel"]:
        data["train"]["max_seqlen_per_rank"] = 128
    path = tmp_path / "ring.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CaseError) as err:
        load_cases([path])
    assert f"field '{field}'" in str(err.value) and message in str(err.value)


def test_the_worst_growth_over_ranks_names_its_rank_and_count() -> None:
    from harness.compare.ring import not_wrapped, worst_growth, wrapped_counts

    assert wrapped_counts({2: 2, 4: 4, 6: 4, 8: 4}) == (6, [6, 8])
    assert wrapped_counts({2: 2, 4: 4}) == (None, [])
    per_rank = {0: {6: 4.0, 8: 5.0, 12: 4.0}, 1: {6: 4.0, 8: 4.0, 12: 7.0},
                2: {6: 4.0, 8: 6.0, 12: 4.0}}
    assert worst_growth(per_rank, 6, relative=False) == (3.0, 12, 1)
    assert worst_growth({0: {6: 100.0, 8: 100.0}, 1: {6: 100.0, 8: 150.0}}, 6,
                        relative=True) == (pytest.approx(0.5), 8, 1)
    # Nothing grows: the first rank is named, at the first count past the start.
    assert worst_growth({0: {6: 4.0, 8: 4.0}, 1: {6: 4.0, 8: 3.0}}, 6, relative=False) == (0.0, 8, 0)
    assert not_wrapped("4 slots at 4") == (
        "fewer than two counts outnumber the slot ring (4 slots at 4); add larger counts to "
        "compare.slot_ring.microbatches")
