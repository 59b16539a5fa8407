"""Serving memory per pipeline rank: weights, KV cache, indexer key cache and the top-k buffer.

Per GPU of pipeline rank ``p`` (every GPU of a rank's TP group holds the same amounts):

* **Weights** of the rank's decoder layers, from :func:`app.core.model.parameters.stage_params`: TP
  splits the MLA up/out projections, dense FFN, shared expert and vocabulary; routed experts are
  split ``tp`` ways inside each expert (vLLM / SGLang without expert parallelism), or with expert
  parallelism ``ep`` ways by expert and ``tp // ep`` ways inside each (SGLang's ``moe_tp_size =
  tp_size // moe_ep_size``, ``python/sglang/srt/distributed/parallel_state.py``; vLLM's expert
  parallelism has ``ep = tp x dp``: whole experts). Rank 0 adds the embedding, the
  last rank lm_head and the final norm, and the MTP draft layer where it is served (the last rank;
  counted with one embedding copy, as ``stage_params`` does for Megatron; whether the engines'
  draft shares the target's embedding tensor is not confirmed here). Bytes per parameter:
  ``weight_dtype`` ``bf16`` = 2, ``fp8`` = 1 for every weight (an approximation: FP8 checkpoints
  keep norms and some projections in BF16); unless stated, the checkpoint's
  (:func:`served_weight_dtype`: the engines load the ``quantization_config`` format).
* **KV cache** for ``context x concurrency`` tokens on each of the rank's layers (and the MTP
  layer): the MLA latent, ``kv_lora_rank + qk_rope_head_dim`` values per token per layer (576 for
  GLM-5.2), 2 bytes each in BF16 (1152 B), or vLLM's ``fp8_ds_mla`` layout: the latent in FP8, one
  FP32 scale per 128 values and the rope part in BF16 (512 + 16 + 128 = 656 B). MLA has one latent
  head, so TP does not split it. Source: FACTS.md section 5 (vLLM ``fp8_ds_mla``). A
  sliding-window layer (Gemma 2, GPT-OSS) or chunked-attention layer (Llama 4) is counted with the
  whole context too - the engines
  allocate less there (vLLM's hybrid KV cache manager about the window, SGLang's SWA pool a
  ratio of the full pool, ``--swa-full-tokens-ratio``), which is not modelled: an overestimate,
  on the safe side of ``fits``. A hybrid model keeps KV only on its attention layers and, on each
  Mamba layer, one state per sequence (``MambaDims.state_bytes``, counted in the same term).
* **Indexer key cache**: ``index_head_dim`` FP8 values + one FP32 scale = 132 B per token, only on
  layers that own an indexer (full layers, MTP layers); ``indexer_cache_on_all_layers`` models an
  engine that allocates it on every layer (FACTS.md section 5 says older SGLang did).
* **Top-k buffer**: ``max_batched_tokens x index_topk`` int32 per rank (vLLM allocates one
  ``torch.empty(max_num_batched_tokens, index_topk, int32)`` per model instance,
  ``vllm/model_executor/models/deepseek_v2.py`` @ 002d6073aa03; SGLang assumed alike).

Not counted: activations, CUDA graphs, NCCL buffers, the sampler. ``fits`` compares the sum with
``capacity_gib x gpu_memory_utilization`` (vLLM's ``--gpu-memory-utilization``, SGLang's
``--mem-fraction-static``: the plan's ``gpu_memory_utilization``, default 0.9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parameters import serving_expert_tp, shapes, stage_params
from app.core.model.roles import RoleMap

#: the plan's KV dtypes (``app.core.plan.KV_DTYPES``); ``fp8_ds_mla`` is vLLM's name of the FP8 layout of
#: an MLA cache and reads as ``fp8``
KV_DTYPES = ("bf16", "fp8")
KV_DTYPE_NAMES = {"bf16": "bf16", "fp8": "fp8", "fp8_ds_mla": "fp8"}
WEIGHT_BYTES = {"bf16": 2, "fp8": 1}
GIB = 1 << 30
MAX_TOKENS = 1 << 40


class ServingMemoryError(ValueError):
    """A memory setting that cannot be used; the message names the setting (``field``: the plan
    field that fixes it, where it is not the context)."""

    field = "context"


class AttentionSplitError(ServingMemoryError):
    """Data-parallel attention ranks that do not divide the TP ranks."""

    field = "dp"


class WeightFormatError(ServingMemoryError):
    """The checkpoint's weights are in a format the memory model does not cover."""

    field = "weight_dtype"


def served_weight_dtype(cfg: ModelConfig, stated: str | None) -> str:
    """The weights' dtype a server holds: the one stated, else the checkpoint's
    (:attr:`ModelConfig.checkpoint_weight_dtype`: vLLM and SGLang load the ``quantization_config``
    format); :class:`WeightFormatError` for a format the memory model does not cover."""
    if stated is not None:
        return stated
    found = cfg.checkpoint_weight_dtype
    if found is None:
        raise WeightFormatError(f"{cfg.id}'s config.json quantizes its weights with {cfg.weight_format!r}, which "
                                "isplan's serving memory does not cover: give weight_dtype (bf16 or fp8 bytes per "
                                "weight) to judge it at one of those")
    return found


