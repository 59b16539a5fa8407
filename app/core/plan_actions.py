"""Page actions that rewrite a plan: **Balance** (the optimal valid layout for the plan's PP x
VPP) and **Nearest valid** (the valid layout that moves the fewest layers from the plan's stages).

Both return a new plan in split mode (the sizes, PP and VPP of the answer), so the URL that the
page shows afterwards reproduces the screen; a plan with no valid layout is a problem on ``split``.
"""

from __future__ import annotations

from dataclasses import replace

from app.core.evaluate import pipeline_spec
from app.core.layer_costs import layer_costs
from app.core.layer_roles import derive_roles
from app.core.model_config import ModelConfig
from app.core.optimiser import k_best_layouts, nearest_valid
from app.core.plan import FieldProblem, Plan
from app.core.stages import materialise

ACTIONS = ("balance", "nearest")


def apply_action(plan: Plan, cfg: ModelConfig, action: str) -> tuple[Plan, FieldProblem | None]:
    """``plan`` rewritten by ``action`` (``balance`` or ``nearest``), or unchanged with a problem."""
    roles = derive_roles(cfg, plan.engine, pattern=plan.pattern, freq=plan.dsa_freq, offset=plan.dsa_offset)
    stages = materialise(pipeline_spec(plan), cfg.num_hidden_layers)
    pp, vpp = stages.pp, stages.vpp
    full = [r.role == "full" for r in roles.layers]
    split: list[int] | None = None
    if action == "balance":
        lc = layer_costs(cfg, roles, "balanced")
        best = k_best_layouts(list(lc.costs), full, pp, vpp, k=1, first_stage_extra=lc.first_stage_extra,
                              last_stage_extra=lc.last_stage_extra)
        split = list(best[0].split) if best else None
    elif action == "nearest":
        sizes = stages.sizes if stages.stages and sum(stages.sizes) == cfg.num_hidden_layers else None
        nv = nearest_valid(sizes, full, vpp) if sizes else None
        split = list(nv.split) if nv else None
    else:
        return plan, FieldProblem("action", f"unknown action {action[:40]!r}; use one of {', '.join(ACTIONS)}")
    if split is None:
        return plan, FieldProblem("split", f"{action}: no valid layout with {pp * vpp} stages for this model")
    return replace(plan, mode="split", split=tuple(split), pp=pp, vpp=vpp if vpp > 1 else plan.vpp), None
