"""MaxText's circular pipeline: which layers each (stage, repeat) holds, and MaxText's own checks.

Read from AI-Hypercomputer/maxtext at commit e591f30cbbf217ed67ef71263ec0538239f9c3b8 (2026-08-22)
(re-implemented, never copied):

* ``src/maxtext/configs/types.py`` (lines 3565-3624) and ``configs/base.yml``: ``num_stages =
  ici_pipeline_parallelism * dcn_pipeline_parallelism``; pipelining is on when either is > 1
  (``using_pipeline_parallelism``, line 3572), and only then are the settings below derived and
  asserted. Without it ``decoders.py`` (line 894) runs every decoder layer in order on every device:
  one stage, no (stage, repeat) boundary, none of the pipeline settings read.
  ``pipeline_parallel_layers`` -1 means the MoE layers (``num_decoder_layers -
  first_num_dense_layers``) for the DeepSeek decoder block, else all decoder layers.
  ``num_pipeline_repeats`` -1 is derived as ``pipeline_parallel_layers / (num_stages *
  num_layers_per_pipeline_stage)`` and must divide exactly; then ``num_stages * repeats * Lps``
  must equal ``pipeline_parallel_layers``. ``num_pipeline_microbatches`` -1 becomes
  ``num_stages`` (``2 * num_stages`` with ``pipeline_delay_activation_forwarding``); it must be
  positive, divisible by ``num_stages``, divide the per-step batch, and be at least
  ``2 * num_stages`` with the delay. Each failure is an ``assert`` with the message quoted in
  :func:`maxtext_plan`'s errors.
* ``src/maxtext/layers/pipeline.py`` (``get_microbatch_and_repeat_ids``, ``get_current_stage_weights``):
  weights are laid out ``[repeat, stage, layer-in-stage]``; a microbatch passes stages 0 .. S-1 of
  repeat 0, then of repeat 1, and so on, and only the activations ``y`` move between stages.
  So stage ``s`` of repeat ``r`` holds the pipelined layers ``g0 + r*S*Lps + s*Lps + [0, Lps)``.
* ``src/maxtext/layers/decoders.py`` (lines 900-945): with the DeepSeek block the dense layers and
  the MoE layers beyond ``pipeline_parallel_layers`` run *before* the pipeline (``g0 =
  num_decoder_layers - pipeline_parallel_layers``); other blocks pipeline from layer 0 and run the
  remaining layers *after* it.

Upstream MaxText has no index-share support (no ``index_share_pattern`` under ``src/``). The GLM-5.2
PR described in seed 002 (closed) hard-coded ``index_share_pattern="FSSS"`` from layer 0. Since
only activations cross a stage, every (stage, repeat) must start on a full layer of the roles
MaxText itself runs: the pattern when one is given, else the checkpoint's ``indexer_types``. A
pattern that disagrees with the checkpoint is an error listing every differing layer (the
shared layers' indexer weights are pruned at conversion, so MaxText would run the wrong roles).
Not modelled: whether top-k survives between the separate dense / MoE scans outside the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any

from app.core.engines.base import Engine, LaunchSyntax, LayoutCheck, with_caller_parts
from app.core.engines.rules import EngineInputError, ShareBehaviour
from app.core.layout.boundary import BoundaryReport, validate_boundaries
from app.core.layout.stages import PipelineSpec, PlanError, Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import TRANSFORMERS_RULE, PatternError, RoleMap, derive_roles
from app.core.plan import Plan

ENGINE = "maxtext"
SOURCE = "AI-Hypercomputer/maxtext @ e591f30cbbf2: src/maxtext/configs/types.py, src/maxtext/layers/pipeline.py"
DECODER_BLOCKS = ("deepseek", "other")
MAX_VALUE = 1 << 20


@dataclass(frozen=True)
class MaxTextPipeline:
    """The MaxText config keys that shape the pipeline (``-1`` = MaxText derives the value)."""

    ici_pipeline_parallelism: int = 1
    dcn_pipeline_parallelism: int = 1
    num_layers_per_pipeline_stage: int = 1
    num_pipeline_repeats: int = -1
    pipeline_parallel_layers: int = -1
    num_pipeline_microbatches: int = -1
    pipeline_delay_activation_forwarding: bool = False
    micro_batch_size_to_train_on: int = 0
    decoder_block: str = "deepseek"
    first_num_dense_layers: int | None = None  # None: the config's first_k_dense_replace

    @property
    def num_stages(self) -> int:
        """MaxText's ``num_stages``: ICI x DCN pipeline parallelism."""
        return self.ici_pipeline_parallelism * self.dcn_pipeline_parallelism

    @property
    def pipelined(self) -> bool:
        """MaxText's ``using_pipeline_parallelism``: more than one pipeline stage."""
        return self.num_stages > 1

    def overrides(self) -> list[str]:
        """``key=value`` command-line overrides for the values the user set."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("decoder_block", "first_num_dense_layers") or value == f.default:
                continue
            out.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
        return out


@dataclass(frozen=True)
class MaxTextLayout:
    num_stages: int
    repeats: int
    layers_per_stage: int
    pipelined_layers: int
    first_pipelined: int  # 1-based
    microbatches: int
    outside: tuple[int, int] | None  # 1-based inclusive range of layers run outside the pipeline

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_stages": self.num_stages, "num_pipeline_repeats": self.repeats,
            "num_layers_per_pipeline_stage": self.layers_per_stage,
            "pipeline_parallel_layers": self.pipelined_layers, "first_pipelined_layer": self.first_pipelined,
            "num_pipeline_microbatches": self.microbatches,
            "layers_outside_pipeline": list(self.outside) if self.outside else None,
        }


def _whole(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > MAX_VALUE:
        raise EngineInputError(f"{name} must be a whole number from {minimum} to {MAX_VALUE}, got {value!r}")
    return value


def _validate(p: MaxTextPipeline) -> None:
    for name in ("ici_pipeline_parallelism", "dcn_pipeline_parallelism", "num_layers_per_pipeline_stage"):
        _whole(getattr(p, name), name, 1)
    for name in ("num_pipeline_repeats", "pipeline_parallel_layers", "num_pipeline_microbatches"):
        _whole(getattr(p, name), name, -1)
    _whole(p.micro_batch_size_to_train_on, "micro_batch_size_to_train_on", 0)
    if p.decoder_block not in DECODER_BLOCKS:
        raise EngineInputError(f"decoder_block must be one of {', '.join(DECODER_BLOCKS)}, got {p.decoder_block!r}")


def _layout(cfg: ModelConfig, p: MaxTextPipeline, errors: list[PlanError]) -> MaxTextLayout | None:
    n = cfg.num_hidden_layers
    dense = cfg.first_k_dense_replace if p.first_num_dense_layers is None else p.first_num_dense_layers
    deepseek = p.decoder_block == "deepseek"
    ppl = p.pipeline_parallel_layers
    if ppl == -1:
        ppl = n - dense if deepseek else n
    limit = n - dense if deepseek else n
    if not 0 < ppl <= limit:
        errors.append(PlanError("pipeline_parallel_layers", (
            f"pipeline_parallel_layers {ppl} must be between 1 and {limit} (the "
            + ("MoE layers: num_decoder_layers - first_num_dense_layers" if deepseek else "decoder layers")
            + ")"), "pipeline_parallel_layers"))
        return None
    s, lps = p.num_stages, p.num_layers_per_pipeline_stage
    repeats = p.num_pipeline_repeats
    if repeats == -1:
        repeats, remainder = divmod(ppl, s * lps)
        if remainder:
            errors.append(PlanError("repeats_divisibility", (
                f"The number of layers per stage ({lps}) times the number of stages ({s}) must divide the "
                f"number of pipeline_parallel_layers which defaults to decoder layers ({ppl})"),
                "num_layers_per_pipeline_stage"))
            return None
    if s * repeats * lps != ppl:
        errors.append(PlanError("pipeline_product", (
            f"The product of pipeline stages ({s}), repeats ({repeats}), and layers per stage ({lps}) must be "
            f"equal to pipeline_parallel_layers which defaults to decoder layers ({ppl})"), "num_pipeline_repeats"))
        return None
    micro = p.num_pipeline_microbatches
    if micro == -1:
        micro = 2 * s if p.pipeline_delay_activation_forwarding else s
    _microbatch_errors(p, s, micro, errors)
    first = n - ppl + 1 if deepseek else 1
    outside = None
    if ppl < n:
        outside = (1, n - ppl) if deepseek else (ppl + 1, n)
    return MaxTextLayout(s, repeats, lps, ppl, first, micro, outside)


def _microbatch_errors(p: MaxTextPipeline, s: int, micro: int, errors: list[PlanError]) -> None:
    flag = "num_pipeline_microbatches"
    if micro <= 0:
        errors.append(PlanError("microbatches_positive", "num_pipeline_microbatches must be positive", flag))
        return
    if micro % s:
        errors.append(PlanError("microbatches_divisibility", (
            f"The number of microbatches ({micro}) must be divisible by the number of stages ({s})"), flag))
    b = p.micro_batch_size_to_train_on
    if b > 0 and b % micro:
        errors.append(PlanError("microbatch_size", (
            f"The batch size for a single forward pass ({b}) must be divisible by the number of microbatches "
            f"({micro})"), flag))
    if p.pipeline_delay_activation_forwarding and micro < 2 * s:
        errors.append(PlanError("delay_microbatches", (
            f"Delayed activation forwarding requires at least 2 * num_stages microbatches, but {s} stages are "
            f"used with {micro} microbatches"), flag))


def maxtext_plan(cfg: ModelConfig, pipeline: MaxTextPipeline) -> tuple[StagePlan, MaxTextLayout | None]:
    """The (stage, repeat) blocks MaxText pipelines, as a :class:`StagePlan` (``pp_rank`` = stage,
    ``vp_stage`` = repeat, vp-major order), and the resolved layout. MaxText's config assertions
    are ``errors``; the stages are empty when the config would not start."""
    _validate(pipeline)
    if not pipeline.pipelined:   # every layer on every device, in order: one stage (module docstring)
        n = cfg.num_hidden_layers
        one = Stage(0, 0, 0, 1, n, n)
        return StagePlan(1, 1, n, 0, (one,), (), PipelineSpec(pp=1, vpp=1, split=(n,))), None
    errors: list[PlanError] = []
    layout = _layout(cfg, pipeline, errors)
    stages: list[Stage] = []
    if layout is not None:
        s, lps = layout.num_stages, layout.layers_per_stage
        for r in range(layout.repeats):
            for st in range(s):
                first = layout.first_pipelined + r * s * lps + st * lps
                stages.append(Stage(r * s + st, st, r, first, first + lps - 1, lps))
    pp = layout.num_stages if layout else pipeline.num_stages
    vpp = layout.repeats if layout else 1
    spec = PipelineSpec(pp=pp, vpp=vpp, split=tuple(x.num_layers for x in stages) or None)
    return StagePlan(pp, vpp, cfg.num_hidden_layers, 0, tuple(stages), tuple(errors), spec), layout


def maxtext_roles(cfg: ModelConfig, index_share_pattern: str | None = None) -> tuple[RoleMap, list[int]]:
    """Roles MaxText runs: ``index_share_pattern`` (F/S letters repeated from layer 1, i.e. MaxText's
    layer 0) when given, else the checkpoint's; and every 1-based layer where the pattern and the
    checkpoint's ``indexer_types`` (or its freq/offset rule) disagree."""
    if index_share_pattern is None:
        return derive_roles(cfg, TRANSFORMERS_RULE), []
    try:
        roles = derive_roles(cfg, TRANSFORMERS_RULE, pattern=index_share_pattern)
    except PatternError as exc:
        raise PatternError(str(exc).replace("--pattern", "index_share_pattern")) from None
    return roles, list(roles.pattern_differences or ())


