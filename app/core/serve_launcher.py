"""Read a ``vllm serve`` / ``python -m sglang.launch_server`` launch without running anything.

Input is text: a shell script (or one command line), a Kubernetes-style container spec pasted as
text (``env:`` items ``- name: VLLM_PP_LAYER_PARTITION`` / ``value: "..."``, and ``command:`` /
``args:`` lists, block or ``[...]`` flow style), or both. The result is the engine, the model,
TP, PP and the layer partition from ``VLLM_PP_LAYER_PARTITION`` / ``SGLANG_PP_LAYER_PARTITION``,
each with the line it came from.

The shell subset (``app.core.launcher``'s reader is Megatron-specific: fixed flag lists, no
command detection, no line numbers for variables, so it is not reused):

* ``\\``-newline continuations, ``#`` comments, quotes, and ``;`` ``&&`` ``||`` ``|`` ``&``
  between commands, lexed with :mod:`shlex` (never ``eval``, never a subprocess);
* ``NAME=value`` and ``export NAME=value`` set variables; ``NAME=value cmd`` and
  ``env NAME=value cmd`` set them for that command only; ``docker run -e NAME=value`` too;
* ``$NAME``, ``${NAME}`` and ``${NAME:-default}`` expand from assignments earlier in the text;
  any other ``$`` expression (``$(...)``, a name never assigned) is unknown. Quoting is not
  tracked for expansion: a ``$`` inside single quotes is expanded as well (an approximation);
* the serve command is ``vllm serve MODEL`` (or ``--model``), ``python[3] -m
  vllm.entrypoints.openai.api_server --model M``, ``python[3] -m sglang.launch_server`` /
  ``sglang serve`` with ``--model-path`` (or ``--model``); ``exec``, ``nohup``, ``time`` and a
  path before the program name are allowed.

Flags read: vLLM ``--tensor-parallel-size`` / ``-tp``, ``--pipeline-parallel-size`` / ``-pp``;
SGLang ``--tp-size`` / ``--tp`` / ``--tensor-parallel-size``, ``--pp-size`` / ``--pp`` /
``--pipeline-parallel-size``; ``--flag value`` and ``--flag=value``; the last occurrence wins
(argparse). Missing TP / PP mean the engines' default 1.

Fails closed (:class:`ServeLauncherError`, naming the field and line): no serve command, more
than one, an unknown or non-integer TP/PP/model/partition value, an unterminated quote on a line
that matters, two different partition values, or text over :data:`MAX_BYTES`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from app.core.engines import sglang, vllm
from app.core.engines.serving import serving_check_report

MAX_BYTES = 1 << 20
ENV_VARS = {vllm.ENV_VAR: "vllm", sglang.ENV_VAR: "sglang"}
_FLAGS = {
    "vllm": {"tp": ("--tensor-parallel-size", "-tp"), "pp": ("--pipeline-parallel-size", "-pp"),
             "model": ("--model",)},
    "sglang": {"tp": ("--tp-size", "--tp", "--tensor-parallel-size"),
               "pp": ("--pp-size", "--pp", "--pipeline-parallel-size"), "model": ("--model-path", "--model")},
}
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_SEPARATORS = {";", "&&", "||", "|", "&", "|&", ";;"}
_K8S_NAME = re.compile(r"^\s*-\s*name:\s*(\S+?)\s*$")
_K8S_VALUE = re.compile(r"^\s*value:\s*(.*?)\s*$")
_K8S_INLINE = re.compile(r"^\s*-\s*\{\s*name:\s*([^,\s]+)\s*,\s*value:\s*(.*?)\s*\}\s*$")
_K8S_LIST = re.compile(r"^(\s*)(command|args):\s*(.*?)\s*$")
_K8S_ITEM = re.compile(r"^(\s*)-\s+(.*?)\s*$")


class ServeLauncherError(ValueError):
    """The launch cannot be read completely; the message names what is missing and where."""


@dataclass(frozen=True)
class Provenance:
    value: str
    line: int  # 1-based line of the text
    how: str  # command | assignment | export | prefix | docker_env | k8s_env | k8s_args

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "line": self.line, "how": self.how}


@dataclass(frozen=True)
class ServeLaunch:
    engine: str
    model: str
    tp: int
    pp: int
    partition: tuple[int, ...] | None
    provenance: dict[str, Provenance]
    warnings: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "model": self.model, "tp": self.tp, "pp": self.pp,
            "partition": list(self.partition) if self.partition is not None else None,
            "provenance": {k: v.to_dict() for k, v in self.provenance.items()},
            "warnings": list(self.warnings),
        }


@dataclass
class _Command:
    words: list[str]  # expanded and unquoted; "\0" marks a part that cannot be known
    line: int
    env: dict[str, Provenance]
    word_lines: list[int]
    raw_words: list[str]  # each word as written (before expansion)

    def line_of(self, k: int) -> int:
        return self.word_lines[k] if k < len(self.word_lines) else self.line


class _Unterminated(Exception):
    """A quote, ``$(``, ``${`` or backtick that does not end on its logical line."""


def _logical_lines(text: str) -> list[tuple[int, str, list[int]]]:
    """Join ``\\``-newline continuations: (first line number, text, offset where each physical
    line starts in the text)."""
    out: list[tuple[int, str, list[int]]] = []
    offsets: list[int] = []
    buf, start = "", 0
    for n, raw in enumerate(text.split("\n"), start=1):
        if not offsets:
            start = n
        offsets.append(len(buf))
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            buf += raw[:-1] + " "
            continue
        out.append((start, buf + raw, offsets))
        buf, offsets = "", []
    if offsets:
        out.append((start, buf, offsets))
    return out


def _close(s: str, i: int, char: str) -> int:
    k = s.find(char, i + 1)
    if k < 0:
        raise _Unterminated(char)
    return k + 1


def _skip_paren(s: str, i: int) -> int:
    """``s[i] == "("``: the index after its matching ``)`` (quotes inside are not tracked)."""
    depth = 0
    for k in range(i, len(s)):
        depth += {"(": 1, ")": -1}.get(s[k], 0)
        if depth == 0:
            return k + 1
    raise _Unterminated("$(")


def _skip_double(s: str, i: int) -> int:
    k = i + 1
    while k < len(s):
        c = s[k]
        if c == "\\":
            k += 2
        elif c == '"':
            return k + 1
        elif s.startswith("$(", k):
            k = _skip_paren(s, k + 1)
        elif c == "`":
            k = _close(s, k, "`")
        else:
            k += 1
    raise _Unterminated('"')


def _raw_words(s: str) -> list[tuple[str, int]]:
    """Words of one logical line with their quotes kept, and ``;`` ``&`` ``|`` operators, each with
    its offset. ``#`` at the start of a word ends the line."""
    out: list[tuple[str, int]] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t\r":
            i += 1
            continue
        if c == "#":
            break
        if c in ";&|":
            j = i + 1
            while j < n and j - i < 2 and s[j] in ";&|":
                j += 1
            out.append((s[i:j], i))
            i = j
            continue
        start = i
        while i < n and s[i] not in " \t\r;&|":
            c = s[i]
            if c == "\\":
                i += 2
            elif c == "'":
                i = _close(s, i, "'")
            elif c == '"':
                i = _skip_double(s, i)
            elif s.startswith("$(", i):
                i = _skip_paren(s, i + 1)
            elif s.startswith("${", i):
                i = _close(s, i, "}")
            elif c == "`":
                i = _close(s, i, "`")
            elif c in "<>":  # a redirection: keep `2>&1`, `>&2` in one word
                i += 1
                while i < n and s[i] in ">&":
                    i += 1
            else:
                i += 1
        out.append((s[start:i], start))
    return out


_UNKNOWN = "\0"
_NAME_AT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::?-(.*))?", re.DOTALL)


