"""vLLM: how it splits decoder layers over pipeline ranks, and what a shared start does.

Read from vllm-project/vllm (never copied; re-implemented from the rule):

* ``vllm/distributed/utils.py: get_pp_indices`` at commit 5a6541db9bfa77756459722f69e8c89a0b47a14d:
  ``VLLM_PP_LAYER_PARTITION="a,b,..."`` (read through ``vllm/envs.py``) overrides everything; each
  entry goes through ``int()`` ("Invalid partition string: ..." otherwise), the list must have
  ``pp_size`` entries (``len(partitions)=... does not match pp_size=...``) and sum to the decoder
  layers (``sum(partitions)=... does not match num_hidden_layers=...``). Without it, every rank gets
  ``b = L // P`` and the ``r = L % P`` remaining layers go to ranks ``P-2, P-3, ..., P-1-r``
  (``partitions[-i] += 1`` for ``i`` in ``2 .. r+1``): the last rank never gets an extra layer.
  The docstring there still describes an older "middle partitions" idea; the code is the rule.
* That rule arrived with vllm-project/vllm PR #13839 "Improve pipeline partitioning" (reviewed
  2025-02-25/26; the merge date is taken from the thread, not from a commit). Before it
  (vLLM v0.6.x, e.g. v0.6.4.post1, which sgl-project/sglang copied into
  ``python/sglang/srt/distributed/utils.py``) the last rank took all ``r`` extra layers.
  PR #46217 (open on 2026-06-20) would move the extras to the last ranks; it is not modelled.
* ``vllm/model_executor/models/deepseek_v2.py`` at commit 002d6073aa034d4f5545d45021b0e56d1f3c3593:
  a layer skips its indexer iff ``index_topk_pattern[i] == "S"`` when the pattern is given, else
  iff ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (defaults freq 1,
  offset 2). ``indexer_types`` is **not read**. MTP layers (``layer_id >= num_hidden_layers``)
  always build their own indexer. The top-k buffer is ``torch.empty(max_num_batched_tokens,
  index_topk, int32)`` created per model instance, i.e. per pipeline rank, and only
  ``hidden_states`` / ``residual`` cross ranks (``make_empty_intermediate_tensors_factory``): a
  rank that starts on a shared layer reads a buffer nothing on that rank wrote in this forward
  pass. No error is raised; attention silently uses wrong positions.
* Placement: embedding on the first rank, final norm and lm_head on the last
  (``get_pp_group().is_first_rank`` / ``is_last_rank``); the speculative drafter (MTP) is built only
  on the last rank (``vllm/v1/worker/gpu_model_runner.py``, per PR #53575's description). MTP
  under PP > 1 is still being fixed upstream (issues #49355 and #52069, PR #46994): this planner
  places it on the last rank and says so.
"""

from __future__ import annotations

import json
from datetime import date
from typing import Any, ClassVar

from app.core.engines.base import LaunchSyntax, MaxContext
from app.core.engines.rules import RuleChange, ShareBehaviour
from app.core.engines.serving import (
    SERVING_FIELDS,
    ServingEngine,
    config_number,
    config_options,
    rope_entries,
    stated_flags,
)
from app.core.model.config import ModelConfig
from app.core.plan import Plan
from app.core.verdict import Reason

ENGINE = "vllm"
ENV_VAR = "VLLM_PP_LAYER_PARTITION"
TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
SOURCE = "vllm-project/vllm vllm/distributed/utils.py:get_pp_indices @ 5a6541db9bfa"
MODEL_SOURCE = "vllm-project/vllm vllm/model_executor/models/deepseek_v2.py @ 002d6073aa03"
ROLE_RULE = (
    "vLLM reads index_topk_pattern, else index_topk_freq / index_skip_topk_offset (defaults 1 / 2); "
    "it never reads indexer_types"
)
READS_INDEXER_TYPES = False

PARTITION_RULES: tuple[RuleChange, ...] = (
    RuleChange(date.min, "every rank gets L // P layers and the last rank also takes the L % P extra ones",
               "vLLM v0.6.x get_pp_indices (v0.6.4.post1, as copied by sgl-project/sglang)"),
    RuleChange(date(2025, 2, 26), "every rank gets L // P; the L % P extra layers go one each to ranks "
               "P-2, P-3, ... (never the last rank)", f"vllm-project/vllm PR #13839; {SOURCE}"),
)

