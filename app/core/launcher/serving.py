"""The serving consumer: a ``vllm serve`` / ``python -m sglang.launch_server`` launch -> engine,
model, TP, PP and the layer partition (``VLLM_PP_LAYER_PARTITION`` / ``SGLANG_PP_LAYER_PARTITION``),
each with the file and line it came from.

Input is a shell script (read by the one bash reader, :mod:`app.core.launcher.commands`: variables,
arrays, ``source``, ``$((...))``; ``NAME=value cmd`` and ``env NAME=value cmd`` set a variable for
that command only, ``docker run -e NAME=value`` too), a Kubernetes-style spec (:mod:`app.core.launcher.kubernetes`),
or both. The engine sees a variable only when it is exported, assigned for its command, or in the
spec's ``env:`` list.

Flags read: vLLM ``--tensor-parallel-size`` / ``-tp``, ``--pipeline-parallel-size`` / ``-pp``,
the model as ``vllm serve MODEL`` or ``--model``; SGLang ``--tp-size`` / ``--tp`` /
``--tensor-parallel-size``, ``--pp-size`` / ``--pp`` / ``--pipeline-parallel-size``,
``--model-path`` / ``--model``; the context (vLLM ``--max-model-len``, ``128k`` = 128,000 in every vLLM
build; SGLang ``--context-length``)
and ``--kv-cache-dtype`` (the engine's values mapped to bf16 / fp8; ``auto`` keeps the plan's
with a warning); ``--flag value`` and ``--flag=value``; the last occurrence wins (argparse). The
``--quantization fp8`` is the plan's ``weight_dtype`` (another method is a warning); SGLang's
``--ep-size`` / ``--expert-parallel-size`` and vLLM's ``--enable-expert-parallel`` (EP = TP x DP)
its ``ep``, vLLM's ``--data-parallel-size`` and SGLang's ``--dp-size`` its ``dp`` (SGLang's
``--enable-dp-attention``: ``enable_dp_attention``); speculative decoding that drafts with the
checkpoint's MTP layers (vLLM ``--speculative-config`` with an MTP method, SGLang
``--speculative-algorithm EAGLE`` / ``NEXTN`` without a draft model) its ``mtp_layers``, another
draft a warning; vLLM's
``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static`` its ``gpu_memory_utilization``. The
engine's override of the model's maximum context (``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` /
``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``, read as the engine reads its value) is the plan's
``allow_long_context``.
Missing TP / PP mean the engines' default 1. A flag that changes what a rank holds but that no
plan field carries (the engine's ``LaunchSyntax.unread_flags``: memory utilisation, quantization,
expert or data parallelism ...) is a warning naming it and what the verdict assumes instead.

A container run of an engine's image whose entrypoint is its serve program (``docker run ...
vllm/vllm-openai:TAG MODEL --flags``: ``LaunchSyntax.images``) is that serve command. vLLM's command
line is read as its ``FlexibleArgumentParser`` reads it (:func:`flexible_args`: ``--tensor_parallel_size``,
``--speculative-config.method mtp``); ``-q`` is its ``--quantization``.

Fails closed (:class:`ServeLauncherError`, naming the field and line): no serve command, more
than one, an unknown or non-integer TP/PP/model/partition value, anything the reader cannot read
completely (an unterminated quote, a sourced file it cannot read), two different partition values,
an options file it cannot read (``--config FILE`` is read as each engine merges it, pasted or beside
the launcher: :func:`_with_config`), and ``vllm serve`` again after the vLLM image
(``vllm serve vllm serve ...``, which vLLM refuses).
"""

from __future__ import annotations

import itertools
import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from app.core.engines import ENGINES
from app.core.engines.serving import engine_module
from app.core.launcher.engine import SERVE_IMAGES, image_name, serve_start
from app.core.launcher.reader import launch_commands
from app.core.launcher.results import Arg, Command, EnvValue, LauncherParse
from app.core.launcher.state import Loader
from app.core.launcher.text import LauncherError, decode, where

