"""Hostile uploads are refused fast, with a clear 4xx naming the problem, and memory stays bounded.

Through the real app (TestClient) for what the parser refuses; over a real uvicorn subprocess on
127.0.0.1 where streaming matters (a 50 MiB body, with and without ``Content-Length``, must be
answered 413 without the server reading it all: its RSS, from ``/proc/<pid>/status``, must not
grow by more than ~20 MB).
"""

from __future__ import annotations

import copy
import html
import json
import select
import socket
import threading
import time
from pathlib import Path
from typing import Self

import pytest

import app.main as web
from app.core.model.config import MAX_CONFIG_BYTES
from app.web.limits import DEFAULT_LIMIT, UPLOAD_LIMIT
from tests.browser_support import AppServer

PRESET = Path(web.__file__).resolve().parent / "core" / "presets" / "glm-5.2.json"
BASE = json.loads(PRESET.read_text())
SPLIT = "22,20,20,16"  # a valid GLM-5.2 layout (78 layers, PP=4)
QUICK = 5.0  # seconds: every refusal comes back well within this


def config_bytes(**fields) -> bytes:
    cfg = copy.deepcopy(BASE)
    cfg.update(fields)
    return json.dumps(cfg, indent=1).encode()


def with_field(name: str, value_json: str) -> bytes:
    """The preset with one more field whose JSON text is given verbatim (for hostile values)."""
    text = json.dumps(BASE, indent=1)
    return (text[: text.rindex("}")].rstrip() + f',\n "{name}": {value_json}\n}}').encode()


CLIENT_OPTIONS = dict(follow_redirects=False)  # the shared `client` fixture (tests/conftest.py) takes these


def upload(client, data: bytes, filename: str = "config.json"):
    rows = client.app.state.store.count()
    t0 = time.monotonic()
    r = client.post("/upload", files={"file": (filename, data, "application/json")}, data={"query": ""})
    r.elapsed_s = time.monotonic() - t0
    r.rows_added = client.app.state.store.count() - rows
    return r


def problem(r) -> str:
    """The message of a refusal: the JSON error's message, or the page's text."""
    if r.headers.get("content-type", "").startswith("application/json"):
        return " | ".join(e["message"] for e in r.json()["errors"])
    return html.unescape(r.text)


def refused(r, status: int, *needles: str) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.elapsed_s < QUICK
    assert getattr(r, "rows_added", 0) == 0, "a refused upload was stored"
    text = problem(r)
    for needle in needles:
        assert needle in text, (needle, text[:2000])
    return text


def accepted(client, r) -> str:
    assert r.status_code == 303, (r.status_code, problem(r)[:2000])
    model = next(p.split("=", 1)[1] for p in r.headers["location"].split("?", 1)[1].split("&")
                 if p.startswith("model="))
    assert model.startswith(("sha256%3A", "sha256:"))
    return model.replace("%3A", ":")


# --------------------------------------------------------------------------- through the app


def test_a_valid_upload_is_accepted(client):
    data = config_bytes(vocab_size=151_000)
    model = accepted(client, upload(client, data))
    assert client.get("/api/v1/check", params={"model": model, "split": SPLIT}).status_code == 200


def test_one_byte_over_1_mib_is_refused_naming_the_limit(client):
    data = with_field("padding", '"' + "x" * MAX_CONFIG_BYTES + '"')
    assert MAX_CONFIG_BYTES < len(data) < UPLOAD_LIMIT
    data = data[: MAX_CONFIG_BYTES + 1]  # exactly 1 MiB + 1
    refused(upload(client, data), 422, f"{MAX_CONFIG_BYTES + 1:,} bytes", "1 MiB")


def test_a_body_over_2_mib_is_413_before_the_app_reads_it(client):
    t0 = time.monotonic()
    r = client.post("/upload", files={"file": ("big.json", b" " * (3 << 20), "application/json")})
    r.elapsed_s = time.monotonic() - t0
    refused(r, 413, "2 MiB")
    body = r.json()
    assert body["valid"] is False and body["errors"][0]["code"] == "too_large"
    assert body["errors"][0]["field"] == "file"
    assert r.headers["connection"] == "close"