#: only activations cross a MaxText stage (``pipeline.py``): a (stage, repeat) that starts on a shared
#: layer has no top-k from its source, so the index-share port cannot run it
MAXTEXT_SHARED_START = ShareBehaviour(
    "no_source", True, "MaxText passes only the activations between pipeline stages; a (stage, repeat) that "
    "starts on a shared layer has no top-k from its source layer. Choose num_layers_per_pipeline_stage and "
    "pipeline_parallel_layers so every stage of every repeat starts on a full layer", SOURCE)


@dataclass(frozen=True)
class MaxTextCheck(LayoutCheck):
    model: ModelConfig
    pipeline: MaxTextPipeline
    pattern: str | None
    layout: MaxTextLayout | None
    roles: RoleMap
    plan: StagePlan
    boundary: BoundaryReport
    differences: tuple[int, ...]
    errors: tuple[PlanError, ...]
    warnings: tuple[str, ...] = field(default=())
    #: what the caller adds to the JSON (a launcher import's report, ``launcher``)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def unit(self) -> str:
        return "stage of every repeat"

    @property
    def layout_text(self) -> str:
        return " ".join(self.pipeline.overrides()) if self.pipeline.pipelined else "no pipelining"

    @property
    def share(self) -> ShareBehaviour:
        return MAXTEXT_SHARED_START

    def text_lines(self) -> list[str]:
        """``stage k: a-b (role)`` lines per (stage, repeat), then the verdict."""
        body = self.to_json()
        lines = [f"model {body['model']['id']}, engine maxtext, {body['pp']} stage(s) x {body['vpp']} repeat(s)"]
        lines += [f"warning: {w}" for w in body["warnings"]]
        lines += [f"stage {r['stage']} (stage {r['pp_rank']}, repeat {r['vp_stage']}): {r['first_layer']}-"
                  f"{r['last_layer']} ({r['start_role']})" for r in body["stages"] if r["num_layers"]]
        lines += [f"INVALID: {e['message']}" for e in body["errors"]]
        lines += [f"INVALID: {v['message']}" for v in body["violations"]]
        if body["valid"]:
            lines.append("VALID: " + self.boundary_holds())
        return lines

    def to_json(self) -> dict[str, Any]:
        stages = []
        for rec in self.boundary.records:
            d = rec.to_dict()
            d["stage_index"], d["repeat"] = rec.stage.pp_rank, rec.stage.vp_stage
            stages.append(d)
        return {
            "valid": self.valid,
            "engine": ENGINE,
            "model": self.model.summary(),
            "pp": self.plan.pp,
            "vpp": self.plan.vpp,
            "layout": self.layout.to_dict() if self.layout else None,
            "config_overrides": self.pipeline.overrides(),
            "index_share_pattern": self.pattern,
            "roles_rule": self.roles.rule,
            "pattern_differences": list(self.differences),
            "stages": stages,
            "violations": [v.to_dict() for v in self.boundary.violations],
            "errors": [e.to_dict() for e in self.errors],
            "warnings": list(self.warnings),
            "source": SOURCE,
            **self.extra,
        }


