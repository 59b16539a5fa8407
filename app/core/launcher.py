"""Read Megatron-LM / slime parallelism flags out of a bash launcher script, without running it.

Users paste the launcher they actually use (a slime ``scripts/run-*.sh``, a Megatron
``torchrun ... pretrain_gpt.py`` script) and :func:`parse_launcher` reports the values the script
would pass for :data:`KNOWN_VALUE_FLAGS` and :data:`KNOWN_SWITCH_FLAGS`. **Nothing is executed**:
a small lexer and interpreter read this subset of bash statically:

* ``\\`` line continuations, ``#`` comments, single/double quotes and backslash escapes;
* scalar assignments ``NAME=v`` / ``NAME+=v`` (also after ``export``, ``readonly``, ``local``,
  ``declare``, ``typeset``), arrays ``NAME=( ... )`` / ``NAME+=( ... )`` over several lines with
  comments inside, and ``unset NAME``;
* ``$V``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:=d}``, ``${V:+a}``, ``${V:?}``, ``${A[@]}``,
  ``${A[*]}``, ``${A[i]}``, ``${#V}``, ``${#A[@]}`` and ``$(( ... ))`` 64-bit integer arithmetic
  with ``+ - * / % ( )`` (``/`` truncates toward zero), evaluated by a tiny recursive-descent
  parser, never ``eval``;
* flags as ``--flag value`` or ``--flag=value`` in command lines, in array bodies and in
  double-quoted scalar values (the old ``GPT_ARGS="--num-layers 24 ..."`` style); ``_`` in a
  flag name counts as ``-`` (torchrun accepts ``--nproc_per_node``);
* ``source FILE`` / ``. FILE``, read through a loader (:func:`read_launcher` from disk,
  :func:`read_launcher_files` from pasted files), relative to the sourcing file's directory, at
  most :data:`MAX_SOURCE_DEPTH` deep; ``SCRIPT_DIR`` idioms (``$(cd -- "$(dirname --
  "${BASH_SOURCE[0]}")" && pwd)``, ``$(dirname "$0")``, ...) expand to that directory;
* ``printf -v NAME FORMAT ARGS`` with ``%s`` / ``%d``.

The trainer invocation (a command with a ``*.py`` word or ``torchrun`` / ``python`` / ...) is read
as argparse would see it: its literal flags and the flags of every ``${ARR[@]}`` / ``$VAR`` it
expands, in command-line order, so the last occurrence on that line wins (Python ``argparse``
stores each option in turn). Provenance of every value is kept (:meth:`LauncherParse.provenance`).

Deliberate approximations:

* Every statement is read once, in text order: ``if``/``case`` branches, loop and function
  bodies all count, so the last assignment in the text wins. ``then``, ``do``, ``{`` ... at the
  start of a command are skipped; other control-flow syntax is read as ordinary words.
* Flags are collected where they are *written*: an array body counts even if the array is never
  expanded (before the trainer line's own flags, which come last in their command-line order).
* ``VAR=x cmd`` prefix assignments are treated as ordinary assignments.
* Command substitution (``$(...)``, backticks), positional parameters and variables never assigned
  in the text (they would come from the environment) are unknown; when one feeds a flag of interest
  the flag lands in ``unresolved`` with the reason. ``${V:-default}`` uses the default.
* ``|``, ``;``, ``&&``, ``(`` ... only separate commands; redirection targets and here-document
  bodies are skipped; a ``${ARGS[@]}`` never assigned in the script is reported.

Hostile input stays cheap: more than :data:`MAX_LAUNCHER_BYTES` per file (:data:`MAX_TOTAL_BYTES`
in all) raises :class:`LauncherError`, and nesting depth, value length, array length and total
expansion work are capped. In the default lenient mode any other text parses without raising (what
cannot be known lands in ``unresolved`` / ``warnings`` / ``fatal``); in strict mode
(:func:`read_launcher`, :func:`read_launcher_files`, ``parse_launcher(strict=True)``) a script that
cannot be read completely raises :class:`LauncherError` instead of giving a verdict
(:func:`fail_closed`).
"""

from __future__ import annotations

import bisect
import itertools
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.engines import flag_vocabulary
from app.core.layout.stages import PipelineSpec, PlanError
from app.core.plan import TABLE

FLAG_FIELDS = flag_vocabulary()  # every training engine's flag -> plan field

MAX_LAUNCHER_BYTES = 1 << 20

KNOWN_VALUE_FLAGS: frozenset[str] = frozenset({
    "--num-layers", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--pipeline-model-parallel-layout", "--tensor-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--dsa-indexer-topk-freq",
    "--dsa-indexer-skip-topk-offset", "--mtp-num-layers", "--micro-batch-size",
    "--global-batch-size", "--seq-length", "--max-tokens-per-gpu", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--actor-num-nodes", "--actor-num-gpus-per-node",
    "--num-gpus-per-node", "--nnodes", "--nproc-per-node", "--hidden-size", "--num-attention-heads",
    "--num-experts", "--moe-ffn-hidden-size", "--hf-checkpoint", "--load", "--cp-comm-type",
})
KNOWN_SWITCH_FLAGS: frozenset[str] = frozenset({
    "--sequence-parallel", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--optimizer-cpu-offload",
    "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d", "--allgather-cp",
    "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--use-distributed-optimizer",
})
# every Megatron/slime flag of the plan table is read too, so a launcher import loses no setting
KNOWN_VALUE_FLAGS |= {flag for flag, name in FLAG_FIELDS.items() if TABLE[name].kind != "bool"}
KNOWN_SWITCH_FLAGS |= {flag for flag, name in FLAG_FIELDS.items() if TABLE[name].kind == "bool"}

