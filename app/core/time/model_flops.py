"""Model FLOPs per step in Megatron-Bridge's convention: what its performance tables' "Model
TFLOP / sec / GPU" divides by the step time.

Source: NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/training/utils/flop_utils.py``
``num_floating_point_operations`` -> ``transformer_flops`` @ 067f987df03b8355b03192d88d70f1709fedf51a
(the commit of ``docs/performance-summary*.md`` the calibration rows cite). Per token (``3 * 2``
= forward + backward, 2 FLOPs per multiply-add; no recompute; causal attention counted as half of
the ``s x s`` square; norms, softmax, router and biases not counted):

* MLP: ``6 H (I * f * dense + (i * topk * f + i_shared * f) * moe)``, ``f = 3`` for a gated
  (SwiGLU) MLP and ``2`` otherwise; MTP layers count as one more MoE (or dense) layer each;
* GQA / MHA attention per layer (MTP layers included):
  ``6 (H (q + k + v) + q H + q * s / 2 * 2)`` with ``q = kv_channels * heads``,
  ``k = v = kv_channels * query_groups``; on a sliding-window layer of ``W < s`` keys the core is
  ``6 q * c * 2`` over the window's mean causal context ``c = W - W (W - 1) / (2 s)`` (the
  function's ``window_size`` / ``window_attn_skip_freq`` branch; GPT-OSS: every other layer);
* MLA per layer: ``6 (rq (H + h (dn + dr) + 1) + rkv (H + h (dn + dv) + 1) + H dr + h dv H
  + s h (dn + dr) / 2 + s h dv / 2)`` (``H h (dn + dr)`` without a q LoRA);
* DSA (``experimental_attention_variant == "dsa"``): the MLA projections, absorbed sparse
  attention ``6 * sparse_ctx * h * (2 rkv + dr)`` with ``sparse_ctx = k - k (k-1) / (2 s)``, the
  indexer projections ``2 x`` forward only and its scoring ``2 * (s+1)/2 * Hi (di + 1)`` on the
  layers that compute top-k (with the auxiliary loss: 4 x projections, backward over the selected
  pairs, and the teacher QK term, as ``flop_utils`` counts them);
* Qwen3-Next / Qwen3.5 (``experimental_attention_variant`` gated DeltaNet): the GQA term with the
  output gate's ``H q`` more (``attention_output_gate``), then each gated DeltaNet layer's share
  replaced by its own term (:func:`_gdn_term`);
* MTP: ``6 * mtp * (3H + 2H^2)``; logits ``6 H V_pad (mtp + 1)`` with the vocabulary padded to a
  multiple of ``128 * TP`` (``calculate_padded_vocab_size``).

A hybrid model (``hybrid_layer_pattern``) is counted by ``hybrid_flops`` instead, layer kind by
layer kind (3 x forward): attention ``4 H p (H + H g / h) + 2 H p s`` (``p = head_dim h / H``, the
core over the whole square), Mamba ``2 H (2 d_in + 2 G N + heads) + 7 d_in N + 2 d_in H`` with
``d_in = 2 H`` (the function's own stand-in for ``heads x head_dim``), MLP ``4 H I f / 2``, MoE
``4 H (i topk + i_shared) f / 2`` (``f / 2`` = 1, or 3/2 gated; LatentMoE: the routed part over L for H
and ``4 H L`` for the projections), logits ``2 H V_pad`` once more per MTP layer, each MTP layer's
attention and MoE blocks counted as layers.
"""

from __future__ import annotations

from app.core.model.config import ModelConfig
from app.core.model.roles import RoleMap, ffn_kinds


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's ``calculate_padded_vocab_size`` (``megatron/training/vocab_utils.py``)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def model_flops_per_token(cfg: ModelConfig, roles: RoleMap | None = None, *, seq_length: int, tp: int = 1,
                          mtp_layers: int = 0, indexer_loss: bool = True, vocab_divisible_by: int = 128) -> float:
    """Megatron-Bridge model FLOPs (forward + backward) per token of a ``seq_length`` batch."""
    if cfg.hybrid_pattern is not None:
        return _hybrid_flops(cfg, seq_length, padded_vocab(cfg.vocab_size, tp, vocab_divisible_by), mtp_layers)
    H, h, s = cfg.hidden_size, cfg.num_attention_heads, seq_length
    kinds = ffn_kinds(cfg)
    n_moe = sum(1 for k in kinds if k == "moe")
    n_dense = len(kinds) - n_moe
    last_moe = 1 if kinds and kinds[-1] == "moe" else 0
    n_moe += last_moe * mtp_layers
    n_dense += (1 - last_moe) * mtp_layers
    layers = cfg.num_hidden_layers + mtp_layers
    f = 3 if cfg.gated_mlp else 2
    shared = cfg.n_shared_experts * cfg.moe_intermediate_size
    mlp = 6 * H * (cfg.intermediate_size * f * n_dense
                   + (cfg.moe_intermediate_size * cfg.num_experts_per_tok * f + shared * f) * n_moe)
    if cfg.attention == "gqa":
        q = cfg.head_dim * h
        kv = cfg.head_dim * cfg.num_key_value_heads
        gate = q if cfg.attention_output_gate else 0
        attn = 6 * (layers * (H * (q + 2 * kv + gate) + q * H) + 2 * q * _gqa_context(cfg, s, mtp_layers))
        if cfg.gdn is not None and cfg.layer_attention is not None:
            attn = _gdn_term(cfg, attn, layers, mtp_layers)
    else:
        rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q_term = rq * (H + h * (dn + dr) + 1) if rq else H * h * (dn + dr)
        kv_term = rkv * (H + h * (dn + dv) + 1) + H * dr
        o_term = h * dv * H
        if cfg.has_indexer:
            attn = _dsa_term(cfg, roles, layers, mtp_layers, s, q_term, kv_term, o_term, indexer_loss)
        else:
            core = s * h * (dn + dr) / 2 + s * h * dv / 2
            attn = 6 * layers * (q_term + kv_term + o_term + core)
    mtp = 6 * mtp_layers * (3 * H + 2 * H * H)
    logits = 6 * H * padded_vocab(cfg.vocab_size, tp, vocab_divisible_by) * (mtp_layers + 1)
    return mlp + attn + mtp + logits


