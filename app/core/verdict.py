"""One verdict for every answer: go / no-go, with each blocking reason and its kind.

``kind`` says which part of the plan blocks the launch:

* ``boundary`` - a (physical or virtual) stage starts on a shared layer;
* ``megatron`` / ``vllm`` / ``sglang`` / ``maxtext`` - that engine refuses the layout (its own
  acceptance rules; slime and the hf what-if run Megatron's, so theirs are ``megatron``);
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

#: every kind, in the order the headline lists them (each engine's ``acceptance_kind`` is one of them)
KINDS = ("boundary", "megatron", "vllm", "sglang", "maxtext", "parallel", "memory", "gpus", "model")


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
    #: what was judged: the layout always; parallelism and memory when the plan states them
    judged: tuple[str, ...] = ("layout",)

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

    @property
    def notes(self) -> tuple[Reason, ...]:
        """The warnings no check lists with its own lines: the model's (a multimodal file's language
        model only) and an engine judgement's own (a context above the model's maximum, taken with the
        engine's override). A layout check's warnings (code ``warning``) and the parallel checks'
        (kind ``parallel``) are printed where those checks are."""
        return tuple(r for r in self.warnings if r.code != "warning" and r.kind != "parallel")

    def to_dict(self) -> dict[str, Any]:
        return {"go": self.go, "blocking": [r.to_dict() for r in self.blocking],
                "warnings": [r.to_dict() for r in self.warnings], "judged": list(self.judged)}

    def merged(self, other: Verdict) -> Verdict:
        judged = self.judged + tuple(j for j in other.judged if j not in self.judged)
        return Verdict(_unique(self.blocking + other.blocking), _unique(self.warnings + other.warnings), judged)


def verdict_of(blocking: Iterable[Reason], warnings: Iterable[Reason] = (),
               judged: tuple[str, ...] = ("layout",)) -> Verdict:
    for r in blocking:
        if r.kind not in KINDS:
            raise ValueError(f"unknown verdict kind {r.kind!r}")
    return Verdict(_unique(tuple(blocking)), _unique(tuple(warnings)), judged)


def _unique(reasons: tuple[Reason, ...]) -> tuple[Reason, ...]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for r in reasons:
        key = (r.kind, r.code, r.message)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return tuple(out)


def ranges(numbers: list[int]) -> str:
    """``1, 2, 3, 5, 7, 8`` -> ``1-3, 5, 7-8`` (for reasons that cover many stages or ranks)."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = out[-1].split("-")[0] + f"-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)
