"""Megatron's parallel constraints, each a named :class:`~app.core.model.parallelism.Check` with the
plan field that fixes it (FACTS.md section 3 and the Megatron argument checks they come from).

Sources (NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553):
``megatron/training/arguments.py: validate_args`` (SP disabled with a warning when TP = 1;
``--optimizer-cpu-offload`` needs ``--use-precision-aware-optimizer``; global batch divisible by
``mbs * DP``; interleaving), ``megatron/core/model_parallel_config.py`` (EP > 1 and TP > 1 need SP),
``megatron/core/parallel_state.py`` (world and expert grid divisibility),
``megatron/core/transformer/transformer_config.py`` (GQA query groups over TP), Transformer Engine
context parallelism (load-balanced CP splits each sequence into ``2 * CP`` chunks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.core.engines.megatron.placement import interleave_error
from app.core.layout.stages import PipelineSpec, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import Check, ParallelConfig, _try, divisors, nearest_divisors

#: plan field of each check (the field a failure links to)
CHECK_FIELD = {
    "world_size": "gpus", "heads_tp": "tp", "kv_heads_tp": "tp", "ffn_width": "tp", "experts_ep": "ep",
    "expert_grid": "ep", "expert_data_parallel": "ep", "cp_seq": "cp", "dsa_cp": "cp", "sp_tp": "sp",
    "sp_moe_tp": "sp", "mtp_cp": "mtp_layers", "interleave_pp": "vpp", "pipeline_plan": "pp", "vpp_divides": "vpp",
    "global_batch": "global_batch", "microbatches": "num_microbatches", "interleave_microbatches": "num_microbatches",
    "pipeline_fill": "num_microbatches", "recompute_layers": "recompute_num_layers",
    "cpu_offload_flags": "use_precision_aware_optimizer", "precision_aware_dtypes": "use_precision_aware_optimizer",
    "distributed_optimizer": "no_distributed_optimizer",
}
#: checks whose failure is about the GPU budget, not a constraint between sizes
GPU_CHECKS = ("world_size",)


def _placed(checks: list[Check]) -> list[Check]:
    return [replace(c, field=CHECK_FIELD.get(c.name), kind="gpus" if c.name in GPU_CHECKS else "parallel")
            for c in checks]


def kv_heads_tp_check(cfg: ModelConfig, par: ParallelConfig) -> Check | None:
    """GQA: the key-value heads g must be a multiple or a divisor of TP (NVIDIA/Megatron-LM
    ``megatron/core/transformer/transformer_config.py`` ``__post_init__`` raises "num_query_groups
    (g) must be a multiple or divisor of tensor_model_parallel_size"). ``None`` for MLA models.
"""
    if cfg.attention != "gqa":
        return None
    g, tp = cfg.num_key_value_heads, par.tp
    if g % tp == 0 or tp % g == 0:
        per_gpu = f"{g // tp} per GPU" if g % tp == 0 else f"each of the {g} replicated over {tp // g} GPUs"
        return Check("kv_heads_tp", True, f"{g} key-value heads with TP={tp}: {per_gpu}")
    ok = [t for t in divisors(cfg.num_attention_heads) if g % t == 0 or t % g == 0]
    below = max((t for t in ok if t < tp), default=None)
    above = min((t for t in ok if t > tp), default=None)
    return Check("kv_heads_tp", False,
                 f"TP={tp} is neither a multiple nor a divisor of the {g} key-value heads (Megatron raises "
                 f"'num_query_groups must be a multiple or divisor of tensor_model_parallel_size'); "
                 f"try TP={_try((below, above))}")


def check_parallel(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None = None) -> list[Check]:
    """Every constraint of FACTS.md section 3 (and the Megatron flags around it) as a named check.

    Messages follow NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553:
    ``megatron/training/arguments.py: validate_args`` (interleaving needs PP > 1 with the default
    ``overlap_p2p_comm``, PP > 2 with ``--no-overlap-p2p-communication``; MTP with CP is not
    refused), ``megatron/core/model_parallel_config.py: __post_init__`` (EP and TP without SP only
    warns) and ``megatron/core/transformer/moe/moe_layer.py: MoELayer.forward`` (training MoE with
    TP > 1 and no SP raises ValueError, for any EP); CP all-gather is ``--cp-comm-type allgather``.
    """
    out: list[Check] = []
    tp, cp, pp, ep, etp = par.tp, par.cp, par.pp, par.ep, par.expert_tp
    mp = par.model_parallel
    heads, experts = cfg.num_attention_heads, cfg.n_routed_experts
    mtp = plan.mtp_layers if plan is not None else cfg.num_nextn_predict_layers

    # world size ---------------------------------------------------------------------------
    if par.gpus is not None and par.gpus % mp != 0:
        lo = (par.gpus // mp) * mp
        hi = lo + mp
        out.append(Check("world_size", False,
                         f"{par.gpus} GPUs is not a multiple of TP*CP*PP = {tp}*{cp}*{pp} = {mp}; "
                         f"use {_try((lo or None, hi))} GPUs, or change TP/CP/PP"))
    elif par.gpus is not None and par.dp is not None and par.gpus != mp * par.dp:
        out.append(Check("world_size", False,
                         f"gpus = {par.gpus} but TP*CP*PP*DP = {mp}*{par.dp} = {mp * par.dp}; "
                         f"give DP = {par.gpus // mp} or {mp * par.dp} GPUs"))
    else:
        out.append(Check("world_size", True,
                         f"world = TP*CP*PP*DP = {tp}*{cp}*{pp}*{par.data_parallel} = {par.world} GPUs"))

    # attention heads over TP ----------------------------------------------------------------
    if heads % tp != 0:
        out.append(Check("heads_tp", False,
                         f"TP={tp} does not divide {heads} attention heads; try TP={_try(nearest_divisors(heads, tp))}"))
    else:
        out.append(Check("heads_tp", True, f"{heads} attention heads / TP={tp} = {heads // tp} per GPU"))
    kv = kv_heads_tp_check(cfg, par)  # GQA only
    if kv is not None:
        out.append(kv)

    # dense FFN / shared expert widths over TP, expert FFN over ETP ------------------------------
    widths = [("intermediate_size", cfg.intermediate_size, tp, "TP"),
              ("shared expert width", cfg.n_shared_experts * cfg.moe_intermediate_size, tp, "TP"),
              ("moe_intermediate_size", cfg.moe_intermediate_size, etp, "ETP")]
    bad = [(name, w, d, f) for name, w, d, f in widths if w and w % d != 0]
    if bad:
        name, w, d, f = bad[0]
        out.append(Check("ffn_width", False,
                         f"{f}={d} does not divide the {name} {w}; try {f}={_try(nearest_divisors(w, d))}"))
    else:
        out.append(Check("ffn_width", True, "FFN widths divide by TP (dense, shared expert) and ETP (experts)"))

    # experts over EP ---------------------------------------------------------------------------
    if experts:
        if experts % ep != 0:
            out.append(Check("experts_ep", False,
                             f"EP={ep} does not divide {experts} experts; try {_try(nearest_divisors(experts, ep))}"))
        else:
            out.append(Check("experts_ep", True, f"{experts} experts / EP={ep} = {experts // ep} per GPU"))
    elif ep > 1:
        out.append(Check("experts_ep", False, f"EP={ep} needs a MoE model; this config has no routed experts, use EP=1"))

    # expert grid -------------------------------------------------------------------------------
    grid = par.expert_grid_size
    if par.world % grid != 0:
        cands = [d for d in divisors(max(1, par.world // max(1, etp * pp))) if not experts or experts % d == 0]
        below = max((d for d in cands if d < ep), default=None)
        above = min((d for d in cands if d > ep), default=None)
        out.append(Check("expert_grid", False,
                         f"ETP*EP*PP = {etp}*{ep}*{pp} = {grid} does not divide the world of {par.world} GPUs; "
                         f"try EP={_try((below, above))} or change ETP"))
    else:
        out.append(Check("expert_grid", True,
                         f"ETP*EP*PP = {etp}*{ep}*{pp} = {grid} divides the world of {par.world} GPUs"))
    if par.world % grid == 0:
        edp_msg = (f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} = {par.edp}: routed-expert optimizer state "
                   f"is sharded {par.edp} way(s)")
        if par.edp == 1 and experts:
            edp_msg += " (not at all: every GPU keeps full FP32 master + Adam state of its experts)"
    else:
        edp_msg = (f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} is not a whole number, so there is no expert "
                   "data-parallel group until the expert grid divides the world")
    out.append(Check("expert_data_parallel", par.world % grid == 0, edp_msg, level="info"))

    # context parallelism -------------------------------------------------------------------------
    if cp > 1:
        s = par.sample_length
        if s % (2 * cp) != 0:
            lo = (s // (2 * cp)) * 2 * cp
            out.append(Check("cp_seq", False,
                             f"sequence length {s} is not divisible by 2*CP = {2 * cp} (load-balanced CP splits each "
                             f"sequence into 2*CP chunks); pad to {lo + 2 * cp}" + (f" or cut to {lo}" if lo else "")))
        else:
            out.append(Check("cp_seq", True, f"sequence length {s} divides by 2*CP = {2 * cp}"))
        if cfg.has_indexer:
            out.append(Check("dsa_cp", True,
                             f"DSA with CP={cp} needs the all-gather CP layout: --cp-comm-type allgather in "
                             "Megatron, --allgather-cp in slime (as its GLM-5.2 script sets)",
                             level="warning", warning=True))

    # sequence parallelism --------------------------------------------------------------------------
    if par.sp and tp == 1:
        out.append(Check("sp_tp", True,
                         "sequence parallelism needs TP > 1; with TP=1 Megatron turns it off with a warning "
                         "(drop --sequence-parallel)", level="warning", warning=True))
    if experts and tp > 1 and not par.sp:
        out.append(Check("sp_moe_tp", False,
                         f"MoE with TP={tp} and no --sequence-parallel: Megatron-Core's ModelParallelConfig only "
                         "warns (model_parallel_config.py, EP > 1 and TP > 1), but MoELayer.forward raises "
                         "ValueError during training for any EP (megatron/core/transformer/moe/moe_layer.py, "
                         "'performance may degrade if MoE and tensor parallelism are enabled without also "
                         "enabling sequence parallelism'); add --sequence-parallel"))
    elif experts and tp > 1:
        out.append(Check("sp_moe_tp", True, f"sequence parallelism is on with MoE and TP={tp}", level="warning"))

    # MTP with CP: accepted (validate_args no longer refuses it; FACTS.md section 3) -----------------
    if mtp and cp > 1:
        out.append(Check("mtp_cp", True,
                         f"MTP ({mtp} layer(s)) with CP={cp}: accepted by Megatron's validate_args "
                         "(NVIDIA/Megatron-LM megatron/training/arguments.py @ d98e8a6 has no MTP/CP refusal)",
                         level="info"))

    # pipeline ---------------------------------------------------------------------------------------
    # With a stage plan, interleaving is the placement's rule (placement.interleave_error, one home);
    # without one (a bare parallel config) the same rule is applied to par's sizes here.
    v = par.vpp or 1
    if plan is None and v > 1:
        rule = interleave_error(pp, v, par.overlap_p2p_comm, "--num-virtual-stages-per-pipeline-rank")
        out.append(Check("interleave_pp", rule is None, rule.message if rule else f"interleaving VPP={v} with PP={pp}"))
    if plan is not None:
        if plan.pp != pp:
            out.append(Check("pipeline_plan", False,
                             f"the stage plan has PP={plan.pp} but the parallel config has PP={pp}; use one PP"))
        elif (plan.vpp or 1) != v:
            out.append(Check("pipeline_plan", False,
                             f"the stage plan has VPP={plan.vpp} but the parallel config has VPP={v}; use one VPP"))
        elif not plan.stages:   # the placement's own errors are the engine's verdict, not repeated here
            out.append(Check("pipeline_plan", False, "the pipeline plan has no stages"))
        else:
            out.append(Check("pipeline_plan", True,
                             f"{len(plan.stages)} stage(s): layers per rank "
                             f"{[sum(s.num_layers for s in plan.rank_stages(r)) for r in range(pp)]}"))
    elif v > 1:
        n = cfg.num_hidden_layers
        if n % pp != 0 or (n // pp) % v != 0:
            out.append(Check("vpp_divides", False,
                             f"{n} layers over PP={pp} x VPP={v} do not split evenly; per-rank layers must divide "
                             f"by VPP: try VPP={_try(nearest_divisors(n // pp, v)) if n % pp == 0 else 1} or give a stage plan"))
        else:
            out.append(Check("vpp_divides", True, f"{n // pp} layers per rank divide by VPP={v}"))

    # micro-batches ---------------------------------------------------------------------------------
    dp = par.data_parallel
    if par.global_batch is not None:
        unit = par.mbs * dp
        if par.global_batch % unit != 0:
            lo = (par.global_batch // unit) * unit
            out.append(Check("global_batch", False,
                             f"global batch {par.global_batch} is not divisible by mbs*DP = {par.mbs}*{dp} = {unit}; "
                             f"use {_try((lo or None, lo + unit))}"))
        else:
            out.append(Check("global_batch", True,
                             f"global batch {par.global_batch} = {par.global_batch // unit} micro-batches x mbs {par.mbs} x DP {dp}"))
        if par.num_microbatches is not None and par.num_microbatches * unit != par.global_batch:
            out.append(Check("microbatches", False,
                             f"num_microbatches {par.num_microbatches} disagrees with global batch "
                             f"{par.global_batch}/(mbs*DP) = {par.global_batch / unit:g}; give one of them"))
    m = par.microbatches
    if m is not None and v > 1 and m % pp != 0:
        out.append(Check("interleave_microbatches", True,
                         f"{m} micro-batches is not a multiple of PP={pp}; older Megatron interleaved schedules "
                         f"refuse it: use {_try(((m // pp) * pp or None, (m // pp + 1) * pp))}",
                         level="warning", warning=True))
    if m is not None and pp > 1 and m < pp:
        out.append(Check("pipeline_fill", True,
                         f"{m} micro-batches < PP={pp}: the pipeline never fills (bubble "
                         f"{(pp - 1) / (v * m + pp - 1):.0%}); use at least {pp}", level="warning", warning=True))

    # recompute -------------------------------------------------------------------------------------
    if par.recompute == "full" and plan is not None and plan.stages:
        biggest = max(s.num_layers for s in plan.stages)
        if par.recompute_method == "block" and par.recompute_num_layers > biggest:
            out.append(Check("recompute_layers", False,
                             f"--recompute-num-layers {par.recompute_num_layers} exceeds the {biggest} layers of the "
                             f"largest virtual stage (block method); use at most {biggest}"))

    # optimizer flags ----------------------------------------------------------------------------------
    if par.optimizer_cpu_offload and not par.use_precision_aware_optimizer:
        out.append(Check("cpu_offload_flags", False,
                         "--optimizer-cpu-offload must be used with --use-precision-aware-optimizer (Megatron "
                         "validate_args); add --use-precision-aware-optimizer"))
    lowered = [n for n in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
               if getattr(par, n) != "fp32"]
    if lowered and not par.use_precision_aware_optimizer:
        out.append(Check("precision_aware_dtypes", False,
                         f"lowered optimizer dtypes ({', '.join(lowered)}) need --use-precision-aware-optimizer; add it"))
    if (par.optimizer_cpu_offload or lowered) and not par.distributed_optimizer:
        out.append(Check("distributed_optimizer", False,
                         "--use-precision-aware-optimizer / --optimizer-cpu-offload need --use-distributed-optimizer; add it"))
    return _placed(out)


def parallel_report(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None = None) -> dict[str, Any]:
    """JSON-ready: the config, ``gpus``, ``expert_grid`` and the checks."""
    checks = check_parallel(cfg, par, plan)
    return {
        "gpus": par.world,
        "dp": par.data_parallel,
        "expert_grid": par.expert_grid,
        "ok": all(c.ok for c in checks),
        "checks": [c.to_dict() for c in checks],
        "config": par.to_dict(),
    }


def slime_glm52_training() -> tuple[PipelineSpec, ParallelConfig]:
    """The slime GLM-5.2 training profile (THUDM/slime ``scripts/run-glm5.2-744B-A40B.sh``, FACTS.md
    section 1): TP4 CP8 PP8 (first 14, last 16) EP32 ETP1 SP on 256 H100s, full uniform recompute of
    1 layer, ``--max-tokens-per-gpu 8192``, mbs 1, distributed optimizer with
    ``--optimizer-cpu-offload --use-precision-aware-optimizer``."""
    spec = PipelineSpec(pp=8, first=14, last=16)
    par = ParallelConfig(tp=4, cp=8, pp=8, gpus=256, ep=32, etp=1, sp=True, mbs=1, tokens_per_gpu=8192,
                         recompute="full", recompute_method="uniform", recompute_num_layers=1,
                         optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                         distributed_optimizer=True, gpu="h100-80gb")
    return spec, par
