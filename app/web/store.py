"""Content-addressed store of uploaded ``config.json`` files: SQLite (default) or PostgreSQL.

An upload is validated first (:func:`app.core.model.config.load_config_bytes`), then stored under
the SHA-256 of its exact bytes, so ``model=sha256:<hex>`` in a share URL keeps working after a
restart. Identical uploads are one row, and the first upload's file name is the label for good.
Nothing from the request ever becomes a path: the database is chosen by the operator.

Backends (:func:`open_store`): SQLite in ``ISPLAN_DATA_DIR`` (default ``./data``), the embedded
default for one machine; or PostgreSQL when ``ISPLAN_DATABASE_URL`` is set
(:mod:`app.web.store_postgres`), for several workers or replicas sharing one store. Both commit
the row before :meth:`BaseStore.put` returns (SQLite: WAL, ``synchronous=FULL``; PostgreSQL: a
committed transaction), so an acknowledged upload is durable and a crash leaves no half row.

Limits (issue 9: one anonymous client stored 840 MB in 19 s; disk full, a read-only database or
an uncreatable data dir gave bare 500s while ``/healthz`` said ok):

* quotas on stored bytes, in all (``ISPLAN_UPLOAD_QUOTA_BYTES``, default 512 MiB) and per client
  (``ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES``, default 32 MiB; the client is what the caller passes,
  e.g. its address): :class:`QuotaExceeded` (413) names the quota. The check and the insert are
  one serialised transaction, so concurrent uploads cannot overshoot. Re-uploading stored bytes
  costs nothing.
* :class:`StoreUnavailable` (503, with a message) whenever the store cannot open, read or write.
  Its message is what a client sees and names no server path or socket; the detail (paths, the
  driver's own words) goes to the server log only (issue 20, finding 16).
* :meth:`BaseStore.health` for ``/healthz``: a real write probe plus free disk space, cached
  for a few seconds so health checks stay cheap.
* SQLite: the database file deleted or replaced while the server runs (``rm configs.sqlite3*``)
  is detected before and after every write and by every health check (the file's device and
  inode, compared with the ones opened): uploads get a 503 and ``/healthz`` a 503 instead of
  being acknowledged into a file that is gone (issue 20, finding 14).
* an optional upload token (``ISPLAN_UPLOAD_TOKEN``) for shared deployments: :func:`check_token`.

Parsed configs are kept in a small LRU cache (bounded in entries and in source bytes), so many
distinct uploads cannot grow the process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import settings as app_settings
from app.core.model.config import (
    MAX_CONFIG_BYTES,
    MAX_JSON_DEPTH,
    ConfigError,
    ModelConfig,
    _bracket_depth,
    load_config_bytes,
)
from app.core.plan import bounds

log = logging.getLogger("isplan.store")

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")

#: Parsed uploads kept in memory: at most this many, holding at most this many source bytes.
CACHE_ENTRIES = 64
CACHE_BYTES = 8 << 20
#: Seconds a health result is reused.
HEALTH_TTL = 5.0
#: Free bytes the data directory must keep for health to say ok (room for a few more uploads).
MIN_FREE_BYTES = 16 * MAX_CONFIG_BYTES

DEFAULT_TOTAL_QUOTA = 512 << 20
DEFAULT_CLIENT_QUOTA = 32 << 20


class StoreUnavailable(RuntimeError):
    """The store cannot open, read or write (disk full, read-only, no data dir, server down): 503.

    ``str()`` is the message for clients (no path, no socket); ``detail`` what the server log
    gets besides it."""

    status_code = 503

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail
        if detail:
            _log_once(f"{message} ({detail})")


_LOGGED: dict[str, float] = {}


def _log_once(line: str, every: float = 60.0) -> None:
    """Log ``line`` at most once per ``every`` seconds (a broken store is seen by every probe)."""
    now = time.monotonic()
    if now - _LOGGED.get(line, -every) >= every:
        if len(_LOGGED) > 1000:
            _LOGGED.clear()
        _LOGGED[line] = now
        log.warning("%s", line)


class QuotaExceeded(ValueError):
    """Storing the upload would pass a quota (413); the message names the quota and its setting."""

    status_code = 413

    def __init__(self, message: str, field: str | None = "file"):
        super().__init__(message)
        self.field = field


class UploadForbidden(PermissionError):
    """Uploads need ``ISPLAN_UPLOAD_TOKEN`` and the request's token is missing (401) or wrong (403)."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class Quotas:
    """Bytes that may be stored in all and per client (0 = no uploads at all)."""

    total: int = DEFAULT_TOTAL_QUOTA
    per_client: int = DEFAULT_CLIENT_QUOTA

    @classmethod
    def from_env(cls) -> Quotas:
        s = app_settings.current()
        return cls(s.upload_quota_bytes, s.upload_client_quota_bytes)

    def check(self, size: int, stored_total: int, stored_by_client: int | None) -> None:
        """Raise :class:`QuotaExceeded` if ``size`` more bytes would pass either quota (the
        per-client one only when the caller named the client: ``stored_by_client`` not None)."""
        if stored_total + size > self.total:
            raise QuotaExceeded(
                f"the upload store is full: {stored_total:,} of {self.total:,} bytes used and this config is "
                f"{size:,} bytes (ISPLAN_UPLOAD_QUOTA_BYTES); use a preset or ask the operator to raise the quota")
        if stored_by_client is not None and stored_by_client + size > self.per_client:
            raise QuotaExceeded(
                f"this client has stored {stored_by_client:,} of its {self.per_client:,} bytes and this config is "
                f"{size:,} bytes (ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES); reuse an uploaded config's sha256: link")


