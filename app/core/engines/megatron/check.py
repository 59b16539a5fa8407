"""The release-gate check: config + engine semantics + pipeline spec -> one verdict.

This is what ``isplan check`` prints, what receipts record per named layout, and what the
dashboard's plan view shows. It composes the other core modules and adds no rules of its own
beyond collecting their findings and failing closed.

Roles for the verdict: with engine ``megatron`` or ``slime`` the boundary check uses the roles the
engine *builds* - from the freq/offset overrides (``--dsa-indexer-topk-freq`` /
``--dsa-indexer-skip-topk-offset``), else the config's ``index_topk_freq`` /
``index_skip_topk_offset`` - because neither engine reads ``indexer_types``
(NVIDIA/Megatron-LM ``megatron/core/transformer/experimental_attention_variant/dsa.py:
DSAttention.__init__``; THUDM/slime ``slime_plugins/models/glm5/glm5.py``). Every layer where
those roles differ from the checkpoint's declared roles is a blocking ``model`` error
(``roles_disagree_checkpoint``): a full layer the engine builds would find no indexer weights to
load, a shared one would leave the checkpoint's indexer weights unused. (Read at NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553 and THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from app.core.engines.base import LayoutCheck
from app.core.engines.megatron.hybrid_placement import hybrid_flags, materialise_hybrid
from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.engines.rules import ShareBehaviour
from app.core.layout.boundary import BoundaryReport, validate_boundaries
from app.core.layout.stages import PipelineSpec, PlanError, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import (
    TRANSFORMERS_RULE,
    RoleMap,
    RoleRule,
    checkpoint_disagreements,
    config_declared_roles,
    derive_roles,
    describe_disagreements,
    role_disagreements,
)

#: Megatron at a stage that starts on a shared layer: the model build refuses the split
#: (NVIDIA/Megatron-LM ``megatron/core/models/gpt/experimental_attention_variant_module_specs.py``:
#: ``_validate_dsa_index_share_pipeline_split`` raises RuntimeError "DSA index-share pipeline split is
#: invalid: ... Choose a pipeline layout where each stage starts on a computing layer").
MEGATRON_SHARED_START = ShareBehaviour(
    "crash", True, "Megatron refuses the split at model build (RuntimeError: DSA index-share pipeline split is "
    "invalid); choose a layout where each stage starts on a computing layer",
    "NVIDIA/Megatron-LM megatron/core/models/gpt/experimental_attention_variant_module_specs.py "
    "_validate_dsa_index_share_pipeline_split @ d98e8a64")


@dataclass(frozen=True)
class CheckResult(LayoutCheck):
    """Megatron's check of one layout (the megatron, slime and hf engines)."""

    model: ModelConfig
    engine: str
    pattern: str | None
    spec: PipelineSpec
    roles: RoleMap
    plan: StagePlan
    boundary: BoundaryReport
    errors: tuple[PlanError, ...]
    warnings: tuple[str, ...]
    megatron_flags: tuple[str, ...]
    layout_string: str
    extra: dict[str, Any] = field(default_factory=dict)
    checkpoint_roles: RoleMap | None = None   # the checkpoint's roles when they are not ``roles``
    shared_start: ShareBehaviour = field(default_factory=lambda: MEGATRON_SHARED_START)

    @property
    def share(self) -> ShareBehaviour:
        return self.shared_start

    @property
    def layout_text(self) -> str:
        return self.layout_string

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "model": {
                "id": self.model.id,
                "sha256": self.model.sha256,
                "canonical_sha256": self.model.canonical_sha256,
                "num_layers": self.model.num_hidden_layers,
                "mtp_layers": self.plan.mtp_layers,
                "provenance": self.model.provenance,
            },
            "engine": self.engine,
            "roles_rule": self.roles.rule,
            "roles_built_by_engine": self.checkpoint_roles is not None,
            "pattern": self.pattern,
            "pp": self.plan.pp,
            "vpp": self.plan.vpp,
            "inputs": self.spec.to_dict(),
            "stages": [r.to_dict() for r in self.boundary.records],
            "violations": [v.to_dict() for v in self.boundary.violations],
            "errors": [e.to_dict() for e in self.errors],
            "warnings": list(self.warnings),
            "megatron_flags": list(self.megatron_flags),
            "layout_string": self.layout_string,
            **self.extra,
        }

    def text_lines(self) -> list[str]:
        """The seed checker's style: one ``stage k: a-b (role)`` line per stage, then a verdict."""
        lines = [
            f"model {self.model.id} ({self.model.num_hidden_layers} layers, sha256 {self.model.sha256[:12]}), "
            f"engine {self.engine}, PP {self.plan.pp}"
            + (f" x VPP {self.plan.vpp}" if self.plan.vpp > 1 else "")
        ]
        for w in self.warnings:
            lines.append(f"warning: {w}")
        for r in self.boundary.records:
            s = r.stage
            where = f" (pp rank {s.pp_rank}, vp stage {s.vp_stage})" if self.plan.vpp > 1 else ""
            extras = ", ".join(
                x for x in (
                    "embedding" if s.embedding else "",
                    f"MTP x{s.mtp_layers}" if s.mtp_layers else "",
                    "loss" if s.loss else "",
                ) if x
            )
            if s.num_layers == 0:
                lines.append(f"stage {s.index + 1}{where}: no decoder layers" + (f" [{extras}]" if extras else ""))
            else:
                lines.append(
                    f"stage {s.index + 1}{where}: {s.first_layer}-{s.last_layer} ({r.start_role})"
                    + (f" [{extras}]" if extras else "")
                )
        for e in self.errors:
            lines.append(f"INVALID: {e.message}")
        for v in self.boundary.violations:
            lines.append(f"INVALID: {v.short}")
        if self.valid:
            lines.append("VALID: " + self.boundary_holds())
        if self.megatron_flags:
            lines.append("megatron flags: " + " ".join(_quote(a) for a in self.megatron_flags))
        return lines


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in "|*(), ") else arg


