"""A plan from an engine's own command line (launcher import): each flag the engine's vocabulary
maps onto a plan field takes its value; switches set booleans; the rest keep the base plan.

The vocabulary is the engine's (``app.core.engines.<name>``: ``flags`` flag -> field, ``flag_settings``
switch -> (field, value), ``absent_defaults`` field -> the value a command line of that engine means
when it gives none of the flags for the field), so this module knows no engine's names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from app.core.plan.table import TABLE, FieldProblem, Plan, parse_value


def plan_from_flags(values: Mapping[str, str], switches: Iterable[str], base: Plan,
                    vocabulary: Mapping[str, str], *, settings: Mapping[str, tuple[str, Any]] | None = None,
                    absent: Mapping[str, Any] | None = None) -> tuple[Plan, list[FieldProblem]]:
    """``base`` with every field whose flag (in ``vocabulary``) appears in ``values`` / ``switches``.

    ``settings``: switches that set a field to one value (``--recompute-activations`` -> recompute
    selective); they are applied after the value flags, as the engine applies them after parsing.
    ``absent``: the value a field takes when the command line gives none of its flags (the engine's
    default where it differs from the plan's neutral value: Megatron builds no distributed optimizer
    without ``--use-distributed-optimizer``). The layout mode follows the flags (a layout string
    wins, else Megatron flags)."""
    out: dict[str, Any] = {}
    problems: list[FieldProblem] = []
    for flag, raw in values.items():
        name = vocabulary.get(flag)
        if name is None or name in out:
            continue
        try:
            out[name] = parse_value(TABLE[name], raw)
        except ValueError as exc:
            problems.append(FieldProblem(name, f"{flag} {str(raw)[:40]}: {exc}"))
    given = set(switches)
    for flag in given:
        name = vocabulary.get(flag)
        if name is not None and TABLE[name].kind == "bool":
            out[name] = True
    for flag, (name, value) in (settings or {}).items():
        if flag in given:
            out[name] = value
    for name, value in (absent or {}).items():
        out.setdefault(name, value)
    out["mode"] = "layout" if out.get("layout") else "flags"
    return replace(base, **out), problems
