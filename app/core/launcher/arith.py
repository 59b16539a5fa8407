"""Arithmetic: ``$(( expr ))`` with ``+ - * / % ( )`` in bash's signed 64-bit integers (``/``
truncates toward zero, ``%`` takes the dividend's sign, a leading ``0`` is octal, ``0x`` hex), by a
recursive-descent evaluator bounded in depth and length; never ``eval``."""

from __future__ import annotations

import re

from app.core.launcher.lexer import NAME
from app.core.launcher.state import ShellState
from app.core.launcher.text import MAX_ARITH, MAX_DEPTH, TOO_COMPLEX, short

_ARITH_TOKEN_RE = re.compile(rf"\s*(0[xX][0-9A-Fa-f]+|[0-9]+|{NAME}|[-+*/%()])")


class Unresolved(Exception):
    """An arithmetic expression (or an index) cannot be evaluated; the message is the reason."""


def wrap(v: int) -> int:
    """Reduce to a signed 64-bit integer, as bash does."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def _number(tok: str) -> int:
    try:
        if tok[:2] in ("0x", "0X"):
            return wrap(int(tok, 16))
        return wrap(int(tok, 8) if len(tok) > 1 and tok[0] == "0" else int(tok))
    except ValueError:
        raise Unresolved(f"invalid number {short(tok, 30)} in arithmetic") from None


class ArithRules(ShellState):
    def arith(self, expr: str, depth: int) -> int:
        """Evaluate ``$(( expr ))`` (raises :class:`Unresolved`)."""
        if depth >= MAX_DEPTH:
            raise Unresolved("arithmetic is nested too deeply")
        if not self.spend(256):
            raise Unresolved(TOO_COMPLEX)
        text, reason = self.expand(expr, depth)
        if reason:
            raise Unresolved(reason)
        if len(text) > MAX_ARITH:
            raise Unresolved(f"the arithmetic expression is longer than {MAX_ARITH} characters")
        tokens, pos = [], 0
        while m := _ARITH_TOKEN_RE.match(text, pos):
            tokens.append(m.group(1))
            pos = m.end()
        if text[pos:].strip():
            raise Unresolved(f"unsupported arithmetic $(({short(expr)}))")
        return _Arith(self, tokens, expr).parse(depth)

    def variable(self, name: str, depth: int) -> int:
        """A bare name inside arithmetic: its value, itself evaluated as arithmetic."""
        text, reason, is_set = self.lookup(name, None, depth)
        if not is_set:
            raise Unresolved(f"${name} is not assigned in this script")
        if reason:
            raise Unresolved(reason)
        return self.arith(text, depth + 1) if text.strip() else 0


class _Arith:
    """Recursive-descent evaluator: + - * / % and parentheses."""

    def __init__(self, shell: ArithRules, tokens: list[str], source: str) -> None:
        self.shell, self.tokens, self.source, self.pos = shell, tokens, source, 0

    def fail(self) -> None:
        raise Unresolved(f"unsupported arithmetic $(({short(self.source)}))")

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def parse(self, depth: int) -> int:
        if not self.tokens:
            return 0
        value = self.expr(depth)
        if self.pos != len(self.tokens):
            self.fail()
        return value

    def expr(self, depth: int) -> int:
        value = self.term(depth)
        while (op := self.peek()) in ("+", "-"):
            self.pos += 1
            rhs = self.term(depth)
            value = wrap(value + rhs if op == "+" else value - rhs)
        return value

    def term(self, depth: int) -> int:
        value = self.unary(depth)
        while (op := self.peek()) in ("*", "/", "%"):
            self.pos += 1
            rhs = self.unary(depth)
            if op == "*":
                value = wrap(value * rhs)
                continue
            if rhs == 0:
                raise Unresolved(f"division by zero in $(({short(self.source)}))")
            q = abs(value) // abs(rhs)
            q = -q if (value < 0) != (rhs < 0) else q   # truncate toward zero, like bash
            value = wrap(q if op == "/" else value - rhs * q)
        return value

    def unary(self, depth: int) -> int:
        sign = 1
        while (op := self.peek()) in ("+", "-"):
            self.pos += 1
            sign = -sign if op == "-" else sign
        return wrap(sign * self.primary(depth))

    def primary(self, depth: int) -> int:
        tok = self.peek()
        self.pos += 1
        if tok[:1].isdigit():
            return _number(tok)
        if tok[:1].isalpha() or tok[:1] == "_":
            return self.shell.variable(tok, depth + 1)
        if tok == "(" and depth < MAX_DEPTH:
            value = self.expr(depth + 1)
            if self.peek() != ")":
                self.fail()
            self.pos += 1
            return value
        if tok == "(":
            raise Unresolved("arithmetic is nested too deeply")
        self.fail()
        return 0   # unreachable
