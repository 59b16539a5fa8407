"""SGLang: how it splits decoder layers over pipeline ranks, and what a shared start does.

Read from sgl-project/sglang and its issue tracker (rules re-implemented, never copied):

* ``python/sglang/srt/distributed/utils.py: get_pp_indices``. ``SGLANG_PP_LAYER_PARTITION``
  (``os.getenv``) overrides with the same checks and messages as vLLM's ("Invalid partition
  string", ``len(partitions)=... does not match pp_size=...``, ``sum(partitions)=... does not
  match num_hidden_layers=...``). The default changed twice:

  - up to PR #13282: every rank gets ``L // P`` and the last rank takes all ``L % P`` extra layers
    (the stored upstream snapshot, commit 3e5a73c85326244e4a9d586e22788e20378c42a8, still has it;
    "adapted from vLLM v0.6.4.post1");
  - PR #13282 "fix uneven PP layer indices" (reviewed 2025-11-17): the first ``L % P`` ranks get one
    extra (61 layers, PP 8 -> 8,8,8,8,8,7,7,7, as its reviewer wrote);
  - PR #13977 "Optimize uneven PP layer distribution logic" (opened 2025-11-26): the **last**
    ``L % P`` ranks get one extra ("Distribute the extra layers to the last 'remainder'
    partitions"). This form was confirmed in a downstream copy of the file, not in an upstream
    snapshot; the dates are those of the PR threads, not confirmed merge commits.

* Shared start. Before the fix SGLang forwarded only ``hidden_states`` / ``residual`` between
  pipeline stages, so a stage starting on a shared layer crashed: ``page_table_1=None`` in
  FlashMLA-KV (issue #28525, analysed in PR #28532), ``RuntimeError: batch_size must be equal to
  batch_size_k`` (issue #29014) and ``KeyError: 'topk_indices'`` (reported by users; not found
  verbatim in the threads read here). PR #28532 "Fix IndexCache PP topk handoff" (opened
  2026-06-17) sends ``topk_indices`` through the PP proxy when the next stage needs it, and PR
  #28785 (2026-06-20/21) does the same for the warm-up buffers (it fixes #28659, a crash at start).
  This planner treats builds from :data:`TOPK_HANDOFF_FIX` on as handing off. A later report
  (issue #29162, 2026-06-24, ``SGLANG_PP_LAYER_PARTITION=19,20,20,19``: index out of range on
  some requests) was closed as inactive; it is shown as a caveat.
* Roles: SGLang's freq/offset reading is taken as the HF rule (FACTS.md section 8); it was not
  confirmed in SGLang's ``deepseek_v2.py`` at a cited commit (a downstream note says SGLang
  0.5.12 ignored ``index_skip_topk_offset``).
* Placement: embedding on the first stage, lm_head on the last. Speculative decoding and PP were
  mutually exclusive (a ``server_args.py`` assertion) until PR #30775 (merged after 2026-07-28,
  behind ``SGLANG_ENABLE_PP_SPEC=1``), which builds the draft worker only on the last stage.
"""

from __future__ import annotations

import json
from datetime import date
from typing import ClassVar

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

ENGINE = "sglang"
ENV_VAR = "SGLANG_PP_LAYER_PARTITION"
TP_FLAG = "--tp-size"
PP_FLAG = "--pp-size"
PP_SPEC_ENV = "SGLANG_ENABLE_PP_SPEC"
SOURCE = "sgl-project/sglang python/sglang/srt/distributed/utils.py:get_pp_indices"
ROLE_RULE = (
    "SGLang is taken to read indexer_types, then index_topk_pattern, then index_topk_freq / "
    "index_skip_topk_offset like transformers (not confirmed in SGLang's source)"
)
READS_INDEXER_TYPES = True

#: First build date treated as forwarding top-k to a stage that starts on a shared layer
#: (PR #28532 opened 2026-06-17, warm-up follow-up PR #28785 2026-06-20/21).
TOPK_HANDOFF_FIX = date(2026, 6, 21)
#: PP together with speculative decoding (MTP draft on the last stage): PR #30775, after this date.
PP_SPEC_SINCE = date(2026, 7, 28)

PARTITION_RULES: tuple[RuleChange, ...] = (
    RuleChange(date.min, "every rank gets L // P layers and the last rank also takes the L % P extra ones",
               f"{SOURCE} @ 3e5a73c85326"),
    RuleChange(date(2025, 11, 17), "the first L % P ranks get one extra layer",
               "sgl-project/sglang PR #13282"),
    RuleChange(date(2025, 11, 26), "the last L % P ranks get one extra layer",
               "sgl-project/sglang PR #13977"),
)

