"""bench/memory_gpu.py: the reduced case copies and the predicted-vs-measured table from a sweep's
records (written here as a CUDA rank writes them)."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.results import GraphStats, PredictedMemory, StepRecord, StepWriter
from tests.benches import load_bench

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def test_a_reduced_case_keeps_the_named_comparisons_and_steps(tmp_path: Path) -> None:
    bench = load_bench("memory_gpu")
    src = ROOT / "cases/emulated/gb200-qwen3-30b-a3b-dcp-graphs-emulated-16l.yaml"
    doc = yaml.safe_load(bench.reduced_case(f"{src}:4:graph_vs_eager", tmp_path).read_text())
    assert doc["train"]["steps"] == 4 and doc["train"]["memory_probe_step"] == 3
    assert list(doc["compare"]) == ["graph_vs_eager"]


def test_the_table_puts_the_prediction_beside_the_measurement(tmp_path: Path) -> None:
    bench = load_bench("memory_gpu")
    arm = tmp_path / "sweep" / "case-a" / "graph"
    writer = StepWriter(arm, 0)
    stats = GraphStats("line", 2, 8, 128, 13_794 * MIB, 0, 13_115 * MIB, 13_794 * MIB, 1, 1.0, 1.0, 0, 0)
    writer.append(StepRecord(1, max_allocated_bytes=59_937 * MIB,
                             memory_predicted=PredictedMemory(13_542 * MIB, 13_115 * MIB, 61_055 * MIB,
                                                              38_307 * MIB)))
    writer.append(StepRecord(2, graph_stats=stats))
    (row,) = bench.rows_of(tmp_path / "sweep")
    assert (row["case"], row["arm"], row["rank"]) == ("case-a", "graph", 0)
    text = bench.table([row])
    assert "13,542 / 13,794 = **0.9817**" in text and "13,115 / 13,115 = **1.0000**" in text
    assert "61,055 / 59,937 = **1.0187**" in text and "38,307 (0.639)" in text
