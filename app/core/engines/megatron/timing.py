"""How fast a Megatron-family plan trains: the plan's settings as the time model's
:class:`~app.core.time.settings.TimeSettings`, its GPU from the catalogue, and
:func:`app.core.time.model.step_time` over the stages Megatron builds.

Where the plan leaves something to Megatron's defaults the time model uses Megatron's (its
settings module cites them). Two things a plan may not say, and what is assumed then (each is a
note in the answer):

* the micro-batches per step: ``--global-batch`` / ``--num-microbatches``, else 8 per pipeline
  rank (enough to fill the pipeline; the bubble then is what 8 x PP gives);
* the sample length: ``--seq-length``, else slime's ``--max-tokens-per-gpu`` x CP (one packed
  sample per micro-batch), else 4096.

A plan the time model cannot time (a custom GPU without peak rates, settings it refuses) has no
time; the reason is the answer's ``unavailable`` (the verdict is unchanged: it does not depend on
the time model).

The EP overlap and its dispatcher, CUDA graphs, FP8 attention and the FP8 output layer are plan
settings (``--overlap-moe-expert-parallel-comm``, ``--moe-token-dispatcher-type``,
``--cuda-graph-impl``, ``--fp8-dot-product-attention``, ``--fp8-output-proj``), off by default as in
Megatron-LM (a plan that names no dispatcher is timed with ``flex``, as Megatron-Bridge launches
MoE); Megatron-Bridge's MXFP8 MoE recipes on Blackwell turn them on. Settings a plan has no field for take the defaults in
:data:`UNSTATED_DEFAULTS` - Megatron-LM's own unless stated, which is how a run launched with the
plan's flags and nothing else behaves.
"""

from __future__ import annotations

from typing import Any

from app.core.layout.stages import StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import ParallelConfig
from app.core.model.roles import RoleMap
from app.core.plan import Plan

#: What the time model assumes for settings a plan has no field for (each is a
#: :class:`~app.core.time.settings.TimeSettings` default; the answer's ``defaults`` repeats them):
#: Megatron-LM's defaults at NVIDIA/Megatron-LM@d98e8a64ddf3 unless said otherwise.
UNSTATED_DEFAULTS: dict[str, str] = {
    "distributed_optimizer": "on unless --no-distributed-optimizer (every recipe isplan models uses it)",
    "grad_reduce_in_fp32": "off: --accumulate-allreduce-grads-in-fp32 is opt-in; Megatron-Bridge's perf recipes set "
                           "grad_reduce_in_fp32 = False (perf_recipes/_common.py _benchmark_common)",
}
#: The Megatron flags behind :data:`UNSTATED_DEFAULTS` (NVIDIA/Megatron-LM ``megatron/training/arguments.py``
#: @ d98e8a64ddf3, ``app/core/data/megatron_arguments.txt``): ``(flag, takes a value, the setting it
#: would change)``. A launcher may set them; the plan has no field for them, so the step time keeps
#: the default (the launcher import says so: :attr:`app.core.engines.base.LaunchSyntax.untimed_flags`).
UNTIMED_FLAGS: tuple[tuple[str, bool, str], ...] = (
    ("--accumulate-allreduce-grads-in-fp32", False, "grad_reduce_in_fp32"),
)


def untimed_flags() -> tuple[tuple[str, bool, str], ...]:
    """:data:`UNTIMED_FLAGS` with what the step time assumes for each (:data:`UNSTATED_DEFAULTS`)."""
    return tuple((flag, takes, UNSTATED_DEFAULTS[setting]) for flag, takes, setting in UNTIMED_FLAGS)


#: micro-batches per pipeline rank assumed when the plan gives no global batch
ASSUMED_MICROBATCHES_PER_RANK = 8
#: the schedule simulation has a forward and a backward per micro-batch per stage: bounded before any
#: work, tighter for an answer computed with every plan (the page's live update, every command's
#: verdict) than for ``isplan time`` / ``/api/v1/time``, which ask for it (~1 us per event)
MAX_LIVE_EVENTS = 100_000
MAX_EVENTS = 4_000_000
#: --cp-comm-type -> the CP form the time model costs (a2a+p2p: all-to-all inside, ring across)
_CP_FORM = {"p2p": "p2p", "allgather": "allgather", "all_gather": "allgather", "a2a": "a2a", "a2a+p2p": "a2a"}


def _cp_form(cp_comm_type: str, notes: list[str]) -> str:
    """The time model's CP communication: the plan's type, or, for a per-layer list, the type most
    layers use (stated in ``notes``)."""
    types = cp_comm_type.split(",")
    if len(set(types)) == 1:
        return _CP_FORM[types[0]]
    common = max(dict.fromkeys(types), key=types.count)
    notes.append(f"per-layer --cp-comm-type timed as {common}, the type of {types.count(common)} of {len(types)} layers")
    return _CP_FORM[common]


