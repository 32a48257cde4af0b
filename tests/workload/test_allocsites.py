"""Allocator snapshots by pool and allocation site, and the diff of two arms (pure)."""

from __future__ import annotations

from harness.workload.allocsites import (
    ACTIVE, DEFAULT_POOL, FREE, GRAPH_POOL, NO_FRAME, diff_sites, frame_site, pool_totals,
    summarize_segments,
)


def _frames(*where):
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in where]


MOE = ("/x/site-packages/torch/nn/functional.py", 10, "linear"), ("/w/harness/workload/moe.py", 88, "forward")
ARENA = (("/w/harness/slotmem/arenas.py", 12, "backing"), ("/w/harness/slotmem/capture.py", 5, "layout"))


def _seg(pool, *blocks, size=None):
    total = sum(b["size"] for b in blocks)
    return {"segment_pool_id": pool, "total_size": size or total, "blocks": list(blocks)}


def _blk(size, state="active_allocated", frames=()):
    return {"size": size, "state": state, "frames": list(frames)}


def test_the_innermost_project_frame_names_the_site():
    assert frame_site(_frames(*MOE)) == "harness/workload/moe.py:88 forward"
    assert frame_site(_frames(("/x/torch/a.py", 1, "f"), ("/u/bench/emulated.py", 3, "main"))) == \
        "/u/bench/emulated.py:3 main"
    assert frame_site([]) == NO_FRAME


def test_segments_are_bucketed_by_pool_state_and_site():
    segs = [
        _seg((0, 0), _blk(100, frames=_frames(*MOE)), _blk(30, "inactive"), _blk(20, frames=_frames(*MOE))),
        _seg((1, 7), _blk(500, frames=_frames(*ARENA)), _blk(12, "inactive")),
        _seg((0, 0), _blk(64, "inactive")),  # a wholly free segment (empty_cache would release it)
    ]
    sites = summarize_segments(segs)
    by = {(s.pool, s.state, s.site): (s.bytes, s.blocks) for s in sites}
    assert by[(DEFAULT_POOL, ACTIVE, "harness/workload/moe.py:88 forward")] == (120, 2)
    assert by[(DEFAULT_POOL, FREE, "free beside harness/workload/moe.py:88 forward")] == (30, 1)
    assert by[(GRAPH_POOL, ACTIVE, "harness/slotmem/arenas.py:12 backing")] == (500, 1)
    assert by[(GRAPH_POOL, FREE, "free beside harness/slotmem/arenas.py:12 backing")] == (12, 1)
    assert by[(DEFAULT_POOL, FREE, f"free beside {NO_FRAME}")] == (64, 1)
    assert sites[0].bytes == 500  # largest first
    totals = pool_totals(sites)
    assert totals == {(DEFAULT_POOL, ACTIVE): 120, (DEFAULT_POOL, FREE): 94, (GRAPH_POOL, ACTIVE): 500,
                      (GRAPH_POOL, FREE): 12}
    assert sum(totals.values()) == sum(s["total_size"] for s in segs)


def test_the_diff_lists_every_changed_bucket_largest_change_first():
    a = summarize_segments([_seg((0, 0), _blk(100, frames=_frames(*MOE))), _seg((1, 1), _blk(900, frames=_frames(*ARENA)))])
    b = summarize_segments([_seg((0, 0), _blk(160, frames=_frames(*MOE))), _seg((1, 1), _blk(300, frames=_frames(*ARENA)))])
    rows = diff_sites(a, b)
    assert [(r.pool, r.delta) for r in rows] == [(GRAPH_POOL, 600), (DEFAULT_POOL, -60)]
    assert diff_sites(a, a) == () and len(diff_sites(a, b, top=1)) == 1
