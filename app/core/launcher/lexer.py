"""Lexing: bash text -> words, operators, newlines and array bodies, with their positions.

A regex fast path reads ordinary words; :func:`_scan_word` / :func:`_match_end` finish a word that
holds ``$(``, ``${``, backticks or quotes, iteratively (100k-deep nesting cannot overflow the stack).
An unterminated construct is reported by the position of its opener (``problems``), never raised.
Here-document bodies are skipped; a word followed by ``(`` after ``NAME=`` opens an array body.
"""

from __future__ import annotations

import re

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ARRAY_OPEN_RE = re.compile(rf"{NAME}\+?=")
_PLAIN_RE = re.compile(r"(?:[^ \t\r\n;&|()<>\\'\"`$]|\$(?![({]))+")   # ordinary word characters
_NESTED_PLAIN_RE = re.compile(r"[^\\$'\"`(){}]+")   # characters that never change nesting
_BREAK = " \t\r\n;&|()<>"
_SIMPLE = r"""\$\{[^{}"'`$\\]*\}|\$\(\([^()"'`$\\]*\)\)"""   # ${...} / $((...)) without nesting
_TOKEN_RE = re.compile(r"""
    (?P<blank>(?:[ \t\r]|\\\n)+)
  | (?P<nl>\n[ \t\r\n]*)
  | (?P<comment>\#[^\n]*)
  | (?P<op><<<|<<-|&>>|&&|\|\||;;|<<|>>|>&|<&|&>|\|&|>\||[;&|()<>])
  | (?P<word>(?:[^ \t\r\n;&|()<>\\'"`$]|\\[^\n]|\$(?![({])|'[^']*'|SIMPLE
                |"(?:[^"\\`$]|\\[\s\S]|\$(?![({])|SIMPLE)*")+)(?:[ \t\r]|\\\n)*
""".replace("SIMPLE", _SIMPLE), re.VERBOSE)   # fast path; _scan_word finishes words it stops inside
REDIRECTS = frozenset({"<", ">", ">>", "<<", "<<-", "<<<", ">&", "<&", "&>", "&>>", ">|"})

Token = tuple[str, object, int]   # ("word", raw, pos) | ("op", op, pos) | ("nl", "", pos) | ("array", ..., pos)


def opener(s: str, pos: int) -> str:
    """What opens at ``s[pos]``, for a message: ``'``, ``"``, a backtick, ``$(``, ``${`` or ``(``."""
    return s[pos:pos + 2] if s[pos:pos + 2] in ("$(", "${") else s[pos:pos + 1]


def match_end(s: str, i: int, end: int) -> tuple[int, bool]:
    """Skip the ``"``, backtick, ``$(`` or ``${`` opening at s[i]; return (index past its closer,
    closed?). Iterative, so deep nesting cannot overflow the stack."""
    if s[i] in '"`':
        stack, i = [s[i]], i + 1
    else:
        stack, i = [")" if s[i + 1] == "(" else "}"], i + 2
    while i < end:
        m = _NESTED_PLAIN_RE.match(s, i, end)
        if m:
            i = m.end()
            continue
        c, top = s[i], stack[-1]
        if c == "\\":
            i += 2
            continue
        if c == "$" and i + 1 < end and s[i + 1] in "({":
            stack.append(")" if s[i + 1] == "(" else "}")
            i += 2
            continue
        if top == '"':
            if c == '"':
                stack.pop()
            elif c == "`":
                stack.append("`")
        elif c == "'":
            j = s.find("'", i + 1, end)
            if j < 0:
                return end, False
            i = j
        elif c == '"':
            stack.append('"')
        elif c == top:
            stack.pop()
        elif c == "`":
            stack.append("`")
        elif (c, top) in (("(", ")"), ("{", "}")):
            stack.append(top)
        i += 1
        if not stack:
            return i, True
    return end, False


