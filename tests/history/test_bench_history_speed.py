"""bench/history_speed.py on a small scale: it adds a real sweep three ways and builds, shows and
checks a synthetic history through the history's own code (the figures are for bench/RESULTS-log.md;
here only that it measures what it says)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.history import check, open_history, record_sweep, series
from tests.benches import load_bench
from tests.history.sweeps import make_sweep, record_golden, started


def test_the_bench_adds_a_sweep_and_queries_a_synthetic_history(tmp_path: Path):
    bench = load_bench("history_speed")
    record_golden(tmp_path)
    sweep = make_sweep(tmp_path, tmp_path / "s1", started=started(0))
    out = tmp_path / "speed.json"
    assert bench.main(["--sweep", str(sweep), "--sweeps", "12", "--cases", "2", "--repeats", "1",
                       "--json", str(out)]) in (0, 1)
    result = json.loads(out.read_text())
    kept = record_sweep(sweep, url=f"sqlite:///{tmp_path / 'one.sqlite'}").figures
    assert result["add"]["figures"] == kept > 20 and result["sweeps"] == 12
    assert set(result["show"]) == {"build_s", "db_mib", "show_one_s", "show_one_plot_s",
                                   "show_every_s", "show_every_plot_s", "check_s",
                                   "show_one_process_s"}
    # The synthetic history is what the bench says: 12 nights, 2 cases x 2 arms, a slow creep
    # well inside the drift bound.
    url = f"sqlite:///{tmp_path / 'synthetic.sqlite'}"
    assert bench.build(url, 12, 2) > 0
    history = open_history(url)
    with history.read() as conn:
        found = series(conn, metric="step_time_median_s", last=20)
    history.close()
    assert len(found) == 4 and {len(v) for v in found.values()} == {12}
    assert check(found).exit_code == 0
