"""HTTP hygiene as pure ASGI middleware: headers on every response, same-origin writes, HEAD,
a body-read deadline, and one-line client-disconnect logs (issue 9, "HTTP hygiene").

Compose them with :func:`secure`, which wraps an ASGI app (the FastAPI app, *outside* everything
Starlette adds, so even its own 500 goes through):  ``asgi = secure(app, csp=CSP)``; uvicorn then
serves ``asgi``. Each class also works with ``app.add_middleware(Class, ...)``.

Rules (and why):

* :class:`SecurityHeaders` - ``Content-Security-Policy`` (the app's string, a constructor argument),
  ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin``
  and ``Cross-Origin-Opener-Policy: same-origin`` are set on *every* ``http.response.start``,
  404/405/413/500 included (issue 9: 413 and 500 lacked them). An exception before the response
  started becomes a JSON 500 with those headers and is re-raised (so the server still logs it and
  a test client still raises); a client that went away is logged in one line, not a traceback.
* :class:`SameOrigin` - a state-changing request (any method but GET/HEAD/OPTIONS) is refused with
  a JSON 403 when the browser says it is cross-site: ``Sec-Fetch-Site`` other than ``same-origin``
  or ``none`` (Fetch Metadata, https://www.w3.org/TR/fetch-metadata/), or an ``Origin`` whose host
  differs from ``Host`` (or ``Origin: null``). A request with neither header (curl, scripts) is
  not a browser acting for a user, and passes. Paths listed in ``json_only`` also need
  ``Content-Type: application/json`` (415 otherwise): a cross-site page cannot send that without a
  CORS preflight, which this app never grants.
* :class:`HeadAsGet` - ``HEAD`` is served by the ``GET`` route with the body dropped (FastAPI's
  routes answer HEAD with 405; RFC 9110 section 9.3.2 says HEAD is GET without content).
* :class:`AllowedHosts` - the ``Host`` header must name this server: a loopback name
  (``localhost``, ``*.localhost``), an IP address, or an operator's host (``ISPLAN_ALLOWED_HOSTS``);
  any other is a JSON 400 before the app runs (issue 20: DNS rebinding let a page on
  ``rebind.evil.example`` reach a loopback server and store uploads). An IP address cannot be
  rebound - the browser connects to the address it names - so probes and users that reach the
  server by its address keep working.
* :class:`BodyDeadline` - the whole request body must arrive within ``seconds`` of the first
  read; a body that stalls gets a JSON 408 with ``Connection: close`` and the app sees
  ``http.disconnect`` (issue 9: 400 stalled uploads held 840 MB). Slow *headers* are the server's
  job: run uvicorn with ``--timeout-keep-alive`` and ``--h11-max-incomplete-event-size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("isplan.http")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: The app's Content-Security-Policy: scripts from this origin only, no inline script anywhere.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


def security_headers(csp: str = CSP) -> list[tuple[bytes, bytes]]:
    """The headers every answer carries, the server's own 400 included."""
    return [(b"content-security-policy", csp.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"same-origin"),
            (b"cross-origin-opener-policy", b"same-origin")]


def error_body(status: int, code: str, message: str, field: str | None = None) -> bytes:
    """The JSON every isplan 4xx/5xx carries: ``{valid: false, errors: [{code, message, field}]}``."""
    return json.dumps({"valid": False, "errors": [{"code": code, "message": message, "field": field}]}).encode()


