"""A plan, evaluated once: roles, stages, parallel checks, memory, FLOPs and the verdict.

Data flows one way: :class:`~app.core.plan.Plan` -> pipeline spec -> :func:`run_check` (roles,
stages, acceptance, boundary) -> parallel config and checks -> memory and stage FLOPs ->
:class:`~app.core.verdict.Verdict`. Roles and stages are computed once here and handed to every
report (``app.core.reports``), the page and the receipt; nothing downstream re-derives them.

Memory and the GPU budget join the verdict whenever the plan states parallelism (``parallel``):
always on the page, on the CLI when a parallel/memory flag, ``--gpu`` or a launcher is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.engines.megatron.check import CheckResult, run_check
from app.core.layout.stages import LayoutInputError, PipelineSpec, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import Check, ParallelConfig, check_parallel
from app.core.model.roles import PatternError, RoleMap, derive_roles, parse_pattern
from app.core.plan import SERVING_ENGINES, TABLE, FieldProblem, Plan
from app.core.verdict import Reason, Verdict, verdict_of

#: plan field (URL key) of each flag an error may name: the CLI's and the engines' spellings
FLAG_FIELD: dict[str, str] = {}
for _name, _spec in TABLE.items():
    for _flag in ((_spec.cli,) if _spec.cli else ()) + _spec.megatron + _spec.slime:
        FLAG_FIELD.setdefault(_flag, _spec.url)

#: MaxText's config keys (its error messages name them)
FLAG_FIELD.update({"index_share_pattern": "pattern", "pipeline_parallel_layers": "pipeline_layers",
                   "num_layers_per_pipeline_stage": "lps", "ici_pipeline_parallelism": "ici_pp",
                   "dcn_pipeline_parallelism": "dcn_pp", "num_pipeline_repeats": "repeats",
                   "num_pipeline_microbatches": "mb"})

#: plan field of each parallel check (``app.core.model.parallelism.check_parallel`` names)
CHECK_FIELD = {
    "world_size": "gpus", "heads_tp": "tp", "kv_heads_tp": "tp", "ffn_width": "tp", "experts_ep": "ep", "expert_grid": "ep",
    "expert_data_parallel": "ep", "cp_seq": "cp", "dsa_cp": "cp", "sp_tp": "sp", "sp_moe_tp": "sp",
    "mtp_cp": "mtp", "interleave_pp": "vpp", "pipeline_plan": "pp", "vpp_divides": "vpp",
    "global_batch": "gbs", "microbatches": "mb", "interleave_microbatches": "mb", "pipeline_fill": "mb",
    "recompute_layers": "rnl", "cpu_offload_flags": "pao", "precision_aware_dtypes": "pao",
    "distributed_optimizer": "no_dist_opt",
}
#: checks whose failure is about the GPU budget, not a constraint between sizes
GPU_CHECKS = ("world_size",)

#: model-shape plan fields compared with the config (a launcher's ``--num-layers`` and friends):
#: Megatron builds the model from these flags, so a value other than the checkpoint's cannot load it
SHAPE_FIELDS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "heads": "num_attention_heads",
                "experts": "n_routed_experts", "moe_ffn": "moe_intermediate_size"}


@dataclass
class Evaluation:
    plan: Plan
    cfg: ModelConfig
    parallel: bool
    check: Any = None  # CheckResult (megatron, slime, hf), ServingCheck (vllm, sglang) or MaxTextCheck
    conversion: CheckResult | None = None
    par: ParallelConfig | None = None
    checks: list[Check] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    serving_memory: dict[str, Any] | None = None
    stage_flops: dict[str, Any] | None = None
    problems: list[FieldProblem] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)

    @property
    def stage_plan(self) -> StagePlan | None:
        return self.check.plan if self.check is not None else None


def layout_field(plan: Plan) -> str:
    """The field that describes the layout in the plan's mode (where a shared start is fixed)."""
    if plan.engine == "maxtext":
        return "lps"
    return {"split": "split", "layout": "layout"}.get(plan.mode, "pp")


