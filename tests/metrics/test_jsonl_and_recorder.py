"""JSON lines and the record API (StepRecorder) -> the harness's step records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.metrics import GraphStats, MetricsError, StepRecorder, read_jsonl, read_source
from harness.results import read_steps
from harness.spec.schema import MetricsSpec


def test_recorder_writes_what_read_steps_and_the_source_read(tmp_path: Path) -> None:
    rec = StepRecorder(environ={"RANK": "1", "DCP_HARNESS_METRICS_DIR": str(tmp_path)})
    stats = GraphStats(summary="capture: 2 variants", variants=2, physical_slots=3, graphs=4,
                       pool_reserved_bytes=10, pool_allocated_bytes=8, arena_bytes=6,
                       largest_pool_bytes=10, pools=1, capture_s=0.1, warmup_s=0.2,
                       capture_peak_bytes=12, warmup_peak_bytes=11)
    assert rec.record(1, loss=2.5, grad_norm=1.0, graph_stats=stats)
    assert rec.record(2, loss=float("nan"), grad_norm=1.0)
    assert not rec.record(2, loss=1.0)  # already recorded
    steps = read_steps(tmp_path)
    assert list(steps) == [1]
    first, second = steps[1]
    assert first.platform == "cpu" and first.environment is not None
    assert first.graph_stats == stats and second.environment is None
    assert second.nan and math.isnan(second.loss)
    got = read_source(MetricsSpec(source="record"), tmp_path.parent, [1], "cpu",
                      path=f"{tmp_path.name}/rank{{rank}}.jsonl")
    assert got[1] == [first, second]


def test_recorder_refuses_a_bad_field(tmp_path: Path) -> None:
    rec = StepRecorder(folder=tmp_path, rank=0)
    with pytest.raises(ValueError, match="field 'loss'"):
        rec.record(1, loss="low")


def test_a_bad_line_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n"
                    + json.dumps({"step": 2, "los": 1.0}) + "\n")
    with pytest.raises(MetricsError, match=r"m.jsonl:2: bad step record: field 'los'"):
        read_jsonl(path)
    path.write_text("[1]\n")
    with pytest.raises(MetricsError, match=r"m.jsonl:1: a JSON list"):
        read_jsonl(path)


def test_a_missing_rank_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="no metrics file for rank 0"):
        read_source(MetricsSpec(source="jsonl"), tmp_path, [0], "cpu")
