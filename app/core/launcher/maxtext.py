"""The MaxText consumer: ``python3 -m maxtext.trainers.pre_train.train CONFIG.yml key=value ...`` ->
the plan's MaxText pipeline keys, each with the file and line it came from.

MaxText builds its config (``src/maxtext/configs/pyconfig.py`` @ e591f30c, re-implemented for the
keys read here) from, in order: the YAML file (the first argument when it ends in ``.yml``, else
the module's default, ``base.yml``) with its ``base_config`` chain; the ``key=value`` words after
it (OmegaConf's dotlist: the last of a key wins); ``M_<KEY>`` environment variables (a key both on
the command line and in the environment is MaxText's own ``ValueError``). A Kubernetes-style spec
(``command`` / ``args``, ``sh -c``, its ``env:`` list) is read like a script. The keys read are the
engine's vocabulary (``MaxTextEngine.flags``: pipeline sizes, layers per stage, repeats, pipelined
layers, micro-batches, ``index_share_pattern``); ``-1`` is MaxText's "derive it", the plan's unset.

MaxText's own ``base.yml`` sets every one of them to its default, so a launch on it needs nothing
more; any other config file is read from the pasted files or beside the launcher (the reader's
loader) with its ``base_config`` chain, and fails closed, naming it, when it cannot be. The
command may also sit in ``xpk workload create --command "..."``. ``model_name=...`` selects
MaxText's model file (the model's shape; MaxText's own model files set no pipeline key): said in
a warning, the plan keeps its model.

Fails closed (:class:`MaxTextLauncherError`): more than one MaxText command, a MaxText command kept
in a variable the reader cannot know completely, a key whose value it cannot know, a word it cannot
know at all (it may hold keys), a value that is not a whole number, a key set on the command line
and in the environment, a config file that cannot be read or parsed.
"""

from __future__ import annotations

import itertools
import posixpath
from dataclasses import dataclass, field
from typing import Any

import yaml

from app.core.engines import ENGINES
from app.core.launcher.engine import TRAINER_MODULES, TRAINER_SCRIPTS, module_start
from app.core.launcher.reader import LaunchCommands, parse_launcher
from app.core.launcher.results import INT_RE, Arg, Command
from app.core.launcher.state import Loader
from app.core.launcher.text import LauncherError, where

#: MaxText's default config and the keys that point to a parent config (``pyconfig._BASE_CONFIG_ATTR``)
BASE_CONFIG = "base.yml"
BASE_CONFIG_KEY = "base_config"
#: ``base_config`` chains longer than this are refused (MaxText recurses without a bound)
MAX_CONFIG_DEPTH = 8


class MaxTextLauncherError(LauncherError):
    """The MaxText launch cannot be read completely; the message names what is missing and where."""


@dataclass(frozen=True)
class KeyValue:
    value: str
    file: str
    line: int
    how: str   # command | env | config

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "file": self.file, "line": self.line, "how": self.how}


@dataclass
class MaxTextLaunch:
    """The engine, the keys read (key -> value and where), the config file, the model MaxText is told
    to build."""

    engine: str
    values: dict[str, KeyValue]
    config: str
    model_name: str | None
    line: tuple[str, int]
    warnings: list[str] = field(default_factory=list)


def _words(cmd: Command) -> list[str]:
    return [a.text for a in cmd.argv]


def _inner(cmd: Command) -> list[Command]:
    """The commands inside ``xpk ... --command "..."`` (re-read as a script of their own)."""
    for a, b in itertools.pairwise(cmd.argv):
        if a.text == "--command" and b.reason is None:
            read = parse_launcher(b.text, name=b.file)
            return [Command(c.argv, {**cmd.env, **c.env}, b.file, b.line) for c in read.commands]
    return []


def _names_maxtext(text: str) -> bool:
    """Whether ``text`` names a trainer module or entry script (MaxText's: the engines' launch syntax)."""
    return any(m in text for m in TRAINER_MODULES) or any(s in text for s in TRAINER_SCRIPTS)


def maxtext_command(read: LaunchCommands) -> tuple[Command, int, str] | None:
    """The one MaxText training command of the script (a trainer started as a module or entry
    script: :func:`module_start`), the index of its first argument and the engine; None when it has
    none. Two or more are refused."""
    found = []
    for cmd in read.commands:
        hidden = next((a for a in cmd.argv if a.reason is not None and _names_maxtext(a.text)), None)
        if hidden is not None:
            raise MaxTextLauncherError(f"{where(hidden.file, hidden.line)}: {hidden.raw} runs MaxText but cannot be "
                                       f"read completely ({hidden.reason})")
        for c in [cmd, *(_inner(cmd) if "--command" in _words(cmd) else [])]:
            start = module_start(_words(c))
            if start is not None:
                found.append((c, start[2], start[1]))
    if len(found) > 1:
        lines = ", ".join(where(c.file, c.line) for c, _, _ in found)
        raise MaxTextLauncherError(f"{len(found)} MaxText commands ({lines}); paste one launch at a time")
    return found[0] if found else None


def _whole(key: str, kv: KeyValue) -> KeyValue:
    text = kv.value.strip()
    if key != "index_share_pattern" and not INT_RE.fullmatch(text):
        raise MaxTextLauncherError(f"{where(kv.file, kv.line)}: {key}={kv.value!r} is not a whole number")
    return kv


