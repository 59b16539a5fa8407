"""gzip for the answers that a client accepts it for, with Intel's ISA-L deflate where it is installed.

Starlette's :class:`~starlette.middleware.gzip.GZipMiddleware` decides what to compress (text
bodies of at least ``minimum_size`` bytes, not a ``206``, not one that already has a
``Content-Encoding``) and compresses with :mod:`zlib`. This is that middleware with the
compressor swapped: ``isal.isal_zlib.compressobj`` (python-isal, the ISA-L library's bindings:
the same ``compress`` / ``flush`` / ``Z_SYNC_FLUSH`` interface as :mod:`zlib`, gzip framing by
``wbits = 16 + MAX_WBITS``). Every gzip reader reads its output (RFC 1952).

Why: a live update's 61 KB fragment took 0.77-0.80 ms in zlib level 1 on this 2-core machine
(12.5 KB) and 0.10 ms in ISA-L level 1 (12.4 KB), about a tenth of the whole fragment request
(``bench/api_latency.py``). ISA-L's levels are 0-3 (a higher level is taken as 3). Without
``isal`` (a platform it has no wheel for) zlib does the work at the level asked, as before.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware, GZipResponder
from starlette.types import ASGIApp, Receive, Scope, Send

deflate: Any
try:
    from isal import isal_zlib as deflate
except ImportError:  # pragma: no cover - isal has wheels wherever CPython runs on x86-64 / arm64
    deflate = None


class _Compressor(Protocol):
    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self, mode: int = ..., /) -> bytes: ...


def compressor(level: int) -> _Compressor:
    """A gzip-framed deflate stream at ``level`` (1 = fastest): ISA-L's when installed, else zlib's."""
    if deflate is not None:
        return deflate.compressobj(min(level, 3), deflate.DEFLATED, 16 + deflate.MAX_WBITS)
    return zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)


ENGINE = "isa-l" if deflate is not None else "zlib"


def gzip_bytes(data: bytes, level: int = 1) -> bytes:
    """``data`` as one gzip member (:func:`compressor`): a huge plan's page, compressed in the worker
    that renders it (level 3 there: ISA-L's smallest output, still faster than zlib's level 1)."""
    c = compressor(level)
    return c.compress(data) + c.flush()


class _Responder(GZipResponder):
    """Starlette's responder with :func:`compressor` (the flush modes have the same values in both)."""

    @property
    def compressor(self) -> Any:
        if self._compressor is None:
            self._compressor = compressor(self.compresslevel)  # type: ignore[assignment]
        return self._compressor


class GZip(GZipMiddleware):
    """:class:`~starlette.middleware.gzip.GZipMiddleware` whose gzip responder is :class:`_Responder`."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "gzip" not in Headers(scope=scope).get("Accept-Encoding", ""):
            await super().__call__(scope, receive, send)
            return
        responder: ASGIApp = _Responder(self.app, self.minimum_size, compresslevel=self.compresslevel,
                                        thread_minimum_size=self.thread_minimum_size,
                                        exclude_content_types=self.exclude_content_types)
        await responder(scope, receive, send)
