"""The browser fixture drives a real headless Chromium over a local file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import browser as browser_mod


def test_the_browser_reads_a_local_page_and_screenshots_it(browser, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text("<!doctype html><title>t</title><table><tr><td>a</td></tr>"
                    "<tr><td>b</td></tr></table><div style='height:3000px'>tall</div>")
    browser.open(page)
    assert browser.count("tr") == 2
    assert browser.js("return document.title") == "t"
    shot = browser.screenshot("fixture-self-test")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    height = int.from_bytes(data[20:24], "big")  # IHDR: the whole page, not the window
    assert height >= 3000


def test_a_missing_browser_skips_here_and_fails_under_ci(monkeypatch) -> None:
    monkeypatch.setenv(browser_mod.CHROMIUM_ENV, "/nonexistent/chromium")
    assert "no Chromium" in (browser_mod.missing() or "")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        browser_mod.require_browser()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but the browser tests cannot run"):
        browser_mod.require_browser()
