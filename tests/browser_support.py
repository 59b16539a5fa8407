"""Shared launcher for the browser tests and ``scripts/screenshot.py``.

* :class:`AppServer` runs the real app (``uvicorn app.main:app``) in a subprocess on a free
  127.0.0.1 port with ``ISPLAN_DATA_DIR`` pointing at a directory of the caller's choosing, waits
  for ``/healthz`` and stops it again.
* :func:`chromium_context` starts Debian's Chromium (``ISPLAN_CHROMIUM``, default
  ``/usr/bin/chromium``) headless through Playwright with a fresh profile directory; no browser is
  downloaded.
* :class:`PageWatch` records console errors (Content-Security-Policy violations are console
  errors), uncaught page errors and dialogs of a page.

Nothing here imports pytest, so the screenshot script can use it as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CHROMIUM = "/usr/bin/chromium"
# --disable-dev-shm-usage: Debian's /usr/bin/chromium wrapper is meant to add it when /dev/shm is
# small (containers), but its check misfires on some mount setups; without it Chromium can crash.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
INSTALL_HINT = ("install Debian's Chromium (`apt-get install chromium`, or `make browser`) or point "
                "ISPLAN_CHROMIUM at a Chromium binary")
# The page is ready: app.js ran (body[data-ready]) and Plotly drew every figure on screen (figures
# below the fold are drawn when they scroll into view, so a first load does not fetch Plotly; app.js
# draws those within 200 px of the viewport, while a figure still to be fetched - ``.pending``, htmx's
# ``intersect`` - is asked for only once it is in the viewport itself).
FIGURES_DRAWN_JS = """() => {
  if (document.body.dataset.ready !== '1') return false;
  return Array.from(document.querySelectorAll('.plotly-figure')).every(f => {
    const r = f.getBoundingClientRect(), margin = f.classList.contains('pending') ? 0 : 200;
    return r.top > window.innerHeight + margin || r.bottom < -margin || f.querySelector('.main-svg') ||
      f.textContent.startsWith('figure unavailable');
  });
}"""

ALL_FIGURES_DRAWN_JS = """() => Array.from(document.querySelectorAll('.plotly-figure'))
  .every(f => f.querySelector('.main-svg'))"""


def chromium_path() -> str:
    return os.environ.get("ISPLAN_CHROMIUM", DEFAULT_CHROMIUM)


def chromium_missing_reason() -> str | None:
    """None when the configured Chromium can be started, else why not."""
    path = chromium_path()
    resolved = shutil.which(path)
    if resolved is None:
        return f"Chromium not found at {path!r} (ISPLAN_CHROMIUM); {INSTALL_HINT}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """The real app in a uvicorn subprocess; ``with AppServer(data_dir) as srv: srv.url``."""

    def __init__(self, data_dir: Path, *, log_path: Path | None = None, start_timeout: float = 60.0):
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path) if log_path else self.data_dir / "uvicorn.log"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> AppServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ISPLAN_DATA_DIR": str(self.data_dir), "PYTHONUNBUFFERED": "1"}
        last_error = ""
        for _attempt in range(3):  # another process may grab the free port between probe and bind
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                     "--port", str(self.port), "--log-level", "warning"],
                    cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                self._wait_healthy()
                return self
            except RuntimeError as exc:
                last_error = str(exc)
                self.stop()
                if "address already in use" not in last_error.lower():
                    break
        raise RuntimeError(last_error)

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with code {self.proc.returncode} before answering "
                                   f"/healthz; its log:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the app did not answer {self.url}/healthz within {self.start_timeout:.0f} s; "
                           f"its log:\n{self.log()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_profile(pw, user_data_dir: Path, *, width: int = 1440, height: int = 1800,
                   device_scale_factor: float = 1, timeout_ms: float = 20_000, args: tuple[str, ...] = ()):
    """A headless Chromium persistent context with a fresh profile in ``user_data_dir``, from a
    running Playwright ``pw`` (a second browser for the same test shares the first one's
    Playwright: the sync API allows one per thread); ``args`` are added to Chromium's command line
    (e.g. ``--host-resolver-rules`` for a plain-HTTP hostname). The caller closes it."""
    Path(user_data_dir).mkdir(parents=True, exist_ok=True)
    ctx = pw.chromium.launch_persistent_context(
        user_data_dir=str(user_data_dir), executable_path=chromium_path(), headless=True,
        args=[*CHROMIUM_ARGS, *args], viewport={"width": width, "height": height},
        device_scale_factor=device_scale_factor, accept_downloads=True, timeout=60_000)
    ctx.set_default_timeout(timeout_ms)
    ctx.isplan_playwright = pw
    return ctx


@contextlib.contextmanager
def chromium_context(user_data_dir: Path, *, width: int = 1440, height: int = 1800,
                     device_scale_factor: float = 1, timeout_ms: float = 20_000) -> Iterator:
    """A Playwright persistent context of headless Chromium with a fresh profile in ``user_data_dir``
    (one browser process; open pages with ``ctx.new_page()``; ``ctx.isplan_playwright`` is the
    Playwright that runs it, for :func:`launch_profile`)."""
    from playwright.sync_api import sync_playwright

    reason = chromium_missing_reason()
    if reason:
        raise RuntimeError(reason)
    with sync_playwright() as pw:
        ctx = launch_profile(pw, user_data_dir, width=width, height=height,
                             device_scale_factor=device_scale_factor, timeout_ms=timeout_ms)
        try:
            yield ctx
        finally:
            ctx.close()


class PageWatch:
    """Console errors, page errors and dialogs of one page. Dialogs are dismissed and recorded."""

    def __init__(self, page, name: str = "page"):
        self.page = page
        self.name = name
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda err: self.page_errors.append(str(err)))
        page.on("dialog", self._dialog)

    def _console(self, msg) -> None:
        if msg.type == "error":
            loc = msg.location or {}
            self.console_errors.append(f"{msg.text} ({loc.get('url', '')}:{loc.get('lineNumber', '')})")

    def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        with contextlib.suppress(Exception):
            dialog.dismiss()

    def problems(self) -> list[str]:
        return ([f"{self.name}: console error: {e}" for e in self.console_errors]
                + [f"{self.name}: page error: {e}" for e in self.page_errors]
                + [f"{self.name}: dialog opened: {d}" for d in self.dialogs])


def wait_for_figures(page, timeout_ms: float | None = None) -> None:
    page.wait_for_function(FIGURES_DRAWN_JS, timeout=timeout_ms)


def screenshot(out: Path, *, width: int = 1440, height: int = 1800, full_page: bool = True) -> Path:
    """Start the app and Chromium, open the default page, wait for the figures, write a PNG."""
    import tempfile

    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="isplan-shot-") as tmp:
        tmp_path = Path(tmp)
        with AppServer(tmp_path / "data") as srv, chromium_context(tmp_path / "profile", width=width,
                                                                    height=height) as ctx:
            page = ctx.new_page()
            watch = PageWatch(page, "screenshot")
            resp = page.goto(srv.url + "/", wait_until="load")
            if resp is None or resp.status != 200:
                raise RuntimeError(f"GET / answered {resp.status if resp else 'nothing'}")
            wait_for_figures(page)
            if full_page:  # figures are drawn when they scroll into view: bring each one in
                for fig in page.locator(".plotly-figure").all():
                    fig.scroll_into_view_if_needed()
                page.wait_for_function(ALL_FIGURES_DRAWN_JS)
                page.evaluate("() => window.scrollTo(0, 0)")
            page.evaluate("() => document.fonts ? document.fonts.ready.then(() => true) : true")
            page.wait_for_timeout(300)  # let Plotly finish its transitions
            page.screenshot(path=str(out), full_page=full_page)
            if watch.problems():
                raise RuntimeError("the page reported errors:\n" + "\n".join(watch.problems()))
    return out
