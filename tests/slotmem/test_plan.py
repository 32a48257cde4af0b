"""Slot planner: physical slots, liveness colours, CP variants, lockstep order, records, validate."""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.slotmem.colouring import dsatur
from harness.slotmem.liveness import ConflictBuilder, OrderSet, OutstandingCounter, walk_orders
from harness.slotmem.plan import (
    PipelinePlan,
    SlotPlan,
    cp_variants,
    layers_per_rank,
    lockstep_order,
    plan_pipeline,
    required_slots,
)
from harness.slotmem.planerrors import PlanError, ScheduleError, SlotPeriodError
from harness.slotmem.records import COMPACT_FIELDS, SlotRecord
from harness.slotmem.schedule import (
    allowed_microbatch_counts,
    order_events,
    rank_order,
)

from tests.slotmem.oracles import is_proper, max_outstanding


def test_the_outstanding_oracle_counts_forwards_in_flight() -> None:
    assert max_outstanding(rank_order(2, 0, 4, 1, 2), 1) == (2,)
    assert max_outstanding(rank_order(1, 0, 4, 1, 1), 1) == (1,)


def _naive_slots(pp: int, vpp: int, group: int, counts: Sequence[int]) -> int:
    return max(
        max(max_outstanding(rank_order(pp, r, m, vpp, group), vpp))
        for r in range(pp)
        for m in counts
    )


def _grad_intervals(plan: SlotPlan, order: Sequence[int]) -> list[tuple[int, int, tuple[int, int]]]:
    """``(first, last, frame)`` backward-event indices during which each returned input grad is
    live: its own backward; through the next backward when grads go over P2P (PP > 1 or VPP > 1);
    with PP = 1 until the backward of the same microbatch in the nearest lower chunk with layers."""
    layers = plan.layers_per_chunk
    backs = [ev for ev in order_events(order, plan.chunks) if not ev.forward and layers[ev.chunk]]
    index = {(ev.chunk, ev.microbatch): i for i, ev in enumerate(backs)}
    in_flight = plan.pp > 1 or plan.chunks > 1
    out = []
    for i, ev in enumerate(backs):
        last = min(i + 1, len(backs) - 1) if in_flight else i
        lower = [c for c in range(ev.chunk) if layers[c]]
        if plan.pp == 1 and lower:
            last = max(last, index[(lower[-1], ev.microbatch)])
        out.append((i, last, (ev.chunk, ev.microbatch % plan.physical_slots)))
    return out


def _naive_check(plan: SlotPlan) -> None:
    """Independent of the planner's walkers: replay every reachable order event by event with
    plain sets and intervals, checking the slot ring and both colourings."""
    S = plan.physical_slots
    saved = {r.saved_frame: r.saved_colour for r in plan.records}
    grad = {r.grad_frame: r.grad_colour for r in plan.records}
    layers = plan.layers_per_chunk
    orders = [rank_order(plan.pp, plan.rank, m, plan.chunks, plan.group)
              for m in plan.microbatch_counts] + [plan.order]
    for order in orders:
        live_slots: set[tuple[int, int]] = set()
        live_colours: list[int] = []
        for ev in order_events(order, plan.chunks):
            frame = (ev.chunk, ev.microbatch % S)
            cols = [saved[(ev.chunk, frame[1], l)] for l in range(layers[ev.chunk])]
            if ev.forward:
                assert frame not in live_slots, f"slot reused while live: {frame}"
                live_slots.add(frame)
                assert not set(cols) & set(live_colours), "saved colour shared by live frames"
                live_colours.extend(cols)
            else:
                live_slots.remove(frame)
                for c in cols:
                    live_colours.remove(c)
        assert not live_slots
        intervals = _grad_intervals(plan, order)
        for a, (first_a, last_a, frame_a) in enumerate(intervals):
            for first_b, last_b, frame_b in intervals[a + 1:]:
                if first_b <= last_a and first_a <= last_b:  # live at the same time
                    assert frame_a != frame_b, f"grad frame {frame_a} reused while live"
                    assert grad[frame_a] != grad[frame_b], "grad colour shared by live grads"


# --------------------------------------------------------------------------- slot counts
def test_pp4_vpp4_needs_eight_slots() -> None:
    counts = allowed_microbatch_counts(4, 4, 4, range(1, 129))
    plan = plan_pipeline(4, 4, counts, (1, 2))
    assert plan.physical_slots == 8
    assert plan.summary() == "2 dynamic-CP variants over 8 slot-aliased physical pool slots"
    plan.validate()