def time_settings(plan: Plan, stages: StagePlan, par: ParallelConfig) -> tuple[Any, list[str]]:
    """The plan as the time model's settings, and what had to be assumed."""
    from app.core.time.settings import RECOMPUTE_MODULES as TIME_RECOMPUTE_MODULES
    from app.core.time.settings import TimeSettings

    notes = []
    dp = par.data_parallel
    if plan.seq_length:
        seq = plan.seq_length
    elif plan.tokens_per_gpu:
        seq = plan.tokens_per_gpu * plan.cp
        notes.append(f"sample length = --tokens-per-gpu x CP = {plan.tokens_per_gpu} x {plan.cp} = {seq} tokens "
                     "(one packed sample per micro-batch)")
    else:
        seq = 4096
        notes.append("no --seq-length: 4096 tokens per sample assumed")
    mbs = 1 if plan.tokens_per_gpu and not plan.seq_length else plan.mbs
    if plan.global_batch:
        gbs = plan.global_batch
    elif plan.num_microbatches:
        gbs = plan.num_microbatches * mbs * dp
    else:
        gbs = ASSUMED_MICROBATCHES_PER_RANK * stages.pp * mbs * dp
        notes.append(f"no --global-batch: {ASSUMED_MICROBATCHES_PER_RANK} micro-batches per pipeline rank assumed "
                     f"({ASSUMED_MICROBATCHES_PER_RANK * stages.pp} per step)")
    settings = TimeSettings(
        tp=plan.tp, cp=plan.cp, pp=stages.pp, vpp=stages.vpp, ep=plan.ep, etp=plan.etp, dp=dp, mbs=mbs,
        global_batch=gbs, seq_length=seq, sp=plan.sp, recompute=plan.recompute,
        recompute_method=plan.recompute_method if plan.recompute == "full" else None,
        recompute_num_layers=plan.recompute_num_layers if plan.recompute == "full" else None,
        # the GatedDeltaNet / mHC modules (refused for every model isplan loads) take no time here
        recompute_modules=None if plan.recompute_modules is None else
        tuple(m for m in plan.recompute_modules if m in TIME_RECOMPUTE_MODULES),
        mtp_layers=stages.mtp_layers, precision=plan.precision,
        tp_comm_overlap=plan.tp_comm_overlap, overlap_grad_reduce=plan.overlap_grad_reduce,
        overlap_param_gather=plan.overlap_param_gather, distributed_optimizer=not plan.no_distributed_optimizer,
        optimizer_cpu_offload=plan.optimizer_cpu_offload, cp_comm_type=_cp_form(plan.cp_comm_type, notes),
        vocab_divisible_by=plan.make_vocab_size_divisible_by,
        ep_comm_overlap=plan.overlap_moe_expert_parallel_comm, cuda_graph=_graphs(plan.cuda_graph_impl, notes),
        fp8_attention=plan.fp8_dot_product_attention and plan.precision != "bf16",
        moe_dispatcher=plan.moe_token_dispatcher_type or "flex",
        fp8_output_proj=plan.fp8_output_proj)
    if plan.fp8_dot_product_attention and plan.precision == "bf16":
        notes.append("--fp8-dot-product-attention has no effect without an FP8 or FP4 --precision (Transformer "
                     "Engine reads it inside the FP8 autocast only): the attention is timed in BF16")
    return settings, notes


#: A part of the step worth a note when the switch that hides it is off: at least this share of it.
SWITCH_NOTE_SHARE = 0.05


def speed_switch_notes(plan: Plan, body: dict[str, Any]) -> list[str]:
    """What the step time leaves exposed because a Megatron speed switch is off (as it is by
    default), when it is at least :data:`SWITCH_NOTE_SHARE` of the step: the host issuing every
    kernel (``--cuda-graph-impl`` other than ``full_iteration``) and the expert-parallel all-to-all
    (no ``--overlap-moe-expert-parallel-comm``). Megatron-Bridge's 26.06+ MXFP8 MoE recipes on
    GB200 / GB300 turn both on; their runs measured 20-30 % faster than the same flags timed
    without (docs/MODELS.md, "Tenth round")."""
    step, parts = body.get("step_seconds") or 0.0, body.get("breakdown", {})
    host, ep = (parts.get(k, {}).get("exposed", 0.0) for k in ("host", "ep"))
    out = []
    if plan.cuda_graph_impl != "full_iteration" and host >= SWITCH_NOTE_SHARE * step > 0:
        out.append(f"the host issuing kernels is {host / step:.0%} of this step (eager, no full-iteration CUDA "
                   "graph: Megatron's default); --cuda-graph-impl full_iteration takes it off")
    if not plan.overlap_moe_expert_parallel_comm and ep >= SWITCH_NOTE_SHARE * step > 0:
        out.append(f"the expert-parallel all-to-all is {ep / step:.0%} of this step, exposed; "
                   "--overlap-moe-expert-parallel-comm runs it beside another micro-batch's compute "
                   "(Megatron needs VPP when PP > 1)")
    return out