async def send_error(send: Send, status: int, code: str, message: str, *, close: bool = False) -> None:
    body = error_body(status, code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store")]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _is_disconnect(exc: BaseException) -> bool:
    """A client that went away: Starlette's ClientDisconnect, a reset/broken pipe, a closed stream."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ClientDisconnect", "ConnectionError", "BrokenResourceError", "ClosedResourceError",
                         "EndOfStream"})


# --------------------------------------------------------------------------- headers + errors


class SecurityHeaders:
    """Set the security headers on every response; turn an unhandled error into a JSON 500 with
    them; log a client disconnect in one line."""

    def __init__(self, app: ASGIApp, csp: str, extra: Iterable[tuple[str, str]] = ()):
        self.app = app
        self.headers = [*security_headers(csp), *((k.lower().encode(), v.encode()) for k, v in extra)]
        self._names = {k for k, _ in self.headers}

    def _with_headers(self, message: Message) -> Message:
        kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in self._names]
        return {**message, "headers": kept + self.headers}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        disconnected = False

        async def watched_receive() -> Message:
            nonlocal disconnected
            message = await receive()
            disconnected = disconnected or message["type"] == "http.disconnect"
            return message

        async def headed_send(message: Message) -> None:
            nonlocal started
            if disconnected:  # nobody is listening (Starlette answers a ClientDisconnect with a 500)
                return
            if message["type"] == "http.response.start":
                started = True
                message = self._with_headers(message)
            await send(message)

        try:
            await self.app(scope, watched_receive, headed_send)
        except Exception as exc:
            where = f"{scope.get('method', '?')} {scope.get('path', '?')[:200]}"
            if disconnected or _is_disconnect(exc):
                log.info("client disconnected during %s (%s)", where, type(exc).__name__)
                return
            if not started:
                await send_error(headed_send, 500, "internal_error",
                                 "internal error; the server log has the details")
            raise


# --------------------------------------------------------------------------- same origin


def _origin_host(origin: str) -> str | None:
    """``host[:port]`` of an Origin header, default port dropped, or None for ``null``/garbage."""
    scheme, sep, rest = origin.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
        return None
    return _normal_host(rest, scheme)


def _normal_host(host: str, scheme: str) -> str:
    """``host`` lower-cased without the default port of ``scheme`` (``:80`` / ``:443``)."""
    host = host.lower()
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return host[: -len(default)] if default and host.endswith(default) else host


class SameOrigin:
    """Refuse cross-site state-changing requests (403) and non-JSON bodies on JSON-only paths (415)."""

    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str] = (), json_only: Iterable[str] = ()):
        self.app = app
        self.allowed = {h for h in (_origin_host(o) for o in allowed_origins) if h}
        self.json_only = frozenset(json_only)

    def cross_site_reason(self, scope: Scope) -> str | None:
        """Why this request is cross-site, or None when it is same-origin or not from a browser."""
        site = _header(scope, b"sec-fetch-site")
        if site is not None and site.lower() not in ("same-origin", "none"):
            return f"Sec-Fetch-Site is {site[:40]!r}"
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        origin = origin.strip()
        origin_host = _origin_host(origin)
        if origin_host is None:
            return f"Origin is {origin[:80]!r}"
        # behind a TLS proxy the scope says http while the Origin says https: drop the Origin's default port
        own = _normal_host(_header(scope, b"host") or "", origin.partition("://")[0])
        if origin_host == own or origin_host in self.allowed:
            return None
        return f"Origin {origin[:80]!r} is not this server ({own[:80]!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method", "GET") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        reason = self.cross_site_reason(scope)
        if reason is not None:
            await send_error(send, 403, "cross_site",
                             f"cross-site {scope.get('method')} refused: {reason}; submit the form from this "
                             "server's own page (scripts without Origin/Sec-Fetch-Site headers are allowed)",
                             close=True)
            return
        if scope.get("path") in self.json_only:
            ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                await send_error(send, 415, "unsupported_media_type",
                                 f"{scope.get('path')} takes Content-Type: application/json, "
                                 f"got {ctype[:60] or 'none'!r}", close=True)
                return
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------- Host allow-list


def _host_name(host: str) -> str:
    """The name part of a ``Host`` value, lower-case, without port or trailing dot; ``[v6]`` kept bare."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AllowedHosts:
    """A JSON 400 (``Connection: close``) for a request whose ``Host`` is none of: ``localhost``
    or a ``*.localhost`` name, an IP address, or an entry of ``allowed`` (``name``,
    ``.suffix`` for it and its subdomains, ``*`` for any). A missing ``Host`` is refused too."""

    LOOPBACK_NAMES = ("localhost",)

    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()):
        self.app = app
        names = [a.lower().rstrip(".") for a in allowed]
        self.any = "*" in names
        self.exact = frozenset(n for n in names if not n.startswith(".")) | set(self.LOOPBACK_NAMES)
        self.suffixes = tuple(n for n in names if n.startswith(".")) + (".localhost",)

    def allows(self, host: str | None) -> bool:
        if self.any:
            return True
        if not host:
            return False
        name = _host_name(host)
        if name in self.exact or _is_ip_address(name):
            return True
        return any(name.endswith(s) or name == s[1:] for s in self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allows(_header(scope, b"host")):
            await self.app(scope, receive, send)
            return
        await send_error(send, 400, "unknown_host",
                         "this server does not answer for the host this request names; open it by its own "
                         "address (the operator lists other names in ISPLAN_ALLOWED_HOSTS)", close=True)


# --------------------------------------------------------------------------- HEAD


class HeadAsGet:
    """Answer ``HEAD`` with the ``GET`` route's status and headers and no body."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def bodiless_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, bodiless_send)


# --------------------------------------------------------------------------- body deadline


class BodyDeadline:
    """The request body must be complete within ``seconds`` of the app's first read (408 otherwise)."""

    def __init__(self, app: ASGIApp, seconds: float = 30.0):
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method", "GET") in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        deadline: float | None = None
        body_done = started = rejected = timed_out = False

        async def timed_receive() -> Message:
            nonlocal deadline, body_done, timed_out, started, rejected
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:  # after the body: waiting for a disconnect is not a slow body
                return await receive()
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + self.seconds
            try:
                message = await asyncio.wait_for(receive(), timeout=max(deadline - now, 0.0))
            except TimeoutError:
                timed_out = True
                log.info("request body not complete after %g s: %s %s", self.seconds,
                         scope.get("method"), scope.get("path", "")[:200])
                if not started:
                    started = rejected = True
                    await send_error(send, 408, "timeout",
                                     f"the request body did not arrive within {self.seconds:g} seconds; "
                                     "send it in one go (a slow or stalled upload is dropped)", close=True)
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:  # the client has our 408; whatever the app answers afterwards is dropped
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not rejected:
                raise  # after our 408 the app's complaint about the missing body is expected


# --------------------------------------------------------------------------- /docs


def swagger_ui_html(openapi_url: str = "/openapi.json", *, title: str = "isplan API",
                    static_prefix: str = "/static") -> str:
    """The ``/docs`` page on the vendored Swagger UI (``static/vendor/swagger-ui/``, version and
    SHA-256 in ``static/vendor/VENDOR.json``), started by ``static/swagger-init.js``: no CDN and
    no inline script, so it works under the app's ``script-src 'self'`` CSP (FastAPI's own
    ``/docs`` loads Swagger from a CDN that this CSP blocks)."""
    esc = html.escape
    vendor = f"{esc(static_prefix)}/vendor/swagger-ui"
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title>"
        f'<link rel="stylesheet" href="{vendor}/swagger-ui.css"></head>'
        f'<body><div id="swagger-ui" data-openapi-url="{esc(openapi_url)}"></div>'
        f'<script src="{vendor}/swagger-ui-bundle.js"></script>'
        f'<script src="{esc(static_prefix)}/swagger-init.js"></script>'
        "</body></html>\n"
    )


