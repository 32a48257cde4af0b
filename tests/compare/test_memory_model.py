"""``<arm>.memory_model``: predicted beside measured, a figure without a bound, a check with one."""

from __future__ import annotations

import dataclasses

from harness.compare.memory_model import memory_model_check
from harness.results import GraphStats, PredictedMemory, StepRecord

MIB = 2**20


def _stats(pool: int, arenas: int) -> GraphStats:
    return GraphStats("line", 2, 8, 128, pool * MIB, pool * MIB, arenas * MIB, pool * MIB, 1, 1.0, 1.0, 0, 0)


def _steps(pred: PredictedMemory | None) -> dict[int, list[StepRecord]]:
    first = StepRecord(1, max_allocated_bytes=50_000 * MIB, memory_predicted=pred)
    second = StepRecord(2, max_allocated_bytes=60_000 * MIB, graph_stats=_stats(13_794, 13_115))
    return {0: [first, second]}


PRED = PredictedMemory(13_542 * MIB, 13_115 * MIB, 61_055 * MIB, 38_307 * MIB)


def test_the_ratios_are_a_figure_without_a_bound() -> None:
    (check,) = memory_model_check("graph", _steps(PRED), None)
    assert check.name == "graph.memory_model" and check.figure and check.passed
    assert abs(check.value - (1 - 13_542 / 13_794)) < 1e-9  # the pool is the furthest off
    assert "rank 0: pool 0.982, arenas 1.000, peak 1.018 (Megatron's estimate / peak 0.638)" in check.detail


def test_a_bound_makes_it_a_check_that_can_fail() -> None:
    (ok,) = memory_model_check("graph", _steps(PRED), 0.05)
    assert ok.passed and not ok.figure and ok.bound == 0.05
    off = dataclasses.replace(PRED, peak_bytes=70_000 * MIB)
    (bad,) = memory_model_check("graph", _steps(off), 0.05)
    assert not bad.passed and abs(bad.value - (70_000 / 60_000 - 1)) < 1e-9


def test_nothing_without_a_prediction() -> None:
    assert memory_model_check("graph", _steps(None), 0.05) == ()