SHARE_BEHAVIOUR = ShareBehaviour(
    "silent_wrong",
    True,
    "vLLM passes only hidden_states and residual between pipeline ranks; the top-k buffer is "
    "rank-local, so a rank that starts on a shared layer reads top-k indices nothing wrote in "
    "this pass: silently wrong attention, no error. Choose a partition where every rank starts on "
    f"a full layer (set {ENV_VAR})",
    MODEL_SOURCE,
)


def default_partition(num_layers: int, pp: int, build: date | None = None) -> list[int]:
    """Layers per pipeline rank when ``VLLM_PP_LAYER_PARTITION`` is unset (see module docstring)."""
    base, extra = divmod(num_layers, pp)
    sizes = [base] * pp
    rule = PARTITION_RULES[-1] if build is None or build >= PARTITION_RULES[-1].since else PARTITION_RULES[0]
    if rule is PARTITION_RULES[0]:
        sizes[-1] += extra
        return sizes
    for rank in range(pp - 1 - extra, pp - 1):
        sizes[rank] += 1
    return sizes


def share_behaviour(build: date | None = None) -> ShareBehaviour:
    """The same at every build this planner knows: IndexShare never crossed vLLM ranks."""
    return SHARE_BEHAVIOUR


#: ``--max-model-len``: the longest sequence a server takes, whose KV cache must fit (the plan's ``context``)
CONTEXT_FLAG = "--max-model-len"
KV_DTYPE_FLAG = "--kv-cache-dtype"
#: ``--quantization fp8`` loads a BF16 checkpoint's weights quantized to FP8 (the plan's ``weight_dtype``);
#: another method is not a plan setting (a launcher warning)
QUANTIZATION_FLAG = "--quantization"
#: expert parallelism: vLLM has no size of its own - ``--enable-expert-parallel`` makes it TP x DP
#: (``vllm/config/parallel.py``), so the plan's ``ep`` is 1 or TP x DP (``parallel_reasons``)
EP_SWITCH = "--enable-expert-parallel"
#: data-parallel ranks of one server (the plan's ``dp``): each holds the whole model over TP x PP, its
#: own requests and KV cache; with expert parallelism the experts are spread over TP x DP
DP_FLAG = "--data-parallel-size"
#: speculative decoding (``vllm/config/speculative.py``): a JSON object whose ``method`` names the draft.
#: Its ``MTPModelTypes`` - ``mtp`` and one ``<model>_mtp`` per model family, a list that grows with
#: every release - draft with the checkpoint's own MTP layers (the plan's ``mtp_layers``); any other
#: method (``eagle``, ``eagle3``, ``ngram``, ``draft_model`` ...) runs a draft the memory model does not hold
SPECULATIVE_FLAG = "--speculative-config"
#: the share of each GPU the server takes for weights and KV cache (the plan's ``gpu_memory_utilization``)
MEMORY_FRACTION_FLAG = "--gpu-memory-utilization"
#: ``--kv-cache-dtype`` values (``vllm/config/cache.py`` ``CacheDType`` @ c1d86421) -> the plan's
#: ``kv_dtype``; ``auto`` is the model's dtype - except for DeepSeek-V3.2-style (DSA) models, which
#: that file says "default to fp8" - so it is read as the plan's default and said (a warning)
KV_CACHE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_ds_mla": "fp8"}
#: settings no plan field carries: (flag, takes a value, what the memory verdict assumes)
UNREAD_FLAGS = (
    ("--max-num-batched-tokens", True, "8192 tokens per batch for the top-k buffer"),
    ("--cpu-offload-gb", True, "no weights offloaded to the host"),
    ("--kv-cache-memory-bytes", True, "the KV cache sized by --gpu-memory-utilization"),
    # expert-parallel load balancing's redundant experts (arg_utils @ 99d7eb5d: --eplb-config's
    # num_redundant_experts, default 0, and the deprecated --num-redundant-experts) add expert copies
    # over the EP ranks: more expert weights a GPU (--enable-eplb alone adds none)
    *((flag, True, "no redundant experts (EPLB's copies add expert weights on every EP rank): a lower bound")
      for flag in ("--eplb-config", "--num-redundant-experts")),
    # context parallelism (arg_utils @ 99d7eb5d: -dcp; later builds -pcp) spreads a sequence's cached
    # tokens over the ranks of the TP group; how DSA's indexer cache follows is not read here
    *((flag, True, "the KV and indexer caches of every token on each TP rank (not 1/DCP of them): an upper bound")
      for flag in ("--decode-context-parallel-size", "-dcp")),
    *((flag, True, "the KV and indexer caches of every token on each TP rank (not 1/PCP of them): an upper bound")
      for flag in ("--prefill-context-parallel-size", "-pcp")),
)


