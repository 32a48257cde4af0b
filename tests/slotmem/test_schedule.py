"""Per-rank PP/VPP orders (Megatron's interleaved 1F1B, ``_order`` convention)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.slotmem.planerrors import ScheduleError
from harness.slotmem.schedule import (
    OrderEvent,
    allowed_microbatch_counts,
    check_layout,
    check_microbatch_count,
    check_order,
    microbatch_count_problem,
    order_events,
    rank_order,
    rank_order_arrays,
    schedule_table,
    warmup_count,
)


def _orders(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split())


# --------------------------------------------------------------------------- known tables
def test_schedule_table_megatron_example() -> None:
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_issue_example_rank0() -> None:
    assert rank_order(2, 0, 5, 2, 3) == _orders("1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1")


def test_issue_example_rank1() -> None:
    # warmup 3: F 1 1 1, then (F, B) pairs, then the last three backwards
    assert rank_order(2, 1, 5, 2, 3) == _orders("1 1 1 2 -2 2 -2 2 -2 1 -1 1 -1 2 -1 2 -2 -2 -1 -1")


def test_pp1_alternates_forward_backward() -> None:
    assert warmup_count(1, 0, 3, 1, 1) == 0
    assert rank_order(1, 0, 3, 1, 1) == (1, -1, 1, -1, 1, -1)


def test_pp2_without_vpp() -> None:
    assert rank_order(2, 0, 4, 1, 2) == _orders("1 1 -1 1 -1 1 -1 -1")
    assert rank_order(2, 1, 4, 1, 2) == _orders("1 -1 1 -1 1 -1 1 -1")


def test_pp4_vpp4_last_rank() -> None:
    order = rank_order(4, 3, 8, 4, 4)
    assert order[:14] == _orders("1 1 1 1 2 2 2 2 3 3 3 3 4 -4")
    assert order[-8:] == _orders("-2 -2 -2 -2 -1 -1 -1 -1")


@pytest.mark.parametrize(
    ("pp", "rank", "m", "chunks", "group", "expected"),
    [
        (4, 0, 8, 2, 4, 2 * 3 + 1 * 4),
        (4, 3, 8, 2, 4, 4),
        (8, 0, 16, 4, 8, 14 + 24),
        (4, 0, 1, 1, 4, 1),  # pp-rank-1 = 3, capped at 1 virtual microbatch
        (4, 1, 8, 1, 4, 2),
        (2, 0, 2, 2, 2, 4),  # 2 + 2 = 4 = total
        (4, 0, 4, 4, 4, 16),  # 6 + 12 = 18 capped at 16
    ],
)
def test_warmup_counts(pp: int, rank: int, m: int, chunks: int, group: int, expected: int) -> None:
    assert warmup_count(pp, rank, m, chunks, group) == expected


def test_uneven_last_group_is_the_remainder() -> None:
    table = schedule_table(7, 2, 3)
    assert [mb for mb, _ in table][-2:] == [6, 6]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


def test_order_events_fifo_microbatches() -> None:
    events = order_events(rank_order(2, 0, 5, 2, 3), 2)
    assert events[0] == OrderEvent(True, 0, 0)
    assert [e.microbatch for e in events if e.forward and e.chunk == 0] == [0, 1, 2, 3, 4]
    assert [e.microbatch for e in events if not e.forward and e.chunk == 1] == [0, 1, 2, 3, 4]
    assert [(1 if e.forward else -1) * (e.chunk + 1) for e in events] == list(rank_order(2, 0, 5, 2, 3))


# --------------------------------------------------------------------------- rules and errors
def test_microbatch_count_rules() -> None:
    assert microbatch_count_problem(4, 1, 4, 3) is None  # no VPP: any count
    assert "fewer than the microbatch group" in microbatch_count_problem(2, 2, 3, 2)
    assert microbatch_count_problem(2, 2, 3, 5) is None  # remainder 2 >= PP
    assert "remainder" in microbatch_count_problem(4, 2, 6, 7)  # remainder 1 < PP
    assert allowed_microbatch_counts(4, 4, 4, range(1, 17)) == (4, 8, 12, 16)
    assert allowed_microbatch_counts(2, 2, 3, range(1, 10)) == (3, 5, 6, 8, 9)
    with pytest.raises(ScheduleError, match="remainder"):
        check_microbatch_count(4, 2, 6, 7)


def test_layout_errors() -> None:
    assert check_layout(4, 2) == 4
    with pytest.raises(ScheduleError, match="group >= PP"):
        check_layout(4, 2, 2)
    assert check_layout(4, 1, 2) == 2  # the group does not matter without VPP
    with pytest.raises(ScheduleError, match="pp must be a positive integer"):
        check_layout(0, 1)
    with pytest.raises(ScheduleError, match="PP rank"):
        rank_order(2, 2, 4, 1, 2)


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ((-1, 1), "no outstanding forward"),
        ((1, 1, -1), "does not drain"),
        ((1, 0, -1), "not a chunk id"),
        ((1, 3, -1, -3), "not a chunk id"),
        ((1, 1, 2, -2, -1, -1), "different microbatch counts"),
    ],
)
def test_check_order_rejects(order: tuple[int, ...], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        check_order(order, 2)


# --------------------------------------------------------------------------- properties
@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int, int]:
    pp = draw(st.integers(1, 6))
    vpp = draw(st.integers(1, 4))
    group = draw(st.integers(pp, 2 * pp + 2)) if vpp > 1 else pp
    allowed = allowed_microbatch_counts(pp, vpp, group, range(1, 4 * group + 1))
    m = draw(st.sampled_from(allowed))
    return pp, vpp, group, m


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_every_order_drains_and_respects_dependencies(layout: tuple[int, int, int, int]) -> None:
    pp, vpp, group, m = layout
    arrays = rank_order_arrays(pp, [m], vpp, group)
    for rank in range(pp):
        order = rank_order(pp, rank, m, vpp, group)  # raises unless it drains
        assert tuple(arrays[rank][0]) == order
        assert len(order) == 2 * m * vpp
        events = order_events(order, vpp)
        position = {(e.forward, e.chunk, e.microbatch): i for i, e in enumerate(events)}
        assert len(position) == len(events)  # each (direction, chunk, microbatch) exactly once
        for c in range(vpp):
            for mb in range(m):
                assert position[(True, c, mb)] < position[(False, c, mb)]
                if c + 1 < vpp:  # data flows chunk c -> c+1 forward, back again in backward
                    assert position[(True, c, mb)] < position[(True, c + 1, mb)]
                    assert position[(False, c + 1, mb)] < position[(False, c, mb)]
        # forwards follow the schedule table
        table = schedule_table(m, vpp, group)
        forwards = [(e.microbatch, e.chunk) for e in events if e.forward]
        assert forwards == list(table)
        warmup = warmup_count(pp, rank, m, vpp, group)
        assert all(o > 0 for o in order[:warmup])
        if warmup < m * vpp:  # steady state starts with a forward followed by a backward
            assert order[warmup] > 0 and order[warmup + 1] < 0
        else:  # everything was warmup: only backwards follow
            assert all(o < 0 for o in order[warmup:])
