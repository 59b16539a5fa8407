"""One verdict for every answer: go / no-go, with each blocking reason and its kind.

``kind`` says which part of the plan blocks the launch:

* ``boundary`` - a (physical or virtual) stage starts on a shared layer;
* ``megatron`` - the engine refuses the layout (acceptance, divisibility);
* ``parallel`` - an error-level parallelism constraint fails;
* ``memory``   - a pipeline rank needs more than the GPU holds;
* ``gpus``     - the stated GPU budget differs from TP x CP x PP x DP;
* ``model``    - the config, the engine's roles or a launcher disagree about the model.

The CLI exits 1 exactly when ``go`` is false; the page headline, every ``/api/v1`` answer that
evaluates a plan and the receipt carry the same object. Each reason names the plan field (its URL
key) to change, so the page can link to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KINDS = ("boundary", "megatron", "parallel", "memory", "gpus", "model")


@dataclass(frozen=True)
class Reason:
    kind: str
    code: str
    message: str
    field: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "message": self.message, "field": self.field}


@dataclass(frozen=True)
class Verdict:
    blocking: tuple[Reason, ...] = ()
    warnings: tuple[Reason, ...] = ()

    @property
    def go(self) -> bool:
        return not self.blocking

    def kinds(self) -> list[str]:
        """The blocking kinds, in :data:`KINDS` order, each once."""
        present = {r.kind for r in self.blocking}
        return [k for k in KINDS if k in present]

    def headline(self) -> str:
        if self.go:
            return "GO"
        return "NO-GO: " + ", ".join(f"{sum(r.kind == k for r in self.blocking)} {k}" for k in self.kinds())

    def to_dict(self) -> dict[str, Any]:
        return {"go": self.go, "blocking": [r.to_dict() for r in self.blocking],
                "warnings": [r.to_dict() for r in self.warnings]}

    def merged(self, other: Verdict) -> Verdict:
        return Verdict(_unique(self.blocking + other.blocking), _unique(self.warnings + other.warnings))


def verdict_of(blocking: Iterable[Reason], warnings: Iterable[Reason] = ()) -> Verdict:
    for r in blocking:
        if r.kind not in KINDS:
            raise ValueError(f"unknown verdict kind {r.kind!r}")
    return Verdict(_unique(tuple(blocking)), _unique(tuple(warnings)))


def _unique(reasons: tuple[Reason, ...]) -> tuple[Reason, ...]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for r in reasons:
        key = (r.kind, r.code, r.message)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return tuple(out)
