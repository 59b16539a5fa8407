"""The browser tests' fixtures: one app server (``python -m uvicorn app.main:app`` on a fresh
``ISPLAN_DATA_DIR``) and one Chromium (Debian's, fresh profile) per module, and ``open_page``, a
watched page whose console errors (a Content-Security-Policy violation is one), page errors and
dialogs fail the test that opened it. Chromium missing fails the run when ``CI`` is set and skips,
saying how to install it, elsewhere; Playwright is a test dependency (``pip install -e '.[test]'``),
so its absence is an import error, never a skip."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from browser_support import AppServer, PageWatch, chromium_context, chromium_missing_reason, wait_for_figures
from playwright.sync_api import Page


@pytest.fixture(scope="module")
def chromium_ready() -> None:
    reason = chromium_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run in CI: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def server(chromium_ready, tmp_path_factory) -> AppServer:
    with AppServer(tmp_path_factory.mktemp("isplan-data")) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium_ready, tmp_path_factory):
    with chromium_context(tmp_path_factory.mktemp("chromium-profile")) as ctx:
        yield ctx


@pytest.fixture
def open_page(browser, server) -> Callable[..., Page]:
    """``open_page(path)``: a new watched page at ``server.url + path`` (status and figures checked).
    At teardown every page it opened must have had no console error, page error or dialog."""
    watches: list[PageWatch] = []

    def _open(path: str = "/", *, status: int = 200, figures: bool = True, base: str | None = None) -> Page:
        page = browser.new_page()
        watch = PageWatch(page, path[:120])
        watches.append(watch)
        page.watch = watch  # tests that provoke an error on purpose read and clear it
        resp = page.goto((base or server.url) + path)
        assert resp is not None and resp.status == status, f"GET {path}: {resp.status if resp else None}"
        if figures:
            wait_for_figures(page)
        return page

    yield _open
    problems = [p for w in watches for p in w.problems()]
    for w in watches:
        w.page.close()
    if problems:
        pytest.fail("the browser reported:\n" + "\n".join(problems), pytrace=False)
