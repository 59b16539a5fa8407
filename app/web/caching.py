"""Long-lived caching for versioned static files, as a pure ASGI middleware.

A static file is immutable when its URL names its version: a vendored file carries the version in
its name (``plotly-basic-4.1.1.min.js``); the project's own files are
linked as ``app.js?v=<digest of the file>`` (:data:`app.web.routers.pages.ASSET_VERSION`), so a
new release changes their URL. Those answers are ``public, max-age=31536000, immutable``; any
other file under ``/static/`` is revalidated on every use (``no-cache``), so an unversioned file
is never served stale.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from app.web.assets import asset_dir

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

IMMUTABLE = "public, max-age=31536000, immutable"


def _asset_version() -> str:
    """A digest of the page's own static files (``app.js``, ``app.css``): their ``?v=``."""
    digest = hashlib.sha256()
    for name in ("app.js", "app.css"):
        digest.update((asset_dir("static") / name).read_bytes())
    return digest.hexdigest()[:12]


#: ``?v=`` of the page's own files; templates link ``/static/app.js?v={{ asset_v }}``
ASSET_VERSION = _asset_version()
#: the Plotly bundle the page loads (``static/vendor/VENDOR.json``: version and SHA-256)
PLOTLY_FILE: str = json.loads((asset_dir("static") / "vendor" / "VENDOR.json").read_text())["plotly"]["file"]
VERSIONED_NAME = re.compile(r"/static/vendor/[^/]*-[0-9]+\.[0-9]+\.[0-9]+[^/]*$")


def static_cache_control(path: str, query: str) -> str:
    """The ``Cache-Control`` of a static file at ``path`` asked for with ``query``."""
    versioned = VERSIONED_NAME.search(path) is not None or query.startswith("v=")
    return IMMUTABLE if versioned else "no-cache"


class StaticCacheHeaders:
    """Set ``Cache-Control`` on successful ``/static/`` answers (see the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/static/"):
            await self.app(scope, receive, send)
            return
        value = static_cache_control(path, scope.get("query_string", b"").decode("latin-1")).encode()

        async def cached_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 200:
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"cache-control"]
                message = {**message, "headers": [*headers, (b"cache-control", value)]}
            await send(message)

        await self.app(scope, receive, cached_send)
