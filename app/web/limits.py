"""Request body size limit, as a pure ASGI middleware (``app.add_middleware(BodySizeLimit)``).

A request whose ``Content-Length`` is over the limit for its path is answered ``413`` at once,
before the app runs and before a byte of the body is read. A body without a length (chunked)
is counted as it streams through to the app; once it passes the limit the client gets the same
``413`` and the app sees ``http.disconnect``, so nothing ever buffers more than the limit plus
one chunk. The ``413`` carries ``Connection: close`` so the server stops reading the rest.

Limits: 2 MiB for the endpoints that take a config, a launcher script or a receipt (a config is
at most 1 MiB, :data:`app.core.model.config.MAX_CONFIG_BYTES`, and the multipart overhead fits),
64 KiB for everything else. It is a plain ASGI callable, not ``BaseHTTPMiddleware``, which would
only see the body after the app had buffered it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_LIMIT = 64 << 10
UPLOAD_LIMIT = 2 << 20
PATH_LIMITS: dict[str, int] = {"/upload": UPLOAD_LIMIT, "/launcher": UPLOAD_LIMIT, "/api/v1/verify": UPLOAD_LIMIT}


def human_size(n: int) -> str:
    """``2 MiB``, ``64 KiB``, ``1000 bytes``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"


def too_large_body(limit: int, path: str) -> bytes:
    message = f"the request body is over the {human_size(limit)} limit ({limit:,} bytes) for {path[:100]}"
    if limit >= UPLOAD_LIMIT:
        message += "; a config.json may be at most 1 MiB"
    return json.dumps({"valid": False, "errors": [{"code": "too_large", "message": message, "field": "file"}]}).encode()


class BodySizeLimit:
    """Refuse request bodies over ``limits[path]`` (else ``default``) with a JSON ``413``."""

    def __init__(self, app: ASGIApp, default: int = DEFAULT_LIMIT, limits: Mapping[str, int] | None = None):
        self.app = app
        self.default = default
        self.limits = dict(PATH_LIMITS if limits is None else limits)

    def limit_for(self, path: str) -> int:
        return self.limits.get(path, self.default)

    async def _reject(self, scope: Scope, send: Send, limit: int) -> None:
        body = too_large_body(limit, scope.get("path", ""))
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
        ]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._reject(scope, send, limit)
            return

        received = 0
        started = False  # a response has begun (ours or the app's)
        rejected = False  # we sent the 413: drop whatever the app sends afterwards
        over = False

        async def limited_receive() -> Message:
            nonlocal received, started, rejected, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    if not started:
                        started = rejected = True
                        await self._reject(scope, send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # The app saw a disconnect in the middle of its body (ClientDisconnect and the like):
            # the client already has its 413, nothing to report.
            if not rejected:
                raise


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                n = int(value)
            except ValueError:
                return None
            return n if n >= 0 else None
    return None


# --------------------------------------------------------------------------- upload bytes per client


class UploadRate:
    """Bytes one client may send to the upload endpoints per minute, accepted or refused alike
    (``ISPLAN_UPLOAD_RATE_BYTES``; issue 20: refused uploads spent no quota, so a client could
    have the server parse a megabyte of hostile JSON as often as it liked).

    A token bucket per client (its address): it holds at most ``rate`` bytes and refills at
    ``rate / 60`` bytes a second; every body byte that arrives is charged as it streams in, so a
    refused or abandoned upload costs what it sent. A client whose bucket is empty gets a 429
    with ``Retry-After`` (the seconds until a full upload fits again) before a byte of its body is
    read. Per server process, like the other per-client limits."""

    WINDOW = 60.0
    MAX_CLIENTS = 10_000

    def __init__(self, app: ASGIApp, paths: Iterable[str] = ("/upload", "/launcher"), rate: int | None = None,
                 clock: Callable[[], float] | None = None):
        import time

        from app.settings import current

        self.app = app
        self.paths = frozenset(paths)
        self.rate = rate if rate is not None else current().upload_rate_bytes
        self.clock = clock or time.monotonic
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)

    def tokens(self, client: str) -> float:
        now = self.clock()
        tokens, at = self.buckets.get(client, (float(self.rate), now))
        return min(float(self.rate), tokens + (now - at) * self.rate / self.WINDOW)

    def charge(self, client: str, n: int) -> None:
        if len(self.buckets) > self.MAX_CLIENTS:  # forget clients whose buckets are full again
            now = self.clock()
            self.buckets = {c: v for c, v in self.buckets.items()
                            if v[0] + (now - v[1]) * self.rate / self.WINDOW < self.rate}
        self.buckets[client] = (self.tokens(client) - n, self.clock())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown", 0))[0]
        tokens = self.tokens(client)
        if tokens <= 0:
            wait = max(1, int(-tokens * self.WINDOW / self.rate) + 1)
            body = json.dumps({"valid": False, "errors": [{"code": "upload_rate", "field": "file", "message": (
                f"this client sent more than {human_size(self.rate)} of uploads in the last minute "
                f"(ISPLAN_UPLOAD_RATE_BYTES; refused uploads count too); retry in {wait} s")}]}).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(wait).encode()), (b"connection", b"close"), (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": body})
            return

        async def charged_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.charge(client, len(message.get("body", b"")))
            return message

        await self.app(scope, charged_receive, send)