def test_pp8_vpp4_uses_sixteen_noncolliding_slots() -> None:
    counts = allowed_microbatch_counts(8, 4, 8, range(1, 257))
    plan = plan_pipeline(8, 4, counts, (1, 2, 4, 8), group=8)
    assert plan.physical_slots == 16
    assert all(max(p.slots_per_chunk) == 16 for p in plan.ranks)  # every rank needs exactly 16
    plan.validate()
    for p in plan.ranks[::7]:
        _naive_check(p)


def test_pp1_single_slot() -> None:
    plan = plan_pipeline(1, 1, range(1, 9), (1, 2), layers_per_chunk=3)
    (p,) = plan.ranks
    assert p.order == (1, -1)
    assert plan.physical_slots == 1
    assert p.lockstep_order == (1, 2, -1, -2)
    assert len(p.records) == 2 * 3
    assert {r.grad_colour for r in p.records} == {0}  # no PP send in flight with PP=1
    assert sorted({r.saved_colour for r in p.records}) == [0, 1, 2]  # one per live layer
    plan.validate()


def test_pp1_with_vpp_keeps_grads_until_consumed() -> None:
    # PP=1: chunk 2's input grad feeds chunk 1's backward of the same microbatch on this rank,
    # three backwards later with group 3, so those grads must not share an arena meanwhile
    p = plan_pipeline(1, 2, [3, 6], (1,), group=3).ranks[0]
    assert p.order[:11] == (1, 1, 1, 2, -2, 2, -2, 2, -2, 1, -1)
    grad = {r.grad_frame: r.grad_colour for r in p.records}
    live_together = [(1, 0), (1, 1), (1, 2), (0, 0)]
    assert len({grad[f] for f in live_together}) == 4
    _naive_check(p)


def test_pp2_without_vpp() -> None:
    plan = plan_pipeline(2, 1, range(1, 9), (1,))
    assert [p.slots_per_chunk for p in plan.ranks] == [(2,), (1,)]
    assert plan.physical_slots == 2
    assert plan.ranks[0].order == (1, 1, -1, -1)
    assert plan.ranks[1].order == (1, -1, 1, -1)
    # rank 1 never has two microbatches live: both slots may share one saved arena
    assert plan.ranks[1].saved_colours == 1 and plan.ranks[0].saved_colours == 2
    plan.validate()


def test_counts_not_multiple_of_group() -> None:
    counts = allowed_microbatch_counts(2, 2, 3, range(1, 40))
    assert 5 in counts and 7 not in counts  # remainder 7 % 3 = 1 < PP is not schedulable
    plan = plan_pipeline(2, 2, counts, (1, 2), group=3)
    assert plan.physical_slots == _naive_slots(2, 2, 3, counts)
    plan.validate()
    for p in plan.ranks:
        _naive_check(p)
    single = plan_pipeline(2, 2, 5, (1, 2), group=3)
    assert single.ranks[0].slots_per_chunk == (5, 3)
    assert single.physical_slots == 5


def test_required_slots_matches_naive() -> None:
    counts = allowed_microbatch_counts(4, 2, 6, range(1, 50))
    got = required_slots(4, 2, counts, group=6)
    for rank, row in enumerate(got):
        want = [max(max_outstanding(rank_order(4, rank, m, 2, 6), 2)[c] for m in counts)
                for c in range(2)]
        assert list(row) == want


def test_too_few_slots_raises() -> None:
    with pytest.raises(SlotPeriodError, match="use at least 8"):
        plan_pipeline(4, 4, [4, 8, 12], (1, 2), physical_slots=7)
    # the liveness walk itself also refuses a short ring
    builder = ConflictBuilder(4, 7, [1] * 4, 4)
    with pytest.raises(SlotPeriodError, match="slot period 7 is shorter"):
        walk_orders([("m=8", rank_order(4, 0, 8, 4, 4))], builder)


def test_more_slots_than_required_is_valid() -> None:
    plan = plan_pipeline(4, 2, [4, 8], (1, 2), physical_slots=9)
    assert plan.physical_slots == 9
    assert all(p.order == rank_order(4, p.rank, 9, 2, 4) for p in plan.ranks)
    plan.validate()


