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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.content_cache import remember, scope
from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import GDN_MODEL_TYPES, ModelConfig
from app.core.model.flops import mtp_role
from app.core.model.hardware import Hardware
from app.core.model.parameters import shapes, stage_params
from app.core.model.roles import LayerRole, RoleMap
from app.core.time import comm
from app.core.time.efficiency import Efficiency, efficiency_for
from app.core.time.model_flops import model_flops_per_token
from app.core.time.ops import ACT_BYTES, LayerCost, OpContext, embedding_cost, head_cost, layer_cost
from app.core.time.precision import get_precision
from app.core.time.schedule import Schedule, ScheduleError, simulate
from app.core.time.settings import TimeInputError, TimeSettings

ADAM_BYTES_PER_PARAM = 30.0
HOST_ADAM_BYTES_PER_PARAM = 32.0  # FP32 master, m, v and the FP32 gradient, read and written
BREAKDOWN = ("compute", "recompute", "host", "tp", "cp", "ep", "pp", "bubble", "dp", "optimizer")
_RECOMPUTE_PARTS = {"core_attn": ("core_attn",), "mlp": ("mlp",),
                    "moe": ("moe", "moe_act", "moe_act_clamp", "expert_bias", "shared_experts"),
                    "moe_act": ("moe_act", "moe_act_clamp"), "mla_up_proj": ("mla_up_proj", "rope"), "layernorm": ("layernorm",),
                    "shared_experts": ("shared_experts",), "gdn_norm_out": ("gdn_norm_out",)}

TERMS = (
    "GEMMs of every linear layer in the plan's precision (forward, data and weight gradients), ceiling x peak "
    "plus operand traffic plus a launch per kernel; the output layer in BF16",
    "flash attention (causal, or DSA sparse over the top-k) and the DSA indexer on layers that own one, BF16; "
    "dense attention on A100 as Megatron's unfused core attention (every published A100 Megatron run predates "
    "flash attention there, so an A100 run with flash attention is predicted slow); a hybrid model's Mamba-2 "
    "scan from its FLOPs at the attention fractions and its kernels' bytes (chunk states in FP32)",
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
            "bubble_fill_drain": self.schedule.fill_drain_fraction,
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
                "bubble": "bubble_fraction: the ranks' idle share of the simulated pipeline (mean over ranks); "
                          "bubble_fill_drain: the part its fill and drain explain, (PP - 1) / (VPP x m + PP - 1) "
                          "(all of it with equal stages and free sends); the rest is ranks waiting on slower "
                          "stages, sends and parameter gathers",
            },
            "notes": list(self.notes),
        }
        if timeline:
            out["timeline"] = self.schedule.timeline()
        return out


#: Families whose predictions are known to miss published measured runs, and by how much (docs/MODELS.md
#: "Model families"): said with every step time of the family.
FAMILY_CAVEATS = {
    "gpt_oss": "GPT-OSS was fitted on nothing: against Megatron-Bridge's 31 published GPT-OSS-120B runs "
               "(docs/performance-summary*.md @ 067f987d; python -m bench steptime, each with its container's "
               "recipe settings) this model's tokens/s/GPU are off by +0 to +56 % in BF16 on B200 / B300 / GB200 / "
               "GB300, +2 to +8 % on H100 and -15 to +44 % in MXFP8 on GB200 / GB300 / B300 (Transformer Engine's "
               "fused expert MLP, which the newer MXFP8 recipes switch on, is not modelled); read it as optimistic",
    "nemotron_h": "hybrid Mamba models: the Mamba-2 kernels are timed from their FLOPs and bytes, the bytes at a "
                  "bandwidth fitted on Nemotron 3 Nano's runs (efficiency.SSD_BANDWIDTH); against Megatron-Bridge's "
                  "20 published Nemotron 3 Nano runs (docs/performance-summary*.md @ 067f987d; python -m bench "
                  "steptime) this model's tokens/s/GPU are off by -8 to +3 % in MXFP8 on B200 / B300 / GB200 / GB300 "
                  "and -8 to +6 % in FP8 on H100, and against its 30 Nemotron 3 Super runs (LatentMoE, two MTP "
                  "depths; not fitted on) by -18 to -13 % on GB200, -2 to +13 % on GB300, +2 to +5 % on B200 and "
                  "-14 to +1 % on B300 (EP 8); read it as uncertain by system",
    **{t: "gated DeltaNet models (Qwen3-Next, Qwen3.5): the delta-rule kernels are timed from their FLOPs and "
          "bytes (app.core.model.gated_delta_net), the bytes at the bandwidth fitted on Mamba-2's Triton kernels "
          "(efficiency.SSD_BANDWIDTH), and their eager ops as any layer's; no published measured run of these "
          "models exists to check it against: read it as unvalidated"
       for t in GDN_MODEL_TYPES},
}

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


