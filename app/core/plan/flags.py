"""A plan from an engine's own command line (launcher import): each flag the engine's vocabulary
maps onto a plan field takes its value; switches set booleans; the rest keep the base plan.

The vocabulary is the engine's (``app.core.engines.<name>.flags``: flag -> field), so this module
knows no engine's names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from app.core.plan.table import TABLE, FieldProblem, Plan, parse_value


def plan_from_flags(values: Mapping[str, str], switches: Iterable[str], base: Plan,
                    vocabulary: Mapping[str, str]) -> tuple[Plan, list[FieldProblem]]:
    """``base`` with every field whose flag (in ``vocabulary``) appears in ``values`` / ``switches``.
    The layout mode follows the flags (a layout string wins, else Megatron flags)."""
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
    for flag in switches:
        name = vocabulary.get(flag)
        if name is not None and TABLE[name].kind == "bool":
            out[name] = True
    out["mode"] = "layout" if out.get("layout") else "flags"
    return replace(base, **out), problems
