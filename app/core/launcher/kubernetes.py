"""A Kubernetes-style container spec pasted as text: ``env:`` items (``- name: X`` + ``value: ...``
on the next line, or ``- {name: X, value: ...}``; ``valueFrom`` is unknown) and ``command:`` /
``args:`` lists (block items or a ``[...]`` flow list of double-quoted strings).

No regular expression that can backtrack (issue 20 finding 7: ``(.*?)\\s*\\}\\s*$`` took 32 s on a
4 kB line): each line is cut with ``str`` methods, and a line longer than :data:`MAX_LINE` is never
read as YAML. The lines read here are blanked (numbering kept) and the rest is read as shell."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from app.core.launcher.text import LauncherError

MAX_LINE = 4096


@dataclass
class Spec:
    """What the YAML part says: env values (name -> (value or None when unknown, line)), the
    ``command`` + ``args`` words with their lines, and the remaining shell text."""

    env: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    words: list[tuple[str, int]] = field(default_factory=list)
    shell: str = ""


def _key(line: str) -> tuple[int, str, str] | None:
    """``(indent, key, rest)`` of ``[- ]key: rest`` (key a plain name), else None."""
    if len(line) > MAX_LINE:
        return None
    stripped = line.lstrip(" ")
    indent = len(line) - len(stripped)
    if stripped.startswith("- "):
        stripped = stripped[2:].lstrip(" ")
    key, colon, rest = stripped.partition(":")
    if not colon or not key or not all(c.isalnum() or c in "_-." for c in key):
        return None
    if rest and not rest.startswith((" ", "\t")):
        return None
    return indent, key, rest.strip()


def scalar(text: str, line: int) -> str:
    """A YAML scalar: double-quoted (JSON rules), single-quoted (``''`` is a quote), or plain
    (a `` #`` starts a comment)."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        if t[0] == '"':
            try:
                return str(json.loads(t))
            except ValueError:
                raise LauncherError(f"line {line}: cannot read the quoted value {t[:80]}") from None
        return t[1:-1].replace("''", "'")
    return t.split(" #", 1)[0].strip()


def _inline_env(item: str, line: int) -> tuple[str, str] | None:
    """``{name: X, value: V}`` -> (X, V)."""
    body = item.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    name_part, comma, value_part = body[1:-1].partition(",")
    nk, _, name = name_part.partition(":")
    vk, _, value = value_part.partition(":")
    if not comma or nk.strip() != "name" or vk.strip() != "value" or not name.strip():
        return None
    return name.strip(), scalar(value, line)


def _list(lines: list[str], i: int, indent: int, key: str, inline: str) -> tuple[list[tuple[str, int]], int]:
    """A ``command:`` / ``args:`` list starting at line index i: (items with their lines, next index)."""
    if inline.startswith("["):
        try:
            items = json.loads(inline)
        except ValueError:
            raise LauncherError(f"line {i + 1}: {key}: {inline[:80]} is not a list of double-quoted strings") from None
        if not isinstance(items, list):
            raise LauncherError(f"line {i + 1}: {key} must be a list")
        return [(str(x), i + 1) for x in items], i + 1
    if inline:
        raise LauncherError(f"line {i + 1}: {key} must be a list")
    out, j = [], i + 1
    while j < len(lines) and len(lines[j]) <= MAX_LINE:
        stripped = lines[j].lstrip(" ")
        if not stripped.startswith("- ") or len(lines[j]) - len(stripped) < indent:
            break
        out.append((scalar(stripped[2:], j + 1), j + 1))
        j += 1
    return out, j


def read_spec(text: str) -> Spec:
    """Split ``text`` into its Kubernetes-style parts and the shell text (same line numbers)."""
    lines = text.split("\n")
    keep = list(lines)
    spec = Spec()
    lists: dict[str, list[tuple[str, int]]] = {}
    i = 0
    while i < len(lines):
        item = lines[i].lstrip(" ")
        inline = _inline_env(item[2:], i + 1) if item.startswith("- {") and len(item) <= MAX_LINE else None
        if inline:
            spec.env[inline[0]] = (inline[1], i + 1)
            keep[i] = ""
            i += 1
            continue
        got = _key(lines[i])
        if got is None:
            i += 1
            continue
        indent, key, rest = got
        if key in ("command", "args") and not item.startswith("- "):
            lists[key], end = _list(lines, i, indent, key, rest)
            keep[i:end] = [""] * (end - i)
            i = end
            continue
        if key == "name" and lines[i].lstrip(" ").startswith("- ") and i + 1 < len(lines):
            nxt = _key(lines[i + 1])
            if nxt is not None and nxt[1] == "value":
                spec.env[rest] = (scalar(nxt[2], i + 2), i + 2)
                keep[i] = keep[i + 1] = ""
                i += 1
            elif nxt is not None and nxt[1] == "valueFrom":
                spec.env[rest] = (None, i + 1)
                keep[i] = ""
        i += 1
    spec.words = lists.get("command", []) + lists.get("args", [])
    if lists or spec.env:   # YAML mappings (image:, containers:, ...) are no shell commands
        keep = ["" if _key(line) is not None and line.strip() else line for line in keep]
    spec.shell = "\n".join(keep)
    return spec
