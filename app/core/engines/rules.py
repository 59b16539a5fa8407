"""Types shared by the serving engines' rule modules (:mod:`.vllm`, :mod:`.sglang`).

Each serving engine module states, for a build date, three things read from the engine's source:
how it splits decoder layers over pipeline ranks by default, what it does when a pipeline rank
starts on a *shared* (top-k reusing) layer, and which rank holds lm_head and the MTP draft.
A build is named by its date (``YYYY-MM-DD``, the date of the engine commit it was built from);
``None`` means the newest behaviour this planner knows (the commit cited in each module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Any

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
LATEST = ("latest", "main", "current", "")


class EngineInputError(ValueError):
    """Input that cannot be used at all (unknown engine, unreadable version or partition, bad PP)."""


@dataclass(frozen=True)
class RuleChange:
    """One change of an engine rule: from ``since`` on, ``summary`` holds (``source`` says where)."""

    since: date
    summary: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since.isoformat(), "summary": self.summary, "source": self.source}


@dataclass(frozen=True)
class ShareBehaviour:
    """What an engine build does when a pipeline rank starts on a shared layer.

    ``code`` is ``silent_wrong`` (runs, reads a top-k buffer nothing wrote: wrong attention, no
    error), ``handoff`` (the top-k is forwarded between ranks: correct) or ``crash`` (fails at
    warm-up or on the first request). ``blocking`` is true unless the engine handles it.
    """

    code: str
    blocking: bool
    message: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "blocking": self.blocking, "message": self.message, "source": self.source}


def parse_build_date(version: str | date | None, what: str = "--engine-version") -> date | None:
    """``None`` / ``latest`` -> None (newest known behaviour); ``YYYY-MM-DD`` -> that date."""
    if version is None or isinstance(version, date):
        return version
    text = str(version).strip().lower()
    if text in LATEST:
        return None
    m = _DATE.fullmatch(text)
    if not m:
        raise EngineInputError(
            f"{what} is {version!r}; give the build date of the engine as YYYY-MM-DD "
            "(the date of the commit it was built from) or 'latest'"
        )
    try:
        return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        raise EngineInputError(f"{what} {version!r} is not a calendar date") from None


def rule_in_force(changes: tuple[RuleChange, ...], build: date | None) -> RuleChange:
    """The newest change not after ``build`` (the newest of all when ``build`` is None).

    ``changes`` are sorted oldest first; the first entry's ``since`` is ``date.min``.
    """
    if build is None:
        return changes[-1]
    current = changes[0]
    for change in changes:
        if change.since <= build:
            current = change
    return current