def _escape(value: str, in_double: bool, split: bool) -> str:
    """``value`` written so that :func:`shlex.split` gives it back literally (split on whitespace
    only when ``split``, as bash splits an unquoted expansion)."""
    if value == _UNKNOWN:
        return value
    if in_double:
        return value.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c.isalnum() or (split and c in " \t\n") else "\\" + c for c in value)


class _Reader:
    def __init__(self) -> None:
        self.vars: dict[str, Provenance] = {}
        self.commands: list[_Command] = []
        self.k8s_env: dict[str, Provenance] = {}
        self.warnings: list[str] = []

    def lookup(self, name: str, scope: dict[str, Provenance]) -> str | None:
        got = scope.get(name) or self.vars.get(name)
        return got.value if got is not None else None

    def expand(self, raw: str, scope: dict[str, Provenance], split: bool) -> str:
        """``raw`` with ``$NAME`` / ``${NAME}`` / ``${NAME:-default}`` replaced outside single
        quotes; ``$(...)``, backticks and unknown names become :data:`_UNKNOWN`."""
        out: list[str] = []
        i, n, dq = 0, len(raw), False
        while i < n:
            c = raw[i]
            if c == "\\":
                out.append(raw[i:i + 2])
                i += 2
            elif c == "'" and not dq:
                k = _close(raw, i, "'")
                out.append(raw[i:k])
                i = k
            elif c == '"':
                dq = not dq
                out.append(c)
                i += 1
            elif c == "`":
                i = _close(raw, i, "`")
                out.append(_UNKNOWN)
            elif raw.startswith("$(", i):
                i = _skip_paren(raw, i + 1)
                out.append(_UNKNOWN)
            elif raw.startswith("${", i):
                k = _close(raw, i, "}")
                m = _PARAM.fullmatch(raw[i + 2:k - 1])
                value = self.lookup(m.group(1), scope) if m else None
                if value is None and m and m.group(2) is not None:
                    value = m.group(2)
                out.append(_escape(value if value is not None else _UNKNOWN, dq, split))
                i = k
            elif c == "$" and (m := _NAME_AT.match(raw, i + 1)):
                value = self.lookup(m.group(0), scope)
                out.append(_escape(value if value is not None else _UNKNOWN, dq, split))
                i = m.end()
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def words(self, raw: str, scope: dict[str, Provenance], split: bool = True) -> list[str]:
        try:
            return shlex.split(self.expand(raw, scope, split))
        except (ValueError, _Unterminated):
            return [_UNKNOWN]

    def shell(self, text: str, line_offset: int = 0) -> None:
        for n, line, offsets in _logical_lines(text):
            n += line_offset
            try:
                raw = _raw_words(line)
            except _Unterminated as exc:
                if re.search(r"vllm|sglang|_PP_LAYER_PARTITION", line):
                    raise ServeLauncherError(f"line {n}: unterminated {exc.args[0]}; the serve command cannot be "
                                             "read") from None
                continue
            cmd: list[tuple[str, int]] = []
            for word, at in [*raw, (";", len(line))]:
                if word in _SEPARATORS or set(word) <= set(";&|"):
                    if cmd:
                        self.simple(cmd, n, offsets)
                    cmd = []
                else:
                    cmd.append((word, n + bisect.bisect_right(offsets, at) - 1))

    def simple(self, raw: list[tuple[str, int]], n: int, offsets: list[int]) -> None:
        how = "assignment"
        if raw[0][0] in ("export", "readonly", "declare", "local"):
            raw, how = raw[1:], "export"
        elif raw[0][0] == "env":
            raw, how = raw[1:], "prefix"
        prefix: dict[str, Provenance] = {}
        i = 0
        while i < len(raw) and (m := _ASSIGN.fullmatch(raw[i][0])):
            value = "".join(self.words(m.group(2), prefix, split=False))
            prefix[m.group(1)] = Provenance(_UNKNOWN if _UNKNOWN in value else value, raw[i][1], how)
            i += 1
        if i == len(raw):  # assignments only: shell variables from here on
            self.vars.update(prefix)
            return
        if how == "export":  # `export NAME`: an earlier assignment goes into the environment
            for name, _ in raw[i:]:
                if name in self.vars:
                    self.vars[name] = Provenance(self.vars[name].value, self.vars[name].line, "export")
            return
        words: list[str] = []
        lines: list[int] = []
        raws: list[str] = []
        for token, line in raw[i:]:
            got = self.words(token, prefix)
            words += got
            lines += [line] * len(got)
            raws += [token] * len(got)
        start = _serve_start(words)
        for v, p in itertools.pairwise(words[:start]):  # `docker run -e NAME=value ... image <serve>`
            if v in ("-e", "--env") and (m := _ASSIGN.fullmatch(p)):
                prefix[m.group(1)] = Provenance(m.group(2), lines[words.index(p)], "docker_env")
        if start is not None:
            scope = {k: (v if how != "assignment" else Provenance(v.value, v.line, "prefix")) for k, v in prefix.items()}
            self.commands.append(_Command(words[start:], lines[start], scope, lines[start:], raws[start:]))

    def kubernetes(self, text: str) -> str:
        """Collect ``env:`` items and ``command:`` / ``args:`` lists; return the rest as shell text."""
        lines = text.split("\n")
        keep = list(lines)
        lists: dict[str, tuple[list[str], list[int]]] = {}
        i = 0
        while i < len(lines):
            line = lines[i]
            if m := _K8S_INLINE.match(line):
                self.k8s_env[m.group(1)] = Provenance(_yaml_scalar(m.group(2), i + 1), i + 1, "k8s_env")
                keep[i] = ""
            elif (m := _K8S_NAME.match(line)) and i + 1 < len(lines):
                nxt = lines[i + 1]
                if v := _K8S_VALUE.match(nxt):
                    self.k8s_env[m.group(1)] = Provenance(_yaml_scalar(v.group(1), i + 2), i + 2, "k8s_env")
                    keep[i] = keep[i + 1] = ""
                    i += 1
                elif "valueFrom" in nxt:
                    self.k8s_env[m.group(1)] = Provenance(_UNKNOWN, i + 1, "k8s_env")
                    keep[i] = ""
            elif m := _K8S_LIST.match(line):
                items, item_lines, end = _yaml_list(lines, i, m)
                lists[m.group(2)] = (items, item_lines)
                for j in range(i, end):
                    keep[j] = ""
                i = end - 1
            i += 1
        if lists:
            self.k8s_command(lists)
        return "\n".join(keep)

    def k8s_command(self, lists: dict[str, tuple[list[str], list[int]]]) -> None:
        cmd, clines = lists.get("command", ([], []))
        args, alines = lists.get("args", ([], []))
        words, lines = cmd + args, clines + alines
        if len(words) >= 3 and words[0].split("/")[-1] in ("sh", "bash") and words[1] == "-c":
            self.shell(words[2], line_offset=lines[2] - 1)
            return
        start = _serve_start(words)
        if start is not None:
            self.commands.append(_Command(words[start:], lines[start], {}, lines[start:], words[start:]))