def maxtext_check(cfg: ModelConfig, pipeline: MaxTextPipeline,
                  index_share_pattern: str | None = None) -> MaxTextCheck:
    """MaxText's config checks, the pattern-vs-checkpoint comparison and the stage-start rule."""
    plan, layout = maxtext_plan(cfg, pipeline)
    roles, diffs = maxtext_roles(cfg, index_share_pattern)
    boundary = validate_boundaries(plan, roles)
    errors = [PlanError(e.code, e.message, None) for e in roles.errors] + list(plan.errors)
    if diffs:
        base = "indexer_types" if cfg.indexer_types is not None else "the config's index roles"
        errors.append(PlanError("pattern_mismatch", (
            f"index_share_pattern {index_share_pattern!r} disagrees with the checkpoint's {base} on "
            f"{len(diffs)} of {cfg.num_hidden_layers} layers: {', '.join(map(str, diffs))} (1-based); MaxText "
            "would run the indexer on layers whose weights the checkpoint does not have, or skip it where it "
            "does"), "index_share_pattern", kind="model"))
    warnings = []
    if layout is not None and layout.outside and pipeline.decoder_block == "other":
        start = layout.outside[0]
        if roles.role(start).role != "full":
            errors.append(PlanError("after_pipeline_start", (
                f"layer {start}, the first layer run after the pipeline, is shared; only activations leave the "
                "pipeline, so its top-k source is lost"), "pipeline_parallel_layers"))
    if not pipeline.pipelined:
        warnings.append("ici_pipeline_parallelism x dcn_pipeline_parallelism is 1: MaxText does not pipeline "
                        "(using_pipeline_parallelism is false), so every decoder layer runs in order on every "
                        "device and no stage boundary exists; the other pipeline settings are not read")
    if not plan.stages and not errors:
        errors.append(PlanError("no_stages", "the pipeline description produced no stages"))
    return MaxTextCheck(cfg, pipeline, index_share_pattern, layout, roles, plan, boundary, tuple(diffs),
                        tuple(errors), tuple(warnings))


