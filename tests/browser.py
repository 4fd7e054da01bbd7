"""The headless Chromium the browser tests drive (Debian's chromium through Playwright), and the one rule for when a
test without it is skipped: never in CI, which installs it (.ci/run), so a missing browser there fails loudly."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HAVE_CHROMIUM = Path(CHROMIUM).exists()

needs_chromium = pytest.mark.skipif(not HAVE_CHROMIUM and not os.environ.get("CI"),
                                    reason="Debian chromium not installed (CI installs it)")
