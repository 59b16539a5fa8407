"""The reader's entry points: :func:`parse_launcher` (text, lenient or strict), :func:`read_launcher`
(a file on disk and what it sources), :func:`read_launcher_files` (pasted files), the fail-closed
rule :func:`fail_closed`, and :func:`candidate_config` (the checkpoint's ``config.json``, CLI only).

Hostile input stays cheap: more than :data:`MAX_LAUNCHER_BYTES` per file (:data:`MAX_TOTAL_BYTES`
in all) raises :class:`LauncherError`, and nesting depth, value length, array length and total
expansion work are capped. In the lenient mode any other text parses without raising (what cannot
be known lands in ``unresolved`` / ``warnings`` / ``fatal``); in strict mode a script that cannot
be read completely raises :class:`LauncherError` instead of giving a verdict.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.core.inputs import InputError, read_bounded
from app.core.launcher.interpreter import Interpreter
from app.core.launcher.kubernetes import read_spec
from app.core.launcher.results import INT_RE, Arg, Command, EnvValue, LauncherParse
from app.core.launcher.source import disk_loader, files_loader
from app.core.launcher.state import Loader
from app.core.launcher.text import MAX_LAUNCHER_BYTES, MAX_TOTAL_BYTES, LauncherError, decode, text_file, where

PARALLEL_SIZE_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-virtual-stages-per-pipeline-rank",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
)


def parse_launcher(text: str | bytes, *, name: str = "", loader: Loader | None = None,
                   strict: bool = False, sourced_budget: int | None = None) -> LauncherParse:
    """Statically read a bash launcher script (never executed) and report its flags of interest.

    ``source`` / ``.`` files are read through ``loader``. With ``strict`` anything that keeps the
    script from being read completely raises :class:`LauncherError` (see :func:`fail_closed`);
    otherwise it only lands in ``warnings`` / ``unresolved`` / ``fatal``. Oversized or non-UTF-8
    input always raises. ``sourced_budget`` fixes the work budget up front (see
    :func:`app.core.launcher.cost.read_work_bound`)."""
    body = decode(text, name or "(pasted)")
    if strict and "\x00" in body:
        raise LauncherError(f"{name or 'the launcher script'} holds binary data (a NUL byte), not a bash script")
    interp = Interpreter(body, name, loader, sourced_budget)
    interp.run()
    parsed = interp.result()
    if strict:
        fail_closed(parsed, body, name)
    return parsed


@dataclass(frozen=True)
class LaunchCommands:
    """The commands a launch text runs (its shell script's and its Kubernetes-style spec's), the
    spec's ``env:`` list (``k8s_env``; a ``valueFrom`` is unknown) and the shell's variables."""

    commands: tuple[Command, ...]
    k8s: dict[str, EnvValue]
    shell: dict[str, EnvValue]
    work: int


def launch_commands(text: str, name: str, loader: Loader | None, parsed: LauncherParse | None) -> LaunchCommands:
    """Every command of ``text`` that names a launched engine (a serve command, a MaxText trainer):
    the shell script's, the spec's ``command`` / ``args`` words, and the script of a spec's
    ``sh -c`` / ``bash -c``. ``parsed``: the text already read (reused when the text holds no
    Kubernetes-style parts). Raises :class:`LauncherError` for a script that cannot be read completely."""
    spec = read_spec(text)
    scripts: list[str | LauncherParse] = [parsed if parsed is not None and not (spec.env or spec.words) else spec.shell]
    words = [w for w, _ in spec.words]
    commands: list[Command] = []
    if len(words) >= 3 and posixpath.basename(words[0]) in ("sh", "bash") and words[1] == "-c":
        scripts.append("\n" * (spec.words[2][1] - 1) + words[2])   # the script keeps its line number
    elif words:
        commands.append(Command(tuple(Arg(w, None, w, name, n) for w, n in spec.words), {}, name, spec.words[0][1]))
    shell: dict[str, EnvValue] = {}
    work = 0
    for script in scripts:
        read = parse_launcher(script, name=name, loader=loader) if isinstance(script, str) else script
        if read.missing:
            raise LauncherError("cannot read the sourced file(s) " + "; ".join(read.missing))
        if read.fatal:
            raise LauncherError("; ".join(read.fatal) + "; the command cannot be read")
        commands += read.commands
        work += read.work if isinstance(script, str) else 0
        shell.update(read.environment)
    k8s = {k: EnvValue(v if v is not None else "", None if v is not None else "valueFrom", name, line, "k8s_env")
           for k, (v, line) in spec.env.items()}
    return LaunchCommands(tuple(commands), k8s, shell, work)


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
        if value is not None and INT_RE.fullmatch(value.strip()) and int(value) < 1:
            raise LauncherError(f"{flag} is {value} at {at.get(flag, name)}; a parallel size must be at least 1")


def read_launcher(path: str | os.PathLike[str], *, strict: bool = True) -> LauncherParse:
    """Read the launcher at ``path`` and every file it sources from disk (bounded reads: regular
    files only); strict (raises :class:`LauncherError`) unless ``strict`` is False (a sourced file
    that is not a regular file raises all the same)."""
    main = os.path.abspath(os.fspath(path))
    if main == os.devnull:
        raise LauncherError(f"the launcher script {path} is empty (it is {os.devnull})")
    try:
        data = read_bounded(main, limit=MAX_LAUNCHER_BYTES, what="the launcher script")
    except InputError as exc:
        raise LauncherError(f"cannot read the launcher script {path}: {exc}") from None
    text = text_file(data, main)
    parsed = parse_launcher(text, name=main, loader=disk_loader())
    if strict:
        fail_closed(parsed, text, main)
    return parsed


def read_launcher_files(files: Mapping[str, str | bytes], main: str, *, strict: bool = True) -> LauncherParse:
    """Read pasted / uploaded files (name -> text): ``main`` is the launcher; a sourced path is looked
    up by its path relative to ``main``'s directory, then by its base name when that is unique."""
    if sum(len(v) for v in files.values()) > MAX_TOTAL_BYTES:
        raise LauncherError(f"the launcher and its sourced files exceed {MAX_TOTAL_BYTES} bytes")
    named = {posixpath.normpath(k.replace("\\", "/")): v for k, v in files.items()}
    start = posixpath.normpath(main.replace("\\", "/"))
    if start not in named:
        raise LauncherError(f"the launcher {main} is not among the given files")
    body = decode(named[start], start)
    if "\x00" in body:
        raise LauncherError(f"{start} holds binary data (a NUL byte), not a bash script")
    sourced = sum(len(v) for k, v in named.items() if k != start)
    parsed = parse_launcher(body, name=start, loader=files_loader(named), sourced_budget=sourced)
    if strict:
        fail_closed(parsed, body, start)
    return parsed


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
