"""Page actions that rewrite a plan: **Balance** (the optimal valid layout for the plan's PP x
VPP, as its engine builds it) and **Nearest valid** (the valid layout that moves the fewest layers
from the plan's stages).

Both ask the plan's engine (``Engine.best_layouts`` / ``Engine.nearest``) and return a new plan
in split mode (the sizes, PP and VPP of the answer), so the URL that the page shows afterwards
reproduces the screen; a plan with no valid layout is a problem on the engine's layout field.
"""

from __future__ import annotations

from app.core.engines import engine_for
from app.core.model.config import ModelConfig
from app.core.plan import FieldProblem, Plan

ACTIONS = ("balance", "nearest")


def apply_action(plan: Plan, cfg: ModelConfig, action: str) -> tuple[Plan, FieldProblem | None]:
    """``plan`` rewritten by ``action`` (``balance`` or ``nearest``), or unchanged with a problem."""
    engine = engine_for(plan)
    if action not in ACTIONS:
        return plan, FieldProblem("action", f"unknown action {action[:40]!r}; use one of {', '.join(ACTIONS)}")
    try:
        if action == "balance":
            found = engine.best_layouts(cfg, _anchored(plan, cfg), objective="balanced", top=1)
            result = found[0] if found else None
        else:
            result = engine.nearest(cfg, plan)
    except NotImplementedError:
        return plan, FieldProblem(engine.layout_field(plan), f"{action}: {engine.label}'s stages are fixed by its "
                                                             "pipeline settings; change them instead")
    if result is None:
        return plan, FieldProblem(engine.layout_field(plan), f"{action}: no valid layout with these pipeline sizes "
                                                             "for this model")
    return result, None


def _anchored(plan: Plan, cfg: ModelConfig) -> Plan:
    """Balance keeps the plan's pipeline sizes: in split mode PP follows the sizes (and VPP)."""
    from dataclasses import replace

    if plan.mode == "split" and plan.split:
        return replace(plan, pp=max(1, len(plan.split) // (plan.vpp or 1)))
    return plan
