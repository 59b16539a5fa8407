"""What the reader returns: flag occurrences with their file and line, unresolved values, the
final argv of the commands that matter, and :class:`LauncherParse` that holds them all."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.core.launcher.text import short, where

INT_RE = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class FlagOccurrence:
    """One place a flag of interest is written; ``value`` is None for switches and unresolved values."""

    flag: str
    value: str | None
    line: int   # 1-based line of the flag token in the original text
    raw: str    # the value as written (unexpanded), "" for switches
    file: str = ""   # the file it is written in (the launcher itself or a sourced file)


@dataclass(frozen=True)
class UnresolvedValue:
    """A value flag whose value cannot be known statically, and why."""

    flag: str
    raw: str
    line: int
    reason: str
    file: str = ""


@dataclass(frozen=True)
class Arg:
    """One word of a command's final argv: its text (or why it cannot be known), as written, where."""

    text: str
    reason: str | None
    raw: str
    file: str
    line: int


@dataclass(frozen=True)
class EnvValue:
    """A variable a command may see: its value (or why unknown), where it was set and how:
    ``assignment`` (a shell variable, not exported), ``export``, ``prefix`` (``VAR=x cmd`` /
    ``env VAR=x cmd``), ``docker_env`` (``docker run -e``) or ``k8s_env`` (a Kubernetes env list)."""

    value: str
    reason: str | None
    file: str
    line: int
    how: str


@dataclass(frozen=True)
class Command:
    """A command whose whole argv was expanded (one that names vLLM, SGLang or MaxText): argv and
    the variables assigned for it alone."""

    argv: tuple[Arg, ...]
    env: dict[str, EnvValue]
    file: str
    line: int


@dataclass(frozen=True)
class LauncherParse:
    """What a launcher passes. ``values``/``switches`` are final (the last occurrence wins; a flag
    whose last occurrence is unresolved is absent from ``values``); ``occurrences`` and
    ``unresolved`` list every occurrence in text order, overridden ones included."""

    values: dict[str, str]
    switches: frozenset[str]
    occurrences: tuple[FlagOccurrence, ...]
    unresolved: tuple[UnresolvedValue, ...]
    warnings: tuple[str, ...]
    variables: dict[str, str]   # final resolved scalar variables, for display
    final: tuple[FlagOccurrence, ...] = ()      # the trainer command line's flags, in order
    trainer: tuple[str, int] | None = None      # (file, line) of the trainer invocation used
    trainer_argv: tuple[Arg, ...] = ()          # that command's argv, every word (unknown flags too)
    files: tuple[str, ...] = ()                 # the launcher and every file it sourced
    missing: tuple[str, ...] = ()               # sourced files that could not be read
    fatal: tuple[str, ...] = field(default=())  # why the script cannot be read completely
    program: str | None = None                  # the trainer's entry point as written (train.py, ...)
    arrays: tuple[str, ...] = ()                # array names the script assigns
    commands: tuple[Command, ...] = ()          # commands naming vLLM / SGLang / MaxText, with their argv
    environment: dict[str, EnvValue] = field(default_factory=dict)   # variables with where and how set
    work: int = 0                               # work units the reading charged (the cost estimate's bound)
    #: every trainer invocation read, in text order: (file, line, entry point as written, its line's
    #: flags with their values)
    runs: tuple[tuple[str, int, str | None, frozenset[tuple[str, str | None]]], ...] = ()

    def ordered_occurrences(self) -> list[FlagOccurrence]:
        """Occurrences in the order argparse would see them (the trainer line's flags last)."""
        passed = {id(o) for o in self.final}
        return [o for o in self.occurrences if id(o) not in passed] + list(self.final)

    def provenance(self) -> dict[str, dict[str, object]]:
        """``{flag: {value, file, line}}`` for every final value and switch (switches: value True)."""
        out: dict[str, dict[str, object]] = {}
        for o in self.ordered_occurrences():
            if o.flag in self.values and o.value == self.values[o.flag]:
                out[o.flag] = {"value": o.value, "file": o.file, "line": o.line}
            elif o.flag in self.switches:
                out[o.flag] = {"value": True, "file": o.file, "line": o.line}
        return dict(sorted(out.items()))

    def int_value(self, flag: str) -> int | None:
        """``values[flag]`` as an int, None if absent; ValueError naming the flag if not an integer."""
        value = self.values.get(flag)
        if value is None:
            return None
        if INT_RE.fullmatch(value.strip()):
            try:
                return int(value.strip())
            except ValueError:   # more digits than int() accepts
                pass
        raise ValueError(f"{flag} is {short(value)!r}, which is not an integer")

    def at(self, flag: str, default: str = "the launcher") -> str:
        """``file:line`` of the occurrence that gave ``flag`` its final value (a switch: its last one)."""
        found = default
        for o in self.ordered_occurrences():
            if o.flag == flag and (o.value is not None or flag in self.switches):
                found = where(o.file, o.line)
        return found


def duplicate_warning(flag: str, occs: list[FlagOccurrence]) -> str:
    """``--flag is set N times: v1 (file:line), ...; the last one (v) is used``."""
    shown = [o.value if o.value is not None else f"{o.raw or '(nothing)'} (unresolved)" for o in occs]
    listed = [f"{v} ({where(o.file, o.line)})" for v, o in zip(shown, occs, strict=True)]
    if len(listed) > 6:
        listed = [*listed[:3], "...", *listed[-3:]]
    listing = " and ".join(listed) if len(occs) == 2 else ", ".join(listed)
    last = occs[-1].value
    tail = f"the last one ({last}) is used" if last is not None else \
        "the last one cannot be resolved, so no value is used"
    count = "twice" if len(occs) == 2 else f"{len(occs)} times"
    return f"{flag} is set {count}: {listing}; {tail}"