_MAX_DEPTH = 32           # nesting of ${...}, $((...)), arithmetic parentheses and variable lookups
_MAX_VALUE = 1 << 16      # characters in one expanded value
_MAX_ITEMS = 10_000       # elements kept in one array
_MAX_ARITH = 4096         # characters in one arithmetic expression
_TOO_LONG = f"the value is longer than {_MAX_VALUE} characters"
_TOO_COMPLEX = "the script is too complex to expand (work limit reached)"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME_RE = re.compile(_NAME)
_ASSIGN_RE = re.compile(rf"({_NAME})(\+?)=")
_ARRAY_OPEN_RE = re.compile(rf"{_NAME}\+?=")
_SPLICE_RE = re.compile(rf'"?\$\{{({_NAME})\[[@*]\]\}}"?')
_LENGTH_RE = re.compile(rf"#({_NAME})(\[[@*]\])?")
_PARAM_RE = re.compile(rf"({_NAME}|[0-9]+|[@*#?$!-])(?:\[([^\]]*)\])?(?:(:?[-=+?])(.*))?", re.DOTALL)
_ARITH_TOKEN_RE = re.compile(rf"\s*(0[xX][0-9A-Fa-f]+|[0-9]+|{_NAME}|[-+*/%()])")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_PLAIN_RE = re.compile(r"(?:[^ \t\r\n;&|()<>\\'\"`$]|\$(?![({]))+")   # ordinary word characters
_NESTED_PLAIN_RE = re.compile(r"[^\\$'\"`(){}]+")   # characters that never change nesting
_LITERAL_RE = re.compile(r"[^\\'\"`$]+")               # runs needing no expansion
_NEEDS_EXPANSION = re.compile(r"[\\'\"`$]").search
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
_REDIRECTS = frozenset({"<", ">", ">>", "<<", "<<-", "<<<", ">&", "<&", "&>", "&>>", ">|"})
_DECLARE = frozenset({"export", "readonly", "local", "declare", "typeset"})
_RESERVED = frozenset({"if", "then", "elif", "else", "fi", "while", "until", "do", "done", "esac",
                       "{", "}", "!", "time"})   # skipped at the start of a command
_SPECIAL = "0123456789@*#?$!-"