def _scan_word(s: str, i: int, end: int) -> tuple[int, int]:
    """Return (end of the word starting at s[i], -1 or the position of the opener never closed);
    s[i] is not a blank or operator."""
    while i < end:
        m = _PLAIN_RE.match(s, i, end)
        if m:
            i = m.end()
            continue
        c = s[i]
        if c in _BREAK:
            break
        if c == "\\":
            i += 2
        elif c == "'":
            j = s.find("'", i + 1, end)
            if j < 0:
                return end, i
            i = j + 1
        elif c in '"`' or (c == "$" and i + 1 < end and s[i + 1] in "({"):
            start = i
            i, ok = match_end(s, i, end)
            if not ok:
                return end, start
        else:
            i += 1
    return min(i, end), -1


def _skip_heredoc(s: str, i: int, end: int, delim: str, tabs: bool) -> int:
    while i < end:
        j = s.find("\n", i, end)
        j = end if j < 0 else j
        line = s[i:j]
        if (line.lstrip("\t") if tabs else line) == delim:
            return min(j + 1, end)
        i = j + 1
    return end


def _word_end(s: str, i: int, end: int, m: re.Match | None) -> tuple[int, int, int]:
    """(end of the word at s[i], where to continue, -1 or the opener never closed) given the
    fast-path match, if any."""
    j = m.end("word") if m else i
    if j < end and s[j] not in _BREAK:   # the fast path stopped at $(, ${, ` or a bad quote
        j, bad = _scan_word(s, j, end)
        return j, j, bad
    return j, (m.end() if m else j), -1


def _lex_array(s: str, i: int, end: int, problems: list[int]) -> tuple[list[tuple[str, int]], int]:
    """Read array elements after ``NAME=(`` up to the closing ``)``; return (elements, end)."""
    elems: list[tuple[str, int]] = []
    start = i
    while i < end:
        m = _TOKEN_RE.match(s, i, end)
        kind = m.lastgroup if m else "word"
        if m is not None and kind in ("blank", "nl", "comment"):
            i = m.end()
        elif kind == "op":
            if s[i] == ")":
                return elems, i + 1
            i += 1   # a stray operator inside an array body: ignore it
        else:
            j, nxt, bad = _word_end(s, i, end, m)
            if bad >= 0:
                problems.append(bad)
            elems.append((s[i:j], i))
            i = nxt
    problems.append(start - 1)   # the "(" of an array never closed
    return elems, end


def lex(s: str, start: int, end: int, problems: list[int]) -> list[Token]:
    """Split s[start:end] into ("word", raw, pos), ("op", op, pos), ("nl", "", pos) and
    ("array", (prefix, [(raw, pos), ...]), pos) tokens. Unterminated constructs go to `problems`."""
    toks: list[Token] = []
    heredocs: list[tuple[str, bool]] = []
    want_delim: str | None = None
    i = start
    while i < end:
        m = _TOKEN_RE.match(s, i, end)
        kind = m.lastgroup if m else "word"
        if m is not None and kind in ("blank", "comment"):
            i = m.end()
        elif m is not None and kind == "nl":
            toks.append(("nl", "", i))
            i = m.end()
            if heredocs:
                i = m.start() + 1
                for delim, tabs in heredocs:
                    i = _skip_heredoc(s, i, end, delim, tabs)
                heredocs.clear()
            want_delim = None
        elif m is not None and kind == "op":
            toks.append(("op", m.group(), i))
            i = m.end()
            want_delim = m.group() if m.group() in ("<<", "<<-") else None
        else:
            j, nxt, bad = _word_end(s, i, end, m)
            if bad >= 0:
                problems.append(bad)
            raw = s[i:j]
            if want_delim:
                heredocs.append((re.sub(r"[\"'\\]", "", raw), want_delim == "<<-"))
                want_delim = None
            if j < end and s[j] == "(" and _ARRAY_OPEN_RE.fullmatch(raw):
                elems, j = _lex_array(s, j + 1, end, problems)
                toks.append(("array", (raw, elems), i))
            else:
                toks.append(("word", raw, i))
                j = nxt
            i = j
    return toks


# --- interpretation -------------------------------------------------------------------------------
