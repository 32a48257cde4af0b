"""A real browser for page tests: headless Chromium (the distribution's ``chromium`` and
``chromium-driver``) driven by Selenium.

The ``browser`` fixture (registered in ``tests/conftest.py``) yields a :class:`Browser`. Where
Chromium, its driver or Selenium is missing the test is skipped with the reason, except under
``CI=true``, where it fails: CI installs them (``.ci/chromium.sh``) and must not pass a page test
it did not run. Screenshots go to ``$DCP_TEST_ARTIFACTS/browser/`` (default
``results/test-artifacts/browser/`` in the repository), the folder CI keeps as an artifact.

Chromium here runs as root on a machine without a network: the flags below keep it headless,
unsandboxed and quiet (no background connections, no component updates), with a fresh profile.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS_ENV = "DCP_TEST_ARTIFACTS"
CHROMIUM_ENV = "DCP_CHROMIUM"          # another Chromium binary (default: chromium on PATH)
CHROMEDRIVER_ENV = "DCP_CHROMEDRIVER"  # another driver (default: chromedriver on PATH)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000")


def artifacts_dir() -> Path:
    """Where page tests keep their screenshots (CI's artifact folder)."""
    base = os.environ.get(ARTIFACTS_ENV)
    return (Path(base) if base else ROOT / "results" / "test-artifacts") / "browser"


def _binary(env: str, *names: str) -> Optional[str]:
    given = os.environ.get(env)
    if given:
        return given if Path(given).is_file() else None
    return next((p for p in (shutil.which(n) for n in names) if p), None)


def missing() -> Optional[str]:
    """Why no browser test can run here (None: it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (`pip install -e '.[test]'`)"
    if _binary(CHROMIUM_ENV, "chromium", "chromium-browser") is None:
        return ("no Chromium (`apt-get install chromium chromium-driver`, or set "
                f"{CHROMIUM_ENV})")
    if _binary(CHROMEDRIVER_ENV, "chromedriver") is None:
        return f"no chromedriver (`apt-get install chromium-driver`, or set {CHROMEDRIVER_ENV})"
    return None


def require_browser() -> None:
    """Skip the calling test when no browser can run here; under CI=true, fail instead."""
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the browser tests cannot run: {reason}; .ci/chromium.sh "
                    "installs Chromium and its driver", pytrace=False)
    pytest.skip(reason)


class Browser:
    """One headless Chromium: ``open`` a local file, query it, ``screenshot`` the whole page."""

    def __init__(self, driver) -> None:  # type: ignore[no-untyped-def]
        self.driver = driver

    def open(self, path: Path) -> None:
        """Load a local file (``file://``) and wait until it has loaded."""
        self.driver.get(Path(path).resolve().as_uri())

    def timed_opens(self, path: Path, repeats: int) -> tuple[list[float], list[float]]:
        """Open ``path`` ``repeats`` times (each from a blank page): the wall seconds of each open
        (WebDriver's ``get`` returns after the load event) and the browser's own ``loadEventEnd``
        of each, in seconds. The benchmarks' one timing loop (``bench/page_size.py``,
        ``bench/scale.py``)."""
        walls, loads = [], []
        for _ in range(repeats):
            self.driver.get("about:blank")
            t = time.perf_counter()
            self.open(path)
            walls.append(time.perf_counter() - t)
            loads.append(self.js("const n = performance.getEntriesByType('navigation')[0];"
                                 "return n.loadEventEnd - n.startTime;") / 1000)
        return walls, loads

    def all(self, css: str) -> list:  # type: ignore[type-arg]
        """Every element matching the CSS selector (Selenium WebElements)."""
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def count(self, css: str) -> int:
        return len(self.all(css))

    def js(self, script: str, *args):  # type: ignore[no-untyped-def]
        """Run JavaScript in the page (``return ...`` gives a value)."""
        return self.driver.execute_script(script, *args)

    def screenshot(self, name: str) -> Path:
        """The whole page (not just the window) as ``<artifacts>/<name>.png``; its path.
        Content the page lets the browser skip while off screen (``content-visibility: auto``)
        is rendered for it."""
        self.driver.execute_script(
            "const s = document.createElement('style');"
            "s.textContent = '*{content-visibility: visible !important}';"
            "document.head.appendChild(s);")
        metrics = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                     "scale": 1}})
        out = artifacts_dir() / f"{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out


def start_browser(profile: Path) -> Browser:
    """A headless Chromium with a fresh profile folder ``profile``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _binary(CHROMIUM_ENV, "chromium", "chromium-browser") or ""
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=_binary(CHROMEDRIVER_ENV, "chromedriver"))
    return Browser(webdriver.Chrome(service=service, options=options))


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A headless Chromium for the session's page tests (skipped without one; failed under
    CI=true)."""
    require_browser()
    b = start_browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.driver.quit()
