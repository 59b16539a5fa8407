"""Model configs: the pinned presets and any HF ``config.json`` of the model families Megatron /
slime users train.

A :class:`ModelConfig` keeps the fields the planner's models need, every other field of the
file untouched (``extra``), and two digests:

* ``sha256``: of the exact bytes that were loaded (what a receipt pins);
* ``canonical_sha256``: of the sorted, minified JSON (``sort_keys``, ``(",", ":")`` separators,
  UTF-8), so two files that differ only in whitespace or key order share it.

Accepted model types, by attention kind (``ModelConfig.attention``):

* ``mla`` (multi-head latent attention): ``glm_moe_dsa`` (GLM-5.x, DSA), ``deepseek_v32`` (DSA
  reference), ``deepseek_v3`` and ``kimi_k2`` (Kimi-K2 ships ``DeepseekV3ForCausalLM``), and any
  config of another type that carries the MLA fields (``kv_lora_rank`` ...), as in transformers
  ``DeepseekV3Config``;
* ``gqa`` (grouped-query / multi-head attention with ``num_key_value_heads`` and ``head_dim``):
  ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``phi3``, ``gemma``, ``gemma2``, ``gemma3_text`` (and a
  multimodal ``gemma3`` file's ``text_config``; a ``mistral3`` file's ``mistral`` or ``ministral3`` one; the
  language model of a Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), GLM-4.1V or GLM-4.5V file, :data:`_TEXT_FAMILIES`),
  ``ministral3`` (Ministral 3: Mistral's shapes), ``olmo2``, ``olmo3``,
  ``granite`` (Granite 3: Llama's shapes, its multipliers scale activations only), ``smollm3`` (Llama's shapes,
  tied by default, windows only on its NoPE layers), ``ernie4_5`` (ERNIE 4.5 dense: Llama's shapes, ``use_bias`` on
  every projection, tied by default), ``seed_oss`` (Seed-OSS: Llama's shapes, q/k/v biases by ``attention_bias``,
  the output's by ``attention_out_bias``), ``starcoder2`` (StarCoder2: Mistral's attention and a 2-matrix GELU MLP,
  ``use_bias`` everywhere, LayerNorms with biases), ``cohere`` / ``cohere2`` (Command R / R+ / R7B / A: one
  LayerNorm a layer before attention and MLP in parallel, tied; Command R+'s per-head q/k LayerNorms; Cohere2:
  ``head_dim`` H / h, windows on 3 layers of 4), ``exaone4`` (EXAONE 4.0: OLMo 2's post-norm layer, a
  per-head QK-norm, sliding windows on 3 layers of 4), ``glm4`` (GLM-4 dense:
  four norms a layer, q/k/v biases), ``nemotron``
  (Nemotron-4 / Minitron: a 2-matrix squared-ReLU MLP and LayerNorms with biases), ``mimo`` (Xiaomi MiMo:
  Qwen2's decoder with MTP layers) (dense) and
  ``qwen2_moe``, ``qwen3_moe``, ``mixtral``, ``olmoe``, ``granitemoe`` / ``granitemoeshared`` (Granite 3 MoE: Mixtral's
  experts on Granite's attention, the latter with a shared expert), ``minimax_m2``, ``ernie4_5_moe``,
  ``bailing_moe_v2`` (Ling 2.0),
  ``glm4_moe``, ``gpt_oss``, ``llama4`` (MoE; Llama 4's
  ``text_config``, with chunked attention), ``nemotron_h`` (hybrid Mamba), ``qwen3_next``, ``qwen3_5_text`` and
  ``qwen3_5_moe_text`` (Qwen3-Next, Qwen3.5 / 3.6 and a ``qwen3_5`` / ``qwen3_5_moe`` file's ``text_config``:
  gated attention on every ``full_attention_interval``-th layer, a gated DeltaNet on the others,
  :func:`_gdn_family`), and ``gpt2`` (the
  dense GPT of GPT-2 / GPT-3 / Megatron's ``GPTModel``: multi-head attention, a 2-matrix GELU
  MLP of ``n_inner`` (default 4H), LayerNorms with biases, biases on every linear layer, learned
  position embeddings of ``n_positions`` rows and tied embeddings by default; transformers
  ``models/gpt2/configuration_gpt2.py`` ``GPT2Config`` and ``modeling_gpt2.py``
  ``GPT2Attention`` / ``GPT2MLP``).

Each family spells its fields its own way; they are read into one set of fields
(huggingface/transformers ``models/<family>/configuration_<family>.py`` and the module shapes
in ``modeling_<family>.py``):

* experts: ``n_routed_experts`` (DeepSeek, GLM), ``num_experts`` (Qwen3-MoE; OLMoE, whose
  ``intermediate_size`` is the expert width), ``num_local_experts`` (Mixtral, likewise);
* dense-first / interleaved MoE layers: ``first_k_dense_replace`` + ``moe_layer_freq``
  (DeepSeek, GLM), ``decoder_sparse_step`` + ``mlp_only_layers`` (Qwen3-MoE: layer ``i`` is MoE
  iff ``i`` is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``), every
  layer (Mixtral);
* shared experts: ``n_shared_experts`` (DeepSeek, GLM-4.5); Qwen2-MoE's one gated shared expert of
  ``shared_expert_intermediate_size`` as that many expert widths (:func:`_qwen2_moe_experts`);
  none for Qwen3-MoE and Mixtral;
* attention biases: Qwen2 has q/k/v biases (``bias=True`` in ``Qwen2Attention``) and none on
  o_proj; Llama / Mistral / Qwen3 put ``attention_bias`` on q, k, v and o; GLM-4.5 on q, k, v only;
* QK-norm (an RMSNorm of ``head_dim`` on q and on k): always for Qwen3 / Qwen3-MoE and Gemma 3,
  ``use_qk_norm`` for GLM-4.5; OLMo 2 / 3, OLMoE and MiniMax-M2 norm the whole q and k projections
  (``qk_norm_full``);
* Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (same counts, no biases);
  Gemma / Gemma 2 / Gemma 3 default ``head_dim`` to 256 and tie the embeddings unless the file says
  otherwise, Gemma 2 and 3 have four RMSNorms a layer (``norms_per_layer``), and Gemma 3 a QK-norm
  and one full-attention layer every ``sliding_window_pattern`` (6) layers, the rest sliding;
* GPT-OSS: attention sinks, expert and trained router biases, and sliding windows on alternate
  layers (``layer_windows``, :func:`_layer_windows`, as for Gemma 2, Mistral and Phi-3);
* router score-correction bias (``e_score_correction_bias``, E per MoE layer): DeepSeek, GLM, MiniMax-M2,
  ERNIE 4.5 (its ``moe_statics``) and Ling 2.0 (``expert_bias``);
* MTP (``num_nextn_predict_layers``): DeepSeek, GLM, Ling 2.0 and MiMo, and Qwen3-Next / Qwen3.5
  (``mtp_num_hidden_layers`` too); none elsewhere (a file that names MTP
  layers nothing builds - MiniMax-M2's, ERNIE 4.5's, GLM-4.5V's - has none).

A ``model_type`` outside this list without the MLA fields is refused (its shapes cannot be read
completely), and so is any config that sets a field building what isplan does not model
(:data:`UNMODELLED_FIELDS`: DeepSeek-V4's hyper-connections, compressed sparse attention and hash
routing, Kimi K3's linear attention, a gated DeltaNet outside Qwen3-Next / Qwen3.5). Input is refused, with a message naming the field, when
it is not JSON, is over 1 MiB, nests deeper than 64 levels, repeats a key, contains NaN or
Infinity, lacks ``num_hidden_layers``, or carries a negative, non-integer or absurd size, or an
``indexer_types`` / ``mlp_layer_types`` / ``index_topk_pattern`` of the wrong length or with
other values.

Design note: this module deliberately uses a frozen dataclass with hand-written validation rather
than pydantic. ``isplan check`` runs inside launch scripts as a release gate and must start within
2x of a dependency-free Node checker; importing pydantic alone costs ~180 ms on the reference
machine. The web layer wraps these objects in pydantic response models.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from app.core.content_cache import hash_once, state_without_hash
from app.core.model.gated_delta_net import GdnDims
from app.core.model.hybrid import SYMBOL_PARTS, MambaDims, block_symbols
from app.core.plan.bounds import MAX_MTP_LAYERS

MAX_CONFIG_BYTES = 1 << 20
MAX_JSON_DEPTH = 64

#: Upper bounds that no real config of this family comes near; larger values are refused as absurd.
_LIMITS: dict[str, int] = {
    "num_hidden_layers": 4096,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 22,
    "moe_intermediate_size": 1 << 22,
    "vocab_size": 1 << 24,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "q_lora_rank": 1 << 20,
    "kv_lora_rank": 1 << 20,
    "qk_nope_head_dim": 1 << 16,
    "qk_rope_head_dim": 1 << 16,
    "v_head_dim": 1 << 16,
    "n_routed_experts": 1 << 16,
    "n_shared_experts": 1 << 10,
    "num_experts_per_tok": 1 << 16,
    "first_k_dense_replace": 4096,
    "moe_layer_freq": 4096,
    "index_n_heads": 4096,
    "index_head_dim": 1 << 16,
    "index_topk": 1 << 24,
    "index_topk_freq": 4096,
    "index_skip_topk_offset": 4096,
    "num_nextn_predict_layers": MAX_MTP_LAYERS,  # the plan's own bound: a plan builds the config's MTP layers
    "max_position_embeddings": 1 << 30,
    "head_dim": 1 << 16,
    "num_experts": 1 << 16,
    "num_local_experts": 1 << 16,
    "decoder_sparse_step": 4096,
    "moe_num_experts": 1 << 16,
    "moe_k": 1 << 16,
    "moe_num_shared_experts": 1 << 10,
    "moe_layer_start_index": 4096,
    "moe_layer_end_index": 4096,
    "moe_layer_interval": 4096,
    "no_rope_layer_interval": 4096,
}

#: Fields that must be >= 1 when present (the others may be 0).
_POSITIVE = {
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "num_attention_heads",
    "index_topk_freq",
    "moe_layer_freq",
    "head_dim",
    "num_key_value_heads",
    "decoder_sparse_step",
    "moe_layer_interval",
    "no_rope_layer_interval",
}

MLA_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32", "deepseek_v3", "kimi_k2")
GQA_MODEL_TYPES = (
    # dense
    "llama", "mistral", "ministral3", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "gemma2", "gemma3_text", "olmo2",
    "olmo3", "granite", "smollm3", "exaone4", "glm4", "ernie4_5", "seed_oss", "starcoder2", "cohere", "cohere2",
    "nemotron", "mimo",
    # MoE and hybrid
    "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "granitemoe", "granitemoeshared", "glm4_moe", "gpt_oss", "minimax_m2",
    "ernie4_5_moe", "bailing_moe_v2",
    "nemotron_h", "llama4", "llama4_text",
    # gated DeltaNet hybrids (attention + FFN layers, some of whose token mixers are linear attention)
    "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
)
#: Qwen3-Next and Qwen3.5 / 3.6's language models: gated attention and gated DeltaNet layers
#: (:mod:`app.core.model.gated_delta_net`)
GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
#: Gemma, Gemma 2 and Gemma 3: ``head_dim`` 256 and tied embeddings when the file omits them (``GemmaConfig`` /
#: ``Gemma2Config`` / ``Gemma3TextConfig`` defaults, transformers ``models/gemma2/configuration_gemma2.py``,
#: ``models/gemma3/configuration_gemma3.py``)
_GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")
#: four RMSNorms a layer - input, post-attention, pre- and post-feedforward (``Gemma2DecoderLayer``,
#: ``Gemma3DecoderLayer``; GLM-4's ``Glm4DecoderLayer``: input, post-self-attention, post-attention and
#: post-MLP, transformers ``models/glm4/modular_glm4.py``)
_FOUR_NORM_TYPES = ("gemma2", "gemma3_text", "glm4")
#: OLMo 2 and 3 (transformers ``models/olmo2/modeling_olmo2.py`` ``Olmo2Attention``: ``q_norm =
#: RMSNorm(h d)``, ``k_norm = RMSNorm(g d)``; ``Olmo2DecoderLayer``: two norms, after attention and after
#: the MLP; ``models/olmo3/modular_olmo3.py``: the same layer, sliding windows on 3 layers of 4)
_OLMO_TYPES = ("olmo2", "olmo3")
#: OLMoE (transformers ``models/olmoe/modular_olmoe.py``: ``OlmoeAttention`` is Llama's attention with
#: ``q_norm = RMSNorm(H)`` and ``k_norm = RMSNorm(H / h * g)``, the whole q and k projections; Llama's
#: pre-norm layer; every layer an MoE of ``num_experts`` (alias ``num_local_experts``) gated experts of
#: ``intermediate_size``, a router without bias, no shared expert; ``OlmoeConfig`` defaults 64, top-8,
#: 2048, untied, ``attention_bias`` false)
#: MiniMax-M2 (transformers ``models/minimax_m2/modular_minimax_m2.py``: ``MiniMaxM2Attention`` is OLMo 2's
#: attention - ``q_norm`` over h d, ``k_norm`` over g d - with bias-free projections; Mixtral's pre-norm layer
#: and experts, ``num_local_experts`` (alias ``num_experts``) of ``intermediate_size``, a sigmoid router with
#: ``e_score_correction_bias``; ``MiniMaxM2Config`` defaults 256, top-8, 1536, ``head_dim`` 128, 8 KV heads;
#: its ``num_mtp_modules`` are built by neither transformers nor Megatron-Bridge's bridge, so not counted)
_FULL_QK_NORM_TYPES = (*_OLMO_TYPES, "olmoe", "minimax_m2")
#: ``head_dim`` when the file omits it (the config classes' defaults; else H / h)
_HEAD_DIM_DEFAULT = {"gemma": 256, "gemma2": 256, "gemma3_text": 256, "gpt_oss": 64, "minimax_m2": 128,
                     "bailing_moe_v2": 128, "ministral3": 128, "ernie4_5": 128, "seed_oss": 128,
                     **{t: 256 for t in GDN_MODEL_TYPES}}
KNOWN_MODEL_TYPES = MLA_MODEL_TYPES + GQA_MODEL_TYPES
#: model types whose MoE router has a score-correction bias (``e_score_correction_bias``)
_ROUTER_BIAS_TYPES = ("glm_moe_dsa", "deepseek_v32", "deepseek_v3", "kimi_k2", "glm4_moe", "minimax_m2", "ernie4_5_moe",
                      "bailing_moe_v2")
#: families whose attention projections never read ``attention_bias`` (MiniMax-M2: bias-free; ERNIE 4.5:
#: ``use_bias``, refused when true by :func:`_ernie45_moe`; Ling 2.0: :func:`_bailing_moe_v2`; EXAONE 4 and
#: Ministral 3 (``MistralAttention``'s projections): bias-free)
_OWN_BIAS_TYPES = ("minimax_m2", "ernie4_5", "ernie4_5_moe", "bailing_moe_v2", "exaone4", "ministral3", "seed_oss",
                   "starcoder2")
#: families whose config class ties the embeddings when the file does not say (``GemmaConfig`` ...,
#: ``SmolLM3Config``, ``Ernie4_5Config``, ``Starcoder2Config``, ``CohereConfig``, ``Cohere2Config``)
_TIED_BY_DEFAULT = (*_GEMMA_TYPES, "smollm3", "ernie4_5", "starcoder2", "cohere", "cohere2")
#: ``num_key_value_heads`` when the file omits it, where the config class's default is not h
_KV_HEADS_DEFAULT = {"minimax_m2": 8, "ernie4_5": 2, "ernie4_5_moe": 4, "bailing_moe_v2": 4, "exaone4": 32,
                     "smollm3": 4, "ministral3": 8, "seed_oss": 8, "starcoder2": 2,
                     **{t: 2 for t in GDN_MODEL_TYPES}}
_DSA_DEFAULTS = {"glm_moe_dsa": (32, 128, 2048), "deepseek_v32": (64, 128, 2048)}


class ConfigError(ValueError):
    """A config that cannot be used; ``field`` names the offending field (or ``None``)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Preset:
    id: str
    file: str
    label: str
    provenance: str
    upstream_repo: str
    notes: str
    sha256: str