def _recompute_seconds(lc: LayerCost, exp: dict[str, float], s: TimeSettings, full: bool) -> tuple[float, float]:
    """(GPU, host) seconds of what recompute re-runs of one layer before its backward: the whole
    forward (full), else the listed modules' parts (:data:`_RECOMPUTE_PARTS`) - their GPU time and
    the host's issue time of their kernels (``LayerCost.host_modules``)."""
    if full:
        return lc.fwd.total + exp["tp_f"] + exp["ep_f"] + exp["cp_f"], lc.host_fwd
    sec = host = 0.0
    for module in s.modules:
        for part in _RECOMPUTE_PARTS[module]:
            sec += lc.modules.get(part, 0.0)
            host += lc.host_modules.get(part, 0.0)
        if module == "moe":
            sec += exp["ep_f"]
    return sec, host


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


def _add_layer(sc: _StageCost, lc: LayerCost, exp: dict[str, float], redo: tuple[float, float] = (0.0, 0.0),
               count: int = 1) -> None:
    """Add ``count`` equal layers to a stage; each direction takes the longer of the GPU stream
    (compute and exposed communication) and the host issuing its kernels (``host_fwd`` / ``host_bwd``):
    ``f = max(fwd + tp_f + ep_f + cp_f, host_fwd)``, ``b = max(bwd + tp_b + ep_b + cp_b + recompute,
    host_bwd + recompute_host)`` with ``redo = (recompute, recompute_host)`` (:func:`_recompute_seconds`)."""
    recompute, recompute_host = redo
    gpu_f = lc.fwd.total + exp["tp_f"] + exp["ep_f"] + exp["cp_f"]
    gpu_b = lc.bwd.total + exp["tp_b"] + exp["ep_b"] + exp["cp_b"] + recompute
    f = max(gpu_f, lc.host_fwd)
    b = max(gpu_b, lc.host_bwd + recompute_host)
    sc.fwd += count * f
    sc.bwd += count * b
    sc.host += count * ((f - gpu_f) + (b - gpu_b))
    sc.compute += count * (lc.fwd.total + lc.bwd.total)
    sc.recompute += count * recompute
    sc.tp[0] += count * (exp["tp_f"] + exp["tp_b"])
    sc.tp[1] += count * (lc.tp_fwd + lc.tp_bwd)
    sc.ep[0] += count * (exp["ep_f"] + exp["ep_b"])
    sc.ep[1] += count * (lc.ep_fwd + lc.ep_bwd)
    sc.cp[0] += count * (exp["cp_f"] + exp["cp_b"])
    sc.cp[1] += count * (lc.cp_fwd + lc.cp_bwd)
    sc.flops += count * lc.flops_fwd


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


#: Layer costs by (model, layer kind, :func:`layer_settings_key`, constants), shared across calls: a
#: live page re-evaluates one plan after every edit and a search times many plans of one layer
#: shape. Bounded: cleared when it holds :data:`LAYER_CACHE_SIZE` settings.
_LAYER_CACHE: dict[Any, dict[Any, Any]] = {}
LAYER_CACHE_SIZE = 512