#: each serving engine's partition variable (``Engine.launch.partition_env``) -> the engine
ENV_VARS = {e.launch.partition_env: e.name for e in ENGINES.values() if e.launch.partition_env}
ENV_VARS_BY_ENGINE = {v: k for k, v in ENV_VARS.items()}


#: the plan fields a serve command's flags set (the engine's flag vocabulary names them)
SERVE_FIELDS = ("tp", "pp", "dp", "ep", "context", "kv_dtype", "weight_dtype", "gpu_memory_utilization")


def _flags(engine: str) -> dict[str, tuple[str, ...]]:
    """The engine's own spellings of TP, PP, the context and the KV cache dtype (its flag
    vocabulary) and of the model (its launch syntax)."""
    e = ENGINES[engine]
    out = {key: tuple(f for f, n in e.flags.items() if n == key and f.startswith("-")) for key in SERVE_FIELDS}
    return {**out, "model": e.launch.model_flags}
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_UNRESOLVED = "(a variable not assigned in the text, or a command substitution)"


class ServeLauncherError(ValueError):
    """The launch cannot be read completely; the message names what is missing and where."""


@dataclass(frozen=True)
class Provenance:
    value: str
    line: int  # 1-based line
    how: str  # command | assignment | export | prefix | docker_env | k8s_env
    file: str = ""
    reason: str | None = None   # why the value cannot be known

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "line": self.line, "how": self.how, "file": self.file}


@dataclass(frozen=True)
class ServeLaunch:
    engine: str
    model: str
    tp: int
    pp: int
    partition: tuple[int, ...] | None
    provenance: dict[str, Provenance]
    warnings: tuple[str, ...] = field(default=())
    work: int = 0   # work units the reading charged (see app.core.launcher.cost)
    context: int | None = None   # the engine's context flag, when given
    kv_dtype: str | None = None   # bf16 / fp8 from --kv-cache-dtype, when given (not auto)
    weight_dtype: str | None = None   # fp8 from --quantization fp8 (online FP8 weights)
    memory_fraction: float | None = None   # --gpu-memory-utilization / --mem-fraction-static, when given
    ep: int = 1   # SGLang --ep-size; vLLM --enable-expert-parallel: TP x DP
    dp: int | None = None   # vLLM --data-parallel-size, when given
    allow_long_context: bool = False   # the engine's long-context override variable is on
    #: the boolean plan field of each of the engine's switches: whether the command gives it (SGLang enable_dp_attention)
    switched: dict[str, bool] = field(default_factory=dict)
    mtp: bool = False   # speculative decoding drafts with the checkpoint's MTP layers

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "model": self.model, "tp": self.tp, "pp": self.pp,
            "context": self.context, "kv_dtype": self.kv_dtype, "weight_dtype": self.weight_dtype,
            "gpu_memory_utilization": self.memory_fraction, "ep": self.ep, "dp": self.dp,
            **self.switched, "mtp": self.mtp,
            "allow_long_context": self.allow_long_context,
            "partition": list(self.partition) if self.partition is not None else None,
            "provenance": {k: v.to_dict() for k, v in self.provenance.items()},
            "warnings": list(self.warnings),
        }


def _env(v: EnvValue, how: str | None = None) -> Provenance:
    return Provenance(v.value, v.line, how or v.how, v.file, v.reason)


def _commands(text: str, name: str, loader: Loader | None,
              parsed: LauncherParse | None) -> tuple[tuple[Command, ...], dict[str, Provenance], dict[str, Provenance], int]:
    """The launch's commands (:func:`launch_commands`), the spec's env and the shell's variables as provenance."""
    read = launch_commands(text, name, loader, parsed)
    return (read.commands, {k: _env(v) for k, v in read.k8s.items()}, {k: _env(v) for k, v in read.shell.items()},
            read.work)