@dataclass(frozen=True)
class ModelConfig:
    """The fields of an HF config that the planner uses, plus everything else in ``extra``."""

    id: str
    source: str  # "preset" | "path" | "upload"
    sha256: str
    canonical_sha256: str
    provenance: str
    upstream_repo: str | None
    label: str
    model_type: str | None
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    moe_layer_freq: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_topk_freq: int | None
    index_skip_topk_offset: int | None
    index_topk_pattern: str | None
    indexer_types: tuple[str, ...] | None
    mlp_layer_types: tuple[str, ...] | None
    num_nextn_predict_layers: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    attention: str = "mla"  # "mla" | "gqa"
    num_key_value_heads: int = 0  # GQA: key/value heads (MLA: 0, one latent)
    head_dim: int = 0  # GQA: per-head dim of q, k and v
    qkv_bias: bool = False  # biases on q, k, v projections
    o_bias: bool = False  # bias on the output projection
    qk_norm: bool = False  # RMSNorm(head_dim) on q and on k
    qk_norm_full: bool = False  # OLMo 2 / 3: an RMSNorm over the whole q (h d) and the whole k (g d) projection
    moe_router_bias: bool = True  # router score-correction bias in the checkpoint
    gated_mlp: bool = True  # SwiGLU-style 3-matrix MLP; False: 2 matrices (GPT-2 GELU, H -> I -> H)
    mlp_bias: bool = False  # biases on the MLP's linear layers (GPT-2: c_fc I, c_proj H)
    norm_bias: bool = False  # LayerNorm with a bias (2 vectors of H) instead of RMSNorm (1)
    position_embeddings: int = 0  # rows of a learned absolute position table (GPT-2: n_positions)
    activation: str = "silu"  # the MLP activation as the config names it
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate (H -> 1) on the shared expert's output
    expert_bias: bool = False  # GPT-OSS: biases on every expert's gate/up (2i) and down (H) projections
    router_weight_bias: bool = False  # GPT-OSS: a trained router bias (E), unlike DeepSeek's correction bias
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per attention head
    activation_clamp: float = 0.0  # GPT-OSS ``swiglu_limit``: the gated activation's inputs clamped (0: none)
    #: YaRN's attention factor (Megatron's "concentration factor" on RoPE's cos / sin; 1: none)
    rope_attention_factor: float = 1.0
    layer_windows: tuple[int, ...] | None = None  # per decoder layer: sliding-window size (0: full causal)
    norms_per_layer: int = 2  # norms in a decoder layer (Gemma 2: 4, a post-norm after attention and MLP too)
    #: per decoder layer: "attention" | "mamba" | "none" (a hybrid model's MoE / MLP block); None: all attention
    layer_mixers: tuple[str, ...] | None = None
    #: per decoder layer: chunked-attention chunk size (0: none; Llama 4's ``chunked_attention`` layers)
    layer_chunks: tuple[int, ...] | None = None
    #: the multimodal file (its ``model_type``: ``gemma3``, ``mistral3``, ``llama4``, ``qwen3_vl``, ``glm4v``
    #: ...: :data:`_MULTIMODAL_WRAPPERS`) whose language model this is; its vision encoder and projector are
    #: not counted
    multimodal: str | None = None
    mamba: MambaDims | None = None  # a hybrid model's Mamba-2 mixer sizes (app.core.model.hybrid)
    #: per decoder layer of an attention + FFN model: "attention" | "gdn" (a gated DeltaNet token mixer,
    #: :mod:`app.core.model.gated_delta_net`); None: all attention
    layer_attention: tuple[str, ...] | None = None
    gdn: GdnDims | None = None  # the gated DeltaNet's sizes (Qwen3-Next, Qwen3.5)
    #: Qwen3-Next / Qwen3.5: q_proj also makes a sigmoid gate on the attention output (h d more columns)
    attention_output_gate: bool = False
    #: LatentMoE: the routed experts work in this many dimensions between two projections (0: in H)
    moe_latent_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: the language model's own fields as the file gives them (a multimodal file's ``text_config``,
    #: GPT-2's names mapped): what a serving engine reads its maximum context from
    text_raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: how the checkpoint stores its weights (``quantization_config``, :func:`read_weight_format`):
    #: ``None`` unquantized, ``fp8``, or the ``quant_method`` of a format isplan's memory does not cover
    weight_format: str | None = None

    __hash__ = hash_once  # hashed once: a config is in most cache keys of an evaluation
    __getstate__ = state_without_hash

    @property
    def has_indexer(self) -> bool:
        """True when the model has a DSA lightning indexer (an ``index_*`` size > 0)."""
        return self.index_n_heads > 0 and self.index_head_dim > 0

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def checkpoint_weight_dtype(self) -> str | None:
        """The bytes a serving engine loads the weights in: ``bf16`` for an unquantized checkpoint
        (a float32 one is cast down by both engines' ``dtype=auto``), ``fp8`` for an FP8 one;
        ``None`` for a quantization the memory model does not cover (:attr:`weight_format`)."""
        return "bf16" if self.weight_format is None else "fp8" if self.weight_format == "fp8" else None

    @property
    def hybrid_pattern(self) -> str | None:
        """A hybrid model's layers as Megatron's symbols (``M`` Mamba, ``*`` attention, ``E`` MoE,
        ``-`` MLP: ``--hybrid-layer-pattern``); ``None`` for a model of attention + FFN layers."""
        if self.layer_mixers is None:
            return None
        ffn = self.mlp_layer_types or ("none",) * self.num_hidden_layers
        parts = {v: k for k, v in SYMBOL_PARTS.items()}
        return "".join(parts[(m, {"sparse": "moe"}.get(f, f))] for m, f in zip(self.layer_mixers, ffn))

    @property
    def mtp_stores_embedding_and_head(self) -> bool:
        """Whether the checkpoint's MTP module stores its own copy of the embedding and the output
        head: DeepSeek checkpoints do (``model.layers.61.embed_tokens`` and
        ``model.layers.61.shared_head.head``; published 671B main + 14B MTP = 685B, deepseek-ai
        DeepSeek-V3 README); GLM checkpoints do not (FACTS.md section 7)."""
        return (self.model_type or "").startswith("deepseek")

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "source": self.source,
            "model_type": self.model_type,
            "sha256": self.sha256,
            "canonical_sha256": self.canonical_sha256,
            "provenance": self.provenance,
            "upstream_repo": self.upstream_repo,
            "num_layers": self.num_hidden_layers,
            "mtp_layers": self.num_nextn_predict_layers,
            "has_indexer": self.has_indexer,
            "attention": self.attention,
            "moe": self.n_routed_experts > 0,
        }