CRASH_ERRORS = (
    "page_table_1=None (FlashMLA-KV)",
    "RuntimeError: batch_size must be equal to batch_size_k",
    "KeyError: 'topk_indices'",
)


def default_partition(num_layers: int, pp: int, build: date | None = None) -> list[int]:
    """Layers per pipeline rank when ``SGLANG_PP_LAYER_PARTITION`` is unset, for ``build``."""
    base, extra = divmod(num_layers, pp)
    sizes = [base] * pp
    if build is not None and build < PARTITION_RULES[1].since:
        sizes[-1] += extra
    elif build is not None and build < PARTITION_RULES[2].since:
        for rank in range(extra):
            sizes[rank] += 1
    else:
        for rank in range(pp - extra, pp):
            sizes[rank] += 1
    return sizes


def share_behaviour(build: date | None = None) -> ShareBehaviour:
    """Handoff from :data:`TOPK_HANDOFF_FIX` on (and for ``None``, the newest build); crash before."""
    if build is None or build >= TOPK_HANDOFF_FIX:
        return ShareBehaviour(
            "handoff",
            False,
            "SGLang (build from 2026-06-21 on: PR #28532 + #28785) forwards topk_indices through the "
            "PP proxy to a stage that starts on a shared layer: correct, at the cost of one extra "
            "transfer of index_topk int32 values per token. Caveat: issue #29162 reported an index "
            "out of range with SGLANG_PP_LAYER_PARTITION=19,20,20,19 after the fix (closed inactive)",
            "sgl-project/sglang PR #28532, PR #28785",
        )
    return ShareBehaviour(
        "crash",
        True,
        "SGLang before 2026-06-21 forwards only hidden_states and residual between stages; a stage "
        "that starts on a shared layer crashes at warm-up or on the first request with one of: "
        + "; ".join(CRASH_ERRORS)
        + f". Upgrade to a build with PR #28532 and #28785, or set {ENV_VAR} so every stage starts on "
        "a full layer",
        "sgl-project/sglang issues #28525, #28659, #29014; PR #28532",
    )


#: ``--context-length``: the model's maximum context a server takes (the plan's ``context``)
CONTEXT_FLAG = "--context-length"
KV_DTYPE_FLAG = "--kv-cache-dtype"
#: ``--quantization fp8`` loads a BF16 checkpoint's weights quantized to FP8 (the plan's ``weight_dtype``);
#: another method is not a plan setting (a launcher warning)
QUANTIZATION_FLAG = "--quantization"
#: ``--ep-size`` / ``--expert-parallel-size``: the MoE's expert-parallel size (the plan's ``ep``); each expert
#: is then split ``tp // ep`` ways (``moe_tp_size``, ``python/sglang/srt/distributed/parallel_state.py``)
EP_SIZE_FLAG = "--ep-size"
#: what sets ``ep_size = tp_size`` whatever ``--ep-size`` says: the all-to-all MoE backends that "force
#: expert parallelism to span the TP group" (``_A2A_EP_SPANNING_BACKENDS`` and ``_a2a_ep_size`` in
#: ``python/sglang/srt/arg_groups/overrides.py`` @ 003bbaf9; older builds did the same for deepep,
#: mooncake, ascend_fuseep, flashinfer and mori in ``server_args.py`` ``_handle_a2a_moe``), and the
#: deprecated ``--enable-ep-moe`` and ``--enable-deepep-moe`` (``ServerArgs.__post_init__``: the first
#: sets ``ep_size = tp_size``, the second the ``deepep`` backend); ``none`` and ``ascend_tp`` keep it
EP_TP_SWITCHES = ("--enable-ep-moe", "--enable-deepep-moe")
A2A_BACKEND_FLAG = "--moe-a2a-backend"
EP_TP_BACKENDS = frozenset(("megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
                            "flashinfer_megamoe", "mori", "pplx"))