def _command_env(cmd: Command, start: int) -> dict[str, Provenance]:
    """Variables set for this command alone: prefix ``VAR=x``, ``env VAR=x``, ``docker run -e VAR=x``."""
    env = {k: _env(v) for k, v in cmd.env.items()}
    args = cmd.argv[:start]
    k = 1 if args and posixpath.basename(args[0].text) == "env" else len(args)
    while k < len(args) and (m := _ASSIGN.fullmatch(args[k].text)):
        env[m.group(1)] = Provenance(m.group(2), args[k].line, "prefix", args[k].file, args[k].reason)
        k += 1
    for a, b in itertools.pairwise(args):
        if a.text in ("-e", "--env") and (m := _ASSIGN.fullmatch(b.text)):
            env[m.group(1)] = Provenance(m.group(2), b.line, "docker_env", b.file, b.reason)
    return env


def _flag(args: tuple[Arg, ...], names: tuple[str, ...]) -> tuple[str, Arg | None, Arg] | None:
    """The last ``--flag value`` / ``--flag=value`` of ``names``: (flag, value argument or None, flag argument)."""
    found: tuple[str, Arg | None, Arg] | None = None
    for k, a in enumerate(args):
        flag, eq, value = a.text.partition("=")
        if flag not in names:
            continue
        if eq:
            found = (flag, Arg(value, a.reason, a.raw.partition("=")[2] or a.raw, a.file, a.line), a)
        elif k + 1 < len(args) and not args[k + 1].text.startswith("-"):
            found = (flag, args[k + 1], a)
        else:
            found = (flag, None, a)
    return found


def _at_image(cmd: Command, first: int) -> bool:
    """Whether the serve arguments start right after an engine's container image (:data:`SERVE_IMAGES`)."""
    return image_name(cmd.argv[first - 1].text) in SERVE_IMAGES


def _read(cmd: Command, engine: str, first: int) -> dict[str, Provenance]:
    args = cmd.argv[first:]
    got: dict[str, Provenance] = {"engine": Provenance(engine, cmd.argv[first - 1].line, "command", cmd.file)}
    if ENGINES[engine].launch.positional_model and (cmd.argv[first - 1].text == "serve" or _at_image(cmd, first)) \
            and args and not args[0].text.startswith("-"):
        got["model"] = Provenance(args[0].text, args[0].line, "command", args[0].file, args[0].reason)
    for key, names in _flags(engine).items():
        found = _flag(args, names)
        if found is None or (key == "model" and "model" in got):
            continue
        flag, value, at = found
        if value is None:
            raise ServeLauncherError(f"{where(at.file, at.line)}: {flag} has no value")
        if value.reason is not None:
            raise ServeLauncherError(f"{where(value.file, value.line)}: {flag} {value.raw} cannot be resolved "
                                     f"{_UNRESOLVED}")
        got[key] = Provenance(value.text, value.line, "command", value.file)
    return got


def _variable(var: str, engine: str, unset: str, env: dict[str, Provenance], k8s: dict[str, Provenance],
              shell: dict[str, Provenance], warnings: list[str]) -> Provenance | None:
    """The value of the engine's variable ``var`` as the server process sees it: the spec's env, a
    value set for the command, or an exported one (an assignment alone is not seen: said, with
    what the engine does then, ``unset``). Refused when it cannot be resolved or has two values."""
    mine = env.get(var) or shell.get(var)
    if mine is not None and mine.how == "assignment":
        warnings.append(f"{var} is assigned on {where(mine.file, mine.line)} but never exported, so {engine} does "
                        f"not see it and uses {unset} (write `export {var}=...`)")
        mine = None
    seen = [p for p in (k8s.get(var), mine) if p is not None]
    for p in seen:
        if p.reason is not None:
            raise ServeLauncherError(f"{where(p.file, p.line)}: {var} cannot be resolved (unknown variable, command "
                                     "substitution or valueFrom)")
    if len({p.value.strip() for p in seen}) > 1:
        lines = ", ".join(f"{p.value!r} ({where(p.file, p.line)})" for p in seen)
        raise ServeLauncherError(f"{var} has two different values: {lines}; keep one")
    return seen[-1] if seen else None


