"""Launcher import: a bash launcher script -> a :class:`~app.core.plan.Plan` that loses nothing.

:mod:`app.core.launcher` reads the script statically (never runs it); this module maps the final
command line onto the plan table's Megatron/slime flag names (:func:`app.core.plan.plan_from_flags`),
so every value a launcher sets has a plan field, a URL key and a CLI flag. The GPU count of a slime
launcher is ``--actor-num-nodes`` x ``--actor-num-gpus-per-node`` (torchrun: ``--nnodes`` x
``--nproc-per-node``).

Fails closed: a script that cannot be read, or whose pipeline flags cannot be resolved, raises
:class:`LauncherImportError` naming each flag and line (exit 2 / a 422), never a verdict.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.engines import flag_vocabulary
from app.core.launcher import (
    LauncherError,
    LauncherParse,
    candidate_config,
    launcher_request,
    parse_launcher,
    read_launcher,
    read_launcher_files,
)
from app.core.model.config import ModelConfig
from app.core.plan import Plan, plan_from_flags

FLAG_FIELDS = flag_vocabulary()

_NODES = ("--actor-num-nodes", "--nnodes")
_PER_NODE = ("--actor-num-gpus-per-node", "--nproc-per-node", "--num-gpus-per-node")


class LauncherImportError(ValueError):
    """The launcher cannot be read completely; the message names what is missing."""

    field = "launcher"


@dataclass
class LauncherImport:
    plan: Plan
    report: dict[str, Any]
    warnings: tuple[str, ...] = ()
    errors: tuple[Any, ...] = field(default_factory=tuple)
    #: a config.json at the launcher's --hf-checkpoint / --load path (read from disk only: the CLI)
    candidate_config: str | None = None


def _gpus(parsed: LauncherParse) -> int | None:
    def first(flags: tuple[str, ...]) -> int | None:
        for flag in flags:
            try:
                value = parsed.int_value(flag)
            except ValueError:
                return None
            if value is not None:
                return value
        return None

    nodes, per = first(_NODES), first(_PER_NODE)
    return nodes * per if nodes and per else None


_SERVE = re.compile(r"\b(vllm|sglang)\s+serve\b|sglang\.launch_server|vllm\.entrypoints\.openai\.api_server")


def import_serve_launcher(text: str | bytes, base: Plan) -> LauncherImport:
    """A ``vllm serve`` / ``sglang.launch_server`` launch (shell or a Kubernetes-style ``env:`` list):
    engine, TP, PP and the ``*_PP_LAYER_PARTITION`` partition (as ``split``) become the plan."""
    from app.core.serve_launcher import ServeLauncherError, parse_serve_launcher

    try:
        launch = parse_serve_launcher(text)
    except ServeLauncherError as exc:
        raise LauncherImportError(str(exc)) from None
    plan = replace(base, engine=launch.engine, tp=launch.tp, pp=launch.pp, parallel=True,
                   mode="split" if launch.partition is not None else "flags", split=launch.partition)
    return LauncherImport(plan, {"serve": launch.to_json()}, tuple(launch.warnings))


def import_launcher(text: str | bytes, cfg: ModelConfig, base: Plan, *, path: str | None = None,
                    files: Mapping[str, str | bytes] | None = None, main: str = "launcher.sh") -> LauncherImport:
    """The plan a launcher describes on top of ``base`` (model, engine and page settings): a
    Megatron/slime training launcher, or a vLLM/SGLang serve launch.

    The training launcher is read strictly (:mod:`app.core.launcher`): from ``path`` with the files it
    sources beside it (the CLI), from pasted ``files`` (name -> text, ``main`` the launcher; the
    page), or from ``text`` alone (stdin, where a ``source`` cannot be followed and fails closed)."""
    probe = text if isinstance(text, str) else bytes(text[: 1 << 20]).decode("utf-8", "replace")
    if _SERVE.search(probe):
        return import_serve_launcher(text, base)
    try:
        if path is not None:
            parsed = read_launcher(path)
        elif files:
            parsed = read_launcher_files({main: text, **files}, main)
        else:
            parsed = parse_launcher(text, strict=True)
    except LauncherError as exc:
        raise LauncherImportError(str(exc)) from None
    req = launcher_request(parsed, cfg)
    if req.unresolved:
        raise LauncherImportError("the launcher's pipeline flags cannot be read: " + "; ".join(req.unresolved))
    # a launcher is a real job: its parallelism, GPU count and memory join the verdict
    plan, problems = plan_from_flags(parsed.values, parsed.switches, replace(base, mode="flags", parallel=True),
                                     FLAG_FIELDS)
    if problems:
        raise LauncherImportError("; ".join(p.message for p in problems))
    gpus = _gpus(parsed)
    if gpus is not None and plan.gpus is None and plan.dp is None:
        plan = replace(plan, gpus=gpus)
    # a model flag with a plan field is compared with the config by the verdict (its URL key keeps
    # it); the launcher report keeps each value's file and line
    errors = tuple(e for e in req.errors if not (e.kind == "model" and e.flag in FLAG_FIELDS))
    candidate = candidate_config(parsed, os.path.dirname(os.path.abspath(path))) if path is not None else None
    return LauncherImport(plan, req.report, req.warnings, errors, candidate)