# --------------------------------------------------------------------------- layers
def test_uneven_layers_per_chunk() -> None:
    plan = plan_pipeline(2, 2, [2, 4, 6], (1, 2), layers_per_chunk=[[3, 1], [2, 2]])
    p0, p1 = plan.ranks
    assert p0.layers_per_chunk == (3, 1) and p1.layers_per_chunk == (2, 2)
    forwards = sum(1 for o in p0.order if o == 1)  # chunk-1 forwards = slots
    assert forwards == plan.physical_slots
    assert len(p0.records) == 2 * plan.physical_slots * (3 + 1)
    assert {r.layer for r in p0.records if r.chunk == 0} == {0, 1, 2}
    assert {r.layer for r in p0.records if r.chunk == 1} == {0}
    plan.validate()
    _naive_check(p0)
    _naive_check(p1)


def test_zero_layer_chunk_has_no_records() -> None:
    plan = plan_pipeline(2, 2, [2, 4], (1,), layers_per_chunk=[[2, 0], [1, 1]])
    p0 = plan.ranks[0]
    assert {r.chunk for r in p0.records} == {0}
    plan.validate()
    _naive_check(p0)


def test_layer_spec_errors() -> None:
    assert layers_per_rank(2, 2, 3) == ((2, 2, 2), (2, 2, 2))
    assert layers_per_rank([1, 2], 2, 2) == ((1, 2), (1, 2))
    with pytest.raises(PlanError, match="one value per chunk"):
        layers_per_rank([1, 2, 3], 2, 2)
    with pytest.raises(PlanError, match="no layer"):
        layers_per_rank([[0, 0], [1, 1]], 2, 2)
    with pytest.raises(PlanError, match="per-rank lists"):
        layers_per_rank([[1, 1]], 2, 2)