def _partition(engine: str, env: dict[str, Provenance], k8s: dict[str, Provenance],
               shell: dict[str, Provenance], warnings: list[str]) -> Provenance | None:
    var = ENV_VARS_BY_ENGINE[engine]
    found = _variable(var, engine, "its default partition", env, k8s, shell, warnings)
    for other in (v for v in ENV_VARS if v != var):
        if k8s.get(other) or env.get(other) or shell.get(other):
            warnings.append(f"{other} is set but {engine} reads {var}; it is ignored")
    return found


def _long_context(engine: str, env: dict[str, Provenance], k8s: dict[str, Provenance],
                  shell: dict[str, Provenance], warnings: list[str]) -> Provenance | None:
    """The engine's override of the model's maximum context (``ServingEngine.long_context_env``)
    when the launch switches it on; a value the engine reads as neither on nor off is said (the
    engine keeps its default, off)."""
    e = engine_module(engine)
    var = e.long_context_env
    found = _variable(var, engine, "its default (off)", env, k8s, shell, warnings)
    if found is None:
        return None
    on = e.long_context_set(found.value)
    if on is None:
        warnings.append(f"{var}={found.value!r} ({where(found.file, found.line)}) is neither on nor off for "
                        f"{engine}, which keeps its default (off)")
    return found if on else None


def _as_int(p: Provenance, name: str, digits: int = 6) -> int:
    if not re.fullmatch(rf"\s*[0-9]{{1,{digits}}}\s*", p.value) or int(p.value) < 1:
        raise ServeLauncherError(f"{where(p.file, p.line)}: {name} is {p.value!r}; it must be a whole number >= 1")
    return int(p.value)


def _context(p: Provenance, engine: str) -> int:
    """The context flag's value: a whole number, or one with a suffix every build of the engine reads
    alike (:attr:`ServingEngine.context_suffixes`: vLLM's ``128k`` is 128,000)."""
    name = f"the context length ({' / '.join(_flags(engine)['context'])})"
    suffixes = engine_module(engine).context_suffixes
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)([A-Za-z]+)\s*", p.value) if suffixes else None
    if m is None:
        return _as_int(p, name, digits=8)
    number, suffix = m.groups()
    if suffix not in suffixes:
        raise ServeLauncherError(f"{where(p.file, p.line)}: {name} is {p.value!r}: the suffix {suffix!r} means "
                                 f"different numbers in different {ENGINES[engine].label} builds; write the number "
                                 f"or use {' / '.join(suffixes)}")
    value = int(float(number) * suffixes[suffix])
    if not 1 <= value < 10**8:
        raise ServeLauncherError(f"{where(p.file, p.line)}: {name} is {p.value!r}; it must be a whole number >= 1")
    return value


def _kv_dtype(p: Provenance, engine: str, warnings: list[str]) -> str | None:
    """The plan's ``kv_dtype`` for the engine's ``--kv-cache-dtype`` value; ``auto`` is none (the
    plan keeps its own, said); a value the memory model does not cover is refused."""
    known = engine_module(engine).kv_cache_dtypes
    value = p.value.strip()
    if value == "auto":
        auto = engine_module(engine).kv_auto
        warnings.append(f"--kv-cache-dtype auto ({where(p.file, p.line)}) is {auto}; the memory verdict uses the "
                        "plan's kv_dtype - set it to what the server runs")
        return None
    if value not in known:
        raise ServeLauncherError(f"{where(p.file, p.line)}: --kv-cache-dtype {value!r} is not one isplan's memory "
                                 f"model covers ({', '.join(sorted(known))}, or auto)")
    return str(known[value])


def _fraction(p: Provenance, flag: str) -> float:
    """A share of the GPU: a number in (0, 1] as argparse reads a float; refused naming the flag otherwise."""
    try:
        value = float(p.value.strip())
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ServeLauncherError(f"{where(p.file, p.line)}: {flag} is {p.value!r}; it must be a fraction of the GPU "
                                 "in (0, 1]")
    return value


