"""Arrays: ``NAME=( ... )`` / ``NAME+=( ... )`` over several lines with comments inside, elements
that splice ``"${OTHER[@]}"``, at most :data:`~app.core.launcher.text.MAX_ITEMS` elements kept.

``+=`` appends in place and a splice is charged per element and per flag it carries (issue 20
findings 5 and 6: no copy of the whole array per append, no free amplification of flags)."""

from __future__ import annotations

import re

from app.core.launcher.lexer import NAME, Token
from app.core.launcher.results import FlagOccurrence
from app.core.launcher.state import ShellState, Value
from app.core.launcher.text import MAX_ITEMS, SPLICE_COST, TOO_COMPLEX

SPLICE_RE = re.compile(rf'"?\$\{{({NAME})\[[@*]\]\}}"?')


class ArrayRules(ShellState):
    def elements_of(self, name: str) -> list[Value]:
        """The elements ``"${name[@]}"`` gives (a scalar is a one-element array)."""
        return self.arrays.get(name, [self.scalars[name]] if name in self.scalars else [])

    def assign_array(self, item: Token) -> None:
        prefix: str
        elems: list[tuple[str, int]]
        prefix, elems = item[1]  # type: ignore[misc]
        name, append = prefix.rstrip("+="), prefix.endswith("+=")
        items = self.arrays.get(name) if append else None
        if items is None:
            items = list(self.elements_of(name)) if append else []
        exps: list[Value | None] = []
        placed: list[tuple[int, FlagOccurrence]] = []
        for raw, epos in elems:
            m = SPLICE_RE.fullmatch(raw)
            if len(items) >= MAX_ITEMS:
                exps.append(None)
            elif m:   # "${OTHER[@]}" splices OTHER's elements and the flags written in them
                more = self.elements_of(m.group(1))
                flags = self.var_occ.get(m.group(1), [])
                if self.spend(8 * len(more) + SPLICE_COST * len(flags)):
                    items.extend(more[: MAX_ITEMS - len(items)])
                    placed += [(epos, o) for o in flags]
                else:
                    items.append(("", TOO_COMPLEX))
                exps.append(None)
            else:
                value = self.expand(raw)
                exps.append(value)
                items.append(value)
        start = len(self.occurrences)
        self.scan(elems, exps)
        placed += list(zip(self.occ_pos[start:], self.occurrences[start:]))
        written = [o for _, o in sorted(placed, key=lambda t: t[0])]
        if append and name in self.var_occ:
            self.var_occ[name].extend(written)
        else:
            self.var_occ[name] = written
        if len(items) >= MAX_ITEMS:
            del items[MAX_ITEMS:]
            note = f"array {name} reached {MAX_ITEMS} elements; later ones are dropped"
            if note not in self.notes:
                self.notes.append(note)
        self.arrays[name] = items
        self.scalars.pop(name, None)
