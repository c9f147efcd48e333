"""Debian's headless Chromium under Playwright, for the tests of what operators see.

No browser download is possible here: Playwright drives /usr/bin/chromium, which
scripts/install-services.sh installs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.support.env import IN_CI

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    """One browser for a module; in CI a missing Chromium fails, locally it skips."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: scripts/install-services.sh installs chromium"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
