"""Per-layer operation costs: the forward and backward time of every op class of one layer, for
one micro-batch on one GPU, and the bytes each parallel dimension moves for it.

Per GPU and micro-batch, ``t = mbs * seq / CP`` tokens go through the GEMMs (each TP rank holds a
``1/TP`` slice of every TP-sharded weight), ``t_sp = t / TP`` through the sequence-parallel
elementwise ops when SP is on, and ``t_moe`` (= ``t_sp`` with TP > 1, MoE needs SP) into the MoE
layer. The GEMMs of one layer, as (M, N, K) per GPU (Megatron-Core module shapes,
``megatron/core/transformer/`` ``attention.py``, ``multi_latent_attention.py``, ``mlp.py``,
``moe/experts.py``; TP sharding as :mod:`app.core.model.parameters`):

* GQA / MHA: ``qkv (t, (h/TP + 2 g') d, H)`` with ``g' = g/TP`` key-value heads per GPU (one whole
  group when TP > g), ``proj (t, H, h d / TP)``;
* MLA: ``q_a (t_sp, rq, H)`` and ``kv_a (t_sp, rkv + dr, H)`` (the down projections run on the
  sequence-parallel shard and their small outputs are gathered), ``q_b (t, h (dn+dr) / TP, rq)``,
  ``kv_b (t, h (dn+dv) / TP, rkv)``, ``o (t, H, h dv / TP)``; the DSA indexer (on layers that own
  one, duplicated over TP) ``wq_b (t, Hi di, rq)``, ``wk (t, di, H)``, ``weights (t, Hi, H)``;
* dense MLP ``fc1 (t, 2I/TP, H)`` (gated; ``I/TP`` for a 2-matrix GELU MLP), ``fc2 (t, H, I/TP)``;
* MoE: router ``(t_moe, E, H)``; routed experts as grouped GEMMs over the ``E/EP`` local experts,
  each getting ``M_e = t_moe * topk * EP * ETP / E`` tokens (force-balanced routing, the measured
  runs' setting), ``fc1 (M_e, 2i/ETP, H)``, ``fc2 (M_e, H, i/ETP)``; shared experts as a TP-sharded
  dense MLP of width ``S * i``; LatentMoE (``moe_latent_size`` L): ``latent_fc1 (t_moe, L, H)`` and
  ``latent_fc2 (t_moe, H, L)`` around the experts, which take L for H, and L-wide dispatch / combine;
* a hybrid model's Mamba-2 mixer (:mod:`app.core.model.hybrid`): ``in_proj (t, (2d + 2GN + heads)/TP, H)``
  and ``out_proj (t, H, d/TP)``; its fused conv + SSD scan + gated norm as the attention core is
  timed: the scan's FLOPs (``ssm_scan``, over TP) at the attention fractions of the BF16 peak, 2.5 x
  backward as flash attention's (the backward recomputes the chunk states and forms three
  gradients), plus the kernels' bytes over HBM (``MambaDims.scan_bytes_per_token``), three times
  backward (it recomputes the conv and the states), at ``Efficiency.ssd_bw`` of the rate a streaming
  kernel reaches (fitted: ``efficiency.SSD_BANDWIDTH``). A hybrid layer has one norm, one
  residual add and one module; its attention applies no RoPE (Nemotron-H's attention layers carry
  no position embedding: ``NemotronHAttention`` rotates nothing, the Mamba layers give the order);
  its kernel gaps and host operations are counted as a whole layer's (:data:`HOST_LAYER_OPS`: more
  than one module issues, on the safe side; only micro-batch-1 MoE runs are host-bound);
* the loss stage's output layer ``(t, V/TP, H)`` in BF16 (Megatron's ``output_layer`` is not a
  Transformer Engine module) and each MTP layer's ``eh_proj (t, H/TP, 2H)`` and its logits.

Backward: a data-gradient and a weight-gradient GEMM per forward GEMM, each with the forward's
FLOPs (shapes ``(M, K, N)`` and ``(K, N, M)``). The total of the GEMM FLOPs times TP equals
:func:`app.core.model.flops.sequence_layer_flops`' ``linear`` term less the norm gains
(``tests/core/time/test_time_model.py``); the attention core and the indexer scoring take that module's
``sparse_attention`` / ``indexer_*`` terms (divided by TP * CP; the indexer is duplicated over TP,
so by CP only). Flash-attention backward is 2.5 x its forward FLOPs (five GEMMs against two);
the indexer's backward runs over the selected top-k pairs only (as ``training_flops``).

Memory-bound work per token (elements of 2 B; ``t_sp`` tokens for norms and residual adds): two
norms ``2 x 2H`` (Gemma 2's four ``4 x 2H``), two residual adds ``2 x 3H``, RoPE ``2 x (q + k rope dims)``, the MLA latent
norms ``2 (rq + rkv)``, the activation (``3 x width`` gated, ``2 x`` GELU), the MoE router
softmax / top-k ``4E`` and the fused permutation and un-permutation ``2 (topk + 1) H``, plus the
quantisation of every GEMM input (``Precision.quant_bytes`` per element) and, on DSA layers, the
FP32 indexer logits written and read for the top-k. Backward moves twice the forward's bytes. The
eager PyTorch ops Megatron runs unfused - RoPE under a YaRN attention factor, a clamped gated
activation's clamps, the experts' FP32 ``fc2`` bias - move their own bytes each way
(:data:`UNFUSED_ROPE_BYTES`) and are issued by the host one raw op each (:func:`_eager_host_ops`).
Every GEMM is two kernels (quantise + GEMM) forward and three backward, every layer eight more
elementwise kernels (twelve more with MoE).

Communication per layer (bytes per GPU, timed in :mod:`app.core.time.comm`): TP with SP two
all-gathers (of the quantized GEMM input, :func:`_add_communication`) and two reduce-scatters of
the ``t x H`` BF16 activation forward and backward (an MoE
layer with ETP = 1 only the attention's two), without SP two all-reduces; EP an all-to-all
dispatch and combine of ``t_moe * topk * H`` BF16 forward and again backward (sent once per remote
NVLink domain with the ``flex`` dispatcher, :func:`app.core.time.comm.all_to_all`); CP the key/value
chunks ``(CP - 1)`` times around the ring forward and twice that backward (``p2p``), or an
all-gather forward and a reduce-scatter backward (``allgather``, which DSA requires).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from app.core.model.config import ModelConfig
from app.core.model.flops import sequence_layer_flops
from app.core.model.hardware import Hardware
from app.core.model.hybrid import MambaDims
from app.core.model.parameters import Shapes
from app.core.model.roles import LayerRole
from app.core.time.efficiency import Efficiency
from app.core.time.model_flops import padded_vocab
from app.core.time.precision import Precision
from app.core.time.settings import TimeSettings

ACT_BYTES = 2  # BF16 activations
FA_BWD_FLOPS = 2.5  # flash-attention backward / forward kernel FLOPs (5 GEMMs vs 2)
#: FP8 attention (``--fp8-dot-product-attention``) reaches a smaller share of the FP8 peak than BF16
#: attention of the BF16 peak: FlashAttention-3 on H100, "FP16 reaching up to 740 TFLOPs/s (75%
#: utilization), and with FP8 reaching close to 1.2 PFLOPs/s" (Shah et al. 2024, arXiv 2407.08608,
#: abstract): 1.2 / 1.979 = 0.61 against 0.75, i.e. 0.81 x the BF16 fraction, on the FP8 peak.
FP8_ATTN_FRACTION = (1.2 / 1.979) / (0.740 / 0.989)
#: Rows and columns of a flash-attention tile: the kernels compute the score matrix in whole
#: ``128 x 128`` blocks of queries and keys (cuDNN's and FlashAttention-3 / -4's tiles for head
#: dimensions up to 128), skipping only the blocks a mask leaves empty.
ATTN_TILE = 128


def window_tile_factor(seq_length: int, window: int, tile: int = ATTN_TILE) -> float:
    """How much more a flash kernel computes per useful pair under a sliding ``window`` than under
    full causal attention (whose efficiency the constants state). A query block ``i`` of ``tile``
    rows reaches back ``window - 1`` keys before its first row, so it touches ``min(i, c) + 1`` key
    blocks, ``c = ceil((window - 1) / tile)``; causal attention touches ``i + 1``. The computed
    ``blocks x tile^2`` over the useful pairs (:func:`app.core.model.flops.window_pairs`), as a ratio
    of the two: 1 without a window, about 2 for a 128-key window at any length (two blocks for 128
    useful keys per query), 1.12 for 1,024 keys."""
    from app.core.model.flops import causal_pairs, window_pairs

    n = -(-seq_length // tile)
    c = -(-(window - 1) // tile) if window else n
    if not window or n <= c + 1:
        return 1.0
    windowed = c * (c + 1) // 2 + (n - c) * (c + 1)
    causal = n * (n + 1) // 2
    return (windowed / window_pairs(seq_length, window)) / (causal / causal_pairs(seq_length))


def head_dim_factor(eff: Efficiency, head_dim: int) -> tuple[float, float]:
    """(forward, backward) share of the stated attention efficiency a head dimension keeps:
    :attr:`Efficiency.attn_head64` at 64 and below, 1 from 128 (MLA's 192 / 128 too), linear in
    between. The softmax's work per score does not shrink with the head, the matmuls' does."""
    if not head_dim or head_dim >= 128:
        return 1.0, 1.0
    w = max(0.0, (head_dim - 64) / 64)
    f64, b64 = eff.attn_head64
    return f64 + (1 - f64) * w, b64 + (1 - b64) * w


@dataclass(frozen=True)
class Gemm:
    name: str
    m: float
    n: float
    k: float
    count: float = 1.0  # grouped GEMMs: the number of equal problems in one kernel
    low_precision: bool = True  # runs in the plan's precision (else BF16)
    module: str = ""  # recompute module it belongs to
    grouped: bool = False  # a routed-expert grouped GEMM (its own ceiling, Efficiency.gemm_grouped)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass
class Cost:
    """Seconds by op class (one direction of one micro-batch)."""

    gemm: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    kernel: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.memory + self.kernel

    def add(self, other: Cost, scale: float = 1.0) -> Cost:
        self.gemm += other.gemm * scale
        self.attention += other.attention * scale
        self.memory += other.memory * scale
        self.kernel += other.kernel * scale
        return self


@dataclass
class LayerCost:
    """One layer, one micro-batch, one GPU: compute per direction, recomputable parts, and the
    raw communication seconds per dimension (before any overlap)."""

    fwd: Cost = field(default_factory=Cost)
    bwd: Cost = field(default_factory=Cost)
    modules: dict[str, float] = field(default_factory=dict)  # recompute module -> forward seconds
    tp_fwd: float = 0.0
    tp_bwd: float = 0.0
    tp_gemm_fwd: float = 0.0  # GEMM time a TP overlap can hide communication under
    tp_gemm_bwd: float = 0.0
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    cp_fwd: float = 0.0
    cp_bwd: float = 0.0
    cp_overlappable: bool = True
    attn_fwd: float = 0.0
    attn_bwd: float = 0.0
    flops_fwd: float = 0.0  # executed forward FLOPs on this GPU (GEMMs + attention)
    host_fwd: float = 0.0  # seconds the host needs to issue the layer's kernels (eager mode)
    host_bwd: float = 0.0
    host_modules: dict[str, float] = field(default_factory=dict)  # recompute part -> forward host seconds


@dataclass(frozen=True)
class OpContext:
    cfg: ModelConfig
    sh: Shapes
    s: TimeSettings
    hw: Hardware
    eff: Efficiency
    prec: Precision
    groups: dict  # dim -> comm.Group

    @property
    def t(self) -> float:
        return self.s.mbs * self.s.seq_length / self.s.cp

    @property
    def t_sp(self) -> float:
        return self.t / self.s.tp if (self.s.sp and self.s.tp > 1) else self.t

    @property
    def t_moe(self) -> float:
        return self.t / self.s.tp if self.s.tp > 1 else self.t


def tile_factor(eff: Efficiency, weight_side: float, token_side: float) -> float:
    """The work a GEMM kernel does over its useful work: it computes whole output tiles
    (``Efficiency.gemm_tile``), so a side that is not a multiple of the tile's pays for the rest of
    the last one - ``ceil(w / Tw) Tw / w x ceil(t / Tt) Tt / t`` (GPT-OSS's 2,880 features: 3,072 /
    2,880 on Blackwell's 256-wide side)."""
    tw, tt = eff.gemm_tile
    return (math.ceil(weight_side / tw) * tw / weight_side) * (math.ceil(token_side / tt) * tt / token_side)


def gemm_seconds(ctx: OpContext, m: float, n: float, k: float, *, low: bool, count: float = 1.0,
                 out_bytes: float = ACT_BYTES, grouped: bool = False, tile: tuple[float, float] | None = None) -> float:
    """One GEMM kernel (``count`` equal problems): tensor time at the ceiling - of the whole tiles
    its output ``tile = (weight side, token side)`` takes (:func:`tile_factor`) - plus operand
    traffic plus the launch (:mod:`app.core.time.efficiency`)."""
    if m <= 0 or n <= 0 or k <= 0 or count <= 0:
        return 0.0
    dtype = ctx.prec.gemm_dtype if low else "bf16"
    in_b = ctx.prec.gemm_bytes if low else ACT_BYTES
    flops = 2.0 * m * n * k * count * (tile_factor(ctx.eff, *tile) if tile else 1.0)
    nbytes = ((m * k + k * n) * in_b + m * n * out_bytes) * count
    return (flops / (ctx.hw.peak_flops(dtype) * ctx.eff.gemm_ceiling(dtype, grouped))
            + nbytes / (ctx.hw.hbm_bw * ctx.eff.mem) + ctx.eff.kernel)


def mem_seconds(ctx: OpContext, nbytes: float) -> float:
    return nbytes / (ctx.hw.hbm_bw * ctx.eff.mem) if nbytes > 0 else 0.0


def layer_gemms(ctx: OpContext, role: LayerRole) -> list[Gemm]:
    """The forward GEMMs of one layer per GPU (module docstring)."""
    cfg, s = ctx.cfg, ctx.s
    H, h, tp = cfg.hidden_size, cfg.num_attention_heads, s.tp
    t, t_sp, t_moe = ctx.t, ctx.t_sp, ctx.t_moe
    out: list[Gemm] = []
    if role.mixer == "mamba":
        m = cfg.mamba
        assert m is not None
        out.append(Gemm("in_proj", t, m.in_proj_out / tp, H, module="mamba"))
        out.append(Gemm("out_proj", t, H, m.d_inner / tp, module="mamba"))
    elif role.mixer == "gdn":   # a gated DeltaNet's two projections, column- and row-parallel
        gd = cfg.gdn
        assert gd is not None
        out.append(Gemm("in_proj", t, gd.in_proj_out / tp, H, module="attn_proj"))
        out.append(Gemm("out_proj", t, H, gd.value_dim / tp, module="attn_proj"))
    elif role.mixer == "none":
        pass
    elif cfg.attention == "gqa":
        d, g = cfg.head_dim, cfg.num_key_value_heads
        g_gpu = g / tp if g >= tp else 1
        gate = h / tp if cfg.attention_output_gate else 0   # Qwen3-Next's q_proj also makes the output gate
        out.append(Gemm("qkv", t, (h / tp + gate + 2 * g_gpu) * d, H, module="attn_proj"))
        out.append(Gemm("proj", t, H, h * d / tp, module="attn_proj"))
    else:
        rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if rq:
            out.append(Gemm("q_a", t_sp, rq, H, module="attn_proj"))
            out.append(Gemm("q_b", t, h * (dn + dr) / tp, rq, module="mla_up_proj"))
        else:
            out.append(Gemm("q", t, h * (dn + dr) / tp, H, module="attn_proj"))
        out.append(Gemm("kv_a", t_sp, rkv + dr, H, module="attn_proj"))
        out.append(Gemm("kv_b", t, h * (dn + dv) / tp, rkv, module="mla_up_proj"))
        out.append(Gemm("o", t, H, h * dv / tp, module="attn_proj"))
        if role.has_indexer:
            hi, di = cfg.index_n_heads, cfg.index_head_dim
            out.append(Gemm("idx_wq_b", t, hi * di, rq or H, module="indexer"))
            out.append(Gemm("idx_wk", t, di, H, module="indexer"))
            out.append(Gemm("idx_weights", t, hi, H, module="indexer"))
    if role.mtp:
        out.append(Gemm("eh_proj", t, H / tp, 2 * H, module="mtp"))
    fc1 = 2 if cfg.gated_mlp else 1  # gate and up, or up alone
    if role.ffn == "dense":
        width = cfg.intermediate_size
        out.append(Gemm("fc1", t, fc1 * width / tp, H, module="mlp"))
        out.append(Gemm("fc2", t, H, width / tp, module="mlp"))
    elif role.ffn == "moe":
        E, topk, i = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        ep, etp = s.ep, s.etp_
        local = -(-E // ep)
        m_e = t_moe * topk * ep * etp / E
        d_in = cfg.moe_latent_size or H
        out.append(Gemm("router", t_moe, E, H, low_precision=False, module="moe"))
        if cfg.moe_latent_size:   # LatentMoE's projections, duplicated over TP (Megatron moe_layer.py)
            out.append(Gemm("latent_fc1", t_moe, d_in, H, module="moe"))
            out.append(Gemm("latent_fc2", t_moe, H, d_in, module="moe"))
        out.append(Gemm("experts_fc1", m_e, fc1 * i / etp, d_in, count=local, module="moe", grouped=True))
        out.append(Gemm("experts_fc2", m_e, d_in, i / etp, count=local, module="moe", grouped=True))
        if cfg.n_shared_experts:
            width = cfg.n_shared_experts * i
            out.append(Gemm("shared_fc1", t, fc1 * width / tp, H, module="shared_experts"))
            out.append(Gemm("shared_fc2", t, H, width / tp, module="shared_experts"))
    return out


def _elementwise(ctx: OpContext, role: LayerRole, gemms: list[Gemm]) -> dict[str, float]:
    """Forward HBM bytes of the memory-bound work by recompute module (module docstring)."""
    cfg, s = ctx.cfg, ctx.s
    H, h, tp = cfg.hidden_size, cfg.num_attention_heads, s.tp
    t, t_sp, t_moe = ctx.t, ctx.t_sp, ctx.t_moe
    b = ACT_BYTES
    hybrid = cfg.layer_mixers is not None  # one norm, one residual add and one module a layer
    out = {"layernorm": cfg.norms_per_layer * 2 * H * t_sp * b, "residual": (1 if hybrid else 2) * 3 * H * t_sp * b}
    if role.mixer == "mamba":
        assert cfg.mamba is not None
        out["mamba"] = cfg.mamba.scan_bytes_per_token() / tp * t
        if s.mbs > 1:  # the sequence-first layout is copied to batch-first and back (MAMBA_LAYOUT_BYTES)
            out["mamba_layout"] = MAMBA_LAYOUT_BYTES * (cfg.mamba.in_proj_out + cfg.mamba.d_inner) / tp * t
    elif role.mixer == "gdn":   # conv and delta rule at the Triton kernels' rate, then the gated norm
        assert cfg.gdn is not None
        out["gdn"] = cfg.gdn.scan_bytes_per_token() / tp * t
        out["gdn_norm_out"] = cfg.gdn.norm_bytes_per_token() / tp * t
    elif role.mixer == "attention" and hybrid:
        out["rope"] = 0.0  # Nemotron-H's attention carries no position embedding (module docstring)
    elif role.mixer == "attention" and cfg.attention == "gqa":
        d, g = cfg.head_dim, cfg.num_key_value_heads
        g_gpu = g / tp if g >= tp else 1
        out["mla_up_proj"] = 0.0
        if cfg.rope_attention_factor == 1.0:
            out["rope"] = 2 * (h / tp + g_gpu) * d * t * b
        else:
            out["rope_unfused"] = UNFUSED_ROPE_BYTES[0] * (h / tp + g_gpu) * d * t
    elif role.mixer == "attention":
        dr = cfg.qk_rope_head_dim
        out["rope"] = 2 * (h / tp * dr + dr) * t * b
        out["mla_up_proj"] = 2 * ((cfg.q_lora_rank or 0) + cfg.kv_lora_rank) * t_sp * b
    act = 3 if cfg.gated_mlp else 2  # the activation reads gate and up (or up) and writes its output
    if role.ffn == "dense":
        out["mlp"] = act * cfg.intermediate_size / tp * t * b
    elif role.ffn == "moe":
        E, topk, i = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        out["moe_act"] = act * i * t_moe * topk * b
        if cfg.activation_clamp:
            out["moe_act_clamp"] = CLAMP_BYTES[0] * 2 * i * t_moe * topk
        if cfg.expert_bias:
            out["expert_bias"] = EXPERT_BIAS_BYTES[0] * (cfg.moe_latent_size or H) * t_moe * topk * s.etp_
        out["moe"] = (4 * E + 2 * topk * (cfg.moe_latent_size or H) + 2 * H) * t_moe * b
        if cfg.n_shared_experts:
            out["shared_experts"] = act * cfg.n_shared_experts * i / tp * t * b
    if role.has_indexer:
        pairs = _pairs(ctx)
        out["indexer"] = 2 * 4 * pairs / s.cp
    quant = ctx.prec.quant_bytes
    if quant:
        for g_ in gemms:
            if g_.low_precision:
                key = g_.module if g_.module in out else "quant"
                out[key] = out.get(key, 0.0) + g_.m * g_.k * g_.count * quant
    return out


def _pairs(ctx: OpContext) -> float:
    from app.core.model.flops import causal_pairs

    return ctx.s.mbs * causal_pairs(ctx.s.seq_length)


#: Host-issued operations per layer (eager PyTorch + Transformer Engine, no CUDA graphs): each
#: linear layer quantises its input, updates its scale and launches its GEMM (3 ops forward, 4
#: backward; BF16: 1 and 2); a grouped expert GEMM quantises once (2 ops) and launches one GEMM per
#: local expert (Transformer Engine ``GroupedLinear`` / ``general_grouped_gemm``), twice as many
#: backward, each launch :data:`HOST_EXPERT_LAUNCH` of an op; every layer has ~12 / 18 other ops
#: (norms, residual adds, RoPE, attention, activation); an MoE layer ~30 / 20 more (router, top-k,
#: auxiliary loss, permutation, the token-count exchange and its host synchronisation,
#: un-permutation); each collective is one op. A full-iteration CUDA graph
#: (``cuda_graph="full_iteration"``) issues none of them.
HOST_LAYER_OPS = (12, 18)
HOST_MOE_OPS = (30, 20)
#: One expert's GEMM launch in a grouped GEMM, in host operations: Transformer Engine issues them in
#: one C++ loop, not one Python-level op each. Fitted with ``host_op`` on the calibration and the 104
#: development rows (issue 18's ninth round: 0.35, from 1; the rows with 32-64 local experts -
#: DeepSeek-V3 at EP 8, Nemotron 3 Super at EP 8 - were host-bound far beyond what they measured).
HOST_EXPERT_LAUNCH = 0.35


def _gemm_host_ops(ctx: OpContext, g: Gemm) -> tuple[float, float]:
    """(forward, backward) host-issued operations of one GEMM (:data:`HOST_LAYER_OPS`)."""
    if g.count > 1:
        return 2 + HOST_EXPERT_LAUNCH * g.count, 2 + 2 * HOST_EXPERT_LAUNCH * g.count
    if g.low_precision and ctx.prec.gemm_dtype != "bf16":
        return 3.0, 4.0
    return 1.0, 2.0


def _eager_host_ops(ctx: OpContext, role: LayerRole) -> dict[str, tuple[float, float]]:
    """(forward, backward) host operations of the eager PyTorch ops of :data:`UNFUSED_ROPE_BYTES` by
    recompute part, each raw op :data:`HOST_EXPERT_LAUNCH` of an op (no module around it; the backward's
    from the C++ autograd engine): the unfused RoPE's 12 forward ops per rotated tensor (cos, sin and
    their scaling and casts, the two products, the negation, two ``cat`` s and the add; q and k) and 5
    backward; the clamp's 5 forward (a ``chunk``, two clamps, a ``cat``, the offset's tensor) and 3
    backward; the expert bias's 2 a local expert (product and sum) plus 4 forward (two ``split`` s, the
    ``cat``, the cast) and 4 a local expert plus 2 backward."""
    cfg, out = ctx.cfg, {}
    if role.mixer == "attention" and cfg.attention == "gqa" and cfg.rope_attention_factor != 1.0:
        out["rope_unfused"] = (2 * 12.0, 2 * 5.0)
    if role.ffn == "moe":
        local = cfg.n_routed_experts / ctx.s.ep
        if cfg.activation_clamp:
            out["moe_act_clamp"] = (5.0, 3.0)
        if cfg.expert_bias:
            out["expert_bias"] = (2 * local + 4, 4 * local + 2)
    return {k: (f * HOST_EXPERT_LAUNCH, b * HOST_EXPERT_LAUNCH) for k, (f, b) in out.items()}


def host_ops(ctx: OpContext, role: LayerRole, gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, backward) host-issued operations of one layer (:data:`HOST_LAYER_OPS`, the eager ops
    of :func:`_eager_host_ops`)."""
    fwd, bwd = float(HOST_LAYER_OPS[0]), float(HOST_LAYER_OPS[1])
    for f, b in _eager_host_ops(ctx, role).values():
        fwd, bwd = fwd + f, bwd + b
    for g in gemms:
        f, b = _gemm_host_ops(ctx, g)
        fwd, bwd = fwd + f, bwd + b
    if role.ffn == "moe":
        fwd, bwd = fwd + HOST_MOE_OPS[0], bwd + HOST_MOE_OPS[1]
    if ctx.s.tp > 1:
        fwd, bwd = fwd + 4, bwd + 4
    return fwd, bwd


def host_module_ops(ctx: OpContext, role: LayerRole, gemms: list[Gemm]) -> dict[str, float]:
    """Forward host-issued operations of the parts selective recompute re-runs, keyed as the
    recompute parts (``LayerCost.modules``): each GEMM's forward ops (:func:`_gemm_host_ops`) under
    its module, and one op a kernel for the rest - the layer's norms (``layernorm``), the attention
    core (``core_attn``) and its RoPE (``rope``), an MLP's or shared expert's activation, the MoE
    activation (``moe_act``: Megatron's fused weighted SwiGLU / quick-GeGLU), and an MoE layer's
    router-to-unpermute work (``moe``, :data:`HOST_MOE_OPS`). A recomputed module is issued again
    before its backward (Megatron ``CheckpointWithoutOutput`` / ``tensor_parallel.checkpoint``), so
    the host re-issues these ops, not the whole layer's forward, as full recompute does."""
    out: dict[str, float] = {"layernorm": float(ctx.cfg.norms_per_layer)}
    for g in gemms:
        out[g.module] = out.get(g.module, 0.0) + _gemm_host_ops(ctx, g)[0]
    if role.mixer == "attention":
        out["core_attn"] = out.get("core_attn", 0.0) + 1
        out["rope"] = out.get("rope", 0.0) + 1
    elif role.mixer == "gdn":
        out["gdn_norm_out"] = 1.0   # the gated norm, one kernel
    if role.ffn == "dense":
        out["mlp"] = out.get("mlp", 0.0) + 1
    elif role.ffn == "moe":
        out["moe"] = out.get("moe", 0.0) + HOST_MOE_OPS[0]
        out["moe_act"] = 1.0
        if "shared_experts" in out:
            out["shared_experts"] += 1
    for part, (fwd, _) in _eager_host_ops(ctx, role).items():
        out[part] = out.get(part, 0.0) + fwd
    return out


#: GEMM modules sharded over TP: the GEMM time a TP communication overlap can hide under
TP_SHARDED_MODULES = ("attn_proj", "mla_up_proj", "mlp", "shared_experts", "mtp", "mamba")

#: ``--tp-comm-overlap`` (Transformer Engine userbuffers): every GEMM whose TP collective is
#: overlapped chunk by chunk runs as ``TP`` GEMMs of ``M / TP`` rows, each reading the whole weight
#: again and paying its own launch, while the copy engines move the next chunk. That is the
#: ``ring_exchange`` method: Transformer Engine's default for the all-gathers (``initialize_ub`` in
#: ``transformer_engine/pytorch/module/base.py``: ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``,
#: ``fc2_dgrad``; ``num_splits = tp_size``, ``num_sm = 1``, ``use_ce``, no SM margin) and what
#: Megatron-Bridge's FP8 configurations also use for the row-parallel forward's reduce-scatter
#: (``src/megatron/bridge/training/comm_overlap.py`` @ 067f987d: ``proj_fprop`` / ``fc2_fprop`` =
#: ``RingExchangeOverlapCfg(num_sm=1)`` in every ``userbuffers_fp8_*`` config). The column-parallel
#: backward (``qkv`` / ``fc1`` data and weight gradients) overlaps its collective in ``bulk``: one
#: whole GEMM beside it (those configs set ``set_sm_margin=False``), timed as a plain GEMM. Names:
#: ``qkv``, ``fc1`` (column-parallel) and ``proj``, ``o``, ``fc2`` (row-parallel; MLA's ``o`` is
#: Megatron's ``linear_proj``).
UB_COLUMN = frozenset(("qkv", "fc1"))
UB_ROW = frozenset(("proj", "o", "fc2"))


def _gemm_times(ctx: OpContext, g: Gemm) -> tuple[float, float, float]:
    """(forward, weight gradient, data gradient) seconds of one GEMM; with ``--tp-comm-overlap`` the
    ring-exchanged ones as ``TP`` chunks (:data:`UB_COLUMN`)."""
    s = ctx.s
    low, count, grouped = g.low_precision, g.count, g.grouped
    ring = s.tp if (s.tp_comm_overlap and s.tp > 1 and (g.name in UB_COLUMN or g.name in UB_ROW)) else 1
    f = ring * gemm_seconds(ctx, g.m / ring, g.n, g.k, low=low, count=count, grouped=grouped, tile=(g.n, g.m / ring))
    wgrad = gemm_seconds(ctx, g.k, g.n, g.m, low=low, count=count, out_bytes=4, grouped=grouped, tile=(g.k, g.n))
    if g.module == "indexer":
        return f, wgrad, 0.0
    split = ring if g.name in UB_ROW else 1  # the row-parallel data gradient's all-gather: ring exchange
    dgrad = split * gemm_seconds(ctx, g.m / split, g.k, g.n, low=low, count=count, grouped=grouped,
                                 tile=(g.k, g.m / split))
    return f, wgrad, dgrad


def _add_gemms(ctx: OpContext, lc: LayerCost, gemms: list[Gemm]) -> None:
    """Each GEMM forward ``f = gemm_seconds(M, N, K)``; backward the data gradient ``(M, K, N)`` and
    the weight gradient ``(K, N, M)`` with its FP32 main-grad output (the indexer's projections a
    weight gradient only: their input is detached); with ``--tp-comm-overlap`` the ring-exchanged
    GEMMs in ``TP`` chunks (:func:`_gemm_times`). Launch gaps are counted with the layer's
    kernels (:func:`_add_kernels`), so each GEMM adds its time less ``kernel`` per kernel."""
    s, eff = ctx.s, ctx.eff
    for g in gemms:
        f, wgrad, dgrad = _gemm_times(ctx, g)
        b = wgrad + dgrad
        lc.fwd.gemm += f - eff.kernel
        lc.bwd.gemm += b - (2 if dgrad else 1) * eff.kernel
        lc.modules[g.module] = lc.modules.get(g.module, 0.0) + f
        if g.module in TP_SHARDED_MODULES and s.tp > 1:
            lc.tp_gemm_fwd += f
            lc.tp_gemm_bwd += b
        lc.flops_fwd += g.flops


#: Bytes per element of the ``s x s`` score matrix in Megatron's unfused core attention
#: (``megatron/core/transformer/dot_product_attention.py`` ``DotProductAttention.forward`` @ d98e8a64,
#: as ``megatron/model/transformer.py`` ``CoreAttention`` in the 2021 code of Narayanan et al.):
#: forward ``torch.baddbmm`` writes the scores (2 B), ``FusedScaleMaskSoftmax`` reads and writes them
#: (2 + 2), ``attention_dropout`` reads them and writes the dropped probabilities and its mask
#: (2 + 2 + 1), ``torch.bmm`` with V reads them (2): 13 B; backward the probability gradient written
#: (2), the dropped probabilities read for dV (2), dropout's backward (2 + 1 read, 2 written), the
#: fused softmax backward (2 + 2 read, 2 written) and the two score-gradient GEMMs for dQ and dK
#: (2 + 2 read): 19 B.
UNFUSED_FWD_BYTES, UNFUSED_BWD_BYTES = 13.0, 19.0


def unfused_attention_seconds(ctx: OpContext, attn_flops: float) -> tuple[float, float]:
    """(forward, backward) seconds of the unfused core attention of one layer and micro-batch on one
    GPU: the two batched GEMMs over the whole ``s x s`` square (the causal mask is applied to it
    after ``QK^T``: ``2 s / (s + 1)`` x the causal FLOPs ``attn_flops``), four backward, at the
    BF16 GEMM ceiling, plus the score matrix's traffic :data:`UNFUSED_FWD_BYTES` /
    :data:`UNFUSED_BWD_BYTES` per element of ``mbs x h/TP x s/CP x s``, and the kernels."""
    s, cfg, eff = ctx.s, ctx.cfg, ctx.eff
    seq = s.seq_length
    square = attn_flops * 2 * seq / (seq + 1)
    rate = ctx.hw.peak_flops("bf16") * eff.gemm_ceiling("bf16")
    elems = s.mbs * cfg.num_attention_heads / s.tp * seq / s.cp * seq
    fwd = square / rate + mem_seconds(ctx, UNFUSED_FWD_BYTES * elems) + 4 * eff.kernel
    bwd = 2 * square / rate + mem_seconds(ctx, UNFUSED_BWD_BYTES * elems) + 8 * eff.kernel
    return fwd, bwd


def _add_attention(ctx: OpContext, lc: LayerCost, role: LayerRole) -> None:
    """Flash attention ``F / (rate * a_fwd)`` forward and ``2.5 F / (rate * a_bwd)`` backward, ``F``
    the layer's ``sparse_attention`` FLOPs over TP x CP, ``rate`` the BF16 peak (FP8 attention: the
    FP8 peak x :data:`FP8_ATTN_FRACTION`), a sliding window's partly empty blocks counted
    (:func:`window_tile_factor`) and a head below 128 at its share (:func:`head_dim_factor`); the DSA
    indexer's scoring ``I`` (over CP: duplicated over TP) at the BF16 peak forward, and backward
    ``2 I`` over the selected top-k pairs' share only."""
    if role.mixer != "attention":
        return
    cfg, s, eff, hw = ctx.cfg, ctx.s, ctx.eff, ctx.hw
    terms = sequence_layer_flops(cfg, role, seq_length=s.seq_length, mbs=s.mbs)
    attn_flops = terms["sparse_attention"] / (s.tp * s.cp)
    peak16 = hw.peak_flops("bf16")
    rate = hw.peak_flops("fp8") * FP8_ATTN_FRACTION if s.fp8_attention else peak16
    if eff.attn_unfused and not s.fp8_attention and not cfg.has_indexer:  # DSA's sparse kernel has no unfused twin
        lc.attn_fwd, lc.attn_bwd = unfused_attention_seconds(ctx, attn_flops)
    else:
        fh, bh = head_dim_factor(eff, cfg.head_dim)
        tiles = window_tile_factor(s.seq_length, role.window)
        lc.attn_fwd = tiles * attn_flops / (rate * eff.attn_fwd * fh)
        lc.attn_bwd = tiles * FA_BWD_FLOPS * attn_flops / (rate * eff.attn_bwd * bh)
    lc.flops_fwd += attn_flops
    idx = (terms["indexer_scoring"] + terms["indexer_weighting"]) / s.cp
    if idx:
        from app.core.model.flops import causal_selected_pairs

        sel = causal_selected_pairs(cfg, s.seq_length) / max(1, _pairs(ctx) / s.mbs)
        lc.attn_fwd += idx / (peak16 * eff.attn_fwd)
        lc.attn_bwd += 2 * idx * sel / (peak16 * eff.attn_bwd)
        lc.flops_fwd += idx
    lc.fwd.attention += lc.attn_fwd
    lc.bwd.attention += lc.attn_bwd
    lc.modules["core_attn"] = lc.attn_fwd


#: The token mixers timed as a chunked scan of Triton kernels: a Mamba-2 mixer and a gated DeltaNet
#: (their scan FLOPs, their kernels' bytes at ``Efficiency.ssd_bw``, their CP all-to-all)
SCAN_MIXERS = ("mamba", "gdn")


def _add_scan(ctx: OpContext, lc: LayerCost, role: LayerRole) -> None:
    """A Mamba-2 layer's SSD scan, or a gated DeltaNet's chunked delta rule: its ``ssm_scan`` FLOPs
    over TP at the BF16 peak times the attention fractions, 2.5 x backward (module docstring); the
    kernels' bytes are counted with the memory-bound work (:func:`_elementwise`)."""
    if role.mixer not in SCAN_MIXERS:
        return
    s, eff = ctx.s, ctx.eff
    flops = sequence_layer_flops(ctx.cfg, role, seq_length=s.seq_length, mbs=s.mbs)["ssm_scan"] / (s.tp * s.cp)
    peak16 = ctx.hw.peak_flops("bf16")
    lc.attn_fwd = flops / (peak16 * eff.attn_fwd)
    lc.attn_bwd = FA_BWD_FLOPS * flops / (peak16 * eff.attn_bwd)
    lc.flops_fwd += flops
    lc.fwd.attention += lc.attn_fwd
    lc.bwd.attention += lc.attn_bwd
    lc.modules[role.mixer] = lc.modules.get(role.mixer, 0.0) + lc.attn_fwd


#: Eager PyTorch ops Megatron runs unfused, (forward, backward) bytes per element they touch (each op
#: reads its inputs and writes its output in full; a view moves nothing):
#:
#: * RoPE with a YaRN attention factor: TE's fused RoPE takes no ``mscale``, so ``apply_rotary_pos_emb``
#:   falls back to ``_apply_rotary_pos_emb_bshd`` (``megatron/core/models/common/embeddings/rope_utils.py``
#:   @ d98e8a64, since 987395813b): ``t * cos`` 4, ``_rotate_half``'s negation 2 and ``cat`` 4, ``* sin``
#:   4, the add 6, the final ``cat`` with the empty pass-through 4 = 24 B forward; backward the two
#:   products' gradients 4 + 4, the negation 2, the halves' ``cat`` 4, their sum 6 = 20 B (fused: 4 / 8).
#: * the clamped gated activation (``activation_func_clamp_value``, GPT-OSS): ``weighted_bias_quick_geglu_impl``
#:   (``megatron/core/fusions/fused_bias_geglu.py`` @ d98e8a64, since 2e29a5e1e3) clamps the two halves
#:   of the ``fc1`` output and ``cat``s them before its fused kernel: 2 + 2 + 4 = 8 B per ``fc1`` element
#:   forward; backward each clamp's gradient (gradient and input read, one written) 6 and the halves'
#:   ``cat`` 4 = 10 B.
#: * the routed experts' ``fc2`` bias (``add_bias_linear``, GPT-OSS): ``TEGroupedMLP._apply_bias``
#:   (``megatron/core/transformer/moe/experts.py``, a329dd6da5 .. d98e8a64) adds ``bias * prob`` per
#:   expert in FP32 (the BF16 bias times the FP32 router probabilities), ``cat``s the experts and casts
#:   back to BF16: the product written 4, the sum 2 + 4 read and 4 written, the ``cat`` 4 + 4, the cast
#:   4 + 2 = 28 B per output element; backward the cast's gradient to FP32 6, the input's back to BF16 6,
#:   the bias and probability gradients (a product and a reduction each) 12 + 12 = 36 B.
UNFUSED_ROPE_BYTES, CLAMP_BYTES, EXPERT_BIAS_BYTES = (24.0, 20.0), (8.0, 10.0), (28.0, 36.0)
#: A Mamba layer's layout copies: ``MambaMixer._ssm_training`` (``megatron/core/ssm/mamba_mixer.py`` @
#: d98e8a64) turns the ``in_proj`` output from Megatron's ``(seq, batch, d)`` into the kernel's
#: ``(batch, seq, d)`` and the scan's output back with ``rearrange(...).contiguous()``, which copies
#: (2 B read, 2 written per element) whenever the micro-batch holds more than one sequence (with one,
#: the permuted tensor is already contiguous); backward the gradients are copied back the same way
#: for the projections' GEMMs.
MAMBA_LAYOUT_BYTES = 4.0
#: Backward bytes over forward bytes of the memory-bound work: twice, except the Mamba scan's
#: kernels, whose backward also recomputes the conv and the chunk states (:mod:`app.core.model.hybrid`),
#: and the eager ops above
BWD_BYTES = {"mamba": 3.0, "gdn": 3.0, "rope_unfused": UNFUSED_ROPE_BYTES[1] / UNFUSED_ROPE_BYTES[0],
             "moe_act_clamp": CLAMP_BYTES[1] / CLAMP_BYTES[0], "expert_bias": EXPERT_BIAS_BYTES[1] / EXPERT_BIAS_BYTES[0],
             "mamba_layout": 1.0}


def _add_memory_and_host(ctx: OpContext, lc: LayerCost, role: LayerRole, gemms: list[Gemm]) -> None:
    """Memory-bound work ``bytes / (HBM * m)`` forward, twice backward (the Mamba scan's three
    times, :data:`BWD_BYTES`, and its bytes at ``ssd_bw`` of that rate; :func:`_elementwise`); a
    gap of ``kernel`` per kernel (two per GEMM, eight more per layer, twelve more per MoE layer;
    twice as many backward); the host's issue time ``ops * host_op`` (:func:`host_ops`), none under
    a full-iteration CUDA graph."""
    eff = ctx.eff
    for key, nbytes in _elementwise(ctx, role, gemms).items():
        sec = mem_seconds(ctx, nbytes) / (eff.ssd_bw if key in SCAN_MIXERS else 1.0)
        lc.fwd.memory += sec
        lc.bwd.memory += BWD_BYTES.get(key, 2.0) * sec
        lc.modules[key] = lc.modules.get(key, 0.0) + sec
    n_kernels = 2 * len(gemms) + 8 + (12 if role.ffn == "moe" else 0)
    lc.fwd.kernel += n_kernels * eff.kernel
    lc.bwd.kernel += 2 * n_kernels * eff.kernel
    if ctx.s.cuda_graph != "full_iteration":  # a full-iteration graph replays the step: nothing to issue
        ops_f, ops_b = host_ops(ctx, role, gemms)
        lc.host_fwd, lc.host_bwd = ops_f * eff.host_op, ops_b * eff.host_op
        lc.host_modules = {k: n * eff.host_op for k, n in host_module_ops(ctx, role, gemms).items()}


def _add_communication(ctx: OpContext, lc: LayerCost, role: LayerRole) -> None:
    """Raw seconds per direction (module docstring, "Communication per layer"): TP ``n`` collectives
    of the ``t x H`` activation (SP: ``n = 2`` + 2 for a dense MLP or ETP > 1, half of them
    reduce-scatters in BF16 and half all-gathers of a GEMM input, which Transformer Engine quantizes
    before it gathers - ``module/linear.py`` @ d0067d0d: ``input_quantizer(inputmat)`` then
    ``gather_along_first_dim(..., quantizer=...)``, which moves FP8, MXFP8 and NVFP4 data as such
    (``distributed.py``), the gradient gathered for a row-parallel data gradient likewise - so they
    carry ``Precision.gemm_bytes`` an element, block scales included; without SP 2 all-reduces); EP
    dispatch + combine of ``t_moe * topk * H``; CP the K/V ring ``(CP - 1)`` / ``2 (CP - 1)`` steps,
    or an all-gather and a reduce-scatter (``allgather``, DSA)."""
    from app.core.time import comm

    cfg, s, hw, eff, gr = ctx.cfg, ctx.s, ctx.hw, ctx.eff, ctx.groups
    act = ctx.t * cfg.hidden_size * ACT_BYTES
    if s.tp > 1:
        mixer, ffn = role.mixer != "none", role.ffn == "dense" or (role.ffn == "moe" and s.etp_ > 1)
        if s.sp:
            n_coll = 2 * mixer + 2 * ffn
            # half the collectives gather a GEMM's input, quantized first (docstring)
            gathered = ctx.t * cfg.hidden_size * ctx.prec.gemm_bytes
            per = (comm.reduce_scatter(gr["tp"], act, hw, eff) + comm.all_gather(gr["tp"], gathered, hw, eff)) / 2
        else:
            n_coll, per = int(mixer) + int(role.ffn != "none"), comm.all_reduce(gr["tp"], act, hw, eff)
        lc.tp_fwd = lc.tp_bwd = n_coll * per
    if role.ffn == "moe" and s.ep > 1:
        dedup = s.moe_dispatcher == "flex"
        width = cfg.moe_latent_size or cfg.hidden_size   # LatentMoE dispatches latent tokens
        a2a = comm.all_to_all(gr["ep"], ctx.t_moe * cfg.num_experts_per_tok * width * ACT_BYTES, hw, eff,
                              topk=cfg.num_experts_per_tok if dedup else 0,
                              experts=cfg.n_routed_experts if dedup else 0)
        lc.ep_fwd = lc.ep_bwd = 2 * a2a
    if s.cp > 1 and role.mixer in SCAN_MIXERS:
        _mamba_cp(ctx, lc)
    elif s.cp > 1 and role.mixer == "attention":
        kv = _kv_bytes_per_token(ctx) * ctx.t
        if s.cp_comm_type == "allgather" or cfg.has_indexer:
            lc.cp_fwd = comm.all_gather(gr["cp"], kv * s.cp, hw, eff)
            lc.cp_bwd = comm.reduce_scatter(gr["cp"], kv * s.cp, hw, eff)
            lc.cp_overlappable = False
        else:
            step = comm.p2p(gr["cp"], kv, hw, eff)
            lc.cp_fwd = (s.cp - 1) * step
            lc.cp_bwd = 2 * (s.cp - 1) * step


def _mamba_cp(ctx: OpContext, lc: LayerCost) -> None:
    """A Mamba layer under CP (Megatron ``megatron/core/ssm/mamba_context_parallel.py``
    ``MambaContextParallel``): z, x, B, C and dt go from sequence to head shards by all-to-all
    before the conv and the scan, the scan's output back after it; backward the same two
    (``pre_conv_ssm`` / ``post_conv_ssm``). Not overlapped. A gated DeltaNet does the same with its
    in_proj output and the rule's output (``gated_delta_net/common.py`` ``a2a_cp_to_hp`` /
    ``a2a_hp_to_cp`` @ d98e8a64)."""
    from app.core.time import comm

    m, s = ctx.cfg.mamba or ctx.cfg.gdn, ctx.s
    assert m is not None
    inner = m.d_inner if isinstance(m, MambaDims) else m.value_dim
    pre = comm.all_to_all(ctx.groups["cp"], ctx.t * m.in_proj_out / s.tp * ACT_BYTES, ctx.hw, ctx.eff)
    post = comm.all_to_all(ctx.groups["cp"], ctx.t * inner / s.tp * ACT_BYTES, ctx.hw, ctx.eff)
    lc.cp_fwd = lc.cp_bwd = pre + post
    lc.cp_overlappable = False


def layer_cost(ctx: OpContext, role: LayerRole) -> LayerCost:
    """Every op of one layer (decoder or MTP) for one micro-batch on one GPU: its GEMMs
    (:func:`layer_gemms`, :func:`_add_gemms`), attention and indexer (:func:`_add_attention`),
    memory-bound work, kernel gaps and host issue (:func:`_add_memory_and_host`), and the raw
    communication per parallel dimension (:func:`_add_communication`)."""
    lc = LayerCost()
    gemms = layer_gemms(ctx, role)
    _add_gemms(ctx, lc, gemms)
    _add_attention(ctx, lc, role)
    _add_scan(ctx, lc, role)
    _add_memory_and_host(ctx, lc, role, gemms)
    _add_communication(ctx, lc, role)
    return lc


def _kv_bytes_per_token(ctx: OpContext) -> float:
    """Key + value bytes per token one GPU holds for attention (what CP moves)."""
    cfg, tp = ctx.cfg, ctx.s.tp
    if cfg.attention == "gqa":
        g = cfg.num_key_value_heads
        g_gpu = g / tp if g >= tp else 1
        return 2 * g_gpu * cfg.head_dim * ACT_BYTES
    if cfg.has_indexer:  # absorbed: the shared latent + rope key, and the indexer key
        return (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim) * ACT_BYTES
    h = cfg.num_attention_heads / tp
    return h * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * ACT_BYTES


def head_cost(ctx: OpContext, mtp_layers: int) -> LayerCost:
    """The loss stage's final norm, output layer (BF16: Megatron's ``output_layer`` is a plain
    ``ColumnParallelLinear``; MXFP8 with ``fp8_output_proj``, Megatron-Core's
    ``TELMHeadColumnParallelLinear`` in ``extensions/transformer_engine.py``) and cross-entropy, and
    the logits of each MTP layer through the shared output layer (Megatron computes them on the
    ``post_process`` stage; see :mod:`app.core.model.flops`)."""
    cfg, s = ctx.cfg, ctx.s
    lc = LayerCost()
    v = padded_vocab(cfg.vocab_size, s.tp, s.vocab_divisible_by) / s.tp
    low = s.fp8_output_proj  # Megatron's TELMHeadColumnParallelLinear (--fp8-output-proj, MXFP8)
    for _ in range(1 + mtp_layers):
        f = gemm_seconds(ctx, ctx.t, v, cfg.hidden_size, low=low, tile=(v, ctx.t))
        b = (gemm_seconds(ctx, cfg.hidden_size, v, ctx.t, low=low, out_bytes=4, tile=(cfg.hidden_size, v))
             + gemm_seconds(ctx, ctx.t, cfg.hidden_size, v, low=low, tile=(cfg.hidden_size, ctx.t)))
        lc.fwd.gemm += f
        lc.bwd.gemm += b
        lc.flops_fwd += 2 * ctx.t * v * cfg.hidden_size
        # logits (BF16 write), FP32 softmax read/write, loss; the same again backward
        ce = mem_seconds(ctx, ctx.t * v * (2 + 4 + 4))
        norm = mem_seconds(ctx, 2 * cfg.hidden_size * ctx.t_sp * ACT_BYTES)
        lc.fwd.memory += ce + norm
        lc.bwd.memory += 2 * (ce + norm)
        lc.fwd.kernel += 6 * ctx.eff.kernel
        lc.bwd.kernel += 12 * ctx.eff.kernel
    if s.tp > 1:
        from app.core.time import comm

        act = ctx.t * cfg.hidden_size * ACT_BYTES
        per = comm.reduce_scatter(ctx.groups["tp"], act, ctx.hw, ctx.eff)
        lc.tp_fwd = lc.tp_bwd = (1 + mtp_layers) * per
    return lc


def embedding_cost(ctx: OpContext) -> LayerCost:
    """Embedding look-up (and the position table) forward, its gradient scatter backward."""
    lc = LayerCost()
    sec = mem_seconds(ctx, ctx.t * ctx.cfg.hidden_size * ACT_BYTES * 2)
    lc.fwd.memory += sec
    lc.bwd.memory += 2 * sec
    lc.fwd.kernel += 2 * ctx.eff.kernel
    lc.bwd.kernel += 4 * ctx.eff.kernel
    if ctx.s.tp > 1:
        from app.core.time import comm

        act = ctx.t * ctx.cfg.hidden_size * ACT_BYTES
        per = comm.reduce_scatter(ctx.groups["tp"], act, ctx.hw, ctx.eff)
        lc.tp_fwd = lc.tp_bwd = per
    return lc