def _yaml_scalar(text: str, line: int) -> str:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        if t[0] == '"':
            try:
                value = json.loads(t)
            except ValueError:
                raise ServeLauncherError(f"line {line}: cannot read the quoted value {t}") from None
            return str(value)
        return t[1:-1].replace("''", "'")
    return t.split(" #", 1)[0].strip()


def _yaml_list(lines: list[str], i: int, m: re.Match[str]) -> tuple[list[str], list[int], int]:
    """A ``command:`` / ``args:`` list: (items, their 1-based lines, index of the next line)."""
    indent, inline = len(m.group(1)), m.group(3)
    if inline.startswith("["):
        try:
            items = json.loads(inline)
        except ValueError:
            raise ServeLauncherError(f"line {i + 1}: {m.group(2)}: {inline} is not a list of double-quoted "
                                     "strings") from None
        if not isinstance(items, list):
            raise ServeLauncherError(f"line {i + 1}: {m.group(2)} must be a list")
        return [str(x) for x in items], [i + 1] * len(items), i + 1
    if inline:
        raise ServeLauncherError(f"line {i + 1}: {m.group(2)} must be a list")
    items, item_lines, j = [], [], i + 1
    while j < len(lines) and (it := _K8S_ITEM.match(lines[j])) and len(it.group(1)) >= indent:
        items.append(_yaml_scalar(it.group(2), j + 1))
        item_lines.append(j + 1)
        j += 1
    return items, item_lines, j


