"""CPU tests of the pure parts of capture: arena layout, saved-tensor packing, plan checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.slotmem import allocator as alloc
from harness.slotmem.arenas import (
    ALIGN,
    EXTERNAL,
    INPUT,
    NATIVE,
    ForwardPlan,
    TensorMeta,
    align,
    arena_sizes,
    frame_layout,
    grad_layout,
    group_storage,
    pack_backing,
    view_at,
)
from harness.slotmem.capture import make_graphed_callables
from harness.slotmem.plan import plan_pipeline
from harness.slotmem.planerrors import PlanError
from harness.slotmem.protocol import (
    as_record,
    build_slot_map,
    capture_steps,
    check_liveness,
    check_orders,
    live_colours,
)
from harness.slotmem.saved import ArenaPacker, CaptureMismatch, SaveObserver
from harness.slotmem.schedule import rank_order

F32 = torch.float32


def meta(shape, stride=None, offset=0, dtype=F32) -> TensorMeta:
    t = torch.empty(shape, dtype=dtype)
    return TensorMeta(tuple(shape), tuple(stride) if stride else tuple(t.stride()), dtype, offset)


# ----------------------------------------------------------------------------- arenas


def test_extent_of_strided_and_empty_tensors() -> None:
    assert meta((4, 8)).extent_bytes == 128
    assert meta((4, 8), stride=(16, 1)).extent_bytes == (3 * 16 + 7 + 1) * 4
    assert meta((0, 8)).extent_bytes == 0
    assert meta((4, 8), offset=8).start_byte == 32


def test_group_storage_packs_overlapping_saved_views_of_one_storage_together() -> None:
    h = torch.empty(4, 8)
    a, b = h.chunk(2, dim=-1)
    saves = [
        (NATIVE, 1, TensorMeta.of(b), -1),
        (EXTERNAL, 2, meta((8, 8)), -1),
        (NATIVE, 1, TensorMeta.of(a), -1),
        (NATIVE, 3, meta((5,)), -1),
        (INPUT, 4, meta((4, 8)), 0),
    ]
    g = group_storage(saves)
    entries, comps = g.saved, g.components
    assert [e.kind for e in entries] == [NATIVE, EXTERNAL, NATIVE, NATIVE, INPUT]
    assert comps == (h.numel() * 4, 20)  # a covers bytes [0, 112), b [16, 128): one 128-byte component
    assert entries[0].component == entries[2].component == 0 and entries[3].component == 1
    assert entries[0].rel_byte == 16 and entries[2].rel_byte == 0
    assert entries[4].source == 0


def test_group_storage_rejects_misaligned_mixed_dtype_views() -> None:
    ok = [(NATIVE, 1, meta((4,), dtype=torch.uint8), -1), (NATIVE, 1, TensorMeta((1,), (1,), torch.int16, 1), -1)]
    g = group_storage(ok)
    entries, comps = g.saved, g.components
    assert [e.rel_byte for e in entries] == [0, 2] and comps == (4,)
    bad = [(NATIVE, 1, meta((1,), dtype=torch.uint8, offset=1), -1),
           (NATIVE, 1, TensorMeta((1,), (1,), torch.int16, 1), -1)]
    with pytest.raises(ValueError, match="element size"):
        group_storage(bad)


def _plan(inputs=((4, 8),), outputs=((4, 8),), comps=(100, 300), grads=(True,)) -> ForwardPlan:
    return ForwardPlan(tuple(meta(s) for s in inputs), tuple(meta(s) for s in outputs), (), tuple(comps),
                       grads, (), 0)


def test_frame_layout_is_aligned_and_disjoint() -> None:
    fl = frame_layout(_plan())
    offs = [*fl.inputs, *fl.outputs, *fl.components]
    sizes = [128, 128, 100, 300]
    assert all(o % ALIGN == 0 for o in offs)
    spans = sorted(zip(offs, sizes))
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert fl.nbytes == 4 * ALIGN + align(300) - ALIGN == spans[-1][0] + align(300)


def test_grad_layout_only_for_wanted_inputs() -> None:
    gl = grad_layout([_plan(inputs=((4, 8), (2,)), grads=(True, False)), _plan(grads=(True,))])
    assert set(gl.offsets) == {(0, 0), (1, 0)}
    assert gl.offsets[(1, 0)] == ALIGN and gl.nbytes == 2 * ALIGN


def test_arena_sizes_take_the_max_over_members() -> None:
    assert arena_sizes([(0, 100), (0, 700), (1, 10), (0, 3)]) == {0: align(700), 1: ALIGN}


def test_pack_backing_places_regions_without_overlap() -> None:
    layout = pack_backing({("saved", 1): 1000, ("grad", 0): 10, ("saved", 0): 300})
    keys = sorted(layout.offsets, key=layout.offsets.__getitem__)
    for k1, k2 in zip(keys, keys[1:]):
        assert layout.offsets[k1] + layout.sizes[k1] <= layout.offsets[k2]
    assert layout.nbytes == sum(layout.sizes.values())
    assert all(v % ALIGN == 0 for v in layout.offsets.values())


def test_view_at_shares_the_backing_with_planned_strides() -> None:
    backing = torch.zeros(4096, dtype=torch.uint8)
    m = TensorMeta((4, 3), (8, 1), F32, 17)
    v = view_at(backing, 512, m)
    assert v.untyped_storage().data_ptr() == backing.untyped_storage().data_ptr()
    assert v.stride() == (8, 1) and v.storage_offset() == 128
    v.fill_(1.0)
    assert backing[512:516].tolist() == list(torch.tensor([1.0]).view(torch.uint8).tolist())
    c = view_at(backing, 1024, m, keep_strides=False)
    assert c.is_contiguous()
    with pytest.raises(ValueError, match="aligned"):
        view_at(backing, 2, m)


# ----------------------------------------------------------------------------- saved tensors


def _glu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a, b = (x @ w).chunk(2, dim=-1)
    return a * torch.sigmoid(b)


def test_observer_and_packer_copy_native_saves_into_arena_views() -> None:
    w = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    obs = SaveObserver({w.untyped_storage().data_ptr()}, [x])
    with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack):
        ref = _glu(x, w)
    g = obs.groups()
    entries, comps = g.saved, g.components
    kinds = [e.kind for e in entries]
    assert INPUT in kinds and EXTERNAL in kinds and kinds.count(NATIVE) >= 2
    gx_ref, gw_ref = torch.autograd.grad(ref.sum(), [x, w])

    backing = torch.zeros(sum(align(n) for n in comps) + ALIGN, dtype=torch.uint8)
    starts = [sum(align(n) for n in comps[:i]) for i in range(len(comps))]
    views = [view_at(backing, starts[e.component] + e.rel_byte, e.meta) if e.kind == NATIVE else None
             for e in entries]
    packer = ArenaPacker("glu", entries, views, {w.untyped_storage().data_ptr()}, [x])
    with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
        y = _glu(x, w)
    packer.finish()
    for v in views:
        if v is not None:
            assert v.untyped_storage().data_ptr() == backing.untyped_storage().data_ptr()
    backing_before = backing.clone()
    gx, gw = torch.autograd.grad(y.sum(), [x, w])
    assert torch.equal(gx, gx_ref) and torch.equal(gw, gw_ref)
    assert torch.equal(backing, backing_before)  # backward only reads the arena
    # the backward really reads the arena: corrupt it and the grads change
    packer2 = ArenaPacker("glu", entries, views, {w.untyped_storage().data_ptr()}, [x])
    with torch.autograd.graph.saved_tensors_hooks(packer2.pack, packer2.unpack):
        y2 = _glu(x, w)
    backing.fill_(0)
    gx2, _ = torch.autograd.grad(y2.sum(), [x, w])
    assert not torch.equal(gx2, gx_ref)


def test_packer_rejects_a_forward_that_saves_differently() -> None:
    w = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    obs = SaveObserver({w.untyped_storage().data_ptr()}, [x])
    with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack):
        _glu(x, w)
    entries = obs.groups().saved
    packer = ArenaPacker("glu", entries, [None] * len(entries), {w.untyped_storage().data_ptr()}, [x])
    with pytest.raises(CaptureMismatch):
        with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
            torch.tanh(x @ w)  # different first save
    short = ArenaPacker("glu", entries + entries, [None] * (2 * len(entries)), set(), [x])
    with pytest.raises(CaptureMismatch, match="saved 0 tensors"):
        short.finish()


# ----------------------------------------------------------------------------- plan checks


@pytest.fixture(scope="module")
def pp2_plan():
    return plan_pipeline(2, 2, (4, 6, 8), (1, 2), 2).ranks[0]


def test_slot_map_reads_planner_records(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    assert smap.variants == (1, 2)
    assert smap.slots == {0: pp2_plan.physical_slots, 1: pp2_plan.physical_slots}
    assert as_record(pp2_plan.records[0]).cp_size == pp2_plan.records[0].cp_size
    assert as_record(pp2_plan.records[0].as_dict()) == as_record(pp2_plan.records[0])


def test_planner_plans_pass_the_liveness_check(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    for _, order in pp2_plan.reachable_orders():
        check_liveness(order, smap)
    pp1 = plan_pipeline(1, 1, (3, 5), (1, 2, 4), 3).ranks[0]
    smap1 = build_slot_map(pp1.records, pp1.layers_per_chunk)
    for _, order in pp1.reachable_orders():
        check_liveness(order, smap1, pp=1)


def test_two_live_frames_one_saved_colour_is_rejected(pp2_plan) -> None:
    merged = [replace(r, saved_colour=0) for r in pp2_plan.records]
    smap = build_slot_map(merged, pp2_plan.layers_per_chunk)
    with pytest.raises(PlanError, match="saved colour 0 is given to live frames"):
        check_liveness(pp2_plan.order, smap)


def test_consecutive_backwards_sharing_a_grad_colour_are_rejected_with_pp(pp2_plan) -> None:
    merged = [replace(r, grad_colour=0) for r in pp2_plan.records]
    smap = build_slot_map(merged, pp2_plan.layers_per_chunk)
    with pytest.raises(PlanError, match="grad colour 0"):
        check_liveness(pp2_plan.order, smap, pp=2)
    # PP = 1 without VPP: nothing is sent, a returned grad is dead after its own backward
    pp1 = plan_pipeline(1, 1, (3, 5), (1, 2), 2).ranks[0]
    check_liveness(pp1.order, build_slot_map([replace(r, grad_colour=0) for r in pp1.records], (2,)), pp=1)


def test_capture_and_planner_apply_one_grad_liveness_rule() -> None:
    """PP = 1 with VPP = 2: a returned grad stays live until its same-rank consumer's backward; the
    planner's validate and capture's check must reject the same merged colours."""
    plan = plan_pipeline(1, 2, (4,), (1, 2), 1, strict=False).ranks[0]
    assert plan.grad_colours > 1
    merged = replace(plan, records=tuple(replace(r, grad_colour=0) for r in plan.records))
    with pytest.raises(PlanError, match="share grad colour") as planner:
        merged.validate()
    smap = build_slot_map(merged.records, merged.layers_per_chunk)
    with pytest.raises(PlanError, match="share grad colour") as capture:
        check_orders(merged.reachable_orders(), smap, merged.pp)
    assert str(planner.value).split(": ", 1)[1] == str(capture.value).split(": ", 1)[1]
    for label, order in plan.reachable_orders():  # the planner's own colours pass both
        check_liveness(order, build_slot_map(plan.records, plan.layers_per_chunk), pp=1)


def test_too_small_slot_ring_is_rejected(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    small = replace(smap, slots={0: 1, 1: 1})
    with pytest.raises(PlanError, match="reuses physical slot"):
        check_liveness(rank_order(2, 0, 8, 2, 2), small)


def test_record_consistency_checks(pp2_plan) -> None:
    recs = list(pp2_plan.records)
    layers = pp2_plan.layers_per_chunk
    with pytest.raises(PlanError, match="two records"):
        build_slot_map(recs + [recs[0]], layers)
    with pytest.raises(PlanError, match="no record"):
        build_slot_map([r for r in recs if not (r.cp_size == 2 and r.microbatch == 1)], layers)
    with pytest.raises(PlanError, match="saved colour"):
        build_slot_map([replace(recs[0], saved_colour=99)] + recs[1:], layers)
    with pytest.raises(PlanError, match="share a branch id"):
        build_slot_map([replace(r, branch=0) for r in recs], layers)
    with pytest.raises(PlanError, match="no layer"):
        build_slot_map(recs, (1, 2))
    with pytest.raises(PlanError, match="lacks fields"):
        as_record({"cp_size": 1})
    with pytest.raises(PlanError, match="no records"):
        build_slot_map([], layers)


def test_capture_steps_are_lockstep_units_in_schedule_order(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    steps = capture_steps(pp2_plan.order, smap)
    assert len(steps) == 2 * pp2_plan.physical_slots * sum(pp2_plan.layers_per_chunk)
    assert len({(s.forward, s.chunk, s.slot, s.layer) for s in steps}) == len(steps)
    first_fwd = [s.layer for s in steps if s.forward][:2]
    first_bwd = [s.layer for s in steps if not s.forward][:2]
    assert first_fwd == [0, 1] and first_bwd == [1, 0]
    for s in steps:
        if not s.forward:  # a backward is captured after its forward
            assert steps.index(replace(s, forward=True)) < steps.index(s)


def test_live_colours_drain_at_the_end(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    order = pp2_plan.order
    saved, grad = live_colours(order, smap, len(order))
    assert saved == set() and len(grad) == 1
    saved1, _ = live_colours(order, smap, 1)
    assert saved1 == {smap.saved_colour[(0, 0, l)] for l in range(2)}


def test_own_minimal_records_work() -> None:
    """Records given as mappings without ``variant`` and ``warmup_group``."""
    recs = [dict(cp_size=cp, chunk=0, layer=0, microbatch=m, slot=m, branch=b * 2 + m, saved_colour=m, grad_colour=m)
            for b, cp in enumerate((1, 2)) for m in range(2)]
    smap = build_slot_map(recs, (1,))
    assert smap.variants == (1, 2) and smap.slots == {0: 2}
    check_liveness((1, 1, -1, -1), smap)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_capture_fails_closed_without_cuda(pp2_plan) -> None:
    import gc

    gc.enable()
    layers = [[torch.nn.Linear(4, 4)] * 2, [torch.nn.Linear(4, 4)] * 2]
    with pytest.raises(alloc.AllocatorUnsupported, match="CUDA"):
        make_graphed_callables(layers, lambda cp, c, l: (torch.randn(4, 4),), pp2_plan.order, pp2_plan.records)
    assert gc.isenabled()


def test_reset_frames_resets_every_graph_and_drops_roots() -> None:
    from harness.slotmem.replay import Frame, reset_frames

    class FakeGraph:
        def __init__(self) -> None:
            self.resets = 0

        def reset(self) -> None:
            self.resets += 1

    x = torch.zeros(2)
    done = Frame("a", (x,), (x,), (True,), (), (), (), FakeGraph(), FakeGraph(), None)
    pending = Frame("b", (x,), (x,), (True,), (), (), (), FakeGraph(), None, (x,))
    frames = {"a": done, "b": pending}
    reset_frames(frames)
    assert frames == {}
    assert done.fwd.resets == done.bwd.resets == pending.fwd.resets == 1
    assert pending.roots is None