def _graphs(impl: str, notes: list[str]) -> str:
    """The time model's CUDA graphs: ``full_iteration``, else eager; partial graphs are timed as eager
    (an upper bound on their host cost), which ``notes`` says."""
    if impl in ("local", "transformer_engine"):
        notes.append(f"--cuda-graph-impl {impl} captures parts of the step: timed as eager, an upper bound on "
                     "the host's cost")
    return "full_iteration" if impl == "full_iteration" else "none"


def hardware_of(plan: Plan) -> Any:
    """The plan's GPU: the catalogue's, or ``--gpu custom`` built from its own figures
    (:func:`app.core.model.hardware.custom_hardware`), with every value the plan overrides (peaks in
    TFLOP/s, HBM in TB/s, NVLink in GB/s each direction, the network in Gb/s, the NVLink domain)."""
    from app.core.model.hardware import custom_hardware, get_hardware, with_overrides

    def scaled(value: float | None, unit: float) -> float | None:
        return None if value is None else value * unit

    own = {"bf16_flops": scaled(plan.bf16_tflops, 1e12), "hbm_bw": scaled(plan.hbm_tbps, 1e12),
           "nvlink_bw": scaled(plan.nvlink_gbs, 1e9)}
    if plan.gpu == "custom":   # built from these figures: they are its own, not overrides
        base = custom_hardware(generation=plan.gpu_generation, **own,
                               capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None)
        own = {}
    else:
        base = get_hardware(plan.gpu)
    return with_overrides(base, network_gbps=plan.network_gbps, nvlink_domain=plan.nvlink_domain, **own,
                          fp8_flops=scaled(plan.fp8_tflops, 1e12), fp4_flops=scaled(plan.fp4_tflops, 1e12))


#: the plan settings that replace a catalogue GPU's figures (:func:`hardware_of`)
HARDWARE_FIGURES = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_tbps", "nvlink_gbs", "network_gbps",
                    "nvlink_domain")


def _hardware_notes(plan: Plan, hw: Any) -> list[str]:
    """What the step time assumed of a GPU the plan describes itself: a custom one is timed with its
    generation's achieved-efficiency constants, and the published runs quoted for that generation were
    not on it; overridden figures likewise leave the quoted runs' GPU behind."""
    given = [n for n in HARDWARE_FIGURES if getattr(plan, n) is not None]
    if plan.gpu == "custom":
        return [f"--gpu custom timed as a {hw.generation} GPU from the figures given (the {hw.generation} "
                "constants; the published runs quoted below were on catalogue GPUs, not this one)"]
    if given:
        return [f"{plan.gpu}'s figures replaced ({', '.join('--' + n.replace('_', '-') for n in given)}): the "
                "published runs quoted below ran on the catalogue's figures"]
    return []


def time_layer_costs(cfg: ModelConfig, plan: Plan, roles: RoleMap) -> Any:
    """Per-layer forward + backward seconds of one micro-batch under the plan's settings (the
    optimiser's ``--objective time``): what one layer adds to its stage, the embedding on the first
    stage and the output layer (+ MTP) on the last. A plan the time model cannot time (no catalogue
    GPU, parallel settings that do not divide the world) is a ``ValueError`` naming why."""
    from app.core.engines.megatron import parallel_config
    from app.core.layout.stages import Stage
    from app.core.model.layer_costs import LayerCosts
    from app.core.model.parameters import shapes
    from app.core.time import comm
    from app.core.time.efficiency import efficiency_for
    from app.core.time.model import stage_costs
    from app.core.time.ops import OpContext
    from app.core.time.precision import get_precision
    from app.core.time.settings import TimeInputError

    n, mtp = cfg.num_hidden_layers, plan.mtp_layers or 0
    shell = StagePlan(plan.pp, plan.vpp or 1, n, mtp, ())
    try:
        hw = hardware_of(plan)
        s, _ = time_settings(plan, shell, parallel_config(plan, shell))
        s.validate(cfg.num_attention_heads, cfg.n_routed_experts)
    except (ValueError, TimeInputError) as exc:
        raise ValueError(str(exc)) from exc
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    ctx = OpContext(cfg, shapes(cfg), s, hw, efficiency_for(hw.generation), get_precision(s.precision), gr)
    singles = tuple(Stage(k - 1, 0, 0, k, k, 1) for k in range(1, n + 1))
    ends = (Stage(n, 0, 0, None, None, 0, embedding=True), Stage(n + 1, 0, 0, None, None, 0, loss=True, mtp_layers=mtp))
    costs = stage_costs(cfg, roles, StagePlan(1, 1, n, mtp, singles + ends), s, ctx)
    per = [c.fwd + c.bwd for c in costs]
    return LayerCosts("time", "seconds per micro-batch (forward + backward)", tuple(per[:n]), per[n], per[n + 1])