#: ``--dp-size``: data-parallel ranks - replicas of TP x PP GPUs each, or with ``--enable-dp-attention``
#: attention ranks inside the TP ranks (``attn_tp_size = tp_size // dp_size``; the plan's ``dp`` and
#: ``enable_dp_attention``)
DP_FLAG = "--dp-size"
#: speculative decoding: ``EAGLE`` / ``NEXTN`` without ``--speculative-draft-model-path`` draft with the
#: checkpoint's own MTP (NextN) layers (the plan's ``mtp_layers``); another algorithm or a draft model
#: runs a draft the memory model does not hold
SPECULATIVE_FLAG = "--speculative-algorithm"
DRAFT_MODEL_FLAG = "--speculative-draft-model-path"
MTP_ALGORITHMS = ("EAGLE", "NEXTN")
DP_ATTENTION_SWITCH = "--enable-dp-attention"
#: the share of each GPU the server takes for weights and KV cache (the plan's ``gpu_memory_utilization``)
MEMORY_FRACTION_FLAG = "--mem-fraction-static"
#: ``--kv-cache-dtype`` values -> the plan's ``kv_dtype`` (``auto``: the model's dtype, read as the
#: plan's default and said). ``fp8_e4m3`` / ``fp8_e5m2`` are the spellings SGLang launch scripts use;
#: the list of choices was not read in SGLang's ``server_args.py`` at a cited commit
KV_CACHE_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
#: settings no plan field carries: (flag, takes a value, what the memory verdict assumes)
UNREAD_FLAGS = (
    ("--chunked-prefill-size", True, "8192 tokens per batch for the top-k buffer"),
    ("--enable-dp-lm-head", False, "lm_head split over all TP ranks"),
    ("--moe-dense-tp-size", True, "the dense MLP split over all TP ranks"),
    # expert-parallel load balancing's redundant experts add expert copies over the EP ranks
    ("--ep-num-redundant-experts", True, "no redundant experts (their copies add expert weights on every EP "
                                         "rank): a lower bound"),
    # attention context parallelism: attn_tp_size = tp_size // dp_size // attn_cp_size
    # (python/sglang/srt/layers/dp_attention.py, compute_dp_attention_world_info; commit not read);
    # DeepSeek-V3.2-style prefill context parallelism may switch DP attention and EP on
    *((flag, True, "attention split over all TP ranks (not TP / CP)")
      for flag in ("--attention-context-parallel-size", "--attn-cp-size")),
    *((flag, False, "none of what its in-seq-split mode switches on (DP attention, EP = TP)")
      for flag in ("--enable-dsa-prefill-context-parallel", "--enable-nsa-prefill-context-parallel")),
)


def config_file_args(text: str, path: str) -> list[str]:
    """The options ``--config FILE`` adds: ``prepare_server_args`` merges it with
    ``ConfigArgumentMerger`` (``python/sglang/srt/utils/server_args_config_parser.py`` @ 7ef0fc26): a
    ``.yaml`` / ``.yml`` file (empty: nothing) holding one mapping
    (:func:`~app.core.engines.serving.config_options`; ``true`` on a switch is the switch - the
    switches read here are ``store_true`` - and a mapping ``--key`` its JSON). A key written with
    ``_`` is passed as written; one that names an option read here only with ``-`` is refused
    (SGLang's parser names its options with dashes)."""
    read = set(SglangEngine.flags) | set(SglangEngine.switches)

    def dashes(key: object) -> None:
        if "_" in str(key) and f"--{str(key).replace('_', '-')}" in read:
            raise ValueError(f"{key} in {path}: SGLang's option is --{str(key).replace('_', '-')}; write the key "
                             "with dashes")

    return config_options(text, path, "SGLang", lambda key, value: [f"--{key}", json.dumps(value)], empty_ok=True,
                          check_key=dashes)


#: ``get_context_length`` (``python/sglang/srt/utils/hf_transformers_utils.py`` @ 002fc100): the config
#: keys of the context length, the first present taken
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
CONTEXT_SOURCE = ("sgl-project/sglang python/sglang/srt/utils/hf_transformers_utils.py:get_context_length @ 002fc100; "
                  "python/sglang/srt/configs/model_config.py:_derive_context_length @ 001adf56")
#: ``python/sglang/srt/environ.py`` (an ``EnvBool``): set, a --context-length above the derived one is taken
#: with a warning
LONG_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def max_context(cfg: ModelConfig) -> MaxContext | None:
    """SGLang's derived context length (:data:`CONTEXT_SOURCE`): the first of
    :data:`CONTEXT_LENGTH_KEYS` present, times the rope scaling ``factor`` unless the scaling names
    an ``original_max_position_embeddings`` or is ``llama3`` (so a yarn config keeps its
    ``max_position_embeddings``, where vLLM scales the original; a per-layer-type one has no
    ``factor`` of its own). ``None`` when no key is present (SGLang would take 2048, or its config
    class's default)."""
    text = cfg.text_raw
    key, n = next(((k, n) for k in CONTEXT_LENGTH_KEYS if (n := config_number(text, k)) is not None), ("", None))
    if n is None:
        return None
    entries, nested = rope_entries(text)
    factor = 1.0
    if entries and not nested:
        rp = entries[0]
        factor = config_number(rp, "factor", "rope scaling") or 1.0
        if "original_max_position_embeddings" in rp or rp["rope_type"] == "llama3":
            factor = 1.0
    how = f"{key} {n:,.0f}" + (f" × {entries[0]['rope_type']} factor {factor:g}" if factor != 1 else "")
    return MaxContext(int(factor * n), how)


