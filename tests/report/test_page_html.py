"""index.html as text (no browser): what each section holds for hand-made sweeps, emulated
ranks said, nothing fetched from outside, no figures without plots."""

from __future__ import annotations

import re
from pathlib import Path

from harness.report import PAGE_FILE, write_reports
from harness.report.pair_figures import series_key
from harness.report.render import series_id
from tests.test_report import crashing, failing, passing
from tests.test_report_emulated import emulated_sweep


def test_sections_of_a_sweep_with_a_pass_a_failure_and_a_crash(tmp_path: Path) -> None:
    passing(tmp_path)
    failing(tmp_path)
    crashing(tmp_path)
    files = write_reports(tmp_path, plots=False)
    assert files.page == tmp_path / PAGE_FILE
    page = files.page.read_text()
    assert "<svg" not in page and "figures left out" in page
    assert page.count('<tr class="entry ') == len(files.sweep.rows)
    assert re.search(r'<p class="gate fail" id="gate">gate: FAIL \(exit 1\)', page)
    failures = page[page.index('<section id="failures">'):page.index('<section id="errors">')]
    assert 'data-case="b-nan" data-pair="repeat"' in failures and "eager-repeat.no_nan_inf" in failures
    errors = page[page.index('<section id="errors">'):page.index('<section id="entries">')]
    assert "c-crash" in errors and "dcp-harness run cases/focused/c.yaml -k c-crash" in errors
    # Only relative links and in-page anchors: nothing outside the sweep folder, no script.
    assert not re.search(r'(?:href|src)="(?!#)[a-z]+:', page) and "<script" not in page
    assert not re.search(r'href="/', page)


def test_a_case_of_emulated_ranks_says_so_and_draws_each_rank(tmp_path: Path) -> None:
    sweep = emulated_sweep(tmp_path)
    page = write_reports(sweep).page.read_text()
    assert "not a multi-GPU run" in page and "local loss (emulated ranks)" in page
    case = re.search(r'<section class="case" id="[^"]+" data-case="([^"]+)"', page)[1]
    for rank in (0, 3):  # the emulated ranks of emulated_sweep: one line of each per arm
        assert f'id="{series_id(series_key(case, "graph_vs_eager", "loss", "graph", rank))}"' in page
