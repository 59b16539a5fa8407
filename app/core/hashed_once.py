"""A frozen dataclass that is a part of many cache keys hashes once.

A frozen dataclass's generated ``__hash__`` hashes every compared field on every call; a model
config (~45 fields, two of them a tuple per layer) and a launch's parallel settings are in most
cache keys of one evaluation, so they were hashed again at every lookup. :func:`hash_once` is that
same hash (the compared fields, in order), kept in the instance's ``__dict__``; a class opts in
with ``__hash__ = hash_once`` and ``__getstate__ = state_without_hash`` in its body (an explicit
``__hash__`` in the class body is what :func:`dataclasses.dataclass` leaves alone). The kept hash is
never pickled: string hashes differ between processes (``PYTHONHASHSEED``), so an instance sent
to a worker hashes again there.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

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
