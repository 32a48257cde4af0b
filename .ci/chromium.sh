#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the page tests (tests/browser.py): the distribution's
# packages, installed once on CI's fresh machine. Nothing is started here: each test session
# starts its own headless browser and stops it.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "chromium: $(chromium --version 2>/dev/null), $(chromedriver --version)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
echo "chromium: $(chromium --version 2>/dev/null), $(chromedriver --version)"