def run_check(
    cfg: ModelConfig,
    spec: PipelineSpec,
    engine: RoleRule | str = "megatron",
    *,
    rules: tuple[RoleRule, ...] = (),
    pattern: str | None = None,
    freq: int | None = None,
    offset: int | None = None,
    extra_errors: tuple[PlanError, ...] = (),
    extra_warnings: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
    shared_start: ShareBehaviour = MEGATRON_SHARED_START,
) -> CheckResult:
    """Materialise ``spec`` over ``cfg`` with Megatron's placement and validate every stage start
    under the ``engine``'s role rule (a :class:`RoleRule`, or an engine's name; fails closed). ``rules``: every engine's rule, for the
    warning that the checkpoint's array and this engine's rule disagree.

    Raises :class:`app.core.layout.stages.LayoutInputError` / :class:`app.core.model.roles.PatternError`
    for unusable input; every rule violation is returned in the result instead.
    """
    if not extra_errors and not extra_warnings and extra is None:
        return _plain_check(cfg, spec, engine, rules, pattern, freq, offset, shared_start)
    return _run_check(cfg, spec, engine, rules, pattern, freq, offset, extra_errors, extra_warnings, extra,
                      shared_start)


@lru_cache(maxsize=128)
def _plain_check(cfg: ModelConfig, spec: PipelineSpec, engine: RoleRule | str, rules: tuple[RoleRule, ...],
                 pattern: str | None, freq: int | None, offset: int | None, shared_start: ShareBehaviour
                 ) -> CheckResult:
    """:func:`run_check` without a launcher's findings, kept by its inputs (a check reads nothing
    else): the conversion slot's check is the same on every live update of a drag, and a layout the
    drag returns to is checked once. The result is immutable (its ``extra`` is an empty dict no
    reader writes)."""
    return _run_check(cfg, spec, engine, rules, pattern, freq, offset, (), (), None, shared_start)