def check_token(presented: str | None, expected: str | None = None) -> None:
    """Accept the upload when no token is configured (``ISPLAN_UPLOAD_TOKEN`` unset or empty) or
    when ``presented`` (an ``Authorization`` header ``Bearer <token>``, or the bare token from a
    form field) equals it, compared in constant time. Raises :class:`UploadForbidden`."""
    expected = (app_settings.current().upload_token or "") if expected is None else expected
    if not expected:
        return
    if not presented:
        raise UploadForbidden("uploads on this server need a token: send 'Authorization: Bearer <token>' "
                              "(ask the operator for ISPLAN_UPLOAD_TOKEN)", 401)
    token = presented.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape")):
        raise UploadForbidden("the upload token is wrong", 403)


def _name(name: str | None) -> str:
    """The file name as stored: at most 200 characters, valid UTF-8, no NUL (PostgreSQL text)."""
    return (name or "")[:200].encode("utf-8", "replace").decode("utf-8").replace("\x00", "")


def _label(name: str | None) -> str:
    return (_name(name) or "uploaded config")[:120]


def _client(client: str | None) -> str | None:
    """The client as stored (at most 100 characters), or None when the caller did not say."""
    return None if client is None else (_name(client)[:100] or "anonymous")


def data_dir() -> Path:
    return app_settings.current().data_dir


def check_config_shape(data: bytes) -> None:
    """Refuse, before the JSON parser runs, an upload with more containers (``[`` and ``{``, in
    strings too: an upper bound) than :data:`app.core.plan.bounds.MAX_CONFIG_CONTAINERS`. A config
    has a few dozen; 1 MiB of ``[[0],[0],...]`` has 262,000 and cost about a second of the
    server's CPU to parse and walk before it was refused (issue 20, finding 3)."""
    containers = data.count(b"[") + data.count(b"{")
    if containers > bounds.MAX_CONFIG_CONTAINERS:
        # deep nesting gets its own message; it shows within the first bytes (a bounded scan)
        head = data[:1 << 16].decode("utf-8", "replace")
        if _bracket_depth(head) > MAX_JSON_DEPTH:
            raise ConfigError(f"config.json nests deeper than {MAX_JSON_DEPTH} levels")
        raise ConfigError(f"config.json has {containers:,} arrays and objects; a config has a few dozen and the "
                          f"limit is {bounds.MAX_CONFIG_CONTAINERS:,}")