@dataclass(frozen=True)
class ServingMemorySettings:
    tp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    context: int = 4096
    concurrency: int = 1
    max_batched_tokens: int = 8192
    capacity_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    indexer_cache_on_all_layers: bool = False
    #: data-parallel attention ranks inside the TP ranks (SGLang ``--enable-dp-attention``): the
    #: attention is split ``tp // attn_dp`` ways and the embedding is whole on each GPU; 1: none
    attn_dp: int = 1

    def validate(self) -> ServingMemorySettings:
        for name in ("tp", "ep", "context", "concurrency", "max_batched_tokens", "attn_dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ServingMemoryError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.tp % self.attn_dp:
            raise AttentionSplitError(f"data-parallel attention splits the {self.tp} TP ranks into {self.attn_dp} "
                                      "groups: dp must divide tp")
        if self.context * self.concurrency > MAX_TOKENS:
            raise ServingMemoryError(f"--context x --concurrency = {self.context * self.concurrency:,} tokens is absurd")
        if self.weight_dtype not in WEIGHT_BYTES:
            raise ServingMemoryError(f"--weight-dtype must be one of {', '.join(WEIGHT_BYTES)}, got {self.weight_dtype!r}")
        if self.kv_dtype not in KV_DTYPE_NAMES:
            raise ServingMemoryError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.capacity_gib is not None and not self.capacity_gib > 0:
            raise ServingMemoryError(f"--gpu-memory must be a positive number of GiB, got {self.capacity_gib!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ServingMemoryError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        return self


def latent_bytes_per_token(cfg: ModelConfig, kv_dtype: str = "bf16", *, tp: int = 1) -> int:
    """KV cache bytes per token per layer on one GPU: the MLA latent (BF16, or vLLM's
    ``fp8_ds_mla`` layout), or a GQA model's keys and values of the GPU's heads; one formula for
    training and serving (:func:`app.core.model.memory.kv_bytes_per_token_layer`)."""
    from app.core.model.memory import kv_bytes_per_token_layer

    if kv_dtype not in KV_DTYPE_NAMES:
        raise ServingMemoryError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return kv_bytes_per_token_layer(cfg, KV_DTYPE_NAMES[kv_dtype], tp=tp)


def indexer_key_bytes_per_token(cfg: ModelConfig) -> int:
    """Indexer key cache bytes per token on a layer that owns an indexer: FP8 key + FP32 scale."""
    return cfg.index_head_dim + 4 if cfg.has_indexer else 0


@dataclass(frozen=True)
class RankMemory:
    pp_rank: int
    first_layer: int | None
    last_layer: int | None
    num_layers: int
    indexer_layers: int
    params_per_gpu: int   # the parameters behind ``weights`` (one GPU's share, as ``stage_params`` shards them)
    weights: int
    kv_latent: int
    indexer_cache: int
    topk_buffer: int
    usable: int | None

    @property
    def total(self) -> int:
        return self.weights + self.kv_latent + self.indexer_cache + self.topk_buffer

    @property
    def fits(self) -> bool | None:
        return None if self.usable is None else self.total <= self.usable

    def to_dict(self) -> dict[str, Any]:
        return {
            "pp_rank": self.pp_rank, "first_layer": self.first_layer, "last_layer": self.last_layer,
            "num_layers": self.num_layers, "indexer_layers": self.indexer_layers,
            "params_per_gpu": self.params_per_gpu, "weights_bytes": self.weights, "kv_latent_bytes": self.kv_latent,
            "indexer_cache_bytes": self.indexer_cache, "topk_buffer_bytes": self.topk_buffer,
            "total_bytes": self.total, "total_gib": round(self.total / GIB, 3),
            "usable_bytes": self.usable, "fits": self.fits,
        }


def _stage_bytes(cfg: ModelConfig, roles: RoleMap, stage: Stage, s: ServingMemorySettings) -> tuple[int, int, int, int]:
    """(weights, KV latent, indexer cache, indexer-owning layers) per GPU of one stage."""
    params = stage_params(cfg, roles, [stage], tp=s.tp, ep=s.ep, etp=serving_expert_tp(s.tp, s.ep))
    tokens = s.context * s.concurrency
    mixers = [roles.role(n).mixer for n in stage.layers]
    kv_layers = mixers.count("attention") + stage.mtp_layers
    attn_tp = s.tp // s.attn_dp
    per_gpu = params.per_gpu + (_attention_dp_extra(cfg, stage, kv_layers, s.tp, attn_tp) if s.attn_dp > 1 else 0)
    weights = per_gpu * WEIGHT_BYTES[s.weight_dtype]
    owners = sum(1 for n in stage.layers if roles.role(n).has_indexer)
    owners += stage.mtp_layers if cfg.has_indexer else 0
    index_layers = kv_layers if s.indexer_cache_on_all_layers and cfg.has_indexer else owners
    latent = kv_layers * latent_bytes_per_token(cfg, s.kv_dtype, tp=attn_tp) * tokens
    if cfg.mamba is not None:
        latent += round(mixers.count("mamba") * cfg.mamba.state_bytes(s.tp) * s.concurrency)
    if cfg.gdn is not None:
        latent += round(mixers.count("gdn") * cfg.gdn.state_bytes(s.tp) * s.concurrency)
    index = index_layers * indexer_key_bytes_per_token(cfg) * tokens
    return weights, latent, index, index_layers


def _attention_dp_extra(cfg: ModelConfig, stage: Stage, attention_layers: int, tp: int, attn_tp: int) -> int:
    """What data-parallel attention adds per GPU to the TP-split parameters: each attention layer's
    TP-split projections over ``attn_tp`` instead of ``tp`` ranks (``DeepseekV2AttentionMLA``:
    ``num_local_heads = num_heads // attn_tp_size``), and the embedding whole on every GPU
    (``VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())`` in SGLang's models)."""
    sh = shapes(cfg)
    extra = attention_layers * (-(-sh.attn_sharded // attn_tp) - -(-sh.attn_sharded // tp))
    if stage.embedding:
        extra += sh.embedding - -(-sh.embedding // tp)
    return extra


def rank_memory(cfg: ModelConfig, roles: RoleMap, stage: Stage, settings: ServingMemorySettings) -> RankMemory:
    """Memory per GPU of the pipeline rank that holds ``stage`` (serving: one stage per rank)."""
    s = settings.validate()
    weights, latent, index, owners = _stage_bytes(cfg, roles, stage, s)
    topk = s.max_batched_tokens * cfg.index_topk * 4 if cfg.has_indexer else 0
    usable = int(s.capacity_gib * GIB * s.gpu_memory_utilization) if s.capacity_gib is not None else None
    params = weights // WEIGHT_BYTES[s.weight_dtype]   # weights = parameters per GPU x bytes each
    return RankMemory(stage.pp_rank, stage.first_layer, stage.last_layer, stage.num_layers, owners, params,
                      weights, latent, index, topk, usable)


@dataclass(frozen=True)
class ServingMemoryReport:
    settings: ServingMemorySettings
    ranks: tuple[RankMemory, ...]

    @property
    def fits(self) -> bool | None:
        if self.settings.capacity_gib is None:
            return None
        return all(r.fits for r in self.ranks)

    @property
    def max_rank(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.total)

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        return {
            "settings": {
                "tp": s.tp, "ep": s.ep, "weight_dtype": s.weight_dtype, "kv_dtype": s.kv_dtype,
                "context": s.context, "concurrency": s.concurrency, "max_batched_tokens": s.max_batched_tokens,
                "capacity_gib": s.capacity_gib, "gpu_memory_utilization": s.gpu_memory_utilization,
                "indexer_cache_on_all_layers": s.indexer_cache_on_all_layers,
            },
            "ranks": [r.to_dict() for r in self.ranks],
            "max_rank": self.max_rank.pp_rank if self.ranks else None,
            "fits": self.fits,
            "not_counted": "activations, CUDA graphs, communication buffers, sampler",
        }


def serving_memory(cfg: ModelConfig, plan: StagePlan, roles: RoleMap,
                   settings: ServingMemorySettings | None = None) -> ServingMemoryReport:
    """Memory per GPU for every pipeline rank of a serving plan (one stage per rank)."""
    s = (settings or ServingMemorySettings()).validate()
    return ServingMemoryReport(s, tuple(rank_memory(cfg, roles, st, s) for st in plan.stages))


def serving_layer_costs(cfg: ModelConfig, roles: RoleMap, settings: ServingMemorySettings | None = None, *,
                        mtp_layers: int = 0) -> tuple[list[float], float, float]:
    """Bytes per GPU that each decoder layer adds to its rank (weights + KV + indexer cache), and the
    first / last rank's extras (embedding; lm_head + final norm + MTP). The per-rank top-k buffer is
    the same on every rank, so it does not change which partition is best and is left out."""
    s = (settings or ServingMemorySettings()).validate()

    def cost(stage: Stage) -> float:
        w, latent, index, _ = _stage_bytes(cfg, roles, stage, s)
        return float(w + latent + index)

    costs = [cost(Stage(0, 0, 0, n, n, 1)) for n in range(1, cfg.num_hidden_layers + 1)]
    first = cost(Stage(0, 0, 0, None, None, 0, embedding=True))
    last = cost(Stage(0, 0, 0, None, None, 0, loss=True, mtp_layers=mtp_layers))
    return costs, first, last
