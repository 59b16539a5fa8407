"""Which engine a launcher is written for, read from the command that matters (issue 16 item 4).

* serving: ``vllm serve`` (vllm-project/vllm ``vllm/entrypoints/cli/serve.py`` at 78265ccd),
  ``python -m vllm.entrypoints.openai.api_server``, ``python -m sglang.launch_server`` and
  ``sglang serve`` (sgl-project/sglang ``python/sglang/cli/serve.py`` at c6f80cf9): see
  :func:`serve_start`;
* Megatron-LM: an entry point ``pretrain_*.py`` (``pretrain_gpt.py``, ``pretrain_mamba.py`` ... at
  the root of NVIDIA/Megatron-LM, e.g. 964bd0b2);
* slime: a slime-only flag on the trainer line (:func:`app.core.launcher.vocabulary.slime_flags`:
  ``--actor-num-nodes``, ``--max-tokens-per-gpu`` ...), or its entry points ``train.py`` /
  ``train_async.py`` (THUDM/slime at 624b824a) with the ``PERF_ARGS`` array its scripts use.

Anything else is None: the plan keeps the engine it had.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from app.core.launcher.results import LauncherParse
from app.core.launcher.text import where
from app.core.launcher.vocabulary import slime_flags

SERVE_MODULES = {"vllm.entrypoints.openai.api_server": "vllm", "sglang.launch_server": "sglang"}
_PYTHON = re.compile(r"python[0-9.]*")
_MEGATRON_ENTRY = re.compile(r"pretrain_[A-Za-z0-9_]+\.py")
SLIME_ENTRIES = ("train.py", "train_async.py")


@dataclass(frozen=True)
class EngineGuess:
    """The engine a launcher is written for and why (None: the script does not say)."""

    engine: str | None
    reason: str
    file: str = ""
    line: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.engine, "reason": self.reason, "file": self.file, "line": self.line}


def serve_start(words: list[str]) -> tuple[int, str, int] | None:
    """(index of the program word, engine, index of its first argument) of a serve command in
    ``words``, or None."""
    for k, w in enumerate(words):
        base = posixpath.basename(w)
        nxt = words[k + 1] if k + 1 < len(words) else ""
        if base in ("vllm", "sglang") and nxt == "serve":
            return k, base, k + 2
        if _PYTHON.fullmatch(base) and nxt == "-m" and k + 2 < len(words) and words[k + 2] in SERVE_MODULES:
            return k, SERVE_MODULES[words[k + 2]], k + 3
    return None


def training_engine(parsed: LauncherParse) -> EngineGuess:
    """Megatron, slime or None for a training launcher (see the module docstring)."""
    file, line = parsed.trainer or ("", 0)
    program = posixpath.basename(parsed.program or "")
    if _MEGATRON_ENTRY.fullmatch(program):
        return EngineGuess("megatron", f"{program} is a Megatron-LM entry point", file, line)
    slime = sorted(o.flag for o in parsed.final if o.flag in slime_flags())
    if slime:
        return EngineGuess("slime", f"{slime[0]} is a slime-only flag (on the trainer line at "
                           f"{where(file, line)})", file, line)
    if program in SLIME_ENTRIES and "PERF_ARGS" in parsed.arrays:
        return EngineGuess("slime", f"{program} with PERF_ARGS is how slime's launchers start training", file, line)
    return EngineGuess(None, "the trainer line names no engine (no pretrain_*.py, no slime-only flag)", file, line)
