"""The plan table: every setting of a plan, defined once, with one name.

A :class:`Plan` is a frozen dataclass whose fields carry their whole description in metadata
(:class:`Field`: type, bounds, default, CLI flag, the layout modes they apply in, help text, the
URL keys earlier versions used). **One name per setting**: the field's name is its URL key and its
CLI flag without the dashes (``tokens_per_gpu`` / ``--tokens-per-gpu``); short flags stay short
(``--tp`` / ``tp``). The names the engines themselves use (``--tensor-model-parallel-size``,
``VLLM_PP_LAYER_PARTITION`` ...) are each engine's vocabulary (``app.core.engines``), mapped onto
these fields.

Each field has one bound, checked by the parsers (:mod:`app.core.plan.query`,
:mod:`app.core.plan.cli`) before any work is done. Cross-field rules live in
:func:`plan_conflicts`, once.

The core stays free of pydantic so ``isplan check`` starts fast (docs/DESIGN.md).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any
from urllib.parse import quote_plus

from app.core.model.hardware import CATALOGUE, GENERATIONS
from app.core.model.parallelism import EXP_AVG_DTYPES, MAIN_GRADS_DTYPES, MAIN_PARAMS_DTYPES

# one upper bound per count, enforced before any work (issue 9): app/core/plan/bounds.py
from app.core.plan.bounds import MAX_CONTEXT as MAX_TOKENS
from app.core.plan.bounds import MAX_CP, MAX_EP, MAX_GPUS, MAX_LAYERS, MAX_MODEL_ID, MAX_PP, MAX_STAGES, MAX_TP, MAX_VPP
from app.core.plan.bounds import MAX_MTP_LAYERS as MAX_MTP
from app.core.plan.bounds import MAX_PLAN_PATTERN as MAX_PATTERN
from app.core.plan.bounds import MAX_PLAN_TEXT as MAX_TEXT

LAYOUT_MODES = ("flags", "split", "layout")
CONVERSION_MODES = ("none", "flags", "split")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
GPUS = (*CATALOGUE, "custom")  # the GPU catalogue (app/core/model/hardware.py) + a custom capacity
#: every engine isplan models; each has its module under ``app/core/engines/`` (the registry there
#: is built from this tuple and a test checks that they agree)
ENGINES = ("megatron", "slime", "hf", "vllm", "sglang", "maxtext")
KV_DTYPES = ("bf16", "fp8")
WEIGHT_DTYPES = ("bf16", "fp8")
#: GEMM precision (app/core/time/precision.py: the Megatron flags each one exports)
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
#: ``--recompute-modules``: every module Megatron's ``TransformerConfig.__post_init__`` allows
#: (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py:1945-1957 @ d98e8a64); the GatedDeltaNet /
#: GatedDeltaProduct / mHC ones belong to model families isplan does not load (the engine's rules say so)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                     "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")
#: ``--cp-comm-type`` (megatron/training/arguments.py:3221-3226 @ d98e8a64): Transformer Engine's attention
#: takes p2p, all_gather, a2a, a2a+p2p; Megatron's DSA attention normalises allgather / all_gather
#: (``dsa_layout.py:115-119``); slime's ``--allgather-cp`` is ``allgather``
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p", "all_gather")
#: ``--moe-token-dispatcher-type`` (Megatron-LM ``transformer_config.py`` @ d98e8a64)
MOE_DISPATCHERS = ("allgather", "alltoall", "flex")
#: ``--cuda-graph-impl`` (Megatron-LM ``transformer_config.py`` ``cuda_graph_impl`` @ d98e8a64)
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")


#: ``quote_plus`` of a query key or value, kept: a live page encodes the same few dozen texts (the
#: field names, ``4``, ``full``, a layout it has seen) in every answer's URLs. Bounded (LRU).
_quoted = lru_cache(maxsize=4096)(quote_plus)


def encode_query(pairs: Iterable[tuple[str, str]]) -> str:
    """``urllib.parse.urlencode(pairs)`` for text keys and values - the same string (``quote_plus``
    of each, ``=`` between, ``&`` between pairs) - with each text's quoting kept
    (:data:`_quoted`): the plan's query and the page's share URL are built on every answer."""
    return "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in pairs)


_WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: str.isdigit() also accepts superscripts


@dataclass(frozen=True)
class Field:
    """How one plan setting is typed, bounded and documented everywhere. ``url`` is the field's
    name (set when the table is built); ``aliases`` are URL keys of earlier versions, still read."""

    kind: str  # int | float | bool | choice | choices (a list of choices) | text | sizes
    cli: str | None  # isplan flag; None: positional (model) or derived (the layout modes)
    help: str
    group: str  # model | layout | parallel | memory | conversion | flops | serving | maxtext
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    max_len: int = 1000
    modes: tuple[str, ...] = ()  # layout modes the field applies in; () = all
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    url: str = ""
    #: the engine's flag takes one or more values (argparse ``nargs='+'``): a launcher's words after the
    #: flag, or the CLI's, are read as one comma list
    nargs: bool = False
    #: the neutral value is ``None`` ("not given"): the page offers a blank choice
    optional: bool = False
    #: what a blank optional field means, in words (the page's placeholder; "unset" when empty)
    default_text: str = ""

    def bounds_text(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.lo is not None and self.hi is not None:
            return f"{self.lo:.15g} to {self.hi:.15g}"
        return ""


def _f(kind: str, default: Any, cli: str | None, help: str, group: str, **kw: Any) -> Any:
    return field(default=default, metadata={"isplan": Field(kind, cli, help, group, optional=default is None, **kw)})


@dataclass(frozen=True)
class Plan:
    """One plan: the model and engine, its layout, parallelism and the memory/FLOPs settings."""

    # model ------------------------------------------------------------------------------
    model: str = _f("text", "glm-5.2", None, "a preset id or an uploaded config (sha256:...)", "model",
                    max_len=MAX_MODEL_ID)
    engine: str = _f("choice", "megatron", "--engine",
                     "the engine that builds the stages and derives full/shared roles (training: megatron, slime, "
                     "hf, maxtext; serving: vllm, sglang)", "model", choices=ENGINES)
    engine_version: str | None = _f("text", None, "--engine-version",
                                    "serving engine build date YYYY-MM-DD (default: latest); the partition rule "
                                    "and the shared-start behaviour follow it", "model", max_len=40, metavar="DATE")
    pattern: str | None = _f("text", None, "--pattern",
                             "what-if role override: F/S letters, periodic from layer 1 (FSSS) or one per layer",
                             "model", max_len=MAX_PATTERN, metavar="P")
    num_layers: int | None = _f("int", None, "--num-layers",
                                "decoder layers the job builds (must equal the config's num_hidden_layers)",
                                "model", lo=1, hi=MAX_LAYERS, metavar="N", aliases=("layers",))
    hidden_size: int | None = _f("int", None, "--hidden-size", "the job's hidden size (must equal the config's)",
                                 "model", lo=1, hi=1 << 20, metavar="N", aliases=("hidden",))
    num_attention_heads: int | None = _f("int", None, "--num-attention-heads",
                                         "the job's attention heads (must equal the config's)", "model", lo=1,
                                         hi=MAX_LAYERS, metavar="N", aliases=("heads",))
    num_experts: int | None = _f("int", None, "--num-experts", "the job's routed experts (must equal the config's)",
                                 "model", lo=1, hi=1 << 16, metavar="N", aliases=("experts",))
    moe_ffn_hidden_size: int | None = _f("int", None, "--moe-ffn-hidden-size",
                                         "the job's expert FFN width (must equal the config's)", "model", lo=1,
                                         hi=1 << 22, metavar="N", aliases=("moe_ffn",))
    # attention flags Megatron builds the model with (megatron/training/arguments.py @ d98e8a64), each
    # compared with the config when given (app/core/evaluate.py: SHAPE_FIELDS)
    group_query_attention: bool = _f("bool", False, "--group-query-attention",
                                     "the job builds grouped-query attention (Megatron reads --num-query-groups "
                                     "only with it)", "model")
    num_query_groups: int | None = _f("int", None, "--num-query-groups",
                                      "the job's key-value (query) groups with --group-query-attention (must equal "
                                      "the config's num_key_value_heads)", "model", lo=1, hi=1 << 16, metavar="N")
    multi_latent_attention: bool = _f("bool", False, "--multi-latent-attention",
                                      "the job builds multi-latent attention (the config must be an MLA model)",
                                      "model")
    q_lora_rank: int | None = _f("int", None, "--q-lora-rank", "MLA query LoRA rank (must equal the config's)",
                                 "model", lo=1, hi=1 << 20, metavar="N")
    kv_lora_rank: int | None = _f("int", None, "--kv-lora-rank", "MLA key-value LoRA rank (must equal the config's)",
                                  "model", lo=1, hi=1 << 20, metavar="N")
    qk_head_dim: int | None = _f("int", None, "--qk-head-dim",
                                 "MLA query-key head dim without RoPE (the config's qk_nope_head_dim)", "model",
                                 lo=1, hi=1 << 16, metavar="N")
    qk_pos_emb_head_dim: int | None = _f("int", None, "--qk-pos-emb-head-dim",
                                         "MLA RoPE head dim (the config's qk_rope_head_dim)", "model", lo=1,
                                         hi=1 << 16, metavar="N")
    v_head_dim: int | None = _f("int", None, "--v-head-dim", "MLA value head dim (the config's v_head_dim)", "model",
                                lo=1, hi=1 << 16, metavar="N")
    dsa_topk_freq: int | None = _f("int", None, "--dsa-topk-freq",
                                   "the engine's top-k frequency (default: the config's index_topk_freq)", "model",
                                   lo=1, hi=MAX_LAYERS, metavar="N", aliases=("dsa_freq",))
    dsa_skip_topk_offset: int | None = _f("int", None, "--dsa-skip-topk-offset",
                                          "the engine's skip offset (default: the config's index_skip_topk_offset)",
                                          "model", lo=0, hi=MAX_LAYERS, metavar="N", aliases=("dsa_offset",))
    # layout -----------------------------------------------------------------------------
    mode: str = _f("choice", "flags", None, "how the layout is described: flags, split or layout", "layout",
                   choices=LAYOUT_MODES)
    split: tuple[int, ...] | None = _f("sizes", None, "--split",
                                       "stage sizes, vp-major (virtual stage 0 of every rank first, then virtual "
                                       "stage 1, ...), e.g. 14,8,8,8,8,8,8,16; for vllm/sglang the engine's "
                                       "PP_LAYER_PARTITION", "layout", lo=0, hi=MAX_LAYERS, max_len=MAX_TEXT,
                                       modes=("split",), metavar="LIST")
    pp: int = _f("int", 1, "--pp", "pipeline-parallel size", "layout", lo=1, hi=MAX_PP)
    first: int | None = _f("int", None, "--first", "decoder layers on the first pipeline stage", "layout", lo=1,
                           hi=MAX_LAYERS, modes=("flags", "layout"), metavar="F")
    last: int | None = _f("int", None, "--last", "decoder layers on the last pipeline stage", "layout", lo=1,
                          hi=MAX_LAYERS, modes=("flags", "layout"), metavar="L")
    vpp: int | None = _f("int", None, "--vpp", "virtual stages per pipeline rank", "layout", lo=1, hi=MAX_VPP,
                         metavar="V")
    layers_per_vstage: int | None = _f("int", None, "--layers-per-vstage",
                                       "decoder layers per virtual stage (VPP follows)", "layout", lo=1,
                                       hi=MAX_LAYERS, modes=("flags", "layout"), metavar="K", aliases=("lpvs",))
    account_for_embedding: bool = _f("bool", False, "--account-for-embedding",
                                     "the embedding takes one layer slot on the first stage", "layout",
                                     modes=("flags", "layout"), aliases=("emb",))
    account_for_loss: bool = _f("bool", False, "--account-for-loss",
                                "the loss takes one layer slot on the last stage", "layout", modes=("flags", "layout"),
                                aliases=("loss",))
    layout: str | None = _f("text", None, "--layout", "Megatron layout string, e.g. 'Et*3|(tt|)*29,m|L'", "layout",
                            max_len=MAX_TEXT, modes=("layout",), metavar="STR")
    mtp_layers: int | None = _f("int", None, "--mtp-layers",
                                "MTP layers the job builds (none unless given: Megatron's and slime's default)",
                                "layout", lo=0, hi=MAX_MTP, metavar="M", aliases=("mtp",))
    no_overlap_p2p_communication: bool = _f("bool", False, "--no-overlap-p2p-communication",
                                            "turn off P2P overlap (then interleaving needs PP > 2)", "layout",
                                            aliases=("no_p2p_overlap",))
    # parallelism -----------------------------------------------------------------------
    parallel: bool = _f("bool", False, "--parallel",
                        "judge the GPU count, parallel constraints and memory too (implied by any parallel or "
                        "memory setting, and by a launcher)", "parallel")
    tp: int = _f("int", 1, "--tp", "tensor-parallel size", "parallel", lo=1, hi=MAX_TP)
    cp: int = _f("int", 1, "--cp", "context-parallel size", "parallel", lo=1, hi=MAX_CP)
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = _f(
        "sizes", None, "--hierarchical-context-parallel-sizes",
        "CP group sizes per level (a2a+p2p: the a2a size, then the p2p size); their product must be CP", "parallel",
        lo=1, hi=MAX_CP, max_len=200, metavar="LIST", nargs=True)
    ep: int = _f("int", 1, "--ep", "expert-parallel size", "parallel", lo=1, hi=MAX_EP)
    etp: int | None = _f("int", None, "--etp", "expert tensor-parallel size (default: TP)", "parallel", lo=1,
                         hi=MAX_TP)
    dp: int | None = _f("int", None, "--dp", "data-parallel size (or give --gpus)", "parallel", lo=1, hi=MAX_GPUS)
    gpus: int | None = _f("int", None, "--gpus", "the GPU budget; it must equal TP x CP x PP x DP", "parallel",
                          lo=1, hi=MAX_GPUS)
    sp: bool = _f("bool", False, "--sp", "sequence parallelism", "parallel")
    mbs: int = _f("int", 1, "--mbs", "micro-batch size", "parallel", lo=1, hi=1024)
    num_microbatches: int | None = _f("int", None, "--num-microbatches", "micro-batches per step per DP rank",
                                      "parallel", lo=1, hi=1 << 16, aliases=("mb",))
    global_batch: int | None = _f("int", None, "--global-batch", "global batch size (micro-batches follow)",
                                  "parallel", lo=1, hi=MAX_TOKENS, aliases=("gbs",))
    seq_length: int | None = _f("int", None, "--seq-length", "tokens per sample", "parallel", lo=1, hi=MAX_TOKENS,
                                aliases=("seq",))
    max_position_embeddings: int | None = _f("int", None, "--max-position-embeddings",
                                             "Megatron's position limit; it must be at least --seq-length", "parallel",
                                             lo=1, hi=MAX_TOKENS, metavar="N")
    tokens_per_gpu: int | None = _f("int", None, "--tokens-per-gpu",
                                    "tokens per GPU after the CP split (slime --max-tokens-per-gpu)", "parallel",
                                    lo=1, hi=MAX_TOKENS, aliases=("tpg",))
    # memory ----------------------------------------------------------------------------
    recompute: str = _f("choice", "none", "--recompute", "activation recompute granularity", "memory",
                        choices=RECOMPUTE)
    recompute_modules: tuple[str, ...] | None = _f("choices", None, "--recompute-modules",
                                                   "modules recomputed under --recompute selective (Megatron's "
                                                   "default: core_attn)", "memory", choices=RECOMPUTE_MODULES,
                                                   metavar="M", nargs=True)
    moe_grouped_gemm: bool = _f("bool", False, "--moe-grouped-gemm",
                                "grouped-GEMM experts (TEGroupedMLP); --recompute-modules moe_act needs it", "memory")
    recompute_method: str | None = _f("choice", None, "--recompute-method",
                                      "full recompute method (Megatron: required with full, refused with selective)",
                                      "memory", choices=RECOMPUTE_METHODS, aliases=("rmethod",))
    recompute_num_layers: int | None = _f("int", None, "--recompute-num-layers",
                                          "layers per recompute unit (Megatron: required with full, refused with "
                                          "selective)", "memory", lo=1, hi=MAX_LAYERS, aliases=("rnl",))
    distribute_saved_activations: bool = _f("bool", False, "--distribute-saved-activations",
                                            "split each full-recompute checkpoint over the TP group (needs TP > 1, "
                                            "no sequence parallelism)", "memory")
    optimizer_cpu_offload: bool = _f("bool", False, "--optimizer-cpu-offload",
                                     "optimizer states on the host (HybridDeviceOptimizer)", "memory",
                                     aliases=("offload",))
    overlap_cpu_optimizer_d2h_h2d: bool = _f("bool", False, "--overlap-cpu-optimizer-d2h-h2d",
                                             "overlap the offloaded optimizer's copies", "memory", aliases=("d2h",))
    use_precision_aware_optimizer: bool = _f("bool", False, "--use-precision-aware-optimizer",
                                             "precision-aware optimizer (needed with CPU offload)", "memory",
                                             aliases=("pao",))
    main_grads_dtype: str = _f("choice", "fp32", "--main-grads-dtype",
                               "main gradients' dtype (lower than fp32 needs the precision-aware optimizer)",
                               "memory", choices=MAIN_GRADS_DTYPES)
    main_params_dtype: str = _f("choice", "fp32", "--main-params-dtype",
                                "master weights' dtype (lower than fp32 needs the precision-aware optimizer)",
                                "memory", choices=MAIN_PARAMS_DTYPES)
    exp_avg_dtype: str = _f("choice", "fp32", "--exp-avg-dtype",
                            "Adam first moment's dtype (lower than fp32 needs the precision-aware optimizer)",
                            "memory", choices=EXP_AVG_DTYPES)
    exp_avg_sq_dtype: str = _f("choice", "fp32", "--exp-avg-sq-dtype",
                               "Adam second moment's dtype (lower than fp32 needs the precision-aware optimizer)",
                               "memory", choices=EXP_AVG_DTYPES)
    no_distributed_optimizer: bool = _f("bool", False, "--no-distributed-optimizer",
                                        "plain Adam states on every DP rank", "memory", aliases=("no_dist_opt",))
    gpu: str = _f("choice", "h100-80gb", "--gpu", "GPU preset", "memory", choices=GPUS)
    gpu_memory_gb: float | None = _f("float", None, "--gpu-memory-gb", "GPU capacity in GB for --gpu custom",
                                     "memory", lo=1, hi=10_000, aliases=("gpu_gb",))
    host_memory_gb: float = _f("float", 2048.0, "--host-memory-gb",
                               "host memory per node in GB (CPU optimizer offload lives there)", "memory", lo=1,
                               hi=1 << 20, aliases=("host_gb",))
    gpus_per_node: int = _f("int", 8, "--gpus-per-node", "GPUs per node (host memory is per node)", "memory",
                            lo=1, hi=1024, aliases=("gpn",))
    make_vocab_size_divisible_by: int = _f("int", 128, "--make-vocab-size-divisible-by",
                                           "Megatron pads the vocabulary to a multiple of this (times TP)", "memory",
                                           lo=1, hi=1 << 16, aliases=("vocab_div",))
    # time (issue 18: how fast the plan trains) ---------------------------------------------
    precision: str = _f("choice", "bf16", "--precision",
                        "GEMM precision (attention and the rest stay BF16): bf16, fp8 (current scaling), mxfp8, nvfp4",
                        "time", choices=PRECISIONS)
    tp_comm_overlap: bool = _f("bool", False, "--tp-comm-overlap", "overlap TP communication with the GEMMs "
                               "(Transformer Engine userbuffers)", "time")
    overlap_grad_reduce: bool = _f("bool", False, "--overlap-grad-reduce",
                                   "overlap the gradient reduce-scatter with backward", "time")
    overlap_param_gather: bool = _f("bool", False, "--overlap-param-gather",
                                    "overlap the parameter all-gather with forward", "time")
    overlap_moe_expert_parallel_comm: bool = _f(
        "bool", False, "--overlap-moe-expert-parallel-comm",
        "overlap the MoE all-to-all with another micro-batch's compute (Megatron's combined 1F1B; needs EP > 1, "
        "and VPP when PP > 1)", "time")
    moe_token_dispatcher_type: str | None = _f(
        "choice", None, "--moe-token-dispatcher-type",
        "how MoE tokens reach their experts: flex (DeepEP / HybridEP: a token crosses to a remote NVLink domain "
        "once), alltoall or allgather (NCCL: every expert copy crosses); not given: timed as flex, as "
        "Megatron-Bridge's recipes launch MoE (Megatron-LM's own default is allgather)", "time",
        choices=MOE_DISPATCHERS)
    cuda_graph_impl: str = _f("choice", "none", "--cuda-graph-impl",
                              "CUDA graphs: full_iteration replays the whole step (no host cost); local and "
                              "transformer_engine capture parts of it and are timed as eager", "time",
                              choices=CUDA_GRAPH_IMPLS)
    fp8_dot_product_attention: bool = _f("bool", False, "--fp8-dot-product-attention",
                                         "the attention core in FP8 (Megatron-Bridge's mixed-precision "
                                         "fp8_dot_product_attention; Megatron-LM has no flag for it; needs an FP8 or "
                                         "FP4 --precision)", "time")
    fp8_output_proj: bool = _f("bool", False, "--fp8-output-proj",
                               "the output layer in MXFP8 (needs --precision mxfp8)", "time")
    cp_comm_type: str = _f("choice", "p2p", "--cp-comm-type",
                           "context-parallel communication, one type for every layer or a comma list of one per "
                           "layer (DSA with CP > 1 needs allgather; a2a+p2p needs "
                           "--hierarchical-context-parallel-sizes)", "time",
                           choices=CP_COMM_TYPES, nargs=True)
    nvlink_domain: int | None = _f("int", None, "--nvlink-domain",
                                   "GPUs per NVLink domain (default: the GPU's system: 8, or 72 on NVL72)", "time",
                                   lo=1, hi=MAX_GPUS)
    network_gbps: float | None = _f("float", None, "--network-gbps",
                                    "network bandwidth per GPU in Gb/s (default: the GPU's system)", "time", lo=1,
                                    hi=100_000, metavar="GBIT_S")
    gpu_generation: str | None = _f("choice", None, "--gpu-generation",
                                    "the generation a --gpu custom is timed as (its achieved-efficiency constants)",
                                    "time", choices=GENERATIONS)
    bf16_tflops: float | None = _f("float", None, "--bf16-tflops",
                                   "dense BF16 tensor peak per GPU in TFLOP/s (default: the catalogue's; needed "
                                   "for --gpu custom)", "time", lo=1, hi=1_000_000, metavar="TFLOPS")
    fp8_tflops: float | None = _f("float", None, "--fp8-tflops",
                                  "dense FP8 tensor peak per GPU in TFLOP/s (default: the catalogue's; none for "
                                  "--gpu custom until given)", "time", lo=1, hi=1_000_000, metavar="TFLOPS")
    fp4_tflops: float | None = _f("float", None, "--fp4-tflops",
                                  "dense FP4 tensor peak per GPU in TFLOP/s (default: the catalogue's; none for "
                                  "--gpu custom until given)", "time", lo=1, hi=1_000_000, metavar="TFLOPS")
    hbm_tbps: float | None = _f("float", None, "--hbm-tbps",
                                "HBM bandwidth per GPU in TB/s (default: the catalogue's; needed for --gpu custom)",
                                "time", lo=0.01, hi=10_000, metavar="TB_S")
    nvlink_gbs: float | None = _f("float", None, "--nvlink-gbs",
                                  "NVLink (xGMI) bandwidth per GPU in GB/s, each direction (H100: 450; default: the "
                                  "catalogue's; needed for --gpu custom)", "time", lo=1, hi=1_000_000, metavar="GB_S")
    # FLOPs -----------------------------------------------------------------------------
    context: int | None = _f("int", None, "--context",
                             "context length (tokens per sequence): per-token FLOPs and the serving KV cache "
                             "(default: the model's maximum - max_position_embeddings; a serving engine derives "
                             "it by its own rule, rope scaling included)", "flops",
                             lo=1024, hi=MAX_TOKENS, aliases=("ctx",), default_text="model's maximum")
    # conversion (a second layout slot, e.g. slime's checkpoint conversion) ---------------
    conv: str = _f("choice", "none", None, "conversion layout: none, flags or split", "conversion",
                   choices=CONVERSION_MODES)
    conv_split: tuple[int, ...] | None = _f("sizes", None, "--conv-split",
                                            "conversion stage sizes (the checkpoint conversion's own pipeline split)",
                                            "conversion", lo=0, hi=MAX_LAYERS, max_len=MAX_TEXT, metavar="LIST")
    conv_pp: int | None = _f("int", None, "--conv-pp", "conversion pipeline-parallel size", "conversion", lo=1,
                             hi=MAX_PP, metavar="N")
    conv_first: int | None = _f("int", None, "--conv-first", "conversion first-stage layers", "conversion", lo=1,
                                hi=MAX_LAYERS, metavar="F")
    conv_last: int | None = _f("int", None, "--conv-last", "conversion last-stage layers", "conversion", lo=1,
                               hi=MAX_LAYERS, metavar="L")
    # serving (vllm, sglang): the partition is ``split`` (the engine's PP_LAYER_PARTITION) --------
    concurrency: int = _f("int", 1, "--concurrency", "sequences served at once (KV cache), by each data-parallel "
                          "rank where the server has several", "serving", lo=1, hi=1 << 16)
    kv_dtype: str = _f("choice", "bf16", "--kv-dtype",
                       "KV cache dtype (fp8: the engine's FP8 cache, vLLM's fp8_ds_mla layout for MLA)", "serving",
                       choices=KV_DTYPES)
    weight_dtype: str | None = _f("choice", None, "--weight-dtype",
                                 "the weights' dtype in GPU memory (default: the checkpoint's - fp8 for an FP8 "
                                 "quantization_config, else bf16; fp8 of a BF16 checkpoint is the engine's "
                                 "--quantization fp8)", "serving", choices=WEIGHT_DTYPES,
                                 default_text="the checkpoint's")
    gpu_memory_utilization: float | None = _f("float", None, "--gpu-memory-utilization",
                                              "the fraction of each GPU the server takes for weights and KV cache "
                                              "(vLLM --gpu-memory-utilization, SGLang --mem-fraction-static; default "
                                              "0.9)", "serving", lo=0.05, hi=1, default_text="0.9")
    enable_dp_attention: bool = _f("bool", False, "--enable-dp-attention",
                            "SGLang's data-parallel attention (--enable-dp-attention): the dp ranks split the "
                            "attention inside the TP ranks (attention TP = TP / DP, the embedding whole on each GPU, "
                            "each rank its own sequences); the GPUs stay TP x PP", "serving")
    allow_long_context: bool = _f("bool", False, "--allow-long-context",
                                  "serve a context above the model's maximum: the engine's override variable "
                                  "(vLLM VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLang "
                                  "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1); without it the engine refuses to "
                                  "start", "serving")
    # MaxText pipeline (src/maxtext/configs/types.py keys) -----------------------------------
    ici_pipeline_parallelism: int = _f("int", 1, "--ici-pipeline-parallelism", "MaxText ici_pipeline_parallelism",
                                       "maxtext", lo=1, hi=MAX_PP, aliases=("ici_pp",))
    dcn_pipeline_parallelism: int = _f("int", 1, "--dcn-pipeline-parallelism", "MaxText dcn_pipeline_parallelism",
                                       "maxtext", lo=1, hi=MAX_PP, aliases=("dcn_pp",))
    layers_per_pipeline_stage: int = _f("int", 1, "--layers-per-pipeline-stage",
                                        "MaxText num_layers_per_pipeline_stage", "maxtext", lo=1, hi=MAX_LAYERS,
                                        aliases=("lps",))
    num_pipeline_repeats: int | None = _f("int", None, "--num-pipeline-repeats",
                                          "MaxText num_pipeline_repeats (default: derived)", "maxtext", lo=1,
                                          hi=MAX_LAYERS, aliases=("repeats",))
    pipeline_parallel_layers: int | None = _f("int", None, "--pipeline-parallel-layers",
                                              "MaxText pipeline_parallel_layers (default: the MoE layers)", "maxtext",
                                              lo=1, hi=MAX_LAYERS, aliases=("pipeline_layers",))

    def __post_init__(self) -> None:
        # one rule: a plan with any parallel or memory setting states its parallelism
        if not self.parallel and _implied_parallel(self):
            object.__setattr__(self, "parallel", True)

    # ------------------------------------------------------------------------- adapters
    def query(self, **overrides: Any) -> str:
        """The canonical query string (neutral defaults left out; ``model`` always present)."""
        plan = replace(self, **overrides) if overrides else self
        return encode_query(plan.query_pairs())

    def query_pairs(self) -> list[tuple[str, str]]:
        """``(URL key, text)`` of every setting :meth:`query` holds, in the plan table's order:
        what ``parse_qsl`` reads back from it."""
        derived = {"mode": derived_mode(self.layout, self.split),
                   "conv": derived_conv(self.conv_split, self.conv_pp), "parallel": _implied_parallel(self)}
        out: list[tuple[str, str]] = []
        for name, spec in TABLE.items():
            value = getattr(self, name)
            if name in derived:
                if value == derived[name]:
                    continue
            elif name != "model" and value == NEUTRAL_VALUES[name]:
                continue
            if value is None:
                continue
            out.append((name, format_value(spec, value)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v) for name, v in
                ((n, getattr(self, n)) for n in TABLE)}

    def cli_args(self, *, model: str | None = None) -> list[str]:
        """``isplan check`` arguments that rebuild this plan (the model first: ``model`` replaces
        the plan's id where the CLI reads the config from a path)."""
        args = [model or self.model]
        implied = _implied_parallel(self)
        for name, spec in TABLE.items():
            value = getattr(self, name)
            if spec.cli is None or value == NEUTRAL_VALUES[name] or value is None:
                continue
            if name == "parallel" and implied:  # another parallel/memory flag says it
                continue
            if not applies(spec, self.mode):
                continue
            text = format_value(spec, value)
            if spec.kind == "bool":
                args.append(spec.cli)
            elif spec.kind == "choices" or spec.nargs:   # one word per value, as the engine's flag takes them
                args += [spec.cli, *text.split(",")]
            elif text.startswith("-"):  # argparse would read it as an option
                args.append(f"{spec.cli}={text}")
            else:
                args += [spec.cli, text]
        return args

    def cli_command(self, command: str = "check", *, model: str | None = None) -> str:
        """The shell-safe ``isplan <command>`` line that rebuilds this plan (every value quoted)."""
        return shlex.join(["isplan", command, *self.cli_args(model=model)])

    @property
    def states_layout(self) -> bool:
        """Whether the plan describes a pipeline layout beyond the neutral single stage."""
        return self.split is not None or self.layout is not None or self.pp != 1

    @property
    def given_parallelism(self) -> bool:
        """**The one rule of what is judged**: memory, the GPU count and the parallel constraints join
        the verdict exactly when the plan states its parallelism - a launcher, ``--parallel`` /
        ``parallel=1``, or any parallel/memory setting given (even at its neutral value)."""
        return self.parallel


TABLE: dict[str, Field] = {f.name: replace(f.metadata["isplan"], url=f.name) for f in fields(Plan)}
#: every field's neutral value: what an absent URL key or CLI flag means
NEUTRAL_VALUES: dict[str, Any] = {f.name: f.default for f in fields(Plan)}
#: every URL key a plan is read from (the name, then each earlier alias) -> the field
BY_URL: dict[str, str] = {**{alias: name for name, spec in TABLE.items() for alias in spec.aliases},
                          **{name: name for name in TABLE}}

_PARALLEL_GROUPS = ("parallel", "memory", "time")


def _implied_parallel(plan: Plan) -> bool:
    """Any parallel or memory setting other than ``parallel`` itself differs from the neutral plan."""
    return any(getattr(plan, n) != NEUTRAL_VALUES[n] for n, s in TABLE.items()
               if s.group in _PARALLEL_GROUPS and n != "parallel")


def states_parallelism(given: Iterable[str]) -> bool:
    """Whether any of the given fields (by name) is a parallel or memory setting: giving one, even
    at its neutral value (``--tp 1``, ``gpu=h100-80gb``), states the plan's parallelism."""
    return any(TABLE[n].group in _PARALLEL_GROUPS for n in given)


def derived_mode(layout: str | None, split: tuple[int, ...] | None) -> str:
    """The layout mode a URL or command line without ``mode`` means: a layout string, else stage
    sizes, else Megatron flags."""
    return "layout" if layout else "split" if split is not None else "flags"


def derived_conv(conv_split: tuple[int, ...] | None, conv_pp: int | None) -> str:
    return "split" if conv_split is not None else "flags" if conv_pp is not None else "none"


def applies(spec: Field, mode: str) -> bool:
    return not spec.modes or mode in spec.modes


def format_value(spec: Field, value: Any) -> str:
    if spec.kind == "bool":
        return "1" if value else "0"
    if spec.kind in ("sizes", "choices"):
        return ",".join(map(str, value))
    if spec.kind == "float":
        return f"{value:.15g}"
    return str(value)


# ----------------------------------------------------------------------------- values
@dataclass(frozen=True)
class FieldProblem:
    """A value that cannot be used: the field (its URL key), and a message naming the fix."""

    field: str
    message: str


class PlanError(ValueError):
    """Strict parsing failed; ``problems`` lists every field at fault (the first is the message)."""

    def __init__(self, problems: Sequence[FieldProblem]):
        super().__init__(problems[0].message)
        self.problems = tuple(problems)
        self.field = problems[0].field


def label(spec: Field) -> str:
    return spec.cli or spec.url


def parse_value(spec: Field, raw: object) -> Any:
    """One value from text (URL, CLI) or JSON (receipts), bounded before any work; ValueError names it."""
    name = label(spec)
    if spec.nargs and isinstance(raw, (list, tuple)):   # the words of a nargs='+' flag: one comma list
        raw = ",".join(str(p).strip() for p in raw)
    if spec.kind == "choice" and spec.nargs:
        return _one_choice(spec, str(raw), name)
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text not in ("0", "1", "true", "false", "on", "off"):
            raise ValueError(f"{name} must be 1 or 0, got {str(raw)[:40]!r}")
        return text in ("1", "true", "on")
    if spec.kind == "choice":
        if raw not in spec.choices:
            raise ValueError(f"{name} must be one of {', '.join(spec.choices)}, got {str(raw)[:40]!r}")
        return raw
    if spec.kind == "choices":   # a comma list (URL) or a list (CLI nargs, JSON)
        parts = [str(p).strip() for p in raw] if isinstance(raw, (list, tuple)) else str(raw).split(",")
        parts = [p for p in (x.strip() for x in parts) if p]
        bad = [p for p in parts if p not in spec.choices]
        if not parts or bad or len(parts) > len(spec.choices):
            raise ValueError(f"{name} takes one or more of {', '.join(spec.choices)}, got {str(raw)[:60]!r}")
        return tuple(dict.fromkeys(parts))
    if spec.kind == "text":
        text = str(raw)
        if len(text) > spec.max_len:
            raise ValueError(f"{name} is {len(text):,} characters; the limit is {spec.max_len:,}")
        return text
    if spec.kind == "sizes":
        return parse_sizes(raw, name, hi=int(spec.hi or MAX_LAYERS))
    if spec.kind == "float":
        try:
            number = float(str(raw))
        except ValueError:
            raise ValueError(f"{name} must be a number, got {str(raw)[:40]!r}") from None
        if not (spec.lo is not None and spec.hi is not None and spec.lo <= number <= spec.hi):
            raise ValueError(f"{name} must be between {spec.lo:.15g} and {spec.hi:.15g}, got {str(raw)[:40]}")
        return number
    return parse_int(raw, name, int(spec.lo or 0), int(spec.hi or 0))


def _one_choice(spec: Field, raw: str, name: str) -> str:
    """A choice a flag may give per layer (``--cp-comm-type p2p p2p a2a ...``): one entry is that value
    for every layer; more stay the per-layer list, comma-joined (layer 1 first), as Megatron keeps a
    list of more than one (``megatron/training/argument_utils.py:343-344``)."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    bad = [p for p in parts if p not in spec.choices]
    if not parts or bad:
        raise ValueError(f"{name} takes one of {', '.join(spec.choices)}, or one per layer; got {raw[:40]!r}")
    if len(parts) > MAX_LAYERS:
        raise ValueError(f"{name} gives {len(parts):,} per-layer values; the limit is {MAX_LAYERS:,}")
    return ",".join(parts)


def parse_int(raw: object, label: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool):
        raise ValueError(f"{label} must be a whole number, got {raw!r}")
    text = str(raw).strip() if not isinstance(raw, int) else str(raw)
    if not _WHOLE.fullmatch(text) or len(text) > 12:
        raise ValueError(f"{label} must be a whole number, got {text[:40]!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise ValueError(f"{label} must be between {lo:,} and {hi:,}, got {value:,}")
    return value


def parse_sizes(raw: object, label: str = "--split", hi: int = MAX_LAYERS) -> tuple[int, ...]:
    """``14,8,8,8,8,8,8,16`` (or a JSON list) -> stage sizes, each 0..``hi``, at most MAX_STAGES."""
    if isinstance(raw, (list, tuple)):
        parts = [str(p) for p in raw]
    else:
        text = str(raw)
        if not text.strip():
            raise ValueError(f"{label} is empty; give stage sizes such as 14,8,8,8,8,8,8,16")
        if len(text) > MAX_TEXT:
            raise ValueError(f"{label} is {len(text):,} characters; the limit is {MAX_TEXT:,}")
        parts = text.split(",")
    if len(parts) > MAX_STAGES:
        raise ValueError(f"{label} has {len(parts):,} entries; the limit is {MAX_STAGES:,} stages")
    out = []
    for k, part in enumerate(parts, start=1):
        p = part.strip()
        if not _WHOLE.fullmatch(p) or len(p) > 9:
            raise ValueError(f"{label} entry {k} is {p[:20]!r}; every stage size must be a whole number")
        value = int(p)
        if not 0 <= value <= hi:
            raise ValueError(f"{label} entry {k} is {value:,}; a stage holds 0 to {hi:,} layers")
        out.append(value)
    return tuple(out)


def parse_values(given: Mapping[str, object], *, label_of: Any = None) -> tuple[dict[str, Any], list[FieldProblem]]:
    """Each given field (by name) parsed and bounded; a blank value is unset. Every problem names
    the field by its URL key."""
    values: dict[str, Any] = {}
    problems: list[FieldProblem] = []
    for name, raw in given.items():
        spec = TABLE[name]
        if raw is None or str(raw).strip() == "":
            continue
        try:
            values[name] = parse_value(spec, raw)
        except ValueError as exc:
            problems.append(FieldProblem(name, str(exc) if label_of is None else label_of(spec, exc)))
    return values, problems


def build_plan(values: dict[str, Any]) -> Plan:
    """The plan of parsed ``values``: the layout and conversion modes follow what was given
    unless stated, and any parallel/memory setting given states the plan's parallelism."""
    values = dict(values)
    values.setdefault("mode", derived_mode(values.get("layout"), values.get("split")))
    values.setdefault("conv", derived_conv(values.get("conv_split"), values.get("conv_pp")))
    if states_parallelism(values):
        values["parallel"] = True
    return Plan(**values)


# ----------------------------------------------------------------------------- cross-field rules
_MODE_WORDS = {"flags": "Megatron flags", "split": "stage sizes (--split)", "layout": "a layout string (--layout)"}


def engine_conflicts(plan: Plan, ignored: Iterable[str]) -> list[FieldProblem]:
    """A problem for every setting the plan's engine does not read (``ignored``) that the plan sets:
    the API and the CLI refuse it (exit 2 / 422), so the page may not judge the plan as if the
    setting were absent (it shows the same problem: one verdict for every URL, issue 16)."""
    return [FieldProblem(name, f"{label(TABLE[name])} does not apply to engine {plan.engine}; drop it")
            for name in ignored if getattr(plan, name) != NEUTRAL_VALUES[name]]


def plan_conflicts(plan: Plan, *, strict: bool, ignored: Iterable[str] = ()) -> list[FieldProblem]:
    """Cross-field rules: the layout description in use must be complete, the world TP x CP x PP x
    DP is bounded, and settings that do not apply are named.

    ``ignored``: fields the plan's engine does not read (``app.core.engines``); one the plan sets is
    a problem everywhere (:func:`engine_conflicts`). ``strict`` (the CLI, the API): a setting that
    does not apply to the layout mode is an error too; otherwise (the page, whose form keeps every
    mode's values) it is kept in the URL and explained, never silently used.
    """
    out: list[FieldProblem] = []
    if plan.mode == "split" and plan.split is None:
        out.append(FieldProblem("split", "mode=split needs split=LIST of stage sizes, e.g. 14,8,8,8,8,8,8,16"))
    if plan.mode == "layout" and not plan.layout:
        out.append(FieldProblem("layout", "mode=layout needs layout=STR, e.g. Et*3|(tt|)*29,m|L"))
    if plan.mode == "split" and plan.split and len(plan.split) > MAX_PP * (plan.vpp or 1):
        out.append(FieldProblem("split", f"--split has {len(plan.split):,} stages: PP would be over its limit of "
                                         f"{MAX_PP} (with VPP {plan.vpp or 1}); give PP x VPP stage sizes"))
    # the world is bounded too (each factor has its own bound, their product did not: host memory is
    # evaluated per node, so tp=8&cp=1024&dp=1048576 ran for minutes); a split implies its PP
    pp = max(plan.pp, len(plan.split) // (plan.vpp or 1)) if plan.mode == "split" and plan.split else plan.pp
    world = plan.tp * plan.cp * pp * (plan.dp or 1)
    if world > MAX_GPUS:
        out.append(FieldProblem("dp", f"TP x CP x PP x DP = {plan.tp} x {plan.cp} x {pp} x {plan.dp or 1} = "
                                      f"{world:,} GPUs; the limit is {MAX_GPUS:,} GPUs - lower dp (or tp, cp, pp)"))
    out += engine_conflicts(plan, ignored)
    if strict:
        for name in ignored_fields(plan):
            out.append(FieldProblem(name, f"{label(TABLE[name])} does not apply when the layout is given by "
                                          f"{_MODE_WORDS[plan.mode]}; drop it"))
        stray = [n for n in ("conv_pp", "conv_first", "conv_last") if getattr(plan, n) is not None]
        if plan.conv == "none" and stray:
            out.append(FieldProblem(stray[0], f"{TABLE[stray[0]].cli} needs --conv-pp N (the conversion pipeline "
                                              "size)"))
        elif plan.conv == "split" and stray:
            out.append(FieldProblem(stray[0], f"{TABLE[stray[0]].cli} does not apply with --conv-split; drop one "
                                              "of them"))
    if plan.conv == "split" and plan.conv_split is None:
        out.append(FieldProblem("conv_split", "conv=split needs conv_split=LIST of conversion stage sizes"))
    if plan.conv == "flags" and plan.conv_pp is None:
        out.append(FieldProblem("conv_pp", "conv=flags needs conv_pp=N (the conversion pipeline size)"))
    return out


def ignored_fields(plan: Plan) -> list[str]:
    """Fields set to a non-neutral value that the plan's layout mode does not use."""
    return [name for name, spec in TABLE.items()
            if not applies(spec, plan.mode) and getattr(plan, name) != NEUTRAL_VALUES[name]]


def mode_note(plan: Plan) -> str | None:
    """Words for the page: which given settings the current layout mode does not use."""
    names = ignored_fields(plan)
    if not names:
        return None
    return f"{', '.join(names)} not used: the layout is given by {_MODE_WORDS[plan.mode]}"
