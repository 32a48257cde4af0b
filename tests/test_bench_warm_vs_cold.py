"""bench/warm_vs_cold.py: the same case run cold and warm through the CLI gives equal records (the
bench passes), and a record changed in one sweep is found and named (the bench fails)."""

from __future__ import annotations

import json
import math

from tests.benches import load_bench


def test_timings_are_left_out_and_the_first_difference_is_named():
    bench = load_bench("warm_vs_cold")
    a = {"step": 1, "loss": 2.0, "step_time_s": 0.5, "probe": {"taken_at": 1.0, "bytes": 3}}
    b = {"step": 1, "loss": 2.0, "step_time_s": 0.7, "probe": {"taken_at": 2.0, "bytes": 3}}
    assert bench.first_difference(bench.without_timings(a), bench.without_timings(b)) is None
    assert bench.first_difference({"x": [1.0, math.nan]}, {"x": [1.0, math.nan]}) is None
    assert bench.first_difference({"x": [1.0, 2.0]}, {"x": [1.0, 2.5]}) == "x[1]"
    assert bench.first_difference({"x": 1}, {"y": 1}) == "x"


def test_cold_and_warm_runs_of_a_case_compare_equal_and_a_changed_record_is_caught(tmp_path,
                                                                                  capsys):
    bench = load_bench("warm_vs_cold")
    out = tmp_path / "wc"
    assert bench.main(["cases/focused", "-k", "tiny-static-cp2.scope-attn", "--out", str(out),
                       "--json", str(tmp_path / "wc.json")]) == 0
    printed = capsys.readouterr().out
    assert "| equal |" in printed and "verdicts: the same" in printed
    rows = json.loads((tmp_path / "wc.json").read_text())["rows"]
    assert rows and all(r["equal"] and r["steps"] > 0 for r in rows)

    # One loss in the warm sweep off by one part in 1e12: named, and the bench fails.
    record = next(out.glob("warm/*/*/rank0.jsonl"))
    lines = record.read_text().splitlines()
    first = json.loads(lines[0])
    first["loss"] = first["loss"] * (1 + 1e-12)
    record.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    arm = str(record.parent.relative_to(out / "warm"))
    row = next(r for r in bench.compare_sweeps(out / "cold", out / "warm") if r["arm"] == arm)
    assert not row["equal"] and row["first_difference"] == "0[0].loss"