def recipe_layout(num_layers: int, stages: int, mtp: int) -> str:
    """Megatron-Bridge's layout for layer counts no even split fits (``set_deepseek_v3_pipeline_model_parallel_layout``,
    ``_get_kimi_k2_pipeline_layout`` @ v0.6.0): ``K = ceil((n + 3) / stages)`` decoder layers per stage,
    the embedding on the first, the last stage ``n - K (stages - 1)`` layers with the MTP layers and
    the loss; spread evenly when that does not fit."""
    k = -(-(num_layers + 3) // stages)
    sizes = [k] * stages
    last = num_layers - k * (stages - 1)
    if last >= 0:
        sizes[-1] = last
    else:
        sizes = [num_layers // stages + (1 if i < num_layers % stages else 0) for i in range(stages)]
    return "|".join(("E" if i == 0 else "") + "t" * s + (("m" * mtp + "L") if i == stages - 1 else "")
                    for i, s in enumerate(sizes))


def recipe_stages(cfg: ModelConfig, plan: Plan) -> tuple[StagePlan, str] | None:
    """Stages for timing a plan whose PP x VPP Megatron refuses as given (an uneven layer count
    with plain ``--pp`` / ``--vpp``): as Megatron-Bridge's recipes place them - the embedding and
    the loss each taking a layer slot when that splits evenly, else :func:`recipe_layout`. Only
    for plans given by PP (and VPP) alone; the verdict still says what Megatron refuses."""
    from app.core.engines.megatron.placement import materialise
    from app.core.layout.stages import PipelineSpec

    if plan.mode != "flags" or plan.first or plan.last or plan.layers_per_vstage or plan.account_for_embedding \
            or plan.account_for_loss:
        return None
    n, pp, vpp, mtp = cfg.num_hidden_layers, plan.pp, plan.vpp or 1, plan.mtp_layers or 0
    tries = [(PipelineSpec(pp=pp, vpp=plan.vpp, account_for_embedding=True, account_for_loss=True, mtp_layers=mtp),
              "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")]
    if vpp == 1 or pp > 1:
        layout = recipe_layout(n, pp * vpp, mtp)
        tries.append((PipelineSpec(pp=pp, layout=layout, mtp_layers=mtp), f"--pipeline-model-parallel-layout {layout}"))
    for spec, how in tries:
        stages = materialise(spec, n)
        if stages.stages and not stages.errors:
            return stages, how
    return None


def plan_time(cfg: ModelConfig, plan: Plan, stages: StagePlan, roles: RoleMap, par: ParallelConfig,
              *, timeline: bool = True, max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """The step time of the plan (``time`` of issue 18's JSON), or ``{"unavailable": reason,
    "field": ...}`` when the time model cannot time it (or the simulation is over ``max_events``)."""
    from app.core.time.accuracy import accuracy_for
    from app.core.time.model import step_time
    from app.core.time.settings import TimeInputError

    try:
        hw = hardware_of(plan)
    except ValueError as exc:
        return {"unavailable": f"no step time for --gpu {plan.gpu}: {exc}", "field": getattr(exc, "field", "gpu")}
    settings, notes = time_settings(plan, stages, par)
    events = 2 * len(stages.stages) * max(1, settings.gbs // (settings.mbs * settings.dp))
    if events > max_events:
        return {"unavailable": f"no step time here: simulating {events:,} forward and backward steps is over the "
                               f"limit of {max_events:,}" + ("; isplan time simulates up to "
                                                              f"{MAX_EVENTS:,}" if max_events < MAX_EVENTS else ""),
                "field": "global_batch"}
    try:
        result = step_time(cfg, roles, stages, settings.validate(cfg.num_attention_heads, cfg.n_routed_experts), hw,
                           record=timeline)
    except TimeInputError as exc:
        return {"unavailable": f"no step time: {exc}", "field": exc.field}
    body = result.to_json(timeline=timeline)
    body["notes"] = [*body.get("notes", []), *speed_switch_notes(plan, body)]
    body["assumed"] = [*notes, *_hardware_notes(plan, hw)]
    body["settings"] = settings.to_dict()
    body["defaults"] = dict(UNSTATED_DEFAULTS)
    body["accuracy"] = accuracy_for(hw.generation, settings.precision, cfg.id, cfg.canonical_sha256)
    return body