def _gqa_context(cfg: ModelConfig, s: int, mtp_layers: int) -> float:
    """The causal context summed over the attention layers (MTP layers as full ones): ``s / 2`` a
    full layer, ``W - W (W - 1) / (2 s)`` a sliding-window layer of ``W < s`` keys (``flop_utils``'
    exact mean causal sliding-window context; a window of ``s`` or more counts as full)."""
    windows = cfg.layer_windows or ()
    full = cfg.num_hidden_layers + mtp_layers - sum(1 for w in windows if 0 < w < s)
    return full * s / 2 + sum(w - w * (w - 1) / (2 * s) for w in windows if 0 < w < s)


def _gdn_term(cfg: ModelConfig, attn: float, layers: int, mtp_layers: int) -> float:
    """``flop_utils``' gated DeltaNet branch: of the ``layers`` attention terms (MTP layers
    included, each of the last decoder layer's kind), the GDN layers' are replaced by
    ``6 (H (2K + 2V + 2Hv) + C (2K + V) + 4 Hv dv^2 + H V)`` (``dk dv`` for ``dv^2``) and the others
    keep the mean attention term."""
    g, kinds = cfg.gdn, cfg.layer_attention
    assert g is not None and kinds is not None
    n_gdn = kinds.count("gdn") + (mtp_layers if kinds and kinds[-1] == "gdn" else 0)
    per_gdn = 6 * (cfg.hidden_size * g.in_proj_out + g.conv_kernel * g.conv_dim
                   + 4 * g.value_heads * g.key_head_dim * g.value_head_dim + cfg.hidden_size * g.value_dim)
    return per_gdn * n_gdn + attn / layers * (layers - n_gdn)


def _dsa_term(cfg: ModelConfig, roles: RoleMap | None, layers: int, mtp_layers: int, s: int, q_term: float,
              kv_term: float, o_term: float, indexer_loss: bool) -> float:
    H, h = cfg.hidden_size, cfg.num_attention_heads
    rq, rkv, dr = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    k, hi, di = cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim
    if roles is not None:
        n_idx = sum(1 for r in roles.layers if r.has_indexer) + sum(1 for r in roles.mtp[:mtp_layers] if r.has_indexer)
    else:
        n_idx = layers
    dense_ctx = (s + 1) / 2
    sparse_ctx = dense_ctx if s <= k else k - k * (k - 1) / (2 * s)
    proj = 6 * layers * (q_term + kv_term + o_term)
    core = 6 * layers * sparse_ctx * h * ((rkv + dr) + rkv)
    idx_proj = (4 if indexer_loss else 2) * n_idx * ((rq or H) * hi * di + H * di + H * hi)
    unit = hi * (di + 1)
    score = 2 * n_idx * dense_ctx * unit + (4 * n_idx * sparse_ctx * unit if indexer_loss else 0)
    teacher = 2 * n_idx * sparse_ctx * h * (rkv + dr) if indexer_loss else 0
    return proj + core + idx_proj + score + teacher


def _hybrid_flops(cfg: ModelConfig, s: int, vocab: int, mtp_layers: int = 0) -> float:
    """``flop_utils.hybrid_flops`` per token (module docstring): its layer counts from the pattern and
    the MTP layers' blocks (``*E`` each, ``get_hybrid_layer_counts`` counts them too), the logits
    once more per MTP layer."""
    pattern = (cfg.hybrid_pattern or "") + "*E" * mtp_layers
    H, h = cfg.hidden_size, cfg.num_attention_heads
    scale = 1.5 if cfg.gated_mlp else 1.0
    p = cfg.head_dim * h / H
    attn = 4 * H * p * (H + H * cfg.num_key_value_heads / h) + 2 * H * p * s
    mamba = 0.0
    if cfg.mamba is not None:
        m, d_in = cfg.mamba, 2 * H
        mamba = 2 * H * (2 * d_in + 2 * m.groups * m.state + m.heads) + 7 * d_in * m.state + 2 * d_in * H
    mlp = 4 * H * cfg.intermediate_size * scale
    shared = cfg.n_shared_experts * cfg.moe_intermediate_size
    latent = cfg.moe_latent_size
    moe = 4 * (latent or H) * cfg.moe_intermediate_size * cfg.num_experts_per_tok * scale + 4 * H * shared * scale
    moe += 4 * H * latent  # LatentMoE's two projections
    forward = (pattern.count("*") * attn + pattern.count("M") * mamba + pattern.count("-") * mlp
               + pattern.count("E") * moe + 2 * H * vocab * (1 + mtp_layers))
    return 3 * forward