def _switches(cmd: Command, engine: str, first: int, got: dict[str, Provenance]) -> dict[str, bool]:
    """The boolean plan field of each of the engine's switches (``ServingEngine.switches``): on
    when the command gives it (kept with its line), else off (the engine's default)."""
    out = {}
    for switch, name in engine_module(engine).switches.items():
        found = _flag(cmd.argv[first:], (switch,))
        out[name] = found is not None
        if found is not None:
            got[name] = Provenance("1", found[2].line, "command", found[2].file)
    return out


def _speculative(cmd: Command, engine: str, first: int, got: dict[str, Provenance], warnings: list[str]) -> bool:
    """Whether the command's speculative decoding drafts with the checkpoint's MTP layers (the
    engine's ``launch_mtp`` on its ``speculative_flags``); a draft the memory model does not hold is
    said, a value the reader cannot know refused."""
    e = engine_module(engine)
    values: dict[str, str] = {}
    at: Arg | None = None
    for flag in e.speculative_flags:
        found = _flag(cmd.argv[first:], (flag,))
        if found is None or found[1] is None:
            continue
        value = found[1]
        if value.reason is not None:
            raise ServeLauncherError(f"{where(value.file, value.line)}: {flag} {value.raw} cannot be resolved "
                                     f"{_UNRESOLVED}")
        values[flag], at = value.text, at or found[2]
    mtp, note = e.launch_mtp(values)
    if at is not None and note is not None:
        warnings.append(f"{note} ({where(at.file, at.line)})")
    if at is not None and mtp:
        got["mtp_layers"] = Provenance("1", at.line, "command", at.file)
    return mtp


def _ep_is_tp(cmd: Command, engine: str, first: int) -> tuple[str, Arg] | None:
    """What in the command makes the engine's expert-parallel size its TP size (``ep_tp_switches``,
    ``ep_tp_flag``), as written, and where; None when nothing does."""
    e, args = engine_module(engine), cmd.argv[first:]
    found: tuple[str, Arg] | None = None
    for switch in e.ep_tp_switches:
        hit = _flag(args, (switch,))
        if hit is not None:
            found = (switch, hit[2])
    if e.ep_tp_flag is not None:
        flag, values = e.ep_tp_flag
        hit = _flag(args, (flag,))
        if hit is not None and hit[1] is not None:
            if hit[1].reason is not None:
                raise ServeLauncherError(f"{where(hit[1].file, hit[1].line)}: {flag} {hit[1].raw} cannot be resolved "
                                         f"{_UNRESOLVED}")
            if hit[1].text in values:
                found = (f"{flag} {hit[1].text}", hit[2])
    return found


def _expert_parallel(cmd: Command, engine: str, first: int, got: dict[str, Provenance], tp: int, ranks: int,
                     warnings: list[str]) -> int:
    """The expert-parallel size: the TP size when the command makes it so (:func:`_ep_is_tp`: SGLang's
    all-to-all MoE backends override ``--ep-size``, said when it differs), else the engine's size flag
    (SGLang ``--ep-size``), or its switch (vLLM ``--enable-expert-parallel``: EP = TP x DP, ``ranks``);
    1 without any."""
    forced = _ep_is_tp(cmd, engine, first)
    if forced is not None:
        what, at = forced
        given = got.get("ep")
        if given is not None and given.value.strip() != str(tp):
            warnings.append(f"{what} ({where(at.file, at.line)}) makes {ENGINES[engine].label}'s expert-parallel size "
                            f"the TP size, {tp}; the expert parallel size {given.value.strip()} "
                            f"({where(given.file, given.line)}) is overridden")
        got["ep"] = Provenance(str(tp), at.line, "command", at.file)
        return tp
    if "ep" in got:
        return _as_int(got["ep"], "the expert parallel size")
    switch = engine_module(engine).ep_switch
    found = _flag(cmd.argv[first:], (switch,)) if switch else None
    if found is None:
        return 1
    at = found[2]
    got["ep"] = Provenance(str(ranks), at.line, "command", at.file)
    return ranks