def serve_args(model: str, tp: int, pp: int, *, context: int | None = None, kv_dtype: str | None = None,
               indexer: bool = False, quantization: str | None = None, memory_fraction: float | None = None,
               ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> list[str]:
    """``vllm serve MODEL --tensor-parallel-size TP --pipeline-parallel-size PP``, with
    ``--max-model-len`` when a context is stated and ``--kv-cache-dtype`` (``fp8``; ``bfloat16``
    for a DSA model, whose ``auto`` may be FP8 - for another model ``bfloat16`` is refused, its
    ``auto`` is already BF16), ``--quantization fp8`` (online FP8 weights), the GPU share and
    ``--enable-expert-parallel`` where the plan states them, so the command runs the settings the
    memory verdict judged."""
    args = ["vllm", "serve", model, TP_FLAG, str(tp), PP_FLAG, str(pp)]
    args += stated_flags((CONTEXT_FLAG, context), (QUANTIZATION_FLAG, quantization),
                         (MEMORY_FRACTION_FLAG, memory_fraction))
    if dp > 1:
        args += [DP_FLAG, str(dp)]
    if ep > 1:
        args.append(EP_SWITCH)
    if mtp:
        args += [SPECULATIVE_FLAG, json.dumps({"method": "mtp", "num_speculative_tokens": 1}, separators=(",", ":"))]
    if kv_dtype == "fp8" or (kv_dtype == "bf16" and indexer):
        args += [KV_DTYPE_FLAG, "fp8" if kv_dtype == "fp8" else "bfloat16"]
    return args


def config_file_args(text: str, path: str) -> list[str]:
    """The options ``vllm serve --config FILE`` adds: ``FlexibleArgumentParser.load_config_file``
    (``vllm/utils/argparse_utils.py`` @ c836a6fe) reads a ``.yaml`` / ``.yml`` file holding one flat
    mapping (:func:`~app.core.engines.serving.config_options`). A nested mapping (which vLLM passes
    on as Python text, not JSON) is not read."""

    def nested(key: str, value: dict[str, Any]) -> list[str]:
        raise ValueError(f"{key} in {path} is a mapping, which vLLM passes on as Python text (not JSON); "
                         "give that option on the command line")

    return config_options(text, path, "vLLM", nested, empty_ok=False)


#: ``_get_and_verify_max_len`` (``vllm/config/model.py`` @ 0052a5b8): the config keys of a maximum
#: length, the smallest of those present taken
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
MAX_LEN_SOURCE = "vllm-project/vllm vllm/config/model.py:_get_and_verify_max_len @ 0052a5b8"
#: ``vllm/envs.py``: set to 1 / true, a --max-model-len above the derived maximum is taken with a warning
LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def max_context(cfg: ModelConfig) -> MaxContext | None:
    """vLLM's maximum model length (:data:`MAX_LEN_SOURCE`): the smallest of :data:`MAX_LEN_KEYS`
    present, or ``model_max_length`` when set; times the rope scaling ``factor`` unless the rope
    type is ``su``, ``longrope`` or ``llama3`` (a ``yarn`` one scales its
    ``original_max_position_embeddings``; a Gemma 3 config is already scaled); LongRoPE models
    default to ``original_max_position_embeddings``. Not read: the tokenizer's ``model_max_length``
    (``tokenizer_config.json``, which can only lower it). ``None`` when no key is present."""
    text = cfg.text_raw
    found = [(k, n) for k in MAX_LEN_KEYS if (n := config_number(text, k)) is not None]
    if not found:
        return None
    key, n = min(found, key=lambda kn: kn[1])
    if text.get("model_max_length"):
        key, n = "model_max_length", config_number(text, "model_max_length") or n
    how = f"{key} {n:,.0f}"
    entries, _ = rope_entries(text)
    model_type = str(text.get("model_type") or cfg.model_type or "")
    if entries and "gemma3" not in model_type:
        factor = 1.0
        for rp in entries:
            if rp["rope_type"] not in ("su", "longrope", "llama3"):
                factor = config_number(rp, "factor", "rope scaling") or factor
                if rp["rope_type"] == "yarn":
                    orig = config_number(rp, "original_max_position_embeddings", "rope scaling")
                    if orig is None:
                        raise ValueError("config.json's yarn rope scaling has no original_max_position_embeddings, "
                                         "which vLLM reads to derive the maximum context")
                    n, how = orig, f"original_max_position_embeddings {orig:,.0f}"
        if factor != 1:
            n, how = n * factor, f"{how} × {entries[0]['rope_type']} factor {factor:g}"
    default = None
    if any(rp["rope_type"] == "longrope" for rp in entries):
        default = int(config_number(text, "original_max_position_embeddings") or n)
    return MaxContext(int(n), how, default)


def parallel_reasons(cfg: ModelConfig, plan: Plan) -> list[Reason]:
    """vLLM's start-up checks of the parallel sizes (``ModelConfig.verify_with_parallel_config``,
    ``vllm/config/model.py`` @ 0052a5b8): the attention heads must divide over TP; expert
    parallelism needs routed experts (``_verify_with_expert_parallelism``); and its expert-parallel
    size is TP x DP when ``--enable-expert-parallel`` is given, else 1, so no other ``ep`` can be
    served."""
    out = []
    heads = cfg.num_attention_heads
    if heads % plan.tp:
        out.append(Reason(ENGINE, "heads_tp", f"Total number of attention heads ({heads}) must be divisible by "
                          f"tensor parallel size ({plan.tp}). (vLLM's own check: pick a TP dividing {heads})", "tp"))
    ranks = plan.tp * (plan.dp or 1)
    if plan.ep > 1 and not cfg.n_routed_experts:
        out.append(Reason(ENGINE, "ep_without_experts", "Number of experts in the model must be greater than 0 when "
                          f"expert parallelism is enabled. ({cfg.id} is dense: set ep to 1)", "ep"))
    elif plan.ep not in (1, ranks):
        out.append(Reason(ENGINE, "ep_not_tp", f"vLLM has no expert-parallel size: {EP_SWITCH} makes it TP x DP = "
                          f"{plan.tp} x {plan.dp or 1} = {ranks}, so ep={plan.ep} cannot be served; set ep to 1 or "
                          f"{ranks}", "ep"))
    return out


def launch_mtp(values: dict[str, str]) -> tuple[bool, str | None]:
    """``--speculative-config '{"method": "mtp", ...}'``: the checkpoint's MTP layers draft (``mtp``
    or a ``<model>_mtp`` method); another method, or a value that is not a JSON object, is said."""
    text = values.get(SPECULATIVE_FLAG)
    if text is None:
        return False, None
    try:
        spec = json.loads(text)
    except ValueError:
        spec = None
    method = spec.get("method") if isinstance(spec, dict) else None
    if isinstance(method, str) and (method == "mtp" or method.endswith("_mtp")):
        return True, None
    return False, (f"{SPECULATIVE_FLAG} {text[:80]} is not a plan setting unless its method is mtp or a <model>_mtp "
                   "one (the checkpoint's MTP layers): its draft is not in the memory verdict")


def long_context_set(value: str) -> bool:
    """``VLLM_ALLOW_LONG_MAX_MODEL_LEN``: on for ``1`` / ``true`` (any case, spaces stripped), off otherwise."""
    return value.strip().lower() in ("1", "true")


def mtp_with_pp(build: date | None = None) -> str:
    """vLLM builds the MTP drafter on the last rank; MTP with PP > 1 is still being fixed upstream."""
    return ("vLLM builds the MTP drafter on the last pipeline rank only; MTP with PP > 1 is still being fixed "
            "upstream (vllm issues #49355, #52069)")


class VllmEngine(ServingEngine):
    """vLLM (``vllm serve``): the rules above, behind the engine protocol."""

    name = ENGINE
    label = "vLLM"
    acceptance_kind = "vllm"
    source = SOURCE
    env_var = ENV_VAR
    tp_flag = TP_FLAG
    pp_flag = PP_FLAG
    partition_rules = PARTITION_RULES
    role_source = ROLE_RULE
    reads_indexer_types = READS_INDEXER_TYPES
    flags: ClassVar[dict[str, str]] = {TP_FLAG: "tp", "-tp": "tp", PP_FLAG: "pp", "-pp": "pp", ENV_VAR: "split",
                                       CONTEXT_FLAG: "context", KV_DTYPE_FLAG: "kv_dtype",
                                       QUANTIZATION_FLAG: "weight_dtype", "-q": "weight_dtype",
                                       MEMORY_FRACTION_FLAG: "gpu_memory_utilization",
                                       DP_FLAG: "dp", "-dp": "dp"}
    kv_cache_dtypes = KV_CACHE_DTYPES
    kv_auto = "the model's dtype (FP8 for DeepSeek-V3.2-style DSA models, vllm/config/cache.py @ c1d86421)"
    context_flag = CONTEXT_FLAG
    long_context_env = LONG_CONTEXT_ENV
    #: ``--max-model-len`` is a ``human_readable_int``: a lowercase ``k`` is 1,000 in every build read
    #: (``vllm/engine/arg_utils.py`` @ 001999d2 and 99d7eb5d, ``vllm/utils/argparse_utils.py`` @ c836a6fe,
    #: and the later SI / IEC variant); ``K``, ``M``, ``m``, ``G`` ... changed meaning (``1M`` is 2^20
    #: before the SI variant, 10^6 in it; ``1m`` is refused there), so they are not read
    context_suffixes: ClassVar[dict[str, int]] = {"k": 1000}
    ep_switch = EP_SWITCH
    speculative_flags = (SPECULATIVE_FLAG,)
    fields = SERVING_FIELDS | {"dp"}
    #: ``vllm serve MODEL`` (``vllm/entrypoints/cli/serve.py`` @ 78265ccd) or the OpenAI server module;
    #: the ``vllm/vllm-openai`` image's entrypoint is ``vllm serve`` (``docker/Dockerfile`` @ dead20ba:
    #: ``FROM vllm-openai-base AS vllm-openai``, ``ENTRYPOINT ["vllm", "serve"]``); the command line is
    #: read by ``FlexibleArgumentParser`` (``vllm/utils/argparse_utils.py`` @ c836a6fe: underscores,
    #: dotted JSON options, ``--config FILE``)
    launch: ClassVar[LaunchSyntax] = LaunchSyntax(
        programs=(("vllm", "serve"),), modules=("vllm.entrypoints.openai.api_server",), model_flags=("--model",),
        positional_model=True, partition_env=ENV_VAR, unread_flags=UNREAD_FLAGS, images=("vllm/vllm-openai",),
        flexible_args=True, config_flag="--config", config_reader=config_file_args)

    def default_partition(self, num_layers: int, pp: int, build: date | None = None) -> list[int]:
        return default_partition(num_layers, pp, build)

    def share_behaviour(self, build: date | None = None) -> ShareBehaviour:
        return share_behaviour(build)

    def serve_args(self, model: str, tp: int, pp: int, *, context: int | None = None, kv_dtype: str | None = None,
                   indexer: bool = False, quantization: str | None = None, memory_fraction: float | None = None,
                   ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> list[str]:
        return serve_args(model, tp, pp, context=context, kv_dtype=kv_dtype, indexer=indexer,
                          quantization=quantization, memory_fraction=memory_fraction, ep=ep, dp=dp, mtp=mtp)

    def mtp_with_pp(self, build: date | None) -> str:
        return mtp_with_pp(build)

    def max_context(self, cfg: ModelConfig) -> MaxContext | None:
        return max_context(cfg)

    def parallel_reasons(self, cfg: ModelConfig, plan: Plan) -> list[Reason]:
        return parallel_reasons(cfg, plan)

    def launch_mtp(self, values: dict[str, str]) -> tuple[bool, str | None]:
        return launch_mtp(values)

    def long_context_set(self, value: str) -> bool | None:
        return long_context_set(value)


ENGINE_OBJECT = VllmEngine()
