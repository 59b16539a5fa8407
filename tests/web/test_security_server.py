"""A real uvicorn with app.web.security.uvicorn_options(): a request head that never completes is
cut off at its deadline, on a new connection and between keep-alive requests (slowloris)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request

from app.web.security import other_requests_waiting, secure, uvicorn_options
from tests.browser_support import free_port


@pytest.fixture(scope="module")
def server():
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(0.6)
        return {"slept": True}

    @app.get("/others")
    async def others() -> dict:
        return {"waiting": other_requests_waiting()}

    port = free_port()
    config = uvicorn.Config(secure(app, csp="default-src 'self'", body_seconds=0.5), host="127.0.0.1", port=port,
                            log_level="warning", **uvicorn_options(header_seconds=0.5))
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(10)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed the connection (None if it stayed open)."""
    sock.settimeout(seconds)
    t0 = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    return time.monotonic() - t0


def test_incomplete_head_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
        for _ in range(3):  # trickling bytes does not extend the deadline
            time.sleep(0.1)
            s.sendall(b"X-A: b\r\n")
        closed = _closed_within(s, 3)
    assert closed is not None and closed < 2


def test_silent_connection_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        assert _closed_within(s, 3) is not None


def test_complete_requests_and_keep_alive_then_stall(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2)  # two pipelined requests
        s.settimeout(3)
        data = b""
        while data.count(b'{"status":"ok"}') < 2:
            data += s.recv(4096)
        assert data.count(b"HTTP/1.1 200") == 2 and data.lower().count(b"x-frame-options: deny") == 2
        time.sleep(0.3)  # idle between requests, within the deadline: still open
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next head stalls
        closed = _closed_within(s, 3)
        assert closed is not None and closed < 1


def test_stalled_body_gets_408_and_the_connection_closes(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        s.settimeout(5)
        t0 = time.monotonic()
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except TimeoutError:
            pass
        assert data.startswith(b"HTTP/1.1 408") and b'"code": "timeout"' in data
        assert time.monotonic() - t0 < 3


def test_body_in_time_is_answered(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789")
        s.settimeout(5)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b'{"n":10}')


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        s.settimeout(5)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return data.partition(b"\r\n\r\n")[2]


def test_the_server_says_whether_other_requests_wait(server):
    """The page renders on the event loop only when no other request of this process is in
    flight (app.web.routers.pages.render_page): the signal is uvicorn's own task per request."""
    assert json.loads(_get(server, "/others")) == {"waiting": False}
    slow = threading.Thread(target=_get, args=(server, "/slow"))
    slow.start()
    time.sleep(0.2)  # /slow is in flight
    assert json.loads(_get(server, "/others")) == {"waiting": True}
    slow.join(5)
    assert json.loads(_get(server, "/others")) == {"waiting": False}


def test_the_server_runs_on_uvloop():
    """uvloop is a dependency (pyproject.toml): the loop's own socket work is what /healthz waits
    behind under a flood (app.web.security.event_loop)."""
    import importlib.util

    assert importlib.util.find_spec("uvloop") is not None
    assert uvicorn_options()["loop"] == "uvloop"