def plan_roles(plan: Plan, cfg: ModelConfig) -> tuple[RoleMap, list[int]]:
    """The roles the plan's engine runs, and the layers where they differ from the checkpoint's
    (vLLM never reads ``indexer_types``; MaxText runs its ``index_share_pattern``)."""
    if plan.engine in SERVING_ENGINES:
        from app.core.engines.serving import engine_roles

        return engine_roles(cfg, plan.engine)
    if plan.engine == "maxtext":
        from app.core.engines.maxtext import maxtext_roles

        return maxtext_roles(cfg, plan.pattern)
    return derive_roles(cfg, plan.engine, pattern=plan.pattern, freq=plan.dsa_freq, offset=plan.dsa_offset), []


def pipeline_spec(plan: Plan) -> PipelineSpec:
    """The Megatron pipeline description of the plan's layout mode.

    In split mode PP is implied by the sizes; a PP other than the neutral 1 must agree with them.
    Without ``mtp`` no MTP layer is built: ``--mtp-num-layers`` defaults to None in Megatron and
    slime (THUDM/slime ``slime/utils/arguments.py``).
    """
    common: dict[str, Any] = {"vpp": plan.vpp, "mtp_layers": plan.mtp if plan.mtp is not None else 0,
                              "overlap_p2p": not plan.no_overlap_p2p}
    if plan.mode == "split":
        return PipelineSpec(split=plan.split or (), pp=plan.pp if plan.pp != 1 else None, **common)
    if plan.mode == "layout":
        return PipelineSpec(pp=plan.pp, layout=plan.layout or "", **common)
    return PipelineSpec(pp=plan.pp, first=plan.first, last=plan.last, layers_per_vstage=plan.layers_per_vstage,
                        account_for_embedding=plan.account_for_embedding, account_for_loss=plan.account_for_loss,
                        **common)


def conversion_spec(plan: Plan) -> PipelineSpec | None:
    mtp = plan.mtp if plan.mtp is not None else 0
    if plan.conv == "split" and plan.conv_split:
        return PipelineSpec(split=plan.conv_split, mtp_layers=mtp)
    if plan.conv == "flags" and plan.conv_pp:
        return PipelineSpec(pp=plan.conv_pp, first=plan.conv_first, last=plan.conv_last, mtp_layers=mtp)
    return None


def parallel_config(plan: Plan, stages: StagePlan) -> ParallelConfig:
    """Megatron's parallel settings for the plan (``ValueError`` names a bad combination)."""
    return ParallelConfig(
        tp=plan.tp, cp=plan.cp, pp=stages.pp, dp=plan.dp, gpus=plan.gpus, ep=plan.ep, etp=plan.etp,
        vpp=stages.vpp if stages.vpp > 1 else None, sp=plan.sp, mbs=plan.mbs, num_microbatches=plan.microbatches,
        global_batch=plan.global_batch,
        seq_length=plan.seq_length if (plan.seq_length or plan.tokens_per_gpu) else 4096,
        tokens_per_gpu=plan.tokens_per_gpu, recompute=plan.recompute, recompute_method=plan.recompute_method,
        recompute_num_layers=plan.recompute_num_layers, optimizer_cpu_offload=plan.offload,
        use_precision_aware_optimizer=plan.precision_aware, distributed_optimizer=not plan.no_distributed_optimizer,
        gpu=plan.gpu, gpu_capacity_bytes=int(plan.gpu_gb * 1e9) if plan.gpu_gb else None,
        host_memory_gb=plan.host_gb, gpus_per_node=plan.gpus_per_node,
        make_vocab_size_divisible_by=plan.vocab_divisible_by)


def _overrides(plan: Plan) -> tuple[int | None, int | None, tuple[str, ...]]:
    if plan.engine == "hf" and (plan.dsa_freq is not None or plan.dsa_offset is not None):
        return None, None, ("--dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset are Megatron flags; "
                            "the hf engine reads the config, so they are ignored",)
    return plan.dsa_freq, plan.dsa_offset, ()


