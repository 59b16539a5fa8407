"""The evaluation's caches keyed on contents: where an entry is kept, and keys that hash once.

A live page re-evaluates the plan after every edit, and a drag leaves most of it alone; a search
times many plans of one shape. So the parts of an evaluation that depend on a small part of the
plan are kept by exactly what they read (a pipeline rank's memory, a layer kind's FLOPs, a stage's
layer sums and parameters, a layout check, a layer-map cell), never by the whole plan
(``docs/DESIGN.md``, "Caches keyed on contents").

* :func:`remember` is how every such cache keeps an entry: bounded, it empties itself when it
  would grow past its limit (all at once, not LRU: a hit stays one dict lookup, and an entry is
  cheap to make again); :func:`scope` is the inner cache of one settings scope.
* :func:`hash_once`: a frozen dataclass that is a part of many keys hashes once. The generated
  ``__hash__`` hashes every compared field on every call; a model config (~45 fields, two of them a
  tuple per layer) and a launch's parallel settings are in most keys of one evaluation. A class opts
  in with ``__hash__ = hash_once`` and ``__getstate__ = state_without_hash`` in its body (an explicit
  ``__hash__`` in the class body is what :func:`dataclasses.dataclass` leaves alone). The kept hash
  is never pickled: string hashes differ between processes (``PYTHONHASHSEED``), so an instance
  sent to a worker hashes again there.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, limit: int) -> V:
    """Keep ``value`` under ``key`` in ``cache`` and return it; a cache that already holds
    ``limit`` entries is emptied first."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


def scope(cache: dict[K, dict[Any, Any]], key: K, limit: int) -> dict[Any, Any]:
    """The inner cache kept under ``key`` in ``cache`` (one settings scope), a new empty one
    (:func:`remember`-ed) when there is none."""
    found = cache.get(key)
    return remember(cache, key, {}, limit) if found is None else found


#: The compared fields of each class (:func:`hash_once`), in the dataclass's order.
_HASHED: dict[type, tuple[str, ...]] = {}


def hash_once(self: Any) -> int:
    """``hash`` of the fields the dataclass's own ``__hash__`` would hash (``field.hash``, else
    ``field.compare``), computed on the first call and kept."""
    found = self.__dict__.get("_hash")
    if found is None:
        cls = type(self)
        names = _HASHED.get(cls)
        if names is None:
            names = _HASHED[cls] = tuple(f.name for f in fields(cls) if (f.compare if f.hash is None else f.hash))
        found = self.__dict__["_hash"] = hash(tuple(getattr(self, n) for n in names))
    return int(found)


def state_without_hash(self: Any) -> dict[str, Any]:
    """The instance's state for pickling, without the kept hash."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}