def _command_keys(args: tuple[Arg, ...], keys: frozenset[str]) -> dict[str, KeyValue]:
    out: dict[str, KeyValue] = {}
    for a in args:
        key, eq, value = a.raw.partition("=") if a.reason is not None else a.text.partition("=")
        if a.reason is not None and not (eq and key.isidentifier()):
            raise MaxTextLauncherError(f"{where(a.file, a.line)}: {a.raw} cannot be resolved ({a.reason}); it may "
                                       "set MaxText keys")
        if not eq or key not in keys:
            continue
        if a.reason is not None:
            raise MaxTextLauncherError(f"{where(a.file, a.line)}: {a.raw} cannot be resolved ({a.reason})")
        out[key] = _whole(key, KeyValue(value, a.file, a.line, "command"))
    return out


def _env_keys(cmd: Command, read: LaunchCommands, keys: frozenset[str], given: dict[str, KeyValue],
              prefix: str, warnings: list[str]) -> dict[str, KeyValue]:
    """``M_<KEY>`` variables (``prefix``) the process sees: set for the command, in a spec's ``env:``
    list, or exported by the script."""
    out: dict[str, KeyValue] = {}
    for key in sorted(keys):
        var = prefix + key.upper()
        v = cmd.env.get(var) or read.k8s.get(var) or read.shell.get(var)
        if v is None:
            continue
        if v.how == "assignment":
            warnings.append(f"{var} is assigned on {where(v.file, v.line)} but never exported, so MaxText does not "
                            f"see it (write `export {var}=...`)")
            continue
        if v.reason is not None:
            raise MaxTextLauncherError(f"{where(v.file, v.line)}: {var} cannot be resolved ({v.reason})")
        if key in given:
            raise MaxTextLauncherError(f"Key '{key}' is overridden by both CLI/kwargs and environment variable "
                                       f"'{var}'. This is not allowed. ({where(v.file, v.line)}, MaxText's pyconfig)")
        out[key] = _whole(key, KeyValue(v.value, v.file, v.line, "env"))
    return out


def _config_keys(path: str, keys: frozenset[str], loader: Loader | None, at: tuple[str, int],
                 depth: int = 0) -> dict[str, KeyValue]:
    """The keys ``path`` (and its ``base_config`` chain) sets: MaxText's own ``base.yml`` sets
    them to their defaults (nothing to read)."""
    if posixpath.basename(path) == BASE_CONFIG:
        return {}
    if depth >= MAX_CONFIG_DEPTH:
        raise MaxTextLauncherError(f"{path}: base_config nests more than {MAX_CONFIG_DEPTH} files deep")
    text = loader(path) if loader is not None else None
    if text is None:
        raise MaxTextLauncherError(f"{where(*at)}: cannot read the MaxText config {path!r} (it may set pipeline "
                                   "keys): paste it beside the launcher, or launch on base.yml with key=value")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MaxTextLauncherError(f"{path}: not YAML MaxText can read ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise MaxTextLauncherError(f"{path}: nested too deeply to read") from None
    if not isinstance(data, dict):
        raise MaxTextLauncherError(f"{path}: a MaxText config is a mapping of keys, got {type(data).__name__}")
    parent = data.get(BASE_CONFIG_KEY)
    if parent is not None and not isinstance(parent, str):
        raise MaxTextLauncherError(f"{path}: {BASE_CONFIG_KEY} is a {type(parent).__name__}, not a file name")
    out = _config_keys(posixpath.join(posixpath.dirname(path), str(parent)), keys, loader, at, depth + 1) \
        if parent is not None else {}
    for key in keys & set(data):
        if isinstance(data[key], (list, dict)):   # str() of aliased lists can be billions of characters
            raise MaxTextLauncherError(f"{path}: {key} is a {type(data[key]).__name__}, not a whole number")
        out[key] = _whole(key, KeyValue(str(data[key]), path, 0, "config"))
    return out


def parse_maxtext_launch(read: LaunchCommands, loader: Loader | None = None) -> MaxTextLaunch | None:
    """The MaxText launch among a launch's commands (None: it has no MaxText command); see the
    module docstring. ``loader`` reads a config file. Raises :class:`MaxTextLauncherError` when it
    cannot be read completely."""
    found = maxtext_command(read)
    if found is None:
        return None
    cmd, first, engine = found
    keys = frozenset(ENGINES[engine].flags)
    args = cmd.argv[first:]
    config = BASE_CONFIG
    if args and args[0].reason is None and args[0].text.endswith(".yml"):
        config, args = args[0].text, args[1:]
    elif args and args[0].reason is not None and args[0].raw.endswith(".yml"):
        if posixpath.basename(args[0].raw) != BASE_CONFIG:
            raise MaxTextLauncherError(f"{where(args[0].file, args[0].line)}: the config {args[0].raw} cannot be "
                                       f"resolved ({args[0].reason})")
        config, args = args[0].raw, args[1:]
    warnings: list[str] = []
    given = _command_keys(args, keys)
    values = {**_config_keys(config, keys, loader, (cmd.file, cmd.line)), **given,
              **_env_keys(cmd, read, keys, given, ENGINES[engine].launch.env_prefix or "", warnings)}
    model = next((a.text.partition("=")[2] for a in reversed(args)
                  if a.reason is None and a.text.startswith("model_name=")), None)
    return MaxTextLaunch(engine, values, config, model, (cmd.file, cmd.line), warnings)
