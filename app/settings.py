"""Every ``ISPLAN_*`` environment variable, read in exactly one place: :meth:`Settings.from_env`.

Each field of the frozen dataclass :class:`Settings` names its variable, type, default and bounds
(:class:`Setting`, in the field's metadata); a value that cannot be used is a :class:`SettingsError`
naming the variable, what it takes and what it got, never a silent fallback to the default. The
README's Settings table lists exactly these fields (``tests/test_settings.py`` compares them).

No web imports: the domain core reads its one setting (``ISPLAN_RECEIPT_KEY``,
:mod:`app.core.receipt`) from here too, and ``isplan`` stays free of the web stack.

:func:`current` is the settings of the environment as it is now, re-read only when one of the
variables changed (a tuple of 18 look-ups), so a long-lived server and a test that sets a variable
both see the value in force. ``only=`` parses just the named fields (the CLI asks for the receipt
key and is not refused for a bad server setting it never uses).
"""

from __future__ import annotations

import ipaddress
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """An ``ISPLAN_*`` value that cannot be used; the message names the variable and the fix."""

    def __init__(self, variable: str, message: str):
        super().__init__(f"{variable} {message}")
        self.variable = variable


@dataclass(frozen=True)
class Setting:
    """One variable: its name, how it is parsed (``kind``), its bounds and what the README says."""

    variable: str
    kind: str  # path | text | secret | int | bytes | seconds | origins | hosts
    lo: float | None = None
    hi: float | None = None
    help: str = ""
    default_text: str = ""
    #: a value besides the bounds that is accepted (e.g. 0 = "no cap")
    also: float | None = None

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` (already known to be non-empty), or :class:`SettingsError`."""
        text = raw.strip()
        parser = _PARSERS[self.kind]
        value = parser(self, text)
        if self.kind in ("int", "bytes", "seconds"):
            self._check_bounds(value)
        return value

    def _check_bounds(self, value: float) -> None:
        if self.also is not None and value == self.also:
            return
        unit = {"bytes": " bytes", "seconds": " seconds"}.get(self.kind, "")
        if self.lo is not None and value < self.lo:
            extra = f" (or {_num(self.also)})" if self.also is not None else ""
            raise SettingsError(self.variable, f"must be at least {_num(self.lo)}{unit}{extra}, got {_num(value)}")
        if self.hi is not None and value > self.hi:
            raise SettingsError(self.variable, f"must be at most {_num(self.hi)}{unit}, got {_num(value)}")


def _num(x: float) -> str:
    """``2,097,152`` for a whole number, ``2.5`` otherwise."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def _whole(s: Setting, text: str) -> int:
    try:
        return int(text.replace("_", ""), 10)
    except ValueError:
        unit = " of bytes" if s.kind == "bytes" else ""
        raise SettingsError(s.variable, f"must be a whole number{unit}, got {text[:40]!r}") from None


def _seconds(s: Setting, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(s.variable, f"must be a number of seconds, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise SettingsError(s.variable, f"must be a finite number of seconds, got {text[:40]!r}")
    if value <= 0:
        raise SettingsError(s.variable, f"must be more than 0 seconds, got {value:g}")
    return value


def _text(s: Setting, text: str) -> str:
    if len(text) > 4096 or "\x00" in text:
        raise SettingsError(s.variable, "must be at most 4,096 characters without NUL")
    return text


def _path(s: Setting, text: str) -> Path:
    return Path(_text(s, text))


def _items(s: Setting, text: str) -> list[str]:
    return [item.strip() for item in _text(s, text).split(",") if item.strip()]


def _origins(s: Setting, text: str) -> tuple[str, ...]:
    out = []
    for origin in _items(s, text):
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or not rest or "/" in rest:
            raise SettingsError(s.variable, "takes comma-separated origins such as https://plans.example.com "
                                            f"(scheme://host[:port], no path), got {origin[:80]!r}")
        out.append(origin)
    return tuple(out)


def _hosts(s: Setting, text: str) -> tuple[str, ...]:
    out = []
    for host in _items(s, text):
        name = host.lower().rstrip(".")
        bare = name[1:] if name.startswith(".") else name
        ok = name == "*" or (bare and all(part and all(c.isalnum() or c in "-_" for c in part)
                                          for part in bare.split(".")))
        if not ok and not _is_ip(bare.strip("[]")):
            raise SettingsError(s.variable, "takes comma-separated host names: plans.example.com, .example.com "
                                            f"(it and every subdomain) or * (any host), got {host[:80]!r}")
        out.append(name)
    return tuple(out)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


_PARSERS: dict[str, Callable[[Setting, str], Any]] = {
    "path": _path, "text": _text, "secret": _text, "int": _whole, "bytes": _whole, "seconds": _seconds,
    "origins": _origins, "hosts": _hosts,
}


def _setting(variable: str, kind: str, default: Any, help: str, *, lo: float | None = None, hi: float | None = None,
             default_text: str = "", also: float | None = None, factory: Callable[[], Any] | None = None) -> Any:
    spec = Setting(variable, kind, lo, hi, help, default_text or ("unset" if default is None else str(default)), also)
    if factory is not None:
        return field(default_factory=factory, metadata={"isplan": spec})
    return field(default=default, metadata={"isplan": spec})


MiB = 1 << 20


def _default_workers() -> int:
    return min(os.cpu_count() or 1, 4)


@dataclass(frozen=True)
class Settings:
    """The operator's settings of one process (defaults where a variable is unset or empty)."""

    data_dir: Path = _setting("ISPLAN_DATA_DIR", "path", Path("data"),  # noqa: RUF009 - a field() with metadata
                              "where the SQLite upload store lives", default_text="`./data`")
    database_url: str | None = _setting("ISPLAN_DATABASE_URL", "text", None,
                                        "a PostgreSQL store instead (several replicas share it)")
    upload_token: str | None = _setting("ISPLAN_UPLOAD_TOKEN", "secret", None,
                                        "require `Authorization: Bearer <token>` (or the form's token field) "
                                        "for uploads")
    upload_quota_bytes: int = _setting("ISPLAN_UPLOAD_QUOTA_BYTES", "bytes", 512 * MiB,
                                       "stored upload bytes in all (0: no uploads)", lo=0, default_text="512 MiB")
    upload_client_quota_bytes: int = _setting("ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES", "bytes", 32 * MiB,
                                              "stored upload bytes per client", lo=0, default_text="32 MiB")
    upload_rate_bytes: int = _setting("ISPLAN_UPLOAD_RATE_BYTES", "bytes", 16 * MiB,
                                      "bytes one client may send to `/upload` and `/launcher` per minute, "
                                      "refused uploads included (429 beyond)", lo=2 * MiB, hi=1 << 40,
                                      default_text="16 MiB")
    receipt_key: str | None = _setting("ISPLAN_RECEIPT_KEY", "secret", None,
                                       "sign receipts with HMAC-SHA-256; verify then requires the signature")
    server_workers: int = _setting("ISPLAN_SERVER_WORKERS", "int", 2,
                                   "server processes started by `python -m app.serve`", lo=1, hi=64)
    workers: int = _setting("ISPLAN_WORKERS", "int", None, "planner worker processes per server process",
                            lo=1, hi=64, default_text="CPUs (≤ 4)", factory=_default_workers)
    work_per_client: int = _setting("ISPLAN_WORK_PER_CLIENT", "int", 2,
                                    "expensive requests one client may have in flight per server process "
                                    "(429 beyond)", lo=1, hi=1000)
    work_budget: int = _setting("ISPLAN_WORK_BUDGET", "int", 20_000_000,
                                "the cost budget of one expensive job, in work units (422 beyond)",
                                lo=1000, hi=10**12, default_text="2·10⁷ units")
    work_deadline: float = _setting("ISPLAN_WORK_DEADLINE", "seconds", 20.0,
                                    "seconds one expensive job may take, queue included (503 beyond)",
                                    hi=3600, default_text="20 s")
    worker_memory: int = _setting("ISPLAN_WORKER_MEMORY", "bytes", 2 << 30,
                                  "address-space cap of one planner worker (0: no cap)", lo=256 * MiB, also=0,
                                  default_text="2 GiB")
    header_seconds: float = _setting("ISPLAN_HEADER_SECONDS", "seconds", 10.0,
                                     "seconds a request head may take (the connection is closed after)",
                                     hi=3600, default_text="10")
    body_seconds: float = _setting("ISPLAN_BODY_SECONDS", "seconds", 30.0,
                                   "seconds a request body may take (408 after)", hi=3600, default_text="30")
    connections_per_client: int = _setting("ISPLAN_CONNECTIONS_PER_CLIENT", "int", 128,
                                           "open connections one peer address may hold per server process "
                                           "(the excess is closed at once; raise it behind a proxy)",
                                           lo=1, hi=100_000)
    allowed_origins: tuple[str, ...] = _setting("ISPLAN_ALLOWED_ORIGINS", "origins", (),
                                                "extra origins allowed to POST (same-origin always is)",
                                                default_text="unset")
    allowed_hosts: tuple[str, ...] = _setting("ISPLAN_ALLOWED_HOSTS", "hosts", (),
                                              "host names this server answers besides loopback names and IP "
                                              "addresses (`.example.com`: it and its subdomains; `*`: any); "
                                              "any other `Host` is a 400 (DNS rebinding)", default_text="unset")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, only: Iterable[str] | None = None) -> Settings:
        """The settings in ``environ`` (default ``os.environ``): an unset or empty variable is its
        default; a bad value is a :class:`SettingsError` naming it. ``only`` (field names) parses
        just those fields and leaves the others at their defaults."""
        env = os.environ if environ is None else environ
        wanted = None if only is None else set(only)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if wanted is not None and f.name not in wanted:
                continue
            spec: Setting = f.metadata["isplan"]
            raw = env.get(spec.variable, "")
            if raw.strip():
                values[f.name] = spec.parse(raw)
        return cls(**values)


def specs() -> dict[str, Setting]:
    """Every field's :class:`Setting`, by field name, in declaration order."""
    return {f.name: f.metadata["isplan"] for f in fields(Settings)}


VARIABLES: tuple[str, ...] = tuple(s.variable for s in specs().values())

_lock = threading.Lock()
_cached: tuple[tuple[str | None, ...], Settings] | None = None


def current() -> Settings:
    """:meth:`Settings.from_env` of the environment as it is now (cached until a variable changes)."""
    global _cached
    key = tuple(os.environ.get(v) for v in VARIABLES)
    cached = _cached
    if cached is not None and cached[0] == key:
        return cached[1]
    with _lock:
        settings = Settings.from_env()
        _cached = (key, settings)
    return settings