def _run_check(cfg: ModelConfig, spec: PipelineSpec, engine: RoleRule | str, rules: tuple[RoleRule, ...],
               pattern: str | None, freq: int | None, offset: int | None, extra_errors: tuple[PlanError, ...],
               extra_warnings: tuple[str, ...], extra: dict[str, Any] | None, shared_start: ShareBehaviour
               ) -> CheckResult:
    rule = engine
    if isinstance(rule, str):   # an engine's name: its rule, from the registry
        from app.core.engines import engine_for, role_rules

        rule, rules = engine_for(rule).role_rule or TRANSFORMERS_RULE, rules or role_rules()
    hybrid = cfg.hybrid_pattern   # a hybrid model is pipelined by its --hybrid-layer-pattern
    plan = (materialise_hybrid(spec, hybrid) if hybrid is not None
            else materialise(spec, cfg.num_hidden_layers, default_mtp=cfg.num_nextn_predict_layers))
    roles, checkpoint, mismatch = engine_roles(cfg, rule, pattern, freq, offset, plan.mtp_layers)
    boundary = validate_boundaries(plan, roles)
    errors = list(extra_errors)
    errors += [PlanError(e.code, e.message, None, kind="model") for e in roles.errors]
    errors += mismatch
    errors += list(plan.errors)
    if not plan.stages and not errors:
        errors.append(PlanError("no_stages", "the pipeline description produced no stages"))
    warnings = list(extra_warnings)
    if pattern is None and checkpoint is None:
        for d in role_disagreements(cfg, rules or (rule,), freq=freq, offset=offset):
            if d["kind"] == "array_vs_rule" and d["engine"] == rule.engine:
                warnings.append(
                    d["message"] + f"; {rule.engine} builds indexers from its freq/offset flags, so the "
                    "engine and the checkpoint would disagree on which layers own an indexer"
                )
    # flags only for a plan Megatron would accept; a boundary violation still gets them (it is the
    # engine's DSA check, not its placement, that would refuse it)
    args, layout = ([], "") if not plan.stages or plan.errors else (
        hybrid_flags(plan, hybrid) if hybrid is not None else megatron_flags(plan))
    return CheckResult(
        cfg, rule.engine, pattern, spec, roles, plan, boundary, tuple(errors), tuple(warnings),
        tuple(args), layout, extra or {}, checkpoint, shared_start,
    )


def engine_roles(
    cfg: ModelConfig, rule: RoleRule, pattern: str | None, freq: int | None, offset: int | None, mtp_layers: int
) -> tuple[RoleMap, RoleMap | None, list[PlanError]]:
    """(roles for the verdict, the checkpoint's roles when they differ in origin, blocking errors).

    Engines that read the config's array and pattern overrides use :func:`derive_roles` as is.
    Megatron and slime build from freq/offset alone; when the config declares roles
    (``indexer_types`` / ``index_topk_pattern``) each layer that differs is listed in one ``model``
    error.
    """
    declared = config_declared_roles(cfg)
    if rule.reads_declared or pattern is not None or declared is None or not cfg.has_indexer:
        return derive_roles(cfg, rule, pattern=pattern, freq=freq, offset=offset, mtp_layers=mtp_layers), None, []
    built = derive_roles(cfg, rule, freq=freq, offset=offset, mtp_layers=mtp_layers, engine_built=True)
    checkpoint = derive_roles(cfg, rule, mtp_layers=mtp_layers)
    diffs = checkpoint_disagreements(checkpoint, built)
    if not diffs:
        return built, checkpoint, []
    err = PlanError(
        "roles_disagree_checkpoint",
        f"{rule.engine} builds indexers from freq {built.freq} / offset {built.offset} ({rule.set_by}), which "
        f"disagree with the checkpoint's {declared[0]} on {len(diffs)} layer(s): {describe_disagreements(diffs)}. "
        "Use the checkpoint's freq/offset or a checkpoint converted for these roles",
        rule.flag, kind="model",
    )
    return built, checkpoint, [err]