def test_a_chunked_body_over_2_mib_is_413(client):
    def chunks():
        for _ in range(64):  # 4 MiB in 64 KiB chunks, no Content-Length
            yield b"y" * (64 << 10)

    t0 = time.monotonic()
    r = client.post("/api/v1/verify", content=chunks(), headers={"content-type": "application/json"})
    r.elapsed_s = time.monotonic() - t0
    refused(r, 413, "2 MiB")


@pytest.mark.parametrize("path", ["/launcher", "/api/v1/verify"])
def test_the_other_upload_endpoints_share_the_2_mib_limit(client, path):
    t0 = time.monotonic()
    r = client.post(path, content=b"z" * (UPLOAD_LIMIT + 1), headers={"content-type": "application/json"})
    r.elapsed_s = time.monotonic() - t0
    refused(r, 413, "2 MiB", path)


def test_a_body_of_exactly_the_limit_reaches_the_endpoint(client):
    r = client.post("/api/v1/verify", content=b"z" * UPLOAD_LIMIT, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not JSON" in problem(r)


def test_everything_else_takes_at_most_64_kib(client):
    t0 = time.monotonic()
    r = client.post("/api/v1/about", content=b"q" * (DEFAULT_LIMIT + 1))
    r.elapsed_s = time.monotonic() - t0
    refused(r, 413, "64 KiB")
    assert client.post("/api/v1/about", content=b"q" * DEFAULT_LIMIT).status_code == 405  # not ours to refuse


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deep_nesting_is_refused(client, depth):
    # the top-level object is level 1, so depth - 1 nested arrays make `depth` levels
    data = with_field("nested", "[" * (depth - 1) + "]" * (depth - 1))
    assert len(data) < MAX_CONFIG_BYTES
    refused(upload(client, data), 422, "nests deeper than 64 levels")


def test_nesting_of_exactly_64_levels_is_accepted(client):
    accepted(client, upload(client, with_field("nested", "[" * 63 + "]" * 63)))


def test_a_deep_top_level_array_is_refused(client):
    refused(upload(client, b"[" * 100_000 + b"]" * 100_000), 422, "nests deeper than 64 levels")


@pytest.mark.parametrize("data", [
    b"\xff\xfe{\x00}\x00",  # UTF-16
    config_bytes()[:-40] + b"\xc3\x28" + config_bytes()[-40:],  # an invalid UTF-8 sequence inside
    config_bytes().replace(b"glm_moe_dsa", "glm_moe_dsa\u00e9".encode("latin-1")),  # Latin-1
], ids=["utf16", "invalid-sequence", "latin1"])
def test_non_utf8_is_refused(client, data):
    refused(upload(client, data), 422, "not UTF-8")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(client, constant):
    data = config_bytes().replace(b'"vocab_size": 154880', f'"vocab_size": {constant}'.encode())
    assert constant.encode() in data
    refused(upload(client, data), 422, constant, "not valid JSON")


def test_a_million_entry_array_is_refused_by_size(client):
    compact = with_field("million", json.dumps([0] * 10**6, separators=(",", ":")))
    assert MAX_CONFIG_BYTES < len(compact) < UPLOAD_LIMIT - 4096  # reaches the app: the 1 MiB config limit
    refused(upload(client, compact), 422, "1 MiB", f"limit is {MAX_CONFIG_BYTES:,} bytes")
    spaced = with_field("million", json.dumps([0] * 10**6))
    assert len(spaced) > UPLOAD_LIMIT  # refused by the request limit before the app
    refused(upload(client, spaced), 413, "2 MiB")


def test_a_100k_entry_array_in_a_checked_field_is_refused_naming_it(client):
    data = config_bytes(indexer_types=["full"] * 100_000)
    assert len(data) < MAX_CONFIG_BYTES
    refused(upload(client, data), 422, "indexer_types")


def test_a_100k_entry_array_elsewhere_is_a_valid_config(client):
    data = config_bytes(vocab_size=152_000, some_table=list(range(100_000)))
    assert len(data) < MAX_CONFIG_BYTES
    model = accepted(client, upload(client, data))
    cfg = client.app.state.store.get(model)
    assert cfg is not None and cfg.extra["some_table"][-1] == 99_999
    assert client.get("/api/v1/check", params={"model": model, "split": SPLIT}).status_code == 200


def test_duplicate_keys_are_refused_naming_the_key(client):
    text = json.dumps(BASE, indent=1)
    data = text.replace('"hidden_size": 6144,', '"hidden_size": 6144,\n "hidden_size": 4096,').encode()
    assert data.count(b'"hidden_size"') == 2
    refused(upload(client, data), 422, "repeats the key 'hidden_size'")


@pytest.mark.parametrize("field", ["vocab_size", "some_extra_field"])
def test_an_integer_of_5000_digits_is_a_422_not_a_500(client, field):
    data = with_field(field, "9" * 5000) if field != "vocab_size" else \
        config_bytes().replace(b'"vocab_size": 154880', b'"vocab_size": ' + b"9" * 5000)
    refused(upload(client, data), 422, "4300 digits")


def test_an_empty_file_is_refused(client):
    refused(upload(client, b""), 422, "not valid JSON")


@pytest.mark.parametrize("data", [b"[]", json.dumps([BASE]).encode(), b'"text"', b"42"])
def test_anything_but_an_object_at_the_top_level_is_refused(client, data):
    refused(upload(client, data), 422, "must be a JSON object")


# --------------------------------------------------------------------------- over a real server


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class RssPeak:
    """Samples the VmRSS of ``pid`` every few ms in a thread; ``peak_kb`` is the largest seen."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak_kb = rss_kb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, rss_kb(self.pid))
            time.sleep(0.003)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak_kb = max(self.peak_kb, rss_kb(self.pid))


def stream_body(port: int, path: str, total: int, *, chunked: bool, content_type: str,
                prefix: bytes = b"", deadline_s: float = 15.0) -> tuple[int, bytes, int, float]:
    """POST ``total`` bytes to ``path`` over a raw socket, 64 KiB at a time, stopping as soon as
    the server answers (or stops reading). Returns (status, body, bytes sent, seconds)."""
    chunk = b"x" * (64 << 10)
    t0 = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n"
        s.sendall(head.encode() + b"\r\n")
        pieces = [prefix] if prefix else []
        try:
            while sent < total and time.monotonic() - t0 < deadline_s:
                if select.select([s], [], [], 0)[0]:
                    break  # the answer is there: stop sending
                piece = pieces.pop() if pieces else chunk[: total - sent]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server answered and closed
        raw = b""
        try:
            while time.monotonic() - t0 < deadline_s:
                part = s.recv(65536)
                if not part:
                    break
                raw += part
                if b"\r\n\r\n" in raw:
                    head_end = raw.index(b"\r\n\r\n") + 4
                    length = [int(v.split(b":")[1]) for v in raw[:head_end].split(b"\r\n")
                              if v.lower().startswith(b"content-length:")]
                    if length and len(raw) >= head_end + length[0]:
                        break
        except (ConnectionResetError, TimeoutError):
            pass
    elapsed = time.monotonic() - t0
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    status = int(raw.split(b" ", 2)[1])
    return status, raw.split(b"\r\n\r\n", 1)[1], sent, elapsed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("upload-server")) as srv:
        yield srv


BOUNDARY = "----isplan-test-boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
PART_HEAD = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.json\"\r\n"
             "Content-Type: application/json\r\n\r\n").encode()

FIFTY_MIB = 50 << 20


@pytest.mark.slow
@pytest.mark.parametrize("path,chunked", [
    ("/upload", False),  # Content-Length: 50 MiB -> 413 before a byte is read
    ("/upload", True),  # chunked multipart: counted while the form parser streams it
    ("/api/v1/verify", True),  # chunked into an endpoint that reads the whole body: cut at 2 MiB
], ids=["upload-content-length", "upload-chunked", "verify-chunked"])
def test_a_50_mib_body_is_refused_without_reading_it(server, path, chunked, record_property):
    ctype = MULTIPART if path == "/upload" else "application/json"
    prefix = PART_HEAD if path == "/upload" else b""
    # warm up the code path (imports, the multipart parser, the 413 answer) before the baseline
    stream_body(server.port, path, 3 << 20, chunked=chunked, content_type=ctype, prefix=prefix)
    before = rss_kb(server.proc.pid)
    with RssPeak(server.proc.pid) as rss:
        status, body, sent, elapsed = stream_body(server.port, path, FIFTY_MIB, chunked=chunked,
                                                  content_type=ctype, prefix=prefix)
    growth_mb = (rss.peak_kb - before) / 1024
    record_property("rss_growth_mb", round(growth_mb, 2))
    print(f"\n{path} chunked={chunked}: sent {sent / 2**20:.1f} MiB of 50, {elapsed:.2f} s, "
          f"RSS {before / 1024:.1f} MB -> peak {rss.peak_kb / 1024:.1f} MB (+{growth_mb:.2f} MB)")
    assert status == 413
    err = json.loads(body)["errors"][0]
    assert err["code"] == "too_large" and "2 MiB" in err["message"]
    assert elapsed < QUICK
    assert sent < FIFTY_MIB // 2, "the client could push most of the 50 MiB: the server kept reading"
    assert growth_mb < 20, f"server RSS grew by {growth_mb:.1f} MB"
    # the server is fine afterwards
    assert stream_body(server.port, "/api/v1/verify", 10, chunked=False, content_type="application/json")[0] == 422


@pytest.mark.slow
def test_the_real_server_refuses_hostile_configs_quickly(server):
    """A few of the parser refusals again over the wire, with the answer timed end to end."""
    import urllib.error
    import urllib.request

    def post(data: bytes) -> tuple[int, str, float]:
        body = PART_HEAD + data + f"\r\n--{BOUNDARY}--\r\n".encode()
        req = urllib.request.Request(f"{server.url}/upload", data=body, method="POST",
                                     headers={"Content-Type": MULTIPART})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode(), time.monotonic() - t0
        except urllib.error.HTTPError as exc:
            return exc.code, html.unescape(exc.read().decode()), time.monotonic() - t0

    for data, needle in [
        (with_field("nested", "[" * 99_999 + "]" * 99_999), "nests deeper than 64 levels"),
        (with_field("million", json.dumps([0] * 10**6, separators=(",", ":"))), "1 MiB"),
        (b"\x80" + config_bytes(), "not UTF-8"),
        (config_bytes().replace(b'"vocab_size": 154880', b'"vocab_size": NaN'), "NaN"),
    ]:
        status, text, elapsed = post(data)
        assert status == 422 and needle in text and elapsed < QUICK, (status, needle, elapsed)


def test_a_hybrid_models_page_marks_each_layers_module(client):
    """An uploaded Nemotron 3 Nano config (tests/core/model/test_hybrid_family.py) draws each layer
    with its module - m Mamba, e MoE, a attention - and its title says so; the flags carry the
    pattern in | segments."""
    from tests.core.model.test_hybrid_family import NANO, PATTERN

    model = accepted(client, upload(client, json.dumps(NANO).encode()))
    r = client.get("/", params={"model": model, "engine": "megatron", "split": "14,13,13,12"})
    assert r.status_code == 200
    page = html.unescape(r.text)
    glyphs = "".join(a.split("</span>", 1)[0] for a in page.split('<span class="ffn" aria-hidden="true">')[1:53])
    assert glyphs == PATTERN.replace("M", "m").replace("E", "e").replace("*", "a")
    assert 'title="layer 1: full, a Mamba-2 mixer, stage 1' in page
    assert 'title="layer 2: full, an MoE block, stage 1' in page
    assert f"--hybrid-layer-pattern '{PATTERN[:14]}|{PATTERN[14:27]}|{PATTERN[27:40]}|{PATTERN[40:]}'" in page