# --------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    raise ConfigError(f"config.json contains {name}, which is not valid JSON; use a finite number")


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"config.json repeats the key {key!r}; keep one value", key)
        out[key] = value
    return out


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion on hostile input)."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def parse_json_bytes(data: bytes) -> dict[str, Any]:
    """Decode config bytes into a JSON object, refusing anything a config cannot be."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config.json is {len(data):,} bytes; the limit is {MAX_CONFIG_BYTES:,} bytes (1 MiB)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config.json is not UTF-8 text (byte {exc.start} is invalid)") from None
    # A cheap bound before the parser sees the text: brackets can only nest as deep as they occur.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _bracket_depth(text) > MAX_JSON_DEPTH:
        raise ConfigError(f"config.json nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        obj = json.loads(
            text, object_pairs_hook=_pairs_without_duplicates, parse_constant=_reject_constant
        )
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"config.json nests deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"config.json is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # e.g. an integer longer than Python's int-conversion limit
        raise ConfigError(f"config.json cannot be read: {str(exc)[:160]}") from None
    if not isinstance(obj, dict):
        raise ConfigError("config.json must be a JSON object ({...}) at the top level")
    if _depth(obj, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ConfigError(f"config.json nests deeper than {MAX_JSON_DEPTH} levels")
    return obj


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def canonical_digest(obj: Any) -> str:
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: JSON may spell lone surrogates ("\ud800"); the digest must still exist
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


def _int_field(raw: dict[str, Any], name: str, default: int | None, *, required: bool = False) -> int | None:
    if name not in raw or raw[name] is None:
        if required:
            raise ConfigError(f"config.json has no {name}; it is required", name)
        return default
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be an integer, got {json.dumps(value)[:40]}", name)
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{name} must be an integer, got {value}", name)
        value = int(value)
    if value < 0:
        raise ConfigError(f"{name} must not be negative, got {value}", name)
    if name in _POSITIVE and value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}", name)
    limit = _LIMITS.get(name)
    if limit is not None and value > limit:
        raise ConfigError(f"{name} = {value:,} is absurd for this model family (limit {limit:,})", name)
    return value


def _str_list(raw: dict[str, Any], name: str, allowed: tuple[str, ...], length: int) -> tuple[str, ...] | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} must be a list of strings from {list(allowed)}", name)
    if len(value) != length:
        raise ConfigError(
            f"{name} has {len(value)} entries but num_hidden_layers is {length}; "
            "it needs one entry per decoder layer",
            name,
        )
    bad = sorted({v for v in value if v not in allowed})
    if bad:
        first = next(i for i, v in enumerate(value) if v not in allowed)
        raise ConfigError(
            f"{name} may only contain {list(allowed)}; entry {first + 1} is {value[first]!r}"
            + (f" (other values: {bad[:5]})" if len(bad) > 1 else ""),
            name,
        )
    return tuple(value)


_NEEDED = (
    "model_type", "num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
    "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
    "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads",
    "index_head_dim", "index_topk", "index_topk_freq", "index_skip_topk_offset",
    "index_topk_pattern", "indexer_types", "mlp_layer_types", "num_nextn_predict_layers",
    "tie_word_embeddings", "max_position_embeddings", "num_key_value_heads", "head_dim",
    "num_experts", "num_local_experts", "decoder_sparse_step", "mlp_only_layers", "use_qk_norm",
    "attention_bias", "hidden_act", "hidden_activation", "qkv_bias", "shared_expert_intermediate_size",
    "sliding_window", "layer_types", "use_sliding_window", "max_window_layers",
)


_GPT2_EXTRA = ("n_layer", "n_embd", "n_head", "n_positions", "n_inner", "activation_function")


def _bool_field(raw: dict[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {json.dumps(value)[:40]}", name)
    return value


#: GPT-2 field names -> the planner's (``GPT2Config.attribute_map`` in transformers).
_GPT2_NAMES = (("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
               ("n_positions", "max_position_embeddings"))


def _gpt2_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    """A GPT-2 config read under the planner's field names: ``n_layer`` / ``n_embd`` / ``n_head`` /
    ``n_positions``, ``n_inner`` (``None`` = 4 x ``n_embd``, ``GPT2MLP``), embeddings tied unless
    the file says otherwise (``GPT2Config`` default ``tie_word_embeddings=True``)."""
    out = dict(raw)
    for gpt2, name in _GPT2_NAMES:
        if raw.get(gpt2) is None and raw.get(name) is None and name != "max_position_embeddings":
            raise ConfigError(f"config.json has no {gpt2}; a gpt2 config needs it", gpt2)
        if raw.get(gpt2) is not None:
            out[name] = raw[gpt2]
    hidden = _int_field(out, "hidden_size", None, required=True)
    out["intermediate_size"] = raw.get("n_inner") if raw.get("n_inner") is not None else 4 * (hidden or 0)
    out.setdefault("tie_word_embeddings", True)
    return out


#: ``NemotronHConfig``'s defaults for the sizes a ``nemotron_h`` file may omit (transformers
#: ``models/nemotron_h/configuration_nemotron_h.py``), and the older names it still reads
_NEMOTRON_H_DEFAULTS = {"head_dim": 128, "num_key_value_heads": 8, "intermediate_size": 21504,
                        "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
                        "num_experts_per_tok": 2, "n_routed_experts": 8, "mamba_num_heads": 128,
                        "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
                        "chunk_size": 128}
_NEMOTRON_H_OLD_NAMES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                         "mamba_chunk_size": "chunk_size", "mamba_conv_bias": "use_conv_bias"}


def _nemotron_h_blocks(raw: dict[str, Any]) -> str:
    """A ``nemotron_h`` file's layers as Megatron's symbols: ``layers_block_type`` (or its alias
    ``layer_types``), else the older ``hybrid_override_pattern`` string (``NemotronHConfig``)."""
    for name in ("layers_block_type", "layer_types"):
        blocks = raw.get(name)
        if blocks is None:
            continue
        if not isinstance(blocks, list) or not blocks or not all(isinstance(b, str) for b in blocks):
            raise ConfigError(f"{name} must be a non-empty list of mamba / attention / moe / mlp block names", name)
        try:
            return block_symbols(blocks)
        except KeyError as exc:
            raise ConfigError(f"{name} has an unknown block {exc.args[0]!r}; use linear_attention, "
                              "full_attention, moe or mlp", name) from None
    pattern = raw.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("a nemotron_h config needs layers_block_type (or hybrid_override_pattern): the kind of "
                          "every layer", "layers_block_type")
    bad = sorted(set(pattern) - set(SYMBOL_PARTS))
    if bad:
        raise ConfigError(f"hybrid_override_pattern may only contain M, *, E and -; found {bad[:5]}",
                          "hybrid_override_pattern")
    return pattern


def _nemotron_h_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``nemotron_h`` file in the planner's names: its layer count from its block list (a stated
    ``num_hidden_layers`` must agree), the sizes it omits at ``NemotronHConfig``'s defaults, the
    older Mamba names read as the new ones, and no experts when no layer is MoE."""
    symbols = _nemotron_h_blocks(raw)
    stated = _int_field(raw, "num_hidden_layers", None)
    if stated is not None and stated != len(symbols):
        raise ConfigError(f"num_hidden_layers is {stated} but the block list has {len(symbols)} layers; "
                          "make them agree", "num_hidden_layers")
    out = {**{new: raw[old] for old, new in _NEMOTRON_H_OLD_NAMES.items() if old in raw}, **raw}
    for name, value in _NEMOTRON_H_DEFAULTS.items():
        if out.get(name) is None:
            out[name] = value
    out.update(num_hidden_layers=len(symbols), hybrid_symbols=symbols)
    if "E" not in symbols:
        out["n_routed_experts"] = 0
    return out


def _nemotron_h_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H's blocks (transformers ``modeling_nemotron_h.py``): one RMSNorm and one module a
    layer (:mod:`app.core.model.hybrid`); q/k/v/o without biases (``bias=False``); MLPs and
    experts of two matrices (``up_proj`` / ``down_proj``, ``mlp_hidden_act`` squared ReLU, biases
    with ``mlp_bias``); a router with a score-correction bias and one shared expert of
    ``moe_shared_expert_intermediate_size``, kept as that many expert widths (as Qwen2-MoE's).
    LatentMoE (``moe_latent_size``, Nemotron 3 Super / Ultra): the routed experts work in that
    many dimensions between ``fc1_latent_proj`` (H -> L) and ``fc2_latent_proj`` (L -> H), the
    shared expert in H (``NemotronHMoE``). MTP layers (``num_nextn_predict_layers``) are read when
    each is an attention block and an MoE block (``mtp_layers_block_type``, default
    ``["full_attention", "moe"]``, or ``mtp_hybrid_override_pattern`` ``*E``) - the MTP layer isplan
    models; another MTP block list is refused naming the field."""
    symbols: str = raw["hybrid_symbols"]
    _hybrid_mtp_blocks(raw)
    names = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size")
    sizes = [_int_field(raw, f, None, required=True) or 0 for f in names]
    for name, size in zip(names, sizes):
        if size < 1:
            raise ConfigError(f"{name} must be at least 1, got {size}", name)
    mamba = MambaDims(heads=sizes[0], head_dim=sizes[1], state=sizes[2], groups=sizes[3], conv_kernel=sizes[4],
                      chunk=sizes[5], conv_bias=_bool_field(raw, "use_conv_bias", True),
                      proj_bias=_bool_field(raw, "use_bias", False))
    if mamba.heads % mamba.groups:
        raise ConfigError(f"mamba_num_heads ({mamba.heads}) must be a multiple of n_groups ({mamba.groups})",
                          "mamba_num_heads")
    mixers = tuple(SYMBOL_PARTS[c][0] for c in symbols)
    ffn = tuple({"moe": "sparse"}.get(SYMBOL_PARTS[c][1], SYMBOL_PARTS[c][1]) for c in symbols)
    out: dict[str, Any] = {"layer_mixers": mixers, "mlp_layer_types": ffn, "mamba": mamba if "M" in symbols else None,
                           "gated_mlp": False, "mlp_bias": _bool_field(raw, "mlp_bias", False),
                           "activation": _activation({"hidden_act": raw.get("mlp_hidden_act")}, default="relu2"),
                           "qkv_bias": False, "o_bias": False, "norms_per_layer": 1, "layer_windows": None,
                           "moe_router_bias": "E" in symbols,
                           "intermediate_size": _int_field(raw, "intermediate_size", 0) if "-" in symbols else 0}
    if "E" in symbols:
        width = _int_field(raw, "moe_intermediate_size", None, required=True) or 0
        shared = _int_field(raw, "moe_shared_expert_intermediate_size", 0) or 0
        out.update(n_routed_experts=_int_field(raw, "n_routed_experts", None, required=True),
                   num_experts_per_tok=_int_field(raw, "num_experts_per_tok", None, required=True),
                   moe_intermediate_size=width,
                   n_shared_experts=_shared_expert_widths(shared, width, "moe_shared_expert_intermediate_size"))
    else:
        out.update(n_routed_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, n_shared_experts=0)
    latent = _int_field(raw, "moe_latent_size", 0) or 0
    return {**out, "first_k_dense_replace": 0, "moe_layer_freq": 1, "moe_latent_size": latent if "E" in symbols else 0,
            "num_nextn_predict_layers": _int_field(raw, "num_nextn_predict_layers", 0)}


#: The MTP layer isplan models for a hybrid model: one attention block and one MoE block
#: (``NemotronHConfig.mtp_layers_block_type`` default; Megatron's ``/*E`` pattern parts)
HYBRID_MTP_BLOCKS = "*E"


def _hybrid_mtp_blocks(raw: dict[str, Any]) -> None:
    """Refuse an MTP block list other than :data:`HYBRID_MTP_BLOCKS` when the model has MTP layers."""
    if not raw.get("num_nextn_predict_layers"):
        return
    for name in ("mtp_layers_block_type", "mtp_hybrid_override_pattern"):
        value = raw.get(name)
        if value is None:
            continue
        try:
            blocks = block_symbols(value) if isinstance(value, list) else value
        except KeyError:
            blocks = None
        if blocks != HYBRID_MTP_BLOCKS:
            raise ConfigError(f"{name} {json.dumps(value)[:60]}: isplan models a hybrid MTP layer of one attention and "
                              "one MoE block (['full_attention', 'moe'], '*E') only", name)


def _gpt2_family(raw: dict[str, Any]) -> dict[str, Any]:
    """The GPT-2 block's shapes (``GPT2Attention``: one ``c_attn`` of 3H with bias, ``c_proj`` H
    with bias; ``GPT2MLP``: ``c_fc`` H -> I and ``c_proj`` I -> H, both with biases; LayerNorm
    ``ln_1`` / ``ln_2`` / ``ln_f`` with biases; ``wpe`` of ``n_positions`` x H)."""
    act = raw.get("activation_function", "gelu_new")
    if not isinstance(act, str):
        raise ConfigError("activation_function must be a string", "activation_function")
    positions = _int_field(raw, "max_position_embeddings", 1024)
    return {"gated_mlp": False, "mlp_bias": True, "norm_bias": True, "activation": act,
            "position_embeddings": positions, "qkv_bias": True, "o_bias": True, "qk_norm": False}


def _gqa_fields(raw: dict[str, Any], model_type: str, n: int, hidden: int, heads: int) -> dict[str, Any]:
    """The GQA family's fields in the planner's names (module docstring)."""
    kv = _int_field(raw, "num_key_value_heads", _KV_HEADS_DEFAULT.get(model_type, heads))
    assert kv is not None
    if heads % kv:
        raise ConfigError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})", "num_key_value_heads"
        )
    head_dim = _int_field(raw, "head_dim", _HEAD_DIM_DEFAULT.get(model_type))
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}); give head_dim", "head_dim"
            )
        head_dim = hidden // heads
    # GptOssConfig and Glm4Config: attention_bias=True by default
    bias = model_type not in _OWN_BIAS_TYPES and _bool_field(raw, "attention_bias", model_type in ("gpt_oss", "glm4"))
    out: dict[str, Any] = {
        "attention": "gqa", "num_key_value_heads": kv, "head_dim": head_dim,
        "qkv_bias": (True if model_type in ("qwen2", "mimo") else _bool_field(raw, "qkv_bias", True) if model_type == "qwen2_moe"
                     else bias),
        "o_bias": (bias if model_type in ("llama", "mistral", "qwen3", "qwen3_moe", "gpt_oss", "nemotron", "llama4",
                                          "llama4_text", "granite", "granitemoe", "granitemoeshared", "smollm3",
                                          "cohere", "cohere2", *_GEMMA_TYPES,
                                          *_FULL_QK_NORM_TYPES, *GDN_MODEL_TYPES)
                   else False),
        # LlamaMLP / GraniteMLP (SmolLM3's is Llama's): gate, up and down with ``bias=config.mlp_bias``
        "mlp_bias": model_type in ("llama", "granite", "smollm3") and _bool_field(raw, "mlp_bias", False),
        "qk_norm": model_type in ("qwen3", "qwen3_moe", "gemma3_text", "exaone4", *GDN_MODEL_TYPES) or (model_type == "glm4_moe"
                                                                           and _bool_field(raw, "use_qk_norm", False)),
        # CohereAttention's optional q / k LayerNorms are (heads, head_dim) weights: the whole projections' count
        "qk_norm_full": model_type in _FULL_QK_NORM_TYPES or (model_type == "cohere"
                                                             and _bool_field(raw, "use_qk_norm", False)),
        "moe_router_bias": model_type in _ROUTER_BIAS_TYPES,
        "attention_sinks": model_type == "gpt_oss",  # GptOssAttention.sinks: one logit per head
        # GptOssExperts clamps gate (above) and up (both sides) at swiglu_limit (GptOssConfig: 7.0)
        "activation_clamp": _positive_float(raw, "swiglu_limit", 7.0) if model_type == "gpt_oss" else 0.0,
        "rope_attention_factor": yarn_attention_factor(raw),
        "activation": _activation(raw),
        "norms_per_layer": 4 if model_type in _FOUR_NORM_TYPES else 2,
        "layer_windows": _layer_windows(raw, model_type, n),
    }
    if model_type in _TIED_BY_DEFAULT and raw.get("tie_word_embeddings") is None:
        out["tie_word_embeddings"] = True
    out.update(_gqa_ffn(raw, model_type, n))
    family = _FAMILY_BLOCKS.get(model_type)
    if family is not None:
        out.update(family(raw))
    return out


def _nemotron_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-4 / Minitron's block (transformers ``models/nemotron``: ``NemotronMLP`` is ``up_proj``
    H -> I and ``down_proj`` I -> H with ``mlp_bias``, squared ReLU between (``hidden_act`` default
    ``relu2``); ``NemotronLayerNorm1P`` is a LayerNorm with weight and bias, two a layer and a final
    one; ``NemotronConfig`` unties the embeddings by default)."""
    return {"gated_mlp": False, "mlp_bias": _bool_field(raw, "mlp_bias", False), "norm_bias": True,
            "activation": _activation(raw, default="relu2")}