#: MaxText's config keys (its messages name them) -> plan fields
MAXTEXT_FLAGS = {"index_share_pattern": "pattern", "pipeline_parallel_layers": "pipeline_parallel_layers",
                 "num_layers_per_pipeline_stage": "layers_per_pipeline_stage",
                 "ici_pipeline_parallelism": "ici_pipeline_parallelism",
                 "dcn_pipeline_parallelism": "dcn_pipeline_parallelism", "num_pipeline_repeats": "num_pipeline_repeats",
                 "num_pipeline_microbatches": "num_microbatches"}


class MaxTextEngine(Engine):
    """MaxText's circular pipeline (the rules above) behind the engine protocol."""

    name = ENGINE
    label = "MaxText"
    acceptance_kind = "maxtext"
    source = SOURCE
    fields = frozenset({"model", "engine", "pattern", *MAXTEXT_FLAGS.values()})
    judges_parallelism = False   # MaxText's sharding and memory are not modelled: the layout is the verdict
    flags = MAXTEXT_FLAGS
    #: ``python3 -m maxtext.trainers.pre_train.train CONFIG.yml key=value ...`` (``pyconfig.py``
    #: ``_CONFIG_FILE_MAPPING`` @ e591f30c), or the ``MaxText.train`` module / ``MaxText/train.py``
    #: script of builds before 2026-04-08 (commit 868098b8 removed those shims); ``M_<KEY>``
    #: environment variables override a key (``pyconfig.yaml_key_to_env_key``)
    launch = LaunchSyntax(
        modules=("maxtext.trainers.pre_train.train", "maxtext.trainers.pre_train.train_compile", "MaxText.train",
                 "MaxText.train_compile"),
        scripts=("maxtext/trainers/pre_train/train.py", "maxtext/trainers/pre_train/train_compile.py",
                 "MaxText/train.py", "MaxText/train_compile.py"),
        env_prefix="M_")

    def layout_field(self, plan: Plan) -> str:
        return "layers_per_pipeline_stage"

    def gpu_line(self, plan: Plan, check: LayoutCheck | None) -> str | None:
        """MaxText's mesh (its data, FSDP, tensor and expert axes) is not modelled: only the pipeline's stages."""
        return (f"GPU count not judged: MaxText's mesh (data, FSDP, tensor, expert axes) is not modelled; "
                f"the pipeline has ICI {plan.ici_pipeline_parallelism} × DCN {plan.dcn_pipeline_parallelism} = "
                f"{self.pipeline(plan).num_stages} stage(s)")

    @staticmethod
    def pipeline(plan: Plan) -> MaxTextPipeline:
        return MaxTextPipeline(
            ici_pipeline_parallelism=plan.ici_pipeline_parallelism,
            dcn_pipeline_parallelism=plan.dcn_pipeline_parallelism,
            num_layers_per_pipeline_stage=plan.layers_per_pipeline_stage,
            num_pipeline_repeats=plan.num_pipeline_repeats or -1,
            pipeline_parallel_layers=plan.pipeline_parallel_layers or -1,
            num_pipeline_microbatches=plan.num_microbatches or -1)

    def roles(self, cfg: ModelConfig, plan: Plan) -> tuple[RoleMap, list[int]]:
        return maxtext_roles(cfg, plan.pattern)

    def check(self, cfg: ModelConfig, plan: Plan, *, extra_errors: tuple[PlanError, ...] = (),
              extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> MaxTextCheck:
        return with_caller_parts(maxtext_check(cfg, self.pipeline(plan), plan.pattern), extra_errors, extra_warnings,
                                 extra)

    def profile(self, cfg: ModelConfig, plan: Plan) -> Plan:
        """The valid pipeline with the most stages (up to 8), then the fewest repeats, then the most
        pipelined layers; no pipelining (one stage) when none is valid."""
        return _profile(cfg, plan.model)


@lru_cache(maxsize=64)
def _profile(cfg: ModelConfig, model: str) -> Plan:
    base = Plan(model=model, engine=ENGINE)
    n = cfg.num_hidden_layers
    for stages in (8, 4, 2):
        valid = []
        for ppl in range(n, stages - 1, -1):
            for lps in range(ppl // stages, 0, -1):   # the most layers per stage: the fewest repeats
                if ppl % (stages * lps):
                    continue
                pipe = MaxTextPipeline(ici_pipeline_parallelism=stages, num_layers_per_pipeline_stage=lps,
                                       pipeline_parallel_layers=ppl)
                try:
                    if maxtext_check(cfg, pipe).valid:
                        valid.append((ppl // (stages * lps), -ppl, lps, ppl))
                        break
                except ValueError:
                    continue
        if valid:
            _, _, lps, ppl = min(valid)
            default = n - cfg.first_k_dense_replace   # MaxText's default for the DeepSeek block: the MoE layers
            return replace(base, ici_pipeline_parallelism=stages, layers_per_pipeline_stage=lps,
                           pipeline_parallel_layers=ppl if ppl != default else None)
    return base


ENGINE_OBJECT = MaxTextEngine()
