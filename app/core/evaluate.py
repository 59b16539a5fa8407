"""A plan, evaluated once: the only place a verdict is made.

Data flows one way: :class:`~app.core.plan.Plan` -> its engine (:func:`app.core.engines.engine_for`:
roles, stages, acceptance, the boundary rule) -> when the plan states its parallelism, the engine's
judgement (parallel constraints, memory per pipeline rank) -> :class:`~app.core.verdict.Verdict`.
Roles and stages are computed once here and handed to every report (``app.core.reports``), the
page and the receipt; nothing downstream re-derives them.

**What is judged** is one rule, :attr:`Plan.given_parallelism`: memory, the GPU count and the
parallel constraints join the verdict exactly when the plan states its parallelism (a launcher,
``--parallel``, or any parallel / memory setting). Every command, route and the page call
:func:`evaluate`, so they judge the same things; :attr:`Evaluation.not_judged` says what was left
out and how to add it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.engines import Engine, EngineInputError, Judgement, LayoutCheck, engine_for
from app.core.layout.boundary import Violation
from app.core.layout.stages import LayoutInputError, PlanError, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import PatternError
from app.core.plan import TABLE, FieldProblem, Plan
from app.core.verdict import Reason, Verdict, ranges, verdict_of

#: model-shape plan fields compared with the config (a launcher's ``--num-layers`` and friends): the
#: engine builds the model from these flags, so a value other than the checkpoint's cannot load it
SHAPE_FIELDS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
                "num_attention_heads": "num_attention_heads", "num_experts": "n_routed_experts",
                "moe_ffn_hidden_size": "moe_intermediate_size",
                # MLA (Megatron's --q-lora-rank ... --v-head-dim, megatron/training/arguments.py:3546-3557)
                "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_head_dim": "qk_nope_head_dim",
                "qk_pos_emb_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim"}

#: shared starts a boundary reason spells out (the stage list names every one)
SHOWN_STARTS = 8

NOT_JUDGED = ("memory, the GPU count and the parallel constraints are not judged: the plan states no "
              "parallelism; give its parallel settings (tp, cp, ep, dp or gpus, gpu ...) or parallel=1 "
              "(--parallel)")


@dataclass
class Evaluation:
    plan: Plan
    cfg: ModelConfig
    engine: Engine
    check: LayoutCheck | None = None
    conversion: LayoutCheck | None = None
    judgement: Judgement = field(default_factory=Judgement)
    problems: list[FieldProblem] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def judged(self) -> bool:
        """Whether memory, GPUs and parallel constraints are part of the verdict (the one rule): the
        plan states its parallelism, or its engine judges memory for every plan (serving)."""
        return self.engine.judges_parallelism and (self.plan.given_parallelism or self.engine.judges_memory_always)

    @property
    def not_judged(self) -> str | None:
        return NOT_JUDGED if self.engine.judges_parallelism and not self.judged else None

    @property
    def stage_plan(self) -> StagePlan | None:
        return self.check.plan if self.check is not None else None

    # the judgement's parts, by name
    @property
    def par(self) -> Any:
        return self.judgement.parallel

    @property
    def checks(self) -> list[Any]:
        return self.judgement.checks

    @property
    def memory(self) -> dict[str, Any] | None:
        return self.judgement.memory

    @property
    def serving_memory(self) -> dict[str, Any] | None:
        return self.judgement.serving_memory

    @property
    def stage_flops(self) -> dict[str, Any] | None:
        return self.judgement.stage_flops

    @property
    def time(self) -> dict[str, Any] | None:
        """How fast the plan trains (step time, tokens/s/GPU, MFU, breakdown), when judged."""
        return self.judgement.time

    def timeline(self) -> dict[str, Any]:
        """The simulated schedule (recomputed on demand: it has an entry per micro-batch and stage)."""
        if self.check is None:
            return {}
        return self.engine.timeline(self.cfg, self.plan, self.check, self.judgement)

    def exports(self) -> dict[str, str]:
        """The engine's launch text for the plan (empty unless the engine accepts the layout)."""
        if self.check is None:
            return {}
        return self.engine.exports(self.cfg, self.plan, self.check, self.judgement, self.conversion)