def _shared_layer_cache(cfg: ModelConfig, s: TimeSettings, ctx: OpContext) -> dict[Any, Any]:
    """The per-layer cost cache for one model, settings and set of constants (:data:`_LAYER_CACHE`)."""
    return scope(_LAYER_CACHE, (cfg, layer_settings_key(s, ctx.hw), ctx.eff.key()), LAYER_CACHE_SIZE)


def _stage_layer_counts(cfg: ModelConfig, roles: RoleMap, st: Stage, s: TimeSettings, first_mtp: int
                        ) -> dict[tuple[Any, bool], tuple[LayerRole, int]]:
    """A stage's decoder and MTP layers grouped by (layer kind, recomputed) with their count:
    equal layers cost the same, so a stage adds each kind once."""
    redo = _recomputed(st, s)
    out: dict[tuple[Any, bool], tuple[LayerRole, int]] = {}
    for n in st.layers:
        role = roles.role(n)
        key: tuple[Any, bool] = (role.kind, n in redo or s.recompute == "selective")
        out[key] = (role, out[key][1] + 1) if key in out else (role, 1)
    for k in range(first_mtp + 1, first_mtp + st.mtp_layers + 1):
        role = mtp_role(cfg, roles, k)
        out[(("mtp", k), s.recompute == "selective")] = (role, 1)
    return out


#: Entries (layer kinds and stages' layer sums) one settings scope of :data:`_LAYER_CACHE` holds
#: before it is cleared.
STAGE_CACHE_SIZE = 8192
#: The fields of :class:`_StageCost` that its layers fill (:func:`_stage_layers`), in order.
_LAYER_SUMS = ("fwd", "bwd", "host", "compute", "recompute", "flops")


def _stage_layers(cfg: ModelConfig, roles: RoleMap, st: Stage, s: TimeSettings, first_mtp: int,
                  cost: Callable[[LayerRole], tuple[LayerCost, dict[str, float]]],
                  cache: dict[Any, Any]) -> _StageCost:
    """A stage's cost from its decoder and MTP layers alone (:func:`_add_layer` over
    :func:`_stage_layer_counts`), cached in ``cache`` - the layer costs of one model, per-layer
    settings and constants - by the stage's layer kinds in order: the stages a drag leaves alone,
    and equal stages of a search's plans, are added once. The sums are the same floats as adding
    the layers again (same kinds, same order)."""
    key = ("stage", roles.kinds_of(st.layers),
           tuple(mtp_role(cfg, roles, k).kind for k in range(first_mtp + 1, first_mtp + st.mtp_layers + 1)))
    found = cache.get(key)
    if found is None:
        sc = _StageCost(st)
        full = s.recompute == "full"
        for (_kind, redo), (role, count) in _stage_layer_counts(cfg, roles, st, s, first_mtp).items():
            lc, exp = cost(role)
            _add_layer(sc, lc, exp, _recompute_seconds(lc, exp, s, full and not role.mtp) if redo else (0.0, 0.0),
                       count)
        found = remember(cache, key, (tuple(getattr(sc, f) for f in _LAYER_SUMS), tuple(sc.tp), tuple(sc.ep),
                                      tuple(sc.cp)), STAGE_CACHE_SIZE)  # bounded: a huge upload's spans are many
    (fwd, bwd, host, compute, recompute, flops), tp, ep, cp = found
    return _StageCost(st, fwd, bwd, compute, recompute, list(tp), list(ep), list(cp), flops, host)