def parallel_reasons(cfg: ModelConfig, plan: Plan) -> list[Reason]:
    """SGLang's attention splits its heads over ``attn_tp_size`` ranks (TP, or TP / DP with
    data-parallel attention) and asserts it can: ``assert num_heads % attn_tp_size == 0`` in
    ``python/sglang/srt/models/deepseek_v2.py`` (``DeepseekV2AttentionMLA``), ``total_num_heads %
    tp_size == 0`` in its GQA models' attention - an ``AssertionError`` while the model loads."""
    heads = cfg.num_attention_heads
    dp = (plan.dp or 1) if plan.enable_dp_attention else 1
    if plan.tp % dp:   # the memory settings name it (AttentionSplitError)
        return []
    attn_tp = plan.tp // dp
    if heads % attn_tp == 0:
        return []
    over = f"TP {plan.tp}" if dp == 1 else f"attention TP {attn_tp} (TP {plan.tp} / DP {dp})"
    return [Reason(ENGINE, "heads_tp", f"SGLang's attention asserts num_heads % attn_tp_size == 0 while the model loads: "
                   f"{heads} heads do not divide over {over} (pick a TP dividing {heads})", "tp")]


def launch_mtp(values: dict[str, str]) -> tuple[bool, str | None]:
    """``--speculative-algorithm EAGLE`` / ``NEXTN`` with no draft model path: the checkpoint's MTP
    layers draft; another algorithm or a draft model is said."""
    algo = values.get(SPECULATIVE_FLAG)
    if algo is None:
        return False, None
    if algo.upper() in MTP_ALGORITHMS and DRAFT_MODEL_FLAG not in values:
        return True, None
    draft = f" with {DRAFT_MODEL_FLAG} {values[DRAFT_MODEL_FLAG]}" if DRAFT_MODEL_FLAG in values else ""
    return False, (f"{SPECULATIVE_FLAG} {algo}{draft} is not a plan setting: its draft is not the checkpoint's MTP "
                   "layers and is not in the memory verdict")


def long_context_set(value: str) -> bool | None:
    """``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` (an ``EnvBool``): ``true`` / ``1`` / ``yes`` / ``y``
    on, ``false`` / ``0`` / ``no`` / ``n`` off (any case); another value is none (SGLang warns and
    keeps its default, off)."""
    value = value.lower()
    return True if value in ("true", "1", "yes", "y") else False if value in ("false", "0", "no", "n") else None


