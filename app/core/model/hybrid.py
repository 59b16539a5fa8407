"""Hybrid Mamba-Transformer models (NVIDIA Nemotron-H and Nemotron 3, HF ``nemotron_h``): which
mixer and which FFN each layer is, the Mamba-2 mixer's shapes, and its parameter, FLOP and byte
counts. The one home of the Mamba physics; the parameter, FLOP, memory and time models read it.

A hybrid model's layer is one pre-norm block with one module, not an attention + FFN pair
(transformers ``models/nemotron_h/modeling_nemotron_h.py`` ``NemotronHBlock``: an RMSNorm and a
mixer). Megatron writes the layers as symbols (NVIDIA/Megatron-LM
``megatron/core/models/hybrid/hybrid_layer_allocation.py`` ``Symbols`` @ d98e8a64): ``M`` Mamba,
``*`` attention, ``E`` MoE, ``-`` MLP (the others - ``G`` gated delta net, ``D`` / ``+`` DSA / MLA
attention - no HF family isplan reads uses); HF writes the same list as ``layers_block_type``
(``linear_attention`` / ``full_attention`` / ``moe`` / ``mlp``, ``NemotronHConfig``) or, in older
files, the symbol string ``hybrid_override_pattern``.

Mamba-2 mixer (``NemotronHMamba2Mixer``; Megatron ``megatron/core/ssm/mamba_mixer.py``), with
``d = heads x head_dim``, ``G`` groups of state size ``N``, ``conv_dim = d + 2GN``, kernel ``K``:

* ``in_proj`` ``H -> 2d + 2GN + heads`` (z, x, B, C, dt), ``conv1d`` depthwise ``conv_dim x K``
  (+ ``conv_dim`` bias with ``use_conv_bias``), ``dt_bias``, ``A_log``, ``D`` (``heads`` each), the
  gated RMSNorm's ``d`` gains, ``out_proj`` ``d -> H``; every part is split over TP by heads and
  groups (Megatron asserts ``heads % TP == 0``, ``groups % TP == 0``, ``heads % groups == 0``).
* SSD, the chunked scan (chunk ``Q``; Dao and Gu 2024, "Transformers are SSMs", the SSD
  algorithm), forward multiply-adds per token: ``G Q N`` (C B^T within a chunk, one per group, whole
  blocks as the kernel computes them) + ``heads (Q P + 2 N P)`` (the masked scores times x, the
  chunk's state ``B^T x`` and the state read-out ``C h``), ``P = head_dim``.
* bytes the conv, the SSD kernels and the gated norm move per token, forward, kernel by kernel as
  mamba_ssm runs them (``ops/triton/ssd_combined.py`` ``_mamba_chunk_scan_combined_fwd``, which
  Megatron's ``mamba_split_conv1d_scan_combined`` calls; BF16 activations, FP32 ``dt`` / ``dA``
  cumulative sums, chunk states and ``C B^T``): the causal conv reads and writes ``conv_dim``; the
  cumulative sums read ``dt`` and write two FP32 copies; ``chunk_state`` reads x, B, dt, dA and
  writes one FP32 state ``heads x P x N`` per chunk (``/ Q`` per token); ``state_passing`` reads and
  writes the states; ``bmm_chunk`` reads B and C and writes ``C B^T`` (``G Q`` FP32 per token);
  ``chunk_scan`` reads ``C B^T``, x, dt, dA, C, the states and z and writes the output and its
  pre-norm copy; the gated RMSNorm reads both and writes the normed output.
  The backward recomputes the conv and the states and forms every gradient: three times the
  forward's bytes (the time model's other memory-bound work moves twice; a kernel-by-kernel count
  of ``MambaSplitConv1dScanCombinedFn.backward`` @ e9594ce1, FP32 partial gradients included, gives
  2.6-3x). The time model moves these bytes at a fitted share of the streaming bandwidth
  (``app.core.time.efficiency.SSD_BANDWIDTH``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: HF ``layers_block_type`` names and Megatron's symbols for the same layer kinds
BLOCK_SYMBOLS = {"linear_attention": "M", "full_attention": "*", "moe": "E", "mlp": "-"}
#: Older HF names for the same blocks (``remap_legacy_layer_types``)
LEGACY_BLOCKS = {"mamba": "M", "attention": "*"}
#: A symbol's (mixer, FFN): what the layer runs besides its norm
SYMBOL_PARTS = {"M": ("mamba", "none"), "*": ("attention", "none"), "E": ("none", "moe"), "-": ("none", "dense")}


@dataclass(frozen=True)
class MambaDims:
    """A Mamba-2 mixer's sizes (module docstring)."""

    heads: int
    head_dim: int
    state: int  # N, ssm_state_size
    groups: int  # G, n_groups
    conv_kernel: int  # K
    chunk: int  # Q, chunk_size
    conv_bias: bool = True
    proj_bias: bool = False  # in_proj / out_proj biases (use_bias)

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj_out(self) -> int:
        """Columns of ``in_proj``: z, x, B, C and dt."""
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads

    def params(self, hidden: int) -> int:
        """Every parameter of one mixer (all TP-sharded in Megatron)."""
        d = self.d_inner
        proj = hidden * self.in_proj_out + d * hidden + ((self.in_proj_out + hidden) if self.proj_bias else 0)
        conv = self.conv_dim * self.conv_kernel + (self.conv_dim if self.conv_bias else 0)
        return proj + conv + 3 * self.heads + d

    def projection_params(self, hidden: int) -> int:
        """The two projections' weights (the GEMMs of the layer)."""
        return hidden * self.in_proj_out + self.d_inner * hidden

    def scan_flops_per_token(self) -> int:
        """SSD forward FLOPs per token (2 per multiply-add; module docstring)."""
        q, n, p = self.chunk, self.state, self.head_dim
        return 2 * (self.groups * q * n + self.heads * (q * p + 2 * n * p))

    def scan_bytes_per_token(self) -> float:
        """Bytes the conv, SSD and gated-norm kernels read and write per token, forward (module
        docstring)."""
        d, gn, nh = self.d_inner, self.groups * self.state, self.heads
        states = 4 * nh * self.head_dim * self.state / self.chunk  # FP32 chunk states per token
        cb = 4 * self.groups * self.chunk  # FP32 C B^T per token
        conv = 2 * 2 * self.conv_dim
        cumsum = 2 * nh + 2 * 4 * nh
        chunk_state = 2 * d + 2 * gn + 2 * 4 * nh + states
        passing = 2 * states
        bmm = 2 * 2 * gn + cb
        scan = cb + 2 * d + 2 * 4 * nh + 2 * gn + states + 2 * d + 2 * 2 * d
        norm = 3 * 2 * d
        return conv + cumsum + chunk_state + passing + bmm + scan + norm


    def state_bytes(self, tp: int = 1) -> float:
        """A serving engine's cache of one sequence in one Mamba layer on one GPU: the conv window
        ``conv_dim x (K - 1)`` in BF16 and the SSM state ``heads x head_dim x N`` in FP32
        (``NemotronHConfig.mamba_ssm_cache_dtype`` "float32"), split over TP by heads and groups -
        per sequence, whatever its length (vLLM's Mamba cache holds one state per request)."""
        return (2 * self.conv_dim * (self.conv_kernel - 1) + 4 * self.heads * self.head_dim * self.state) / tp


def block_symbols(blocks: list[str]) -> str:
    """Megatron's symbol string of an HF ``layers_block_type`` list (raises ``KeyError`` on an
    unknown name, which the config reader turns into a message naming the field)."""
    return "".join(BLOCK_SYMBOLS.get(b) or LEGACY_BLOCKS[b] for b in blocks)
