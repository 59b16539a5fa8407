"""Flags: the reader records each flag of interest (:mod:`app.core.launcher.vocabulary`) where it
is written - in a command line, an array body or a double-quoted value - as ``--flag value`` or
``--flag=value``; ``_`` in a flag name counts as ``-`` (torchrun accepts ``--nproc_per_node``).
Flags must be written literally: a flag that only comes out of an expansion is not seen."""

from __future__ import annotations

from typing import Any

from app.core.launcher.arrays import SPLICE_RE
from app.core.launcher.results import FlagOccurrence, UnresolvedValue
from app.core.launcher.state import ShellState, Value
from app.core.launcher.text import short
from app.core.launcher.vocabulary import list_flags, switch_flags, value_flags


class FlagRules(ShellState):
    def scan(self, words: list[tuple[str, int]], exps: list[Value | None] | None = None) -> None:
        """Record the flags of interest written in `words` (command words or array elements)."""
        n = len(words)
        expanded: list[Value | None] = list(exps) if exps else [None] * n
        values, switches = value_flags(), switch_flags()

        def exp(k: int) -> Value:   # expand lazily: most words are not flags
            got = expanded[k]
            if got is None:
                got = expanded[k] = self.expand(words[k][0])
            return got

        i = 0
        while i < n:
            raw, pos = words[i]
            i += 1
            if not raw.lstrip("\"'").startswith("--"):
                self.note_unknown_splice(raw, pos)
                continue   # flags must be written literally, not come out of an expansion
            text, reason = exp(i - 1)
            name, eq, rest = text.partition("=")
            flag = "--" + name[2:].replace("_", "-")
            if not eq and flag in switches:
                self.occurrences.append(FlagOccurrence(flag, None, self.line(pos), "", self.file))
                self.occ_pos.append(pos)
            elif flag in values and eq:
                vraw = raw.partition("=")[2].replace("\\\n", "")
                if raw[0] in "\"'" and vraw.endswith(raw[0]):
                    vraw = vraw[:-1]
                self.add_value(flag, rest, reason, pos, vraw)
            elif flag in values and i < n and not exp(i)[0].startswith("--") and flag in list_flags():
                i = self.add_list(flag, words, exp, i, pos)
            elif flag in values and i < n and not exp(i)[0].startswith("--"):
                self.add_value(flag, *exp(i), pos, words[i][0].replace("\\\n", ""))
                i += 1
            elif flag in values:
                self.add_value(flag, None, f"{flag} has no value", pos, "")

    def add_list(self, flag: str, words: list[tuple[str, int]], exp: Any, i: int, pos: int) -> int:
        """A ``nargs='+'`` flag: every following word up to the next flag, as argparse reads them,
        recorded as one comma list (an unresolved word makes the whole value unresolved)."""
        texts, raws, reason = [], [], None
        while i < len(words) and not exp(i)[0].startswith("--"):
            text, why = exp(i)
            reason = reason or why
            texts += text.split()   # an unquoted splice (``${MODULES[@]}``) is several words
            raws.append(words[i][0].replace("\\\n", ""))
            i += 1
        self.add_value(flag, ",".join(texts), reason, pos, " ".join(raws))
        return i

    def note_unknown_splice(self, raw: str, pos: int) -> None:
        """``${ARGS[@]}`` of an array never assigned (so far): reported unless assigned later."""
        m = SPLICE_RE.fullmatch(raw) if raw.startswith(("${", '"${')) else None
        if m and m.group(1) not in self.arrays and m.group(1) not in self.scalars:
            self.unknown.setdefault(m.group(1), f"line {self.line(pos)}: {short(raw, 40)} is never "
                                    "assigned in this script, so flags inside it are not seen")

    def add_value(self, flag: str, value: str | None, reason: str | None, pos: int, raw: str) -> None:
        line = self.line(pos)
        if reason is None and not value:
            reason = f"{flag} has an empty value"
        if reason:
            self.occurrences.append(FlagOccurrence(flag, None, line, raw, self.file))
            self.unresolved.append(UnresolvedValue(flag, raw, line, reason, self.file))
        else:
            self.occurrences.append(FlagOccurrence(flag, value, line, raw, self.file))
        self.occ_pos.append(pos)
