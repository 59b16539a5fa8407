"""app.web.security: headers on every response, same-origin writes, HEAD, the body deadline and
one-line disconnect logs, on a minimal FastAPI app (issue 9, "HTTP hygiene")."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from app.web.limits import BodySizeLimit
from app.web.security import secure

CSP = "default-src 'self'; script-src 'self'"
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "x-frame-options": "DENY",
           "referrer-policy": "same-origin"}


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/boom")
    def boom() -> dict:
        raise RuntimeError("bug")

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    @app.post("/api/v1/verify")
    async def verify(request: Request) -> dict:
        return {"n": len(await request.body())}

    app.add_middleware(BodySizeLimit, default=100, limits={})
    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(secure(_app(), csp=CSP), raise_server_exceptions=False)  # type: ignore[arg-type]


def _has_headers(r) -> None:
    for k, v in HEADERS.items():
        assert r.headers.get(k) == v, (r.status_code, k, r.headers)


@pytest.mark.parametrize(("method", "path", "kw", "status"), [
    ("GET", "/healthz", {}, 200),
    ("GET", "/nowhere", {}, 404),
    ("DELETE", "/healthz", {}, 405),
    ("POST", "/echo", {"content": b"x" * 101}, 413),
    ("GET", "/boom", {}, 500),
])
def test_security_headers_on_every_response(client, method, path, kw, status):
    r = client.request(method, path, **kw)
    assert r.status_code == status
    _has_headers(r)


def test_500_shield_when_added_inside_starlette():
    """With add_middleware (inside ServerErrorMiddleware) the 500 still carries the headers."""
    from app.web.security import SecurityHeaders

    app = _app()
    app.add_middleware(SecurityHeaders, csp=CSP)
    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500
    _has_headers(r)
    assert r.json()["errors"][0]["code"] == "internal_error"


@pytest.mark.parametrize("headers", [
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},
    {"origin": "https://evil.example"},
    {"origin": "null"},
    {"origin": "http://testserver.evil.example"},
])
def test_cross_site_post_is_403_json(client, headers):
    r = client.post("/echo", content=b"abc", headers=headers)
    assert r.status_code == 403
    body = r.json()
    assert body["valid"] is False and body["errors"][0]["code"] == "cross_site"
    _has_headers(r)


@pytest.mark.parametrize("headers", [
    {},  # curl, scripts
    {"sec-fetch-site": "same-origin"},
    {"sec-fetch-site": "none"},
    {"origin": "http://testserver"},
    {"origin": "http://testserver:80"},
])
def test_same_origin_and_headerless_posts_pass(client, headers):
    r = client.post("/echo", content=b"abc", headers=headers)
    assert r.status_code == 200 and r.json() == {"n": 3}


def test_cross_site_get_is_not_blocked(client):
    assert client.get("/healthz", headers={"sec-fetch-site": "cross-site"}).status_code == 200


def test_json_only_path_needs_json_content_type(client):
    r = client.post("/api/v1/verify", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["errors"][0]["message"]
    assert client.post("/api/v1/verify", content=b"{}", headers={"content-type": "application/json"}).status_code == 200


def test_head_answered_where_get_is(client):
    get = client.get("/healthz")
    head = client.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"] == str(len(b'{"status":"ok"}'))
    _has_headers(head)
    assert client.head("/nowhere").status_code == 404
    assert client.head("/echo").status_code == 405  # POST-only stays 405


# --------------------------------------------------------------------------- raw ASGI: disconnects and stalls


def _run(asgi, scope_extra: dict, messages: list[dict], stall: bool = False) -> list[dict]:
    scope = {"type": "http", "method": "POST", "path": "/echo", "headers": [], "query_string": b"",
             "scheme": "http", "server": ("testserver", 80), "client": ("1.2.3.4", 5), "root_path": "",
             "http_version": "1.1", **scope_extra}
    queue = list(messages)
    sent: list[dict] = []

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        if stall:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(asgi(scope, receive, send), 10))
    return sent


def test_client_disconnect_is_one_log_line(caplog):
    asgi = secure(_app(), csp=CSP)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="isplan.http"):
        sent = _run(asgi, {}, [{"type": "http.request", "body": b"ab", "more_body": True}])
    assert sent == []  # nobody to answer
    records = [r for r in caplog.records if r.name == "isplan.http"]
    assert len(records) == 1 and records[0].exc_info is None
    assert "client disconnected during POST /echo" in records[0].getMessage()


def test_stalled_body_gets_408_and_the_app_stops(caplog):
    asgi = secure(_app(), csp=CSP, body_seconds=0.2)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="isplan.http"):
        sent = _run(asgi, {}, [{"type": "http.request", "body": b"ab", "more_body": True}], stall=True)
    start = sent[0]
    assert start["status"] == 408
    headers = dict(start["headers"])
    assert headers[b"connection"] == b"close" and headers[b"x-frame-options"] == b"DENY"
    assert json.loads(sent[1]["body"])["errors"][0]["code"] == "timeout"
    assert len([m for m in sent if m["type"] == "http.response.start"]) == 1


def test_body_in_time_passes():
    asgi = secure(_app(), csp=CSP, body_seconds=5)  # type: ignore[arg-type]
    sent = _run(asgi, {}, [{"type": "http.request", "body": b"ab", "more_body": True},
                           {"type": "http.request", "body": b"cd", "more_body": False}])
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"n": 4}