def secure(app: ASGIApp, *, csp: str, body_seconds: float = 30.0, allowed_origins: Iterable[str] = (),
           json_only: Iterable[str] = ("/api/v1/verify",), allowed_hosts: Iterable[str] | None = None) -> ASGIApp:
    """``app`` wrapped in every middleware of this module, outermost first: headers (and the 500
    shield), the Host allow-list (when ``allowed_hosts`` is given: the app always gives it),
    HEAD, same-origin, body deadline."""
    inner: ASGIApp = BodyDeadline(app, seconds=body_seconds)
    inner = SameOrigin(inner, allowed_origins=allowed_origins, json_only=json_only)
    inner = HeadAsGet(inner)
    if allowed_hosts is not None:
        inner = AllowedHosts(inner, allowed_hosts)
    return SecurityHeaders(inner, csp=csp)


# --------------------------------------------------------------------------- the server's own edges


def _h11_protocol() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


#: Seconds a request head may take (``ISPLAN_HEADER_SECONDS``).
HEADER_SECONDS = 10.0
#: Seconds a new connection may stay silent before its first byte (a connection that never
#: speaks is closed: issue 20, one peer holding 2,000 idle sockets starved everyone else).
FIRST_BYTE_SECONDS = 3.0
#: Open connections one server process holds in all; a new one beyond it is closed at once.
MAX_CONNECTIONS = 1000
#: Seconds between two log lines about the same peer's refused connections.
REFUSAL_LOG_SECONDS = 10.0

