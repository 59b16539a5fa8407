"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5 / 3.6; HF ``qwen3_next``, ``qwen3_5_text``,
``qwen3_5_moe_text``): its shapes, and its parameter, FLOP and byte counts. The one home of the
GDN physics; the parameter, FLOP, memory and time models read it.

These models are attention + FFN layers like any GPT: each layer's token mixer is either gated
softmax attention (a "full_attention" layer) or a Gated DeltaNet (a "linear_attention" layer), by
``layer_types`` (default: every ``full_attention_interval``-th layer full, 4). Megatron-Core builds
them as a GPT model with ``experimental_attention_variant="gated_delta_net"`` and
``linear_attention_freq`` (Megatron-Bridge ``src/megatron/bridge/models/qwen/qwen35_bridge.py``
``_apply_qwen35_common_config`` @ 067f987d), so they are pipelined as ordinary decoder layers.

GDN module, with ``K = Hk dk`` (query/key width), ``V = Hv dv`` (value width), kernel ``C``
(NVIDIA/Megatron-LM ``megatron/core/ssm/gated_delta_net/common.py`` ``_GDNBase.__init__`` and
``gdn.py`` ``GatedDeltaNet._setup_variant_attrs`` @ d98e8a64; transformers
``models/qwen3_next/modeling_qwen3_next.py`` ``Qwen3NextGatedDeltaNet``):