def _weight_dtype(p: Provenance, warnings: list[str]) -> str | None:
    """``--quantization fp8``: the weights held in FP8 (the plan's ``weight_dtype``); another method
    is not a plan setting (said: the verdict keeps the checkpoint's dtype or the plan's)."""
    value = p.value.strip()
    if value == "fp8":
        return "fp8"
    warnings.append(f"--quantization {value} ({where(p.file, p.line)}) is not a plan setting: the memory verdict "
                    "does not follow it and assumes the weight_dtype setting (the checkpoint's unless given)")
    return None


def _unread(cmd: Command, engine: str, first: int) -> list[str]:
    """A warning for every flag of the command that changes what a rank holds but that no plan
    field carries (the engine's ``LaunchSyntax.unread_flags``)."""
    out = []
    args = cmd.argv[first:]
    for flag, takes, assumed in ENGINES[engine].launch.unread_flags:
        found = _flag(args, (flag,))
        if found is None:
            continue
        _, value, at = found
        given = f"{flag} {value.raw}" if takes and value is not None else flag
        out.append(f"{given} ({where(at.file, at.line)}) is not a plan setting: the memory verdict does not "
                   f"follow it and assumes {assumed}")
    return out


def _nested(keys: list[str], value: Any) -> Any:
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] += v
        else:
            into[k] = v


def _dotted_value(args: tuple[Arg, ...], k: int, key: str, eq: str, value: str) -> tuple[Arg, bool]:
    """The value of the dotted option at ``args[k]`` (after its ``=``, else the next word) and
    whether it took the next word."""
    a = args[k]
    if eq:
        return Arg(value, a.reason, a.raw, a.file, a.line), False
    if k + 1 >= len(args):
        raise ServeLauncherError(f"{where(a.file, a.line)}: {key} has no value")
    return args[k + 1], True


def flexible_args(args: tuple[Arg, ...]) -> tuple[Arg, ...]:
    """A command line as vLLM's ``FlexibleArgumentParser.parse_args`` rewrites it before argparse
    (``vllm/utils/argparse_utils.py`` @ c836a6fe): in an option's name, before its first ``.``,
    ``_`` reads as ``-`` (``--tensor_parallel_size 8``); ``--json-arg.key value`` /
    ``--json-arg.key=value`` (a value JSON when it parses, else text; ``key+`` appends comma
    items to a list) are merged per option into one JSON object, appended at the end as
    ``--json-arg '{...}'`` - so they win over the option given whole."""
    out: list[Arg] = []
    merged: dict[str, tuple[dict[str, Any], Arg]] = {}
    skip = False
    for k, a in enumerate(args):
        if skip:
            skip = False
            continue
        text = a.text
        if a.reason is None and text.startswith("--"):
            name, eq, value = text.partition("=")
            head, dot, rest = name[2:].partition(".")
            text = "--" + head.replace("_", "-") + dot + rest + eq + value
        name, eq, value = text.partition("=")
        if a.reason is not None or not text.startswith("--") or "." not in name:
            out.append(Arg(text, a.reason, a.raw, a.file, a.line))
            continue
        found, skip = _dotted_value(args, k, name, eq, value)
        if found.reason is not None:
            raise ServeLauncherError(f"{where(found.file, found.line)}: {name} {found.raw} cannot be resolved "
                                     f"{_UNRESOLVED}")
        key, *keys = name.removesuffix("+").split(".")
        item: Any
        if name.endswith("+"):
            item = found.text.split(",")
        else:
            try:
                item = json.loads(found.text)
            except ValueError:
                item = found.text
        _merge(merged.setdefault(key, ({}, a))[0], _nested(keys, item))
    for key, (obj, at) in merged.items():
        text = json.dumps(obj)
        out += [Arg(key, None, key, at.file, at.line), Arg(text, None, text, at.file, at.line)]
    return tuple(out)