@pytest.mark.parametrize("spec", [[1, [2, 2]], [], None, "12", 2.0, True])
def test_malformed_layer_spec_is_a_plan_error_saying_what_is_accepted(spec: object) -> None:
    with pytest.raises(PlanError, match="give one int .* or 2 lists of 2 ints"):
        layers_per_rank(spec, 2, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("slots", [2.5, True, "4"])
def test_forced_slot_count_must_be_an_integer(slots: object) -> None:
    with pytest.raises(PlanError, match="physical_slots must be an integer"):
        plan_pipeline(2, 1, [4], physical_slots=slots)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- variants, lockstep
def test_cp_variants() -> None:
    assert cp_variants([4, 1, 2]) == (1, 2, 4)
    with pytest.raises(PlanError, match="powers of two"):
        cp_variants([1, 3])
    with pytest.raises(PlanError, match="repeat"):
        cp_variants([2, 2])
    with pytest.raises(PlanError, match="at least one"):
        cp_variants([])


def test_lockstep_order_megatron_example() -> None:
    assert lockstep_order([1, 2, 1, 2, -1, -2, -1, -2], 2, 2) == (
        1, 3, 2, 4, 1, 3, 2, 4, -1, -3, -2, -4, -1, -3, -2, -4,
    )


def test_capture_events_and_records_in_lockstep() -> None:
    plan = plan_pipeline(2, 2, [2, 4], (4, 1, 2), layers_per_chunk=2)
    p = plan.ranks[0]
    assert p.cp_sizes == (1, 2, 4)
    events = p.capture_events()
    # each variant appears to a Megatron-style consumer as its own set of chunks
    entries = tuple((1 if e.forward else -1) * (e.chunk + 1 + e.variant * p.chunks) for e in events)
    assert entries == p.lockstep_order
    assert [e.variant for e in events[:3]] == [0, 1, 2]  # canonical first, back to back
    assert len({(e.forward, e.chunk, e.microbatch) for e in events[:3]}) == 1
    first = p.records[:6]  # first forward event: 3 variants x 2 layers
    assert [(r.variant, r.layer) for r in first] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert {r.io_family for r in first[::2]} == {(0, 0, 0)}
    assert [r.branch for r in first[::2]] == [0, plan.physical_slots, 2 * plan.physical_slots]


def test_record_fields_and_compact_form() -> None:
    plan = plan_pipeline(2, 2, [2, 4], (1, 2), layers_per_chunk=[2, 1])
    p = plan.ranks[0]
    S = plan.physical_slots
    total = 3
    for r in p.records:
        assert r.cp_size == p.cp_sizes[r.variant]
        assert r.slot == r.microbatch % S
        assert r.branch == r.variant * S + r.slot
        # largest CP size warms first: variant 1 (CP2) owns groups 0..2, variant 0 groups 3..5
        assert r.warmup_group == (1 - r.variant) * total + (0 if r.chunk == 0 else 2) + r.layer
        assert r.compact() == tuple(getattr(r, f) for f in COMPACT_FIELDS)
        assert len(r.compact()) == 7
    assert p.compact_records() == tuple(r.compact() for r in p.records)
    # frames share colours across variants
    for frame in {r.saved_frame for r in p.records}:
        assert len({r.saved_colour for r in p.records if r.saved_frame == frame}) == 1


def test_records_are_frozen() -> None:
    plan = plan_pipeline(1, 1, [1], (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.ranks[0].records[0].slot = 3  # type: ignore[misc]


def test_user_grad_colours_separate_adjacent_backwards() -> None:
    plan = plan_pipeline(4, 4, [4, 8], (1, 2))
    for p in plan.ranks:
        assert p.grad_colours >= 2
        _naive_check(p)


# --------------------------------------------------------------------------- validate
def _plan() -> PipelinePlan:
    return plan_pipeline(2, 1, [1, 2, 3, 4], (1, 2), layers_per_chunk=1)


def _with_records(p: SlotPlan, records: Sequence[SlotRecord]) -> SlotPlan:
    return dataclasses.replace(p, records=tuple(records))


def test_validate_rejects_shared_saved_colour_of_live_frames() -> None:
    p = _plan().ranks[0]  # rank 0 keeps two microbatches (slots 0 and 1) live together
    colour0 = next(r.saved_colour for r in p.records if r.saved_frame == (0, 0, 0))
    bad = [dataclasses.replace(r, saved_colour=colour0) if r.saved_frame == (0, 1, 0) else r
           for r in p.records]
    with pytest.raises(PlanError, match="share saved colour"):
        _with_records(p, bad).validate()


def test_validate_rejects_shared_grad_colour_in_flight() -> None:
    p = plan_pipeline(2, 2, [2, 4], (1,)).ranks[0]
    bad = [dataclasses.replace(r, grad_colour=0) for r in p.records]
    with pytest.raises(PlanError, match="share grad colour"):
        _with_records(p, bad).validate()


def test_validate_rejects_inconsistent_records() -> None:
    p = _plan().ranks[0]
    with pytest.raises(PlanError, match="one to one"):
        _with_records(p, p.records[1:]).validate()
    with pytest.raises(PlanError, match="branch"):
        _with_records(p, [dataclasses.replace(p.records[0], branch=99)] + list(p.records[1:])).validate()
    with pytest.raises(PlanError, match="two saved colours"):
        _with_records(p, [dataclasses.replace(p.records[0], saved_colour=42)] + list(p.records[1:])).validate()
    with pytest.raises(PlanError, match="slot="):
        _with_records(p, [dataclasses.replace(p.records[0], slot=1)] + list(p.records[1:])).validate()


def test_validate_rejects_short_ring_and_bad_orders() -> None:
    plan = _plan()
    p = plan.ranks[0]
    with pytest.raises(SlotPeriodError):
        dataclasses.replace(p, physical_slots=1).validate()
    with pytest.raises(PlanError, match="capture order"):
        dataclasses.replace(p, order=tuple(reversed(p.order))).validate()
    with pytest.raises(PlanError, match="lockstep"):
        dataclasses.replace(p, lockstep_order=p.order).validate()
    with pytest.raises(PlanError, match="differs"):
        dataclasses.replace(plan, physical_slots=1).validate()
    with pytest.raises(PlanError, match="ranks 0"):
        dataclasses.replace(plan, ranks=plan.ranks[::-1]).validate()


def test_bad_counts_are_schedule_errors() -> None:
    with pytest.raises(ScheduleError, match="fewer than the microbatch group"):
        plan_pipeline(4, 2, [2], (1,))
    with pytest.raises(ScheduleError, match="at least one microbatch count"):
        plan_pipeline(4, 2, [], (1,))
    # strict=False plans counts Megatron rejects, still safely
    plan = plan_pipeline(4, 2, range(1, 20), (1,), strict=False)
    plan.validate()


def test_json_structure() -> None:
    plan = plan_pipeline(2, 2, [2, 4], (1, 2))
    doc = json.loads(json.dumps(plan.to_json()))
    assert set(doc) == {"ranks", "summary"}
    rank = doc["ranks"][0]
    assert {"rank", "order", "slots_per_chunk", "physical_slots", "lockstep_order", "records"} <= set(rank)
    assert set(rank["records"][0]) == {f.name for f in dataclasses.fields(SlotRecord)}
    assert doc["summary"]["text"] == "2 dynamic-CP variants over 4 slot-aliased physical pool slots"
    assert doc["summary"]["physical_slots"] == 4


# --------------------------------------------------------------------------- walkers and colouring
def test_dsatur_proper_and_validated() -> None:
    # a 5-cycle needs three colours
    adj = [0] * 5
    for v in range(5):
        u = (v + 1) % 5
        adj[v] |= 1 << u
        adj[u] |= 1 << v
    colours = dsatur(adj)
    assert is_proper(adj, colours) and len(set(colours)) == 3
    with pytest.raises(ValueError, match="own neighbour"):
        dsatur([1])


@st.composite
def pipelines(draw: st.DrawFn) -> dict:
    pp = draw(st.integers(1, 5))
    vpp = draw(st.integers(1, 3))
    group = draw(st.integers(pp, 2 * pp + 1)) if vpp > 1 else pp
    allowed = allowed_microbatch_counts(pp, vpp, group, range(1, 5 * group + 1))
    counts = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=6, unique=True))
    cps = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4, unique=True))
    rows = draw(st.lists(st.lists(st.integers(0, 2), min_size=vpp, max_size=vpp)
                         .filter(lambda r: sum(r) > 0), min_size=pp, max_size=pp))
    return dict(pp=pp, vpp=vpp, group=group, counts=counts, cps=cps, layers=rows)


