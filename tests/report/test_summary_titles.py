"""summary.md names an entry by its pair and arms; an entry without arms (``slot_ring-plan``: the
slot planner's figures) by its pair alone, in the table and in its figures' heading."""

from __future__ import annotations

from pathlib import Path

import harness
from harness.cli import main

ROOT = Path(harness.__file__).resolve().parents[1]
RING_CASE = ROOT / "cases" / "focused" / "gpu2-slot-ring-pp2-vpp2.yaml"


def test_an_entry_without_arms_has_no_empty_parentheses(tmp_path: Path, capsys,
                                                        monkeypatch) -> None:
    out = tmp_path / "sweep"
    # Without a GPU the graph arms are skipped; the planner's entry is judged anyway.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    main(["run", str(RING_CASE), "--out", str(out)])
    capsys.readouterr()
    summary = (out / "summary.md").read_text()
    assert "| gpu2-slot-ring-pp2-vpp2 | slot_ring-plan | 3/3 | PASS |" in summary
    assert "### gpu2-slot-ring-pp2-vpp2 / slot_ring-plan\n" in summary
    assert "()" not in summary
    assert "slot_ring (graph-mb4 vs graph-mb8 vs graph-mb12 vs graph-mb16)" in summary
