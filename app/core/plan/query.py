"""The plan a URL describes: the page, every ``/api/v1`` route and a share link read it here.

Every field is read by its name (its URL key) or by one of the keys earlier versions used
(:attr:`~app.core.plan.table.Field.aliases`), so old share URLs still open; the canonical URL
(:meth:`~app.core.plan.table.Plan.query`) uses the names. A key that is no setting at all is a
problem naming it (with the nearest setting), never silently dropped.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from app.core.plan.table import (
    BY_URL,
    TABLE,
    FieldProblem,
    Plan,
    PlanError,
    build_plan,
    parse_values,
    plan_conflicts,
)


def unknown_keys(params: Iterable[str], allowed: Iterable[str] = ()) -> list[FieldProblem]:
    """A problem for every key that is neither a plan setting (or an alias of one) nor in
    ``allowed`` (a route's own parameters), naming the nearest setting."""
    known = set(BY_URL) | set(allowed)
    out = []
    for key in params:
        if key in known:
            continue
        near = difflib.get_close_matches(key, list(TABLE), n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        out.append(FieldProblem(key[:40], f"unknown setting {key[:40]!r}{hint}"))
    return out


#: the fields a plan's engine does not read (``app.core.engines.ignored_fields``): the plan package
#: is below the engines, so they are handed in
IgnoredFields = Callable[[Plan], Iterable[str]]


def plan_from_query(params: Mapping[str, str], *, empty: Plan | None = None,
                    ignored: IgnoredFields | None = None) -> tuple[Plan, list[FieldProblem]]:
    """The plan a URL describes, and every field problem (a bad value keeps the field's default).

    An empty query is ``empty`` (the page passes the pinned profile); otherwise an absent key takes
    its neutral default, so a share URL always means the same plan. Without ``mode`` the layout is
    whatever was given (layout string > split > flags). A field given under its name wins over an
    alias of it.
    """
    given: dict[str, str] = {}
    for key, raw in params.items():
        name = BY_URL.get(key)
        if name is not None and (key == name or name not in given):
            given[name] = raw
    if not given and empty is not None:
        return empty, []
    values, problems = parse_values(given, label_of=lambda spec, exc: f"{exc} ({spec.help})")
    plan = build_plan(values)
    conflicts = plan_conflicts(plan, strict=False, ignored=ignored(plan) if ignored else ())
    # bounded before any work: the page shows the offending setting unset
    if any(p.field == "split" and "stages: PP would be over" in p.message for p in conflicts):
        plan = replace(plan, split=None)
    if any(p.field == "dp" for p in conflicts):
        plan = replace(plan, dp=None)
    return plan, problems + conflicts


def strict_plan(params: Mapping[str, str], *, empty: Plan | None = None, ignored: IgnoredFields | None = None,
                allowed: Iterable[str] = ()) -> Plan:
    """:func:`plan_from_query` for the API: any problem is a :class:`PlanError` (a 422), and a
    setting that does not apply (to the layout mode or to the engine: ``ignored``) is one. So is a
    key that is no setting and not one of the route's own parameters (``allowed``): the page
    says NO-GO for it (:func:`unknown_keys`), so the API must not answer as if it were absent."""
    plan, problems = plan_from_query(params, empty=empty)
    problems = unknown_keys(params, allowed) + problems
    problems += [p for p in plan_conflicts(plan, strict=True, ignored=ignored(plan) if ignored else ())
                 if p not in problems]
    if problems:
        raise PlanError(problems)
    return plan
