"""The ``isplan`` options of a plan, generated from the plan table: one option per field.

Each option is the field's CLI flag; the names the engines use for the same setting
(``--tensor-model-parallel-size``, ``--max-tokens-per-gpu`` ...) are accepted too, as launchers
spell them (the caller hands them in from ``app.core.engines``: the plan package is below the
engines). ``--help`` shows each option's URL key, so a command line and a share URL translate one
to one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.core.plan.query import IgnoredFields
from app.core.plan.table import (
    TABLE,
    FieldProblem,
    Plan,
    PlanError,
    build_plan,
    format_value,
    parse_values,
    plan_conflicts,
)

GROUP_TITLES = {
    "model": "model and roles",
    "layout": "layout (one of: --split, --pp with flags, --pp with --layout, --launcher)",
    "parallel": "parallelism (a --launcher supplies them)",
    "memory": "memory",
    "time": "step time (isplan time; the GPU's peaks and links come from --gpu)",
    "flops": "FLOPs",
    "conversion": "conversion layout (a second slot, e.g. --conv-pp 2 --conv-last 40)",
    "serving": "serving (--engine vllm|sglang: --pp N [--split PARTITION] is the engine's PP layer partition)",
    "maxtext": "MaxText pipeline (--engine maxtext)",
}

_METAVARS = {"int": "N", "float": "GB", "text": "TEXT", "sizes": "LIST"}


#: field -> the engines' switches that set it to one value (``--recompute-activations`` -> recompute
#: selective), as ``(flag, value)`` pairs
SettingAliases = Mapping[str, Iterable[tuple[str, Any]]]


def add_cli_arguments(parser: Any, aliases: Mapping[str, Iterable[str]] | None = None,
                      settings: SettingAliases | None = None) -> None:
    """argparse options for every plan field, grouped as the table groups them (default None:
    given vs absent is known). ``aliases``: field -> the engines' own flags for it; ``settings``:
    field -> the engines' switches that set it to a value."""
    for group, title in GROUP_TITLES.items():
        names = [n for n, s in TABLE.items() if s.group == group and s.cli is not None]
        add_cli_fields(parser.add_argument_group(title), names, aliases, settings)


def add_cli_fields(group: Any, names: Iterable[str], aliases: Mapping[str, Iterable[str]] | None = None,
                   settings: SettingAliases | None = None) -> None:
    """One argparse option per named plan field, from the table (flag, type, bounds, help); a
    ``nargs`` field takes one or more words, as the engine's own flag does."""
    for name in names:
        for flag, value in (settings or {}).get(name, ()):
            group.add_argument(flag, dest=name, action="store_const", const=value, default=None,
                               help=f"the engine's switch for {TABLE[name].cli} {format_value(TABLE[name], value)} "
                                    f"[URL key: {name}={format_value(TABLE[name], value)}]")
        spec = TABLE[name]
        assert spec.cli is not None, name
        extra = [f for f in (aliases or {}).get(name, ()) if f != spec.cli]
        text = spec.help + f" [URL key: {name}" + (f"; also {', '.join(extra)}" if extra else "") + "]"
        flags = [spec.cli, *extra]
        if spec.kind == "bool":
            group.add_argument(*flags, dest=name, action="store_true", default=None, help=text)
        elif spec.kind == "choice":
            group.add_argument(*flags, dest=name, choices=spec.choices, default=None, help=text,
                               nargs="+" if spec.nargs else None)
        elif spec.kind == "choices":
            group.add_argument(*flags, dest=name, nargs="+", choices=spec.choices, default=None, metavar=spec.metavar,
                               help=text + f" (one or more of {', '.join(spec.choices)})")
        else:
            group.add_argument(*flags, dest=name, default=None, metavar=spec.metavar or _METAVARS[spec.kind],
                               help=text + (f" ({spec.bounds_text()})" if spec.bounds_text() else ""),
                               nargs="+" if spec.nargs else None)


def given_fields(namespace: Any) -> list[str]:
    """The plan fields given on the command line."""
    return [n for n, s in TABLE.items() if s.cli is not None and getattr(namespace, n, None) is not None]


def plan_from_cli(namespace: Any, model: str, *, ignored: IgnoredFields | None = None) -> Plan:
    """The plan the CLI flags describe; every problem is a :class:`PlanError` (exit 2), and so is
    a setting that does not apply (to the layout mode, or to the engine: ``ignored``)."""
    given = {n: getattr(namespace, n) for n in given_fields(namespace)}
    values, problems = parse_values(given)
    if problems:
        raise PlanError(problems)
    plan = build_plan({"model": model, **values})
    problems = plan_conflicts(plan, strict=True, ignored=ignored(plan) if ignored else ())
    if problems:
        raise PlanError(problems)
    return plan


__all__ = ["GROUP_TITLES", "FieldProblem", "add_cli_arguments", "add_cli_fields", "given_fields", "plan_from_cli"]
