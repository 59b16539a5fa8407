"""The per-client gate in front of the expensive routes (app.web.workers.ClientGate) and
TCP_NODELAY on uvicorn's multi-worker sockets (app.web.security._no_delay): the two changes that
took /healthz p99 under 50 ms in bench/worst_load.py (issue 9)."""

from __future__ import annotations

import asyncio
import socket
import time

from app.web.security import _no_delay
from app.web.workers import ClientGate


class _Blocking:
    """An ASGI app that answers 200 once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope, receive, send) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(path: str, query: bytes = b"", client: str = "10.0.0.1") -> dict:
    return {"type": "http", "method": "GET", "path": path, "query_string": query, "client": (client, 1234),
            "headers": []}


async def _call(app, scope) -> tuple[int, float]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    t0 = time.monotonic()
    await app(scope, receive, send)
    return sent[0]["status"], time.monotonic() - t0


def test_a_client_beyond_its_share_gets_a_delayed_429_before_the_app_runs():
    async def scenario() -> None:
        inner = _Blocking()
        gate = ClientGate(inner, paths=("/api/v1/plan-search", "/fragment?action"), per_client=2, refusal_delay=0.2)
        first = [asyncio.create_task(_call(gate, _scope("/api/v1/plan-search"))) for _ in range(2)]
        await asyncio.sleep(0.05)
        status, waited = await _call(gate, _scope("/api/v1/plan-search"))
        assert status == 429 and waited >= 0.2 and inner.entered == 2  # refused without entering the app
        # another client, an ungated path, and /fragment without an action are not counted
        others = [asyncio.create_task(_call(gate, s)) for s in (
            _scope("/api/v1/plan-search", client="10.0.0.2"), _scope("/healthz"), _scope("/fragment", b"split=1"))]
        await asyncio.sleep(0.05)
        assert inner.entered == 5
        status, _ = await _call(gate, _scope("/fragment", b"split=1&action=nearest"))
        assert status == 429  # the same client: its two plan-searches fill its share
        inner.release.set()
        assert [s for s, _ in await asyncio.gather(*first, *others)] == [200] * 5
        assert gate.in_flight == {}  # every slot given back
        status, _ = await _call(gate, _scope("/fragment", b"action=balance"))
        assert status == 200

    asyncio.run(scenario())


def test_no_delay_is_set_on_a_socket_created_with_proto_0():
    """uvicorn binds the shared socket of workers > 1 with proto 0; asyncio then leaves Nagle on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        assert server.proto == 0
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()):
            conn, _ = server.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0

                class Transport:
                    def get_extra_info(self, name: str):
                        return conn if name == "socket" else None

                _no_delay(Transport())
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
