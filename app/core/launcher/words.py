"""Words: quote removal and expansion of one word (``\\``, ``'...'``, ``"..."``, ``$NAME``,
``$1``..., and the ``$(...)`` / backtick / ``$((...))`` / ``${...}`` pieces), charged per character.

Command substitution is never run: it is unknown, except the ``SCRIPT_DIR`` idioms (``$(cd --
"$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)``, ``$(dirname "$0")``, ...), which expand
to the directory of the file being read.
"""

from __future__ import annotations

import posixpath
import re

from app.core.launcher.arith import Unresolved
from app.core.launcher.lexer import NAME, match_end
from app.core.launcher.state import ShellState, Value
from app.core.launcher.text import MAX_DEPTH, MAX_VALUE, TOO_COMPLEX, TOO_LONG, short

NAME_RE = re.compile(NAME)
_LITERAL_RE = re.compile(r"[^\\'\"`$]+")               # runs needing no expansion
_NEEDS_EXPANSION = re.compile(r"[\\'\"`$]").search
_SPECIAL = "0123456789@*#?$!-"
_SCRIPT_DIR_NOISE = re.compile(
    r"\$\{BASH_SOURCE(?:\[0\])?\}|\$BASH_SOURCE|\$\{0\}|\$0|&>\s*/dev/null|2?>\s*/dev/null|2>&1|&&|;"
    r"|\b(?:cd|dirname|pwd|readlink|realpath)\b|(?<!\S)-[-A-Za-z]*(?!\S)|[\"'`$()\s]")


def is_script_dir(piece: str) -> bool:
    """Only cd / dirname / pwd / readlink / realpath over ``$0`` or ``BASH_SOURCE``."""
    if "dirname" not in piece or not re.search(r"BASH_SOURCE|\$\{?0\}?", piece):
        return False
    return not _SCRIPT_DIR_NOISE.sub("", piece)


class WordRules(ShellState):
    def expand(self, raw: str, depth: int = 0) -> Value:
        """Quote removal and expansion of one word: (text, first unresolved reason or None)."""
        if not self.spend(len(raw) + 8):
            return "", TOO_COMPLEX
        if len(raw) > 4 * MAX_VALUE:
            return "", TOO_LONG
        if not _NEEDS_EXPANSION(raw):
            return raw, None
        out: list[str] = []
        size, reason, in_dq, i, n = 0, None, False, 0, len(raw)
        while i < n:
            m = _LITERAL_RE.match(raw, i)
            r = None
            c = raw[i]
            if m:
                piece, i = m.group(), m.end()
            elif c == "\\":
                nxt = raw[i + 1:i + 2]
                piece = "" if nxt == "\n" else "\\" + nxt if in_dq and nxt not in '$`"\\' else nxt
                i += 2
            elif c == "'" and not in_dq:
                j = raw.find("'", i + 1)
                j = n if j < 0 else j
                piece, i = raw[i + 1:j], j + 1
            elif c == '"':
                piece, in_dq, i = "", not in_dq, i + 1
            elif c == "`" or (c == "$" and raw[i + 1:i + 2] in ("(", "{")):
                j, ok = match_end(raw, i, n)
                piece, r = self.expand_piece(raw[i:j], ok, depth)
                i = j
            elif c == "$":
                piece, r, i = self.dollar(raw, i, in_dq, depth)
            else:
                piece, i = c, i + 1
            reason = reason or r
            out.append(piece)
            size += len(piece)
            if size > MAX_VALUE:
                return "", TOO_LONG
        text = "".join(out)
        self.charge(len(text))
        return text, reason

    def dollar(self, raw: str, i: int, in_dq: bool, depth: int) -> tuple[str, str | None, int]:
        """``$NAME``, ``$1`` / ``$@`` ..., or a lone ``$`` at raw[i]: (text, reason, next index)."""
        nm = NAME_RE.match(raw, i + 1)
        nxt = raw[i + 1:i + 2]
        if nm:
            piece, r, _ = self.lookup(nm.group(), None, depth)
            return piece, r, nm.end()
        if nxt and nxt in _SPECIAL:
            piece, r, _ = self.lookup(nxt)
            return piece, r, i + 2
        return ("" if nxt == "'" and not in_dq else "$"), None, i + 1   # $'...' is read as '...'

    def expand_piece(self, piece: str, ok: bool, depth: int) -> Value:
        """Expand one ``$(...)``, backtick, ``$((...))`` or ``${...}`` piece."""
        if not ok:
            return "", f"{short(piece, 20)} is never closed"
        if depth >= MAX_DEPTH:
            return "", "expansions are nested too deeply"
        if piece.startswith("$((") and piece.endswith("))"):
            try:
                return str(self.arith(piece[3:-2], depth + 1)), None
            except Unresolved as exc:
                return "", str(exc)
        if piece[0] == "`" or piece.startswith("$("):
            if is_script_dir(piece):   # SCRIPT_DIR idioms: the directory of the file being read
                return posixpath.dirname(self.file) or ".", None
            return "", f"command substitution {short(piece)} cannot be evaluated"
        return self.param(piece[2:-1], depth + 1)
