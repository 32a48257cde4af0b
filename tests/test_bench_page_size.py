"""bench/page_size.py: the regression cases' sweep it builds is a complete, judged sweep whose
only failures are the drifted arm's entries (so the page it measures has what a real failing
nightly's has), and its measurement reads the page in a real browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.report import load_sweep
from tests.benches import load_bench

pytestmark = pytest.mark.slow  # judges and renders 5 cases of 8 ranks (about 5-10 s)


def test_the_regression_sweep_is_judged_and_measured(tmp_path: Path, browser) -> None:
    bench = load_bench("page_size")
    sweep = bench.regression_sweep(tmp_path / "regression")
    view = load_sweep(sweep)
    assert len(view.cases) == 5 and not view.problems
    statuses = {(c.case_id, p.pair): p.status for c, p in view.rows}
    failing = {k for k, s in statuses.items() if s == "fail"}
    assert failing == {("gb200-qwen3-30b-a3b-dcp-graphs", "graph_vs_eager"),
                       ("gb200-qwen3-30b-a3b-dcp-graphs", "graph_pools")}
    assert set(statuses.values()) == {"pass", "fail"}  # nothing errored: the records are complete
    result = bench.measure(sweep, repeats=1)
    assert result["entry_rows"] == result["entries"] == len(statuses)
    assert result["figures"] == len(statuses) and result["bytes"] < bench.LIMIT_BYTES
    with pytest.raises(SystemExit, match="not empty"):
        bench.regression_sweep(sweep)