def stage_costs(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, ctx: OpContext,
                cache: dict[Any, Any] | None = None) -> list[_StageCost]:
    """Forward / backward seconds per micro-batch of every stage (vp-major): the sum over its layers
    of :func:`_add_layer` (:func:`_stage_layers`), plus the embedding and the output layer (+ MTP
    logits) on their stages. ``cache``: layer and stage-layer costs by layer kinds, reusable across
    plans whose per-layer settings agree (:func:`quick_step_seconds`); by default the shared
    :data:`_LAYER_CACHE`."""
    cache = _shared_layer_cache(cfg, s, ctx) if cache is None else cache
    ep_share = ep_overlap_share(s)
    ep_sm = min(1.0, EP_COMM_SMS / ctx.hw.sms) if ctx.hw.sms else 0.0

    def cost(role: LayerRole) -> tuple[LayerCost, dict[str, float]]:
        key = role.kind
        if key not in cache:
            lc = layer_cost(ctx, role)
            cache[key] = (lc, _exposed(lc, s, ep_share, ep_sm))
        return cache[key]

    out, mtp_seen = [], 0
    for st in plan.stages:
        sc = _stage_layers(cfg, roles, st, s, mtp_seen, cost, cache)
        mtp_seen += st.mtp_layers
        if st.embedding:
            _add_layer(sc, *_ends_cost(cache, ("embedding",), lambda: embedding_cost(ctx), s))
        if st.loss:
            _add_layer(sc, *_ends_cost(cache, ("head", plan.mtp_layers, s.vocab_divisible_by, s.fp8_output_proj),
                                       lambda: head_cost(ctx, plan.mtp_layers), s))
        out.append(sc)
    return out


def _ends_cost(cache: dict[Any, Any], key: tuple[Any, ...], make: Callable[[], LayerCost], s: TimeSettings
               ) -> tuple[LayerCost, dict[str, float]]:
    """The embedding's or the output layer's cost and its exposed communication, kept in the layer
    cost scope (``cache``: one model, per-layer settings and constants) by ``key``, which names what
    they read beyond the scope (the MTP logits, the padded vocabulary, the FP8 output layer)."""
    found = cache.get(key)
    if found is None:
        lc = make()
        found = cache[key] = (lc, _exposed(lc, s))
    return found


@dataclass(frozen=True)
class _DataParallel:
    """Per rank and chunk: gradient reduction ``rs`` and parameter all-gather ``ag`` seconds and the
    parameters held ``npar``; per rank the optimizer step ``opt``."""

    rs: list[list[float]]
    ag: list[list[float]]
    npar: list[list[int]]
    opt: list[float]


def _param_kinds(roles: RoleMap, st: Stage) -> tuple[Any, ...]:
    """What a stage's parameters read besides the launch: its layers' FFN kinds and indexers, the
    embedding, the loss head and the MTP layers (:func:`app.core.model.parameters.stage_params`)."""
    return tuple((r.ffn, r.has_indexer, r.mixer) for r in roles.of(st.layers)), st.embedding, st.loss, st.mtp_layers


def _optimizer_seconds(shard: float, s: TimeSettings, hw: Hardware, mem_eff: float, grad_b: float) -> float:
    """Adam on ``shard`` parameters: ``shard * 30 B / (HBM * m)`` on the GPU; with CPU offload
    ``shard * 32 B / host_bw + shard * (grad + param bytes) / h2d_bw``."""
    if s.optimizer_cpu_offload:
        return shard * HOST_ADAM_BYTES_PER_PARAM / hw.host_bw + shard * (grad_b + ACT_BYTES) / hw.h2d_bw
    return shard * ADAM_BYTES_PER_PARAM / (hw.hbm_bw * mem_eff)


#: A stage's data-parallel terms (:func:`_stage_dp`) by the launch's scope (model, TP / EP / ETP, the
#: DP and EDP groups, the GPU, the constants, the optimizer's settings) and then the stage's layer
#: kinds, embedding, loss and MTP layers: the stages a drag leaves alone are looked up. Bounded.
_DP_CACHE: dict[Any, dict[Any, tuple[int, float, float, float]]] = {}


