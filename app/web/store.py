"""Content-addressed store of uploaded ``config.json`` files (SQLite, stdlib).

An upload is validated first (:func:`app.core.model_config.load_config_bytes`), then stored under
the SHA-256 of its exact bytes, so ``model=sha256:<hex>`` in a share URL keeps working after a
restart. Writes are one ``INSERT OR IGNORE`` in a transaction (WAL journal, ``synchronous=FULL``):
an acknowledged upload is durable, and a crash mid-write leaves no half-written row. Identical
uploads are one row. Nothing from the request ever becomes a path: the database file is chosen
by the operator (``ISPLAN_DATA_DIR``, default ``./data``).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
from pathlib import Path

from app.core.model_config import MAX_CONFIG_BYTES, ModelConfig, load_config_bytes

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


def data_dir() -> Path:
    return Path(os.environ.get("ISPLAN_DATA_DIR", "data"))


class ConfigStore:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "configs.sqlite3"
        self._lock = threading.Lock()
        self._cache: dict[str, ModelConfig] = {}
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

    def put(self, data: bytes, name: str | None = None) -> ModelConfig:
        """Validate and store; returns the loaded config (id ``sha256:<hex>``). Raises ConfigError."""
        cfg = load_config_bytes(data, source="upload", label=(name or "uploaded config")[:120])
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            db = self._db()
            with db:
                db.execute("INSERT OR IGNORE INTO configs (sha256, bytes, name) VALUES (?, ?, ?)",
                           (digest, data, (name or "")[:200]))
            self._cache[cfg.id] = cfg
        return cfg

    def get(self, model_id: str) -> ModelConfig | None:
        """The stored config for ``sha256:<hex>``, or None when unknown or not of that form."""
        m = _DIGEST.match(model_id)
        if not m:
            return None
        if model_id in self._cache:
            return self._cache[model_id]
        with self._lock:
            row = self._db().execute("SELECT bytes, name FROM configs WHERE sha256 = ?", (m.group(1),)).fetchone()
        if row is None:
            return None
        data = bytes(row[0])
        if len(data) > MAX_CONFIG_BYTES or hashlib.sha256(data).hexdigest() != m.group(1):
            return None
        cfg = load_config_bytes(data, source="upload", label=row[1] or "uploaded config")
        self._cache[model_id] = cfg
        return cfg

    def count(self) -> int:
        with self._lock:
            return self._db().execute("SELECT COUNT(*) FROM configs").fetchone()[0]
