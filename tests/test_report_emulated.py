"""A sweep of emulated ranks judged and reported: per-rank comparisons, the replay check, the
emulated table (TE #3353's beside ours, the snapshot diff) and the label on every report line.

The records are made by hand in the shapes a CUDA run of emulated ranks writes (capture
statistics, replays per frame, memory probes, allocation-site tables), so this runs on CPU."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

import pytest

from harness.arms import plan_case
from harness.compare import Expected, Pair, evaluate_pair
from harness.launch.sweep_folder import finalize_case, prepare_case_dir
from harness.report import gate, load_sweep, write_reports
from harness.report.emulated import emulated_tables, rank_figures
from harness.results import (ArmOutcome, StepRecord, StepWriter, read_steps, record_json,
                             write_outcome)
from harness.sites import SiteBytes, SiteTable, read_sites, write_sites
from harness.spec.derive import as_emulated
from harness.trust.stored_plan import check_stored_plan

from tests.test_arms import GRAPHS, make_case

MIB = 2 ** 20
GIB = 2 ** 30
OK = ArmOutcome(status="ok", returncode=0, wall_s=3.0, detail="emulated ranks ok")
RANKS = (0, 3)
# device_delta_pct as cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml declares it (the
# default, +0.10 % between graph arms, would fail these figures' +0.36 %)
COMPARE = {"graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2, "device_delta_pct": 1.0},
           "graph_pools": {}, "reference": {}}
STEPS = 4


def stats(pool_mib: float, largest_mib: float, variants: int = 2) -> dict:
    return {"summary": f"{variants} dynamic-CP variants over 4 slot-aliased physical pool slots",
            "variants": variants, "physical_slots": 4, "graphs": 8,
            "pool_reserved_bytes": int(pool_mib * MIB), "pool_allocated_bytes": 0,
            "arena_bytes": int(0.8 * pool_mib * MIB), "largest_pool_bytes": int(largest_mib * MIB),
            "pools": 1, "capture_s": 0.1, "warmup_s": 0.1, "capture_peak_bytes": 0,
            "warmup_peak_bytes": 0}


def write_arm(case_dir: Path, arm: str, *, used_gib: float, reserved_gib: float,
              graph: Optional[dict], loss_of=lambda rank, step: 2.0 + rank - 0.1 * step,
              replays: tuple = ((1, 0, 6), (2, 1, 4))) -> None:
    for rank in RANKS:
        w = StepWriter(case_dir / arm, rank)
        for step in range(1, STEPS + 1):
            graphed = graph is not None and step > 1
            probe = ({"device_used_bytes": int((used_gib + rank) * GIB),
                      "device_total_bytes": 140 * GIB, "allocated_bytes": int(used_gib * GIB),
                      "active_bytes": int(used_gib * GIB), "reserved_bytes": int(reserved_gib * GIB)}
                     if step == 3 else None)
            w.append(StepRecord.from_dict({"step": step, "loss": loss_of(rank, step), "aux_loss": 1.0,
                      "grad_norm": 0.5 + rank, "step_time_s": 0.2 if graphed else 0.3,
                      "graphed": graphed, "memory_probe": probe, "max_allocated_bytes": 10 * GIB,
                      "graph_stats": graph if step == 2 else None,
                      "replays": [{"cp_size": c, "slot": s, "replays": n} for c, s, n in replays]
                      if graphed else []}))
        sites = (SiteBytes("graph pool", "active", "harness/slotmem/capture.py:10 build", 900 * MIB, 3),
                 SiteBytes("default", "free", "free beside harness/workload/train.py:299 train_arm",
                           int((reserved_gib - 5) * GIB), 2))
        write_sites(case_dir / arm, SiteTable(rank, 3, sites))
    write_outcome(case_dir / arm, OK)


def emulated_sweep(tmp_path: Path, **graph_arm) -> Path:
    case = as_emulated(make_case(compare=COMPARE, graphs=GRAPHS, train={"steps": STEPS}), RANKS)
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, tmp_path / "sweep")
    write_arm(case_dir, "graph", used_gib=20, reserved_gib=22, graph=stats(1000, 1000),
              **graph_arm)
    write_arm(case_dir, "dcp", used_gib=19, reserved_gib=21, graph=None)
    write_arm(case_dir, "graph-fixed-cp2", used_gib=19.5, reserved_gib=21.25,
              graph=stats(990, 990, 1), loss_of=lambda rank, step: 9.0 + step)
    write_arm(case_dir, "graph-separate-pools", used_gib=21, reserved_gib=23,
              graph=stats(1700, 1000))
    finalize_case(case_dir)
    return tmp_path / "sweep"


def test_a_sweep_of_emulated_ranks_is_judged_rank_by_rank(tmp_path: Path) -> None:
    sweep = emulated_sweep(tmp_path)
    view = load_sweep(sweep, check_stored_plan)
    (case,) = view.cases
    pairs = {p.pair: p for p in case.verdict.pairs}
    assert case.verdict.status == "pass", [(p.pair, p.status, p.error) for p in case.verdict.pairs]
    checks = {c.name: c for c in pairs["graph_vs_eager"].checks}
    # each rank against the same rank of the other arm (their losses differ between ranks)
    assert checks["loss"].passed and "emulated rank 0 of 4: exact: bitwise equal over 4 steps" \
        in checks["loss"].detail and "emulated rank 3 of 4: exact" in checks["loss"].detail
    assert checks["variants_replayed"].passed
    assert "forward replays per frame: cp1/slot0 18, cp2/slot1 12" in checks["variants_replayed"].detail
    assert checks["capture"].detail.startswith("emulated rank 0 of 4: 2 dynamic-CP variants")
    # loss sanity not applicable (rank 0's loss is its own), with the reason
    assert not checks["graph.loss_moves"].applicable
    assert "its own local figures" in checks["graph.loss_moves"].detail
    dcp = {c.name: c for c in pairs["dcp_vs_fixed_cp"].checks}
    assert not dcp["loss"].applicable and "lay the tokens over other ranks" in dcp["loss"].detail
    assert dcp["device_delta_pct"].applicable and "emulated rank 3 of 4 +512 MiB" in \
        dcp["device_delta_pct"].detail
    assert "(arenas 800 vs 792)" in {c.name: c for c in pairs["dcp_vs_fixed_cp"].checks}[
        "graph_pool_bytes"].detail
    assert pairs["reference"].status == "skipped" and "not run for emulated ranks" in \
        pairs["reference"].error
    assert not (sweep / "c" / "reference").exists()


def test_a_rank_that_differs_fails_graph_vs_eager_and_is_named(tmp_path: Path) -> None:
    sweep = emulated_sweep(tmp_path, loss_of=lambda rank, step: 2.0 + rank - 0.1 * step
                           + (1e-9 if rank == 3 and step == 4 else 0.0))
    (case,) = load_sweep(sweep, check_stored_plan).cases
    gve = next(p for p in case.verdict.pairs if p.pair == "graph_vs_eager")
    loss = next(c for c in gve.checks if c.name == "loss")
    assert gve.status == "fail" and not loss.passed
    assert "emulated rank 3 of 4: exact: 1 of 4 steps out of bound; worst step 4" in loss.detail
    assert "emulated rank 0 of 4: exact: bitwise equal" in loss.detail
    # per rank, the figure the emulated report shows (read from the verdict, not recomputed)
    figures = {c.name: c for c in gve.checks if c.figure}
    assert figures["r3.bitwise_steps"].value == 3.0
    assert figures["r3.bitwise_steps"].detail == "bitwise 3/4 steps, first mismatch step 4"
    assert figures["r0.bitwise_steps"].detail == "bitwise 4/4 steps"
    assert rank_figures(case, 3).bitwise == "bitwise 3/4 steps, first mismatch step 4"
    assert gate(sweep, check_plan=check_stored_plan) == 1


def test_a_verdict_written_before_the_bitwise_figures_still_holds(tmp_path: Path) -> None:
    """verdict.json of a sweep judged before graph_vs_eager reported its per-rank figures: the
    gate passes it (figures decide nothing) and the report shows them, from the verdict the
    records prove."""
    sweep = emulated_sweep(tmp_path)
    path = sweep / "c" / "verdict.json"
    data = json.loads(path.read_text())
    for entry in data["pairs"]:
        entry["checks"] = [c for c in entry["checks"] if not c["name"].endswith(".bitwise_steps")]
    path.write_text(json.dumps(data))
    assert "bitwise_steps" not in path.read_text()
    assert gate(sweep, check_plan=check_stored_plan) == 0
    (case,) = load_sweep(sweep, check_stored_plan).cases
    assert rank_figures(case, 3).bitwise == "bitwise 4/4 steps"


def test_a_variant_never_replayed_fails_the_replay_check(tmp_path: Path) -> None:
    sweep = emulated_sweep(tmp_path, replays=((1, 0, 6), (1, 1, 6)))
    (case,) = load_sweep(sweep, check_stored_plan).cases
    gve = next(p for p in case.verdict.pairs if p.pair == "graph_vs_eager")
    check = next(c for c in gve.checks if c.name == "variants_replayed")
    assert not check.passed and check.value == 1.0
    assert "emulated rank 0 of 4 replayed CP sizes [1] of 2 captured variant(s)" in check.detail


def test_plan_decisions_are_applied_when_a_pair_is_evaluated() -> None:
    steps = {0: [StepRecord(step=1, loss=1.0, grad_norm=1.0)]}
    skipped = Pair("g", "golden", ("a",), {"case_id": "c", "golden_dir": "/x", "steps": 1},
                   skipped="because")
    v = evaluate_pair("c", skipped, {})
    assert v.status == "skipped" and v.error == "because" and v.checks == ()
    marked = Pair("r", "repeat", ("a", "b"), {}, not_applicable={"loss": "not here"})
    v = evaluate_pair("c", marked, {"a": (OK, steps), "b": (OK, steps)},
                      Expected(steps=1, ranks=1))
    loss = next(c for c in v.checks if c.name == "loss")
    assert not loss.applicable and loss.detail == "not applicable: not here" and v.status == "pass"


def test_the_emulated_table_holds_the_figures_of_each_rank(tmp_path: Path) -> None:
    sweep = emulated_sweep(tmp_path)
    (case,) = load_sweep(sweep, check_stored_plan).cases
    f = rank_figures(case, 3)
    assert f.label == "emulated rank 3 of 4 (PP stage 0 of 1, pool rank 3)"
    assert f.bitwise == "bitwise 4/4 steps" and f.replayed_cp == (1, 2) and f.graphed_steps == 3
    assert f.capture.startswith("2 dynamic-CP variants over 4")
    assert f.shared_over_largest == pytest.approx(1.0) and f.separate_over_largest == pytest.approx(1.7)
    assert f.device_delta_mib == pytest.approx(512) and f.reserved_delta_mib == pytest.approx(768)
    assert f.device_delta_pct == pytest.approx(100 * 512 / (140 * 1024))
    assert f.step_s == (0.2, 0.3)
    (top, *_) = f.site_diff
    assert top.site.startswith("free beside") and top.delta == int(0.75 * GIB)
    text = emulated_tables(load_sweep(sweep, check_stored_plan))
    assert "| capture line | 2 dynamic-CP variants over 8 slot-aliased physical TE pool slots |" in text
    assert "| reserved delta (MiB) | +758..+1296 MiB (left for follow-up profiling) | +768 | +768 |" in text
    assert "emulated rank 3 of 4 (PP stage 0 of 1, pool rank 3): allocator snapshot diff" in text


def _lines_about_the_case(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.search(r"\bc\b", ln) and ("/" in ln or "|" in ln)]


def test_every_report_line_about_an_emulated_case_says_so(tmp_path: Path, capsys) -> None:
    sweep = emulated_sweep(tmp_path)
    files = write_reports(sweep, check_plan=check_stored_plan)
    summary = files.summary.read_text()
    rows = [ln for ln in summary.splitlines() if ln.startswith("| c ")]
    assert rows and all("(emulated rank 0 of 4, emulated rank 3 of 4)" in ln for ln in rows)
    bullets = [ln for ln in summary.splitlines() if ln.startswith(("- ", "### "))]
    assert bullets and all("emulated rank" in ln for ln in bullets), \
        [ln for ln in bullets if "emulated rank" not in ln]
    assert "## Emulated ranks: TE #3353's validation beside ours" in summary
    junit = ET.fromstring(files.junit.read_bytes())
    names = [tc.get("name") for tc in junit.iter("testcase")]
    assert names and all("emulated rank 0 of 4" in n for n in names)
    for el in junit.iter():
        if el.tag in ("failure", "error", "skipped"):
            assert "emulated rank" in (el.get("message") or "")
    index = json.loads(files.index.read_text())
    (entry,) = index["cases"]
    assert entry["emulated"]["labels"] == ["emulated rank 0 of 4 (PP stage 0 of 1, pool rank 0)",
                                           "emulated rank 3 of 4 (PP stage 0 of 1, pool rank 3)"]
    assert all("emulated rank" in p["title"] for p in entry["pairs"])
    assert all(a["emulated"] == entry["emulated"]["labels"] and a["figures"]["final_loss"] is None
               and a["sites"] == {"0": f"c/{n}/sites.rank0.json", "3": f"c/{n}/sites.rank3.json"}
               for n, a in entry["arms"].items())
    gate(sweep, check_plan=check_stored_plan)
    out = capsys.readouterr().out
    assert "1 case(s) of emulated ranks" in out and "not a multi-GPU run" in out
    assert all("emulated rank" in ln for ln in out.splitlines() if ln.startswith("  "))
    if files.plots:
        assert files.plots[0].read_bytes()[:4] == b"\x89PNG"


def test_site_tables_round_trip_and_an_unusable_one_is_named(tmp_path: Path) -> None:
    table = SiteTable(3, 2, (SiteBytes("default", "active", "x", 10, 1),))
    path = write_sites(tmp_path, table)
    assert path.name == "sites.rank3.json" and read_sites(tmp_path) == {3: table}
    (tmp_path / "sites.rank4.json").write_text(json.dumps(record_json(table)))
    with pytest.raises(Exception, match="sites.rank4.json: holds the sites of rank 3"):
        read_sites(tmp_path)
    (tmp_path / "sites.rank4.json").write_text('{"version": 1, "rank": 4}')
    with pytest.raises(Exception, match="sites.rank4.json: bad allocation-site table: field .step."):
        read_sites(tmp_path)
    assert read_steps(tmp_path) == {}
