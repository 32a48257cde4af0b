"""index.html of a sweep larger than ``every_case_up_to`` in headless Chromium: the case that did
not pass is shown first, in full, with its curves; each passing case is a closed <details>
filled from the page's own JSON when it opens, or when a link names it or one of its entries;
nothing is fetched. Only the failing case gets a plots/ PNG. The sweep is ``bench/scale.py``'s
(real plans of 4 arms x 8 ranks, 20 steps of records; its first case fails), with the threshold
at one case so three cases show the large-sweep page."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.launch.sweep_folder import finalize_case
from harness.report import PAGE_FILE, load_sweep, shown_in_full, write_reports
from harness.report.page import anchor
from harness.trust.stored_plan import check_stored_plan
from tests.benches import load_bench

pytestmark = pytest.mark.slow  # synthesizes and judges three 32-rank-file cases (about 5-10 s)


def until(browser, css: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """Wait (up to 10 s) until ``css`` matches ``n`` elements: a collapsed case is filled once
    the browser has unpacked the page's JSON, a moment after it opens."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser.driver, 10).until(lambda _: browser.count(css) == n)


def by_id(element_id: str) -> str:
    """A CSS selector for an element id (case ids hold dots)."""
    return f'[id="{element_id}"]'


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, sweep, _ = load_bench("scale").synthesize(tmp_path_factory.mktemp("collapsed"), 3)
    for case_dir in sorted(p for p in sweep.iterdir() if (p / "plan.json").is_file()):
        finalize_case(case_dir)
    return sweep


def test_shown_in_full_is_every_case_of_a_small_sweep_else_those_that_did_not_pass(sweep) -> None:
    view = load_sweep(sweep)
    ids = [c.case_id for c in view.cases]
    assert [c.verdict.status for c in view.cases] == ["fail", "pass", "pass"]
    assert shown_in_full(view, every_case_up_to=3) == set(ids)
    assert shown_in_full(view, every_case_up_to=2) == {ids[0]}


def test_the_failing_case_first_the_passing_ones_collapsed_and_reachable(sweep, browser) -> None:
    files = write_reports(sweep, check_plan=check_stored_plan, every_case_up_to=1)
    failing, *passing = (c.case_id for c in files.sweep.cases)
    assert [p.stem for p in files.plots] == [failing]
    browser.open(sweep / PAGE_FILE)
    assert browser.js("return performance.getEntriesByType('resource').length") == 0
    order = [e.get_attribute("data-case") for e in browser.all("section.case, details.lazy")]
    assert order == [failing, *passing]
    full = browser.all("section.case")
    assert len(full) == 1 and full[0].get_attribute("id") == anchor(failing)
    assert browser.count(f"{by_id(anchor(failing))} .figure svg") == 3  # one per entry
    # Collapsed: closed and empty until opened.
    assert browser.count("details.lazy") == 2 and browser.count("details.lazy[open]") == 0
    assert browser.count("details.lazy section.case") == 0
    browser.js("arguments[0].click();", browser.all(f"{by_id(anchor(passing[0]))} > summary")[0])
    until(browser, f"{by_id(anchor(passing[0]))} section.case", 1)
    opened = browser.all(f"{by_id(anchor(passing[0]))} section.case")
    assert len(opened) == 1 and not opened[0].get_attribute("id")  # the <details> has it
    assert browser.count(f"{by_id(anchor(passing[0]))} table.arms tr.arm") == 4
    assert browser.count(f"{by_id(anchor(passing[0]))} tr.rank") == 4 * 8
    assert browser.count(f"{by_id(anchor(passing[0]))} .figure") == 0  # curves drawn for failures only
    # A link to an entry of a collapsed case opens it and reaches the entry.
    target = anchor(passing[1], "graph_vs_eager")
    link = browser.all(f'#entry-table a[href="#{target}"]')[0]
    browser.js("arguments[0].click();", link)  # as a reader's click (the table's header may cover it)
    assert browser.count(f"{by_id(anchor(passing[1]))}[open]") == 1
    until(browser, by_id(target), 1)
    top = browser.js(f"return document.getElementById('{target}').getBoundingClientRect().top")
    assert 0 <= top < browser.js("return window.innerHeight")  # scrolled to
