"""Headless Chromium for the tests that look at pages: Debian's ``/usr/bin/chromium``
(``make browser``, scripts/setup-browser.sh) driven by the ``playwright`` package, which is
pointed at it (no browser download). Without it a test skips saying how to get it, except
under CI=true, where it fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import unavailable

CHROMIUM = Path(os.environ.get("CALLBOX_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched headless Chromium (playwright's ``Browser``), closed on exit."""
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium) as root")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