* ``in_proj`` ``H -> 2K + 2V + 2Hv`` (q, k, v, the output gate z, beta, alpha; HF splits it in
  ``in_proj_qkvz`` + ``in_proj_ba``, Qwen3.5 in four), ``conv1d`` depthwise over ``2K + V``
  channels of ``C`` taps without bias, ``dt_bias`` and ``A_log`` (``Hv`` each), the gated RMSNorm's
  ``dv`` gains (one head's width, shared by the heads), ``out_proj`` ``V -> H``; no biases. All of
  it is split over TP by heads (``dt_bias``, ``A_log``, conv and projections carry
  ``tensor_model_parallel``); the norm's ``dv`` gains are replicated. Megatron requires
  ``Hv % Hk == 0`` and both head counts divisible by ``TP x CP`` (``transformer_config.py``
  ``__post_init__``: "linear_num_key_heads=... must be a multiple of (tensor_model_parallel_size
  * context_parallel_size)").
* The chunked gated delta rule (FLA ``chunk_gated_delta_rule``, chunk ``Q = 64``): q and k are
  repeated to the ``Hv`` value heads, so the kernels work on ``Hv`` heads of ``dk`` and ``dv``.
  Its FLOPs are counted as Megatron-Bridge's model-FLOPs convention counts them
  (``flop_utils.py`` ``gdn_layer_flops``: ``4 Hv dv^2`` multiply-adds a token, the conv
  ``C (2K + V)``), with ``dk dv`` for ``dv^2`` (the same when ``dk = dv``, as in every released
  model).
* Bytes the conv, the delta-rule kernels and the gated norm move per token, forward, kernel by
  kernel as FLA's ``chunk_gated_delta_rule_fwd`` runs them (BF16 activations; FP32 gate
  cumulative sums, the intra-chunk ``A`` (``Q`` a token a head) and chunk states ``dk x dv`` a head,
  once per chunk): the causal conv reads and writes ``2K + V``; the repeat of q and k to ``Hv``
  heads writes them; ``chunk_local_cumsum`` reads and writes ``g``; ``chunk_scaled_dot_kkt`` reads k,
  beta, g and writes ``A``; ``solve_tril`` reads and writes it; ``recompute_w_u`` reads ``A``, k, v,
  beta and writes ``w`` and ``u``; ``chunk_gated_delta_rule_fwd_h`` reads k, w, u, g and writes the
  states and ``v_new``; ``chunk_fwd_o`` reads q, k, ``v_new``, the states and g and writes the output;
  then the gated RMSNorm reads it and z and writes the normed output (kept apart: Megatron's
  ``gdn_norm_out`` recompute module re-runs it, and it streams like any norm). The delta rule's
  backward recomputes and forms every gradient: three times the forward's bytes, as for Mamba-2's
  scan (:mod:`app.core.model.hybrid`); the time model moves them at the same fitted share of the
  streaming bandwidth (``app.core.time.efficiency.SSD_BANDWIDTH``: both are chains of Triton
  kernels over chunked states; no published measurement of FLA's kernels exists).
"""

from __future__ import annotations

from dataclasses import dataclass

#: FLA's chunk length (``GatedDeltaNet.chunk_size``)
GDN_CHUNK = 64


@dataclass(frozen=True)
class GdnDims:
    """A Gated DeltaNet's sizes (module docstring)."""

    key_heads: int  # Hk, linear_num_key_heads
    value_heads: int  # Hv, linear_num_value_heads
    key_head_dim: int  # dk
    value_head_dim: int  # dv
    conv_kernel: int  # C, linear_conv_kernel_dim
    #: bytes of a serving engine's recurrent-state element: 4 when the file asks for an FP32 state
    #: (``mamba_ssm_dtype`` "float32", Qwen3.5's files), else the model's BF16 (:meth:`state_bytes`)
    state_element_bytes: int = 2

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def in_proj_out(self) -> int:
        """Columns of ``in_proj``: q, k, v, z, beta and alpha."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.value_heads

    def params(self, hidden: int) -> int:
        """Every parameter of one GDN module (all TP-sharded but the norm's ``dv`` gains)."""
        return (self.projection_params(hidden) + self.conv_dim * self.conv_kernel + 2 * self.value_heads
                + self.value_head_dim)

    def projection_params(self, hidden: int) -> int:
        """The two projections' weights (the GEMMs of the module)."""
        return hidden * self.in_proj_out + self.value_dim * hidden

    def rule_flops_per_token(self) -> int:
        """The delta rule, forward, per token: ``4 Hv dk dv`` multiply-adds (2 FLOPs each;
        Megatron-Bridge's ``gdn_layer_flops`` convention, module docstring). The conv's ``C (2K + V)``
        are 2 x its weights, counted with the weights."""
        return 2 * 4 * self.value_heads * self.key_head_dim * self.value_head_dim

    def scan_bytes_per_token(self) -> float:
        """Bytes the conv and delta-rule kernels read and write per token, forward (module docstring;
        the gated norm's are :meth:`norm_bytes_per_token`)."""
        hv, dk, dv, q = self.value_heads, self.key_head_dim, self.value_head_dim, GDN_CHUNK
        qk = 2 * hv * dk * 2  # q and k on the value heads, BF16
        k, v = 2 * hv * dk, 2 * hv * dv
        a = 4 * hv * q  # the FP32 intra-chunk matrix, per token
        states = 4 * hv * dk * dv / q  # one FP32 state per head per chunk
        conv = 2 * 2 * self.conv_dim
        repeat = qk
        cumsum = 2 * 4 * hv
        kkt = k + 2 * hv + 4 * hv + a
        tril = 2 * a
        w_u = a + k + v + 2 * hv + k + v
        h = k + k + v + 4 * hv + states + v
        out = qk + v + states + 4 * hv + v
        return conv + repeat + cumsum + kkt + tril + w_u + h + out

    def norm_bytes_per_token(self) -> int:
        """The gated RMSNorm's bytes per token, forward: it reads the rule's output and the gate z and
        writes the normed output (BF16; Megatron's ``gdn_norm_out`` recompute module re-runs it)."""
        return 3 * 2 * self.value_dim

    def state_bytes(self, tp: int = 1) -> float:
        """A serving engine's cache of one sequence in one GDN layer on one GPU: the conv window
        ``(2K + V) x (C - 1)`` in the model's BF16 and the recurrent state ``Hv x dv x dk`` in
        :attr:`state_element_bytes`, split over TP by heads - per sequence, whatever its length
        (vLLM ``mamba_utils.py`` ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator
        .gated_delta_net_state_dtype``: the state in the model's dtype unless ``mamba_ssm_cache_dtype``
        is set, which Qwen3.5's ``mamba_ssm_dtype`` sets)."""
        return (2 * self.conv_dim * (self.conv_kernel - 1)
                + self.state_element_bytes * self.value_heads * self.key_head_dim * self.value_head_dim) / tp