def _with_config(args: tuple[Arg, ...], engine: str, positional: bool, loader: Loader | None,
                 warnings: list[str]) -> tuple[Arg, ...]:
    """``args`` with the options of its ``--config FILE`` in place, as the engines pull them in
    (vLLM ``FlexibleArgumentParser._pull_args_from_config`` @ c836a6fe, SGLang
    ``ConfigArgumentMerger.merge_config_with_args`` @ 7ef0fc26): after a positional model (vLLM),
    before every other option, so the command line wins; the file read by the engine's
    ``config_reader`` through ``loader`` (pasted, or beside the launcher). Both look for the word
    ``--config`` only: ``--config=FILE`` is not pulled in (said; what their parsers make of it is
    not read here). Refused: a file it cannot read, two ``--config`` (both engines refuse them)."""
    syntax = ENGINES[engine].launch
    label = ENGINES[engine].label
    flag = str(syntax.config_flag)
    for a in args:
        if a.text.startswith(flag + "="):
            warnings.append(f"{a.text} ({where(a.file, a.line)}): {label} pulls options from a file only after "
                            f"`{flag} FILE` (two words), so it does not read this one")
    places = [k for k, a in enumerate(args) if a.text == flag]
    if not places:
        return args
    k = places[0]
    a = args[k]
    value = args[k + 1] if k + 1 < len(args) else None
    if len(places) > 1 or value is None or value.reason is not None:
        why = (f"is given twice ({label} takes one)" if len(places) > 1 else "has no value" if value is None
               else f"{value.raw} cannot be resolved {_UNRESOLVED}")
        raise ServeLauncherError(f"{where(a.file, a.line)}: {flag} {why}")
    path = value.text if posixpath.isabs(value.text) else posixpath.normpath(   # beside the launcher, as `source`
        posixpath.join(posixpath.dirname(a.file) or ".", value.text))
    text = loader(path) if loader is not None and syntax.config_reader is not None else None
    if text is None or syntax.config_reader is None:
        raise ServeLauncherError(
            f"{where(a.file, a.line)}: {flag} {value.text}: {label} reads further options from that YAML file, "
            + ("which is not in the text; paste it beside the launcher" if syntax.config_reader is not None
               else "which isplan does not read for it; put its settings on the command line"))
    try:
        words = syntax.config_reader(text, value.text)
    except ValueError as exc:
        raise ServeLauncherError(f"{where(a.file, a.line)}: {flag} {value.text}: {str(exc).splitlines()[0]}") from None
    lines = text.splitlines()
    from_file: list[Arg] = []
    line = 0
    for w in words:   # an option at its key's line, its values at the same line
        if w.startswith("--"):
            line = next((n for n, row in enumerate(lines, 1) if row.lstrip().startswith(w[2:] + ":")), 0)
        from_file.append(Arg(w, None, w, path, line))
    rest = args[:k] + args[k + 2:]
    if positional and rest and not rest[0].text.startswith("-"):
        return rest[:1] + tuple(from_file) + rest[1:]
    return tuple(from_file) + rest


def _serve_args(cmd: Command, engine: str, start: int, first: int, loader: Loader | None,
                warnings: list[str]) -> Command:
    """The serve command as the engine reads it: its ``--config`` file's options in place
    (:func:`_with_config`), then :func:`flexible_args` for vLLM; refused: the serve program again
    after an image whose entrypoint already is it."""
    syntax = ENGINES[engine].launch
    args = cmd.argv[first:]
    if syntax.config_flag:
        positional = syntax.positional_model and (cmd.argv[first - 1].text == "serve" or _at_image(cmd, first))
        args = _with_config(args, engine, positional, loader, warnings)
    args = flexible_args(args) if syntax.flexible_args else args
    at = cmd.argv[start]
    again = serve_start([a.text for a in args]) if _at_image(cmd, first) else None
    if again is not None and again[0] == 0:
        program = " ".join(syntax.programs[0]) if syntax.programs else engine
        raise ServeLauncherError(
            f"{where(at.file, at.line)}: the {image_name(at.text)} image's entrypoint is already `{program}` "
            f"({ENGINES[engine].label}'s docker/Dockerfile), so `{program}` again after the image runs "
            f"`{program} {program} ...`, which {ENGINES[engine].label} refuses (unrecognized arguments): put the "
            "model and its flags right after the image")
    return Command(cmd.argv[:first] + args, cmd.env, cmd.file, cmd.line)