@settings(max_examples=60, deadline=None)
@given(pipelines())
def test_property_plans_are_safe_and_minimal(case: dict) -> None:
    pp, vpp, group, counts = case["pp"], case["vpp"], case["group"], case["counts"]
    plan = plan_pipeline(pp, vpp, counts, case["cps"], case["layers"], group)
    plan.validate()
    for p in plan.ranks:
        _naive_check(p)
        # every chunk's forwards and backwards balance in the capture order
        for c in range(vpp):
            assert p.order.count(c + 1) == p.order.count(-(c + 1)) == plan.physical_slots
        assert len(p.records) == len(case["cps"]) * plan.physical_slots * sum(p.layers_per_chunk)
    # minimal: the naive maximum of outstanding forwards, and one slot fewer is refused
    assert plan.physical_slots == _naive_slots(pp, vpp, group, counts)
    if plan.physical_slots > 1:
        with pytest.raises(SlotPeriodError):
            plan_pipeline(pp, vpp, counts, case["cps"], case["layers"], group,
                          physical_slots=plan.physical_slots - 1)


@settings(max_examples=60, deadline=None)
@given(pipelines(), st.integers(0, 4))
def test_property_prefix_sharing_walk_equals_plain_walk(case: dict, extra_slots: int) -> None:
    """walk_orders' shared-prefix shortcut gives exactly the union of walking each order alone."""
    pp, vpp, group, counts = case["pp"], case["vpp"], case["group"], case["counts"]
    slots = _naive_slots(pp, vpp, group, counts) + extra_slots
    for rank in range(pp):
        labelled = [(str(m), rank_order(pp, rank, m, vpp, group)) for m in counts]
        shared = ConflictBuilder(vpp, slots, case["layers"][rank], pp)
        walk_orders(OrderSet.build(labelled), shared)
        plain = ConflictBuilder(vpp, slots, case["layers"][rank], pp)
        for label, order in labelled:
            plain.start()
            plain.feed(order)
            plain.finish()
        assert shared.saved_adj == plain.saved_adj
        assert shared.grad_adj == plain.grad_adj
        counter = OutstandingCounter(vpp)
        walk_orders(labelled, counter)
        assert tuple(counter.peak) == tuple(
            max(max_outstanding(o, vpp)[c] for _, o in labelled) for c in range(vpp))


def test_planner_modules_import_no_torch_and_no_other_harness_part() -> None:
    import ast
    from pathlib import Path

    import harness.slotmem.plan as plan_module

    root = Path(plan_module.__file__).parent
    for name in ("plan", "schedule", "liveness", "colouring", "records", "planinputs", "planerrors"):
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert not module.startswith("torch"), f"{name}.py imports {module}"
                if module.startswith("harness"):
                    assert module.startswith("harness.slotmem."), f"{name}.py imports {module}"