#: Open connections per peer key in this process (:func:`peer_key`).
_PEERS: dict[str, int] = {}
_REFUSAL_LOGGED: dict[str, float] = {}
#: uvicorn's set of this process's request tasks (``ServerState.tasks``: a task per request whose
#: head is parsed, until its response is sent; one set per process), published by every connection.
_REQUEST_TASKS: set[Any] | None = None


def other_requests_waiting() -> bool:
    """Whether this server process holds a request besides the one asking: uvicorn makes a task
    per request as soon as its head is parsed, so requests that arrived while the loop was busy
    count before they run. ``False`` outside uvicorn (an in-process test client)."""
    return _REQUEST_TASKS is not None and len(_REQUEST_TASKS) > 1


def peer_key(client: tuple[str, int] | None) -> str:
    """Who holds a connection, for the per-peer cap: the IPv4 address, an IPv6 address's /64
    prefix (one host usually owns a whole /64), or ``local`` for a Unix socket."""
    if not client:
        return "local"
    host = client[0]
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host[:100]
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr.ipv4_mapped or addr) if isinstance(addr, ipaddress.IPv6Address) else str(addr)



def _no_delay(transport: Any) -> None:
    """Send each response at once (``TCP_NODELAY``). asyncio sets it only on sockets whose
    ``proto`` is ``IPPROTO_TCP`` (``asyncio.base_events._set_nodelay``); the listening socket that
    uvicorn binds for ``workers > 1`` is created with ``proto`` 0, so its connections kept Nagle's
    algorithm, and every answer written in two parts (head, then body) waited for the client's
    delayed ACK: about 40 ms per request (bench/worst_load.py measured /healthz p50 44 ms with two
    workers, 2 ms with one)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _bad_request_bytes() -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = error_body(400, "bad_request", "the request is not valid HTTP/1.1 (a malformed request line or "
                                          "header, or a head over 16 KiB)")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"cache-control", b"no-store"), *security_headers()]
    return headers, body


class HeaderDeadlineH11Protocol(_h11_protocol()):  # type: ignore[misc]
    """uvicorn's ``H11Protocol`` with the server's own edges made safe (issues 9 and 20):

    * each request head must arrive within ``header_seconds`` (``ISPLAN_HEADER_SECONDS``), and a
      new connection must send its first byte within :data:`FIRST_BYTE_SECONDS`;
    * at most ``per_peer`` open connections per peer (``ISPLAN_CONNECTIONS_PER_CLIENT``,
      :func:`peer_key`) and :data:`MAX_CONNECTIONS` in all: a connection beyond either is closed
      at once, before it can hold a slot (uvicorn's ``limit_concurrency`` counted idle sockets,
      so one peer holding 2,000 of them made every other client's request a 503);
    * uvicorn's own 400 (a request h11 cannot parse) carries the security headers and isplan's
      JSON error body.

    Settings are read per process on the first connection (uvicorn spawns its worker processes,
    which see the operator's environment); a subclass may fix them (:func:`uvicorn_options`)."""

    header_seconds: float | None = None
    first_byte_seconds: float | None = None
    per_peer: int | None = None
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: Any) -> None:
        global _REQUEST_TASKS
        super().connection_made(transport)
        _no_delay(transport)
        _REQUEST_TASKS = self.tasks
        cls = type(self)
        if cls.header_seconds is None or cls.per_peer is None:
            from app.settings import current

            s = current()
            cls.header_seconds = s.header_seconds if cls.header_seconds is None else cls.header_seconds
            cls.per_peer = s.connections_per_client if cls.per_peer is None else cls.per_peer
        self._head_cycle = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._opened = self.loop.time()
        self._spoken = False
        self._peer: str | None = peer_key(self.client)
        held = _PEERS.get(self._peer, 0) + 1
        _PEERS[self._peer] = held
        if held > (self.per_peer or MAX_CONNECTIONS) or len(self.connections) > self.max_connections:
            self._refuse(held)
            return
        first = self.first_byte_seconds if self.first_byte_seconds is not None else FIRST_BYTE_SECONDS
        self._arm_head_timer(min(first, self.header_seconds or HEADER_SECONDS))

    def _refuse(self, held: int) -> None:
        now = self.loop.time()
        peer = self._peer or "?"
        if now - _REFUSAL_LOGGED.get(peer, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            _REFUSAL_LOGGED[peer] = now
            if len(_REFUSAL_LOGGED) > 10_000:
                _REFUSAL_LOGGED.clear()
            log.warning("connection from %s closed at once: it holds %d connections (the limit is %s per peer, "
                        "ISPLAN_CONNECTIONS_PER_CLIENT) or the server holds %d (limit %d)", peer, held, self.per_peer,
                        len(self.connections), self.max_connections)
        self.transport.close()

    def _arm_head_timer(self, seconds: float | None = None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_cycle = self.cycle
        self._head_timer = self.loop.call_later(self.header_seconds if seconds is None else seconds,
                                                self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.cycle is self._head_cycle and not self.transport.is_closing():
            what = "request head not complete" if self._spoken else "no byte"
            log.info("%s after %.3g s from %s; connection closed", what, self.loop.time() - self._opened,
                     self.client[0] if self.client else "?")
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._spoken and data:
            self._spoken = True
            if self._head_timer is not None and self.cycle is self._head_cycle:
                # the first byte arrived: the head has until header_seconds after the connection opened
                elapsed = self.loop.time() - self._opened
                self._arm_head_timer(max((self.header_seconds or HEADER_SECONDS) - elapsed, 0.0))
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._head_cycle:
            self._head_timer.cancel()  # a new request's head is complete
            self._head_timer = None

    def on_response_complete(self) -> None:
        finished = self.cycle
        super().on_response_complete()  # may start a pipelined request (whose head is complete)
        if not self.transport.is_closing() and self.cycle is finished:
            self._arm_head_timer()

    def send_400_response(self, msg: str) -> None:
        import h11

        headers, body = _bad_request_bytes()
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            pass  # a response had already begun: nothing more can be said on this connection
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        peer, self._peer = self._peer, None
        if peer is not None:
            left = _PEERS.get(peer, 1) - 1
            if left > 0:
                _PEERS[peer] = left
            else:
                _PEERS.pop(peer, None)
        super().connection_lost(exc)


def uvicorn_options(header_seconds: float | None = None, keep_alive_seconds: int = 5,
                    per_peer: int | None = None, first_byte_seconds: float | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config``: the h11 protocol above (head
    and first-byte deadlines, per-peer and total connection caps, a 400 with the security
    headers), uvloop (:func:`event_loop`) and a short keep-alive. uvicorn's ``limit_concurrency``
    stays off: it counted idle connections, and its 503 carried no security headers (issue 20).

    Without explicit values the protocol is named by its import path (picklable, so it works
    with ``workers=N``, whose processes uvicorn spawns) and reads the settings; explicit values
    make a subclass, for a server in this process (``workers=1``)."""
    protocol: str | type = "app.web.security:HeaderDeadlineH11Protocol"
    fixed = {k: v for k, v in (("header_seconds", header_seconds), ("per_peer", per_peer),
                               ("first_byte_seconds", first_byte_seconds)) if v is not None}
    if fixed:
        protocol = type("HeaderDeadline", (HeaderDeadlineH11Protocol,), fixed)
    return {"http": protocol, "loop": event_loop(), "timeout_keep_alive": keep_alive_seconds,
            "limit_concurrency": None, "h11_max_incomplete_event_size": 16 * 1024}


def event_loop() -> str:
    """uvicorn's ``loop``: ``uvloop`` (a dependency wherever it builds), else asyncio's own.

    Under a flood of requests the event loop's own work - accepting, reading, writing, closing
    sockets - is what ``/healthz`` waits behind; libuv does it in C. Measured here with 24
    clients of refused 1 MiB uploads (``tests/web/test_security_round3_live.py``, 2 cores):
    ``/healthz`` p99 99-123 ms on asyncio's loop, 41-78 ms on uvloop."""
    import importlib.util

    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