def _dp_times(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, ctx: OpContext) -> _DataParallel:
    """Each chunk's gradient reduce-scatter of its dense (DP x CP group) and expert (EDP group)
    parameters at ``grad_b`` bytes and its parameter all-gather at the precision's
    ``param_gather_bytes`` (without the distributed optimizer: an all-reduce, nothing gathered),
    and each rank's optimizer step on its shard ``dense / DP + expert / EDP`` (:func:`_stage_dp`)."""
    gr = ctx.groups
    grad_b = 4.0 if s.grad_reduce_in_fp32 else 2.0
    dp = _DataParallel([[0.0] * s.vpp for _ in range(s.pp)], [[0.0] * s.vpp for _ in range(s.pp)],
                       [[0] * s.vpp for _ in range(s.pp)], [0.0] * s.pp)
    kept = scope(_DP_CACHE, (cfg, s.tp, s.ep, s.etp_, gr["dp"], gr["edp"], ctx.hw, ctx.eff.key(),
                             ctx.prec.param_gather_bytes, grad_b, s.distributed_optimizer, s.optimizer_cpu_offload),
                 LAYER_CACHE_SIZE)
    for st in plan.stages:
        key = _param_kinds(roles, st)
        found = kept.get(key)
        if found is None:
            found = remember(kept, key, _stage_dp(cfg, roles, st, s, ctx, grad_b), STAGE_CACHE_SIZE)
        r, c = st.pp_rank, st.vp_stage
        dp.npar[r][c], dp.rs[r][c], dp.ag[r][c] = found[0], found[1], found[2]
        dp.opt[r] += found[3]
    return dp


def _stage_dp(cfg: ModelConfig, roles: RoleMap, st: Stage, s: TimeSettings, ctx: OpContext, grad_b: float
              ) -> tuple[int, float, float, float]:
    """One stage's parameters held per GPU, gradient reduction and parameter all-gather seconds,
    and its part of the rank's optimizer step (:func:`_dp_times`)."""
    hw, eff, gr = ctx.hw, ctx.eff, ctx.groups
    par_b = ctx.prec.param_gather_bytes
    p = stage_params(cfg, roles, [st], tp=s.tp, ep=s.ep, etp=s.etp_)  # cached there by what it reads
    if s.distributed_optimizer:
        rs = (comm.reduce_scatter(gr["dp"], p.dense_per_gpu * grad_b, hw, eff)
              + comm.reduce_scatter(gr["edp"], p.expert_per_gpu * grad_b, hw, eff))
        ag = (comm.all_gather(gr["dp"], p.dense_per_gpu * par_b, hw, eff)
              + comm.all_gather(gr["edp"], p.expert_per_gpu * par_b, hw, eff))
    else:
        rs = (comm.all_reduce(gr["dp"], p.dense_per_gpu * grad_b, hw, eff)
              + comm.all_reduce(gr["edp"], p.expert_per_gpu * grad_b, hw, eff))
        ag = 0.0
    dense_shard = gr["dp"].size if s.distributed_optimizer else 1
    expert_shard = gr["edp"].size if s.distributed_optimizer else 1
    shard = p.dense_per_gpu / dense_shard + p.expert_per_gpu / expert_shard
    return p.per_gpu, rs, ag, _optimizer_seconds(shard, s, hw, eff.mem, grad_b)


def layer_settings_key(s: TimeSettings, hw: Hardware) -> tuple[Any, ...]:
    """What one layer's cost depends on: its TP / CP / EP / ETP groups and their placement, the
    micro-batch's tokens, recompute, precision, overlaps (the EP overlap by the share of steps it pairs,
    which PP, VPP and the micro-batch count set) - not otherwise PP, VPP, DP or the layout."""
    return (hw, s.tp, s.cp, s.ep, s.etp_, s.sp, s.mbs, s.seq_length, s.recompute, s.recompute_method,
            s.recompute_num_layers, s.modules, s.precision, s.tp_comm_overlap, ep_overlap_share(s), s.cp_comm_type,
            s.moe_dispatcher, s.fp8_attention, s.cuda_graph)


