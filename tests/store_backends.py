"""Store backends for the tests: SQLite always, PostgreSQL when ``ISPLAN_TEST_DATABASE_URL`` is
set (``scripts/pg_test_server.sh start DIR`` prints one). Each PostgreSQL store gets a fresh
schema, dropped afterwards, so tests never see each other's rows."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.web.store import BaseStore, ConfigStore, Quotas

PG_URL = os.environ.get("ISPLAN_TEST_DATABASE_URL", "").strip()
BACKENDS = ["sqlite"] + (["postgres"] if PG_URL else [])


@contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh schema on the test server; yields the libpq ``options`` that select it."""
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:16]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"-c search_path={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def make_store(backend: str, tmp_path: Path, quotas: Quotas | None = None) -> Iterator[Any]:
    """A fresh store of ``backend``; ``store.reopen()`` gives another store on the same data."""
    if backend == "sqlite":
        path = tmp_path / "configs.sqlite3"
        store = ConfigStore(path, quotas=quotas)
        store.reopen = lambda: ConfigStore(path, quotas=quotas)  # type: ignore[attr-defined]
        yield store
        return
    from app.web.store_postgres import PostgresConfigStore

    with pg_schema() as options:
        opened: list[BaseStore] = []

        def reopen() -> BaseStore:
            s = PostgresConfigStore(PG_URL, quotas=quotas, options=options)
            opened.append(s)
            return s

        store = reopen()
        store.reopen = reopen  # type: ignore[attr-defined]
        try:
            yield store
        finally:
            for s in opened:
                s.close()


def _wired_into_the_app() -> bool:
    """Whether the app builds its store with :func:`app.web.store.open_store` (so a server
    started with ``ISPLAN_DATABASE_URL`` really uses PostgreSQL)."""
    app_dir = Path(__file__).resolve().parents[1] / "app"
    return any("open_store(" in p.read_text() for p in app_dir.rglob("*.py") if p.name != "store.py")


class ServerBackend:
    """What a server test needs of a backend: the environment for the server, the stored rows
    as the server left them, and a fresh store object on the same data."""

    def __init__(self, name: str, data_dir: Path, url: str | None = None):
        self.name, self.data_dir, self.url = name, data_dir, url

    @property
    def env(self) -> dict[str, str]:
        return {"ISPLAN_DATABASE_URL": self.url} if self.url else {}

    def rows(self) -> list[tuple[str, bytes]]:
        """(sha256, bytes) of every row, read-only (SQLite: after ``PRAGMA integrity_check``)."""
        if self.url is None:
            import sqlite3

            conn = sqlite3.connect(f"file:{self.data_dir / 'configs.sqlite3'}?mode=ro", uri=True, timeout=30)
            try:
                assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
                return [(h, bytes(b)) for h, b in conn.execute("SELECT sha256, bytes FROM configs")]
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.url) as conn:
            return [(h, bytes(b)) for h, b in conn.execute("SELECT sha256, bytes FROM configs")]

    def store(self) -> BaseStore:
        if self.url is None:
            return ConfigStore(self.data_dir / "configs.sqlite3")
        from app.web.store_postgres import PostgresConfigStore

        return PostgresConfigStore(self.url)


@contextmanager
def server_backend(name: str, data_dir: Path) -> Iterator[ServerBackend]:
    if name == "sqlite":
        yield ServerBackend(name, data_dir)
        return
    import pytest

    if not _wired_into_the_app():
        pytest.skip("the app does not build its store with app.web.store.open_store() yet")
    with pg_schema() as options:
        sep = "&" if "?" in PG_URL else "?"
        yield ServerBackend(name, data_dir, PG_URL + sep + "options=" + options.replace(" ", "%20").replace("=", "%3D"))