class LauncherError(ValueError):
    """The launcher cannot be read completely, so no verdict may be given (exit 2): too large, not
    UTF-8 text, empty, no trainer invocation, unterminated syntax, the expansion budget hit, a
    parallel size of 0, or a sourced file that is missing (named in ``missing``)."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


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
    files: tuple[str, ...] = ()                 # the launcher and every file it sourced
    missing: tuple[str, ...] = ()               # sourced files that could not be read
    fatal: tuple[str, ...] = field(default=())  # why the script cannot be read completely

    def ordered_occurrences(self) -> list[FlagOccurrence]:
        """Occurrences in the order argparse would see them (the trainer line's flags last)."""
        passed = {id(o) for o in self.final}
        return [o for o in self.occurrences if id(o) not in passed] + list(self.final)

    def provenance(self) -> dict[str, dict[str, object]]:
        """``{flag: {value, file, line}}`` for every final value and switch (switches: value True)."""
        source = self.ordered_occurrences()
        out: dict[str, dict[str, object]] = {}
        for o in source:
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
        if _INT_RE.fullmatch(value.strip()):
            try:
                return int(value.strip())
            except ValueError:   # more digits than int() accepts
                pass
        raise ValueError(f"{flag} is {_short(value)!r}, which is not an integer")


class _Unresolved(Exception):
    """Internal: an arithmetic expression cannot be evaluated; the message is the reason."""


def _short(s: str, limit: int = 60) -> str:
    s = " ".join(s.replace("\\\n", " ").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _via(reason: str, name: str) -> str:
    if reason.endswith(")") and " (via $" in reason:
        return f"{reason[:-1]}, ${name})"
    return f"{reason} (via ${name})"


def _wrap(v: int) -> int:
    """Reduce to a signed 64-bit integer, as bash does."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def _number(tok: str) -> int:
    try:
        if tok[:2] in ("0x", "0X"):
            return _wrap(int(tok, 16))
        return _wrap(int(tok, 8) if len(tok) > 1 and tok[0] == "0" else int(tok))
    except ValueError:
        raise _Unresolved(f"invalid number {_short(tok, 30)} in arithmetic") from None


# --- lexing ---------------------------------------------------------------------------------------

def _match_end(s: str, i: int, end: int) -> tuple[int, bool]:
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


def _scan_word(s: str, i: int, end: int) -> tuple[int, bool]:
    """Return (end of the word starting at s[i], closed?); s[i] is not a blank or operator."""
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
                return end, False
            i = j + 1
        elif c in '"`' or (c == "$" and i + 1 < end and s[i + 1] in "({"):
            i, ok = _match_end(s, i, end)
            if not ok:
                return end, False
        else:
            i += 1
    return min(i, end), True


def _skip_heredoc(s: str, i: int, end: int, delim: str, tabs: bool) -> int:
    while i < end:
        j = s.find("\n", i, end)
        j = end if j < 0 else j
        line = s[i:j]
        if (line.lstrip("\t") if tabs else line) == delim:
            return min(j + 1, end)
        i = j + 1
    return end


def _word_end(s: str, i: int, end: int, m: re.Match | None) -> tuple[int, int, bool]:
    """(end of the word at s[i], where to continue, closed?) given the fast-path match, if any."""
    j = m.end("word") if m else i
    if j < end and s[j] not in _BREAK:   # the fast path stopped at $(, ${, ` or a bad quote
        j, ok = _scan_word(s, j, end)
        return j, j, ok
    return j, (m.end() if m else j), True


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
            j, nxt, ok = _word_end(s, i, end, m)
            if not ok:
                problems.append(i)
            elems.append((s[i:j], i))
            i = nxt
    problems.append(start)
    return elems, end


def _lex(s: str, start: int, end: int, problems: list[int]) -> list[tuple[str, object, int]]:
    """Split s[start:end] into ("word", raw, pos), ("op", op, pos), ("nl", "", pos) and
    ("array", (prefix, [(raw, pos), ...]), pos) tokens. Unterminated constructs go to `problems`."""
    toks: list[tuple[str, object, int]] = []
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
            j, nxt, ok = _word_end(s, i, end, m)
            if not ok:
                problems.append(i)
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

MAX_SOURCE_DEPTH = 8
MAX_TOTAL_BYTES = 4 * MAX_LAUNCHER_BYTES   # the launcher and every file it sources, together
Loader = Callable[[str], "str | None"]
#: A word that makes a command the trainer invocation: a Python entry point or a launcher of one.
TRAINERS = frozenset({"torchrun", "python", "python3", "deepspeed", "accelerate"})
_PRINTERS = frozenset({"echo", "printf", "cat", "logger", ":"})   # commands that only print their words
_VAR_WORD_RE = re.compile(rf'"?\$(?:\{{({_NAME})(?:\[[@*]\])?\}}|({_NAME}))"?')
_SCRIPT_DIR_NOISE = re.compile(
    r"\$\{BASH_SOURCE(?:\[0\])?\}|\$BASH_SOURCE|\$\{0\}|\$0|&>\s*/dev/null|2?>\s*/dev/null|2>&1|&&|;"
    r"|\b(?:cd|dirname|pwd|readlink|realpath)\b|(?<!\S)-[-A-Za-z]*(?!\S)|[\"'`$()\s]")


def where(file: str, line: int) -> str:
    """``file:line``, or ``line N`` for the pasted launcher itself (no file name)."""
    return f"{file}:{line}" if file else f"line {line}"


def _line_starts(text: str) -> list[int]:
    return [0, *itertools.accumulate(len(p) + 1 for p in text.split("\n")[:-1])]


def _is_script_dir(piece: str) -> bool:
    """``$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)``, ``$(dirname "$0")`` and
    the like: only cd / dirname / pwd / readlink / realpath over ``$0`` or ``BASH_SOURCE``."""
    if "dirname" not in piece or not re.search(r"BASH_SOURCE|\$\{?0\}?", piece):
        return False
    return not _SCRIPT_DIR_NOISE.sub("", piece)


def _printf(fmt: str, args: list[str]) -> str:
    out: list[str] = []
    rest = list(args)
    while True:
        i = 0
        while i < len(fmt):
            c = fmt[i]
            if c != "%":
                out.append(c)
                i += 1
                continue
            spec = fmt[i + 1:i + 2]
            if spec == "%":
                out.append("%")
            elif spec == "s":
                out.append(rest.pop(0) if rest else "")
            elif spec == "d":
                arg = rest.pop(0) if rest else "0"
                if not _INT_RE.fullmatch(arg.strip()):
                    raise ValueError(f"{arg!r} is not an integer for %d")
                out.append(str(int(arg)))
            else:
                raise ValueError(f"unsupported format %{spec}")
            i += 2
        if not rest or "%" not in fmt.replace("%%", ""):
            break
        if sum(map(len, out)) > _MAX_VALUE:
            raise ValueError(_TOO_LONG)
    return "".join(out)


def _is_trainer_word(raw: str) -> bool:
    """A word naming a Python entry point or a launcher of one (not text such as ``"run x.py"``)."""
    word = raw.strip("\"'")
    if not word or any(c.isspace() for c in word):
        return False
    return word.endswith(".py") or word in TRAINERS or posixpath.basename(word) in TRAINERS


class _Interpreter:
    """Walks the tokens once, in text order, tracking variables and recording flag occurrences.

    Values are (text, reason) pairs: reason is None when the text is known, else why it is not.
    """

    def __init__(self, text: str, file: str = "", loader: Loader | None = None) -> None:
        self.text = text
        self.file = file
        self.loader = loader
        self.depth = 0
        self.sourced = len(text)   # characters read, sourced files counted each time they are read
        self.files = [file]
        self.missing: list[str] = []
        self.fatal: list[str] = []
        self.trainer: tuple[str, int] | None = None
        self.final: list[FlagOccurrence] | None = None
        self.var_occ: dict[str, list[FlagOccurrence]] = {}   # flags written in each variable, in order
        self.occ_pos: list[int] = []   # text position of each occurrence (same index)
        self.line_starts = _line_starts(text)
        self.scalars: dict[str, tuple[str, str | None]] = {}
        self.arrays: dict[str, list[tuple[str, str | None]]] = {}
        self.occurrences: list[FlagOccurrence] = []
        self.unresolved: list[UnresolvedValue] = []
        self.notes: list[str] = []
        self.unknown: dict[str, str] = {}   # array name -> note, for arrays expanded before assigned
        self.budget = 8 * len(text) + 100_000

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self.line_starts, pos)

    def spend(self, n: int) -> bool:
        self.budget -= n
        if self.budget < 0 and _TOO_COMPLEX not in self.notes:
            self.notes.append(_TOO_COMPLEX)
        return self.budget >= 0

    def run(self) -> None:
        problems: list[int] = []
        cmd: list[tuple[str, object, int]] = []
        skip = False
        for tok in _lex(self.text, 0, len(self.text), problems):
            kind, val, _ = tok
            if kind == "op" and val in _REDIRECTS:
                skip = True
            elif kind in ("op", "nl"):
                if cmd:
                    self.command(cmd)
                cmd, skip = [], False
            elif skip:
                skip = False   # a redirection target
            else:
                cmd.append(tok)
        self.command(cmd)
        if problems:
            self.notes.append(f"line {self.line(min(problems))}: unterminated quote, expansion or "
                              "array; the rest of the script was read as part of it")
            self.fatal.append(f"{where(self.file, self.line(min(problems)))}: unterminated quote, expansion or array")

    def command(self, items: list) -> None:
        i = 0
        while i < len(items) and items[i][0] == "word" and items[i][1] in _RESERVED:
            i += 1
        while i < len(items) and self.assign(items[i]):
            i += 1
        rest = items[i:]
        head = rest[0][1] if rest and rest[0][0] == "word" else None
        if head in _DECLARE:
            for item in rest[1:]:
                self.assign(item)
        elif head in ("source", ".") and len(rest) == 1:
            self.missing.append(f"{head} without a readable file name at {where(self.file, self.line(rest[0][2]))} "
                                "(a process substitution or redirection cannot be read)")
        elif head in ("source", ".") and len(rest) > 1:
            if not self.source(rest[1], rest[0][2]):
                self.notes.append(f"{where(self.file, self.line(rest[0][2]))}: {head} {_short(str(rest[1][1]), 40)} "
                                  "is not read; anything it defines is unknown here")
        elif head == "printf" and len(rest) > 3 and rest[1][1] == "-v" and _NAME_RE.fullmatch(str(rest[2][1])):
            self.printf_v(str(rest[2][1]), [raw for kind, raw, _ in rest[3:] if kind == "word"])
        elif head == "unset":
            for kind, raw, _ in rest[1:]:
                if kind == "word":
                    self.scalars.pop(raw, None)
                    self.arrays.pop(raw, None)
                    self.var_occ.pop(raw, None)
        else:
            for item in rest:
                if item[0] == "array":
                    self.assign(item)
            if rest:
                self.invocation(rest)

    def printf_v(self, name: str, words: list[str]) -> None:
        """``printf -v NAME FORMAT ARGS...`` with ``%s`` / ``%d`` / ``%%`` (the format is reused while
        arguments remain, as bash does); anything else leaves NAME unresolved."""
        fmt, reason = self.expand(words[0])
        args: list[str] = []
        for w in words[1:]:
            text, r = self.expand(w)
            reason = reason or r
            args.append(text)
        if reason is None:
            try:
                text = _printf(fmt, args)
            except ValueError as exc:
                text, reason = "", f"printf -v {name}: {exc}"
        self.set_scalar(name, ("", reason) if reason else (text, None))
        self.var_occ[name] = []

    def invocation(self, rest: list) -> None:
        """Scan a command's flags; for a trainer invocation keep its final, ordered flag list: the
        literal flags plus those of every ``${ARR[@]}`` / ``$VAR`` it expands, in command-line order
        (argparse: the last occurrence wins)."""
        words = [(raw, pos) for kind, raw, pos in rest if kind == "word"]
        start = len(self.occurrences)
        self.scan(words)
        placed = list(zip(self.occ_pos[start:], self.occurrences[start:]))
        for raw, pos in words:
            m = _VAR_WORD_RE.fullmatch(raw)
            if m:
                placed += [(pos, o) for o in self.var_occ.get(m.group(1) or m.group(2), [])]
        if words and words[0][0] not in _PRINTERS and any(_is_trainer_word(raw) for raw, _ in words):
            self.trainer = (self.file, self.line(words[0][1]))
            self.final = [o for _, o in sorted(placed, key=lambda t: t[0])]

    def source(self, item: tuple, pos: int) -> bool:
        """``source FILE`` / ``. FILE``: read FILE (relative to the current file's directory) through
        the loader and interpret it in place, at most :data:`MAX_SOURCE_DEPTH` deep."""
        at = where(self.file, self.line(pos))
        text, reason = self.expand(item[1]) if item[0] == "word" else ("", "not a file name")
        if reason or not text:
            self.missing.append(f"{_short(str(item[1]), 60)} (sourced at {at}; {reason or 'empty name'})")
            return False
        path = text if posixpath.isabs(text) else posixpath.normpath(
            posixpath.join(posixpath.dirname(self.file) or ".", text))
        if self.depth >= MAX_SOURCE_DEPTH:
            self.fatal.append(f"{at}: source {path} nests deeper than {MAX_SOURCE_DEPTH} files")
            return False
        body = self.loader(path) if self.loader is not None else None
        if body is None:
            self.missing.append(f"{path} (sourced at {at})")
            return False
        self.sourced += len(body)
        if self.sourced > MAX_TOTAL_BYTES:
            self.fatal.append(f"{at}: the sourced files add up to more than {MAX_TOTAL_BYTES} bytes")
            return True
        self.budget += 8 * len(body)
        saved = (self.text, self.line_starts, self.file)
        self.text, self.line_starts, self.file = body, _line_starts(body), path
        self.files.append(path)
        self.depth += 1
        try:
            self.run()
        finally:
            self.depth -= 1
            self.text, self.line_starts, self.file = saved
        return True

    def assign(self, item: tuple) -> bool:
        kind, val, pos = item
        if kind == "array":
            prefix, elems = val
            name = prefix.rstrip("+=")
            items: list[tuple[str, str | None]] = []
            if prefix.endswith("+="):
                items = list(self.arrays.get(name, [self.scalars[name]] if name in self.scalars else []))
            exps: list[tuple[str, str | None] | None] = []
            placed: list[tuple[int, FlagOccurrence]] = []
            for raw, epos in elems:
                m = _SPLICE_RE.fullmatch(raw)
                if len(items) >= _MAX_ITEMS:
                    exps.append(None)
                elif m:   # "${OTHER[@]}" splices OTHER's elements
                    src = m.group(1)
                    more = self.arrays.get(src, [self.scalars[src]] if src in self.scalars else [])
                    items.extend(more if self.spend(8 * len(more)) else [("", _TOO_COMPLEX)])
                    placed += [(epos, o) for o in self.var_occ.get(src, [])]
                    exps.append(None)
                else:
                    value = self.expand(raw)
                    exps.append(value)
                    items.append(value)
            start = len(self.occurrences)
            self.scan(elems, exps)
            placed += list(zip(self.occ_pos[start:], self.occurrences[start:]))
            kept = self.var_occ.get(name, []) if prefix.endswith("+=") else []
            self.var_occ[name] = kept + [o for _, o in sorted(placed, key=lambda t: t[0])]
            if len(items) >= _MAX_ITEMS:
                del items[_MAX_ITEMS:]
                note = f"array {name} reached {_MAX_ITEMS} elements; later ones are dropped"
                if note not in self.notes:
                    self.notes.append(note)
            self.arrays[name] = items
            self.scalars.pop(name, None)
            return True
        m = _ASSIGN_RE.match(val) if kind == "word" else None
        if not m:
            return False
        name, vraw = m.group(1), val[m.end():]
        first = len(self.occurrences)
        if len(vraw) >= 2 and vraw[0] == vraw[-1] == '"' and "--" in vraw:
            start = pos + m.end() + 1   # flags written inside a double-quoted value
            inner = _lex(self.text, start, start + len(vraw) - 2, [])
            self.scan([(str(v), p) for k, v, p in inner if k == "word"])
        self.var_occ[name] = (self.var_occ.get(name, []) if m.group(2) else []) + self.occurrences[first:]
        text, reason = self.expand(vraw)
        if m.group(2):
            before, old_reason, _ = self.lookup(name)
            text, reason = before + text, old_reason or reason
            if len(text) > _MAX_VALUE:
                text, reason = "", _TOO_LONG
        self.set_scalar(name, (text, reason))
        return True

    def set_scalar(self, name: str, value: tuple[str, str | None]) -> None:
        arr = self.arrays.get(name)
        if arr is None:
            self.scalars[name] = value
        elif arr:
            arr[0] = value
        else:
            arr.append(value)

    def scan(self, words: list[tuple[str, int]], exps: list | None = None) -> None:
        """Record the flags of interest written in `words` (command words or array elements)."""
        n = len(words)
        exps = list(exps) if exps else [None] * n

        def exp(k: int) -> tuple[str, str | None]:   # expand lazily: most words are not flags
            if exps[k] is None:
                exps[k] = self.expand(words[k][0])
            return exps[k]

        i = 0
        while i < n:
            raw, pos = words[i]
            i += 1
            if not raw.lstrip("\"'").startswith("--"):
                m = _SPLICE_RE.fullmatch(raw) if raw.startswith(("${", '"${')) else None
                if m and m.group(1) not in self.arrays and m.group(1) not in self.scalars:
                    self.unknown.setdefault(m.group(1), f"line {self.line(pos)}: {_short(raw, 40)} is never "
                                            "assigned in this script, so flags inside it are not seen")
                continue   # flags must be written literally, not come out of an expansion
            text, reason = exp(i - 1)
            name, eq, rest = text.partition("=")
            flag = "--" + name[2:].replace("_", "-")
            if not eq and flag in KNOWN_SWITCH_FLAGS:
                self.occurrences.append(FlagOccurrence(flag, None, self.line(pos), "", self.file))
                self.occ_pos.append(pos)
            elif flag in KNOWN_VALUE_FLAGS and eq:
                vraw = raw.partition("=")[2].replace("\\\n", "")
                if raw[0] in "\"'" and vraw.endswith(raw[0]):
                    vraw = vraw[:-1]
                self.add_value(flag, rest, reason, pos, vraw)
            elif flag in KNOWN_VALUE_FLAGS and i < n and not exp(i)[0].startswith("--"):
                self.add_value(flag, *exp(i), pos, words[i][0].replace("\\\n", ""))
                i += 1
            elif flag in KNOWN_VALUE_FLAGS:
                self.add_value(flag, None, f"{flag} has no value", pos, "")

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

    def lookup(self, name: str, index: str | None = None, depth: int = 0) -> tuple[str, str | None, bool]:
        """Value of ``$name`` / ``${name[index]}`` as (text, unresolved reason or None, is set)."""
        if name in self.arrays:
            arr = self.arrays[name]
        elif name in self.scalars:
            arr = [self.scalars[name]]
        elif _NAME_RE.fullmatch(name):
            return "", f"${name} is not assigned in this script", False
        else:
            return "", f"${name} is a positional or special parameter and cannot be known", False
        if index in ("@", "*"):
            if not self.spend(8 * len(arr)):
                return "", _TOO_COMPLEX, True
            parts = [t for t, _ in arr]
            if sum(map(len, parts)) + len(parts) > _MAX_VALUE:
                return "", _TOO_LONG, True
            reason = next((r for _, r in arr if r), None)
            return " ".join(parts), reason and _via(reason, name), bool(arr)
        try:
            k = 0 if index is None else self.arith(index, depth + 1)
        except _Unresolved as exc:
            return "", f"index of ${{{name}[{_short(index or '')}]}}: {exc}", True
        if -len(arr) <= k < len(arr):
            text, reason = arr[k]
            return text, reason and _via(reason, name), True
        return "", None, False

    def expand(self, raw: str, depth: int = 0) -> tuple[str, str | None]:
        """Quote removal and expansion of one word: (text, first unresolved reason or None)."""
        if not self.spend(len(raw) + 8):
            return "", _TOO_COMPLEX
        if len(raw) > 4 * _MAX_VALUE:
            return "", _TOO_LONG
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
                j, ok = _match_end(raw, i, n)
                piece, r = self.expand_piece(raw[i:j], ok, depth)
                i = j
            elif c == "$":
                nm = _NAME_RE.match(raw, i + 1)
                nxt = raw[i + 1:i + 2]
                if nm:
                    piece, r, _ = self.lookup(nm.group(), None, depth)
                    i = nm.end()
                elif nxt and nxt in _SPECIAL:
                    piece, r, _ = self.lookup(nxt)
                    i += 2
                else:   # a lone "$" (or $'...', read as '...')
                    piece, i = ("" if nxt == "'" and not in_dq else "$"), i + 1
            else:
                piece, i = c, i + 1
            reason = reason or r
            out.append(piece)
            size += len(piece)
            if size > _MAX_VALUE:
                return "", _TOO_LONG
        text = "".join(out)
        self.spend(len(text))
        return text, reason

    def expand_piece(self, piece: str, ok: bool, depth: int) -> tuple[str, str | None]:
        """Expand one ``$(...)``, backtick, ``$((...))`` or ``${...}`` piece."""
        if not ok:
            return "", f"{_short(piece, 20)} is never closed"
        if depth >= _MAX_DEPTH:
            return "", "expansions are nested too deeply"
        if piece.startswith("$((") and piece.endswith("))"):
            try:
                return str(self.arith(piece[3:-2], depth + 1)), None
            except _Unresolved as exc:
                return "", str(exc)
        if piece[0] == "`" or piece.startswith("$("):
            if _is_script_dir(piece):   # SCRIPT_DIR idioms: the directory of the file being read
                return posixpath.dirname(self.file) or ".", None
            return "", f"command substitution {_short(piece)} cannot be evaluated"
        return self.param(piece[2:-1], depth + 1)

    def param(self, body: str, depth: int) -> tuple[str, str | None]:
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
            return "", f"unsupported expansion ${{{_short(body)}}}"
        name, index, op, word = m.groups()
        text, reason, is_set = self.lookup(name, index, depth)
        if op is None:
            return text, reason
        empty = not is_set or (op[0] == ":" and reason is None and text == "")
        if op[-1] in "-=":
            if not empty:
                return text, reason
            value = self.expand(word, depth)
            if op[-1] == "=" and index is None and _NAME_RE.fullmatch(name):
                self.set_scalar(name, value)
            return value
        if op[-1] == "+":
            if empty:
                return "", None
            return ("", reason) if reason and op[0] == ":" else self.expand(word, depth)
        if empty:
            return "", f"${name} is not set, so ${{{name}{op}...}} would stop the script"
        return text, reason

    def arith(self, expr: str, depth: int) -> int:
        """Evaluate ``$(( expr ))`` (raises _Unresolved)."""
        if depth >= _MAX_DEPTH:
            raise _Unresolved("arithmetic is nested too deeply")
        if not self.spend(256):
            raise _Unresolved(_TOO_COMPLEX)
        text, reason = self.expand(expr, depth)
        if reason:
            raise _Unresolved(reason)
        if len(text) > _MAX_ARITH:
            raise _Unresolved(f"the arithmetic expression is longer than {_MAX_ARITH} characters")
        tokens, pos = [], 0
        while m := _ARITH_TOKEN_RE.match(text, pos):
            tokens.append(m.group(1))
            pos = m.end()
        if text[pos:].strip():
            raise _Unresolved(f"unsupported arithmetic $(({_short(expr)}))")
        return _Arith(self, tokens, expr).parse(depth)

    def variable(self, name: str, depth: int) -> int:
        """A bare name inside arithmetic: its value, itself evaluated as arithmetic."""
        text, reason, is_set = self.lookup(name, None, depth)
        if not is_set:
            raise _Unresolved(f"${name} is not assigned in this script")
        if reason:
            raise _Unresolved(reason)
        return self.arith(text, depth + 1) if text.strip() else 0

    def ordered(self) -> list[FlagOccurrence]:
        if self.final is None:
            return self.occurrences
        passed = {id(o) for o in self.final}
        return [o for o in self.occurrences if id(o) not in passed] + self.final

    def result(self) -> LauncherParse:
        """Final values: every occurrence in text order, except that the trainer command line's flags
        come last and in that line's expanded order (argparse: the last occurrence wins)."""
        source = self.ordered()
        values: dict[str, str] = {}
        by_flag: dict[str, list[FlagOccurrence]] = {}
        for occ in source:
            if occ.flag in KNOWN_VALUE_FLAGS:
                by_flag.setdefault(occ.flag, []).append(occ)
                if occ.value is None:
                    values.pop(occ.flag, None)
                else:
                    values[occ.flag] = occ.value
        warnings = [_duplicate_warning(flag, occs) for flag, occs in by_flag.items()
                    if len({o.value if o.value is not None else f"{o.raw} (unresolved)" for o in occs}) > 1]
        notes = self.notes + [note for name, note in self.unknown.items()
                              if name not in self.arrays and name not in self.scalars]
        return LauncherParse(
            values=values,
            switches=frozenset(o.flag for o in source if o.flag in KNOWN_SWITCH_FLAGS),
            occurrences=tuple(self.occurrences),
            unresolved=tuple(self.unresolved),
            warnings=tuple(warnings + notes[:20] + [f"... and {len(notes) - 20} more"] * (len(notes) > 20)),
            variables={k: t for k, (t, r) in self.scalars.items() if r is None},
            final=tuple(self.final or ()),
            trainer=self.trainer,
            files=tuple(self.files),
            missing=tuple(self.missing),
            fatal=tuple(self.fatal + ([_TOO_COMPLEX] if self.budget < 0 else [])),
        )


def _duplicate_warning(flag: str, occs: list[FlagOccurrence]) -> str:
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


class _Arith:
    """Recursive-descent evaluator for bash integer arithmetic: + - * / % and parentheses."""

    def __init__(self, interp: _Interpreter, tokens: list[str], source: str) -> None:
        self.interp, self.tokens, self.source, self.pos = interp, tokens, source, 0

    def fail(self) -> None:
        raise _Unresolved(f"unsupported arithmetic $(({_short(self.source)}))")

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
            value = _wrap(value + rhs if op == "+" else value - rhs)
        return value

    def term(self, depth: int) -> int:
        value = self.unary(depth)
        while (op := self.peek()) in ("*", "/", "%"):
            self.pos += 1
            rhs = self.unary(depth)
            if op == "*":
                value = _wrap(value * rhs)
                continue
            if rhs == 0:
                raise _Unresolved(f"division by zero in $(({_short(self.source)}))")
            q = abs(value) // abs(rhs)
            q = -q if (value < 0) != (rhs < 0) else q   # truncate toward zero, like bash
            value = _wrap(q if op == "/" else value - rhs * q)
        return value

    def unary(self, depth: int) -> int:
        sign = 1
        while (op := self.peek()) in ("+", "-"):
            self.pos += 1
            sign = -sign if op == "-" else sign
        return _wrap(sign * self.primary(depth))

    def primary(self, depth: int) -> int:
        tok = self.peek()
        self.pos += 1
        if tok[:1].isdigit():
            return _number(tok)
        if tok[:1].isalpha() or tok[:1] == "_":
            return self.interp.variable(tok, depth + 1)
        if tok == "(" and depth < _MAX_DEPTH:
            value = self.expr(depth + 1)
            if self.peek() != ")":
                self.fail()
            self.pos += 1
            return value
        if tok == "(":
            raise _Unresolved("arithmetic is nested too deeply")
        self.fail()
        return 0   # unreachable


PARALLEL_SIZE_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-virtual-stages-per-pipeline-rank",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
)


def _decode(data: str | bytes, name: str) -> str:
    """The text of one file: at most :data:`MAX_LAUNCHER_BYTES`, UTF-8, no NUL bytes."""
    if isinstance(data, (bytes, bytearray)):
        size, unit = len(data), "bytes"
    elif isinstance(data, str):   # counting characters first avoids encoding a huge string
        size, unit = (len(data), "characters") if len(data) > MAX_LAUNCHER_BYTES else \
            (len(data.encode("utf-8", "surrogatepass")), "bytes")
    else:
        raise TypeError(f"parse_launcher() wants str or bytes, not {type(data).__name__}")
    if size > MAX_LAUNCHER_BYTES:
        raise LauncherError(f"the launcher script {name} is {size} {unit}, "
                            f"over the limit of {MAX_LAUNCHER_BYTES} bytes")
    if not isinstance(data, str):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LauncherError(f"the launcher script {name} is not UTF-8 text "
                                f"(bad byte at offset {exc.start})") from None
    return data.removeprefix("\ufeff").replace("\r\n", "\n")


def _text_file(data: str | bytes, name: str) -> str:
    text = _decode(data, name)
    if "\x00" in text:
        raise LauncherError(f"{name} holds binary data (a NUL byte), not a bash script")
    if not text.strip():
        raise LauncherError(f"{name} is empty")
    return text


def parse_launcher(text: str | bytes, *, name: str = "", loader: Loader | None = None,
                   strict: bool = False) -> LauncherParse:
    """Statically read a bash launcher script (never executed) and report its flags of interest.

    ``source`` / ``.`` files are read through ``loader`` (a resolved path -> text, or None when it
    cannot be read); see :func:`read_launcher` and :func:`read_launcher_files`, which are strict.
    With ``strict`` anything that keeps the script from being read completely raises
    :class:`LauncherError` (see :func:`fail_closed`); otherwise it only lands in ``warnings`` /
    ``unresolved`` / ``fatal``. Oversized or non-UTF-8 input always raises.
    """
    body = _decode(text, name or "(pasted)")
    if strict and "\x00" in body:
        raise LauncherError(f"{name or 'the launcher script'} holds binary data (a NUL byte), not a bash script")
    interp = _Interpreter(body, name, loader)
    interp.run()
    parsed = interp.result()
    if strict:
        fail_closed(parsed, body, name)
    return parsed


def fail_closed(parsed: LauncherParse, text: str, name: str = "") -> None:
    """Raise :class:`LauncherError` unless the whole script was read and says what would run."""
    name = name or "the launcher script"
    if not text.strip():
        raise LauncherError(f"{name} is empty")
    if parsed.missing:
        raise LauncherError("cannot read the sourced file(s) " + "; ".join(parsed.missing)
                            + "; give them too (files next to the script, or paste them)", parsed.missing)
    if parsed.fatal:
        raise LauncherError(f"cannot read {name} completely: " + "; ".join(parsed.fatal))
    if parsed.trainer is None:
        raise LauncherError(f"{name} has no trainer invocation (a torchrun / python ... .py command line), "
                            "so nothing says what would run")
    at = {o.flag: where(o.file, o.line) for o in parsed.occurrences if o.value == parsed.values.get(o.flag)}
    for flag in PARALLEL_SIZE_FLAGS:
        value = parsed.values.get(flag)
        if value is not None and _INT_RE.fullmatch(value.strip()) and int(value) < 1:
            raise LauncherError(f"{flag} is {value} at {at.get(flag, name)}; a parallel size must be at least 1")


def read_launcher(path: str | os.PathLike[str]) -> LauncherParse:
    """Read the launcher at ``path`` and every file it sources (relative to the sourcing file's
    directory, as ``SCRIPT_DIR`` idioms resolve), from disk; strict (raises :class:`LauncherError`)."""
    main = os.path.abspath(os.fspath(path))
    total = [0]

    def load(p: str) -> str | None:
        try:
            with open(p, "rb") as fh:
                data = fh.read(MAX_LAUNCHER_BYTES + 1)
        except OSError:
            return None
        total[0] += len(data)
        if total[0] > MAX_TOTAL_BYTES:
            raise LauncherError(f"the launcher and its sourced files exceed {MAX_TOTAL_BYTES} bytes")
        return _text_file(data, p)

    text = load(main)
    if text is None:
        raise LauncherError(f"cannot read the launcher script {path}")
    return parse_launcher(text, name=main, loader=load, strict=True)


def read_launcher_files(files: Mapping[str, str | bytes], main: str) -> LauncherParse:
    """Read pasted / uploaded files (name -> text): ``main`` is the launcher; a sourced path is looked
    up by its path relative to ``main``'s directory, then by its base name when that is unique."""
    if sum(len(v) for v in files.values()) > MAX_TOTAL_BYTES:
        raise LauncherError(f"the launcher and its sourced files exceed {MAX_TOTAL_BYTES} bytes")
    named = {posixpath.normpath(k.replace("\\", "/")): v for k, v in files.items()}
    start = posixpath.normpath(main.replace("\\", "/"))
    if start not in named:
        raise LauncherError(f"the launcher {main} is not among the given files")

    def load(p: str) -> str | None:
        key = posixpath.normpath(p)
        if key not in named:
            same = [k for k in named if posixpath.basename(k) == posixpath.basename(key)]
            if len(same) != 1:
                return None
            key = same[0]
        return _text_file(named[key], key)

    return parse_launcher(named[start], name=start, loader=load, strict=True)


def candidate_config(parsed: LauncherParse, base: str | os.PathLike[str] | None = None) -> str | None:
    """A ``config.json`` at the launcher's ``--hf-checkpoint`` (then ``--load``) path, if one exists
    on this machine (relative paths from ``base``): offered as the model to check against. For the
    CLI only: on a server it would reveal which paths exist there."""
    for flag in ("--hf-checkpoint", "--load"):
        value = parsed.values.get(flag)
        if not value:
            continue
        p = Path(value)
        if not p.is_absolute() and base is not None:
            p = Path(base) / p
        try:
            if (p / "config.json").is_file():
                return str(p / "config.json")
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- launcher -> layout

#: Flags without which (or with an unresolved value of which) the stages cannot be materialised.
PIPELINE_FLAGS = (
    "--num-layers", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--pipeline-model-parallel-layout", "--mtp-num-layers", "--dsa-indexer-topk-freq",
    "--dsa-indexer-skip-topk-offset",
)


#: Launcher flag -> the config field it must equal (Megatron's names for the HF config's fields).
MODEL_FLAGS = (
    ("--num-layers", "num_hidden_layers"), ("--hidden-size", "hidden_size"),
    ("--num-attention-heads", "num_attention_heads"), ("--num-experts", "n_routed_experts"),
    ("--moe-ffn-hidden-size", "moe_intermediate_size"), ("--dsa-indexer-topk-freq", "index_topk_freq"),
    ("--dsa-indexer-skip-topk-offset", "index_skip_topk_offset"),
)


def model_disagreements(parsed: LauncherParse, cfg: Any, num: Callable[[str], int | None]) -> list[PlanError]:
    """Every model flag of the launcher that differs from MODEL's config, as a ``model`` error naming
    file:line and both values. DSA freq/offset are compared only when the config states them;
    ``--mtp-num-layers`` may be lower than the config's MTP layers (a plan may train without MTP),
    not higher (the checkpoint has no weights for the extra ones)."""
    at = {o.flag: where(o.file, o.line) for o in parsed.ordered_occurrences() if o.value is not None}
    errors: list[PlanError] = []
    for flag, attr in MODEL_FLAGS:
        value, expected = num(flag), getattr(cfg, attr, None)
        if value is None or expected is None or value == expected:
            continue
        errors.append(PlanError("launcher_model_mismatch" if flag != "--num-layers" else "num_layers_mismatch",
                                f"{at.get(flag, 'the launcher')}: {flag} {value} in the script does not match "
                                f"the model's {attr} {expected}", flag, kind="model"))
    mtp = num("--mtp-num-layers")
    if mtp is not None and mtp > cfg.num_nextn_predict_layers:
        errors.append(PlanError("launcher_model_mismatch",
                                f"{at.get('--mtp-num-layers', 'the launcher')}: --mtp-num-layers {mtp} in the "
                                f"script exceeds the model's num_nextn_predict_layers "
                                f"{cfg.num_nextn_predict_layers} (no weights for the extra MTP layers)",
                                "--mtp-num-layers", kind="model"))
    return errors


@dataclass(frozen=True)
class LauncherRequest:
    """What a launcher script says about the pipeline, ready for :func:`app.core.engines.megatron.check.run_check`."""

    spec: PipelineSpec
    freq: int | None
    offset: int | None
    unresolved: tuple[str, ...]  # pipeline flags that could not be resolved: the check cannot run
    warnings: tuple[str, ...]
    errors: tuple[PlanError, ...]
    report: dict


def launcher_request(parsed: LauncherParse, cfg) -> LauncherRequest:
    """Map the parsed flags onto a :class:`PipelineSpec` for ``cfg``.

    ``--virtual-pipeline-model-parallel-size`` (the older name) counts as
    ``--num-virtual-stages-per-pipeline-rank``. Without ``--mtp-num-layers`` the plan builds no
    MTP layer: Megatron's and slime's default is ``None`` (THUDM/slime ``slime/utils/arguments.py``
    at 624b824a898ab0ec1fcb4d373004c7f3852bf515 resets ``--mtp-num-layers`` to ``default=None``). p2p overlap is on unless the script passes
    ``--no-overlap-p2p-communication``. A ``--num-layers`` that differs from the config's
    ``num_hidden_layers`` is an error.
    """
    unresolved = tuple(
        f"{u.flag} ({where(u.file, u.line)}): {u.reason}" for u in parsed.unresolved
        if u.flag in PIPELINE_FLAGS and u.flag not in parsed.values
    )
    warnings = list(parsed.warnings)
    warnings += [f"{u.flag} ({where(u.file, u.line)}) is unresolved: {u.reason}" for u in parsed.unresolved
                 if u.flag not in PIPELINE_FLAGS and u.flag not in parsed.values]
    errors: list[PlanError] = []

    def num(flag: str) -> int | None:
        try:
            return parsed.int_value(flag)
        except ValueError as exc:
            nonlocal unresolved
            unresolved = unresolved + (str(exc),)
            return None

    vpp = num("--num-virtual-stages-per-pipeline-rank")
    legacy = num("--virtual-pipeline-model-parallel-size")
    if vpp is None and legacy is not None:
        vpp = legacy
    mtp = num("--mtp-num-layers")
    if mtp is None and "--mtp-num-layers" not in parsed.values and cfg.num_nextn_predict_layers:
        warnings.append(f"--mtp-num-layers is not in the script, so the plan builds no MTP layer (Megatron's and "
                        f"slime's default is None) although the model has {cfg.num_nextn_predict_layers}")
    errors += model_disagreements(parsed, cfg, num)
    if "--overlap-p2p-communication" in parsed.switches:
        warnings.append("--overlap-p2p-communication is not a Megatron option (its parser would stop on it): p2p "
                        "overlap is on by default and the switch is --no-overlap-p2p-communication "
                        "(megatron/training/arguments.py); drop it")
    if "--virtual-pipeline-model-parallel-size" in parsed.values:
        warnings.append("--virtual-pipeline-model-parallel-size is not a Megatron option any more (its parser would "
                        "stop on it); it is read here as --num-virtual-stages-per-pipeline-rank, use that name")
    pp = num("--pipeline-model-parallel-size")
    if pp is None and "--pipeline-model-parallel-size" not in parsed.values:
        warnings.append("--pipeline-model-parallel-size is not in the script; Megatron's default is 1")
    spec = PipelineSpec(
        pp=pp or 1,
        vpp=vpp,
        layers_per_vstage=num("--num-layers-per-virtual-pipeline-stage"),
        first=num("--decoder-first-pipeline-num-layers"),
        last=num("--decoder-last-pipeline-num-layers"),
        account_for_embedding="--account-for-embedding-in-pipeline-split" in parsed.switches,
        account_for_loss="--account-for-loss-in-pipeline-split" in parsed.switches,
        layout=parsed.values.get("--pipeline-model-parallel-layout"),
        mtp_layers=mtp if mtp is not None else 0,
        overlap_p2p="--no-overlap-p2p-communication" not in parsed.switches,
    )
    report = {
        "values": parsed.provenance(),  # {flag: {value, file, line}}: every value read, with where it was set
        "files": list(parsed.files),
        "trainer": {"file": parsed.trainer[0], "line": parsed.trainer[1]} if parsed.trainer else None,
        "switches": sorted(parsed.switches),
        "unresolved": [{"flag": u.flag, "file": u.file, "line": u.line, "raw": u.raw, "reason": u.reason} for u in parsed.unresolved],
        "warnings": list(parsed.warnings),
    }
    return LauncherRequest(spec, num("--dsa-indexer-topk-freq"), num("--dsa-indexer-skip-topk-offset"),
                           unresolved, tuple(warnings), tuple(errors), report)