def validate_upload(data: bytes, name: str | None) -> ModelConfig:
    """The upload parsed and validated (``ConfigError`` otherwise), before any storage."""
    check_config_shape(data)
    try:
        return load_config_bytes(data, source="upload", label=_label(name))
    except ConfigError:
        raise
    except (ValueError, RecursionError) as exc:  # e.g. an integer literal over 4300 digits
        raise ConfigError(f"config.json cannot be read: {exc}") from None


class BaseStore:
    """Validation, the parsed-config cache, health caching; a backend supplies storage."""

    backend = "base"

    def __init__(self, quotas: Quotas | None = None):
        self.quotas = quotas or Quotas.from_env()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[ModelConfig, int]] = OrderedDict()
        self._cache_bytes = 0
        self._health: tuple[float, dict[str, Any]] | None = None

    # -- backend hooks -------------------------------------------------------------------
    def _insert(self, digest: str, data: bytes, name: str, client: str | None) -> str | None:
        """Store the row unless present (quota-checked in the same transaction); the stored
        name when the digest was already there, else None."""
        raise NotImplementedError

    def _fetch(self, digest: str) -> tuple[bytes, str | None] | None:
        raise NotImplementedError

    def _count(self) -> int:
        raise NotImplementedError

    def _probe(self) -> str:
        """Write and read back a health row; return a short description of the store."""
        raise NotImplementedError

    def _free_bytes(self) -> int | None:
        return None

    def _still_there(self) -> None:
        """Raise :class:`StoreUnavailable` when the storage the store opened is gone (a cheap
        check run on every health call, outside the cache)."""

    # -- cache ---------------------------------------------------------------------------
    def _remember(self, cfg: ModelConfig, size: int) -> None:
        """Cache ``cfg`` (caller holds the lock), evicting the least recently used beyond the bounds."""
        old = self._cache.pop(cfg.id, None)
        if old is not None:
            self._cache_bytes -= old[1]
        self._cache[cfg.id] = (cfg, size)
        self._cache_bytes += size
        while self._cache and (len(self._cache) > CACHE_ENTRIES or self._cache_bytes > CACHE_BYTES):
            _, (_, evicted) = self._cache.popitem(last=False)
            self._cache_bytes -= evicted

    def _cached(self, model_id: str) -> ModelConfig | None:
        hit = self._cache.get(model_id)
        if hit is None:
            return None
        self._cache.move_to_end(model_id)
        return hit[0]

    # -- public API ----------------------------------------------------------------------
    def put(self, data: bytes, name: str | None = None, client: str | None = None) -> ModelConfig:
        """Validate and store; returns the loaded config (id ``sha256:<hex>``).

        ``client`` (e.g. the request's address) is charged for the bytes; without it only the
        total quota applies. Raises ``ConfigError`` (invalid config, 422), :class:`QuotaExceeded` (413) or
        :class:`StoreUnavailable` (503). Returns only once the row is committed, so a caller that
        acknowledges the upload after this returns never acknowledges a row a crash can lose."""
        cfg = validate_upload(data, name)
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            try:
                stored_name = self._insert(digest, data, _name(name), _client(client))
            except StoreUnavailable as exc:  # health says so at once (a small probe row may still fit)
                self._health = (time.monotonic(), {"ok": False, "backend": self.backend, "detail": str(exc)})
                raise
            if stored_name is not None and _label(stored_name) != cfg.label:
                cfg = dataclasses.replace(cfg, label=_label(stored_name))
            self._remember(cfg, len(data))
        return cfg

    def get(self, model_id: str) -> ModelConfig | None:
        """The stored config for ``sha256:<hex>``, or None when unknown or not of that form."""
        m = _DIGEST.match(model_id)
        if not m:
            return None
        with self._lock:
            cached = self._cached(model_id)
            if cached is not None:
                return cached
            row = self._fetch(m.group(1))
        if row is None:
            return None
        data = bytes(row[0])
        if len(data) > MAX_CONFIG_BYTES or hashlib.sha256(data).hexdigest() != m.group(1):
            return None
        cfg = load_config_bytes(data, source="upload", label=_label(row[1]))
        with self._lock:
            self._remember(cfg, len(data))
        return cfg

    def count(self) -> int:
        with self._lock:
            return self._count()

    def data(self, model_id: str) -> bytes | None:
        """The exact bytes of an uploaded config (``sha256:<hex>``), or None (the page offers them
        for download, so its CLI line can read the same config from a file)."""
        m = _DIGEST.match(model_id)
        if not m:
            return None
        with self._lock:
            row = self._fetch(m.group(1))
        if row is None:
            return None
        data = bytes(row[0])
        return data if hashlib.sha256(data).hexdigest() == m.group(1) else None

    def fresh_health(self) -> dict[str, Any] | None:
        """The cached :meth:`health` answer while it is younger than :data:`HEALTH_TTL` and the
        opened storage is still there (a ``stat``), else ``None``: cheap enough for the event
        loop, so a loaded server answers ``/healthz`` without a hop to the health thread and back
        (each hop waits for a turn of a busy loop). ``None`` means: ask :meth:`health`."""
        cached = self._health
        if cached is None or time.monotonic() - cached[0] >= HEALTH_TTL:
            return None
        try:
            self._still_there()
        except StoreUnavailable:
            return None
        return cached[1]

    def health(self) -> dict[str, Any]:
        """``{"ok", "backend", "detail"}``: ok when a write probe succeeds and (SQLite) the data
        directory has at least :data:`MIN_FREE_BYTES` free. Never raises; cached for
        :data:`HEALTH_TTL` seconds. A failed upload write counts as a failed probe (a full disk
        may still take the probe's tiny row)."""
        cached = self.fresh_health()
        if cached is not None:
            return cached
        now = time.monotonic()
        try:
            self._still_there()
        except StoreUnavailable as exc:
            result = {"ok": False, "backend": self.backend, "detail": str(exc)}
            self._health = (now, result)
            return result
        try:
            with self._lock:
                detail = self._probe()
            free = self._free_bytes()
            ok = free is None or free >= MIN_FREE_BYTES
            if not ok:
                detail = f"only {free:,} bytes free in the data directory (need {MIN_FREE_BYTES:,})"
        except StoreUnavailable as exc:
            ok, detail = False, str(exc)
        result = {"ok": ok, "backend": self.backend, "detail": detail}
        self._health = (now, result)
        return result


