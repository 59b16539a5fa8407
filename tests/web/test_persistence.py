"""Acknowledged uploads survive concurrency and a SIGKILL of the server.

The store commits its ``INSERT`` (SQLite: WAL, ``synchronous=FULL``; PostgreSQL: a committed
transaction) inside ``put``, and ``/upload`` answers 303 only after ``put`` returns, so every 303
names a committed row. These tests drive a real uvicorn on 127.0.0.1 with ``ISPLAN_DATA_DIR`` in a
temporary directory, on SQLite and, when ``ISPLAN_TEST_DATABASE_URL`` is set, on PostgreSQL
(``tests/store_backends.py``; ``scripts/pg_test_server.sh`` starts a throw-away server).
"""

from __future__ import annotations

import copy
import hashlib
import http.client
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.browser_support import REPO, AppServer
from tests.store_backends import BACKENDS, ServerBackend, make_store, server_backend

#: a live server, worker processes or latency under load: run on its own (the Makefile's second part)
pytestmark = pytest.mark.exclusive

BASE = json.loads((REPO / "app" / "core" / "presets" / "glm-5.2.json").read_text())
SPLIT = "22,20,20,16"  # a valid GLM-5.2 layout (78 layers, PP=4)
BOUNDARY = "----isplan-persistence"


def config(vocab_size: int) -> bytes:
    cfg = copy.deepcopy(BASE)
    cfg["vocab_size"] = vocab_size
    return json.dumps(cfg, indent=1).encode()


def post_upload(port: int, data: bytes, filename: str = "config.json", timeout: float = 10) -> str | None:
    """POST /upload; the ``sha256:<hex>`` of a 303 (an acknowledged upload), else None."""
    body = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/json\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/upload", body=body,
                     headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 303:
            return None
        return parse_qs(urlsplit(resp.getheader("location")).query)["model"][0]
    finally:
        conn.close()


def check_status(port: int, model: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/api/v1/check?model={model}&split={SPLIT}")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def assert_rows_intact(backend: ServerBackend) -> list[str]:
    rows = backend.rows()
    bad = [h for h, b in rows if hashlib.sha256(b).hexdigest() != h]
    assert not bad, f"rows whose bytes fail their SHA-256: {bad}"
    return [h for h, _ in rows]


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path, monkeypatch):
    with server_backend(request.param, tmp_path / "data") as b:
        for key, value in b.env.items():
            monkeypatch.setenv(key, value)  # AppServer passes the environment on to uvicorn
        yield b


@pytest.mark.slow
def test_concurrent_uploads_of_the_same_and_different_configs(backend, monkeypatch):
    # all 16 clients share 127.0.0.1: give that one client 16 uploads in flight (the default share
    # of 2 is the per-client gate of issue 20, tested in tests/web/test_security_round3_live.py)
    monkeypatch.setenv("ISPLAN_WORK_PER_CLIENT", "16")
    configs = [config(150_000 + i) for i in range(5)]
    digests = {hashlib.sha256(c).hexdigest() for c in configs}
    with AppServer(backend.data_dir) as srv:
        def worker(t: int) -> list[tuple[int, str | None]]:
            out = []
            for k in range(10):
                i = (t + k) % len(configs)
                out.append((i, post_upload(srv.port, configs[i], filename=f"t{t}-{k}.json")))
            return out

        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            results = [r for rs in pool.map(worker, range(16)) for r in rs]
        elapsed = time.monotonic() - t0
        assert len(results) == 160 and elapsed < 30
        assert all(model is not None for _, model in results), "an upload was not acknowledged"
        for i, model in results:
            assert model == "sha256:" + hashlib.sha256(configs[i]).hexdigest()
        for model in {m for _, m in results}:
            assert check_status(srv.port, model) == 200
        stored = assert_rows_intact(backend)
        assert sorted(stored) == sorted(digests)  # identical uploads are one row


