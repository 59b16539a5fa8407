"""The upload store's limits: quotas, 503 when it cannot write, health, the upload token; on
SQLite and (with ``ISPLAN_TEST_DATABASE_URL``) PostgreSQL (issue 9, "Storage")."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import app.web.store as store_mod
from app.web.store import (
    ConfigStore,
    QuotaExceeded,
    Quotas,
    StoreUnavailable,
    UploadForbidden,
    check_token,
    open_store,
)
from tests.store_backends import BACKENDS, PG_URL, make_store

REPO = Path(__file__).resolve().parents[2]
BASE = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())


def config(vocab_size: int) -> bytes:
    cfg = copy.deepcopy(BASE)
    cfg["vocab_size"] = vocab_size
    return json.dumps(cfg, indent=1).encode()


SIZE = len(config(100_000))  # every config(...) below has this many bytes (6-digit vocab sizes)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


def test_round_trip_and_first_name_kept(backend, tmp_path):
    with make_store(backend, tmp_path) as store:
        cfg = store.put(config(100_001), name="first.json", client="a")
        again = store.put(config(100_001), name="second.json", client="b")
        assert cfg.id == again.id and again.label == "first.json"
        fresh = store.reopen()
        assert fresh.get(cfg.id).vocab_size == 100_001 and fresh.get(cfg.id).label == "first.json"
        assert fresh.count() == 1
        assert fresh.get("sha256:" + "0" * 64) is None and fresh.get("glm-5.2") is None


def test_a_nul_in_the_name_is_stored(backend, tmp_path):
    with make_store(backend, tmp_path) as store:
        cfg = store.put(config(100_002), name="a\x00b.json")
        assert store.reopen().get(cfg.id).label == "ab.json"


def test_per_client_quota(backend, tmp_path):
    quotas = Quotas(total=100 * SIZE, per_client=2 * SIZE)
    with make_store(backend, tmp_path, quotas) as store:
        store.put(config(100_010), client="10.0.0.1")
        store.put(config(100_011), client="10.0.0.1")
        with pytest.raises(QuotaExceeded, match=r"ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES") as exc:
            store.put(config(100_012), client="10.0.0.1")
        assert f"stored {2 * SIZE:,} of its {2 * SIZE:,} bytes" in str(exc.value)
        assert exc.value.status_code == 413
        store.put(config(100_010), client="10.0.0.1")  # re-uploading stored bytes costs nothing
        store.put(config(100_012), client="10.0.0.2")  # another client has its own quota
        assert store.count() == 3


def test_total_quota(backend, tmp_path):
    quotas = Quotas(total=3 * SIZE, per_client=100 * SIZE)
    with make_store(backend, tmp_path, quotas) as store:
        for i in range(3):
            store.put(config(100_020 + i), client=f"c{i}")
        with pytest.raises(QuotaExceeded, match="ISPLAN_UPLOAD_QUOTA_BYTES"):
            store.put(config(100_030), client="c9")
        assert store.count() == 3


def test_concurrent_uploads_cannot_overshoot_the_quota(backend, tmp_path):
    quotas = Quotas(total=5 * SIZE, per_client=100 * SIZE)
    with make_store(backend, tmp_path, quotas) as store:
        stores = [store.reopen() for _ in range(4)]  # separate connections, as separate workers have

        def upload(i: int) -> bool:
            try:
                stores[i % 4].put(config(100_100 + i), client=f"c{i}")
                return True
            except QuotaExceeded:
                return False

        with ThreadPoolExecutor(8) as pool:
            accepted = sum(pool.map(upload, range(20)))
        assert accepted == 5 and store.count() == 5


def test_a_new_sqlite_store_waits_for_another_connection_creating_it(tmp_path):
    """The WAL switch of a new file is refused at once (SQLite's busy timeout does not cover it)
    while another connection - another server worker - holds a lock on the file in its first,
    rollback-journal mode; the store waits for it instead of answering 503."""
    path = tmp_path / "configs.sqlite3"
    creator = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE other (a)")
    probe = sqlite3.connect(path, isolation_level=None, timeout=5)
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # what SQLite does on its own
        probe.execute("PRAGMA journal_mode=WAL")
    probe.close()
    release = threading.Timer(0.3, lambda: creator.execute("COMMIT"))
    release.start()
    try:
        store = ConfigStore(path, quotas=Quotas(total=10 * SIZE, per_client=10 * SIZE))
        assert store.count() == 0
        store.put(config(100_300), client="c1")
    finally:
        release.join()
        creator.close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.count() == 1


def test_the_wal_switch_gives_up_after_its_deadline(tmp_path):
    """A lock held for good is still a 503 naming the setting, after the wait, not a hang."""
    path = tmp_path / "configs.sqlite3"
    creator = sqlite3.connect(path, isolation_level=None)
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE other (a)")
    conn = sqlite3.connect(path, isolation_level=None, timeout=0.05)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store_mod._switch_to_wal(conn, seconds=0.2)
    finally:
        conn.close()
        creator.execute("ROLLBACK")
        creator.close()


def test_sqlite_rows_from_before_quotas_are_counted(tmp_path):
    path = tmp_path / "configs.sqlite3"
    with sqlite3.connect(path) as conn:  # the schema of the store before this change
        conn.execute("CREATE TABLE configs (sha256 TEXT PRIMARY KEY, bytes BLOB NOT NULL, name TEXT, "
                     "created_utc TEXT)")
        conn.execute("INSERT INTO configs (sha256, bytes, name) VALUES (?, ?, ?)", ("ab" * 32, b"x" * 1000, "old"))
    store = ConfigStore(path, quotas=Quotas(total=1000 + SIZE - 1, per_client=10 * SIZE))
    with pytest.raises(QuotaExceeded, match="1,000 of"):
        store.put(config(100_200))


def test_quotas_from_env(monkeypatch):
    monkeypatch.setenv("ISPLAN_UPLOAD_QUOTA_BYTES", "1000")
    monkeypatch.setenv("ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES", "10")
    assert Quotas.from_env() == Quotas(1000, 10)
    monkeypatch.setenv("ISPLAN_UPLOAD_QUOTA_BYTES", "lots")
    with pytest.raises(ValueError, match="ISPLAN_UPLOAD_QUOTA_BYTES must be a whole number"):
        Quotas.from_env()


# --------------------------------------------------------------------------- the store cannot write


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_uncreatable_data_dir_is_store_unavailable_unprivileged(tmp_path):  # pragma: no cover - CI runs as root
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    store = ConfigStore(locked / "sub" / "configs.sqlite3")
    with pytest.raises(StoreUnavailable, match="ISPLAN_DATA_DIR"):
        store.put(config(100_300))


def test_uncreatable_data_dir_is_store_unavailable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # even root cannot make a directory under a file
    store = ConfigStore(blocker / "data" / "configs.sqlite3")
    with pytest.raises(StoreUnavailable, match=r"cannot use .*ISPLAN_DATA_DIR") as exc:
        store.put(config(100_301))
    assert exc.value.status_code == 503
    health = store.health()
    assert health["ok"] is False and "ISPLAN_DATA_DIR" in health["detail"]


def test_read_only_database_is_store_unavailable(tmp_path):
    path = tmp_path / "configs.sqlite3"
    ConfigStore(path).put(config(100_310))
    uri_store = ConfigStore(path)
    uri_store._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                                      isolation_level=None)  # what a read-only file or mount gives
    with pytest.raises(StoreUnavailable, match="read-only"):
        uri_store.put(config(100_311))
    assert uri_store.health()["ok"] is False


def test_disk_full_is_store_unavailable(tmp_path):
    path = tmp_path / "configs.sqlite3"
    store = ConfigStore(path)
    store.put(config(100_320))
    db = store._db()
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite then answers SQLITE_FULL, as on a full disk
    with pytest.raises(StoreUnavailable, match="disk is full"):
        store.put(json.dumps({**BASE, "padding": "x" * (4 * page_size)}).encode())
    assert store.count() == 1


def test_health_reports_free_space(tmp_path, monkeypatch):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    assert store.health() == {"ok": True, "backend": "sqlite", "detail": "sqlite configs.sqlite3: writable"}
    monkeypatch.setattr(store_mod, "HEALTH_TTL", 0.0)
    monkeypatch.setattr(store, "_free_bytes", lambda: 1000)
    h = store.health()
    assert h["ok"] is False and "only 1,000 bytes free" in h["detail"]


def test_health_is_cached(tmp_path):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    calls = []
    real = store._probe
    store._probe = lambda: calls.append(1) or real()  # type: ignore[method-assign]
    for _ in range(50):
        store.health()
    assert len(calls) == 1


def test_fresh_health_is_the_cached_answer_only_while_it_is_fresh_and_the_file_is_there(tmp_path, monkeypatch):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    assert store.fresh_health() is None  # nothing cached yet: /healthz asks health() in its thread
    answer = store.health()
    assert store.fresh_health() == answer and answer["ok"]
    now = store_mod.time.monotonic()
    monkeypatch.setattr(store_mod.time, "monotonic", lambda: now + store_mod.HEALTH_TTL + 0.1)
    assert store.fresh_health() is None  # stale: probed again
    monkeypatch.undo()
    store.health()
    for f in tmp_path.glob("configs.sqlite3*"):
        f.unlink()
    assert store.fresh_health() is None  # the file is gone: health() says so, never the cached "ok"
    assert store.health()["ok"] is False


def test_healthz_answers_a_fresh_health_without_asking_the_store_again(tmp_path):
    from fastapi.testclient import TestClient

    from app.web.app import create_app

    store = ConfigStore(tmp_path / "configs.sqlite3")
    calls = []
    real = store.health
    store.health = lambda: calls.append(1) or real()  # type: ignore[method-assign]
    client = TestClient(create_app(store=store))
    assert [client.get("/healthz").status_code for _ in range(5)] == [200] * 5
    assert len(calls) == 1  # the first; the next four were the cached answer, given on the loop


@pytest.mark.skipif(not PG_URL, reason="ISPLAN_TEST_DATABASE_URL not set")
def test_postgres_down_is_store_unavailable():
    from app.web.store_postgres import PostgresConfigStore

    store = PostgresConfigStore("postgresql://nobody@/nodb?host=/nonexistent-socket-dir", connect_timeout=2)
    with pytest.raises(StoreUnavailable, match="ISPLAN_DATABASE_URL"):
        store.put(config(100_400))
    assert store.health()["ok"] is False


def test_backend_selected_by_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ISPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("ISPLAN_DATA_DIR", str(tmp_path))
    s = open_store()
    assert isinstance(s, ConfigStore) and s.path == tmp_path / "configs.sqlite3"
    if PG_URL:
        monkeypatch.setenv("ISPLAN_DATABASE_URL", PG_URL)
        assert open_store().backend == "postgres"


# --------------------------------------------------------------------------- upload token


def test_check_token():
    check_token(None, expected="")  # no token configured: open
    for presented in ("Bearer s3cret", "bearer  s3cret ", "s3cret"):
        check_token(presented, expected="s3cret")
    with pytest.raises(UploadForbidden) as missing:
        check_token(None, expected="s3cret")
    assert missing.value.status_code == 401 and "Authorization: Bearer" in str(missing.value)
    with pytest.raises(UploadForbidden) as wrong:
        check_token("Bearer s3cre", expected="s3cret")
    assert wrong.value.status_code == 403


def test_check_token_from_env(monkeypatch):
    monkeypatch.setenv("ISPLAN_UPLOAD_TOKEN", "t")
    with pytest.raises(UploadForbidden):
        check_token("Bearer u")
    check_token("Bearer t")


def test_thread_safety_of_one_store(backend, tmp_path):
    with make_store(backend, tmp_path) as store:
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                cfg = store.put(config(100_500 + i % 5), name=f"{i}.json")
                assert store.get(cfg.id) is not None
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and store.count() == 5


def test_without_a_client_only_the_total_quota_applies(backend, tmp_path):
    quotas = Quotas(total=5 * SIZE, per_client=1 * SIZE)
    with make_store(backend, tmp_path, quotas) as store:
        for i in range(3):
            store.put(config(100_600 + i))  # 3 x SIZE: over per_client, but nobody was named
        store.put(config(100_603), client="x")
        with pytest.raises(QuotaExceeded, match="ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES"):
            store.put(config(100_604), client="x")  # a named client is charged as usual
        store.put(config(100_605))  # 5 x SIZE stored: the total is reached
        with pytest.raises(QuotaExceeded, match="ISPLAN_UPLOAD_QUOTA_BYTES"):
            store.put(config(100_606))  # and it holds for everyone
