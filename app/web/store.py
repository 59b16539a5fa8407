"""Content-addressed store of uploaded ``config.json`` files (SQLite, stdlib).

An upload is validated first (:func:`app.core.model_config.load_config_bytes`), then stored under
the SHA-256 of its exact bytes, so ``model=sha256:<hex>`` in a share URL keeps working after a
restart. Writes are one ``INSERT OR IGNORE`` in a transaction (WAL journal, ``synchronous=FULL``):
an acknowledged upload is durable, and a crash mid-write leaves no half-written row. Identical
uploads are one row, and the first upload's file name is the label for good (before and after a
restart). Nothing from the request ever becomes a path: the database file is chosen by the
operator (``ISPLAN_DATA_DIR``, default ``./data``). Parsed configs are kept in a small LRU cache
(bounded in entries and in source bytes), so many distinct uploads cannot grow the process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

from app.core.model_config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ModelConfig,
    load_config_bytes,
)

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")

#: Parsed uploads kept in memory: at most this many, holding at most this many source bytes.
CACHE_ENTRIES = 64
CACHE_BYTES = 8 << 20


def _name(name: str | None) -> str:
    """The file name as stored: at most 200 characters, always valid UTF-8 (no lone surrogates)."""
    return (name or "")[:200].encode("utf-8", "replace").decode("utf-8")


def _label(name: str | None) -> str:
    return (_name(name) or "uploaded config")[:120]


def data_dir() -> Path:
    return Path(os.environ.get("ISPLAN_DATA_DIR", "data"))


class ConfigStore:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "configs.sqlite3"
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[ModelConfig, int]] = OrderedDict()
        self._cache_bytes = 0
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS configs (sha256 TEXT PRIMARY KEY, bytes BLOB NOT NULL, "
                "name TEXT, created_utc TEXT DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')))"
            )
            conn.commit()
            self._conn = conn
        return self._conn

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
        """The cached config (caller holds the lock), marked most recently used."""
        hit = self._cache.get(model_id)
        if hit is None:
            return None
        self._cache.move_to_end(model_id)
        return hit[0]

    def put(self, data: bytes, name: str | None = None) -> ModelConfig:
        """Validate and store; returns the loaded config (id ``sha256:<hex>``). Raises ConfigError.

        Returns only once the row is committed (WAL, ``synchronous=FULL``), so a caller that
        acknowledges the upload after this returns never acknowledges a row a crash can lose."""
        try:
            cfg = load_config_bytes(data, source="upload", label=_label(name))
        except ConfigError:
            raise
        except (ValueError, RecursionError) as exc:  # e.g. an integer literal over 4300 digits
            raise ConfigError(f"config.json cannot be read: {exc}") from None
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            db = self._db()
            with db:  # BEGIN ... COMMIT (rolled back if anything raises)
                cur = db.execute("INSERT OR IGNORE INTO configs (sha256, bytes, name) VALUES (?, ?, ?)",
                                 (digest, data, _name(name)))
                if cur.rowcount == 0:  # already stored: the first upload's name stays the label
                    row = db.execute("SELECT name FROM configs WHERE sha256 = ?", (digest,)).fetchone()
                    if row is not None and _label(row[0]) != cfg.label:
                        cfg = dataclasses.replace(cfg, label=_label(row[0]))
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
            row = self._db().execute("SELECT bytes, name FROM configs WHERE sha256 = ?", (m.group(1),)).fetchone()
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
            return self._db().execute("SELECT COUNT(*) FROM configs").fetchone()[0]