def _ernie45_dense(raw: dict[str, Any]) -> dict[str, Any]:
    """ERNIE 4.5 dense (transformers ``models/ernie4_5/modular_ernie4_5.py``): ``Ernie4_5Attention`` and
    ``Ernie4_5MLP`` put ``bias=config.use_bias`` on every projection (the output layer has none)."""
    use_bias = _bool_field(raw, "use_bias", False)
    return {"qkv_bias": use_bias, "o_bias": use_bias, "mlp_bias": use_bias}


def _seed_oss_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Seed-OSS (transformers ``models/seed_oss``): q/k/v biases by ``attention_bias``, the output
    projection's by ``attention_out_bias``, the MLP's by ``mlp_bias`` (``SeedOssConfig``: true, false, false)."""
    return {"qkv_bias": _bool_field(raw, "attention_bias", True), "o_bias": _bool_field(raw, "attention_out_bias", False),
            "mlp_bias": _bool_field(raw, "mlp_bias", False)}


def _cohere_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Cohere / Cohere2 (transformers ``models/cohere``, ``models/cohere2``): one weight-only input
    LayerNorm a layer, before attention and the MLP, which run in parallel; ``Cohere2Config`` sets
    ``head_dim`` to H / h whatever the file says."""
    out: dict[str, Any] = {"norms_per_layer": 1}
    if raw.get("model_type") == "cohere2":
        hidden = _int_field(raw, "hidden_size", None, required=True)
        heads = _int_field(raw, "num_attention_heads", None, required=True)
        assert hidden is not None and heads is not None
        if hidden % heads:
            raise ConfigError(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})",
                              "num_attention_heads")
        out["head_dim"] = hidden // heads
    return out


def _starcoder2_family(raw: dict[str, Any]) -> dict[str, Any]:
    """StarCoder2's block (transformers ``models/starcoder2/modular_starcoder2.py``): Mistral's attention
    with ``bias=config.use_bias`` on q, k, v and o, ``Starcoder2MLP`` ``c_fc`` H -> I and ``c_proj`` I -> H
    with ``use_bias`` and ``gelu_pytorch_tanh`` between, LayerNorms with weight and bias (two a layer and
    a final one); ``Starcoder2Config`` defaults: ``use_bias`` true, 2 KV heads, tied."""
    use_bias = _bool_field(raw, "use_bias", True)
    return {"gated_mlp": False, "mlp_bias": use_bias, "qkv_bias": use_bias, "o_bias": use_bias, "norm_bias": True,
            "activation": _activation(raw, default="gelu_pytorch_tanh")}


def _gqa_ffn(raw: dict[str, Any], model_type: str, n: int) -> dict[str, Any]:
    """A GQA family's FFN fields in the planner's names: its experts (defaults where a field is
    omitted: the transformers config classes', e.g. MixtralConfig 8 experts, top-2, width 14336;
    Qwen3MoeConfig 128, top-8, 768; OlmoeConfig 64, top-8, 2048; MiniMaxM2Config 256, top-8, 1536;
    GptOssConfig 128, top-4, 2880), or none (dense families;
    GLM-4.5 reads the DeepSeek names)."""
    out: dict[str, Any] = {}
    if model_type in _EVERY_LAYER_MOE:
        out.update(_every_layer_experts(raw, model_type))
    elif model_type == "qwen3_moe":
        out.update(n_routed_experts=_int_field(raw, "num_experts", 128),
                   num_experts_per_tok=_int_field(raw, "num_experts_per_tok", 8),
                   moe_intermediate_size=_int_field(raw, "moe_intermediate_size", 768), n_shared_experts=0,
                   first_k_dense_replace=0, moe_layer_freq=1, num_nextn_predict_layers=0,
                   mlp_layer_types=_qwen3_moe_layer_types(raw, n))
    elif model_type == "qwen2_moe":
        out.update(_qwen2_moe_experts(raw, n))
    elif model_type == "ernie4_5_moe":
        out.update(_ernie45_moe(raw, n))
    elif model_type in ("llama4", "llama4_text"):
        out.update(_llama4_layers(raw, n))
    elif model_type not in ("glm4_moe", "nemotron_h", "bailing_moe_v2"):  # dense (Nemotron-H, Ling 2.0: their own)
        out.update(n_routed_experts=0, n_shared_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                   num_nextn_predict_layers=0)
    return out


def _llama4_layers(raw: dict[str, Any], n: int) -> dict[str, Any]:
    """Llama 4's text model's layers (transformers ``models/llama4``, ``Llama4TextConfig`` defaults where a
    field is omitted): MoE layers at ``moe_layers`` (default every ``interleave_moe_layer_step``-th,
    the last of each step) with ``num_local_experts`` routed experts of ``intermediate_size`` (gate
    and up fused, no bias), top-``num_experts_per_tok``, one shared expert of the same width and a
    router without a bias (``Llama4TextMoe``, ``Llama4Router``); the other layers a dense SwiGLU MLP
    of ``intermediate_size_mlp``; chunked attention (``attention_chunk_size``) on the layers
    ``layer_types`` marks ``chunked_attention`` - by default all but every
    ``no_rope_layer_interval``-th, whose NoPE attention sees every earlier token. The q / k L2 norm
    (``use_qk_norm``) has no weights."""
    step = _int_field(raw, "interleave_moe_layer_step", 1) or 1
    moe = raw.get("moe_layers")
    if moe is None:
        moe = list(range(step - 1, n, step))
    if not isinstance(moe, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in moe):
        raise ConfigError(f"moe_layers must be a list of 0-based layer indices below {n}", "moe_layers")
    chunk = _int_field(raw, "attention_chunk_size", 8192) or 0
    kinds = _str_list(raw, "layer_types", ("chunked_attention", "full_attention"), n)
    if kinds is None:
        interval = _int_field(raw, "no_rope_layer_interval", 4) or 4
        rope = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        if not isinstance(rope, list) or len(rope) != n or any(r not in (0, 1) for r in rope):
            raise ConfigError(f"no_rope_layers must be a list of {n} entries of 0 or 1 (one per decoder layer)",
                              "no_rope_layers")
        kinds = tuple("chunked_attention" if r else "full_attention" for r in rope)
    sparse = set(moe)
    width = _int_field(raw, "intermediate_size", 8192)
    return {"n_routed_experts": _int_field(raw, "num_local_experts", 16),
            "num_experts_per_tok": _int_field(raw, "num_experts_per_tok", 1), "moe_intermediate_size": width,
            "intermediate_size": _int_field(raw, "intermediate_size_mlp", 16384), "n_shared_experts": 1,
            "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_nextn_predict_layers": 0,
            "mlp_layer_types": tuple("sparse" if i in sparse else "dense" for i in range(n)),
            "layer_chunks": tuple(chunk if k == "chunked_attention" else 0 for k in kinds) if chunk else None}