def is_serving_launch(parsed: LauncherParse) -> bool:
    """Whether the read script launches vLLM or SGLang (a command naming one with a serve start)."""
    return any(serve_start([a.text for a in c.argv]) is not None for c in parsed.commands)


def parse_serve_launcher(text: str | bytes, *, name: str = "", loader: Loader | None = None,
                         parsed: LauncherParse | None = None) -> ServeLaunch:
    """Read one serve launch from ``text`` (shell, Kubernetes-style YAML, or both); see the module
    docstring. ``parsed``: the reader's result on ``text``, if the caller has it. Raises
    :class:`ServeLauncherError` when it cannot be read completely."""
    try:
        body = decode(text, name or "(pasted)")
        commands, k8s, shell, work = _commands(body, name, loader, parsed)
    except LauncherError as exc:
        raise ServeLauncherError(str(exc)) from None
    found = [(c, s) for c in commands if (s := serve_start([a.text for a in c.argv])) is not None]
    if not found:
        raise ServeLauncherError("no serve command found: expected `vllm serve MODEL ...`, "
                                 "`python -m sglang.launch_server --model-path MODEL ...` or `sglang serve ...`")
    if len(found) > 1:
        lines = ", ".join(str(c.argv[s[0]].line) for c, s in found)
        raise ServeLauncherError(f"{len(found)} serve commands (lines {lines}); paste one launch at a time")
    cmd, (start, engine, first) = found[0]
    read_notes: list[str] = []
    cmd = _serve_args(cmd, engine, start, first, loader, read_notes)
    got = _read(cmd, engine, first)
    model = got.get("model")
    if model is None or model.reason is not None:
        syntax = ENGINES[engine].launch
        flag = (f"MODEL after `{syntax.programs[0][0]} serve`" if syntax.positional_model
                else syntax.model_flags[0])
        at = cmd.argv[start]
        raise ServeLauncherError(f"{where(at.file, at.line)}: the model is missing or cannot be resolved ({flag})")
    tp = _as_int(got["tp"], "the tensor parallel size") if "tp" in got else 1
    pp = _as_int(got["pp"], "the pipeline parallel size") if "pp" in got else 1
    dp = _as_int(got["dp"], "the data parallel size") if "dp" in got else None
    switched = _switches(cmd, engine, first, got)
    warnings: list[str] = read_notes + _unread(cmd, engine, first)
    ep = _expert_parallel(cmd, engine, first, got, tp, tp * (dp or 1), warnings)
    mtp = _speculative(cmd, engine, first, got, warnings)
    context = _context(got["context"], engine) if "context" in got else None
    kv_dtype = _kv_dtype(got["kv_dtype"], engine, warnings) if "kv_dtype" in got else None
    weight_dtype = _weight_dtype(got["weight_dtype"], warnings) if "weight_dtype" in got else None
    fraction = (_fraction(got["gpu_memory_utilization"], _flags(engine)["gpu_memory_utilization"][0])
                if "gpu_memory_utilization" in got else None)
    env = _command_env(cmd, start)
    part = _partition(engine, env, k8s, shell, warnings)
    long_context = _long_context(engine, env, k8s, shell, warnings)
    if long_context is not None:
        got["allow_long_context"] = long_context
    sizes = None
    if part is not None:
        got["partition"] = part
        try:
            sizes = tuple(int(x) for x in part.value.split(","))
        except ValueError:
            raise ServeLauncherError(f"{where(part.file, part.line)}: {ENV_VARS_BY_ENGINE[engine]} is "
                                     f"{part.value!r}, not a comma list of whole numbers") from None
    return ServeLaunch(engine, model.value, tp, pp, sizes, got, tuple(warnings), work, context, kv_dtype,
                       weight_dtype, fraction, ep, dp, long_context is not None, switched, mtp)
