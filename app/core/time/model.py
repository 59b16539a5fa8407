"""One training step's time: per-stage costs, the simulated pipeline, data-parallel traffic, the
optimizer; tokens/s/GPU, model TFLOP/s/GPU and MFU.

``step_time(cfg, roles, stage_plan, settings, hardware)``:

1. every layer's forward / backward op costs and per-dimension communication for one micro-batch
   (:mod:`app.core.time.ops`, :mod:`app.core.time.comm`), summed per stage (vp-major, the
   ``StagePlan``'s real stages: uneven, virtual, the embedding on its stage, the output layer and
   the MTP logits on the loss stage, MTP layers on theirs);
2. exposure per layer and direction: TP communication overlapped with the TP-sharded GEMMs when
   ``tp_comm_overlap`` (exposed ``max(0, comm - gemm)``), else serial; CP ring steps overlapped
   with attention (exposed ``max(0, comm - attention)``), the all-gather form serial; EP
   dispatch + combine serial, or (``ep_comm_overlap``, Megatron's
   ``--overlap-moe-expert-parallel-comm``, which runs one micro-batch's forward beside another's
   backward) hidden under the other direction's compute of the same layer on the steps of the steady
   1F1B phase only, with the SMs the dispatch kernels hold taken from that compute
   (:func:`ep_overlap_share`, :data:`EP_COMM_SMS`);
3. recompute as the extra forward it costs in backward: ``full`` every decoder layer of a stage
   (``uniform``) or its first ``recompute_num_layers`` (``block``), with the layer's forward
   communication; ``selective`` the listed modules' forward time (``core_attn`` the attention
   core; ``mlp`` the dense MLP; ``moe`` the MoE layer with its dispatch; ``moe_act``,
   ``mla_up_proj`` (+ RoPE), ``layernorm``, ``shared_experts``);
4. the pipeline schedule simulated with each stage's forward / backward and the PP sends
   (:mod:`app.core.time.schedule`); with ``overlap_param_gather`` each chunk's first forward waits
   for its parameters' all-gather (chunks gathered in order on a communication stream);
5. per rank a communication stream for the distributed optimizer's gradient reduce-scatter (DP x
   CP group for dense parameters, EDP for experts; FP32 gradients with ``grad_reduce_in_fp32``):
   with ``overlap_grad_reduce`` chunk ``c`` starts when its last backward starts and ends no
   earlier than that backward plus one bucket (Megatron's default bucket, ``max(40M, 1M * DP)``
   parameters); without, after the rank's last step. Without the distributed optimizer the
   gradients are all-reduced (twice the volume) and nothing is gathered;
6. the optimizer step (Adam, ~30 B of HBM traffic per local parameter shard: FP32 master, m, v
   read and written, the gradient read, the BF16 parameter written; with
   ``optimizer_cpu_offload`` on the host at ``host_bw`` plus the shard's gradients down and
   parameters up over ``h2d_bw``), then the parameter all-gather when it is not overlapped, and
   the tied-embedding gradient all-reduce between the first and last stage.

``step_seconds`` = the slowest rank's end of compute and communication + optimizer + the exposed
gathers. Breakdown items are seconds per step on that rank, ``exposed`` (on the critical path;
they add up to ``step_seconds``) and ``total`` (the work or transfer, hidden or not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.flops import mtp_role
from app.core.model.hardware import Hardware
from app.core.model.parameters import shapes, stage_params
from app.core.model.roles import LayerRole, RoleMap
from app.core.time import comm
from app.core.time.efficiency import Efficiency, efficiency_for
from app.core.time.model_flops import model_flops_per_token
from app.core.time.ops import ACT_BYTES, LayerCost, OpContext, embedding_cost, head_cost, layer_cost
from app.core.time.precision import get_precision
from app.core.time.schedule import Schedule, ScheduleError, rank_orders, simulate
from app.core.time.settings import TimeInputError, TimeSettings

ADAM_BYTES_PER_PARAM = 30.0
HOST_ADAM_BYTES_PER_PARAM = 32.0  # FP32 master, m, v and the FP32 gradient, read and written
BREAKDOWN = ("compute", "recompute", "host", "tp", "cp", "ep", "pp", "bubble", "dp", "optimizer")
_RECOMPUTE_PARTS = {"core_attn": ("core_attn",), "mlp": ("mlp",), "moe": ("moe", "moe_act", "shared_experts"),
                    "moe_act": ("moe_act",), "mla_up_proj": ("mla_up_proj", "rope"), "layernorm": ("layernorm",),
                    "shared_experts": ("shared_experts",)}

TERMS = (
    "GEMMs of every linear layer in the plan's precision (forward, data and weight gradients), ceiling x peak "
    "plus operand traffic plus a launch per kernel; the output layer in BF16",
    "flash attention (causal, or DSA sparse over the top-k) and the DSA indexer on layers that own one, BF16",
    "memory-bound work: norms, residual adds, RoPE, activations, router, MoE permutation, quantisation casts, "
    "cross-entropy",
    "TP all-gather / reduce-scatter (SP) or all-reduce; CP ring or all-gather; EP all-to-all dispatch and combine; "
    "PP sends; DP/EDP gradient reduce-scatter and parameter all-gather (all-reduce without the distributed "
    "optimizer); the tied-embedding gradient all-reduce",
    "recompute (full layers or the selective modules) as extra forward time in backward",
    "the optimizer step (HBM-bound Adam, or on the host with CPU offload)",
    "the pipeline schedule simulated per (pp_rank, vp_stage) with Megatron's 1F1B / interleaved order",
)
NOT_MODELLED = (
    "token imbalance across experts (the measured runs force-balance routing) and dropped tokens",
    "CUDA-graph launch savings and CPU launch stalls beyond a fixed cost per kernel",
    "contention between simultaneous DP, PP and EP traffic on one NIC",
    "SM slow-down of compute that overlaps TP, CP or DP communication (the EP dispatch's SMs are counted)",
    "FP8 attention, FP8 / FP4 communication of activations, delayed wgrad, HybridEP / DeepEP de-duplication",
    "data loading, checkpointing, logging and the first step's warm-up",
)


@dataclass
class _StageCost:
    stage: Stage
    fwd: float = 0.0
    bwd: float = 0.0
    compute: float = 0.0  # forward + backward compute (no comm, no recompute)
    recompute: float = 0.0
    tp: list[float] = field(default_factory=lambda: [0.0, 0.0])  # exposed, total
    ep: list[float] = field(default_factory=lambda: [0.0, 0.0])
    cp: list[float] = field(default_factory=lambda: [0.0, 0.0])
    flops: float = 0.0  # executed forward FLOPs per micro-batch on one GPU
    host: float = 0.0  # seconds the GPU waits for the host to issue kernels (fwd + bwd)

    def to_dict(self) -> dict[str, Any]:
        s = self.stage
        return {"index": s.index, "pp_rank": s.pp_rank, "vp_stage": s.vp_stage, "first_layer": s.first_layer,
                "last_layer": s.last_layer, "num_layers": s.num_layers, "embedding": s.embedding, "loss": s.loss,
                "mtp_layers": s.mtp_layers, "forward_seconds": self.fwd, "backward_seconds": self.bwd,
                "compute_seconds": self.compute, "recompute_seconds": self.recompute, "host_seconds": self.host,
                "tp_seconds": {"exposed": self.tp[0], "total": self.tp[1]},
                "ep_seconds": {"exposed": self.ep[0], "total": self.ep[1]},
                "cp_seconds": {"exposed": self.cp[0], "total": self.cp[1]},
                "forward_flops": self.flops}


@dataclass(frozen=True)
class StepTime:
    step_seconds: float
    tokens_per_second_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    mfu_bf16: float
    bubble_fraction: float
    breakdown: dict[str, dict[str, float]]
    per_stage: tuple[dict[str, Any], ...]
    schedule: Schedule
    critical_rank: int
    model_flops_per_token: float
    settings: TimeSettings
    hardware: Hardware
    groups: dict[str, comm.Group]
    notes: tuple[str, ...] = ()

    def to_json(self, *, timeline: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step_seconds": self.step_seconds,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_bf16": self.mfu_bf16,
            "bubble_fraction": self.bubble_fraction,
            "breakdown": self.breakdown,
            "per_stage": list(self.per_stage),
            "critical_rank": self.critical_rank,
            "num_microbatches": self.schedule.num_microbatches,
            "model_flops_per_token": self.model_flops_per_token,
            "gpu": self.hardware.id,
            "precision": self.settings.precision,
            "groups": {k: g.to_dict() for k, g in self.groups.items()},
            "terms": list(TERMS),
            "not_modelled": list(NOT_MODELLED),
            "conventions": {
                "model_flops": "Megatron-Bridge flop_utils.transformer_flops: forward + backward (3 x 2 FLOPs per "
                               "multiply-add) of the model, causal attention, no recompute, vocabulary padded to "
                               "128 x TP (app/core/time/model_flops.py)",
                "mfu": "model TFLOP/s/GPU over the dense peak of the plan's GEMM precision (mfu) and over the "
                       "dense BF16 peak (mfu_bf16)",
                "breakdown": "seconds per step on the critical pipeline rank; 'exposed' items add up to step_seconds",
            },
            "notes": list(self.notes),
        }
        if timeline:
            out["timeline"] = self.schedule.timeline()
        return out


def _layer_key(role: LayerRole) -> tuple[str, bool, bool]:
    return (role.ffn, role.has_indexer, role.mtp)


#: SMs the expert-parallel dispatch / combine kernels occupy while they run beside compute: Megatron-Bridge's
#: performance recipes give HybridEP ``moe_hybridep_num_sms = 32`` (NVIDIA-NeMo/Megatron-Bridge
#: ``src/megatron/bridge/perf_recipes/_common.py`` ``_benchmark_common`` and ``deepseek/common.py``
#: ``_enable_deepseek_full_iteration_mxfp8`` @ 067f987d). Compute overlapping them runs on the other SMs.
EP_COMM_SMS = 32


def ep_overlap_share(s: TimeSettings) -> float:
    """The share of a rank's forward and backward steps that ``--overlap-moe-expert-parallel-comm``
    pairs with another micro-batch's opposite step (Megatron-Core's combined 1F1B: the all-to-all of
    one runs beside the other's compute). Only the steady 1F1B phase pairs: without pipelining every
    micro-batch but one (``(m - 1) / m``); interleaved, ``(m V - w_r) / (m V)`` with rank ``r``'s
    warm-up ``w_r = min((PP - r - 1) * 2 + (V - 1) * G, m V)`` (:func:`app.core.time.schedule.rank_order`),
    averaged over the ranks. Megatron refuses the overlap with PP > 1 and no VPP
    (``transformer_config.py``: "virtual_pipeline_model_parallel_size must be specified"): 0 there."""
    m = s.num_microbatches
    if not s.ep_comm_overlap or m < 1:
        return 0.0
    if s.pp == 1:
        return (m - 1) / m
    if s.vpp == 1:
        return 0.0
    total = m * s.vpp
    g = s.microbatch_group or s.pp
    warm = [min((s.pp - r - 1) * 2 + (s.vpp - 1) * g, total) for r in range(s.pp)]
    return 1.0 - sum(warm) / (s.pp * total)


def _exposed(lc: LayerCost, s: TimeSettings, ep_share: float = 0.0, ep_sm: float = 0.0) -> dict[str, float]:
    """Exposed communication of one layer per direction (module docstring, item 2). EP with the
    overlap: on the ``ep_share`` of steps that pair (:func:`ep_overlap_share`) a forward all-to-all
    ``a`` runs beside another micro-batch's backward compute ``c`` (and a backward one beside a
    forward), on ``ep_sm`` of the SMs (:data:`EP_COMM_SMS` / ``Hardware.sms``): the pair then takes
    ``c + max(a - c, a * ep_sm)`` - compute that loses those SMs for ``a`` seconds finishes
    ``a * ep_sm`` later; the other steps expose the whole all-to-all."""
    tp_f, tp_b = lc.tp_fwd, lc.tp_bwd
    if s.tp_comm_overlap:
        tp_f, tp_b = max(0.0, tp_f - lc.tp_gemm_fwd), max(0.0, tp_b - lc.tp_gemm_bwd)
    ep_f, ep_b = lc.ep_fwd, lc.ep_bwd
    if ep_share > 0:
        ep_f = (1 - ep_share) * ep_f + ep_share * max(ep_f - lc.bwd.total, ep_f * ep_sm)
        ep_b = (1 - ep_share) * ep_b + ep_share * max(ep_b - lc.fwd.total, ep_b * ep_sm)
    cp_f, cp_b = lc.cp_fwd, lc.cp_bwd
    if lc.cp_overlappable:
        cp_f, cp_b = max(0.0, cp_f - lc.attn_fwd), max(0.0, cp_b - lc.attn_bwd)
    return {"tp_f": tp_f, "tp_b": tp_b, "ep_f": ep_f, "ep_b": ep_b, "cp_f": cp_f, "cp_b": cp_b}


def _recompute_seconds(lc: LayerCost, exp: dict[str, float], s: TimeSettings, full: bool) -> float:
    if full:
        return lc.fwd.total + exp["tp_f"] + exp["ep_f"] + exp["cp_f"]
    sec = 0.0
    for module in s.modules:
        for part in _RECOMPUTE_PARTS[module]:
            sec += lc.modules.get(part, 0.0)
        if module == "moe":
            sec += exp["ep_f"]
    return sec


def _recomputed(stage: Stage, s: TimeSettings) -> set[int]:
    """Decoder layers of ``stage`` that full recompute re-runs (Megatron ``transformer_block``:
    ``uniform`` every layer, in groups of ``recompute_num_layers``; ``block`` the first
    ``recompute_num_layers`` of each stage)."""
    if s.recompute != "full":
        return set()
    layers = list(stage.layers)
    if s.recompute_method == "block":
        return set(layers[: (s.recompute_num_layers or 0)])
    return set(layers)


def _add_layer(sc: _StageCost, lc: LayerCost, exp: dict[str, float], recompute: float) -> None:
    """Add one layer to a stage; each direction takes the longer of the GPU stream (compute and
    exposed communication) and the host issuing its kernels (``host_fwd`` / ``host_bwd``)."""
    gpu_f = lc.fwd.total + exp["tp_f"] + exp["ep_f"] + exp["cp_f"]
    gpu_b = lc.bwd.total + exp["tp_b"] + exp["ep_b"] + exp["cp_b"] + recompute
    f = max(gpu_f, lc.host_fwd)
    b = max(gpu_b, lc.host_bwd + (lc.host_fwd if recompute else 0.0))
    sc.fwd += f
    sc.bwd += b
    sc.host += (f - gpu_f) + (b - gpu_b)
    sc.compute += lc.fwd.total + lc.bwd.total
    sc.recompute += recompute
    sc.tp[0] += exp["tp_f"] + exp["tp_b"]
    sc.tp[1] += lc.tp_fwd + lc.tp_bwd
    sc.ep[0] += exp["ep_f"] + exp["ep_b"]
    sc.ep[1] += lc.ep_fwd + lc.ep_bwd
    sc.cp[0] += exp["cp_f"] + exp["cp_b"]
    sc.cp[1] += lc.cp_fwd + lc.cp_bwd
    sc.flops += lc.flops_fwd


def _check(cfg: ModelConfig, plan: StagePlan, s: TimeSettings) -> None:
    s.validate(cfg.num_attention_heads, cfg.n_routed_experts)
    if plan.errors:
        raise TimeInputError("the pipeline layout has errors (" + "; ".join(e.message for e in plan.errors[:3])
                             + "); fix the layout before timing it", "layout")
    if plan.pp != s.pp or (plan.vpp or 1) != s.vpp:
        raise TimeInputError(f"the stage plan is PP {plan.pp} x VPP {plan.vpp} but the settings say "
                             f"PP {s.pp} x VPP {s.vpp}", "pp")
    if plan.mtp_layers != s.mtp_layers:
        raise TimeInputError(f"the stage plan places {plan.mtp_layers} MTP layer(s), the settings say "
                             f"{s.mtp_layers}", "mtp_layers")
    if not plan.stages:
        raise TimeInputError("the stage plan has no stages", "layout")


def stage_costs(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, ctx: OpContext,
                cache: dict[Any, tuple[LayerCost, dict[str, float]]] | None = None) -> list[_StageCost]:
    """Forward / backward seconds per micro-batch of every stage (vp-major). ``cache``: layer costs
    by layer kind, reusable across plans whose per-layer settings agree (:func:`quick_step_seconds`)."""
    cache = {} if cache is None else cache
    ep_share = ep_overlap_share(s)
    ep_sm = min(1.0, EP_COMM_SMS / ctx.hw.sms) if ctx.hw.sms else 0.0

    def cost(role: LayerRole) -> tuple[LayerCost, dict[str, float]]:
        key = _layer_key(role)
        if key not in cache:
            lc = layer_cost(ctx, role)
            cache[key] = (lc, _exposed(lc, s, ep_share, ep_sm))
        return cache[key]

    out = []
    mtp_seen = 0
    full = s.recompute == "full"
    for st in plan.stages:
        sc = _StageCost(st)
        redo = _recomputed(st, s)
        for n in st.layers:
            lc, exp = cost(roles.role(n))
            rc = _recompute_seconds(lc, exp, s, full) if (not full or n in redo) and s.recompute != "none" else 0.0
            _add_layer(sc, lc, exp, rc)
        for k in range(mtp_seen + 1, mtp_seen + st.mtp_layers + 1):
            lc, exp = cost(mtp_role(cfg, roles, k))
            rc = _recompute_seconds(lc, exp, s, False) if s.recompute == "selective" else 0.0
            _add_layer(sc, lc, exp, rc)
        mtp_seen += st.mtp_layers
        if st.embedding:
            ec = embedding_cost(ctx)
            _add_layer(sc, ec, _exposed(ec, s), 0.0)
        if st.loss:
            hc = head_cost(ctx, plan.mtp_layers)
            _add_layer(sc, hc, _exposed(hc, s), 0.0)
        out.append(sc)
    return out


def _dp_times(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, ctx: OpContext
              ) -> tuple[list[list[float]], list[list[float]], list[list[int]], list[float]]:
    """Per rank and chunk: gradient reduction and parameter all-gather seconds, parameters held;
    per rank the optimizer step."""
    hw, eff, gr = ctx.hw, ctx.eff, ctx.groups
    grad_b = 4.0 if s.grad_reduce_in_fp32 else 2.0
    par_b = ctx.prec.param_gather_bytes
    rs = [[0.0] * s.vpp for _ in range(s.pp)]
    ag = [[0.0] * s.vpp for _ in range(s.pp)]
    npar = [[0] * s.vpp for _ in range(s.pp)]
    opt = [0.0] * s.pp
    dense_shard = gr["dp"].size if s.distributed_optimizer else 1
    expert_shard = gr["edp"].size if s.distributed_optimizer else 1
    for st in plan.stages:
        p = stage_params(cfg, roles, [st], tp=s.tp, ep=s.ep, etp=s.etp_)
        r, c = st.pp_rank, st.vp_stage
        npar[r][c] = p.per_gpu
        if s.distributed_optimizer:
            rs[r][c] = (comm.reduce_scatter(gr["dp"], p.dense_per_gpu * grad_b, hw, eff)
                        + comm.reduce_scatter(gr["edp"], p.expert_per_gpu * grad_b, hw, eff))
            ag[r][c] = (comm.all_gather(gr["dp"], p.dense_per_gpu * par_b, hw, eff)
                        + comm.all_gather(gr["edp"], p.expert_per_gpu * par_b, hw, eff))
        else:
            rs[r][c] = (comm.all_reduce(gr["dp"], p.dense_per_gpu * grad_b, hw, eff)
                        + comm.all_reduce(gr["edp"], p.expert_per_gpu * grad_b, hw, eff))
        shard = p.dense_per_gpu / dense_shard + p.expert_per_gpu / expert_shard
        if s.optimizer_cpu_offload:
            opt[r] += (shard * HOST_ADAM_BYTES_PER_PARAM / hw.host_bw
                       + shard * (grad_b + ACT_BYTES) / hw.h2d_bw)
        else:
            opt[r] += shard * ADAM_BYTES_PER_PARAM / (hw.hbm_bw * eff.mem)
    return rs, ag, npar, opt


def layer_settings_key(s: TimeSettings, hw: Hardware) -> tuple[Any, ...]:
    """What one layer's cost depends on: its TP / CP / EP / ETP groups and their placement, the
    micro-batch's tokens, recompute, precision, overlaps (the EP overlap by the share of steps it pairs,
    which PP, VPP and the micro-batch count set) - not otherwise PP, VPP, DP or the layout."""
    return (hw, s.tp, s.cp, s.ep, s.etp_, s.sp, s.mbs, s.seq_length, s.recompute, s.recompute_method,
            s.recompute_num_layers, s.modules, s.precision, s.tp_comm_overlap, ep_overlap_share(s), s.cp_comm_type,
            s.moe_dispatcher, s.fp8_attention, s.cuda_graph)


def quick_step_seconds(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, hw: Hardware,
                       cache: dict[Any, Any]) -> float:
    """A fast estimate of :func:`step_time`'s ``step_seconds`` for ranking many plans (the GPU-budget
    search): the same per-stage costs, but the pipeline by its closed form instead of the
    simulation - ``m x max_r T_r + (PP - 1) x max_r T_r / VPP`` with ``T_r`` a rank's forward +
    backward per micro-batch (exact for equal stages: ``(V m + P - 1) c``) - and the gradient
    reduce-scatter / parameter all-gather exposed unless overlapped. ``cache`` maps
    :func:`layer_settings_key` to layer costs shared across plans."""
    prec = get_precision(s.precision)
    eff = efficiency_for(hw.generation)
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    ctx = OpContext(cfg, shapes(cfg), s, hw, eff, prec, gr)
    costs = stage_costs(cfg, roles, plan, s, ctx, cache.setdefault(layer_settings_key(s, hw), {}))
    per_rank = [0.0] * s.pp
    for c in costs:
        per_rank[c.stage.pp_rank] += c.fwd + c.bwd
    slowest = max(per_rank)
    pipeline = s.num_microbatches * slowest + (s.pp - 1) * slowest / s.vpp
    rs, ag, _, opt = _dp_times(cfg, roles, plan, s, ctx)
    dp = 0.0 if s.overlap_grad_reduce else max(sum(row) for row in rs)
    if s.distributed_optimizer and not s.overlap_param_gather:
        dp += max(sum(row) for row in ag)
    return pipeline + dp + max(opt)


def step_time(cfg: ModelConfig, roles: RoleMap, stage_plan: StagePlan, settings: TimeSettings, hardware: Hardware,
              *, efficiency: Efficiency | None = None) -> StepTime:
    """The time of one training step (module docstring). Raises :class:`TimeInputError` for
    settings or a layout it cannot time."""
    s, hw, plan = settings, hardware, stage_plan
    _check(cfg, plan, s)
    prec = get_precision(s.precision)
    try:
        hw.peak_flops(prec.gemm_dtype)
    except ValueError as exc:
        raise TimeInputError(str(exc), "precision") from None
    eff = efficiency or efficiency_for(hw.generation)
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    ctx = OpContext(cfg, shapes(cfg), s, hw, eff, prec, gr)
    m = s.num_microbatches
    costs = stage_costs(cfg, roles, plan, s, ctx)
    n_stages = len(costs)
    # PP sends: the activation of one micro-batch (sequence-parallel shard with SP)
    act = ctx.t * cfg.hidden_size * ACT_BYTES / (s.tp if (s.sp and s.tp > 1) else 1)
    sends = [0.0] * n_stages
    if s.pp > 1:
        for i in range(n_stages - 1):
            a, b = i % s.pp, (i + 1) % s.pp
            sends[i] = comm.p2p_between(gr["pp"], a, b, act, hw, eff)
    rs, ag, npar, opt = _dp_times(cfg, roles, plan, s, ctx)
    ready = None
    if s.distributed_optimizer and s.overlap_param_gather and gr["dp"].size * max(1, gr["edp"].size) > 1:
        ready = []
        for r in range(s.pp):
            acc, row = 0.0, []
            for c in range(s.vpp):
                acc += ag[r][c]
                row.append(acc)
            ready.append(row)
    fwd = [c.fwd for c in costs]
    bwd = [c.bwd for c in costs]
    try:
        orders = rank_orders(s.pp, s.vpp, m, s.microbatch_group)
    except ScheduleError as exc:  # a schedule Megatron refuses (VPP without PP, m against PP): fail closed
        raise TimeInputError(str(exc), "vpp" if s.vpp > 1 else "global_batch") from None
    sched = simulate(s.pp, s.vpp, m, fwd, bwd, send_fwd=sends, send_bwd=sends, ready=ready,
                     group=s.microbatch_group, orders=orders)
    no_send = (simulate(s.pp, s.vpp, m, fwd, bwd, ready=ready, group=s.microbatch_group, orders=orders,
                        record=False).makespan if s.pp > 1 and any(sends) else sched.makespan)
    # gradient reduction on each rank's communication stream
    bucket = max(40_000_000, 1_000_000 * gr["dp"].size)
    rank_end = []
    for r in range(s.pp):
        free = 0.0
        ends = sched.last_backward[r]
        order = sorted(range(s.vpp), key=lambda c: ends[c][1])
        for c in order:
            t_rs = rs[r][c]
            if t_rs <= 0:
                continue
            b_start, b_end = sched.last_backward[r][c]
            if s.overlap_grad_reduce:
                tail = t_rs * min(1.0, bucket / max(1, npar[r][c]))
                free = max(free, b_start) + t_rs
                free = max(free, b_end + tail)
            else:
                free = max(free, sched.compute_end[r]) + t_rs
        rank_end.append(max(sched.compute_end[r], free))
    crit = max(range(s.pp), key=lambda r: rank_end[r] + opt[r])
    ag_exposed = 0.0
    if s.distributed_optimizer and not (s.overlap_param_gather and ready is not None):
        ag_exposed = max(sum(row) for row in ag)
    emb_sync = 0.0
    if cfg.tie_word_embeddings and s.pp > 1:
        emb_group = comm.Group("embedding", 2, gr["pp"].stride * (s.pp - 1), hw.nvlink_domain)
        emb_sync = comm.all_reduce(emb_group, cfg.vocab_size * cfg.hidden_size / s.tp *
                                   (4.0 if s.grad_reduce_in_fp32 else 2.0), hw, eff)
    t_opt = opt[crit]
    step = rank_end[crit] + t_opt + ag_exposed + emb_sync
    # ---- breakdown on the critical rank
    mine = [c for c in costs if c.stage.pp_rank == crit]
    busy = sched.busy[crit]
    compute = m * sum(c.compute for c in mine)
    recompute = m * sum(c.recompute for c in mine)
    idle = sched.compute_end[crit] - busy
    pp_exposed = min(idle, max(0.0, sched.makespan - no_send)) if s.pp > 1 else 0.0
    pp_total = m * sum(sends[c.stage.index] + (sends[c.stage.index - 1] if c.stage.index else 0.0) for c in mine)
    dp_exposed = rank_end[crit] - sched.compute_end[crit] + ag_exposed + emb_sync
    dp_total = sum(rs[crit]) + sum(ag[crit]) + emb_sync
    breakdown = {
        "compute": {"exposed": compute, "total": compute},
        "recompute": {"exposed": recompute, "total": recompute},
        "host": {"exposed": m * sum(c.host for c in mine), "total": m * sum(c.host for c in mine)},
        "tp": {"exposed": m * sum(c.tp[0] for c in mine), "total": m * sum(c.tp[1] for c in mine)},
        "cp": {"exposed": m * sum(c.cp[0] for c in mine), "total": m * sum(c.cp[1] for c in mine)},
        "ep": {"exposed": m * sum(c.ep[0] for c in mine), "total": m * sum(c.ep[1] for c in mine)},
        "pp": {"exposed": pp_exposed, "total": pp_total},
        "bubble": {"exposed": idle - pp_exposed, "total": idle - pp_exposed},
        "dp": {"exposed": dp_exposed, "total": dp_total},
        "optimizer": {"exposed": t_opt, "total": t_opt},
    }
    tokens = s.gbs * s.seq_length
    world = s.world
    per_token = model_flops_per_token(cfg, roles, seq_length=s.seq_length, tp=s.tp, mtp_layers=s.mtp_layers,
                                      vocab_divisible_by=s.vocab_divisible_by)
    tflops = per_token * tokens / (step * world) / 1e12
    notes = []
    if s.tp > 1 and not s.sp and cfg.n_routed_experts:
        notes.append("MoE with TP > 1 needs sequence parallelism in Megatron; timed as if SP were on for the MoE")
    return StepTime(
        step_seconds=step,
        tokens_per_second_per_gpu=tokens / (step * world),
        model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / hw.peak_flops(prec.gemm_dtype),
        mfu_bf16=tflops * 1e12 / hw.peak_flops("bf16"),
        bubble_fraction=sched.bubble_fraction,
        breakdown=breakdown,
        per_stage=tuple(c.to_dict() for c in costs),
        schedule=sched,
        critical_rank=crit,
        model_flops_per_token=per_token,
        settings=s,
        hardware=hw,
        groups=gr,
        notes=tuple(notes),
    )
