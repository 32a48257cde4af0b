"""The dashboard page: self-contained (no script, nothing fetched), the drift flags, the last
sweeps with links to their folders, a trend per case and platform whose plotted series have one
marker per sweep; and it loads in headless Chromium (the distribution's package) where one is
installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.cli import main
from tests.history.sweeps import drifting_sweeps


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
        "DRIFT", "drift-case", "eager", "step_time_median_s", "h100", "+12.6%", "5",
        "night1 (111111111111)"]
    links = [a["href"] for t, a in tags if t == "a"]
    assert "../night4/" in links and "../night4/index.html" in links  # relative to the page
    (trend,) = [a for t, a in tags if t == "div" and "trend" in a.get("class", "")]
    assert (trend["data-case"], trend["data-platform"], trend["data-points"]) == (
        "drift-case", "h100", "5")
    assert "flagged" in trend["class"]
    # one marker per sweep in each plotted series (matplotlib: a <use> per marker in its group)
    groups = re.findall(r'<g id="series-step_time_median_s-eager">(.*?)</g>\s*</g>', text, re.S)
    assert groups and groups[0].count("<use ") == 5


def test_the_page_needs_nothing_from_outside(page: Path):
    text = page.read_text()
    tags = parse(text)
    assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe")]
    fetched = [a.get("src", "") + a.get("href", "") for _, a in tags]
    assert not [u for u in fetched if u.startswith(("http:", "https:", "//"))]


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium (apt-get install chromium) to load the page in")
def test_the_page_loads_in_headless_chromium(page: Path, tmp_path: Path):
    shot = tmp_path / "dashboard.png"
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<tr class="sweep status-pass">') == 5
    assert '<tr class="drift">' in dom.stdout and "<svg" in dom.stdout
    shots = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1400,900",
                            page.as_uri()], capture_output=True, text=True, timeout=120, env=env)
    assert shots.returncode == 0 and shot.stat().st_size > 10_000, shots.stderr[-2000:]