def _context(cfg: ModelConfig, s: TimeSettings, hw: Hardware, efficiency: Efficiency | None = None) -> OpContext:
    """The op context of a launch: precision, constants of the GPU's generation, placed groups."""
    prec = get_precision(s.precision)
    try:
        hw.peak_flops(prec.gemm_dtype)
    except ValueError as exc:
        raise TimeInputError(str(exc), "precision") from None
    eff = efficiency or efficiency_for(hw.generation)
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    return OpContext(cfg, shapes(cfg), s, hw, eff, prec, gr)


def quick_step_seconds(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, s: TimeSettings, hw: Hardware,
                       cache: dict[Any, Any]) -> float:
    """A fast estimate of :func:`step_time`'s ``step_seconds`` for ranking many plans (the GPU-budget
    search): the same per-stage costs, but the pipeline by its closed form instead of the
    simulation - ``m x max_r T_r + (PP - 1) x max_r T_r / VPP`` with ``T_r`` a rank's forward +
    backward per micro-batch (exact for equal stages: ``(V m + P - 1) c``) - and the gradient
    reduce-scatter / parameter all-gather exposed unless overlapped. ``cache`` maps
    :func:`layer_settings_key` to layer costs shared across plans."""
    ctx = _context(cfg, s, hw)
    costs = stage_costs(cfg, roles, plan, s, ctx, cache.setdefault(layer_settings_key(s, hw), {}))
    per_rank = [0.0] * s.pp
    for c in costs:
        per_rank[c.stage.pp_rank] += c.fwd + c.bwd
    slowest = max(per_rank)
    pipeline = s.num_microbatches * slowest + (s.pp - 1) * slowest / s.vpp
    d = _dp_times(cfg, roles, plan, s, ctx)
    dp = 0.0 if s.overlap_grad_reduce else max(sum(row) for row in d.rs)
    if s.distributed_optimizer and not s.overlap_param_gather:
        dp += max(sum(row) for row in d.ag)
    return pipeline + dp + max(d.opt)


def _pp_sends(cfg: ModelConfig, s: TimeSettings, ctx: OpContext, n_stages: int) -> list[float]:
    """Seconds to send one micro-batch's activation ``t * H * 2 B`` (``/ TP`` with SP) across each
    stage boundary ``i -> i + 1``, on the link between pipeline ranks ``i % PP`` and ``(i + 1) % PP``."""
    act = ctx.t * cfg.hidden_size * ACT_BYTES / (s.tp if (s.sp and s.tp > 1) else 1)
    sends = [0.0] * n_stages
    if s.pp > 1:
        for i in range(n_stages - 1):
            sends[i] = comm.p2p_between(ctx.groups["pp"], i % s.pp, (i + 1) % s.pp, act, ctx.hw, ctx.eff)
    return sends


def _params_ready(s: TimeSettings, ctx: OpContext, dp: _DataParallel) -> list[list[float]] | None:
    """With ``overlap_param_gather``: when chunk ``c`` of rank ``r`` may start, ``sum_{c' <= c}
    ag[r][c']`` (the chunks gathered in order on a communication stream); else None."""
    gr = ctx.groups
    if not (s.distributed_optimizer and s.overlap_param_gather and gr["dp"].size * max(1, gr["edp"].size) > 1):
        return None
    ready = []
    for r in range(s.pp):
        acc, row = 0.0, []
        for c in range(s.vpp):
            acc += dp.ag[r][c]
            row.append(acc)
        ready.append(row)
    return ready


def _pipeline(s: TimeSettings, costs: list[_StageCost], sends: list[float], ready: list[list[float]] | None,
              record: bool) -> tuple[Schedule, float]:
    """The simulated schedule with the PP sends, and the makespan of the same schedule with free
    sends (what the sends expose is the difference), both from one pass over the step graph."""
    m = s.num_microbatches
    fwd, bwd = [c.fwd for c in costs], [c.bwd for c in costs]
    both = s.pp > 1 and any(sends)
    try:
        sched = simulate(s.pp, s.vpp, m, fwd, bwd, send_fwd=sends, send_bwd=sends, ready=ready,
                         group=s.microbatch_group, record=record, free_sends=both)
    except ScheduleError as exc:  # a schedule Megatron refuses (VPP without PP, m against PP): fail closed
        raise TimeInputError(str(exc), "vpp" if s.vpp > 1 else "global_batch") from None
    return sched, sched.free_makespan if sched.free_makespan is not None else sched.makespan


