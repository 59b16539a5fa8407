"""Launcher import: a bash launcher -> a :class:`~app.core.plan.Plan` that loses nothing, and a
report for the CLI and the page.

One reader (:mod:`app.core.launcher.reader`) reads the script; the command that matters decides the
consumer: a ``vllm serve`` / ``sglang`` launch (:mod:`app.core.launcher.serving`), a MaxText
training command (:mod:`app.core.launcher.maxtext`: its ``key=value`` pipeline keys, config file and
``M_`` variables) or a training launcher (:mod:`app.core.launcher.training`), whose final command
line maps onto the plan table's Megatron/slime flag names (:func:`app.core.plan.plan_from_flags`). The engine the script is
written for (:mod:`app.core.launcher.engine`) becomes the plan's engine unless the caller keeps its
own (``keep_engine``: the user gave one explicitly).

The report (:attr:`LauncherImport.report`, the CLI's ``launcher`` JSON key) holds:

* ``engine``: ``{name, reason, file, line}`` - what the script is written for (name None: unknown);
* ``values``: ``{flag: {value, file, line}}`` - every value and switch read, where it was set;
* ``files``, ``trainer`` (``{file, line}``), ``switches``, ``unresolved`` (``[{flag, file, line,
  raw, reason}]``);
* ``warnings``: every warning of the import (duplicate flags, unresolved ``--hf-checkpoint`` /
  ``--load``, no MTP layer built, options Megatron would refuse, settings the step time does not
  follow (:func:`untimed_warnings`), ...);
* ``serve`` (serving launches): engine, model, TP, PP, partition and each one's provenance.

Fails closed: a script that cannot be read, or whose pipeline flags cannot be resolved, raises
:class:`LauncherImportError` naming each flag and line (exit 2 / a 422), never a verdict.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.engines import ENGINES, engine_for, flag_vocabulary
from app.core.engines.base import Engine, engine_options
from app.core.launcher.engine import SERVING_WORDS, EngineGuess, entry_point_engines, training_engine
from app.core.launcher.kubernetes import read_spec
from app.core.launcher.maxtext import MaxTextLaunch, parse_maxtext_launch
from app.core.launcher.reader import (
    candidate_config,
    fail_closed,
    launch_commands,
    parse_launcher,
    read_launcher,
    read_launcher_files,
)
from app.core.launcher.results import Arg, LauncherParse
from app.core.launcher.serving import ServeLaunch, ServeLauncherError, is_serving_launch, parse_serve_launcher
from app.core.launcher.source import disk_loader, files_loader
from app.core.launcher.state import Loader
from app.core.launcher.text import TOO_COMPLEX, LauncherError, decode, where
from app.core.launcher.training import launcher_gpus, launcher_request
from app.core.launcher.vocabulary import READER_ONLY_FLAGS, untimed_flags
from app.core.model.config import ModelConfig
from app.core.plan import TABLE, Plan, plan_from_flags
from app.core.time.precision import PRECISION_FLAGS


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
    #: work units the reading charged (:func:`app.core.launcher.cost.import_work_estimate` bounds it)
    work: int = 0


def _read(text: str | bytes, path: str | None, files: Mapping[str, str | bytes] | None,
          main: str) -> tuple[LauncherParse, str, str]:
    """One lenient read (the file from disk, the pasted files, or the text): (parse, text, name)."""
    if path is not None:
        name = os.path.abspath(path)
        return read_launcher(path, strict=False), decode(text, name), name
    if files:
        return read_launcher_files({main: text, **files}, main, strict=False), decode(text, main), main
    body = decode(text, "the launcher script")
    return parse_launcher(body), body, ""


def _loader(path: str | None, files: Mapping[str, str | bytes] | None, main: str) -> tuple[Loader | None, str]:
    """Where a launch's sourced files are read from (the disk beside ``path``, the pasted files, or
    nowhere: a pasted script) and the name its lines are reported under."""
    if path is not None:
        return disk_loader(), os.path.abspath(path)
    if files:
        return files_loader({posixpath.normpath(k.replace("\\", "/")): v for k, v in files.items()}), main
    return None, ""


#: words in a checkpoint's name that say how it stores its weights (``zai-org/GLM-5-FP8``)
QUANTIZED_NAME = re.compile(r"(?i)(?:^|[-_./])(fp8|fp4|nvfp4|mxfp4|mxfp8|awq|gptq|int4|int8|w4a16|w8a8)(?:$|[-_./])")


def _checkpoint_note(launch: ServeLaunch, cfg: ModelConfig | None) -> str | None:
    """A launch of a checkpoint whose name says it is quantized, judged on a config whose weights
    are BF16 (no ``quantization_config``) with no ``--quantization``: the memory verdict would be the
    BF16 checkpoint's - said, with the fix (the checkpoint's own config.json, or the weight dtype)."""
    found = QUANTIZED_NAME.search(launch.model)
    if found is None or cfg is None or cfg.weight_format is not None or launch.weight_dtype is not None:
        return None
    at = launch.provenance["model"]
    return (f"{launch.model} ({where(at.file, at.line)}): its name says {found.group(1).upper()} weights, but the "
            f"plan's config ({cfg.id}) stores BF16 weights (no quantization_config), so the memory verdict is the BF16 "
            f"checkpoint's - judge that checkpoint's config.json, or set {TABLE['weight_dtype'].cli}")


def import_serve_launcher(text: str | bytes, base: Plan, *, path: str | None = None,
                          files: Mapping[str, str | bytes] | None = None, main: str = "launcher.sh",
                          keep_engine: bool = False, parsed: LauncherParse | None = None,
                          cfg: ModelConfig | None = None) -> LauncherImport:
    """A ``vllm serve`` / ``sglang`` launch: engine, TP, PP and the ``*_PP_LAYER_PARTITION``
    partition (as ``split``) become the plan; ``cfg``: the config it is judged on (a quantized
    checkpoint's name beside BF16 weights is said)."""
    loader, name = _loader(path, files, main)
    try:
        launch = parse_serve_launcher(text, name=name, loader=loader, parsed=parsed)
    except ServeLauncherError as exc:
        raise LauncherImportError(str(exc)) from None
    note = _checkpoint_note(launch, cfg)
    if note is not None:
        launch = replace(launch, warnings=(*launch.warnings, note))
    engine = base.engine if keep_engine else launch.engine
    plan = replace(base, engine=engine, tp=launch.tp, pp=launch.pp, ep=launch.ep,
                   dp=launch.dp, parallel=True,
                   mode="split" if launch.partition is not None else "flags", split=launch.partition,
                   context=base.context if launch.context is None else launch.context,
                   kv_dtype=base.kv_dtype if launch.kv_dtype is None else launch.kv_dtype,
                   weight_dtype=base.weight_dtype if launch.weight_dtype is None else launch.weight_dtype,
                   gpu_memory_utilization=(base.gpu_memory_utilization if launch.memory_fraction is None
                                           else launch.memory_fraction),
                   allow_long_context=launch.allow_long_context, mtp_layers=1 if launch.mtp else None)
    switched: dict[str, Any] = dict(launch.switched)
    plan = replace(plan, **switched)
    at = launch.provenance["engine"]
    guess = EngineGuess(launch.engine, f"`{at.value}` serve command", at.file, at.line)
    values = {k: {"value": v.value, "file": v.file, "line": v.line} for k, v in launch.provenance.items()}
    report = {"engine": guess.to_json(), "values": values, "serve": launch.to_json(),
              "warnings": list(launch.warnings)}
    return LauncherImport(plan, report, tuple(launch.warnings), work=launch.work + (parsed.work if parsed else 0))


def import_launcher(text: str | bytes, cfg: ModelConfig, base: Plan, *, path: str | None = None,
                    files: Mapping[str, str | bytes] | None = None, main: str = "launcher.sh",
                    keep_engine: bool = False) -> LauncherImport:
    """The plan a launcher describes on top of ``base`` (model, engine and page settings): read
    from ``path`` with the files it sources beside it (the CLI), from pasted ``files`` (name ->
    text, ``main`` the launcher; the page), or from ``text`` alone (stdin, where a ``source``
    cannot be followed and fails closed)."""
    kwargs: dict[str, Any] = {"path": path, "files": files, "main": main, "keep_engine": keep_engine}
    try:
        body = decode(text, "the launcher script")
        spec = read_spec(body)
        if spec.words or (spec.env and any(w in body for w in SERVING_WORDS)):   # a Kubernetes-style spec
            loader, name = _loader(path, files, main)
            launch = parse_maxtext_launch(launch_commands(body, name, loader, None), _config_loader(path, files))
            if launch is not None:
                return _maxtext_import(launch, cfg, base, keep_engine, 0)
            return import_serve_launcher(text, base, cfg=cfg, **kwargs)
        parsed, body, name = _read(text, path, files, main)
        if is_serving_launch(parsed):
            return import_serve_launcher(text, base, parsed=parsed, cfg=cfg, **kwargs)
        if parsed.missing or parsed.fatal:
            fail_closed(parsed, body, name)
        launch = parse_maxtext_launch(launch_commands(body, name, None, parsed), _config_loader(path, files))
        if launch is not None:
            return _maxtext_import(launch, cfg, base, keep_engine, parsed.work)
        fail_closed(parsed, body, name)
        return _training_import(parsed, cfg, base, path, keep_engine)
    except LauncherError as exc:
        raise LauncherImportError(str(exc)) from None
    except MemoryError:   # never a 500: the limit, by name (issue 20 finding 6)
        raise LauncherImportError(f"{TOO_COMPLEX}: the reading needed more memory than the import allows") from None


def _config_loader(path: str | None, files: Mapping[str, str | bytes] | None) -> Any:
    """Where a MaxText launch's config file is read from: the pasted files, or the disk as MaxText
    would (from where it runs; the CLI also tries beside the launcher); none for a pasted script."""
    if files or path is None:
        return _loader(None, files, "")[0]
    disk, here = disk_loader(), os.path.dirname(os.path.abspath(path))
    return lambda p: disk(p) or (disk(os.path.join(here, p)) if not os.path.isabs(p) else None)


def _maxtext_import(launch: MaxTextLaunch, cfg: ModelConfig, base: Plan, keep_engine: bool,
                    work: int) -> LauncherImport:
    """A MaxText launch's keys as the plan (``-1`` of a derived key: unset, MaxText derives it)."""
    engine = ENGINES[launch.engine]
    warnings = list(launch.warnings)
    if keep_engine and base.engine != engine.name:
        warnings.append(f"the script launches MaxText (at {where(*launch.line)}); checked as {base.engine}, the "
                        "engine given")
    derived = {k: kv for k, kv in launch.values.items() if kv.value.strip() == "-1"
               and TABLE[engine.flags[k]].optional}
    values = {k: kv.value for k, kv in launch.values.items() if k not in derived}
    plan, problems = plan_from_flags(values, (), replace(base, engine=base.engine if keep_engine else engine.name),
                                     engine.flags)
    if problems:
        raise LauncherImportError("; ".join(f"{p.message} ({where(launch.values[k].file, launch.values[k].line)})"
                                            for p in problems for k in values if engine.flags[k] == p.field))
    unset: dict[str, Any] = {engine.flags[k]: None for k in derived}
    plan = replace(plan, **unset)
    if launch.model_name and launch.model_name != "default":
        warnings.append(f"model_name={launch.model_name}: MaxText builds its own model file for it; the plan judges "
                        f"{cfg.id}'s config, so check that they are the same model")
    guess = EngineGuess(engine.name, f"a MaxText training command (config {launch.config})", *launch.line)
    report = {"engine": guess.to_json(), "values": {k: kv.to_dict() for k, kv in launch.values.items()},
              "config": launch.config, "warnings": warnings,
              "trainer": {"file": launch.line[0], "line": launch.line[1], "at": where(*launch.line)}}
    return LauncherImport(plan, report, tuple(warnings), work=work)


def untimed_warnings(parsed: LauncherParse, untimed: tuple[tuple[str, bool, str], ...]) -> list[str]:
    """A warning for every flag of the script that changes how fast a step runs but that no plan
    field carries (the engine's ``untimed_flags``): the step time keeps its assumption, and says so."""
    out = []
    for flag, takes, assumed in untimed:
        if flag in (parsed.values if takes else parsed.switches):
            given = f"{flag} {parsed.values[flag]}" if takes else flag
            out.append(f"{given} ({parsed.at(flag)}) is not a plan setting: the step time does not follow it "
                       f"and assumes {assumed}")
    return out


def trainer_values(parsed: LauncherParse) -> dict[str, tuple[str, Arg]]:
    """Every ``--flag value`` / ``--flag=value`` of the trainer's own line (after its ``.py``:
    torchrun's own flags come before it), in the order each first appears, with the last value
    (argparse) and the argument that gave it; a switch maps to ``""``."""
    argv = parsed.trainer_argv
    args = argv[next((k + 1 for k, a in enumerate(argv) if a.text.strip("\"'").endswith(".py")), len(argv)):]
    out: dict[str, tuple[str, Arg]] = {}
    for k, a in enumerate(args):
        flag, eq, value = a.text.partition("=")
        if a.reason is not None or not flag.startswith("--"):
            continue
        if not eq and k + 1 < len(args) and not args[k + 1].text.startswith("--") and args[k + 1].reason is None:
            value = args[k + 1].text
        out[flag] = (value, a)
    return out


def option_warnings(given: dict[str, tuple[str, Arg]], engine: Engine) -> list[str]:
    """Warnings for the trainer's own flags (``given``: :func:`trainer_values`) that the engine's
    parser does not have (``launch.options_file``: Megatron's parser stops on them with
    "unrecognized arguments", unless the entry point adds them) or that change memory without a plan
    field (``launch.unread_flags``, named with their value). Flags the reader reads are left to their
    own warnings."""
    launch = engine.launch
    known = engine_options(launch.options_file) if launch.options_file else None
    handled = set(flag_vocabulary()) | set(READER_ONLY_FLAGS) | set(untimed_flags()) | PRECISION_FLAGS
    unread = {flag: (takes, assumed) for flag, takes, assumed in launch.unread_flags}
    out: list[str] = []
    for flag, (value, a) in given.items():
        if flag in handled:
            continue
        if flag in unread:
            takes, assumed = unread[flag]
            shown = f"{flag} {value}" if takes and value else flag
            out.append(f"{shown} ({where(a.file, a.line)}) is not a plan setting: the memory verdict does not "
                       f"follow it and assumes {assumed}")
        elif known is not None and flag not in known:
            out.append(f"{flag} ({where(a.file, a.line)}) is not a {engine.label} option ({engine.source}): its "
                       "parser stops on it ('unrecognized arguments') unless the entry point adds it")
    return out


def training_runs(parsed: LauncherParse, vocabulary: Mapping[str, str]
                  ) -> list[tuple[str, int, str | None, frozenset[tuple[str, str | None]]]]:
    """The script's trainer invocations that launch training: a known entry point, or a line
    setting a flag of ``vocabulary`` (the plan's; a helper such as ``python tools/convert.py
    --input x`` is none)."""
    return [run for run in parsed.runs
            if entry_point_engines(run[2]) or any(flag in vocabulary for flag, _ in run[3])]


def _known_entry_points() -> str:
    """The training entry points isplan knows, by engine (one label per set: hf builds Megatron's)."""
    entries: dict[tuple[str, ...], str] = {}
    for e in ENGINES.values():
        if e.workflow == "training" and e.launch.entry_points:
            entries.setdefault(e.launch.entry_points, e.label)
    return ", ".join(f"{label}'s {' / '.join(points)}" for points, label in entries.items())


def _trainer(parsed: LauncherParse) -> str:
    """The script's Python command and where it is, as the messages below name it."""
    at = where(*parsed.trainer) if parsed.trainer else "the script"
    return f"{parsed.program or 'its Python command'} ({at})"


def _not_a_training_run(parsed: LauncherParse) -> str:
    """Why a script whose Python command is neither a known training entry point nor sets a plan flag
    is refused: ``python tools/preprocess_data.py ...``, a checkpoint converter, an evaluation - a
    verdict on it would be the default plan's, not the job's."""
    return (f"{_trainer(parsed)} is not a training entry point isplan knows ({_known_entry_points()}) and sets none "
            "of the plan's flags (--tensor-model-parallel-size, --pipeline-model-parallel-size, --num-layers ...): "
            "nothing in the script says what would be trained; give the training run's launcher")


def _unknown_entry_point(parsed: LauncherParse, engine: str) -> str:
    """Said when a script's Python command sets plan flags but is no entry point isplan knows (a
    project's own ``train.py``, Megatron-Bridge's MIMO examples, whose parallelism comes from
    environment variables): its flags are read as ``engine``'s entry point reads them, and whatever
    else it reads is not seen."""
    return (f"{_trainer(parsed)} is not a training entry point isplan knows ({_known_entry_points()}): its flags are "
            f"read as {ENGINES[engine].label}'s entry point reads them, and what it sets otherwise (environment "
            "variables, its own configuration) is not seen - check the plan's parallel sizes against what it runs")


def _training_import(parsed: LauncherParse, cfg: ModelConfig, base: Plan, path: str | None,
                     keep_engine: bool) -> LauncherImport:
    req = launcher_request(parsed, cfg)
    if req.unresolved:
        raise LauncherImportError("the launcher's pipeline flags cannot be read: " + "; ".join(req.unresolved))
    guess = training_engine(parsed)
    engine = base.engine if keep_engine or guess.engine is None else guess.engine
    warnings = list(req.warnings)
    if keep_engine and guess.engine is not None and guess.engine != base.engine:
        warnings.append(f"the script is written for {guess.engine} ({guess.reason}); checked as {base.engine}, "
                        "the engine given")
    # a launcher is a real job: its parallelism, GPU count and memory join the verdict
    chosen = engine_for(engine)
    given = trainer_values(parsed)
    vocabulary = flag_vocabulary()
    if guess.engine is None and not any(f in vocabulary for f in (*parsed.values, *parsed.switches)):
        raise LauncherImportError(_not_a_training_run(parsed))
    if guess.engine is None and parsed.program is not None and not entry_point_engines(parsed.program):
        warnings.append(_unknown_entry_point(parsed, engine))
    runs = training_runs(parsed, vocabulary)
    if len({(posixpath.basename(p or ""), flags) for _, _, p, flags in runs}) > 1:   # the same launch twice is one
        lines = ", ".join(f"{where(f, n)} ({p or 'a Python command'})" for f, n, p, _ in runs)
        raise LauncherImportError(f"{len(runs)} training commands ({lines}): each is a run of its own (or a branch "
                                  "only one of which runs), and their flags would mix; give one launch at a time")
    for flag, needs, reason in chosen.launch.replacing_flags:   # the trainer line's own flags (known or not)
        if flag in given and all(n in given for n in needs):
            at = given[flag][1]
            raise LauncherImportError(f"{flag} ({where(at.file, at.line)}): {reason}")
    warnings += untimed_warnings(parsed, chosen.launch.untimed_flags) + option_warnings(given, chosen)
    plan, problems = plan_from_flags(parsed.values, parsed.switches,
                                     replace(base, engine=engine, mode="flags", parallel=True),
                                     chosen.flags, settings=chosen.flag_settings, absent=chosen.absent_defaults)
    if problems:
        raise LauncherImportError("; ".join(p.message for p in problems))
    plan, pipeline_errors = chosen.launch_pipeline(parsed.values, parsed.at, plan, cfg)
    precision, why = chosen.launch_precision({flag: value for flag, (value, _) in given.items()})
    if precision is not None:
        plan = replace(plan, precision=precision)
    elif why is not None:
        at = next(a for f, (_, a) in given.items() if f in ("--fp4-format", "--fp8-format"))
        warnings.append(f"{why} ({where(at.file, at.line)})")
    gpus = launcher_gpus(parsed)
    if gpus is not None and plan.gpus is None and plan.dp is None:
        plan = replace(plan, gpus=gpus)
    # a model flag with a plan field is compared with the config by the verdict (its URL key keeps
    # it); the launcher report keeps each value's file and line
    errors = tuple(e for e in req.errors if not (e.kind == "model" and e.flag in flag_vocabulary())) + tuple(
        pipeline_errors)
    candidate = candidate_config(parsed, os.path.dirname(os.path.abspath(path))) if path is not None else None
    report = {**req.report, "engine": guess.to_json(), "warnings": warnings,
              "trainer": {"file": parsed.trainer[0], "line": parsed.trainer[1],
                          "at": where(*parsed.trainer)} if parsed.trainer else None}
    return LauncherImport(plan, report, tuple(warnings), errors, candidate, parsed.work)