def _serve_start(words: list[str]) -> int | None:
    """Index of the program word of a serve command in ``words``, or None."""
    for k, w in enumerate(words):
        base = w.split("/")[-1]
        nxt = words[k + 1] if k + 1 < len(words) else ""
        if base in ("vllm", "sglang") and nxt == "serve":
            return k
        if re.fullmatch(r"python[0-9.]*", base) and nxt == "-m" and k + 2 < len(words) and words[k + 2] in (
                "sglang.launch_server", "vllm.entrypoints.openai.api_server"):
            return k
    return None


def _engine_of(words: list[str]) -> tuple[str, int]:
    """(engine, index of the first argument after the program and subcommand / module)."""
    if words[1] == "serve":
        return words[0].split("/")[-1], 2
    return ("sglang" if words[2].startswith("sglang") else "vllm"), 3


def _flag_values(args: list[str], names: tuple[str, ...]) -> list[tuple[str, str | None, int]]:
    """Every ``--flag value`` / ``--flag=value`` of ``names``: (flag, raw value, index of the value)."""
    found: list[tuple[str, str | None, int]] = []
    for k, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in names:
            if eq:
                found.append((flag, value, k))
            elif k + 1 < len(args) and not args[k + 1].startswith("-"):
                found.append((flag, args[k + 1], k + 1))
            else:
                found.append((flag, None, k))
    return found


