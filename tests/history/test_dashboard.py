"""The dashboard page: self-contained (no script, nothing fetched), the drift flags, the last
sweeps with links to their folders, a trend per case and platform whose plotted series have one
marker per sweep; and it loads in headless Chromium (the distribution's package) where one is
installed (the page tests' browser, ``tests/browser.py``: skipped without one, failed under
CI=true)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.cli import main
from tests.history.sweeps import drifting_sweeps
from tests.report.test_render import _points as points_of


class Elements(HTMLParser):
    """Every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def parse(page: str) -> list[tuple[str, dict[str, str]]]:
    parser = Elements()
    parser.feed(page)
    return parser.tags


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dashboard")
    nights = drifting_sweeps(root)
    (nights[-1] / "index.html").write_text("<html></html>")  # a sweep page to link to
    db = root / "results" / "history.sqlite"
    db.parent.mkdir()  # a database's folder is never made for it (but the default's, here)
    assert main(["history", "add", *map(str, nights), "--history", str(db)]) == 0
    out = root / "results" / "history.html"
    assert main(["history", "dashboard", "--history", str(db), "--out", str(out)]) == 0
    return out


def test_the_page_flags_the_drift_lists_the_sweeps_and_plots_each_sweep(page: Path):
    text = page.read_text()
    tags = parse(text)
    classes = [a.get("class", "") for t, a in tags if t == "tr"]
    assert classes.count("drift") == 1 and classes.count("sweep status-pass") == 5
    drift_row = re.search(r'<tr class="drift">(.*?)</tr>', text).group(1)
    assert re.findall(r"<td>(.*?)</td>", drift_row) == [
        "DRIFT", "drift-case", "eager", "step_time_median_s", "h100", "+10.9%", "5.0%", "5",
        "night2 (222222222222)"]
    # the verdict first, coloured; the drift's own plot under its row: the band and the marker
    assert tags[[t for t, _ in tags].index("body") + 1] == ("p", {"id": "verdict", "class": "fail"})
    flag = re.search(r'<div class="flag">(.*?)</div>', text, re.S).group(1)
    assert points_of(flag, "drift-case / eager step_time_median_s [h100]-eager") == 5
    assert "1e-" not in flag and "night2" in flag and "2222222" in flag  # sweep + short commit
    links = [a["href"] for t, a in tags if t == "a"]
    assert "../night4/" in links and "../night4/index.html" in links  # relative to the page
    (trend,) = [a for t, a in tags if t == "div" and "trend" in a.get("class", "")]
    assert (trend["data-case"], trend["data-platform"], trend["data-points"]) == (
        "drift-case", "h100", "5")
    assert "flagged" in trend["class"]
    # one marker per sweep in each plotted series (a <use> per point in the series' group)
    assert points_of(text, "step_time_median_s-eager") == 5


def test_the_page_needs_nothing_from_outside(page: Path):
    text = page.read_text()
    tags = parse(text)
    assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe")]
    fetched = [a.get("src", "") + a.get("href", "") for _, a in tags]
    assert not [u for u in fetched if u.startswith(("http:", "https:", "//"))]


def test_the_page_in_headless_chromium(page: Path, browser):
    browser.open(page)
    assert browser.count("#sweeps tr.sweep") == 5
    (row,) = browser.all("#drift tr.drift")
    assert [td.text for td in row.find_elements("css selector", "td")][:4] == [
        "DRIFT", "drift-case", "eager", "step_time_median_s"]
    (trend,) = browser.all("div.trend.flagged")
    assert trend.get_attribute("data-case") == "drift-case"
    # each plotted series: one marker per sweep, as drawn
    assert browser.count("g[id='series-step_time_median_s-eager'] use") == 5
    # the verdict at the top, red; the drift row is the first row of the drift table
    verdict = browser.all("#verdict")[0]
    assert verdict.text.startswith("history check: FAIL (exit 1)")
    assert browser.js("return getComputedStyle(document.getElementById('verdict'))"
                      ".backgroundColor") == "rgb(198, 40, 40)"
    assert browser.js("return document.querySelector('#drift tr:nth-child(2)').className") == "drift"
    assert browser.js("return document.querySelectorAll('svg').length") == 2  # the flag, the trend
    assert browser.screenshot("history-dashboard").stat().st_size > 10_000
