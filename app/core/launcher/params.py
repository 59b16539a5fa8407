"""Parameter expansion: ``$V`` / ``${V[i]}`` / ``${A[@]}`` lookups, ``${#V}``, ``${#A[@]}`` and the
operators ``:-`` ``-`` ``:=`` ``=`` ``:+`` ``+`` ``:?`` ``?``. A name never assigned in the text
(it would come from the environment) and positional parameters are unknown, with the reason."""

from __future__ import annotations

import re

from app.core.launcher.arith import Unresolved
from app.core.launcher.lexer import NAME
from app.core.launcher.state import ShellState, Value
from app.core.launcher.text import MAX_VALUE, TOO_COMPLEX, TOO_LONG, short
from app.core.launcher.words import NAME_RE

_LENGTH_RE = re.compile(rf"#({NAME})(\[[@*]\])?")
_PARAM_RE = re.compile(rf"({NAME}|[0-9]+|[@*#?$!-])(?:\[([^\]]*)\])?(?:(:?[-=+?])(.*))?", re.DOTALL)


def via(reason: str, name: str) -> str:
    """``reason (via $A, $B)``: the chain of variables an unknown value came through."""
    if reason.endswith(")") and " (via $" in reason:
        return f"{reason[:-1]}, ${name})"
    return f"{reason} (via ${name})"


class ParamRules(ShellState):
    def lookup(self, name: str, index: str | None = None, depth: int = 0) -> tuple[str, str | None, bool]:
        """Value of ``$name`` / ``${name[index]}`` as (text, unresolved reason or None, is set)."""
        if name in self.arrays:
            arr = self.arrays[name]
        elif name in self.scalars:
            arr = [self.scalars[name]]
        elif NAME_RE.fullmatch(name):
            return "", f"${name} is not assigned in this script", False
        else:
            return "", f"${name} is a positional or special parameter and cannot be known", False
        if index in ("@", "*"):
            if not self.spend(8 * len(arr)):
                return "", TOO_COMPLEX, True
            parts = [t for t, _ in arr]
            if sum(map(len, parts)) + len(parts) > MAX_VALUE:
                return "", TOO_LONG, True
            reason = next((r for _, r in arr if r), None)
            return " ".join(parts), reason and via(reason, name), bool(arr)
        try:
            k = 0 if index is None else self.arith(index, depth + 1)
        except Unresolved as exc:
            return "", f"index of ${{{name}[{short(index or '')}]}}: {exc}", True
        if -len(arr) <= k < len(arr):
            text, reason = arr[k]
            return text, reason and via(reason, name), True
        return "", None, False

    def param(self, body: str, depth: int) -> Value:
        """Expand the inside of ``${...}``."""
        m = _LENGTH_RE.fullmatch(body)
        if m:
            name = m.group(1)
            if m.group(2):
                return str(len(self.arrays[name]) if name in self.arrays else int(name in self.scalars)), None
            text, reason, _ = self.lookup(name, None, depth)
            return str(len(text)), reason
        m = _PARAM_RE.fullmatch(body)
        if not m:
            return "", f"unsupported expansion ${{{short(body)}}}"
        name, index, op, word = m.groups()
        text, reason, is_set = self.lookup(name, index, depth)
        if op is None:
            return text, reason
        empty = not is_set or (op[0] == ":" and reason is None and text == "")
        if op[-1] in "-=":
            if not empty:
                return text, reason
            value = self.expand(word, depth)
            if op[-1] == "=" and index is None and NAME_RE.fullmatch(name):
                self.set_scalar(name, value)
            return value
        if op[-1] == "+":
            if empty:
                return "", None
            return ("", reason) if reason and op[0] == ":" else self.expand(word, depth)
        if empty:
            return "", f"${name} is not set, so ${{{name}{op}...}} would stop the script"
        return text, reason