def _read_command(reader: _Reader, cmd: _Command) -> tuple[str, dict[str, Provenance]]:
    engine, first = _engine_of(cmd.words)
    args = cmd.words[first:]
    got: dict[str, Provenance] = {"engine": Provenance(engine, cmd.line, "command")}
    if engine == "vllm" and cmd.words[1] == "serve" and args and not args[0].startswith("-"):
        got["model"] = Provenance(args[0], cmd.line_of(first), "command")
    for key, names in _FLAGS[engine].items():
        values = _flag_values(args, names)
        if values and not (key == "model" and "model" in got):
            flag, raw, k = values[-1]
            line = cmd.line_of(first + k)
            if raw is None:
                raise ServeLauncherError(f"line {line}: {flag} has no value")
            if _UNKNOWN in raw:
                raise ServeLauncherError(f"line {line}: {flag} {cmd.raw_words[first + k]} cannot be resolved "
                                         "(a variable not assigned in the text, or a command substitution)")
            got[key] = Provenance(raw, line, "command")
    return engine, got


def _partition(reader: _Reader, cmd: _Command, engine: str) -> Provenance | None:
    var = vllm.ENV_VAR if engine == "vllm" else sglang.ENV_VAR
    other = sglang.ENV_VAR if engine == "vllm" else vllm.ENV_VAR
    shell = cmd.env.get(var) or reader.vars.get(var)
    if shell is not None and shell.how == "assignment":
        reader.warnings.append(f"{var} is assigned on line {shell.line} but never exported, so {engine} does not "
                               f"see it and uses its default partition (write `export {var}=...`)")
        shell = None
    seen = [p for p in (reader.k8s_env.get(var), shell) if p is not None]
    if reader.k8s_env.get(other) or cmd.env.get(other) or reader.vars.get(other):
        reader.warnings.append(f"{other} is set but {engine} reads {var}; it is ignored")
    for p in seen:
        if _UNKNOWN in p.value:
            raise ServeLauncherError(f"line {p.line}: {var} cannot be resolved (unknown variable, command "
                                     "substitution or valueFrom)")
    if len({p.value.strip() for p in seen}) > 1:
        lines = ", ".join(f"{p.value!r} (line {p.line})" for p in seen)
        raise ServeLauncherError(f"{var} has two different values: {lines}; keep one")
    return seen[-1] if seen else None