def evaluate(plan: Plan, cfg: ModelConfig, *, parallel: bool = True, extra_errors: tuple[Any, ...] = (),
             extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> Evaluation:
    """Evaluate ``plan`` on ``cfg``. Unusable input becomes :attr:`Evaluation.problems` (never an
    exception): the CLI and the API turn problems into exit 2 / 422, the page into field messages."""
    ev = Evaluation(plan, cfg, parallel)
    if plan.engine in SERVING_ENGINES or plan.engine == "maxtext":
        _evaluate_other_engine(ev)
        ev.verdict = build_verdict(ev)
        return ev
    freq, offset, notes = _overrides(plan)
    pattern = plan.pattern
    if pattern is not None:  # a bad pattern is its own problem; the layout is still checked without it
        try:
            parse_pattern(pattern, cfg.num_hidden_layers)
        except PatternError as exc:
            ev.problems.append(FieldProblem("pattern", str(exc)))
            pattern = None
    try:
        ev.check = run_check(cfg, pipeline_spec(plan), plan.engine, pattern=pattern, freq=freq, offset=offset,
                             extra_errors=extra_errors, extra_warnings=extra_warnings + notes, extra=extra)
    except PatternError as exc:
        ev.problems.append(FieldProblem("pattern", str(exc)))
    except LayoutInputError as exc:
        ev.problems.append(FieldProblem(layout_field(plan), str(exc)))
    cspec = conversion_spec(plan)
    if cspec is not None and ev.check is not None:
        try:
            ev.conversion = run_check(cfg, cspec, plan.engine, pattern=pattern, freq=freq, offset=offset)
        except LayoutInputError as exc:
            ev.problems.append(FieldProblem("conv_split" if plan.conv == "split" else "conv_pp", str(exc)))
    stages = ev.stage_plan
    if parallel and stages is not None and stages.stages:
        _evaluate_parallel(ev, stages)
    ev.verdict = build_verdict(ev)
    return ev


def _evaluate_other_engine(ev: Evaluation) -> None:
    """vLLM / SGLang serving partitions and MaxText pipelines (``app.core.engines``)."""
    from app.core.engines.maxtext import MaxTextPipeline, maxtext_check
    from app.core.engines.rules import EngineInputError
    from app.core.engines.serving import serving_check

    plan = ev.plan
    try:
        if plan.engine == "maxtext":
            pipeline = MaxTextPipeline(
                ici_pipeline_parallelism=plan.ici_pp, dcn_pipeline_parallelism=plan.dcn_pp,
                num_layers_per_pipeline_stage=plan.layers_per_stage, num_pipeline_repeats=plan.repeats or -1,
                pipeline_parallel_layers=plan.pipeline_layers or -1,
                num_pipeline_microbatches=plan.microbatches or -1)
            ev.check = maxtext_check(ev.cfg, pipeline, plan.pattern)
            return
        partition = plan.split if plan.mode == "split" else None
        ev.check = serving_check(ev.cfg, plan.engine, plan.pp if partition is None else len(partition), partition,
                                 tp=plan.tp, mtp=bool(plan.mtp), version=plan.engine_version)
    except (EngineInputError, ValueError) as exc:
        ev.problems.append(FieldProblem("engine_version" if "version" in str(exc) else layout_field(plan), str(exc)))
        return
    if ev.parallel and ev.check.plan.stages:
        from app.core.model.parallelism import resolve_gpu
        from app.core.model.serving_memory import ServingMemorySettings, serving_memory

        try:
            gpu = resolve_gpu(plan.gpu, int(plan.gpu_gb * 1e9) if plan.gpu_gb else None)
            settings = ServingMemorySettings(tp=plan.tp, ep=plan.ep, weight_dtype=plan.weight_dtype,
                                             kv_dtype=plan.kv_dtype, context=plan.context,
                                             concurrency=plan.concurrency, capacity_gib=gpu.capacity_bytes / 2**30)
            ev.serving_memory = serving_memory(ev.cfg, ev.check.plan, ev.check.roles, settings).to_json()
        except ValueError as exc:
            ev.problems.append(FieldProblem("context", str(exc)))


def _evaluate_parallel(ev: Evaluation, stages: StagePlan) -> None:
    from app.core.model.flops import stage_flops
    from app.core.model.memory import training_memory

    try:
        ev.par = parallel_config(ev.plan, stages)
    except ValueError as exc:
        ev.problems.append(FieldProblem("tp", f"parallel settings: {exc}"))
        return
    assert ev.check is not None
    ev.checks = check_parallel(ev.cfg, ev.par, stages)
    if stages.errors:
        return
    try:
        ev.memory = training_memory(ev.cfg, stages, ev.par, ev.check.roles)
    except ValueError as exc:
        ev.problems.append(FieldProblem("pp", str(exc)))
    ev.stage_flops = stage_flops(ev.cfg, ev.check.roles, stages, seq_length=ev.par.sample_length, mbs=ev.par.mbs)


# ----------------------------------------------------------------------------- the verdict
def _check_reasons(check: CheckResult, plan: Plan, slot: str = "") -> list[Reason]:
    where = layout_field(plan) if not slot else ("conv_split" if plan.conv == "split" else "conv_pp")
    prefix = f"{slot} layout: " if slot else ""
    out = [Reason(getattr(e, "kind", "megatron"), slot + e.code, prefix + e.message,
                  FLAG_FIELD.get(e.flag or "", where)) for e in check.errors]
    behaviour = getattr(check, "behaviour", None)  # serving engines: what a shared start does there
    if behaviour is None or behaviour.blocking:
        tail = f": {behaviour.message}" if behaviour is not None else ""
        out += [Reason("boundary", slot + "shared_start", prefix + v.message + tail, where)
                for v in check.boundary.violations]
    return out


def build_verdict(ev: Evaluation) -> Verdict:
    """Every blocking reason of the evaluated plan, each with its kind and field."""
    blocking: list[Reason] = []
    warnings: list[Reason] = []
    if ev.check is not None:
        blocking += _check_reasons(ev.check, ev.plan)
        warnings += [Reason("megatron", "warning", w) for w in ev.check.warnings]
    if ev.conversion is not None:
        blocking += _check_reasons(ev.conversion, ev.plan, "conversion_")
    for name, attr in SHAPE_FIELDS.items():
        given, actual = getattr(ev.plan, name), getattr(ev.cfg, attr)
        if given is not None and given != actual:
            spec = TABLE[name]
            blocking.append(Reason("model", f"{name}_mismatch", f"{spec.megatron[0]} {given} does not match the "
                                   f"config's {attr} {actual}", spec.url))
    if ev.plan.mtp and ev.plan.mtp > ev.cfg.num_nextn_predict_layers:
        blocking.append(Reason("model", "mtp_mismatch", f"--mtp-num-layers {ev.plan.mtp} exceeds the config's "
                               f"num_nextn_predict_layers {ev.cfg.num_nextn_predict_layers}: the checkpoint has no "
                               "weights for the extra MTP layers", "mtp"))
    for c in ev.checks:
        fld = CHECK_FIELD.get(c.name)
        if not c.ok and c.level == "error":
            blocking.append(Reason("gpus" if c.name in GPU_CHECKS else "parallel", c.name, c.message, fld))
        elif c.warning or (not c.ok and c.level == "warning"):
            warnings.append(Reason("parallel", c.name, c.message, fld))
    if ev.memory is not None:
        blocking += _memory_reasons(ev.memory)
    if ev.serving_memory is not None:
        blocking += _serving_memory_reasons(ev.serving_memory)
    return verdict_of(blocking, warnings)


def _serving_memory_reasons(memory: dict[str, Any]) -> list[Reason]:
    return [Reason("memory", "rank_over_capacity",
                   f"pp rank {r['pp_rank']} needs {r['total_bytes'] / 2**30:.1f} GiB per GPU for weights, KV cache "
                   f"and the top-k buffer; the usable capacity is {r['usable_bytes'] / 2**30:.1f} GiB", "concurrency")
            for r in memory.get("ranks", []) if not r.get("fits", True)]


def _memory_reasons(memory: dict[str, Any]) -> list[Reason]:
    out = []
    host = memory.get("host_memory") or {}
    if host.get("offload_on") and not host.get("fits", True):
        out.append(Reason("memory", "host_over_capacity",
                          f"a node needs {host['max_node_bytes'] / 1e9:.1f} GB of host memory for the offloaded "
                          f"optimizer ({host['bytes_per_sharded_param']} B per sharded parameter, "
                          f"{host['gpus_per_node']} GPUs per node); it has {host['capacity_bytes_per_node'] / 1e9:.0f} GB",
                          "host_gb"))
    label = memory.get("gpu", {}).get("label", "the GPU")
    for st in memory.get("stages", []):
        if not st.get("fits", True):
            out.append(Reason("memory", "rank_over_capacity",
                              f"pp rank {st['pp_rank']} needs {st['total_bytes'] / 1e9:.1f} GB per GPU; {label} "
                              f"holds {st['capacity_bytes'] / 1e9:.0f} GB (largest term: "
                              f"{st.get('dominant_label', '?')})", "gpu"))
    return out
