"""The built site as a reader sees it: headless Chromium (tests/browser.py) opens the home page
and the CLI and policy references, served from this machine's loopback, in light and dark
mode, and each draws: its title, the navigation, and a search box that finds pages (the
search index works offline), with no error in the console and no request to another host.

Screenshots of each page go to ``$CALLBOX_DOCS_SCREENSHOTS`` when it is set (kept), else to the
test's temporary directory; the test prints where (``pytest -s``).
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser import chromium

PAGES = [("home", ""), ("cli-reference", "reference/cli/"), ("policy-reference", "reference/policy/")]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
TIMEOUT_MS = 30_000


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    """The built site served over HTTP on a free loopback port, for the module's tests."""
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = os.environ.get("CALLBOX_DOCS_SCREENSHOTS")
    where = Path(keep) if keep else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the documentation site: {where}")
    return where


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize(("name", "path"), PAGES, ids=[name for name, _ in PAGES])
def test_the_page_draws_and_searches_offline(browser: Any, site_url: str, screenshots: Path, name: str, path: str,
                                             scheme: str) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    context.set_default_timeout(TIMEOUT_MS)
    elsewhere: list[str] = []
    errors: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if urlsplit(url).hostname in LOCAL_HOSTS or url.startswith(("data:", "blob:")):
            request_route.continue_()
        else:
            elsewhere.append(url)
            request_route.abort()

    try:
        context.route("**/*", route)
        page = context.new_page()
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(site_url + path, wait_until="load")
        if errors and all("ERR_NETWORK_CHANGED" in error for error in errors):
            # The host's network interfaces changed during the load (sandboxes start and end beside
            # this test), and Chromium drops requests in flight then: the page is loaded again, once.
            errors.clear()
            page.reload(wait_until="load")

        assert "callbox" in page.title()
        heading = page.locator("article h1").first
        assert heading.is_visible() and heading.inner_text().strip()
        tabs = page.locator(".md-tabs__link")
        assert sum(tabs.nth(i).is_visible() for i in range(tabs.count())) >= 8, "the navigation tabs are not drawn"
        if path:  # a page of a section: its sidebar lists the section's pages
            side = page.locator(".md-sidebar--primary .md-nav__link")
            assert sum(side.nth(i).is_visible() for i in range(side.count())) >= 3
        scheme_attr = page.locator("body").get_attribute("data-md-color-scheme")
        assert scheme_attr == ("slate" if scheme == "dark" else "default"), scheme_attr
        page.screenshot(path=str(screenshots / f"{name}-{scheme}.png"))

        page.locator("label.md-search__icon, .md-search__input").first.click()
        search = page.locator("input.md-search__input")
        search.press_sequentially("sandbox", delay=30)  # the search box reads keystrokes, not a pasted value
        results = page.locator(".md-search-result__item")
        for _ in range(3):
            # A query typed before the worker has built its index is answered at the next key.
            try:
                results.first.wait_for(state="visible", timeout=10_000)
                break
            except PlaywrightTimeout:
                search.press("End")
        assert results.count() >= 1, "the search found nothing for 'sandbox'"
        assert "matching document" in page.locator(".md-search-result__meta").inner_text()
        page.screenshot(path=str(screenshots / f"{name}-{scheme}-search.png"))

        assert not errors, f"{path or 'home'}: console errors: {errors}"
        assert not elsewhere, f"{path or 'home'}: requests to other hosts: {elsewhere}"
    finally:
        context.close()
