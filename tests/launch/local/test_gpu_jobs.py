"""The placement rule of the local GPU lane (``launch.gpu_jobs``): arms + predicted memory +
device memory + the figures a neighbour would move -> which arms run at once."""

from __future__ import annotations

import pytest

from harness.launch.local.gpu_jobs import (
    DEVICE_USED,
    STEP_TIME,
    ArmDemand,
    alone_reason,
    fits,
    groups,
    next_arm,
    order,
    place,
    runs_alone,
)

GIB = 2**30


def arm(name: str, gib: float, *moved: str, seconds: float = 1.0) -> ArmDemand:
    return ArmDemand(("case", name), int(gib * GIB), frozenset(moved), seconds)


def test_a_judged_step_time_runs_alone_whatever_the_memory() -> None:
    timed = arm("eager", 1, STEP_TIME)
    assert runs_alone(timed, per_process_memory=True)
    assert not fits([arm("x", 1)], timed, 100 * GIB, 8, True)
    assert not fits([timed], arm("x", 1), 100 * GIB, 8, True)
    assert fits([], timed, 100 * GIB, 8, True)
    assert "step time" in alone_reason(timed, True)


def test_whole_device_memory_runs_alone_only_without_per_process_accounting() -> None:
    probed = arm("graph", 10, DEVICE_USED)
    assert runs_alone(probed, per_process_memory=False)
    assert not fits([arm("x", 1)], probed, 100 * GIB, 8, False)
    assert fits([arm("x", 1)], probed, 100 * GIB, 8, True)
    assert alone_reason(probed, True) is None
    assert "NVML" in alone_reason(probed, False)


def test_memory_and_jobs_bound_what_runs_at_once() -> None:
    running = [arm("a", 30), arm("b", 30)]
    assert fits(running, arm("c", 30), 90 * GIB, 8, True)
    assert not fits(running, arm("c", 31), 90 * GIB, 8, True)
    assert not fits(running, arm("c", 1), 90 * GIB, 2, True)


def test_an_arm_larger_than_the_device_still_runs_alone() -> None:
    huge = arm("huge", 500)
    assert next_arm([huge], [], 100 * GIB, 4, True) is huge
    slots = place([arm("a", 10), huge], 100 * GIB, 4, True)
    assert {s.arm.key[1]: s.beside for s in slots}["huge"] == ()


def test_order_memory_alone_first_then_longest_then_a_judged_step_time() -> None:
    arms = [arm("short", 1, seconds=1), arm("timed", 1, STEP_TIME), arm("long", 1, seconds=9),
            arm("probed", 1, DEVICE_USED, seconds=5)]
    assert [a.key[1] for a in order(arms, False)] == ["probed", "long", "short", "timed"]
    assert [a.key[1] for a in order(arms, True)] == ["long", "probed", "short", "timed"]


def test_gpu_jobs_1_is_one_after_another_in_order() -> None:
    arms = [arm(f"a{i}", 1, seconds=i + 1) for i in range(4)]
    slots = place(arms, 100 * GIB, 1, True)
    assert all(s.beside == () for s in slots)
    assert groups(slots) == tuple(((s.arm.key),) for s in slots)
    assert [s.start for s in slots] == [0, 4, 7, 9]  # longest first, back to back


def test_place_never_overlaps_an_alone_arm_and_never_exceeds_memory() -> None:
    arms = [arm("timed", 5, STEP_TIME, seconds=3), arm("probed", 20, DEVICE_USED, seconds=2),
            *(arm(f"x{i}", 12 + i, seconds=1 + i % 3) for i in range(8))]
    for per_process in (False, True):
        slots = place(arms, 50 * GIB, 4, per_process)
        by = {s.arm.key: s for s in slots}
        for s in slots:
            if runs_alone(s.arm, per_process):
                assert s.beside == ()
            at_start = [by[k].arm.bytes for k in s.beside if by[k].start <= s.start < by[k].end]
            assert s.arm.bytes + sum(at_start) <= 50 * GIB
            assert len(at_start) < 4
        assert len(slots) == len(arms)


def test_packing_shortens_the_schedule_and_groups_say_what_shared() -> None:
    arms = [arm(f"x{i}", 10, seconds=10) for i in range(6)]
    serial = place(arms, 100 * GIB, 1, True)
    packed = place(arms, 35 * GIB, 8, True)  # three at a time by memory
    assert max(s.end for s in serial) == 60
    assert max(s.end for s in packed) == 20
    assert [len(g) for g in groups(packed)] == [3, 3]


def test_jobs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        place([arm("a", 1)], GIB, 0, True)