def _as_int(p: Provenance, name: str) -> int:
    if not re.fullmatch(r"\s*[0-9]{1,6}\s*", p.value) or int(p.value) < 1:
        raise ServeLauncherError(f"line {p.line}: {name} is {p.value!r}; it must be a whole number >= 1")
    return int(p.value)


def parse_serve_launcher(text: str | bytes) -> ServeLaunch:
    """Read one serve launch from ``text`` (shell, Kubernetes-style YAML, or both); see the module
    docstring for what is understood. Raises :class:`ServeLauncherError` when it cannot be read."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_BYTES:
            raise ServeLauncherError(f"the launcher is {len(text)} bytes, over the limit of {MAX_BYTES}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ServeLauncherError(f"the launcher is not UTF-8 text (bad byte at offset {exc.start})") from None
    if len(text) > MAX_BYTES:
        raise ServeLauncherError(f"the launcher is {len(text)} characters, over the limit of {MAX_BYTES}")
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    reader = _Reader()
    reader.shell(reader.kubernetes(text))
    if not reader.commands:
        raise ServeLauncherError("no serve command found: expected `vllm serve MODEL ...`, "
                                 "`python -m sglang.launch_server --model-path MODEL ...` or `sglang serve ...`")
    if len(reader.commands) > 1:
        lines = ", ".join(str(c.line) for c in reader.commands)
        raise ServeLauncherError(f"{len(reader.commands)} serve commands (lines {lines}); paste one launch at a time")
    cmd = reader.commands[0]
    engine, got = _read_command(reader, cmd)
    if "model" not in got or got["model"].value == "\0":
        flag = "MODEL after `vllm serve`" if engine == "vllm" else "--model-path"
        raise ServeLauncherError(f"line {cmd.line}: the model is missing or cannot be resolved ({flag})")
    tp = _as_int(got["tp"], "the tensor parallel size") if "tp" in got else 1
    pp = _as_int(got["pp"], "the pipeline parallel size") if "pp" in got else 1
    part = _partition(reader, cmd, engine)
    sizes = None
    if part is not None:
        got["partition"] = part
        try:
            sizes = tuple(int(x) for x in part.value.split(","))
        except ValueError:
            raise ServeLauncherError(f"line {part.line}: {ENV_VARS_BY_ENGINE[engine]} is {part.value!r}, not a "
                                     "comma list of whole numbers") from None
    return ServeLaunch(engine, got["model"].value, tp, pp, sizes, got, tuple(reader.warnings))


ENV_VARS_BY_ENGINE = {v: k for k, v in ENV_VARS.items()}


def serve_launcher_report(cfg: Any, text: str | bytes, **settings: Any) -> dict[str, Any]:
    """The JSON body of ``isplan check --engine vllm|sglang --launcher FILE``: what the launch says
    (``launch``, with line numbers) and the serving check of that partition (the engine default
    when the launch sets none). ``settings`` as for
    :func:`app.core.engines.serving.serving_check_report` (``tp`` and ``model`` come from the launch)."""
    launch = parse_serve_launcher(text)
    body = serving_check_report(cfg, launch.engine, launch.pp, launch.partition,
                                **{**settings, "tp": launch.tp, "model": launch.model})
    body["launch"] = launch.to_json()
    body["warnings"] = list(launch.warnings) + body["warnings"]
    return body
