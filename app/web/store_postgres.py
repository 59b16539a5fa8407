"""The upload store on PostgreSQL (``ISPLAN_DATABASE_URL``), for several workers or replicas.

Same contract as :class:`app.web.store.ConfigStore` (see :mod:`app.web.store`): rows keyed by the
SHA-256 of the exact bytes, the first upload's name kept, quotas checked and the row inserted in
one transaction, :class:`~app.web.store.StoreUnavailable` whenever the server cannot be reached or
written. Writers take a transaction-scoped advisory lock (``pg_advisory_xact_lock``), so quota
checks of concurrent uploads from any number of processes are serialised; reads take no lock.
A commit returns only once PostgreSQL has made it durable (``synchronous_commit`` on, the server
default), so an acknowledged upload survives a crash of the app.

Needs the optional dependency ``psycopg`` (v3): ``pip install 'isplan[postgres]'``. One connection
per store object, used under the store's lock and re-opened after a failure.

After the database server restarts, a connection it dropped only says so on its next use
("connection is bad", "server closed the connection unexpectedly"): a transaction that fails on
such a connection is run once more on a fresh one. That is safe because every write here is
idempotent (a row keyed by its content's digest, inserted only when absent), and it is what
``/healthz`` already saw: its probe reconnects (issue 20: the first upload after PostgreSQL came
back got a 503 while ``/healthz`` said ok). Client messages name ``ISPLAN_DATABASE_URL``, never
the server's host or socket path; the driver's own words go to the server log.
"""

from __future__ import annotations

import contextlib
from typing import Any

from app.web.store import BaseStore, Quotas, StoreUnavailable

#: Arbitrary constants naming this app's advisory locks.
_WRITE_LOCK = 0x15_9A_4E_01
_SCHEMA_LOCK = 0x15_9A_4E_02

_SCHEMA = (
    ("CREATE TABLE IF NOT EXISTS configs (sha256 TEXT PRIMARY KEY, bytes BYTEA NOT NULL, name TEXT, "
     "created_utc TIMESTAMPTZ NOT NULL DEFAULT now(), client TEXT, size INTEGER NOT NULL)"),
    "CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, at TIMESTAMPTZ NOT NULL)",
)


class PostgresConfigStore(BaseStore):
    """Uploads in the ``configs`` table of the database at ``url`` (a libpq connection string)."""

    backend = "postgres"

    def __init__(self, url: str, quotas: Quotas | None = None, *, options: str | None = None,
                 connect_timeout: int = 5):
        super().__init__(quotas)
        try:
            import psycopg
        except ImportError:
            raise StoreUnavailable("ISPLAN_DATABASE_URL is set but psycopg is not installed: "
                                   "pip install 'isplan[postgres]'") from None
        self._psycopg = psycopg
        self.url = url
        self.options = options
        self.connect_timeout = connect_timeout
        self._conn: Any = None

    def _failure(self, exc: BaseException) -> StoreUnavailable:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        kind = "the connection failed" if isinstance(exc, self._psycopg.OperationalError) else type(exc).__name__
        return StoreUnavailable(f"the upload store (PostgreSQL) is unavailable ({kind}); check ISPLAN_DATABASE_URL "
                                "and the database server", detail=first_line[:300])

    def _db(self) -> Any:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        kwargs: dict[str, Any] = {"connect_timeout": self.connect_timeout, "autocommit": True}
        if self.options:
            kwargs["options"] = self.options
        try:
            conn = self._psycopg.connect(self.url, **kwargs)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    conn.execute(statement)
        except self._psycopg.Error as exc:
            raise self._failure(exc) from None
        self._conn = conn
        return conn

    def _run(self, work: Any) -> Any:
        """``work(conn)`` in one transaction; on a connection the server dropped, once more on a
        fresh one (every ``work`` here is idempotent); a broken connection is never kept."""
        for attempt in (1, 2):
            conn = self._db()
            try:
                with conn.transaction():
                    return work(conn)
            except self._psycopg.Error as exc:
                dropped = conn.broken or conn.closed
                if dropped:
                    self._conn = None
                    with contextlib.suppress(Exception):
                        conn.close()
                if not (dropped and attempt == 1):
                    raise self._failure(exc) from None
        raise AssertionError("unreachable")

    def _insert(self, digest: str, data: bytes, name: str, client: str | None) -> str | None:
        def work(conn: Any) -> str | None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            row = conn.execute("SELECT name FROM configs WHERE sha256 = %s", (digest,)).fetchone()
            if row is not None:
                return row[0] or ""
            total, mine = conn.execute(
                "SELECT COALESCE(SUM(size), 0), COALESCE(SUM(size) FILTER (WHERE client = %s), 0) FROM configs",
                (client,)).fetchone()
            self.quotas.check(len(data), int(total), None if client is None else int(mine))
            conn.execute("INSERT INTO configs (sha256, bytes, name, client, size) VALUES (%s, %s, %s, %s, %s)",
                         (digest, data, name, client, len(data)))
            return None

        return self._run(work)

    def _fetch(self, digest: str) -> tuple[bytes, str | None] | None:
        row = self._run(lambda c: c.execute("SELECT bytes, name FROM configs WHERE sha256 = %s",
                                            (digest,)).fetchone())
        return None if row is None else (bytes(row[0]), row[1])

    def _count(self) -> int:
        return int(self._run(lambda c: c.execute("SELECT COUNT(*) FROM configs").fetchone()[0]))

    def _probe(self) -> str:
        self._run(lambda c: c.execute(
            "INSERT INTO health (id, at) VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now()"))
        return "postgres: writable"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