# --------------------------------------------------------------------------- SQLite


_SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS configs (sha256 TEXT PRIMARY KEY, bytes BLOB NOT NULL, name TEXT, "
    "created_utc TEXT DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')), client TEXT, size INTEGER)"
)


#: How long a connection waits for another one's lock (SQLite's busy timeout, and the WAL switch's).
SQLITE_BUSY_SECONDS = 30.0


def _switch_to_wal(conn: sqlite3.Connection, seconds: float = SQLITE_BUSY_SECONDS) -> None:
    """``PRAGMA journal_mode=WAL``, retried while the database is busy, for up to ``seconds``.

    The switch needs the database to itself, and SQLite answers it ``SQLITE_BUSY`` at once - its
    busy timeout does not apply - while another connection holds a lock on a file still in
    rollback-journal mode, i.e. while another connection is creating the same new store. That
    is what the server's worker processes do when their first uploads and health checks meet on
    a fresh data directory (8 connections opening one new file together: the switch failed in 12
    of 400 rounds; a 503 "the upload store cannot be written" for an upload that was fine). Once
    the file is in WAL mode it stays so, and the switch is a no-op for every later connection."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _sqlite_failure(exc: BaseException, path: Path) -> StoreUnavailable:
    """The client's message names the setting, never the path (the log has it)."""
    text = str(exc)
    if isinstance(exc, OSError):
        return StoreUnavailable(f"the upload store cannot use its data directory ({exc.strerror or 'not usable'}); "
                                "set ISPLAN_DATA_DIR to a writable directory", detail=f"{path.parent}: {exc}")
    if "full" in text:
        hint = "the disk is full; free space on it"
    elif "readonly" in text or "read-only" in text:
        hint = "the database is read-only; make ISPLAN_DATA_DIR writable"
    elif "unable to open" in text:
        hint = "its file cannot be opened; set ISPLAN_DATA_DIR to a writable directory"
    else:
        hint = "check ISPLAN_DATA_DIR"
    public = text if str(path) not in text and str(path.parent) not in text else "database error"
    return StoreUnavailable(f"the upload store cannot be written ({public[:120]}): {hint}", detail=f"{path}: {text}")


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ConfigStore(BaseStore):
    """SQLite in one file (default ``$ISPLAN_DATA_DIR/configs.sqlite3``)."""

    backend = "sqlite"

    def __init__(self, path: Path | None = None, quotas: Quotas | None = None):
        super().__init__(quotas)
        self.path = path or data_dir() / "configs.sqlite3"
        self._conn: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, check_same_thread=False, timeout=SQLITE_BUSY_SECONDS,
                                       isolation_level=None)
                _switch_to_wal(conn)
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(_SQLITE_SCHEMA)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(configs)")}
                for column, kind in (("client", "TEXT"), ("size", "INTEGER")):  # stores from before quotas
                    if column not in columns:
                        conn.execute(f"ALTER TABLE configs ADD COLUMN {column} {kind}")
                conn.execute("UPDATE configs SET size = LENGTH(bytes) WHERE size IS NULL")
                conn.execute("CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, at REAL)")
            except (sqlite3.Error, OSError) as exc:
                raise _sqlite_failure(exc, self.path) from None
            self._conn = conn
            self._file = _file_id(self.path)
        return self._conn

    def _still_there(self) -> None:
        if self._file is not None and _file_id(self.path) != self._file:
            raise StoreUnavailable(
                "the upload store's database file was removed or replaced while the server runs; uploads are "
                "refused so that none is acknowledged into a file that is gone: restore it (or move the new "
                "one aside) and restart the server", detail=f"{self.path} is not the file opened at start")

    def _run(self, work: Any) -> Any:
        """``work(conn)`` in one ``BEGIN IMMEDIATE`` transaction (serialised across processes), on
        the file the store opened: checked before, and after the commit (a write that landed in
        a deleted file is not reported as done)."""
        db = self._db()
        self._still_there()
        try:
            db.execute("BEGIN IMMEDIATE")
            result = work(db)
            db.execute("COMMIT")
            self._still_there()
            return result
        except sqlite3.Error as exc:
            raise _sqlite_failure(exc, self.path) from None
        finally:
            if db.in_transaction:  # an error or a quota refusal (SQLite may have rolled back already)
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")

    def _insert(self, digest: str, data: bytes, name: str, client: str | None) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT name FROM configs WHERE sha256 = ?", (digest,)).fetchone()
            if row is not None:  # already stored: the first upload's name stays the label
                return row[0] or ""
            total, mine = db.execute(
                "SELECT COALESCE(SUM(size), 0), COALESCE(SUM(CASE WHEN client = ? THEN size END), 0) FROM configs",
                (client,)).fetchone()
            self.quotas.check(len(data), total, None if client is None else mine)
            db.execute("INSERT INTO configs (sha256, bytes, name, client, size) VALUES (?, ?, ?, ?, ?)",
                       (digest, data, name, client, len(data)))
            return None

        return self._run(work)

    def _fetch(self, digest: str) -> tuple[bytes, str | None] | None:
        try:
            return self._db().execute("SELECT bytes, name FROM configs WHERE sha256 = ?", (digest,)).fetchone()
        except sqlite3.Error as exc:
            raise _sqlite_failure(exc, self.path) from None

    def _count(self) -> int:
        try:
            return self._db().execute("SELECT COUNT(*) FROM configs").fetchone()[0]
        except sqlite3.Error as exc:
            raise _sqlite_failure(exc, self.path) from None

    def _probe(self) -> str:
        self._run(lambda db: db.execute("INSERT OR REPLACE INTO health (id, at) VALUES (1, ?)", (time.time(),)))
        return f"sqlite {self.path.name}: writable"

    def _free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.path.parent).free
        except OSError:
            return None


def open_store() -> BaseStore:
    """PostgreSQL when ``ISPLAN_DATABASE_URL`` is set, else SQLite in ``ISPLAN_DATA_DIR``."""
    url = app_settings.current().database_url
    if url:
        from app.web.store_postgres import PostgresConfigStore

        return PostgresConfigStore(url)
    return ConfigStore()
