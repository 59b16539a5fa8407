"""Which engine a launcher is written for, read from the command that matters (issue 16 item 4).

Each engine says how its launch looks (``Engine.launch``, an
:class:`~app.core.engines.base.LaunchSyntax`, with its sources): serve programs and ``python -m``
modules (vLLM, SGLang: :func:`serve_start`), training entry points (Megatron-LM's ``pretrain_*.py``;
slime's ``train.py`` / ``train_async.py`` with its ``PERF_ARGS`` array) and flags only it has
(slime's ``--actor-num-nodes``, ``--max-tokens-per-gpu`` ...). In order: an entry point that needs
nothing else, then an engine-only flag on the trainer line, then an entry point with its array.
Anything else is None: the plan keeps the engine it had.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from app.core.engines import ENGINES
from app.core.launcher.results import LauncherParse
from app.core.launcher.text import where
from app.core.launcher.vocabulary import only_flags

_SERVING = [e for e in ENGINES.values() if e.workflow == "serving"]
#: ``python -m`` module -> engine, (program, subcommand) -> engine: from every serving engine's launch syntax
SERVE_MODULES = {m: e.name for e in _SERVING for m in e.launch.modules}
SERVE_PROGRAMS = {p: e.name for e in _SERVING for p in e.launch.programs}
#: container image -> engine, for the images whose entrypoint is the engine's serve program
SERVE_IMAGES = {i: e.name for e in _SERVING for i in e.launch.images}
#: programs whose ``run`` starts a container from an image
CONTAINER_PROGRAMS = frozenset({"docker", "podman", "nvidia-docker"})
#: words that make a command a serving launch (a serve program or the root of a serve module)
SERVING_WORDS = tuple(dict.fromkeys(w for e in _SERVING for w in e.launch.names))
#: words that make the reader keep a command's whole argv: a serve launch, or a trainer started as a
#: module or entry script (MaxText)
COMMAND_WORDS = tuple(dict.fromkeys(w for e in ENGINES.values() for w in e.launch.names))
#: a training engine started as ``python -m MODULE`` / ``python SCRIPT`` (MaxText) -> its name
TRAINER_MODULES = {m: e.name for e in ENGINES.values() if e.workflow == "training" for m in e.launch.modules}
TRAINER_SCRIPTS = {s: e.name for e in ENGINES.values() if e.workflow == "training" for s in e.launch.scripts}
_PYTHON = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class EngineGuess:
    """The engine a launcher is written for and why (None: the script does not say)."""

    engine: str | None
    reason: str
    file: str = ""
    line: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.engine, "reason": self.reason, "file": self.file, "line": self.line}


def image_name(word: str) -> str:
    """A container image reference without its registry host, tag and digest
    (``docker.io/vllm/vllm-openai:v0.11.0`` -> ``vllm/vllm-openai``)."""
    ref = word.split("@", 1)[0]
    head, slash, last = ref.rpartition("/")
    ref = head + slash + last.split(":", 1)[0]
    parts = ref.split("/")
    if len(parts) > 2 or (len(parts) == 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost")):
        parts = parts[1:]
    return "/".join(parts)


def _container_run(words: list[str]) -> bool:
    """Whether ``words`` (the command before an image word) start a container with the image's own
    entrypoint: ``docker`` / ``podman`` ... ``run``, no ``--entrypoint``."""
    start = next((k for k, w in enumerate(words) if posixpath.basename(w) in CONTAINER_PROGRAMS), None)
    return (start is not None and "run" in words[start + 1:]
            and not any(w == "--entrypoint" or w.startswith("--entrypoint=") for w in words))


def serve_start(words: list[str]) -> tuple[int, str, int] | None:
    """(index of the program word, engine, index of its first argument) of a serve command in
    ``words``, or None. A container run of an engine's image (:data:`SERVE_IMAGES`) starts at the
    image: what follows it is the serve program's arguments."""
    for k, w in enumerate(words):
        base = posixpath.basename(w)
        nxt = words[k + 1] if k + 1 < len(words) else ""
        if (base, nxt) in SERVE_PROGRAMS:
            return k, SERVE_PROGRAMS[(base, nxt)], k + 2
        if _PYTHON.fullmatch(base) and nxt == "-m" and k + 2 < len(words) and words[k + 2] in SERVE_MODULES:
            return k, SERVE_MODULES[words[k + 2]], k + 3
        if "/" in w and image_name(w) in SERVE_IMAGES and _container_run(words[:k]):
            return k, SERVE_IMAGES[image_name(w)], k + 1
    return None


def module_start(words: list[str]) -> tuple[int, str, int] | None:
    """(index of the python word, engine, index of its first argument) of a trainer started as a
    module (``python3 -m maxtext.trainers.pre_train.train``) or an entry script
    (``python3 MaxText/train.py``) in ``words``, or None."""
    for k, w in enumerate(words):
        if not _PYTHON.fullmatch(posixpath.basename(w)) or k + 1 >= len(words):
            continue
        nxt = words[k + 1]
        if nxt == "-m" and k + 2 < len(words) and words[k + 2] in TRAINER_MODULES:
            return k, TRAINER_MODULES[words[k + 2]], k + 3
        script = next((s for s in TRAINER_SCRIPTS if nxt == s or nxt.endswith("/" + s)), None)
        if script is not None:
            return k, TRAINER_SCRIPTS[script], k + 2
    return None


def entry_point_engines(program: str | None) -> list[Any]:
    """The engines whose training entry points (``LaunchSyntax.entry_points``) name ``program``
    (as written: its base name is matched)."""
    name = posixpath.basename(program or "")
    return [e for e in ENGINES.values() if any(fnmatch.fnmatchcase(name, p) for p in e.launch.entry_points)]


def training_engine(parsed: LauncherParse) -> EngineGuess:
    """Megatron, slime or None for a training launcher (see the module docstring)."""
    file, line = parsed.trainer or ("", 0)
    program = posixpath.basename(parsed.program or "")
    entries = entry_point_engines(program)
    for e in entries:
        if e.launch.entry_needs_array is None:
            return EngineGuess(e.name, f"{program} is a {e.label} entry point", file, line)
    owned = only_flags()
    flags = sorted(o.flag for o in parsed.final if o.flag in owned)
    if flags:
        name = owned[flags[0]]
        return EngineGuess(name, f"{flags[0]} is a {ENGINES[name].label}-only flag (on the trainer line at "
                           f"{where(file, line)})", file, line)
    for e in entries:
        if e.launch.entry_needs_array in parsed.arrays:
            return EngineGuess(e.name, f"{program} with {e.launch.entry_needs_array} is how {e.label}'s launchers "
                               "start training", file, line)
    return EngineGuess(None, "the trainer line names no engine (no known entry point, no engine-only flag)",
                       file, line)