def _gradient_ends(s: TimeSettings, ctx: OpContext, sched: Schedule, dp: _DataParallel) -> list[float]:
    """When each rank's compute and gradient reduction end. With ``overlap_grad_reduce`` chunk
    ``c``'s reduce-scatter ``t`` starts at its last backward's start ``b0`` (after the previous
    chunk's) and ends no earlier than that backward's end ``b1`` plus one bucket's share
    ``t * min(1, bucket / params)``, ``bucket = max(40M, 1M * DP)``; without, all run after the
    rank's last step."""
    bucket = max(40_000_000, 1_000_000 * ctx.groups["dp"].size)
    out = []
    for r in range(s.pp):
        free = 0.0
        ends = sched.last_backward[r]
        for c in sorted(range(s.vpp), key=lambda c: ends[c][1]):
            t_rs = dp.rs[r][c]
            if t_rs <= 0:
                continue
            b_start, b_end = ends[c]
            if s.overlap_grad_reduce:
                free = max(max(free, b_start) + t_rs, b_end + t_rs * min(1.0, bucket / max(1, dp.npar[r][c])))
            else:
                free = max(free, sched.compute_end[r]) + t_rs
        out.append(max(sched.compute_end[r], free))
    return out


def _step_tail(cfg: ModelConfig, s: TimeSettings, ctx: OpContext, dp: _DataParallel, overlapped_gather: bool
               ) -> tuple[float, float]:
    """What follows the optimizer on every rank: the parameter all-gather when not overlapped
    (``max_r sum_c ag[r][c]``), and the tied-embedding gradient all-reduce between the first and the
    last pipeline rank (``V * H / TP`` gradients)."""
    ag_exposed = 0.0
    if s.distributed_optimizer and not overlapped_gather:
        ag_exposed = max(sum(row) for row in dp.ag)
    emb_sync = 0.0
    if cfg.tie_word_embeddings and s.pp > 1:
        hw, gr = ctx.hw, ctx.groups
        emb_group = comm.Group("embedding", 2, gr["pp"].stride * (s.pp - 1), hw.nvlink_domain)
        emb_sync = comm.all_reduce(emb_group, cfg.vocab_size * cfg.hidden_size / s.tp *
                                   (4.0 if s.grad_reduce_in_fp32 else 2.0), hw, ctx.eff)
    return ag_exposed, emb_sync


def _breakdown(s: TimeSettings, costs: list[_StageCost], sends: list[float], sched: Schedule, free_makespan: float,
               crit: int, rank_end: float, opt: float, dp_total: float, tail: float) -> dict[str, dict[str, float]]:
    """Seconds per step on the critical rank ``crit``: per-stage items times ``m``; the PP sends
    exposed ``min(idle, makespan - makespan with free sends)``, the rest of the idle time bubble;
    DP what follows its last step (``rank_end - compute_end + tail``)."""
    m = s.num_microbatches
    mine = [c for c in costs if c.stage.pp_rank == crit]

    def total(attr: str, i: int | None = None) -> float:
        return m * sum((getattr(c, attr) if i is None else getattr(c, attr)[i]) for c in mine)

    idle = sched.compute_end[crit] - sched.busy[crit]
    pp_exposed = min(idle, max(0.0, sched.makespan - free_makespan)) if s.pp > 1 else 0.0
    pp_total = m * sum(sends[c.stage.index] + (sends[c.stage.index - 1] if c.stage.index else 0.0) for c in mine)
    out = {name: {"exposed": total(name), "total": total(name)} for name in ("compute", "recompute", "host")}
    out.update({name: {"exposed": total(name, 0), "total": total(name, 1)} for name in ("tp", "cp", "ep")})
    out["pp"] = {"exposed": pp_exposed, "total": pp_total}
    out["bubble"] = {"exposed": idle - pp_exposed, "total": idle - pp_exposed}
    out["dp"] = {"exposed": rank_end - sched.compute_end[crit] + tail, "total": dp_total}
    out["optimizer"] = {"exposed": opt, "total": opt}
    return {name: out[name] for name in BREAKDOWN}


