"""Reports of graph cases: memory/pool figures, skipped entries, the gate when nothing ran."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.compare import Pair, evaluate_case, write_verdict
from harness.report import gate, write_reports
from harness.results import (ArmOutcome, GraphStats, StepWriter, read_outcome, read_steps,
                             write_json_atomic, write_outcome)
from harness.launch.sweep_folder import finalize_case
from tests.records import graph_stats, probe, record
from tests.sweeps import hand_case

GIB = 2 ** 30
OK = ArmOutcome(status="ok", returncode=0, wall_s=2.0)
POOLS = Pair("graph_pools", "graph_pools", ("graph", "graph-separate-pools"), {"max_ratio": 1.05})
DCP = Pair("dcp_vs_fixed_cp", "dcp_vs_fixed_cp", ("graph", "graph-fixed-cp2"),
           {"fixed_cp": 2, "device_delta_pct": 1.0})


def write_arm(d: Path, arm: str, used: float, graph: GraphStats | None) -> None:
    for rank in range(2):
        w = StepWriter(d / arm, rank)
        for step in (1, 2, 3):
            mem = (probe(used + rank * GIB, total=140 * GIB, allocated=used, active=used,
                         reserved=used) if step == 3 else None)
            w.append(record(step, 2.0 / step, aux_loss=1.0, step_time_s=0.1, graphed=step > 1,
                            memory_probe=mem, graph_stats=graph if step == 2 else None))
    write_outcome(d / arm, OK)


def graph_case(sweep: Path, shared_pool: float) -> Path:
    d = hand_case(sweep, "g", [DCP, POOLS], ["graph", "graph-separate-pools", "graph-fixed-cp2"],
                  steps=3)
    write_arm(d, "graph", 20 * GIB, graph_stats(shared_pool, shared_pool, 1))
    write_arm(d, "graph-separate-pools", 21 * GIB, graph_stats(3.4 * GIB, 2 * GIB, 2))
    write_arm(d, "graph-fixed-cp2", 20.5 * GIB, graph_stats(1.9 * GIB, 1.9 * GIB, 1))
    finalize_case(d)
    return d


def test_pool_ratio_and_memory_deltas_are_judged_and_reported(tmp_path: Path) -> None:
    graph_case(tmp_path, shared_pool=2.02 * GIB)
    files = write_reports(tmp_path)
    summary = files.summary.read_text()
    assert files.exit_code == 0
    assert "## Graph and memory figures" in summary
    assert "r0 1.010 (separate pools 1.700, largest variant 2048 MiB)" in summary
    assert "device_used_bytes graph - graph-fixed-cp2" in summary and "-512 MiB (-0.36%)" in summary
    assert "graph / graph-fixed-cp2" in summary  # step-time ratio line
    if files.plots:  # matplotlib present: per-rank memory bars beside the curves
        assert files.plots[0].read_bytes()[:4] == b"\x89PNG"


def test_pool_ratio_over_bound_fails_the_gate(tmp_path: Path) -> None:
    graph_case(tmp_path, shared_pool=2.5 * GIB)
    write_reports(tmp_path, plots=False)
    assert gate(tmp_path) == 1


def test_skipped_arms_skip_their_pairs_and_a_sweep_of_skips_is_not_a_pass(tmp_path: Path, capsys) -> None:
    pair = Pair("graph_vs_eager", "graph_vs_eager", ("graph", "eager"), {"loss": "exact"})
    d = hand_case(tmp_path, "gpu-only", [pair], ["graph", "eager"], steps=3, ranks=1)
    why = "needs CUDA (a graph case); this machine has no CUDA GPU"
    for arm in ("graph", "eager"):
        (d / arm).mkdir(parents=True)
        write_outcome(d / arm, ArmOutcome(status="skipped", detail=why))
    data = {a: (read_outcome(d / a), read_steps(d / a)) for a in ("graph", "eager")}
    verdict = evaluate_case("gpu-only", [pair], data, expected_steps=3, expected_ranks=1)
    assert verdict.status == "skipped" and verdict.pairs[0].error == why  # the reason, once
    write_verdict(d, verdict)
    files = write_reports(tmp_path, plots=False)
    assert files.exit_code == 2
    assert "## Skipped" in files.summary.read_text() and why in files.summary.read_text()
    tc = ET.parse(files.junit).getroot().find(".//testcase")
    assert tc is not None and tc.find("skipped").get("message") == why
    assert gate(tmp_path) == 2
    assert "nothing ran here" in capsys.readouterr().out


@pytest.mark.parametrize("other", ["pass", "skipped"])
def test_skips_beside_a_pass_keep_the_pass(tmp_path: Path, other: str) -> None:
    from harness.compare import combine_status

    assert combine_status(["skipped", other]) == other
    assert combine_status(["skipped", "error"]) == "error"
