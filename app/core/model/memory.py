"""GPU memory: training per pipeline rank (weights, gradients, optimizer, activations) and inference
(weights + MLA / indexer KV cache), with Megatron's own estimate beside it.

Everything is in bytes; ``GB`` in messages is 10**9 bytes and ``GiB`` 2**30 (Megatron prints
"MB" meaning MiB). GPU capacities follow :mod:`app.core.model.parallelism` (vendor decimal, H100 80GB =
80e9 bytes).

Training: weights, gradients, optimizer
---------------------------------------
Parameters per GPU come from :func:`app.core.model.parameters.per_rank_params` (all virtual stages of a
pipeline rank; dense params split by TP with the replicated parts whole, routed experts split by
EP x ETP). Bytes per parameter (FACTS.md section 7, Megatron ``docs/.../dist_optimizer.md``):

* BF16 weights 2 B; FP32 main gradients 4 B (``--main-grads-dtype``);
* FP32 master weights 4 B + Adam ``m``, ``v`` 4 B + 4 B = 12 B (``--main-params-dtype``,
  ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``);
* without the distributed optimizer 2 + 4 + 12 = 18 B/param; with it ``6 + 12/d`` where the
  optimizer state is sharded over ``d = DP * CP`` for dense (non-expert) params and ``d = EDP``
  for routed-expert params.
* ``--optimizer-cpu-offload`` (fraction ``--optimizer-offload-fraction``, default 1): Megatron's
  ``HybridDeviceOptimizer`` (NVIDIA/Megatron-LM
  ``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py`` @ d98e8a6: ``param_to_fp32_param``,
  ``cpu_copy_map_grad`` allocated with ``pin_memory``) keeps on the host, per sharded parameter, an
  FP32 master copy, Adam ``m`` and ``v`` **and a pinned FP32 copy of the gradient**:
  ``4 + 4 + 4 + 4 = 16 B`` (with the four dtype flags at fp32). Reported as ``host_bytes`` per GPU
  and, summed over the GPUs of each node (global ranks in Megatron's default ``tp-cp-ep-dp-pp``
  order, PP outermost, ``gpus_per_node`` to a node), as ``host_bytes_per_node`` against
  ``host_memory_gb``. BF16 weights and FP32 gradient buffers stay on the GPU (6 B/param).
* ``--use-precision-aware-optimizer`` without offload, BF16 params, ``main_params_dtype`` fp32
  and ``store_param_remainders`` (Megatron's default; Transformer Engine >= 2.1): the master
  weight is kept as its 16-bit remainder (``distrib_optimizer.py`` ``init_shard(torch.int16)``;
  ``optimizer_config.py`` ``store_param_remainders``), so the optimizer state is
  ``2 + 4 + 4 = 10 B/param`` instead of 12. Lowered ``--exp-avg(-sq)-dtype`` /
  ``--main-params-dtype`` change the state by exactly their dtype sizes.

Training: activations (per layer, per micro-batch, per CP-local token)
----------------------------------------------------------------------
``t`` = tokens one GPU holds per micro-batch after the CP split (``mbs * seq / CP``, or slime's
``--max-tokens-per-gpu``). Regions under sequence parallelism hold ``t / TP`` tokens (``s_div``
= TP with SP, 1 without). BF16 tensors are 2 B per element, FP32 4 B. With H hidden, h heads,
rq / rkv the q / kv LoRA ranks, dn / dr / dv the nope / rope / value head dims, Hi / di the indexer
heads / head dim, k the routed experts per token, E routed and S shared experts, i / I the expert /
dense FFN widths, per token of ``t``:

=====================  =================================  ======================================
term                   bytes per token                    why it is kept
=====================  =================================  ======================================
attn_norm_input        2H / s_div                         RMSNorm backward (= the layer input)
attn_norm_output       2H / s_div                         input of q_a / kv_a (SP-sharded, re-gathered)
q_latent               2 rq                               q_a output, q_a_layernorm input
q_latent_norm          2 rq                               q_b input (also the indexer's wq_b input)
kv_latent              2 (rkv + dr)                       kv_a output (latent + rope key)
kv_latent_norm         2 rkv                              kv_b input
q_heads, k_heads       2 h (dn + dr) / TP each            attention-core inputs (MLA up-projected)
v_heads                2 h dv / TP                        attention-core input
attn_softmax_lse       4 h / TP                           flash-attention log-sum-exp (FP32)
attn_output            2 h dv / TP                        o_proj input
idx_q (full layers)    2 Hi di                            indexer query (replicated over TP)
idx_k                  4 di                               indexer key before and after k_norm
idx_weights            2 Hi                               per-head weights_proj output
idx_topk_scores        4 topk                             FP32 scores of the selected top-k
mlp_norm_input         2H / s_div                         RMSNorm backward
mlp_norm_output        2H / s_div                         router / shared-expert / FFN input
router                 (4E + 8k) / s_div                  FP32 logits + top-k probs and int32 ids
expert_input           2H * k ETP / TP                    permuted tokens (k copies per token; LatentMoE:
                                                          2L, and ``latent_proj`` 2L / s_div)
expert_fc1             4 (i / ETP) * k ETP / TP           gate+up output
expert_act             2 (i / ETP) * k ETP / TP           SwiGLU output = fc2 input
expert_output          2H * k ETP / TP                    fc2 output, kept for the prob-weighted combine
shared_fc1/act         4 S i / TP, 2 S i / TP             shared expert (TP-sharded)
dense_fc1/act          4 I / TP, 2 I / TP                 dense FFN layers (every fc1 row - dense,
                                                          expert, shared - is half without a gated
                                                          MLP: GELU, squared ReLU)
mamba_* (hybrid)       2 (2d + 2GN + heads) / TP,         a Mamba-2 mixer (d = heads x head_dim):
                       2d / TP, 4G / TP, 2d / TP          in_proj output, scan output, norm rstd,
                                                          out_proj input (``_mamba_terms``)
gdn_* (Qwen3-Next)     2 (2K + 2V + 2Hv) / TP,            a gated DeltaNet (``_gdn_terms``): in_proj
                       2 (2 Hv dk + V) / TP, 10 Hv / TP,  output, the delta rule's q / k (on the value
                       256 Hv / TP, 2V / TP, 2V / TP      heads) and v, FP32 gates, FP32 chunk matrix,
                                                          rule output, out_proj input
mtp_inputs (MTP)       8H / s_div                         enorm / hnorm inputs and eh_proj input
post_norm_inputs       4H / s_div                         Gemma 2's post-attention and post-MLP
                                                          RMSNorms (``norms_per_layer`` 4): inputs
=====================  =================================  ======================================

GQA / MHA attention (``attention == "gqa"``, g key-value heads of dim d) replaces the MLA rows
(latents, q/k/v heads over dn/dr/dv) with ``q_heads 2 h d / TP``, ``k_heads`` and ``v_heads``
``2 max(g / TP, 1) d`` each (TP above g keeps one whole query group per GPU), ``attn_softmax_lse 4 h / TP`` and ``attn_output 2 h d / TP``.

Routed tokens: each GPU holds ``t / TP`` tokens under SP, the dispatcher gathers them over ETP and
sends ``k`` copies, so a GPU processes ``k * t * ETP / TP`` rows whose FFN width is ``i / ETP``
(EP moves tokens between GPUs but does not change how many each holds under balanced routing).
Not itemised: dropout masks (GLM/DeepSeek use no dropout), RoPE caches, token ids, the all-gathered
CP keys of ``--allgather-cp`` and communication buffers (transient).

The IndexShare top-k holder is separate (``topk_indices``): every layer that computes top-k (full
layers and MTP layers) keeps ``t * index_topk`` int32 indices per in-flight micro-batch, because
the shared layers after it read them (and so does their recomputation). Under full recompute a
model in which every layer computes its own top-k (no shared layer: GLM-5.1, DeepSeek-V3.2)
keeps none: each layer recomputes its own (FACTS.md section 7).

The indexer's logits (``indexer_logits``): slime's indexer kernel allocates an FP32
``[q_len, kv_len]`` buffer per call (THUDM/slime
``slime_plugins/models/glm5/ops/tilelang_indexer_fwd.py`` @ 624b824, ``indexer_fwd_interface``:
``torch.empty([seq_len, seq_len_kv], dtype=torch.float32)``), where ``q_len`` is the ``t``
CP-local tokens and ``kv_len`` the all-gathered keys of the sample, ``t * CP``
(``--allgather-cp``). One such buffer is alive at a time, in forward and in recompute, on every
rank that holds a layer with an indexer: ``t * t * CP * 4`` B (8192 x 65,536 x 4 = 2.15 GB for
the slime GLM-5.2 profile). It is a transient, counted once in the peak.

Recompute (``--recompute-granularity``):

* ``none``: every term above is kept for every layer.
* ``selective``: the terms each of ``--recompute-modules`` recomputes are dropped
  (:data:`RECOMPUTE_DROPS`, read from Megatron's layer code); Megatron's default ``core_attn``
  drops only ``attn_softmax_lse`` (q, k, v are the checkpoint's inputs), ``mla_up_proj`` drops
  ``q_heads``, ``k_heads``, ``v_heads``, ``layernorm`` the norm outputs that are modules of their
  own, ``mlp`` / ``moe`` / ``moe_act`` / ``shared_experts`` their FFN terms.
* ``full`` + ``uniform`` N: each virtual stage's decoder layers form groups of N; only each
  group's input (``2H / s_div`` per token; ``2H / TP`` with ``--distribute-saved-activations``) is
  kept per micro-batch (an MTP layer keeps its two inputs); plus a working set of N layers' full
  activations (the largest layers of the rank) while a group is recomputed in backward (one
  micro-batch at a time).
* ``full`` + ``block`` N: the first N layers of each virtual stage keep only their input, the rest
  keep everything (an MTP layer too: Megatron skips its recompute with ``block``); working set one
  layer.

In-flight micro-batches (Megatron ``schedules.py``): 1F1B rank ``p`` (0-based) holds
``min(PP - p, m)`` micro-batches. Interleaved (VPP > 1), rank ``p`` runs
``W = 2 (PP - p - 1) + (VPP - 1) PP`` warm-up forwards (all ``m VPP`` when ``m == PP``); at the
peak it holds ``min(W + 1, m VPP)`` chunk micro-batches, forward ``j`` being on chunk
``(j mod PP VPP) // PP``; each chunk's count multiplies that chunk's own activations. For rank 0
with equal chunks this is ``PP (1 + (PP - 1) / (PP VPP))`` rank-sized micro-batches, FACTS
section 7's factor; applying the same warm-up rule to every rank keeps ranks consistent.
When ``m`` is unknown, ``m >= PP`` (the worst case) is assumed.

Loss stage: the FP32 logits of one micro-batch, ``t * ceil(V / TP) * 4`` B (vocab-parallel
cross-entropy keeps FP32 softmax of the TP shard of the vocabulary for all ``t`` tokens), for the
main head on the loss stage and once more per MTP layer on the MTP stage.

Embedding / lm_head / MTP weights sit on the stages that hold them (``parameters.stage_params``).

Inference
---------
See :func:`inference_memory`.

Megatron's own estimate
-----------------------
:func:`megatron_theoretical` reproduces what ``report_theoretical_memory`` in NVIDIA/Megatron-LM
``megatron/training/theoretical_memory_usage.py`` computes (the version after Megatron-LM PR #4687,
which splits parameters into TP-sharded, replicated and routed-expert buckets): it spreads the
decoder layers evenly over PP, puts one MTP block and the embedding on the "most loaded" shard,
counts MLA without the DSA indexer, divides the whole attention (including the replicated MLA
down-projections) by TP, uses ``DP = world / (TP PP CP)`` for the dense optimizer shard and EDP for
experts, ignores optimizer offload, and estimates activations with the dense-transformer formulas
of Korthikanti et al. (no MoE, no CP, no indexer, no uneven stages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.content_cache import remember
from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.gated_delta_net import GDN_CHUNK
from app.core.model.parallelism import DTYPE_BYTES, ParallelConfig, resolve_gpu
from app.core.model.parameters import per_rank_params, serving_expert_tp, shapes, stage_params
from app.core.model.roles import RoleMap, derive_roles

GB = 10**9
GIB = 2**30
MIB = 2**20

#: What each ``--recompute-modules`` entry stops keeping between forward and backward under selective
#: recompute (NVIDIA/Megatron-LM @ d98e8a64; the Transformer Engine layer specs of
#: ``megatron/core/models/gpt/gpt_layer_specs.py:244-338``), by layer part:
#:
#: * ``core_attn`` (``attention.py:392-395, 1555``): the attention core runs in a checkpoint whose
#:   inputs q, k, v stay; what the kernel saves for backward (the log-sum-exp) is recomputed;
#: * ``mla_up_proj`` (``multi_latent_attention.py:171-174, 455-458, 983-986``): the up-projected q, k,
#:   v heads are discarded after the core and recomputed from the kept latents;
#: * ``layernorm`` (``transformer_layer.py:475-527``): a norm that is its own module is recomputed -
#:   the input norm of MLA attention (GQA fuses it into ``linear_qkv``) and the pre-MLP norm of MoE
#:   layers (dense layers fuse it into ``linear_fc1``);
#: * ``mlp`` (``transformer_layer.py:537-539, 992-1010``): a dense layer's MLP, with its fused norm, runs in
#:   a checkpoint that keeps only the layer's residual;
#: * ``moe`` (``moe/moe_layer.py:247-251``): the whole MoE forward is checkpointed (router, dispatch,
#:   experts, shared experts), keeping its input;
#: * ``moe_act`` (``moe/experts.py:269-272``, grouped-GEMM experts): the experts' activation output
#:   (fc2's input) is recomputed from the kept fc1 output;
#: * ``shared_experts`` (``moe/shared_experts.py:157-158``): the shared experts are checkpointed.
#:
#: Megatron's default is ``["core_attn"]`` (``transformer_config.py:1940-1941``). The GatedDeltaNet /
#: mHC modules apply to no model isplan loads (the engine refuses them) and drop nothing here.
RECOMPUTE_DROPS: dict[str, dict[str, tuple[str, ...]]] = {
    "core_attn": {"any": ("attn_softmax_lse",)},
    "mla_up_proj": {"mla": ("q_heads", "k_heads", "v_heads")},
    "layernorm": {"mla": ("attn_norm_output",), "moe": ("mlp_norm_output",)},
    "mlp": {"dense": ("mlp_norm_output", "dense_fc1", "dense_act")},
    "moe": {"moe": ("router", "expert_input", "expert_fc1", "expert_act", "expert_output", "shared_fc1",
                    "shared_act", "latent_proj")},
    "moe_act": {"moe": ("expert_act",)},
    "shared_experts": {"moe": ("shared_fc1", "shared_act")},
    # a gated DeltaNet's output norm: its output, out_proj's input, is discarded and rebuilt
    # (``gated_delta_net/gdn.py`` ``norm_out_checkpoint.discard_output_and_register_recompute`` @ d98e8a64)
    "gdn_norm_out": {"any": ("gdn_out_proj_input",)},
}


def selective_dropped(cfg: ModelConfig, modules: tuple[str, ...], ffn: str) -> frozenset[str]:
    """The activation terms (:func:`layer_activation_terms`) selective recompute of ``modules``
    drops on a layer whose FFN is ``ffn`` (``dense`` / ``moe``): :data:`RECOMPUTE_DROPS`."""
    parts = {"any", ffn} | ({"mla"} if cfg.attention == "mla" else set())
    return frozenset(term for m in modules for part, terms in RECOMPUTE_DROPS.get(m, {}).items() if part in parts
                     for term in terms)
#: Activation-side terms of a rank's total, beside weights, gradients and optimizer state.
ACTIVATION_TERMS = ("activations", "recompute_working_set", "topk_indices", "indexer_logits", "logits")

TERM_LABELS = {
    "weights_dense": "BF16 dense weights",
    "weights_expert": "expert weights (BF16, or the FP8 / FP4 copy of the low-precision recipes)",
    "gradients_dense": "dense FP32 gradients",
    "gradients_expert": "expert FP32 gradients",
    "optimizer_dense": "dense optimizer state (master weights + Adam m, v)",
    "optimizer_expert": "expert optimizer state (master weights + Adam m, v of the routed experts)",
    "activations": "stored activations of the in-flight micro-batches",
    "recompute_working_set": "recompute working set",
    "topk_indices": "IndexShare top-k indices",
    "indexer_logits": "FP32 indexer logits (transient, one full layer at a time)",
    "logits": "FP32 logits of the loss head(s)",
}

#: How each term is counted, in words for the page (the formulas are in docs/MODELS.md).
TERM_EXPLANATIONS = {
    "weights_dense": "2 B per parameter of the rank's attention, norms, dense FFN and shared experts, sharded by TP",
    "weights_expert": "2 B per routed-expert parameter of the rank's MoE layers (1 B with --precision fp8, "
                      "1.03 B mxfp8, 0.56 B nvfp4: the recipes' FP8 / FP4 parameter copy), sharded by EP x ETP",
    "gradients_dense": "Megatron's FP32 main gradients: 4 B per dense parameter",
    "gradients_expert": "FP32 main gradients: 4 B per routed-expert parameter",
    "optimizer_dense": "distributed optimizer: FP32 master + Adam m, v = 12 B per parameter (10 B with the "
                       "precision-aware optimizer), sharded over DP x CP; on the host with CPU offload",
    "optimizer_expert": "the same state for routed experts, sharded over the expert data-parallel group EDP",
    "activations": "activations stored per layer per micro-batch times the micro-batches this rank holds in "
                   "flight under 1F1B (interleaving adds to the first rank); full recompute keeps only layer inputs",
    "recompute_working_set": "one layer's activations rebuilt at a time during the backward pass under full recompute",
    "topk_indices": "int32 top-k indices (index_topk per token) of each full layer per in-flight micro-batch, "
                    "kept for the shared layers that reuse them",
    "indexer_logits": "the indexer kernel's FP32 [query block x keys] logits buffer of one full layer, in forward "
                      "and in recompute (slime's DSA kernel)",
    "logits": "FP32 logits of the vocabulary head on the last rank (and the MTP heads when built)",
}


# --------------------------------------------------------------------------- activations


def _attention_terms(cfg: ModelConfig, tp: int) -> dict[str, float]:
    """The attention rows of the module docstring's table, per CP-local token.

    MLA: the q / kv latents and their norms (replicated over TP), the up-projected q, k, v heads
    over ``dn + dr`` / ``dv``, the FP32 log-sum-exp and the o_proj input, TP-sharded. GQA / MHA: q
    over h heads, k and v over the g key-value heads (TP above g keeps one whole query group per
    GPU), all of head_dim d."""
    h = cfg.num_attention_heads
    t: dict[str, float] = {}
    if cfg.attention == "gqa":
        d, g = cfg.head_dim, cfg.num_key_value_heads
        kv_local = max(g / tp, 1)
        t["q_heads"] = 2 * h * d / tp
        t["k_heads"] = 2 * kv_local * d
        t["v_heads"] = 2 * kv_local * d
        t["attn_softmax_lse"] = 4 * h / tp
        t["attn_output"] = 2 * h * d / tp
        if cfg.attention_output_gate:   # Qwen3-Next: the sigmoid gate's input, for its backward
            t["attn_gate"] = 2 * h * d / tp
        return t
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if rq:
        t["q_latent"] = 2 * rq
        t["q_latent_norm"] = 2 * rq
    t["kv_latent"] = 2 * (rkv + dr)
    t["kv_latent_norm"] = 2 * rkv
    t["q_heads"] = 2 * h * (dn + dr) / tp
    t["k_heads"] = 2 * h * (dn + dr) / tp
    t["v_heads"] = 2 * h * dv / tp
    t["attn_softmax_lse"] = 4 * h / tp
    t["attn_output"] = 2 * h * dv / tp
    return t


def _ffn_terms(cfg: ModelConfig, ffn: str, tp: int, etp: int, s_div: int) -> dict[str, float]:
    """The FFN rows per CP-local token: a dense layer's fc1 output (gate and up with a gated MLP, up
    alone without: ``gated_mlp``) and activation output over TP;
    an MoE layer's FP32 router logits with top-k probs and int32 ids (``(4E + 8k) / s_div``), its
    ``k ETP / TP`` routed rows of width ``i / ETP`` (input, fc1, act, output) and the TP-sharded
    shared experts."""
    if ffn == "dense":
        fc1 = (4 if cfg.gated_mlp else 2) * cfg.intermediate_size / tp
        return {"dense_fc1": fc1, "dense_act": 2 * cfg.intermediate_size / tp}
    H, k, i = cfg.hidden_size, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    d_in = cfg.moe_latent_size or H  # LatentMoE: the routed tokens travel and work in the latent
    rows = k * etp / tp  # routed rows per CP-local token on one GPU
    fc1 = 4 if cfg.gated_mlp else 2  # gate and up, or up alone
    t: dict[str, float] = {
        "router": (4 * cfg.n_routed_experts + 8 * k) / s_div,
        "expert_input": 2 * d_in * rows,
        "expert_fc1": fc1 * (i / etp) * rows,
        "expert_act": 2 * (i / etp) * rows,
        "expert_output": 2 * d_in * rows,
    }
    if cfg.moe_latent_size:   # fc2_latent_proj's saved input (fc1_latent_proj's is the norm output)
        t["latent_proj"] = 2 * cfg.moe_latent_size / s_div
    if cfg.n_shared_experts:
        t["shared_fc1"] = fc1 * cfg.n_shared_experts * i / tp
        t["shared_act"] = 2 * cfg.n_shared_experts * i / tp
    return t


def _mamba_terms(cfg: ModelConfig, tp: int) -> dict[str, float]:
    """A hybrid model's Mamba-2 mixer, per CP-local token, TP-sharded by heads and groups: what
    Megatron's fused path keeps for backward (``mamba_split_conv1d_scan_combined`` saves the in_proj
    output z, x, B, C, dt, the scan output before the gated norm and the norm's FP32 rstd per group;
    the out_proj keeps its input, the normed output; mamba_ssm ``ops/triton/ssd_combined.py``
    ``MambaSplitConv1dScanCombinedFn``)."""
    m = cfg.mamba
    assert m is not None
    return {"mamba_in_proj_output": 2 * m.in_proj_out / tp, "mamba_scan_output": 2 * m.d_inner / tp,
            "mamba_norm_rstd": 4 * m.groups / tp, "mamba_out_proj_input": 2 * m.d_inner / tp}


def _gdn_terms(cfg: ModelConfig, tp: int) -> dict[str, float]:
    """A gated DeltaNet, per CP-local token, TP-sharded by heads: what Megatron's GDN keeps for
    backward (``megatron/core/ssm/gated_delta_net/gdn.py`` @ d98e8a64: the in_proj output - q, k, v,
    z, beta, alpha - which the causal conv and the gates read back; FLA's
    ``ChunkGatedDeltaRuleFunction`` saves q and k repeated to the ``Hv`` value heads, v, the FP32
    log-decay ``g``, beta and the FP32 intra-chunk matrix ``A`` (``Q`` = 64 a head); the gated norm
    its input and FP32 rstd; out_proj its input)."""
    g = cfg.gdn
    assert g is not None
    hv = g.value_heads
    return {"gdn_in_proj_output": 2 * g.in_proj_out / tp,
            "gdn_rule_inputs": 2 * (2 * hv * g.key_head_dim + g.value_dim) / tp,
            "gdn_gates": (4 + 2 + 4) * hv / tp, "gdn_chunk_matrix": 4 * hv * GDN_CHUNK / tp,
            "gdn_rule_output": 2 * g.value_dim / tp, "gdn_out_proj_input": 2 * g.value_dim / tp}


def layer_activation_terms(cfg: ModelConfig, par: ParallelConfig, *, ffn: str, indexer: bool,
                           mtp: bool = False, mixer: str = "attention") -> dict[str, float]:
    """Bytes per CP-local token of one layer for one micro-batch with nothing recomputed
    (the table in the module docstring): the norms' inputs and outputs (``2H / s_div`` each, SP
    shards them over TP), the attention (:func:`_attention_terms`), the indexer's query, key,
    weights and FP32 top-k scores on a layer that computes its top-k, the FFN (:func:`_ffn_terms`)
    and an MTP layer's enorm / hnorm / eh_proj inputs. A hybrid model's layer has one norm and
    one module: its attention, its Mamba mixer (:func:`_mamba_terms`) or its FFN (``mixer`` /
    ``ffn`` ``"none"`` for the part it does not have). A gated DeltaNet layer (Qwen3-Next, Qwen3.5)
    has :func:`_gdn_terms` for the attention."""
    H = cfg.hidden_size
    s_div = par.tp if par.sp else 1
    t: dict[str, float] = {}
    if mixer != "none":
        t["attn_norm_input"] = t["attn_norm_output"] = 2 * H / s_div
        t.update(_attention_terms(cfg, par.tp) if mixer == "attention" else
                 _gdn_terms(cfg, par.tp) if mixer == "gdn" else _mamba_terms(cfg, par.tp))
    if indexer and cfg.has_indexer:
        t["idx_q"] = 2 * cfg.index_n_heads * cfg.index_head_dim
        t["idx_k"] = 4 * cfg.index_head_dim
        t["idx_weights"] = 2 * cfg.index_n_heads
        t["idx_topk_scores"] = 4 * cfg.index_topk
    if ffn != "none":
        t["mlp_norm_input"] = t["mlp_norm_output"] = 2 * H / s_div
        t.update(_ffn_terms(cfg, ffn, par.tp, par.expert_tp, s_div))
    if mtp:
        t["mtp_inputs"] = 8 * H / s_div
    if cfg.norms_per_layer == 4:
        t["post_norm_inputs"] = 4 * H / s_div
    return t


def in_flight_microbatches(pp: int, vpp: int, m: int | None, rank: int) -> list[int]:
    """Micro-batches whose activations rank ``rank`` holds at its peak, per virtual chunk."""
    if vpp <= 1:
        return [pp - rank if m is None else min(pp - rank, m)]
    total = None if m is None else m * vpp
    if m is not None and m == pp:
        warm = total
    else:
        warm = 2 * (pp - rank - 1) + (vpp - 1) * pp
        if total is not None:
            warm = min(warm, total)
    assert warm is not None
    peak = warm + 1 if total is None else min(warm + 1, total)
    counts = [0] * vpp
    for j in range(peak):
        counts[(j % (pp * vpp)) // pp] += 1
    return counts


LayerKind = tuple[str, bool, bool, str]


def _layer_kinds(roles: RoleMap, stage: Stage) -> list[LayerKind]:
    """(ffn, owns top-k, is MTP, mixer) for every layer of a stage, decoder layers then MTP layers."""
    out: list[LayerKind] = [(r.ffn, r.role == "full", False, r.mixer) for r in roles.of(stage.layers)]
    for j in range(stage.mtp_layers):
        m = roles.mtp[j] if j < len(roles.mtp) else None
        out.append((m.ffn if m else "moe", True, True, "attention"))
    return out


class KindBytes:
    """Activation bytes per micro-batch of one layer of each kind (:data:`LayerKind`): (everything,
    stored under the plan's recompute mode), i.e. :func:`layer_activation_terms` summed, with and
    without what selective recompute drops, times ``t``. A layer's bytes depend only on its kind and
    the settings, so each kind is derived once per estimate however many layers and ranks share it."""

    def __init__(self, cfg: ModelConfig, par: ParallelConfig):
        self.cfg, self.par = cfg, par
        self.per_kind: dict[LayerKind, tuple[float, float]] = {}

    def __call__(self, kind: LayerKind) -> tuple[float, float]:
        found = self.per_kind.get(kind)
        if found is None:
            cfg, par = self.cfg, self.par
            tok = par.tokens_per_microbatch
            terms = layer_activation_terms(cfg, par, ffn=kind[0], indexer=kind[1], mtp=kind[2], mixer=kind[3])
            found = (sum(terms.values()) * tok,
                     _stored_per_token(terms, selective_dropped(cfg, par.modules, kind[0])) * tok)
            self.per_kind[kind] = found
        return found


def indexer_logits_bytes(par: ParallelConfig) -> int:
    """The indexer's FP32 logits buffer of one call: ``t * (t * CP) * 4`` B (module docstring)."""
    t = par.tokens_per_microbatch
    return t * t * par.cp * 4


def _stored_per_token(terms: dict[str, float], dropped: frozenset[str] = frozenset()) -> float:
    return sum(v for k, v in terms.items() if k not in dropped)


def _full_recompute_stored(cfg: ModelConfig, par: ParallelConfig, stage: Stage, full: list[float]) -> float:
    """Bytes one virtual stage keeps per micro-batch under ``--recompute-granularity full``.

    A checkpoint keeps its input, ``2H`` per token (split over TP with
    ``--distribute-saved-activations``, NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/random.py:619-621``;
    SP is off then). ``uniform`` N: one input per group of N decoder layers, an MTP layer its two
    inputs. ``block`` N: the first N decoder layers keep their input, the rest everything, and an MTP
    layer everything ("recompute_method == 'block' is not supported for MTP yet. Skipping
    recompute.", ``multi_token_prediction.py:1630-1634``). ``full`` holds each layer's activations
    with nothing recomputed, decoder layers then MTP layers. Megatron refuses full recompute without
    a method and a layer count (engines/megatron/parallel.py); the estimate of such a plan reads
    uniform / 1."""
    H, tok = cfg.hidden_size, par.tokens_per_microbatch
    s_div = par.tp if par.sp else 1
    n_rec, method = par.recompute_num_layers or 1, par.recompute_method or "uniform"
    kept = 2 * H / (par.tp if par.distribute_saved_activations else s_div) * tok
    n_dec = stage.num_layers
    if method == "uniform":
        groups = math.ceil(n_dec / n_rec) if n_dec else 0
        return groups * kept + stage.mtp_layers * (kept + 2 * H / s_div * tok)
    blocked = min(n_rec, n_dec)
    return blocked * kept + sum(full[blocked:n_dec]) + sum(full[n_dec:])


def _recompute_working_set(par: ParallelConfig, full_layer_bytes: list[float]) -> float:
    """Full recompute rebuilds a group while backward runs, one micro-batch at a time: the N
    largest layers of the rank under ``uniform`` N, one layer under ``block``; nothing otherwise."""
    if par.recompute != "full" or not full_layer_bytes:
        return 0.0
    n = 1 if par.recompute_method == "block" else min(par.recompute_num_layers or 1, len(full_layer_bytes))
    return sum(sorted(full_layer_bytes, reverse=True)[:n])


def _keeps_topk(cfg: ModelConfig, roles: RoleMap, par: ParallelConfig) -> bool:
    """Whether full and MTP layers keep their top-k indices: a model with an indexer does, except
    under full recompute when no layer is shared (each layer recomputes its own top-k, FACTS
    section 7)."""
    return cfg.has_indexer and not (par.recompute == "full" and all(r.role == "full" for r in roles.layers))


def _loss_logits(cfg: ModelConfig, par: ParallelConfig, stages: list[Stage]) -> float:
    """FP32 logits of one micro-batch per loss head the rank holds (the main head on the loss
    stage, one per MTP layer): ``t * ceil(V / TP) * 4`` B each (vocab-parallel cross-entropy)."""
    heads = sum(int(s.loss) + s.mtp_layers for s in stages)
    return float(heads * par.tokens_per_microbatch * math.ceil(cfg.vocab_size / par.tp) * 4)


def _rank_activations(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, par: ParallelConfig,
                      rank: int, kind_bytes: KindBytes | None = None) -> dict[str, Any]:
    """The activation-side terms of pipeline rank ``rank`` (module docstring): each virtual stage's
    stored bytes per micro-batch times the micro-batches it holds in flight
    (:func:`in_flight_microbatches`), the IndexShare top-k indices of its full and MTP layers, the
    recompute working set, one indexer logits buffer where a layer has an indexer, and the loss
    logits. ``kind_bytes`` (:class:`KindBytes`) may be shared by the ranks of one estimate."""
    tok = par.tokens_per_microbatch
    stages = sorted(plan.rank_stages(rank), key=lambda s: s.vp_stage)
    counts = in_flight_microbatches(plan.pp, plan.vpp or 1, par.microbatches, rank)
    kind_bytes = kind_bytes or KindBytes(cfg, par)
    keep_topk = _keeps_topk(cfg, roles, par)
    acts = topk = 0.0
    per_mb: list[float] = []
    full_layer_bytes: list[float] = []
    holds_indexer = False
    for v, st in enumerate(stages):
        kinds = _layer_kinds(roles, st)
        full = [kind_bytes(k)[0] for k in kinds]
        full_layer_bytes.extend(full)
        stored = (_full_recompute_stored(cfg, par, st, full) if par.recompute == "full"
                  else sum(kind_bytes(k)[1] for k in kinds))
        c = counts[v] if v < len(counts) else 0
        per_mb.append(stored)
        acts += c * stored
        owners = sum(1 for k in kinds if k[1]) if cfg.has_indexer else 0
        holds_indexer = holds_indexer or owners > 0
        if keep_topk:
            topk += c * owners * tok * cfg.index_topk * 4
    return {
        "activations": acts,
        "recompute_working_set": _recompute_working_set(par, full_layer_bytes),
        "topk_indices": topk,
        "indexer_logits": float(indexer_logits_bytes(par)) if holds_indexer else 0.0,
        "logits": _loss_logits(cfg, par, stages),
        "in_flight": counts,
        "per_microbatch_stored": per_mb,
    }


# --------------------------------------------------------------------------- weights / optimizer


def _bytes_per_param(par: ParallelConfig, offload: bool = False) -> tuple[int, int, int]:
    """(weight, gradient, GPU optimizer-state) bytes per parameter before sharding. The master
    weight is a 16-bit remainder with the precision-aware optimizer on the GPU (module docstring)."""
    master = DTYPE_BYTES[par.main_params_dtype]
    if not offload and par.precision_aware_master_bytes is not None:
        master = par.precision_aware_master_bytes
    opt = master + DTYPE_BYTES[par.exp_avg_dtype] + DTYPE_BYTES[par.exp_avg_sq_dtype]
    return 2, DTYPE_BYTES[par.main_grads_dtype], opt


def host_bytes_per_param(par: ParallelConfig) -> int:
    """Host bytes per sharded parameter under ``--optimizer-cpu-offload``: FP32 master + Adam m, v
    + the pinned FP32 gradient copy (``HybridDeviceOptimizer``): 16 B at the default dtypes."""
    return (DTYPE_BYTES[par.main_params_dtype] + DTYPE_BYTES[par.exp_avg_dtype]
            + DTYPE_BYTES[par.exp_avg_sq_dtype] + 4)


@dataclass(frozen=True)
class _StateRates:
    """What a launch's optimizer settings make of a rank's parameters (:func:`_bytes_per_param`,
    the distributed optimizer's shard groups, the offloaded fraction), worked out once per launch
    and offload setting instead of once per rank."""

    wb: int
    gb: int
    ob: int
    d_dense: int
    d_exp: int
    frac: float
    expert_weight_bytes: float
    host_per_param: int

    @classmethod
    def of(cls, par: ParallelConfig, offload: bool) -> _StateRates:
        wb, gb, ob = _bytes_per_param(par, offload)
        return cls(wb, gb, ob, par.dense_optimizer_shards if par.distributed_optimizer else 1,
                   par.edp if par.distributed_optimizer else 1,
                   par.optimizer_offload_fraction if offload else 0.0, par.expert_weight_bytes,
                   host_bytes_per_param(par))

    def terms(self, dense: int, expert: int) -> dict[str, float]:
        """Every state term of ``dense`` dense and ``expert`` expert parameters on one GPU."""
        shard_dense, shard_exp = math.ceil(dense / self.d_dense), math.ceil(expert / self.d_exp)
        return {
            "weights_dense": float(dense * self.wb),
            "weights_expert": float(expert * self.expert_weight_bytes),
            "gradients_dense": float(dense * self.gb),
            "gradients_expert": float(expert * self.gb),
            "optimizer_dense": shard_dense * self.ob * (1 - self.frac),
            "optimizer_expert": shard_exp * self.ob * (1 - self.frac),
            "host_optimizer": (shard_dense + shard_exp) * self.host_per_param * self.frac,
        }


def _state_bytes(dense: int, expert: int, par: ParallelConfig, offload: bool) -> dict[str, float]:
    return _StateRates.of(par, offload).terms(dense, expert)


def host_bytes_per_node(par: ParallelConfig, host_per_rank: list[int]) -> list[int]:
    """Host bytes of every node: global ranks in Megatron's default order ``tp-cp-ep-dp-pp``
    (NVIDIA/Megatron-LM ``megatron/core/parallel_state.py`` ``initialize_model_parallel``, PP
    outermost), so global rank ``g`` is pipeline rank ``g // (world / PP)``; ``gpus_per_node``
    consecutive global ranks share a node. Summed per pipeline rank a node overlaps (its GPUs in
    that rank times the rank's bytes), not GPU by GPU."""
    world, per_pp, g_node = par.world, par.gpus_per_pp_rank, par.gpus_per_node
    if per_pp % g_node == 0:   # every node inside one pipeline rank: its GPUs times the rank's bytes
        return [host_per_rank[r] * g_node for r in range(world // per_pp) for _ in range(per_pp // g_node)]
    out = []
    for lo in range(0, world, g_node):
        hi = min(lo + g_node, world)
        out.append(sum(host_per_rank[r] * (min(hi, (r + 1) * per_pp) - max(lo, r * per_pp))
                       for r in range(lo // per_pp, (hi - 1) // per_pp + 1)))
    return out


def rank_layers(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, rank: int) -> dict[str, Any]:
    """What pipeline rank ``rank`` holds, whatever the optimizer: its virtual stages, decoder and
    MTP layers, MoE layers (an MTP layer is one in a model with routed experts) and the layers that
    keep top-k indices (full layers and MTP layers of a model with an indexer)."""
    stages = sorted(plan.rank_stages(rank), key=lambda s: s.vp_stage)
    held = [r for s in stages for r in roles.of(s.layers)]
    mtp = sum(s.mtp_layers for s in stages)
    return {
        "stages": [{"vp_stage": s.vp_stage, "first_layer": s.first_layer, "last_layer": s.last_layer,
                    "num_layers": s.num_layers, "mtp_layers": s.mtp_layers, "embedding": s.embedding,
                    "loss": s.loss} for s in stages],
        "num_layers": sum(s.num_layers for s in stages),
        "mtp_layers": mtp,
        "moe_layers": sum(1 for r in held if r.ffn == "moe") + (mtp if cfg.n_routed_experts else 0),
        "topk_layers": (sum(1 for r in held if r.role == "full") + mtp) if cfg.has_indexer else 0,
    }


def _rank_entry(par: ParallelConfig, rank: int, dense: int, expert: int, offload: bool, capacity: int,
                act: dict[str, Any], layers: dict[str, Any]) -> dict[str, Any]:
    """One pipeline rank's memory: its state bytes under ``offload`` (:func:`_state_bytes`) and
    activation terms, each rounded, the breakdown, total and largest term, beside what it holds
    (``layers``, :func:`rank_layers`)."""
    st = _state_bytes(dense, expert, par, offload)
    fine = {k: v for k, v in st.items() if k != "host_optimizer"}
    fine.update({k: act[k] for k in ACTIVATION_TERMS})
    fine = {k: round(v) for k, v in fine.items()}
    breakdown = {
        "weights": fine["weights_dense"] + fine["weights_expert"],
        "gradients": fine["gradients_dense"] + fine["gradients_expert"],
        "optimizer_states": fine["optimizer_dense"] + fine["optimizer_expert"],
        "activations": fine["activations"],
        "recompute_working_set": fine["recompute_working_set"],
        "topk_indices": fine["topk_indices"],
        "indexer_logits": fine["indexer_logits"],
        "logits": fine["logits"],
    }
    total = sum(breakdown.values())
    dominant = max(fine, key=lambda k: fine[k])
    return {
        "pp_rank": rank,
        **layers,
        "in_flight_microbatches": act["in_flight"],
        "in_flight_equivalent": sum(act["in_flight"]) / max(1, len(act["in_flight"])),
        "params_per_gpu": {"dense": dense, "expert": expert, "total": dense + expert},
        "breakdown": breakdown,
        "breakdown_detail": fine,
        "host_bytes": round(st["host_optimizer"]),
        "total_bytes": total,
        "total_gb": total / GB,
        "capacity_bytes": capacity,
        "fits": total <= capacity,
        "headroom_bytes": capacity - total,
        "dominant_term": dominant,
        "dominant_label": TERM_LABELS[dominant],
    }


def rank_activations(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, par: ParallelConfig) -> list[dict[str, Any]]:
    """Activation-side terms of every pipeline rank (they depend on TP, ETP, CP, SP, recompute,
    micro-batch shape and the plan, not on EP or the optimizer)."""
    kind_bytes = KindBytes(cfg, par)
    return [_rank_activations(cfg, roles, plan, par, r, kind_bytes) for r in range(plan.pp)]


def rank_totals(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, par: ParallelConfig,
                params: list | None = None, acts: list[dict[str, Any]] | None = None) -> list[int]:
    """Total bytes per GPU of every pipeline rank, the same terms as :func:`training_memory`
    (each rounded the same way) without the report around them. ``params``
    (:func:`per_rank_params`) and ``acts`` (:func:`rank_activations`) may be passed in when they
    are cached. The sum of :func:`state_totals` and :func:`activation_totals` (whole numbers, so
    the same total as adding every rounded term in one sum): the GPU-budget search keeps those two
    parts apart and adds them per option (``search._BudgetSearch.totals_for``)."""
    params = params or per_rank_params(cfg, roles, plan, tp=par.tp, ep=par.ep, etp=par.expert_tp)
    acts = acts or rank_activations(cfg, roles, plan, par)
    return [s + a for s, a in zip(state_totals(params, par), activation_totals(acts), strict=True)]


def state_totals(params: list, par: ParallelConfig) -> list[int]:
    """Bytes per GPU of every pipeline rank's weights, gradients and the optimizer state the GPU
    keeps (:func:`_state_bytes`, each term rounded): what the launch's optimizer settings decide,
    not recompute or the micro-batch shape."""
    rates, out = _StateRates.of(par, par.optimizer_cpu_offload), []
    for p in params:
        st = rates.terms(p.dense_per_gpu, p.expert_per_gpu)
        out.append(sum(round(v) for k, v in st.items() if k != "host_optimizer"))
    return out


def activation_totals(acts: list[dict[str, Any]]) -> list[int]:
    """Bytes per GPU of every pipeline rank's activation-side terms (:data:`ACTIVATION_TERMS` of
    :func:`rank_activations`, each rounded)."""
    return [sum(round(act[k]) for k in ACTIVATION_TERMS) for act in acts]


# --------------------------------------------------------------------------- Megatron's estimate


@dataclass(frozen=True)
class MegatronBuckets:
    """Megatron's parameter buckets (``theoretical_memory_usage.py`` after PR #4687): the decoder
    block and the MTP block, each split into TP-sharded, replicated and routed-expert parameters,
    plus the padded embedding (``H * padded_vocab``)."""

    tp_block: int
    repl_block: int
    exp_block: int
    tp_mtp: int
    repl_mtp: int
    exp_mtp: int
    embedding: int
    padded_vocab: int
    untied: bool


def megatron_layer_params(cfg: ModelConfig, add_bias_linear: bool = False) -> dict[str, int]:
    """Parameters of each layer part as Megatron's ``report_theoretical_memory`` counts them.

    MLA attention ``rq (H + h (dn+dr) + 1) + rkv (H + h (dn+dv) + 1) + H dr + h dv H`` (no DSA
    indexer; ``H h (dn+dr)`` for the q projection without a q LoRA); GQA ``H h d + 2 H g d + h d H``
    (+ ``2d`` with qk_layernorm); SwiGLU FFNs ``3 H I``; shared experts ``3 H S i``; routed experts
    ``3 H i E``; norms ``2H``; router ``H E`` (+E with ``--add-bias-linear``); final norm ``H``.
    Every FFN term is ``2 H I`` without a gated MLP (``gated_linear_multiplier = 3 / 2 if
    args.swiglu else 1``, ``theoretical_memory_usage.py`` @ d98e8a64).
    """
    H, h = cfg.hidden_size, cfg.num_attention_heads
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    E = cfg.n_routed_experts
    norm = 1  # RMSNorm
    if cfg.attention == "gqa":
        # Megatron's non-MLA self-attention: q, k, v and o over kv_channels d with g query groups
        # (+ qk_layernorm 2d), ``2 H (h d + g d)`` in its own grouping
        d, g = cfg.head_dim, cfg.num_key_value_heads
        attn = H * h * d + 2 * H * g * d + h * d * H + (2 * d if cfg.qk_norm else 0)
    else:
        q_term = rq * (H + h * (dn + dr) + norm) if rq else H * h * (dn + dr)
        attn = q_term + rkv * (H + h * (dn + dv) + norm) + H * dr + h * dv * H
    f = 3 if cfg.gated_mlp else 2
    return {
        "attn": attn,
        "dense_mlp": f * H * cfg.intermediate_size,
        "shared": f * H * cfg.n_shared_experts * cfg.moe_intermediate_size,
        "routed": f * H * cfg.moe_intermediate_size * E if E else 0,
        "layernorm": 2 * H * norm,
        "router": (H * E + (E if add_bias_linear else 0)) if E else 0,
        "final_ln": norm * H,
    }


def megatron_buckets(cfg: ModelConfig, par: ParallelConfig, mtp_layers: int | None,
                     make_vocab_size_divisible_by: int | None, add_bias_linear: bool) -> MegatronBuckets:
    """Megatron's buckets over the config's dense / MoE layer pattern (:func:`megatron_layer_params`);
    an MTP layer takes the last decoder layer's FFN kind. The vocabulary is padded to
    ``--make-vocab-size-divisible-by`` (the launch's, itself Megatron's 128) times TP
    (``megatron/training/tokenizer`` ``_vocab_size_with_padding``)."""
    lp = megatron_layer_params(cfg, add_bias_linear)
    roles = derive_roles(cfg)
    n_layers = cfg.num_hidden_layers
    moe_pattern = [1 if r.ffn == "moe" else 0 for r in roles.layers] if cfg.n_routed_experts else [0] * n_layers
    n_moe = sum(moe_pattern)
    n_dense = n_layers - n_moe
    n_mtp = cfg.num_nextn_predict_layers if mtp_layers is None else mtp_layers
    mtp_moe = n_mtp * moe_pattern[-1] if n_mtp else 0
    mtp_dense = n_mtp - mtp_moe
    unit = (make_vocab_size_divisible_by or par.make_vocab_size_divisible_by) * par.tp
    padded_vocab = -(-cfg.vocab_size // unit) * unit
    attn, ln, router = lp["attn"], lp["layernorm"], lp["router"]
    return MegatronBuckets(
        tp_block=(attn + lp["dense_mlp"]) * n_dense + (attn + lp["shared"]) * n_moe,
        repl_block=ln * n_dense + (ln + router) * n_moe + lp["final_ln"],
        exp_block=lp["routed"] * n_moe,
        tp_mtp=(attn + lp["dense_mlp"]) * mtp_dense + (attn + lp["shared"]) * mtp_moe,
        repl_mtp=ln * mtp_dense + (ln + router) * mtp_moe,
        exp_mtp=lp["routed"] * mtp_moe,
        embedding=cfg.hidden_size * padded_vocab,
        padded_vocab=padded_vocab,
        untied=not cfg.tie_word_embeddings,
    )


def megatron_weight_optimizer(b: MegatronBuckets, par: ParallelConfig) -> tuple[float, dict[str, Any]]:
    """Megatron's weight + optimizer bytes of the most loaded shard, and the report's fields on it.

    Most-loaded shard ``(tp_block / PP + tp_mtp + embedding) / TP + repl_block / PP + repl_mtp +
    (expert_block / PP + expert_mtp) / (ETP EP)`` (+ the untied lm_head at PP 1); bytes per param
    ``18`` without the distributed optimizer, else ``6 + 12 / DP`` for the dense buckets with
    ``DP = world / (TP PP CP)`` and ``6 + 12 / EDP`` for experts (``EDP = world / (ETP EP PP)``)."""
    tp, pp, cp, etp, ep = par.tp, par.pp, par.cp, par.expert_tp, par.ep
    dp = max(1, par.world // (tp * pp * cp))
    edp = max(1, par.world // (etp * ep * pp))
    tp_shard = (b.tp_block / pp + b.tp_mtp + b.embedding) / tp
    repl_shard = b.repl_block / pp + b.repl_mtp
    exp_shard = (b.exp_block / pp + b.exp_mtp) / (etp * ep)
    if b.untied and pp == 1:
        tp_shard += b.embedding / tp
    other = b.tp_block / (pp * tp) + b.repl_block / pp + b.exp_block / (pp * etp * ep) if pp > 1 else None

    def bpp(d: int) -> float:
        return 18.0 if not par.distributed_optimizer else 6 + 12 / d

    weight_opt = (tp_shard + repl_shard) * bpp(dp) + exp_shard * bpp(edp)
    return weight_opt, {
        "data_parallel_size": dp,
        "expert_data_parallel_size": edp,
        "params_most_loaded_shard": round(tp_shard + repl_shard + exp_shard),
        "params_most_loaded_shard_split": {"tp_sharded": round(tp_shard), "replicated": round(repl_shard),
                                           "routed_experts": round(exp_shard)},
        "params_other_shards": round(other) if other is not None else None,
        "bytes_per_param_dense": bpp(dp),
        "bytes_per_param_expert": bpp(edp),
        "weight_and_optimizer_bytes": round(weight_opt),
        "weight_and_optimizer_gib": weight_opt / GIB,
        "weight_and_optimizer_mib": weight_opt / MIB,
    }


def megatron_activations(cfg: ModelConfig, par: ParallelConfig, padded_vocab: int,
                         seq_length: int | None) -> tuple[float, str, int]:
    """Megatron's activation estimate: (bytes, formula name, sequence length).

    With SP and selective recompute the Korthikanti ``s b H (18 + 4 I / H)`` per layer formula
    divided by TP, otherwise the "without SP" formula ``s b H (10 + 24 / TP)`` per layer times 1.05;
    both multiply by all ``num_layers`` (the first stage holds PP micro-batches of ``L / PP``
    layers), add embedding terms ``8 s b PP + s b H PP`` (and the output layer at PP 1), scale by
    the interleaving penalty ``1 + (PP - 1) / (PP VPP)`` or ``min(1, m / PP)``, and use the whole
    ``--seq-length`` (Megatron never divides it by CP; slime packs ``mbs`` into it, so ``b = 1``)."""
    H, tp, pp = cfg.hidden_size, par.tp, par.pp
    s = seq_length if seq_length is not None else par.sample_length
    b = 1 if par.tokens_per_gpu is not None else par.mbs
    m = par.microbatches
    vpp = par.vpp if par.vpp and par.vpp > 1 else None
    sp_selective = par.sp and par.recompute == "selective"
    if sp_selective:
        act = s * b * H * (18 + 4 * cfg.intermediate_size / H) * cfg.num_hidden_layers
    else:
        act = s * b * H * (10 + 24 / tp) * cfg.num_hidden_layers
    act += 8 * s * b * pp + s * b * H * pp
    if vpp is not None:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1 and m is not None:
        act *= min(1, m / pp)
    if sp_selective:
        if pp == 1:
            act += s * b * H * 4 * (1 + padded_vocab / H)
        return act / tp, "compute_activation_memory (SP + selective recompute)", s
    if pp == 1:
        act += (s * b * padded_vocab / tp + s * b * H) * 2
    return act * 1.05, "compute_activation_memory_without_sp", s


def megatron_theoretical(cfg: ModelConfig, par: ParallelConfig, *, mtp_layers: int | None = None,
                         make_vocab_size_divisible_by: int | None = None, add_bias_linear: bool = False,
                         seq_length: int | None = None) -> dict[str, Any]:
    """What ``report_theoretical_memory`` (NVIDIA/Megatron-LM
    ``megatron/training/theoretical_memory_usage.py``) prints for these flags, in bytes.

    Re-implemented from its formulas (not copied): the parameter buckets
    (:func:`megatron_layer_params`, :func:`megatron_buckets`), the weight + optimizer bytes of the
    most loaded shard (:func:`megatron_weight_optimizer`) and the activations
    (:func:`megatron_activations`); docs/MODELS.md section 4 states them.
    """
    b = megatron_buckets(cfg, par, mtp_layers, make_vocab_size_divisible_by, add_bias_linear)
    weight_opt, wo = megatron_weight_optimizer(b, par)
    act, formula, s = megatron_activations(cfg, par, b.padded_vocab, seq_length)
    return {
        "source": "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py: report_theoretical_memory "
                  "(weights/optimizer as after PR #4687: TP-sharded, replicated and routed-expert buckets)",
        "padded_vocab_size": b.padded_vocab,
        **wo,
        "activation_formula": formula,
        "activation_seq_length": s,
        "activation_bytes": round(act),
        "activation_gib": act / GIB,
        "total_bytes": round(weight_opt + act),
        "total_gib": (weight_opt + act) / GIB,
    }


# --------------------------------------------------------------------------- training


#: Each pipeline rank's two entries (the plan's offload setting and the other) by
#: :func:`_rank_key`: a drag moves one boundary, so the ranks whose stages it left alone are served
#: from here; a search's plans share ranks too. Bounded: cleared when it holds this many.
_RANK_CACHE: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = {}
RANK_CACHE_SIZE = 4096


def _rank_key(roles: RoleMap, plan: StagePlan, rank: int, shared: tuple[Any, ...]) -> tuple[Any, ...]:
    """Everything one rank's memory reads: what every rank of the plan shares (``shared``, from
    :func:`_plan_key`), the rank, its stages' spans and ends and its layers' kinds."""
    stages = plan.rank_stages(rank)
    return (shared, rank,
            tuple((s.vp_stage, s.layers.start, s.layers.stop, s.mtp_layers, s.embedding, s.loss) for s in stages),
            tuple((r.ffn, r.role, r.has_indexer) for s in stages for r in roles.of(s.layers)))


def _plan_key(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, par: ParallelConfig, capacity: int) -> tuple[Any, ...]:
    """The part of :func:`_rank_key` every rank of one estimate shares: the model, the launch, the
    GPU's capacity, PP / VPP (the in-flight micro-batches), whether top-k indices are kept (which
    depends on every layer's role) and the MTP layers' FFNs."""
    return (cfg, par, capacity, plan.pp, plan.vpp, _keeps_topk(cfg, roles, par), tuple(m.ffn for m in roles.mtp))


def _rank_memory(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, par: ParallelConfig, rank: int, capacity: int,
                 kind_bytes: KindBytes, shared: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pipeline rank ``rank``'s entry (:func:`_rank_entry`) with the plan's offload setting and with
    the other one, each a fresh top-level dict (cached in :data:`_RANK_CACHE`; ``shared``:
    :func:`_plan_key`)."""
    key = _rank_key(roles, plan, rank, shared)
    found = _RANK_CACHE.get(key)
    if found is None:
        p = stage_params(cfg, roles, plan.rank_stages(rank), tp=par.tp, ep=par.ep, etp=par.expert_tp)
        act = _rank_activations(cfg, roles, plan, par, rank, kind_bytes)
        held = rank_layers(cfg, roles, plan, rank)
        given, other = (_rank_entry(par, rank, p.dense_per_gpu, p.expert_per_gpu, off, capacity, act, held)
                        for off in (par.optimizer_cpu_offload, not par.optimizer_cpu_offload))
        found = remember(_RANK_CACHE, key, (given, other), RANK_CACHE_SIZE)
    return dict(found[0]), dict(found[1])


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _explain(cfg: ModelConfig, par: ParallelConfig, actual: list[dict[str, Any]], alt: list[dict[str, Any]],
             gpu_label: str, capacity: int) -> str:
    edp_txt = (f"EDP = world/(ETP*EP*PP) = {par.world}/({par.expert_tp}*{par.ep}*{par.pp}) = {par.edp}")
    worst = max(actual, key=lambda e: e["total_bytes"])

    def why(e: dict[str, Any]) -> str:
        d = e["breakdown_detail"]
        term = e["dominant_term"]
        parts = [f"rank {e['pp_rank']} holds {e['num_layers']} decoder layer(s)"
                 + (f" + {e['mtp_layers']} MTP layer(s)" if e["mtp_layers"] else "")
                 + f" ({e['moe_layers']} MoE), {e['params_per_gpu']['expert'] / 1e9:.2f}B routed-expert and "
                 f"{e['params_per_gpu']['dense'] / 1e9:.2f}B dense params per GPU",
                 f"its largest term is the {TERM_LABELS[term]}: {_gb(d[term])}"]
        if term == "optimizer_expert":
            parts.append(f"the expert optimizer state cannot be sharded because {edp_txt}"
                         if par.edp == 1 else
                         f"the expert optimizer state is sharded only {par.edp} ways ({edp_txt})")
        return "; ".join(parts)

    over = [e for e in actual if not e["fits"]]
    if over:
        txt = (f"Does not fit {gpu_label}: rank(s) {', '.join(str(e['pp_rank']) for e in over)} overflow; "
               f"rank {worst['pp_rank']} needs {_gb(worst['total_bytes'])} of {_gb(capacity)}. " + why(worst) + ".")
        if not par.optimizer_cpu_offload:
            alt_worst = max(alt, key=lambda e: e["total_bytes"])
            if all(e["fits"] for e in alt):
                txt += (f" With --optimizer-cpu-offload every rank fits (largest rank {alt_worst['pp_rank']}: "
                        f"{_gb(alt_worst['total_bytes'])}; {_gb(alt_worst['host_bytes'])} of host memory per GPU "
                        "holds its FP32 master weights, Adam m, v and a pinned FP32 gradient copy).")
            else:
                txt += (f" Even with --optimizer-cpu-offload rank {alt_worst['pp_rank']} needs "
                        f"{_gb(alt_worst['total_bytes'])}.")
        return txt
    txt = (f"Every pipeline rank fits {gpu_label}; the fullest is rank {worst['pp_rank']} at "
           f"{_gb(worst['total_bytes'])} ({_gb(worst['headroom_bytes'])} headroom).")
    if par.optimizer_cpu_offload:
        alt_over = [e for e in alt if not e["fits"]]
        if alt_over:
            w = max(alt_over, key=lambda e: e["total_bytes"])
            moved = next(e["host_bytes"] for e in actual if e["pp_rank"] == w["pp_rank"])
            txt += (f" It fits only because of --optimizer-cpu-offload: without it rank(s) "
                    f"{', '.join(str(e['pp_rank']) for e in alt_over)} overflow, rank {w['pp_rank']} needing "
                    f"{_gb(w['total_bytes'])} > {_gb(capacity)}: " + why(w) + f". With the offload each GPU of that rank needs {_gb(moved)} "
                    "of host memory (FP32 master weights, Adam m, v and a pinned FP32 gradient copy).")
        else:
            txt += " It would also fit without --optimizer-cpu-offload."
    return txt


def _refuse_mismatched_plan(plan: StagePlan, par: ParallelConfig) -> None:
    """A memory estimate needs a plan Megatron accepts, with the PP / VPP of ``par``."""
    if plan.errors or not plan.stages:
        msg = "; ".join(e.message for e in plan.errors) or "the plan has no stages"
        raise ValueError(f"cannot estimate memory for an invalid pipeline plan: {msg}")
    if plan.pp != par.pp:
        raise ValueError(f"the plan has PP={plan.pp} but the parallel config has PP={par.pp}")
    if (plan.vpp or 1) != (par.vpp or 1):
        raise ValueError(f"the plan has VPP={plan.vpp} but the parallel config has VPP={par.vpp}")


#: :func:`megatron_theoretical` by what it reads here (the model, the launch, the MTP layers): the
#: same on every update of a drag. Entries are returned as fresh top-level dicts. Bounded.
_MEGATRON_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}
MEGATRON_CACHE_SIZE = 256


def _megatron_beside_model(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan, actual: list[dict[str, Any]],
                           without_off: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`megatron_theoretical` for this plan, with how far it under-reports the model's own
    fullest rank without offload (``vs_model``) and why (``where_it_under_reports``, the module
    docstring's list of what Megatron's estimate leaves out)."""
    if cfg.layer_mixers is not None:
        return {"source": "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py: report_theoretical_memory",
                "unsupported": "Theoretical memory footprints not yet supported for hybrid Mamba-Transformer "
                               "models. (theoretical_memory_usage.py:457-458 @ d98e8a64: Megatron prints this and "
                               "no estimate for a hybrid model)"}
    key = (cfg, par, plan.mtp_layers)
    found = _MEGATRON_CACHE.get(key)
    if found is None:
        found = remember(_MEGATRON_CACHE, key, megatron_theoretical(cfg, par, mtp_layers=plan.mtp_layers),
                         MEGATRON_CACHE_SIZE)
    mt = dict(found)
    worst_no_off = max(without_off, key=lambda e: e["total_bytes"])
    ours_state = sum(worst_no_off["breakdown_detail"][k] for k in (
        "weights_dense", "weights_expert", "gradients_dense", "gradients_expert", "optimizer_dense",
        "optimizer_expert"))
    max_params = max(actual, key=lambda e: e["params_per_gpu"]["total"])
    mt["vs_model"] = {
        "model_max_params_rank": max_params["pp_rank"],
        "model_max_params_per_gpu": max_params["params_per_gpu"]["total"],
        "model_weight_and_optimizer_bytes_without_offload": ours_state,
        "model_rank": worst_no_off["pp_rank"],
        "under_report_fraction": 1 - mt["weight_and_optimizer_bytes"] / ours_state if ours_state else 0.0,
    }
    mt["where_it_under_reports"] = [
        (f"layers are spread evenly ({cfg.num_hidden_layers}/{par.pp} = {cfg.num_hidden_layers / par.pp:g} per "
         f"rank); the real plan puts {max_params['num_layers']} decoder + {max_params['mtp_layers']} MTP layers "
         f"on rank {max_params['pp_rank']} ({max_params['params_per_gpu']['total'] / 1e9:.2f}B params per GPU "
         f"vs {mt['params_most_loaded_shard'] / 1e9:.2f}B)"),
        "no DSA indexer weights or activations, no IndexShare top-k indices",
        "MLA down-projections (replicated in Megatron-Core) are divided by TP",
        ("activations use dense-transformer formulas: no MoE dispatch, no CP split, no recompute-full "
         "savings, no uneven stages, first stage only"),
        "dense optimizer shard uses DP = world/(TP*PP*CP) instead of DP*CP (over-reports with CP > 1)",
        "optimizer CPU offload is ignored (over-reports when it is on)",
    ]
    return mt


def _recompute_note(par: ParallelConfig) -> str:
    """The recompute setting in words: ``full`` with its method and layer count, ``selective``
    with its modules."""
    if par.recompute == "full":
        return f"recompute: full ({par.recompute_method or 'no method'}, {par.recompute_num_layers or 'no'} layer(s))"
    if par.recompute == "selective":
        return f"recompute: selective ({' + '.join(par.modules)})"
    return f"recompute: {par.recompute}"


def _training_notes(cfg: ModelConfig, par: ParallelConfig, roles: RoleMap, gpu_label: str,
                    host: dict[str, Any]) -> list[str]:
    """The conventions behind a training estimate, one sentence each (module docstring)."""
    return [
        (f"capacity convention: {gpu_label}; CUDA context, NCCL buffers and allocator fragmentation are not "
         "itemised and must fit in the headroom"),
        f"tokens per GPU per micro-batch t = {par.tokens_per_microbatch} (after the CP split"
        + (", slime --max-tokens-per-gpu" if par.tokens_per_gpu is not None else "") + ")",
        "micro-batches per step: " + (str(par.microbatches) if par.microbatches is not None else
                                      "unknown; assumed >= PP (1F1B worst case)"),
        _optimizer_note(par),
        (f"host memory with --optimizer-cpu-offload: {host_bytes_per_param(par)} B per sharded parameter (FP32 "
         "master, Adam m and v, pinned FP32 gradient copy; Megatron HybridDeviceOptimizer); fullest node "
         f"{_gb(host['max_node_bytes'])} of {_gb(par.host_capacity_bytes)} ({par.gpus_per_node} GPUs per node)"),
        "distributed optimizer shards: dense over DP*CP = "
        f"{par.dense_optimizer_shards}, experts over EDP = {par.edp}" if par.distributed_optimizer
        else "no distributed optimizer: 18 B/param everywhere",
        _recompute_note(par),
        ("no top-k indices are kept: under full recompute every layer of this model recomputes its own top-k"
         if cfg.has_indexer and par.recompute == "full" and all(r.role == "full" for r in roles.layers) else
         "the IndexShare top-k indices of every full and MTP layer are kept per in-flight micro-batch "
         "(int32, t x index_topk x 4 B)"),
        (f"indexer logits: one FP32 t x (t*CP) buffer = {_gb(indexer_logits_bytes(par))} on every rank that holds "
         "a layer with an indexer (slime tilelang_indexer_fwd.py), in forward and in recompute"
         if cfg.has_indexer else "no indexer: no indexer logits"),
        "logits: FP32 t x ceil(V/TP) x 4 B for one micro-batch per loss head (main + each MTP layer)",
    ]


def _offload_comparison(with_off: list[dict[str, Any]], without_off: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's total with and without ``--optimizer-cpu-offload``."""
    return {
        "with_offload": [{"pp_rank": e["pp_rank"], "total_bytes": e["total_bytes"], "fits": e["fits"],
                          "host_bytes": e["host_bytes"]} for e in with_off],
        "without_offload": [{"pp_rank": e["pp_rank"], "total_bytes": e["total_bytes"], "fits": e["fits"],
                             "dominant_term": e["dominant_term"]} for e in without_off],
    }


def training_memory(cfg: ModelConfig, plan: StagePlan, par: ParallelConfig,
                    roles: RoleMap | None = None) -> dict[str, Any]:
    """Training memory per GPU of every pipeline rank (all its virtual stages), JSON-ready: each
    rank's terms (:func:`_rank_entry`) with the plan's offload setting and with the other one,
    host memory per node, Megatron's own estimate beside it, and the conventions as notes.

    Raises ``ValueError`` for a plan Megatron would refuse or whose PP / VPP disagree with ``par``.
    """
    _refuse_mismatched_plan(plan, par)
    roles = roles or derive_roles(cfg)
    gpu = resolve_gpu(par.gpu, par.gpu_capacity_bytes)
    cap = gpu.capacity_bytes
    kind_bytes, shared = KindBytes(cfg, par), _plan_key(cfg, roles, plan, par, cap)
    actual, alt = (list(x) for x in zip(*(_rank_memory(cfg, roles, plan, par, r, cap, kind_bytes, shared)
                                          for r in range(plan.pp))))
    with_off, without_off = (actual, alt) if par.optimizer_cpu_offload else (alt, actual)
    host = host_memory(par, with_off)
    return {
        "gpus": par.world,
        "gpu": gpu.to_dict(),
        "parallel": par.to_dict(),
        "expert_grid": par.expert_grid,
        "tokens_per_microbatch": par.tokens_per_microbatch,
        "microbatches": par.microbatches,
        "stages": actual,
        "fits": all(e["fits"] for e in actual),
        "max_rank": max(actual, key=lambda e: e["total_bytes"])["pp_rank"],
        "offload_comparison": _offload_comparison(with_off, without_off),
        "host_memory": host,
        "megatron_theoretical": _megatron_beside_model(cfg, par, plan, actual, without_off),
        "explanation": _explain(cfg, par, actual, alt, gpu.label, cap),
        "notes": _training_notes(cfg, par, roles, gpu.label, host),
    }


def _optimizer_note(par: ParallelConfig) -> str:
    _, _, gpu_opt = _bytes_per_param(par, False)
    if par.precision_aware_master_bytes is not None:
        return (f"--use-precision-aware-optimizer with BF16 params: master weights stored as 16-bit remainders "
                f"(store_param_remainders, Transformer Engine >= 2.1): {gpu_opt} B/param of optimizer state on "
                "the GPU instead of 12")
    return (f"optimizer state {gpu_opt} B/param on the GPU (master {par.main_params_dtype}, m {par.exp_avg_dtype}, "
            f"v {par.exp_avg_sq_dtype})")


def host_memory(par: ParallelConfig, with_offload: list[dict[str, Any]]) -> dict[str, Any]:
    """Host memory of ``--optimizer-cpu-offload`` per GPU (per pipeline rank) and per node, against
    ``host_memory_gb`` per node. ``with_offload`` are the rank entries computed with offload on."""
    per_rank = [e["host_bytes"] for e in with_offload]
    nodes = host_bytes_per_node(par, per_rank)
    worst = max(nodes) if nodes else 0
    return {
        "offload_on": par.optimizer_cpu_offload,
        "bytes_per_sharded_param": host_bytes_per_param(par),
        "per_gpu_by_rank": per_rank,
        "gpus_per_node": par.gpus_per_node,
        "nodes": len(nodes),
        "per_node": nodes,
        "max_node_bytes": worst,
        "capacity_bytes_per_node": par.host_capacity_bytes,
        "fits": worst <= par.host_capacity_bytes,
    }


# --------------------------------------------------------------------------- inference


KV_DTYPES = ("bf16", "fp8")
WEIGHT_DTYPES = ("bf16", "fp8")


def kv_bytes_per_token_layer(cfg: ModelConfig, kv_dtype: str = "bf16", *, tp: int = 1) -> int:
    """KV cache of one token in one layer on one GPU.

    MLA: the latent, ``(rkv + dr) * 2`` in BF16; in vLLM's ``fp8_ds_mla`` layout ``rkv`` FP8
    bytes + one FP32 scale per 128 latent values + the rope key in BF16 (``512 + 16 + 128 = 656``
    for GLM-5.2); one latent head, so TP does not shard it.
    GQA / MHA: keys and values of the GPU's key-value heads, ``2 * ceil(g / TP) * d`` elements of
    2 B (BF16) or 1 B (FP8; per-tensor scales ignored); with ``g < TP`` each GPU keeps one head
    (vLLM replicates KV heads when TP exceeds them)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    if cfg.attention == "gqa":
        heads = math.ceil(cfg.num_key_value_heads / tp)
        return 2 * heads * cfg.head_dim * (2 if kv_dtype == "bf16" else 1)
    rkv, dr = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    if kv_dtype == "bf16":
        return 2 * (rkv + dr)
    if kv_dtype == "fp8":
        return rkv + 4 * math.ceil(rkv / 128) + 2 * dr
    raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")


def indexer_bytes_per_token_layer(cfg: ModelConfig) -> int:
    """Indexer key cache of one token in one indexer-owning layer: ``index_head_dim`` FP8 bytes and
    one FP32 scale (132 B for GLM-5.2), FP8 whatever the latent's dtype (vLLM)."""
    return cfg.index_head_dim + 4 if cfg.has_indexer else 0


def _refuse_bad_serving_args(tp: int, ep: int, batch: int, weight_dtype: str, context: int) -> None:
    if tp < 1 or ep < 1 or batch < 1:
        raise ValueError("tp, ep and batch must be >= 1")
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype!r}")
    if context < 1:
        raise ValueError("context must be >= 1 token")


def serving_weights(cfg: ModelConfig, roles: RoleMap, *, tp: int, ep: int, dp_attention: bool,
                    weight_dtype: str, n_mtp: int) -> tuple[int, int, float]:
    """(dense params, routed-expert params, weight bytes) per serving GPU.

    One pipeline stage over all decoder layers (+ ``n_mtp`` MTP layers), split with
    :func:`parameters.stage_params`; routed experts are whole experts over EP (ETP 1) when
    ``ep > 1`` and ``ep`` >= TP, each split ``tp // ep`` ways below that, TP-sharded when
    ``ep == 1`` (:func:`parameters.serving_expert_tp`). ``dp_attention`` replicates the attention weights
    (MLA up/out projections) on every GPU. ``weight_dtype="fp8"`` stores every decoder linear
    weight (attention, indexer, FFN, experts, MTP eh_proj) in 1 B and keeps embedding, lm_head,
    norms and router in BF16 (one embedding copy: the MTP layer shares it); block scales
    (< 0.1 %) are ignored."""
    whole = Stage(0, 0, 0, 1, cfg.num_hidden_layers, cfg.num_hidden_layers, embedding=True, loss=True,
                  mtp_layers=n_mtp)   # the whole model on one GPU group (no pipeline)
    sp = stage_params(cfg, roles, [whole], tp=tp, ep=ep, etp=serving_expert_tp(tp, ep))
    sh = shapes(cfg)
    n_attn = cfg.num_hidden_layers + n_mtp
    dense = sp.dense_per_gpu
    if dp_attention and tp > 1:
        dense += n_attn * (sh.attn_sharded - math.ceil(sh.attn_sharded / tp))
    expert = sp.expert_per_gpu
    if weight_dtype == "bf16":
        return dense, expert, 2 * (dense + expert)
    n_moe = sum(1 for r in roles.layers if r.ffn == "moe") + (n_mtp if cfg.n_routed_experts else 0)
    keep_bf16 = (math.ceil(sh.embedding / tp) + math.ceil(sh.lm_head / tp)
                 + n_attn * sh.norms + sh.final_norm + n_moe * sh.router + n_mtp * 3 * cfg.hidden_size)
    return dense, expert, 2 * keep_bf16 + (dense + expert - keep_bf16)


def serving_kv(cfg: ModelConfig, roles: RoleMap, *, kv_dtype: str, tp: int, n_mtp: int) -> dict[str, Any]:
    """KV cache bytes per token on one GPU: ``layers * latent + indexer_layers * indexer key``
    (:func:`kv_bytes_per_token_layer`, :func:`indexer_bytes_per_token_layer`), where the indexer
    layers are those that own an indexer (+ MTP when served); the layers are the attention layers
    (all of them but a hybrid model's Mamba / MoE / MLP blocks and gated DeltaNet layers), and a
    hybrid model's Mamba layers and a Qwen3-Next's gated DeltaNet layers keep one state per sequence
    (``mamba_bytes_per_sequence``, ``MambaDims.state_bytes``, ``GdnDims.state_bytes``)."""
    latent = kv_bytes_per_token_layer(cfg, kv_dtype, tp=tp)
    idx = indexer_bytes_per_token_layer(cfg)
    idx_layers = sum(1 for r in roles.layers if r.has_indexer) + (n_mtp if cfg.has_indexer else 0)
    kv_layers = sum(1 for r in roles.layers if r.mixer == "attention") + n_mtp
    per_token = kv_layers * latent + idx_layers * idx
    mamba = sum(1 for r in roles.layers if r.mixer == "mamba") * cfg.mamba.state_bytes(tp) if cfg.mamba else 0
    if cfg.gdn is not None:   # a gated DeltaNet's conv window and recurrent state, per sequence too
        mamba += sum(1 for r in roles.layers if r.mixer == "gdn") * cfg.gdn.state_bytes(tp)
    return {
        "mamba_bytes_per_sequence": round(mamba),
        "latent_bytes_per_token_layer": latent,  # MLA latent, or GQA K+V of the GPU's heads
        "kv_bytes_per_token_layer": latent,
        "indexer_bytes_per_token_layer": idx,
        "layers": kv_layers,
        "indexer_layers": idx_layers,
        "bytes_per_token": per_token,
        "latent_only_bytes_per_token": kv_layers * latent,
        "mtp_included": bool(n_mtp),
    }


def serving_budget(capacity: int, weights: float, per_token: int, seqs: int, context: int,
                   tp: int, dp_attention: bool, per_sequence: int = 0) -> tuple[int, int]:
    """(longest context for ``seqs`` sequences per GPU, most sequences of ``context`` tokens) that
    fit after the weights, with no runtime reserve; with DP attention each of the TP GPUs serves
    its own sequences, so the batch is ``tp`` times the sequences per GPU. ``per_sequence``: bytes
    a sequence holds whatever its length (a hybrid model's Mamba state)."""
    avail = capacity - weights
    max_tokens_per_gpu = max(0, (avail - per_sequence * seqs) // per_token) if per_token else 0
    max_context = max_tokens_per_gpu // seqs if seqs else 0
    per_seq = per_token * context + per_sequence
    max_seqs = max(0, avail // per_seq) if per_seq else 0
    return int(max_context), int(max_seqs * tp if dp_attention else max_seqs)


def sequence_bytes(kv: dict[str, Any], context: int) -> int:
    """What one sequence of ``context`` tokens holds on a GPU (:func:`serving_kv`): its KV cache and,
    for a hybrid model, its Mamba state."""
    return kv["bytes_per_token"] * context + kv["mamba_bytes_per_sequence"]


def _serving_notes(cfg: ModelConfig, kv: dict[str, Any], tp: int, context: int) -> list[str]:
    """The KV conventions of a serving estimate, one sentence each."""
    layers, latent, idx_layers = kv["layers"], kv["latent_bytes_per_token_layer"], kv["indexer_layers"]
    per_seq = sequence_bytes(kv, context)
    return [
        f"KV per token = {layers} x {latent} B latent + {idx_layers} x {kv['indexer_bytes_per_token_layer']} B "
        f"indexer keys = {kv['bytes_per_token']:,} B"
        + (" (MTP layer included)" if kv["mtp_included"] else " (decoder layers only; MTP not served)"),
        ("MLA caches one latent head per token, so TP does not shard the KV cache"
         if cfg.attention == "mla" else
         f"GQA: {cfg.num_key_value_heads} key-value heads of {cfg.head_dim} over TP={tp}: "
         f"{math.ceil(cfg.num_key_value_heads / tp)} per GPU"),
        (f"one {context:,}-token sequence: {per_seq / GB:.1f} GB = {per_seq / GIB:.1f} GiB; KV without "
         f"indexer keys {layers * latent * context / GB:.1f} GB = {layers * latent * context / GIB:.1f} GiB"),
        ("max_context_tokens: longest context for the given sequences per GPU; max_batch: most "
         "sequences at the given context; both after weights, with no runtime reserve"),
    ]


def inference_memory(cfg: ModelConfig, *, tp: int = 1, ep: int = 1, dp_attention: bool = False,
                     kv_dtype: str = "bf16", context: int | None = None, batch: int = 1,
                     gpu: str = "h100-80gb", gpu_capacity_bytes: int | None = None,
                     weight_dtype: str = "bf16", include_mtp: bool = False,
                     roles: RoleMap | None = None) -> dict[str, Any]:
    """Serving memory per GPU: weights under TP / EP (:func:`serving_weights`) plus the KV cache
    (:func:`serving_kv`) of ``batch`` sequences of ``context`` tokens (default: the config's
    ``max_position_embeddings``, else 131072), and the largest context / batch that fits
    (:func:`serving_budget`).

    MLA has one latent head, so TP does not shard it: every GPU of a TP group holds the whole cache
    of its sequences; sequences per GPU are all ``batch`` without DP attention, ``ceil(batch / tp)``
    with it (each attention-DP rank serves its own). FACTS counts the decoder layers only (MTP
    excluded by default; ``include_mtp`` serves it). docs/MODELS.md section 6 states the numbers.
    """
    context = context if context is not None else (cfg.max_position_embeddings or 131072)
    _refuse_bad_serving_args(tp, ep, batch, weight_dtype, context)
    roles = roles or derive_roles(cfg)
    g = resolve_gpu(gpu, gpu_capacity_bytes)
    n_mtp = cfg.num_nextn_predict_layers if include_mtp else 0
    dense, expert, weights = serving_weights(cfg, roles, tp=tp, ep=ep, dp_attention=dp_attention,
                                             weight_dtype=weight_dtype, n_mtp=n_mtp)
    kv = serving_kv(cfg, roles, kv_dtype=kv_dtype, tp=tp, n_mtp=n_mtp)
    seqs = math.ceil(batch / tp) if dp_attention else batch
    per_seq = sequence_bytes(kv, context)
    total = weights + per_seq * seqs
    cap = g.capacity_bytes
    max_context, max_batch = serving_budget(cap, weights, kv["bytes_per_token"], seqs, context, tp, dp_attention,
                                            kv["mamba_bytes_per_sequence"])
    return {
        "gpu": g.to_dict(),
        "tp": tp, "ep": ep, "etp": serving_expert_tp(tp, ep), "dp_attention": dp_attention,
        "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "include_mtp": include_mtp,
        "params_per_gpu": {"dense": dense, "expert": expert, "total": dense + expert},
        "weights_bytes_per_gpu": int(weights),
        "kv": kv,
        "context": context,
        "batch": batch,
        "sequences_per_gpu": seqs,
        "kv_bytes_per_sequence": per_seq,
        "kv_bytes_per_gpu": per_seq * seqs,
        "total_bytes_per_gpu": int(total),
        "capacity_bytes": cap,
        "fits": total <= cap,
        "headroom_bytes": int(cap - total),
        "max_context_tokens": max_context,
        "max_batch": max_batch,
        "notes": _serving_notes(cfg, kv, tp, context),
    }
