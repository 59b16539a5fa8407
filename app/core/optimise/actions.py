"""Page actions that rewrite a plan: **Balance** (the optimal valid layout for the plan's PP x
VPP) and **Nearest valid** (the valid layout that moves the fewest layers from the plan's stages).

Both return a new plan in split mode (the sizes, PP and VPP of the answer), so the URL that the
page shows afterwards reproduces the screen; a plan with no valid layout is a problem on ``split``.
"""

from __future__ import annotations

from dataclasses import replace

from app.core.evaluate import pipeline_spec, plan_roles
from app.core.layout.stages import materialise
from app.core.model.config import ModelConfig
from app.core.model.layer_costs import layer_costs
from app.core.optimise.optimiser import k_best_layouts, nearest_valid
from app.core.plan import SERVING_ENGINES, FieldProblem, Plan

ACTIONS = ("balance", "nearest")


def apply_action(plan: Plan, cfg: ModelConfig, action: str) -> tuple[Plan, FieldProblem | None]:
    """``plan`` rewritten by ``action`` (``balance`` or ``nearest``), or unchanged with a problem.

    Serving engines balance the partition as :func:`app.core.engines.serving.best_serving_partition`
    does (weights per rank, MTP draft and lm_head where the engine puts them)."""
    if plan.engine == "maxtext":
        return plan, FieldProblem("lps", f"{action}: MaxText stages are fixed by num_layers_per_pipeline_stage; "
                                         "change it or the pipeline sizes instead")
    roles, _ = plan_roles(plan, cfg)
    if plan.engine in SERVING_ENGINES:
        sizes = list(plan.split) if plan.mode == "split" and plan.split else None
        pp, vpp = len(sizes) if sizes else plan.pp, 1
    else:
        stages = materialise(pipeline_spec(plan), cfg.num_hidden_layers)
        pp, vpp, sizes = stages.pp, stages.vpp, stages.sizes if stages.stages else None
    full = [r.role == "full" for r in roles.layers]
    split: list[int] | None = None
    if action == "balance" and plan.engine in SERVING_ENGINES:
        from app.core.engines.serving import best_serving_partition

        found = best_serving_partition(cfg, plan.engine, pp, k=1, mtp=bool(plan.mtp), version=plan.engine_version)
        split = list(found[0].sizes) if found else None
    elif action == "balance":
        lc = layer_costs(cfg, roles, "balanced")
        best = k_best_layouts(list(lc.costs), full, pp, vpp, k=1, first_stage_extra=lc.first_stage_extra,
                              last_stage_extra=lc.last_stage_extra)
        split = list(best[0].split) if best else None
    elif action == "nearest":
        if plan.engine in SERVING_ENGINES and sizes is None:  # the engine's default partition
            from app.core.engines.serving import default_partition

            sizes = default_partition(plan.engine, cfg.num_hidden_layers, pp, plan.engine_version)
        sizes = sizes if sizes and sum(sizes) == cfg.num_hidden_layers else None
        nv = nearest_valid(sizes, full, vpp) if sizes else None
        split = list(nv.split) if nv else None
    else:
        return plan, FieldProblem("action", f"unknown action {action[:40]!r}; use one of {', '.join(ACTIONS)}")
    if split is None:
        return plan, FieldProblem("split", f"{action}: no valid layout with {pp * vpp} stages for this model")
    return replace(plan, mode="split", split=tuple(split), pp=pp, vpp=vpp if vpp > 1 else plan.vpp), None
