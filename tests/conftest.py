"""Fixtures every test folder may use."""

from tests.browser import browser  # noqa: F401  (the headless Chromium of page tests)