def step_time(cfg: ModelConfig, roles: RoleMap, stage_plan: StagePlan, settings: TimeSettings, hardware: Hardware,
              *, efficiency: Efficiency | None = None, record: bool = True) -> StepTime:
    """The time of one training step (module docstring): ``step_seconds = rank_end[crit] +
    opt[crit] + exposed all-gather + tied-embedding all-reduce``, ``crit`` the rank whose end of
    compute and gradient reduction plus optimizer is latest. ``record=False`` keeps no timeline.
    Raises :class:`TimeInputError` for settings or a layout it cannot time."""
    s, hw, plan = settings, hardware, stage_plan
    _check(cfg, plan, s)
    ctx = _context(cfg, s, hw, efficiency)
    costs = stage_costs(cfg, roles, plan, s, ctx)
    sends = _pp_sends(cfg, s, ctx, len(costs))
    dp = _dp_times(cfg, roles, plan, s, ctx)
    ready = _params_ready(s, ctx, dp)
    sched, free_makespan = _pipeline(s, costs, sends, ready, record)
    rank_end = _gradient_ends(s, ctx, sched, dp)
    crit = max(range(s.pp), key=lambda r: rank_end[r] + dp.opt[r])
    ag_exposed, emb_sync = _step_tail(cfg, s, ctx, dp, ready is not None)
    step = rank_end[crit] + dp.opt[crit] + ag_exposed + emb_sync
    breakdown = _breakdown(s, costs, sends, sched, free_makespan, crit, rank_end[crit], dp.opt[crit],
                           sum(dp.rs[crit]) + sum(dp.ag[crit]) + emb_sync, ag_exposed + emb_sync)
    return _result(cfg, roles, s, hw, ctx, step, breakdown, costs, sched, crit)


def _result(cfg: ModelConfig, roles: RoleMap, s: TimeSettings, hw: Hardware, ctx: OpContext, step: float,
            breakdown: dict[str, dict[str, float]], costs: list[_StageCost], sched: Schedule, crit: int) -> StepTime:
    """Tokens/s/GPU ``GBS * seq / (step * world)``, model TFLOP/s/GPU (``model_flops_per_token``,
    Megatron-Bridge's convention) and MFU over the dense peak of the GEMM precision and of BF16."""
    tokens = s.gbs * s.seq_length
    per_token = model_flops_per_token(cfg, roles, seq_length=s.seq_length, tp=s.tp, mtp_layers=s.mtp_layers,
                                      vocab_divisible_by=s.vocab_divisible_by)
    tflops = per_token * tokens / (step * s.world) / 1e12
    notes = []
    if s.tp > 1 and not s.sp and cfg.n_routed_experts:
        notes.append("MoE with TP > 1 needs sequence parallelism in Megatron; timed as if SP were on for the MoE")
    if cfg.model_type in FAMILY_CAVEATS:
        notes.append(FAMILY_CAVEATS[cfg.model_type])
    return StepTime(
        step_seconds=step, tokens_per_second_per_gpu=tokens / (step * s.world), model_tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / hw.peak_flops(ctx.prec.gemm_dtype), mfu_bf16=tflops * 1e12 / hw.peak_flops("bf16"),
        bubble_fraction=sched.bubble_fraction, breakdown=breakdown, per_stage=tuple(c.to_dict() for c in costs),
        schedule=sched, critical_rank=crit, model_flops_per_token=per_token, settings=s, hardware=hw,
        groups=ctx.groups, notes=tuple(notes))