@pytest.mark.slow
def test_acknowledged_uploads_survive_sigkill(backend):
    data_dir = backend.data_dir
    acked: dict[str, int] = {}  # sha256:<hex> -> vocab_size
    next_vocab = iter(range(100_000, 200_000))
    srv = AppServer(data_dir)
    try:
        for round_ in range(2):
            srv.start()
            stop = threading.Event()
            errors: list[BaseException] = []

            def uploader(stop: threading.Event = stop, errors: list[BaseException] = errors) -> None:
                t_end = time.monotonic() + 20
                for _ in range(2000):
                    if stop.is_set() or time.monotonic() > t_end:
                        return
                    vocab = next(next_vocab)
                    data = config(vocab)
                    try:
                        model = post_upload(srv.port, data, timeout=5)
                    except (ConnectionError, http.client.HTTPException, OSError):
                        return  # the server is gone
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    if model is not None:
                        if model != "sha256:" + hashlib.sha256(data).hexdigest():
                            errors.append(AssertionError(f"303 names {model} for vocab_size={vocab}"))
                            return
                        acked[model] = vocab

            before = len(acked)
            thread = threading.Thread(target=uploader, daemon=True)
            thread.start()
            deadline = time.monotonic() + 15
            while len(acked) < before + 25 and time.monotonic() < deadline and thread.is_alive():
                time.sleep(0.005)
            assert len(acked) >= before + 25, f"round {round_}: only {len(acked) - before} uploads acknowledged"
            srv.proc.kill()  # SIGKILL, in the middle of the stream of uploads
            srv.proc.wait(timeout=10)
            thread.join(timeout=10)
            stop.set()
            assert not thread.is_alive() and not errors, errors

            # the files as the killed server left them: consistent, every row intact
            stored = set(assert_rows_intact(backend))
            missing = [m for m in acked if m.removeprefix("sha256:") not in stored]
            assert not missing, f"acknowledged but lost after SIGKILL: {missing[:3]}"

        # a restarted server on the same data dir serves every acknowledged upload
        srv.start()
        for model in acked:
            assert check_status(srv.port, model) == 200, model
        srv.stop()
        fresh = backend.store()
        for model, vocab in acked.items():
            cfg = fresh.get(model)
            assert cfg is not None and cfg.vocab_size == vocab
        assert fresh.count() >= len(acked)
        assert_rows_intact(backend)
    finally:
        srv.stop()


# --------------------------------------------------------------------------- the store in process


@pytest.fixture(params=BACKENDS)
def store_backend(request) -> str:
    return request.param


def test_the_parsed_config_cache_is_bounded_and_evicted_configs_reload(store_backend, tmp_path, monkeypatch):
    import app.web.store as store_mod

    monkeypatch.setattr(store_mod, "CACHE_ENTRIES", 4)
    with make_store(store_backend, tmp_path) as first:
        store = first.reopen()
        ids = [store.put(config(120_000 + i), name=f"c{i}.json").id for i in range(12)]
        assert len(store._cache) == 4 and store.count() == 12
        for i, model in enumerate(ids):  # evicted ones come back from the database, digest-checked
            cfg = store.get(model)
            assert cfg is not None and cfg.vocab_size == 120_000 + i and cfg.label == f"c{i}.json"
        assert len(store._cache) == 4

        monkeypatch.setattr(store_mod, "CACHE_ENTRIES", 1000)
        monkeypatch.setattr(store_mod, "CACHE_BYTES", 3 * len(config(120_000)))
        store = first.reopen()
        for model in ids:
            store.get(model)
        assert len(store._cache) == 3 and store._cache_bytes <= 3 * len(config(120_000))


def test_the_first_upload_names_a_config_before_and_after_a_restart(store_backend, tmp_path):
    data = config(130_000)
    long_name = "n" * 300 + ".json"
    with make_store(store_backend, tmp_path) as opened:
        first = opened.put(data, name=long_name)
        store = opened.reopen()
        again = store.put(data, name="other.json")  # identical bytes: one row, the first name stays
        assert store.count() == 1
        restarted = opened.reopen().get(first.id)
        assert first.label == again.label == restarted.label == long_name[:120]


def test_a_name_that_is_not_utf8_is_stored_not_a_500(store_backend, tmp_path):
    with make_store(store_backend, tmp_path) as store:
        cfg = store.put(config(131_000), name="bad\udcff.json")  # a lone surrogate
        assert store.reopen().get(cfg.id).label == "bad?.json"


def test_a_tampered_row_is_not_served(store_backend, tmp_path):
    with make_store(store_backend, tmp_path) as store:
        cfg = store.put(config(132_000))
        sql = "UPDATE configs SET bytes = {p} WHERE sha256 = {p}"
        if store_backend == "sqlite":
            with sqlite3.connect(store.path) as conn:
                conn.execute(sql.format(p="?"), (config(132_001), cfg.sha256))
        else:
            with store.reopen()._db().transaction() as tx:
                tx.connection.execute(sql.format(p="%s"), (config(132_001), cfg.sha256))
        assert store.reopen().get(cfg.id) is None