def evaluate(plan: Plan, cfg: ModelConfig, *, extra_errors: tuple[PlanError, ...] = (),
             extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> Evaluation:
    """Evaluate ``plan`` on ``cfg``. Unusable input becomes :attr:`Evaluation.problems` (never an
    exception): the CLI and the API turn problems into exit 2 / 422, the page into field messages.
    ``extra_*``: what a launcher import found (its errors block like the engine's own)."""
    engine = engine_for(plan.engine)
    ev = Evaluation(plan, cfg, engine)
    try:
        ev.check = engine.check(cfg, plan, extra_errors=extra_errors, extra_warnings=extra_warnings, extra=extra)
    except PatternError as exc:
        ev.problems.append(FieldProblem("pattern", str(exc)))
    except (LayoutInputError, EngineInputError, ValueError) as exc:
        fld = "engine_version" if "--engine-version" in str(exc) else engine.layout_field(plan)
        ev.problems.append(FieldProblem(fld, str(exc)))
    if ev.check is not None:
        try:
            ev.conversion = engine.conversion(cfg, plan)
        except (LayoutInputError, ValueError) as exc:
            ev.problems.append(FieldProblem("conv_split" if plan.conv == "split" else "conv_pp", str(exc)))
    if ev.judged and ev.check is not None:
        ev.judgement = engine.judge(cfg, plan, ev.check)
        ev.problems += ev.judgement.problems
    ev.verdict = build_verdict(ev)
    return ev


# ----------------------------------------------------------------------------- the verdict
def _field(ev: Evaluation, fld: str | None, fallback: str) -> str:
    """A reason links to a field the engine's form shows; otherwise to the layout field."""
    return fld if fld in ev.engine.fields else fallback


def _error_reasons(ev: Evaluation, check: LayoutCheck, slot: str = "") -> list[Reason]:
    plan, engine = ev.plan, ev.engine
    where = engine.layout_field(plan) if not slot else ("conv_split" if plan.conv == "split" else "conv_pp")
    prefix = f"{slot} layout: " if slot else ""
    out = [Reason("model" if e.kind == "model" else engine.acceptance_kind, slot + e.code, prefix + e.message,
                  _field(ev, engine.field_of_flag(e.flag), where)) for e in check.errors]
    violations = check.blocking_violations
    if violations:
        out.append(Reason("boundary", slot + "shared_start", prefix + boundary_message(violations, check), where))
    return out


def boundary_message(violations: tuple[Violation, ...], check: LayoutCheck) -> str:
    """One sentence for every stage that starts on a shared layer, and what the engine does there."""
    if len(violations) == 1:
        return f"{violations[0].message}: {check.share.message}"
    stages = ranges([v.stage.index + 1 for v in violations])
    shown = ", ".join(f"{v.layer} (source {v.source_layer if v.source_layer is not None else 'none'})"
                      for v in violations[:SHOWN_STARTS])
    more = f", ... ({len(violations)} in all)" if len(violations) > SHOWN_STARTS else ""
    return (f"stages {stages} start on shared layers {shown}{more}; each start's top-k source is on an earlier "
            f"stage: {check.share.message}")


def _model_reasons(ev: Evaluation) -> list[Reason]:
    out = []
    for name, attr in SHAPE_FIELDS.items():
        given, actual = getattr(ev.plan, name), getattr(ev.cfg, attr)
        if given is not None and given != actual:
            flag = next((f for f, n in ev.engine.flags.items() if n == name), TABLE[name].cli)
            out.append(Reason("model", f"{name}_mismatch", f"{flag} {given} does not match the config's {attr} "
                                                           f"{actual}", name))
    out += ev.engine.model_reasons(ev.cfg, ev.plan)
    if ev.plan.mtp_layers and ev.plan.mtp_layers > ev.cfg.num_nextn_predict_layers:
        out.append(Reason("model", "mtp_mismatch", f"--mtp-num-layers {ev.plan.mtp_layers} exceeds the config's "
                          f"num_nextn_predict_layers {ev.cfg.num_nextn_predict_layers}: the checkpoint has no weights "
                          "for the extra MTP layers", "mtp_layers"))
    return out


def language_model_only(multimodal: str) -> str:
    """What a plan of a multimodal file's language model leaves out, said once with every verdict."""
    return (f"this {multimodal} config is multimodal: isplan plans its language model (text_config); the vision "
            "encoder and projector are not counted in parameters, memory, FLOPs or step time (Megatron's "
            "multimodal models run them on the first pipeline stage, which needs more than shown)")


def build_verdict(ev: Evaluation) -> Verdict:
    """Every blocking reason of the evaluated plan, each with its kind and a field the page shows."""
    blocking: list[Reason] = []
    warnings: list[Reason] = []
    if ev.check is not None:
        blocking += _error_reasons(ev, ev.check)
        warnings += [Reason(ev.engine.acceptance_kind, "warning", w) for w in ev.check.warnings]
    if ev.conversion is not None:
        blocking += _error_reasons(ev, ev.conversion, "conversion_")
    blocking += _model_reasons(ev)
    fallback = ev.engine.layout_field(ev.plan)
    blocking += [Reason(r.kind, r.code, r.message, _field(ev, r.field, fallback)) for r in ev.judgement.blocking]
    warnings += ev.judgement.warnings
    if ev.cfg.multimodal:
        warnings.append(Reason("model", "language_model_only", language_model_only(ev.cfg.multimodal)))
    return verdict_of(blocking, warnings, judged=("layout", "parallelism", "memory") if ev.judged else ("layout",))