def serve_args(model: str, tp: int, pp: int, *, context: int | None = None, kv_dtype: str | None = None,
               indexer: bool = False, quantization: str | None = None, memory_fraction: float | None = None,
               ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> list[str]:
    """``python -m sglang.launch_server --model-path MODEL --tp-size TP --pp-size PP``, with
    ``--context-length`` when a context is stated, ``--kv-cache-dtype fp8_e4m3`` for an FP8 KV
    cache, ``--quantization fp8``, ``--mem-fraction-static`` and ``--ep-size`` where the plan states
    them, so the command runs the settings the memory verdict judged.

    ``--tp-size`` / ``--pp-size`` are the option names SGLang's server arguments define
    (``--tp`` works only through argparse's prefix abbreviation).
    """
    args = ["python", "-m", "sglang.launch_server", "--model-path", model, TP_FLAG, str(tp), PP_FLAG, str(pp)]
    args += stated_flags((CONTEXT_FLAG, context), (QUANTIZATION_FLAG, quantization),
                         (MEMORY_FRACTION_FLAG, memory_fraction))
    if ep > 1:
        args += [EP_SIZE_FLAG, str(ep)]
    if dp > 1:
        args += [DP_FLAG, str(dp)] + ([DP_ATTENTION_SWITCH] if dp_attention else [])
    if mtp:
        args += [SPECULATIVE_FLAG, "EAGLE"]
    if kv_dtype == "fp8":
        args += [KV_DTYPE_FLAG, "fp8_e4m3"]
    return args


def mtp_with_pp(build: date | None = None) -> str:
    """SGLang refused MTP with PP before PR #30775; since then it needs ``SGLANG_ENABLE_PP_SPEC=1``."""
    if build is not None and build < PP_SPEC_SINCE:
        return ("SGLang refused speculative decoding (MTP) together with --pp-size > 1 before PR #30775; "
                "serve without MTP or upgrade")
    return f"SGLang runs MTP with PP only with {PP_SPEC_ENV}=1 (PR #30775); the draft sits on the last stage"


class SglangEngine(ServingEngine):
    """SGLang (``python -m sglang.launch_server``): the rules above, behind the engine protocol."""

    name = ENGINE
    label = "SGLang"
    acceptance_kind = "sglang"
    source = SOURCE
    env_var = ENV_VAR
    tp_flag = TP_FLAG
    pp_flag = PP_FLAG
    partition_rules = PARTITION_RULES
    role_source = ROLE_RULE
    reads_indexer_types = READS_INDEXER_TYPES
    flags: ClassVar[dict[str, str]] = {TP_FLAG: "tp", "--tp": "tp", "--tensor-parallel-size": "tp", PP_FLAG: "pp", "--pp": "pp",
             "--pipeline-parallel-size": "pp", ENV_VAR: "split", CONTEXT_FLAG: "context", KV_DTYPE_FLAG: "kv_dtype",
             QUANTIZATION_FLAG: "weight_dtype", MEMORY_FRACTION_FLAG: "gpu_memory_utilization",
             EP_SIZE_FLAG: "ep", "--expert-parallel-size": "ep", "--ep": "ep", DP_FLAG: "dp", "--dp": "dp",
             "--data-parallel-size": "dp"}
    switches: ClassVar[dict[str, str]] = {DP_ATTENTION_SWITCH: "enable_dp_attention"}
    ep_tp_switches = EP_TP_SWITCHES
    ep_tp_flag = (A2A_BACKEND_FLAG, EP_TP_BACKENDS)
    speculative_flags = (SPECULATIVE_FLAG, DRAFT_MODEL_FLAG)
    fields = SERVING_FIELDS | {"dp", "enable_dp_attention"}
    kv_cache_dtypes = KV_CACHE_DTYPES
    kv_auto = "the model's dtype"
    context_flag = CONTEXT_FLAG
    long_context_env = LONG_CONTEXT_ENV
    #: ``python -m sglang.launch_server --model-path M`` or ``sglang serve`` (``python/sglang/cli/serve.py``
    #: @ c6f80cf9)
    launch: ClassVar[LaunchSyntax] = LaunchSyntax(
        programs=(("sglang", "serve"),), modules=("sglang.launch_server",), model_flags=("--model-path", "--model"),
        partition_env=ENV_VAR, unread_flags=UNREAD_FLAGS, config_flag="--config", config_reader=config_file_args)

    def default_partition(self, num_layers: int, pp: int, build: date | None = None) -> list[int]:
        return default_partition(num_layers, pp, build)

    def share_behaviour(self, build: date | None = None) -> ShareBehaviour:
        return share_behaviour(build)

    def serve_args(self, model: str, tp: int, pp: int, *, context: int | None = None, kv_dtype: str | None = None,
                   indexer: bool = False, quantization: str | None = None, memory_fraction: float | None = None,
                   ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> list[str]:
        return serve_args(model, tp, pp, context=context, kv_dtype=kv_dtype, indexer=indexer,
                          quantization=quantization, memory_fraction=memory_fraction, ep=ep, dp=dp,
                          dp_attention=dp_attention, mtp=mtp)

    def mtp_with_pp(self, build: date | None) -> str:
        return mtp_with_pp(build)

    def max_context(self, cfg: ModelConfig) -> MaxContext | None:
        return max_context(cfg)

    def parallel_reasons(self, cfg: ModelConfig, plan: Plan) -> list[Reason]:
        return parallel_reasons(cfg, plan)

    def launch_mtp(self, values: dict[str, str]) -> tuple[bool, str | None]:
        return launch_mtp(values)

    def replicas(self, plan: Plan) -> int:
        """``--dp-size`` ranks are replicas of TP x PP GPUs, except as data-parallel attention."""
        return 1 if plan.enable_dp_attention else (plan.dp or 1)

    def attention_dp(self, plan: Plan) -> int:
        return (plan.dp or 1) if plan.enable_dp_attention else 1

    def long_context_set(self, value: str) -> bool | None:
        return long_context_set(value)


ENGINE_OBJECT = SglangEngine()
