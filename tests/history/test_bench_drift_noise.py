"""bench/drift_noise.py runs: its synthetic check of the rule prints a row per figure and noise,
with no false alarm at a GPU-like noise of 0.5 % and the 2 % a sweep creep caught."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "drift_noise.py"


def test_the_synthetic_table(capsys):
    spec = importlib.util.spec_from_file_location("drift_noise", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["synthetic", "--sigmas", "0.5", "--series", "3", "--sweeps", "12"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0].strip("| ") for r in rows] == ["step_time_median_s", "peak_allocated_bytes",
                                               "final_loss"]
    for row in rows[:2]:
        assert row[2] == "0 / 27" and float(row[4]) <= 2  # no alarm; 2 % a sweep caught
