"""Boundary validation: every physical and virtual stage that holds decoder layers must start on a
full (index-computing) layer, because top-k indices never cross a pipeline boundary.

Rule sources: seed 000 (the release-gate preflight); NVIDIA/Megatron-LM
``megatron/core/models/gpt/experimental_attention_variant_module_specs.py:
_validate_dsa_index_share_pipeline_split`` (rejects a stage in which a shared layer's source is not
local: "DSA index-share pipeline split is invalid ... Choose a pipeline layout where each stage
starts on a computing layer"); THUDM/slime's GLM-5 provider (AssertionError at build time). Since a
shared layer's source is the nearest preceding full layer, "every shared layer finds its source in
its own stage" is the same as "every stage starts on a full layer". A stage may end on a shared
layer. MTP layers own their indexer, so they never violate the rule.

The check fails closed: a plan is valid only when the roles are sound, the plan sums to
``num_hidden_layers``, every Megatron acceptance rule holds and every start is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.layout.stages import Stage, StagePlan
from app.core.model.roles import RoleMap


@dataclass(frozen=True)
class StageRecord:
    stage: Stage
    start_role: str | None
    source_layer: int | None
    source_stage: Stage | None

    def to_dict(self) -> dict[str, Any]:
        s = self.stage
        return {
            "stage": s.index + 1,
            "pp_rank": s.pp_rank,
            "vp_stage": s.vp_stage,
            "first_layer": s.first_layer,
            "last_layer": s.last_layer,
            "num_layers": s.num_layers,
            "start_role": self.start_role,
            "source_layer": self.source_layer,
            "source_pp_rank": self.source_stage.pp_rank if self.source_stage else None,
            "source_vp_stage": self.source_stage.vp_stage if self.source_stage else None,
            "embedding": s.embedding,
            "loss": s.loss,
            "mtp_layers": s.mtp_layers,
        }


@dataclass(frozen=True)
class Violation:
    stage: Stage
    layer: int
    source_layer: int | None
    source_stage: Stage | None

    @property
    def short(self) -> str:
        """The seed checker's wording: ``stage 3 starts at shared layer 21; source is 19``."""
        src = self.source_layer if self.source_layer is not None else "none"
        return f"stage {self.stage.index + 1} starts at shared layer {self.layer}; source is {src}"

    @property
    def message(self) -> str:
        s = self.stage
        where = f"stage {s.index + 1} (pp rank {s.pp_rank}, vp stage {s.vp_stage})"
        if self.source_layer is None:
            return (
                f"{where} starts at shared layer {self.layer}, which has no full layer before it "
                "to take top-k from"
            )
        src = self.source_stage
        held = (
            f"stage {src.index + 1} (pp rank {src.pp_rank}, vp stage {src.vp_stage})" if src else "no stage"
        )
        return (
            f"{where} starts at shared layer {self.layer}; its source, full layer "
            f"{self.source_layer}, is on {held}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage.index + 1,
            "pp_rank": self.stage.pp_rank,
            "vp_stage": self.stage.vp_stage,
            "layer": self.layer,
            "source_layer": self.source_layer,
            "message": self.message,
            "short": self.short,
        }


@dataclass(frozen=True)
class BoundaryReport:
    records: tuple[StageRecord, ...]
    violations: tuple[Violation, ...]


def validate_boundaries(plan: StagePlan, roles: RoleMap) -> BoundaryReport:
    """A record for every stage and a violation for every stage that starts on a shared layer."""
    by_layer: dict[int, Stage] = {}
    for s in plan.stages:
        for layer in s.layers:
            by_layer.setdefault(layer, s)
    records: list[StageRecord] = []
    violations: list[Violation] = []
    for s in plan.stages:
        if s.num_layers == 0 or s.first_layer is None or s.first_layer > roles.num_layers:
            records.append(StageRecord(s, None, None, None))
            continue
        r = roles.role(s.first_layer)
        src_stage = by_layer.get(r.source) if r.source is not None else None
        records.append(StageRecord(s, r.role, r.source, src_stage))
        if r.role != "full":
            violations.append(Violation(s, s.first_layer, r.source, src_stage))
    return BoundaryReport(tuple(records), tuple(violations))
