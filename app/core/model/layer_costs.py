"""Per-layer costs for the layout optimiser: the model behind ``isplan plan --objective``.

* ``memory``: parameters each decoder layer holds (attention, its indexer if it owns one, norms,
  dense FFN or routed + shared experts + router; :mod:`app.core.model.parameters`). The first stage
  adds the embedding; the last stage adds lm_head, the final norm and the plan's MTP layers
  (``mtp_layers``, the launch's ``--mtp-num-layers``; 0 by default, as slime and Megatron build
  none without the flag) together with the embedding copy Megatron builds for them
  (``mtp_process``).
* ``compute``: forward FLOPs per token of each decoder layer at the given context
  (:func:`app.core.model.flops.per_layer_forward_flops`: linear layers, the indexer where it runs,
  sparse attention). The first stage adds nothing (an embedding lookup is not a matmul); the last
  adds the lm_head and the plan's MTP layers.
* ``balanced``: each of the two, divided by its own model total, added: a layer that is 2 % of
  the weights and 1 % of the FLOPs costs 0.03.

Stage cost = sum of its layers' costs + the extra where it applies (see
:mod:`app.core.optimise.optimiser`).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.model.config import ModelConfig
from app.core.model.flops import (
    head_flops_per_token,
    mtp_layer_forward_flops,
    per_layer_forward_flops,
)
from app.core.model.parameters import layer_components, mtp_layer_total, shapes
from app.core.model.roles import RoleMap

OBJECTIVES = ("compute", "memory", "balanced")


@dataclass(frozen=True)
class LayerCosts:
    objective: str
    unit: str
    costs: tuple[float, ...]
    first_stage_extra: float
    last_stage_extra: float


def memory_costs(cfg: ModelConfig, roles: RoleMap, *, mtp_layers: int = 0) -> LayerCosts:
    """Parameters per decoder layer; the last stage carries ``mtp_layers`` MTP layers."""
    sh = shapes(cfg)
    costs = tuple(float(sum(v for k, v in layer_components(cfg, roles, n, sh).items() if k != "router_bias"))
                  for n in range(1, cfg.num_hidden_layers + 1))
    mtp = mtp_layers
    last = sh.lm_head + sh.final_norm + mtp * (mtp_layer_total(cfg, sh, with_bias=False) + sh.embedding)
    return LayerCosts("memory", "parameters", costs, float(sh.embedding), float(last))


def compute_costs(cfg: ModelConfig, roles: RoleMap, context: int, *, mtp_layers: int = 0) -> LayerCosts:
    """Forward FLOPs per token of each decoder layer; the last stage adds the head and
    ``mtp_layers`` MTP layers."""
    n = cfg.num_hidden_layers
    costs = tuple(float(per_layer_forward_flops(cfg, roles, layer, context)) for layer in range(1, n + 1))
    last = head_flops_per_token(cfg) + sum(
        mtp_layer_forward_flops(cfg, roles, k, context) for k in range(1, mtp_layers + 1))
    return LayerCosts("compute", "forward FLOPs per token", costs, 0.0, float(last))


def layer_costs(cfg: ModelConfig, roles: RoleMap, objective: str = "balanced", *, context: int = 4096,
                mtp_layers: int = 0) -> LayerCosts:
    """Per-layer costs under ``objective`` (module docstring); ``mtp_layers`` from the plan."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if mtp_layers < 0:
        raise ValueError(f"--mtp-num-layers cannot be negative, got {mtp_layers}")
    if objective == "memory":
        return memory_costs(cfg, roles, mtp_layers=mtp_layers)
    if objective == "compute":
        return compute_costs(cfg, roles, context, mtp_layers=mtp_layers)
    mem = memory_costs(cfg, roles, mtp_layers=mtp_layers)
    comp = compute_costs(cfg, roles, context, mtp_layers=mtp_layers)
    tm = sum(mem.costs) + mem.first_stage_extra + mem.last_stage_extra
    tc = sum(comp.costs) + comp.first_stage_extra + comp.last_stage_extra
    costs = tuple(a / tm + b / tc for a, b in zip(mem.costs, comp.costs))
    return LayerCosts("balanced", "share of weights + share of FLOPs", costs,
                      mem.first_stage_extra / tm + comp.first_stage_extra / tc,
                      mem.last_stage_extra / tm + comp.last_stage_extra / tc)