def _llama4_text(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``llama4`` (``Llama4Config``) file's ``text_config``: the language model isplan plans; the
    vision encoder and projector are not counted."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError("a llama4 config needs text_config (the language model's fields)", "text_config")
    return {**text, "model_type": "llama4", "tie_word_embeddings": raw.get("tie_word_embeddings",
                                                                           text.get("tie_word_embeddings", False))}


#: ``Gemma3TextConfig``'s defaults for the fields isplan reads (transformers
#: ``models/gemma3/configuration_gemma3.py`` @ 008f5c8c): a Gemma 3 file omits what equals them (the
#: 27B's ``text_config`` has no ``vocab_size``), and transformers reads it with these.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 6,
}


def _gemma3_text(raw: dict[str, Any]) -> dict[str, Any]:
    """A Gemma 3 language model's fields over :data:`GEMMA3_TEXT_DEFAULTS`: a ``gemma3_text`` file's,
    or a multimodal ``gemma3`` file's ``text_config`` (``Gemma3Config``; the SigLIP vision tower and
    its projector are not counted)."""
    if raw.get("model_type") == "gemma3":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("a gemma3 config needs text_config (the language model's fields)", "text_config")
        raw = {**text, **({"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw
                          and "tie_word_embeddings" not in text else {})}
    return {**GEMMA3_TEXT_DEFAULTS, **raw, "model_type": "gemma3_text"}  # a value the file gives, null too, is kept


#: Multimodal files whose language model (``text_config``) is read when its ``model_type`` is one isplan
#: reads, with the type ``text_config`` has by default: ``Mistral3Config`` (transformers
#: ``models/mistral3/configuration_mistral3.py``: a ``mistral`` text model by default, Mistral Small 3.x;
#: Ministral 3 files name ``ministral3``, Mistral's decoder layer - ``models/ministral3/modular_ministral3.py``);
#: Qwen2-VL / Qwen2.5-VL / Qwen3-VL (``models/qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``); GLM-4.1V /
#: GLM-4.5V (``models/glm4v``, ``glm4v_moe``); Qwen3.5 / 3.6 (``models/qwen3_5``, ``qwen3_5_moe``); Kimi K2.5 / K2.6
#: (``KimiK25ForConditionalGeneration``, whose ``text_config`` is a ``kimi_k2`` or ``deepseek_v3`` model: Kimi K2's
#: language model, as Megatron-Bridge's ``kimi_vl/kimi_k25_vl_bridge.py`` @ 067f987d reads it). The vision tower
#: and projector are not counted.
_TEXT_WRAPPERS = {"mistral3": "mistral", "qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text",
                  "qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text", "glm4v": "glm4v_text",
                  "glm4v_moe": "glm4v_moe_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text",
                  "kimi_k25": "kimi_k2"}
#: A multimodal file's language-model type read as the text family whose modules it builds: (family, its
#: config class's defaults for the fields isplan reads - a file omits what equals them -, what the modules
#: fix whatever the file says). Qwen2-VL's and Qwen2.5-VL's text decoder is Qwen2's (q/k/v biases);
#: Qwen3-VL's ``Qwen3VLTextAttention`` is Qwen3's attention with its sliding window deleted
#: (``Qwen3VLTextConfig``: ``head_dim`` 128, 32 KV heads, untied), Qwen3-VL-MoE's experts Qwen3-MoE's
#: (``Qwen3VLMoeTextConfig``: 60 experts, top-4, 1408, 16 KV heads, tied); GLM-4.1V's ``Glm4vTextDecoderLayer``
#: is GLM-4's (four norms, fused gate/up) with q/k/v biases always and ``head_dim`` H / h; GLM-4.5V's
#: ``Glm4vMoeTextAttention`` is ``Glm4Attention`` (no QK-norm) on GLM-4.5's MoE, no MTP layers built
#: (``Glm4vMoeTextConfig``: ``Glm4MoeConfig``'s defaults with q/k/v biases and a 151,424 vocabulary)
_TEXT_FAMILIES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen2_vl_text": ("qwen2", {}, {}),
    "qwen2_5_vl_text": ("qwen2", {}, {}),
    "qwen3_vl_text": ("qwen3", {"head_dim": 128, "num_key_value_heads": 32, "tie_word_embeddings": False},
                      {"sliding_window": None}),
    "qwen3_vl_moe_text": ("qwen3_moe", {"num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                                        "moe_intermediate_size": 1408, "tie_word_embeddings": True},
                          {"sliding_window": None}),
    "glm4v_text": ("glm4", {}, {"attention_bias": True, "head_dim": None}),
    "glm4v_moe_text": ("glm4_moe", {"vocab_size": 151424, "attention_bias": True, "head_dim": 128,
                                    "num_key_value_heads": 8, "n_routed_experts": 128, "n_shared_experts": 1,
                                    "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                                    "first_k_dense_replace": 1}, {"use_qk_norm": False, "num_nextn_predict_layers": 0}),
}
#: wrappers that may carry the language model's fields at the top level instead of under ``text_config``
#: (``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` build ``text_config`` from them: the earlier files)
_FLAT_WRAPPERS = ("qwen2_vl", "qwen2_5_vl")
#: every multimodal file isplan reads the language model of (:attr:`ModelConfig.multimodal`)
_MULTIMODAL_WRAPPERS = ("gemma3", "llama4", *_TEXT_WRAPPERS)


def _wrapped_text(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model of a :data:`_TEXT_WRAPPERS` file: its ``text_config`` (the wrapper's
    ``tie_word_embeddings`` where the text config has none), refused naming ``text_config`` when it
    is missing or of a type isplan does not read."""
    text = raw.get("text_config")
    if text is None and raw["model_type"] in _FLAT_WRAPPERS and "num_hidden_layers" in raw:
        text = {k: v for k, v in raw.items() if k not in ("model_type", "vision_config")}
    if not isinstance(text, dict):
        raise ConfigError(f"a {raw['model_type']} config needs text_config (the language model's fields)",
                          "text_config")
    kind = text.get("model_type") or _TEXT_WRAPPERS[raw["model_type"]]
    if not isinstance(kind, str):
        raise ConfigError(f"text_config's model_type must be a string, got {json.dumps(kind)[:40]}", "text_config")
    family, defaults, fixed = _TEXT_FAMILIES.get(kind, (kind, {}, {}))
    if family not in KNOWN_MODEL_TYPES:
        raise ConfigError(f"the language model under text_config is model_type {str(kind)[:40]!r}, which isplan does "
                          f"not read (it reads {', '.join(KNOWN_MODEL_TYPES)})", "text_config")
    tie = {"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw else {}
    return {**defaults, **tie, **text, **fixed, "model_type": family}


def _positive_float(raw: dict[str, Any], name: str, default: float) -> float:
    """``raw[name]`` as a positive number (``default`` when omitted or null), refused naming the field."""
    value = raw.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number, got {json.dumps(value)[:40]}", name)
    return float(value)


def yarn_attention_factor(raw: dict[str, Any]) -> float:
    """The factor YaRN multiplies RoPE's cos and sin by (1 without YaRN): ``rope_scaling`` (transformers 4)
    or ``rope_parameters`` (5) of ``rope_type`` / ``type`` ``yarn`` with ``factor`` s > 1 gives
    ``0.1 ln s + 1``, or ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` when both are given - Megatron's
    ``_yarn_get_concentration_factor`` (``megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py``
    @ d98e8a64), which GPT-OSS's bridge feeds with neither (``yarn_mscale = None``: 1.3466 at s = 32)."""
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return 1.0
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1:
        return 1.0

    def mscale(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0

    pair = [scaling.get("mscale"), scaling.get("mscale_all_dim")]
    numbers = [float(v) for v in pair if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) == 2:
        return mscale(numbers[0]) / mscale(numbers[1])
    return mscale(1.0)


def _activation(raw: dict[str, Any], default: str = "silu") -> str:
    """The MLP activation as the config names it: ``hidden_activation`` (Gemma), else ``hidden_act``,
    else the family's default (SiLU; squared ReLU for Nemotron). Only named: every activation is an
    elementwise op of the same cost here."""
    for name in ("hidden_activation", "hidden_act"):
        value = raw.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a string", name)
            return value
    return default


#: the families whose every layer uses ``sliding_window`` unless ``layer_types`` says otherwise
#: (transformers ``MistralAttention`` / ``Phi3Attention`` / ``Ministral3Attention`` / ``Starcoder2Attention``
#: pass it to every layer)
_WINDOW_EVERY_LAYER = ("mistral", "phi3", "ministral3", "starcoder2")
#: the families that alternate sliding and full layers by default, sliding first (``Gemma2Config`` /
#: ``GptOssConfig``: ``"sliding_attention" if (i + 1) % 2 else "full_attention"``)
_WINDOW_ALTERNATE = ("gemma2", "gpt_oss")
#: the families with one full layer every ``sliding_window_pattern`` layers (default 6), the rest sliding:
#: ``Gemma3Attention.is_sliding = bool((layer_idx + 1) % config.sliding_window_pattern)`` (transformers
#: ``models/gemma3`` @ 008f5c8c; later ``Gemma3TextConfig`` writes the same as its default ``layer_types``;
#: ``Olmo3Config``, ``Exaone4Config`` and ``Cohere2Config`` default their ``layer_types`` by the same rule,
#: every 4th layer full)
_WINDOW_PATTERN = {"gemma3_text": 6, "olmo3": 4, "exaone4": 4, "cohere2": 4}
#: ``sliding_window`` when the file omits it, as the family's config class defaults it (``Olmo3Config``,
#: ``Exaone4Config``, ``Cohere2Config``: 4096)
_WINDOW_DEFAULT = {"olmo3": 4096, "exaone4": 4096, "cohere2": 4096}


def _layer_windows(raw: dict[str, Any], model_type: str, n: int) -> tuple[int, ...] | None:
    """Each decoder layer's attention window (0: full causal), or ``None`` when no layer has one:
    ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention``, else on the layers
    the family's config class puts it (:data:`_WINDOW_EVERY_LAYER`, :data:`_WINDOW_ALTERNATE`;
    Qwen2 / Qwen3 only with ``use_sliding_window``, from ``max_window_layers`` on)."""
    # a window the file gives (null too: none) wins over the family's default
    window = _int_field(raw, "sliding_window", None) if "sliding_window" in raw else _WINDOW_DEFAULT.get(model_type)
    if not window or model_type == "nemotron_h":  # NemotronHAttention reads no window; its layer_types are blocks
        return None
    if model_type == "smollm3" and not _bool_field(raw, "use_sliding_window", False):
        return None  # SmolLM3Attention applies a window only with use_sliding_window, whatever layer_types says
    types = raw.get("layer_types")
    if types is not None:
        kinds = _str_list(raw, "layer_types", ("sliding_attention", "full_attention"), n)
        assert kinds is not None
        sliding = [k == "sliding_attention" for k in kinds]
    elif model_type in _WINDOW_ALTERNATE:
        sliding = [bool((i + 1) % 2) for i in range(n)]
    elif model_type == "smollm3":
        sliding = _smollm3_nope_layers(raw, n)
    elif model_type == "exaone4" and isinstance(raw.get("sliding_window_pattern"), str):
        sliding = _local_global(raw["sliding_window_pattern"], n)
    elif model_type in _WINDOW_PATTERN:
        every = _int_field(raw, "sliding_window_pattern", _WINDOW_PATTERN[model_type]) or 1
        sliding = [bool((i + 1) % every) for i in range(n)]
    elif model_type in _WINDOW_EVERY_LAYER:
        sliding = [True] * n
    elif model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and _bool_field(raw, "use_sliding_window", False):
        start = _int_field(raw, "max_window_layers", n)
        sliding = [i >= (start or 0) for i in range(n)]
    else:
        return None
    return tuple(window if s else 0 for s in sliding) if any(sliding) else None


def _smollm3_nope_layers(raw: dict[str, Any], n: int) -> list[bool]:
    """SmolLM3's default sliding layers (transformers ``models/smollm3/modular_smollm3.py``,
    ``SmolLM3Config``'s ``layer_types``): its NoPE layers - ``no_rope_layers[i]`` 0, by default every
    ``no_rope_layer_interval``-th (4) layer."""
    rope = raw.get("no_rope_layers")
    if rope is None:
        every = _int_field(raw, "no_rope_layer_interval", 4) or 1
        return [(i + 1) % every == 0 for i in range(n)]
    if not isinstance(rope, list) or len(rope) < n or any(v not in (0, 1) or isinstance(v, float) for v in rope[:n]):
        raise ConfigError(f"no_rope_layers must list 0 or 1 for each of the {n} layers", "no_rope_layers")
    return [not rope[i] for i in range(n)]


def _local_global(pattern: str, n: int) -> list[bool]:
    """EXAONE 4's ``sliding_window_pattern`` string (``Exaone4Config``'s docstring, transformers
    ``models/exaone4``): ``L`` local (sliding), ``G`` global, repeated from layer 0; the final layer is
    global whatever the pattern says."""
    if not pattern or set(pattern) - {"L", "G"}:
        raise ConfigError(f"sliding_window_pattern must be an integer or a string of L and G, got "
                          f"{json.dumps(pattern)[:40]}", "sliding_window_pattern")
    return [pattern[i % len(pattern)] == "L" and i < n - 1 for i in range(n)]


def _qwen2_moe_experts(raw: dict[str, Any], n: int) -> dict[str, Any]:
    """Qwen2-MoE's sparse block (transformers ``Qwen2MoeSparseMoeBlock``): a router of ``num_experts``,
    the experts of ``moe_intermediate_size``, one shared expert of ``shared_expert_intermediate_size``
    and a shared-expert gate (``H -> 1``, ``shared_expert_gate``); layers as Qwen3-MoE's. The shared
    expert is kept as ``shared / moe`` experts of the expert width (one GEMM of the same shape), so
    its width must be a multiple of the expert width (Qwen1.5-MoE-A2.7B: 5632 = 4 x 1408,
    Qwen2-57B-A14B: 20480 = 8 x 2560). Omitted sizes take ``Qwen2MoeConfig``'s defaults."""
    width = _int_field(raw, "moe_intermediate_size", 1408)
    shared = _int_field(raw, "shared_expert_intermediate_size", 5632)
    assert width is not None and shared is not None
    return {"n_routed_experts": _int_field(raw, "num_experts", 60), "num_experts_per_tok": _int_field(raw, "num_experts_per_tok", 4),
            "moe_intermediate_size": width,
            "n_shared_experts": _shared_expert_widths(shared, width, "shared_expert_intermediate_size"),
            "shared_expert_gate": shared > 0,
            "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_nextn_predict_layers": 0,
            "mlp_layer_types": _qwen3_moe_layer_types(raw, n)}


def _ernie45_moe(raw: dict[str, Any], n: int) -> dict[str, Any]:
    """ERNIE 4.5's FFN (transformers ``models/ernie4_5_moe/modular_ernie4_5_moe.py``): layer ``i``
    (0-based) is sparse iff ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
    moe_layer_end_index`` (-1: the last layer), else a dense MLP of ``intermediate_size``; the sparse block
    is ``moe_num_experts`` experts of ``moe_intermediate_size`` (top ``moe_k``; ``num_experts`` /
    ``num_experts_per_tok`` are the config's aliases), a shared expert of ``moe_num_shared_experts``
    expert widths and a router with a score-correction bias (``moe_statics``); ``Ernie4_5_MoeConfig``'s
    defaults where omitted, tied embeddings among them. ``use_bias`` true also puts biases on the shared
    expert and the output layer, which isplan does not model: refused. Its MTP layers are built by
    neither transformers (``_keys_to_ignore_on_load_unexpected``) nor Megatron-Bridge
    (``models/ernie/ernie_45_bridge.py`` @ 067f987d: ``mtp_num_layers = None``)."""
    if _bool_field(raw, "use_bias", False):
        raise ConfigError("use_bias true also puts biases on the shared expert and the output layer, which isplan "
                          "does not model", "use_bias")

    def read(*names: str, default: int) -> int:
        return _int_of(raw, names, default)

    start, interval = read("moe_layer_start_index", default=1), read("moe_layer_interval", default=1)
    end = n - 1 if raw.get("moe_layer_end_index", -1) == -1 else read("moe_layer_end_index", default=n - 1)
    types = tuple("sparse" if (i + 1) % interval == 0 and start <= i <= end else "dense" for i in range(n))
    out = {"n_routed_experts": read("moe_num_experts", "num_experts", default=64),
           "num_experts_per_tok": read("moe_k", "num_experts_per_tok", default=6),
           "moe_intermediate_size": read("moe_intermediate_size", default=1536),
           "n_shared_experts": read("moe_num_shared_experts", default=2),
           "intermediate_size": read("intermediate_size", default=12288),
           "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_nextn_predict_layers": 0,
           "mlp_layer_types": None if all(t == "sparse" for t in types) else types}
    if raw.get("tie_word_embeddings") is None:
        out["tie_word_embeddings"] = True
    return out


def _bailing_moe_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Ling 2.0 (``BailingMoeV2Config`` / ``modeling_bailing_moe_v2.py``, which Megatron-Bridge bundles @
    067f987d from inclusionAI/Ling-mini-2.0): a fused ``query_key_value`` with ``use_qkv_bias``, a
    per-head QK-norm (``use_qk_norm``), the output projection ``dense`` with ``use_bias``; the first
    ``first_k_dense_replace`` layers a dense MLP of ``intermediate_size``, then ``num_experts`` experts of
    ``moe_intermediate_size`` (null: every layer dense), ``num_shared_experts`` shared expert widths, a
    router with ``expert_bias``; MTP layers (``num_nextn_predict_layers``) DeepSeek's shape sharing the
    embedding and head. The config class's defaults where omitted."""
    experts = None if "num_experts" in raw and raw["num_experts"] is None else _int_field(raw, "num_experts", 256)
    shared = _int_field(raw, "num_shared_experts", 1)
    return {"qkv_bias": _bool_field(raw, "use_qkv_bias", False), "o_bias": _bool_field(raw, "use_bias", False),
            "qk_norm": _bool_field(raw, "use_qk_norm", True),
            "n_routed_experts": experts or 0, "n_shared_experts": shared or 0,
            "num_experts_per_tok": _int_field(raw, "num_experts_per_tok", 8) if experts else 0,
            "moe_intermediate_size": _int_field(raw, "moe_intermediate_size", 512),
            "intermediate_size": _int_field(raw, "intermediate_size", 5120),
            "first_k_dense_replace": _int_field(raw, "first_k_dense_replace", 1) if experts else 0,
            "moe_layer_freq": 1}


#: The families whose every layer is an MoE of gated experts of ``intermediate_size``: the field(s) naming the
#: expert count (an ``attribute_map`` alias second) and the config class's (experts, top-k, width) defaults.
#: Mixtral (``MixtralConfig``); OLMoE (``OlmoeConfig``, ``modular_olmoe.py``) and MiniMax-M2
#: (``MiniMaxM2Config``), both aliasing ``num_experts`` and ``num_local_experts``; GPT-OSS (``GptOssConfig``,
#: with expert and trained router biases); Granite 3 MoE (``GraniteMoeConfig``, ``modular_granitemoe.py``:
#: ``input_linear`` E x 2I x H, ``output_linear`` E x H x I, a bias-free router), ``granitemoeshared``
#: adding ``GraniteMoeSharedMLP`` of ``shared_intermediate_size`` (default 0) as that many expert widths.
_EVERY_LAYER_MOE: dict[str, tuple[tuple[str, ...], int, int, int]] = {
    "mixtral": (("num_local_experts",), 8, 2, 14336),
    "olmoe": (("num_experts", "num_local_experts"), 64, 8, 2048),
    "minimax_m2": (("num_experts", "num_local_experts"), 256, 8, 1536),
    "gpt_oss": (("num_local_experts",), 128, 4, 2880),
    "granitemoe": (("num_local_experts",), 8, 2, 11008),
    "granitemoeshared": (("num_local_experts",), 8, 2, 11008),
}


def _int_of(raw: dict[str, Any], names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` the file gives (a field and its config class's aliases), else ``default``."""
    value = _int_field(raw, next((name for name in names if name in raw), names[0]), default)
    assert value is not None
    return value


def _every_layer_experts(raw: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The FFN of an :data:`_EVERY_LAYER_MOE` family: its experts on every layer, no dense layer, no MTP."""
    names, default_experts, default_top_k, default_width = _EVERY_LAYER_MOE[model_type]
    experts, top_k = _int_of(raw, names, default_experts), _int_of(raw, ("num_experts_per_tok",), default_top_k)
    width = _int_of(raw, ("intermediate_size",), default_width)
    shared = _int_of(raw, ("shared_intermediate_size",), 0) if model_type == "granitemoeshared" else 0
    widths = (_shared_expert_widths(shared, width, "shared_intermediate_size")
              if model_type in ("granitemoe", "granitemoeshared") else 0)
    out = {"n_routed_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": width,
           "intermediate_size": 0, "n_shared_experts": widths,
           "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_nextn_predict_layers": 0}
    if model_type == "gpt_oss":
        out.update(expert_bias=True, router_weight_bias=True)
    return out


def _shared_expert_widths(shared: int, width: int, name: str) -> int:
    """A shared expert of width ``shared`` (the field ``name``) as that many expert widths (isplan
    times it as that many experts, one GEMM of the same shape): refused, naming the field, unless
    it is a multiple of ``moe_intermediate_size`` (``width``)."""
    if width < 1 or shared % width:
        raise ConfigError(f"{name} ({shared}) must be a multiple of moe_intermediate_size ({width}): isplan times "
                          "the shared expert as that many experts", name)
    return shared // width


def _qwen3_moe_layer_types(raw: dict[str, Any], n: int) -> tuple[str, ...] | None:
    """Qwen3-MoE: layer ``i`` (0-based) is sparse iff ``i not in mlp_only_layers`` and
    ``(i + 1) % decoder_sparse_step == 0`` (transformers ``modeling_qwen3_moe.py``
    ``Qwen3MoeDecoderLayer``); ``None`` when every layer is sparse."""
    step = _int_field(raw, "decoder_sparse_step", 1)
    assert step is not None
    only = raw.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                                             for i in only):
        raise ConfigError(f"mlp_only_layers must be a list of 0-based layer indices below {n}", "mlp_only_layers")
    if step == 1 and not only:
        return None
    return tuple("dense" if i in only or (i + 1) % step else "sparse" for i in range(n))


#: Config fields that build what isplan does not model, each with what it builds. A config that sets
#: one is refused before its sizes are read: its parameters, FLOPs, memory and step time would all
#: miss it (an MLA-shaped config of one of these would otherwise load as a plain MLA model). Names as
#: Megatron-Bridge's bridges read them @ 067f987d: ``src/megatron/bridge/models/deepseek/
#: deepseek_v4_bridge.py`` (``hc_mult`` -> ``num_residual_streams``, ``compress_ratios``,
#: ``num_hash_layers``), ``models/qwen/qwen35_bridge.py`` (``linear_num_value_heads``),
#: ``models/kimi/kimi_k3_bridge.py`` (``linear_attn_config``).
UNMODELLED_FIELDS = {
    "hc_mult": "hyper-connections, several residual streams per layer (DeepSeek-V4)",
    "compress_ratios": "compressed sparse attention (DeepSeek-V4)",
    "num_hash_layers": "hash-routed MoE layers (DeepSeek-V4)",
    "linear_num_value_heads": ("gated DeltaNet linear-attention layers, read only in a Qwen3-Next or Qwen3.5 file "
                               f"(model_type {', '.join(GDN_MODEL_TYPES)})"),
    "linear_attn_config": "linear-attention layers (Kimi K3)",
}


def _builds(name: str, value: Any) -> bool:
    """Whether ``value`` of an :data:`UNMODELLED_FIELDS` field builds anything: absent, zero, empty
    or all zeros builds nothing, and ``hc_mult`` 1 is the plain single residual stream."""
    if isinstance(value, (list, tuple)):
        return any(value)
    if name == "hc_mult" and value == 1:
        return False
    return bool(value)


def _refuse_unmodelled(raw: dict[str, Any]) -> None:
    """Refuse a config that sets an :data:`UNMODELLED_FIELDS` field, naming it, and a multimodal
    wrapper whose language model's sizes are under ``text_config`` (pointing there)."""
    for name, what in UNMODELLED_FIELDS.items():
        if name == "linear_num_value_heads" and raw.get("model_type") in GDN_MODEL_TYPES:
            continue   # read by :func:`_gdn_family`
        if _builds(name, raw.get(name)):
            raise ConfigError(f"{name} builds {what}, which isplan does not model: its parameters, FLOPs, memory "
                              "and step time would all miss it, so this config is not read", name)
    if "num_hidden_layers" not in raw and isinstance(raw.get("text_config"), dict):
        raise ConfigError("num_hidden_layers is missing here, and the language model's sizes are under text_config "
                          "(a multimodal wrapper): use that object as the config", "text_config")


def _read_dimensions(raw: dict[str, Any]) -> dict[str, Any]:
    """``model_type`` (a string, or absent) and the four sizes every family needs: layers, hidden
    size, attention heads, vocabulary."""
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError("model_type must be a string", "model_type")
    return {
        "model_type": model_type,
        "num_hidden_layers": _int_field(raw, "num_hidden_layers", None, required=True),
        "hidden_size": _int_field(raw, "hidden_size", None, required=True),
        "num_attention_heads": _int_field(raw, "num_attention_heads", None, required=True),
        "vocab_size": _int_field(raw, "vocab_size", None, required=True),
    }


def _read_topk_pattern(raw: dict[str, Any], n: int) -> str | None:
    """``index_topk_pattern``: one ``F`` (full: computes its top-k) or ``S`` (shared) per decoder layer."""
    pattern = raw.get("index_topk_pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise ConfigError("index_topk_pattern must be a string of F and S", "index_topk_pattern")
    if len(pattern) != n:
        raise ConfigError(
            f"index_topk_pattern has {len(pattern)} characters but num_hidden_layers is {n}",
            "index_topk_pattern",
        )
    bad = sorted(set(pattern) - {"F", "S"})
    if bad:
        raise ConfigError(
            f"index_topk_pattern may only contain 'F' and 'S'; found {bad[:5]}", "index_topk_pattern"
        )
    return pattern


def _read_family(raw: dict[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
    """The attention family's fields: a known GQA type's (:func:`_gqa_fields`), else MLA, which
    needs the four MLA sizes (the first missing one is named)."""
    model_type = dims["model_type"]
    if model_type in GQA_MODEL_TYPES:
        if model_type == "glm4_moe":  # GLM-4.5 reads DeepSeek's MoE names, whose class defaults differ by version
            _require_moe_shape(raw, model_type)
        return _gqa_fields(raw, model_type, dims["num_hidden_layers"], dims["hidden_size"],
                           dims["num_attention_heads"])
    missing = [f for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
               if raw.get(f) is None]
    if missing:
        raise ConfigError(
            f"model_type {model_type!r} is not one isplan can read completely: it is not a known GQA family "
            f"({', '.join(GQA_MODEL_TYPES)}) and, as an MLA model, {missing[0]} is missing "
            f"(MLA types: {', '.join(MLA_MODEL_TYPES)})",
            missing[0] if model_type in MLA_MODEL_TYPES or model_type is None else "model_type",
        )
    _require_moe_shape(raw, model_type)
    return {"moe_router_bias": _router_bias(raw, model_type)}


#: Config classes with DeepSeek's MoE names whose routed-expert fields default to an MoE when a file
#: omits them (transformers ``DeepseekV3Config`` - also Kimi-K2's - 256 experts, ``DeepseekV32Config``,
#: ``GlmMoeDsaConfig``, ``DeepseekV2Config`` 64, ``Glm4MoeLiteConfig`` 64, ``Glm4MoeConfig`` 128): the
#: engines read such a file with its class's defaults, which differ by class and version.
_MOE_DEFAULT_CLASSES = (*MLA_MODEL_TYPES, "deepseek_v2", "glm4_moe_lite", "glm4_moe")
_MOE_FIELDS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")


def _require_moe_shape(raw: dict[str, Any], model_type: str | None) -> None:
    """A DeepSeek-named MoE shape (an MLA model's, GLM-4.5's) is read only when the file states it
    whole: its experts, experts per token and expert width, and which leading layers are dense
    (``first_k_dense_replace``, or ``mlp_layer_types``). A missing one is refused naming it, not read as
    0: the engines would take its config class's default (DeepSeek-V3's 256 experts and 3 dense layers,
    GLM-4.7-Flash's 64 and 1, DeepSeek-V2's 64 and 0), and 0 experts would count a 671B model as a
    dense 10B one. A file of another MLA type that states none of them is a dense MLA model."""
    given = [f for f in _MOE_FIELDS if raw.get(f) is not None]
    if not given and model_type not in _MOE_DEFAULT_CLASSES:
        return
    missing = [f for f in _MOE_FIELDS if raw.get(f) is None]
    if raw.get("first_k_dense_replace") is None and raw.get("mlp_layer_types") is None:
        missing.append("first_k_dense_replace")
    if missing:
        raise ConfigError(f"{missing[0]} is missing: an MoE config with DeepSeek's names must state "
                          f"{', '.join(_MOE_FIELDS)} and first_k_dense_replace (or mlp_layer_types); the engines "
                          "would read an omitted one as "
                          f"its config class's default{f' ({model_type})' if model_type else ''}, which isplan "
                          "does not guess", missing[0])


def _router_bias(raw: dict[str, Any], model_type: str | None) -> bool:
    """Whether an MLA model's checkpoint holds the router's score-correction bias
    (``e_score_correction_bias``): DeepSeek-V3's auxiliary-loss-free routing (``topk_method``
    ``noaux_tc``) and the types built on it; DeepSeek-V2's ``greedy`` / ``group_limited_greedy``
    routing has none (deepseek-ai DeepSeek-V2 ``modeling_deepseek.py`` ``MoEGate``)."""
    if model_type in _ROUTER_BIAS_TYPES:
        return True
    method = raw.get("topk_method")
    return method is None or method == "noaux_tc"


def read_weight_format(original: dict[str, Any], text: dict[str, Any]) -> str | None:
    """``quantization_config`` (the file's, else its language model's) as the weights' format, the
    way vLLM and SGLang load it: ``fp8`` for ``quant_method`` ``fp8`` (DeepSeek-V3 / Kimi-K2's block
    FP8), ``compressed-tensors`` whose every weight group is 8-bit ``float`` (GLM-4.5-FP8) and
    ``modelopt`` with ``quant_algo`` ``FP8``; another method is kept by name (AWQ, GPTQ, MXFP4,
    NVFP4 ...: a format the serving memory does not cover); ``None`` without one. Refuses a
    ``quantization_config`` that is not an object with a string ``quant_method``."""
    q = original.get("quantization_config", text.get("quantization_config"))
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    if not isinstance(method, str) or not method:
        raise ConfigError("quantization_config must be an object with a quant_method string, got "
                          f"{json.dumps(q)[:60]}", "quantization_config")
    groups = q.get("config_groups")
    weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
    nested = q.get("quantization")
    algo = q.get("quant_algo", nested.get("quant_algo") if isinstance(nested, dict) else None)
    fp8 = (method == "fp8"
           or (method == "compressed-tensors" and bool(weights)
               and all(isinstance(w, dict) and w.get("num_bits") == 8 and w.get("type") == "float" for w in weights))
           or (method == "modelopt" and str(algo).upper() == "FP8"))
    return "fp8" if fp8 else method


def _read_sharing_and_embeddings(raw: dict[str, Any]) -> dict[str, Any]:
    """IndexShare's ``index_topk_freq`` / ``index_skip_topk_offset``, ``tie_word_embeddings``
    (a boolean, default false), ``q_lora_rank`` and the MTP layer count."""
    freq = _int_field(raw, "index_topk_freq", None)
    offset = _int_field(raw, "index_skip_topk_offset", None)
    tie = raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError("tie_word_embeddings must be true or false", "tie_word_embeddings")
    return {"index_topk_freq": freq, "index_skip_topk_offset": offset, "tie_word_embeddings": tie,
            "q_lora_rank": _int_field(raw, "q_lora_rank", None),
            "num_nextn_predict_layers": _int_field(raw, "num_nextn_predict_layers", 0)}


def _read_ffn(raw: dict[str, Any]) -> dict[str, Any]:
    """The FFN sizes: leading dense layers, routed experts and experts per token (no more than the
    experts), dense and expert widths, shared experts, MoE layer frequency."""
    first_dense = _int_field(raw, "first_k_dense_replace", 0)
    experts = _int_field(raw, "n_routed_experts", 0)
    topk = _int_field(raw, "num_experts_per_tok", 0)
    if experts and topk and topk > experts:
        raise ConfigError(
            f"num_experts_per_tok ({topk}) exceeds n_routed_experts ({experts})", "num_experts_per_tok"
        )
    return {
        "intermediate_size": _int_field(raw, "intermediate_size", 0),
        "moe_intermediate_size": _int_field(raw, "moe_intermediate_size", 0),
        "n_routed_experts": experts,
        "n_shared_experts": _int_field(raw, "n_shared_experts", 0),
        "num_experts_per_tok": topk,
        "first_k_dense_replace": first_dense,
        "moe_layer_freq": _int_field(raw, "moe_layer_freq", 1),
    }


def _read_mla_and_indexer(raw: dict[str, Any], model_type: str | None) -> dict[str, Any]:
    """MLA's latent ranks and head dims (0 when absent), and the DSA indexer's sizes when the model
    has one (a DSA type, or ``index_n_heads`` given), defaulting to the transformers config
    classes' values when a DSA config omits them (GlmMoeDsaConfig: 32 heads x 128, top-k 2048;
    DeepseekV32Config: 64 heads x 128, top-k 2048)."""
    has_dsa = model_type in ("glm_moe_dsa", "deepseek_v32") or raw.get("index_n_heads") is not None
    dsa_defaults = _DSA_DEFAULTS.get(model_type or "", (0, 0, 0))
    out = {name: _int_field(raw, name, 0) for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                        "v_head_dim")}
    for name, default in zip(("index_n_heads", "index_head_dim", "index_topk"), dsa_defaults):
        out[name] = _int_field(raw, name, default) if has_dsa else 0
    return out


def _refuse_inconsistent(cfg: ModelConfig) -> ModelConfig:
    """What only the built config can tell: more experts per token than routed experts, and
    ``indexer_types`` on a model without an indexer."""
    if cfg.n_routed_experts and cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise ConfigError(
            f"num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds the {cfg.n_routed_experts} routed experts",
            "num_experts_per_tok",
        )
    if cfg.indexer_types is not None and not cfg.has_indexer:
        raise ConfigError(
            "indexer_types is set but the config has no indexer (index_n_heads / index_head_dim)",
            "indexer_types",
        )
    return cfg


def _mimo_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Xiaomi MiMo (``MiMoForCausalLM``, a ``Qwen2Config``): Qwen2's decoder (q/k/v biases, none on
    o_proj) and ``num_nextn_predict_layers`` MTP layers of DeepSeek's shape - token and hidden norms,
    ``input_proj`` ``2H -> H``, a Qwen2 decoder layer with its dense MLP, a final norm - which
    Megatron-Bridge builds as Megatron's MTP (``models/mimo/mimo_bridge.py`` @ 067f987d:
    ``mtp.layers.*.enorm`` / ``hnorm`` / ``eh_proj`` / ``final_layernorm``)."""
    return {"num_nextn_predict_layers": _int_field(raw, "num_nextn_predict_layers", 0)}


#: The config classes' defaults where a file omits a size (transformers ``Qwen3NextConfig``,
#: ``Qwen3_5MoeTextConfig``): experts, experts per token, expert width, shared expert width
_GDN_MOE_DEFAULTS = {"qwen3_next": (512, 10, 512, 512), "qwen3_5_moe_text": (256, 8, 512, 512)}
_GDN_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
               "linear_conv_kernel_dim")
_GDN_FIELD_DEFAULTS = (16, 32, 128, 128, 4)   # every one of the three config classes'
#: ``mamba_ssm_dtype``: the serving engine's recurrent-state element (vLLM reads it into ``mamba_ssm_cache_dtype``)
_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _gdn_layer_types(raw: dict[str, Any], n: int) -> tuple[str, ...]:
    """Each decoder layer's token mixer: ``layer_types`` (``linear_attention`` / ``full_attention``),
    else every ``full_attention_interval``-th layer full (default 4; ``Qwen3NextConfig.__post_init__``,
    Megatron's ``linear_attention_freq``)."""
    types = raw.get("layer_types")
    if types is not None:
        allowed = {"linear_attention": "gdn", "full_attention": "attention"}
        if not isinstance(types, list) or len(types) != n or not all(t in allowed for t in types):
            raise ConfigError(f"layer_types must list linear_attention or full_attention for each of the {n} "
                              "layers", "layer_types")
        return tuple(allowed[t] for t in types)
    every = _int_field(raw, "full_attention_interval", 4) or 0
    if every < 1:
        raise ConfigError(f"full_attention_interval must be at least 1, got {every}", "full_attention_interval")
    return tuple("gdn" if (i + 1) % every else "attention" for i in range(n))


def _gdn_family(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5 / 3.6's language models (transformers ``models/qwen3_next``,
    ``models/qwen3_5``, ``models/qwen3_5_moe``): gated attention (``q_proj`` makes h d queries and h d
    output gates unless the file says ``attn_output_gate: false``, as vLLM reads it - ``qwen3_next.py``
    ``Qwen3NextAttention``, default true; q/k RMSNorms of ``head_dim``; ``attention_bias`` on q, k, v, o) on the
    ``full_attention`` layers, a gated DeltaNet (:class:`GdnDims`) on the others; FFN: Qwen3-Next's
    experts on the layers Qwen3-MoE's rule makes sparse (``mlp_only_layers``, ``decoder_sparse_step``)
    and an MLP of ``intermediate_size`` on the rest, Qwen3.5-MoE's experts on every layer, Qwen3.5's
    MLP on every layer; the MoE blocks have one shared expert with a sigmoid gate
    (``Qwen3NextSparseMoeBlock``). MTP layers as Megatron-Bridge reads them
    (``num_nextn_predict_layers``, else ``mtp_num_hidden_layers``: ``auto_bridge.py``
    ``MTP_CONFIG_FIELDS`` @ 067f987d); the config classes' defaults where a size is omitted."""
    model_type, n = raw["model_type"], _int_field(raw, "num_hidden_layers", None, required=True) or 0
    sizes = [_int_field(raw, f, d) or 0 for f, d in zip(_GDN_FIELDS, _GDN_FIELD_DEFAULTS)]
    for name, size in zip(_GDN_FIELDS, sizes):
        if size < 1:
            raise ConfigError(f"{name} must be at least 1, got {size}", name)
    ssm_dtype = raw.get("mamba_ssm_dtype")
    if ssm_dtype is not None and ssm_dtype not in _STATE_DTYPE_BYTES:
        raise ConfigError(f"mamba_ssm_dtype must be one of {', '.join(_STATE_DTYPE_BYTES)}, got {str(ssm_dtype)[:40]!r}",
                          "mamba_ssm_dtype")
    gdn = GdnDims(key_heads=sizes[0], value_heads=sizes[1], key_head_dim=sizes[2], value_head_dim=sizes[3],
                  conv_kernel=sizes[4], state_element_bytes=_STATE_DTYPE_BYTES[ssm_dtype] if ssm_dtype else 2)
    if _bool_field(raw, "mtp_use_dedicated_embeddings", False):
        raise ConfigError("mtp_use_dedicated_embeddings gives the MTP layers their own embedding table, which isplan "
                          "does not count: its parameters and memory would miss it, so this config is not read",
                          "mtp_use_dedicated_embeddings")
    if gdn.value_heads % gdn.key_heads:   # Megatron's TransformerConfig asserts it; so does the HF module
        raise ConfigError(f"linear_num_value_heads ({gdn.value_heads}) must be a multiple of linear_num_key_heads "
                          f"({gdn.key_heads})", "linear_num_value_heads")
    out: dict[str, Any] = {"layer_attention": _gdn_layer_types(raw, n), "gdn": gdn,
                           "attention_output_gate": _bool_field(raw, "attn_output_gate", True),
                           "num_nextn_predict_layers": _int_of(raw, ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
                                                               0)}
    if model_type == "qwen3_5_text":
        return {**out, "intermediate_size": _int_field(raw, "intermediate_size", None, required=True),
                "n_routed_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0, "n_shared_experts": 0}
    experts, top_k, width, shared = _GDN_MOE_DEFAULTS[model_type]
    width = _int_of(raw, ("moe_intermediate_size",), width)
    shared = _int_of(raw, ("shared_expert_intermediate_size",), shared)
    layers = _qwen3_moe_layer_types(raw, n) if model_type == "qwen3_next" else None
    return {**out, "n_routed_experts": _int_of(raw, ("num_experts",), experts),
            "num_experts_per_tok": _int_of(raw, ("num_experts_per_tok",), top_k), "moe_intermediate_size": width,
            "n_shared_experts": _shared_expert_widths(shared, width, "shared_expert_intermediate_size"),
            "shared_expert_gate": shared > 0, "first_k_dense_replace": 0, "moe_layer_freq": 1,
            "mlp_layer_types": layers,
            "intermediate_size": _int_of(raw, ("intermediate_size",), 5632) if layers else 0}


#: the families whose block differs from the GQA decoder's defaults in :func:`_gqa_fields`: each one's reader
#: of what its own modules build (applied last, so it wins)
_FAMILY_BLOCKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "gpt2": _gpt2_family, "nemotron": _nemotron_family, "nemotron_h": _nemotron_h_family,
    "bailing_moe_v2": _bailing_moe_v2, "ernie4_5": _ernie45_dense, "seed_oss": _seed_oss_family,
    "starcoder2": _starcoder2_family, "cohere": _cohere_family, "cohere2": _cohere_family,
    **{t: _gdn_family for t in GDN_MODEL_TYPES}, "mimo": _mimo_family,
}


def config_from_dict(
    raw: dict[str, Any],
    *,
    data: bytes,
    id: str,
    source: str,
    provenance: str,
    upstream_repo: str | None = None,
    label: str | None = None,
) -> ModelConfig:
    """Validate a parsed config and build a :class:`ModelConfig`; ``data`` are the exact bytes.

    The fields are read group by group, each by its reader, in this order (so the first bad field
    named is always the same): a family's own spelling mapped (GPT-2's and Nemotron-H's names;
    Llama 4's, Gemma 3's and Mistral 3's language model out of a multimodal file), architecture isplan does not
    model refused (:func:`_refuse_unmodelled`), dimensions,
    top-k pattern, attention family, IndexShare / embeddings / MTP, FFN, MLA and indexer sizes,
    per-layer type lists, ``max_position_embeddings``; then the checks on the built config."""
    original = raw
    kind = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None  # else refused below, named
    multimodal = kind if kind in _MULTIMODAL_WRAPPERS else None
    if kind == "gpt2":
        raw = _gpt2_aliases(raw)
    elif kind == "nemotron_h":
        raw = _nemotron_h_aliases(raw)
    elif kind == "llama4":
        raw = _llama4_text(raw)
    elif kind in ("gemma3", "gemma3_text"):
        raw = _gemma3_text(raw)
    elif kind in _TEXT_WRAPPERS:
        raw = _wrapped_text(raw)
    _refuse_unmodelled(raw)
    dims = _read_dimensions(raw)
    n = dims["num_hidden_layers"]
    fields: dict[str, Any] = {
        "id": id,
        "source": source,
        "sha256": hashlib.sha256(data).hexdigest(),
        "canonical_sha256": canonical_digest(original),
        "provenance": provenance,
        "upstream_repo": upstream_repo,
        "label": label or id,
        **dims,
        "index_topk_pattern": _read_topk_pattern(raw, n),
    }
    family = _read_family(raw, dims)
    fields.update(_read_sharing_and_embeddings(raw))
    fields.update(_read_ffn(raw))
    fields.update(_read_mla_and_indexer(raw, dims["model_type"]))
    fields["indexer_types"] = _str_list(raw, "indexer_types", ("full", "shared"), n)
    fields["mlp_layer_types"] = _str_list(raw, "mlp_layer_types", ("dense", "sparse"), n)
    fields["max_position_embeddings"] = _int_field(raw, "max_position_embeddings", None)
    fields["extra"] = {k: v for k, v in original.items() if k not in _NEEDED and k not in _GPT2_EXTRA}
    fields["raw"] = original
    fields["text_raw"] = raw
    fields["weight_format"] = read_weight_format(original, raw)
    fields["multimodal"] = multimodal
    fields.update(family)
    return _refuse_inconsistent(ModelConfig(**fields))


def load_config_bytes(
    data: bytes, *, id: str | None = None, source: str = "upload", label: str | None = None
) -> ModelConfig:
    """Load a user's config from bytes (an upload or a file); its id defaults to ``sha256:<hex>``."""
    raw = parse_json_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return config_from_dict(
        raw,
        data=data,
        id=id or f"sha256:{digest}",
        source=source,
        provenance="user-supplied config.json",
        label=label,
    )


# --------------------------------------------------------------------------- presets


def _preset_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "presets"


@lru_cache(maxsize=1)
def load_manifest() -> tuple[str, tuple[Preset, ...]]:
    """The shipped presets' manifest (the default id and every preset, in order): read once per
    process, as the package's files do not change while it runs (a page answer asked five times)."""
    manifest = json.loads((_preset_dir() / "manifest.json").read_text("utf-8"))
    presets = tuple(Preset(**entry) for entry in manifest["presets"])
    return manifest["default"], presets


@lru_cache(maxsize=1)
def preset_ids() -> tuple[str, ...]:
    """The shipped presets' ids, in the manifest's order."""
    return tuple(p.id for p in load_manifest()[1])


DEFAULT_PRESET = "glm-5.2"


@lru_cache(maxsize=16)
def load_preset(preset_id: str) -> ModelConfig:
    """A shipped preset (cached: presets are immutable and ``ModelConfig`` is frozen)."""
    _, presets = load_manifest()
    for p in presets:
        if p.id == preset_id:
            data = (_preset_dir() / p.file).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest != p.sha256:
                raise ConfigError(
                    f"preset {p.id}: shipped file digest {digest} does not match the manifest "
                    f"({p.sha256}); the package is damaged"
                )
            raw = parse_json_bytes(data)
            return config_from_dict(
                raw,
                data=data,
                id=p.id,
                source="preset",
                provenance=p.provenance,
                upstream_repo=p.upstream_repo,
                label=p.label,
            )
    raise ConfigError(
        f"unknown model {preset_id!r}; use a preset ({', '.join(x.id for x in presets)}) "
        "or a path to a config.json",
        "model",
    )


def preset_named(spec: str) -> str | None:
    """The preset ``spec`` names in any case: its id (``Llama-3.1-405B``) or its upstream Hugging
    Face repository, whole or its last part (``meta-llama/Llama-3.1-405B``, ``Kimi-K2-Instruct``);
    ``None`` when it names none."""
    key = spec.strip().lower()
    for p in load_manifest()[1]:
        repo = p.upstream_repo.lower()
        if key in (p.id, repo, repo.rpartition("/")[2]):
            return p.id
    return None


def model_argument(spec: str) -> str:
    """A MODEL argument as the CLI keeps it: a preset id or an existing path as given (a local
    snapshot folder named like a model is the user's file, not the preset), else the preset it
    names (:func:`preset_named`), else unchanged (:func:`load_model` then says what it is not)."""
    try:
        if spec in preset_ids() or Path(spec).exists():
            return spec
    except (OSError, ValueError):   # a name no file can have (too long, a NUL): load_model says so
        return spec
    return preset_named(spec) or spec


def load_model(spec: str) -> ModelConfig:
    """Resolve a MODEL argument (:func:`model_argument`): a preset id, or a path to a ``config.json``
    (or its folder)."""
    ids = preset_ids()
    spec = model_argument(spec)
    if spec in ids:
        return load_preset(spec)
    path = Path(spec)
    try:
        if path.is_dir():
            path = path / "config.json"
        found = path.exists()
    except (OSError, ValueError):   # a name no file can have (too long, a NUL byte)
        found = False
    if not found:
        shown = repr(spec) if len(spec) <= 120 else f"{spec[:80]!r}... ({len(spec):,} characters)"
        raise ConfigError(
            f"MODEL {shown} is neither a preset ({', '.join(ids)}) nor an existing file", "model"
        )
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path} is {size:,} bytes; the limit is {MAX_CONFIG_BYTES:,} bytes (1 MiB)", "model"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "model") from None
    return load_config_bytes(data, id=str(path), source="path")
