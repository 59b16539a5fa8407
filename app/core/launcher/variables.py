"""Scalar variables: ``NAME=v`` / ``NAME+=v`` (also after ``export`` / ``readonly`` / ``local`` /
``declare`` / ``typeset``), ``export NAME``, ``unset NAME``, and where each was set (for a serving
launch the engine sees only exported variables and those assigned for its command alone).

Flags written inside a double-quoted value (the old ``GPT_ARGS="--num-layers 24 ..."`` style) are
recorded where they are written and belong to that variable, so ``$GPT_ARGS`` on the trainer line
passes them. ``NAME+=`` appends in place (linear in what is appended)."""

from __future__ import annotations

import re

from app.core.launcher.lexer import NAME, Token, lex
from app.core.launcher.results import EnvValue
from app.core.launcher.state import ShellState, Value
from app.core.launcher.text import MAX_VALUE, TOO_LONG

ASSIGN_RE = re.compile(rf"({NAME})(\+?)=")


class VariableRules(ShellState):
    def assign(self, item: Token) -> bool:
        """Apply an assignment word or an array token; False when ``item`` is neither."""
        kind, val, pos = item
        if kind == "array":
            self.assign_array(item)
            return True
        if kind != "word" or not isinstance(val, str) or not (m := ASSIGN_RE.match(val)):
            return False
        name, vraw, append = m.group(1), val[m.end():], bool(m.group(2))
        first = len(self.occurrences)
        if len(vraw) >= 2 and vraw[0] == vraw[-1] == '"' and "--" in vraw:
            start = pos + m.end() + 1   # flags written inside a double-quoted value
            inner = lex(self.text, start, start + len(vraw) - 2, [])
            self.scan([(str(v), p) for k, v, p in inner if k == "word"])
        written = self.occurrences[first:]
        if append and name in self.var_occ:
            self.var_occ[name].extend(written)
        else:
            self.var_occ[name] = written
        text, reason = self.expand(vraw)
        if append:
            before, old_reason, _ = self.lookup(name)
            text, reason = before + text, old_reason or reason
            if len(text) > MAX_VALUE:
                text, reason = "", TOO_LONG
        self.set_scalar(name, (text, reason))
        return True

    def set_scalar(self, name: str, value: Value) -> None:
        arr = self.arrays.get(name)
        if arr is None:
            self.scalars[name] = value
        elif arr:
            arr[0] = value
        else:
            arr.append(value)

    def record_origin(self, item: Token, how: str) -> None:
        """Remember where the scalar that ``item`` assigned was set, and how (for serving)."""
        kind, val, pos = item
        m = ASSIGN_RE.match(val) if kind == "word" and isinstance(val, str) else None
        if m and m.group(1) in self.scalars:
            text, reason = self.scalars[m.group(1)]
            if how == "export":
                self.exported.add(m.group(1))
            how = "export" if m.group(1) in self.exported else how
            self.origins[m.group(1)] = EnvValue(text, reason, self.file, self.line(pos), how)

    def export(self, items: list[Token]) -> None:
        """``export NAME`` (no ``=``): a variable assigned earlier goes into the environment."""
        for kind, raw, _ in items:
            if kind == "word" and isinstance(raw, str) and re.fullmatch(NAME, raw):
                self.exported.add(raw)
                if raw in self.origins:
                    o = self.origins[raw]
                    self.origins[raw] = EnvValue(o.value, o.reason, o.file, o.line, "export")

    def unset(self, items: list[Token]) -> None:
        for kind, raw, _ in items:
            if kind == "word" and isinstance(raw, str):
                for table in (self.scalars, self.arrays, self.var_occ, self.origins):
                    table.pop(raw, None)
                self.exported.discard(raw)
