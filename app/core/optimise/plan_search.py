"""The ``isplan plan`` report: per-layer costs, the optimal valid layout and its alternatives,
the number of valid layouts and the nearest valid layout to a given split, each with the Megatron
flags that build it. Shared by the CLI and ``/api/v1/plan-search``."""

from __future__ import annotations

from typing import Any

from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.layout.stages import PipelineSpec
from app.core.model.config import ModelConfig
from app.core.model.layer_costs import LayerCosts, layer_costs
from app.core.model.roles import RoleMap
from app.core.optimise.optimiser import count_valid_layouts, k_best_layouts, nearest_valid


def _layout_body(cfg: ModelConfig, lay: Any, vpp: int, mtp_layers: int) -> dict[str, Any]:
    plan = materialise(PipelineSpec(split=tuple(lay.split), vpp=vpp, overlap_p2p=True, mtp_layers=mtp_layers),
                       cfg.num_hidden_layers)
    args, layout = megatron_flags(plan) if not plan.errors else ([], "")
    return {"split": list(lay.split), "starts": list(lay.starts), "stage_costs": list(lay.stage_costs),
            "unit_costs": list(lay.unit_costs), "max_cost": lay.max_cost, "exact": lay.exact, "note": lay.note,
            "megatron_flags": args, "layout_string": layout}


def plan_report(cfg: ModelConfig, roles: RoleMap, *, pp: int, vpp: int = 1, objective: str = "balanced",
                context: int = 4096, top: int = 3, near: tuple[int, ...] | None = None,
                mtp_layers: int = 0, costs: LayerCosts | None = None) -> dict[str, Any]:
    """Raises ValueError (with a message naming the option) for unusable input. Whether Megatron
    interleaves at this PP x VPP is the placement's rule (the caller asks it first). ``costs``:
    per-layer costs the caller computed (the time objective's, from the time model)."""
    if pp < 1 or vpp < 1:
        raise ValueError("--pp and --vpp must be at least 1")
    if not 0 <= top <= 100:
        raise ValueError(f"--top must be between 0 and 100, got {top}")
    lc = costs or layer_costs(cfg, roles, objective, context=context, mtp_layers=mtp_layers)
    full = [r.role == "full" for r in roles.layers]
    stages = pp * vpp
    best = k_best_layouts(list(lc.costs), full, pp, vpp, k=top + 1,
                          first_stage_extra=lc.first_stage_extra, last_stage_extra=lc.last_stage_extra)
    body: dict[str, Any] = {
        "model": cfg.summary(), "engine": roles.engine, "pp": pp, "vpp": vpp,
        "objective": lc.objective, "cost_unit": lc.unit, "context": context,
        "layer_costs": list(lc.costs), "first_stage_extra": lc.first_stage_extra,
        "last_stage_extra": lc.last_stage_extra,
        "valid_layout_count": count_valid_layouts(full, stages),
        "best": _layout_body(cfg, best[0], vpp, mtp_layers) if best else None,
        "alternatives": [_layout_body(cfg, lay, vpp, mtp_layers) for lay in best[1:]],
    }
    if near is not None:
        if len(near) != stages:
            raise ValueError(f"--near has {len(near)} stages; --pp {pp} x --vpp {vpp} = {stages}")
        if sum(near) != cfg.num_hidden_layers:
            raise ValueError(f"--near sums to {sum(near)}, but the model has {cfg.num_hidden_layers} layers")
        nv = nearest_valid(list(near), full, vpp)
        body["near"] = None if nv is None else {
            "from": list(near), "split": nv.split, "starts": nv.starts, "moved": nv.moved,
            "changed": [c.__dict__ for c in nv.changed]}
    return body
