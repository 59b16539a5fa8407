"""The launch settings the time model reads: Megatron's flags, validated, with Megatron's defaults.

Defaults are Megatron-LM's at commit d98e8a64ddf3 unless stated: ``overlap_grad_reduce`` and
``overlap_param_gather`` off (``megatron/core/distributed/distributed_data_parallel_config.py``:
``overlap_grad_reduce: bool = False``, ``overlap_param_gather: bool = False``), ``tp_comm_overlap``
off (``model_parallel_config.py``), ``--overlap-moe-expert-parallel-comm`` off, the distributed
optimizer on (isplan's memory model assumes it, as every recipe it models uses it),
``recompute_modules`` ``["core_attn"]`` when the granularity is ``selective``
(``transformer_config.py`` ``__post_init__``), ``--cp-comm-type p2p`` (``arguments.py``),
``microbatch_group_size_per_vp_stage`` = PP. ``moe_dispatcher`` defaults to ``flex`` (DeepEP /
HybridEP), which Megatron-Bridge's v0.6.0 performance recipes use for cross-node expert parallelism
(``src/megatron/bridge/perf_recipes/deepseek/common.py``, ``kimi/*``, ``qwen/b300``; Megatron-LM's own
default is ``allgather``). ``grad_reduce_in_fp32`` is off: Megatron-LM's default (``--accumulate-allreduce-grads-in-fp32`` is
opt-in, ``arguments.py``) and what Megatron-Bridge's performance recipes launch today
(``src/megatron/bridge/perf_recipes/_common.py`` ``_benchmark_common`` and ``_perf_precision`` set
``grad_reduce_in_fp32 = False`` @ 067f987d; only the Kimi-K2 recipes turn it back on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.time.precision import PRECISIONS

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
#: ``recompute_modules`` choices the time model costs (``transformer_config.py``; the GatedDeltaProduct /
#: mHC modules belong to model families isplan does not load).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                     "gdn_norm_out")
CP_COMM_TYPES = ("p2p", "allgather", "a2a")
#: ``--moe-token-dispatcher-type``: ``flex`` (DeepEP / HybridEP: a token crosses to a remote NVLink
#: domain once) or ``alltoall`` / ``allgather`` (NCCL: every expert copy crosses).
MOE_DISPATCHERS = ("flex", "alltoall", "allgather")
#: ``--cuda-graph-impl`` forms the time model distinguishes: ``none`` (eager: the host issues every
#: op) and ``full_iteration`` (one graph replays the step's kernels; Megatron-LM
#: ``megatron/core/full_cuda_graph.py``); partial graphs (``transformer_engine`` / ``local`` with
#: scopes) are timed as eager, an upper bound on their host cost.
CUDA_GRAPHS = ("none", "full_iteration")


class TimeInputError(ValueError):
    """Settings the time model cannot use; ``field`` names the setting."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class TimeSettings:
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int | None = None  # default: tp (Megatron)
    dp: int = 1
    mbs: int = 1
    global_batch: int | None = None  # default: mbs * dp (one micro-batch per DP rank)
    seq_length: int = 4096
    sp: bool = False
    recompute: str = "none"  # none | selective | full (--recompute-granularity)
    recompute_method: str | None = None  # uniform | block (full only)
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] | None = None
    mtp_layers: int = 0
    precision: str = "bf16"
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    distributed_optimizer: bool = True
    optimizer_cpu_offload: bool = False
    cp_comm_type: str = "p2p"
    ep_comm_overlap: bool = False  # --overlap-moe-expert-parallel-comm
    fp8_attention: bool = False  # --fp8-dot-product-attention (the attention core in FP8)
    fp8_output_proj: bool = False  # --fp8-output-proj (the output layer in MXFP8; mxfp8 only)
    cuda_graph: str = "none"  # --cuda-graph-impl: none | full_iteration (the whole step replayed: no host issue cost)
    moe_dispatcher: str = "flex"  # --moe-token-dispatcher-type; flex = Megatron-Bridge's current recipes
    grad_reduce_in_fp32: bool = False
    microbatch_group: int | None = None  # --microbatch-group-size-per-virtual-pipeline-stage
    vocab_divisible_by: int = 128  # --make-vocab-size-divisible-by (Megatron's default 128)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ derived
    @property
    def etp_(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data parallelism: ``world / (ETP * EP * PP)`` (MoE parallel folding)."""
        return self.world // (self.etp_ * self.ep * self.pp)

    @property
    def gbs(self) -> int:
        return self.global_batch if self.global_batch is not None else self.mbs * self.dp

    @property
    def num_microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def modules(self) -> tuple[str, ...]:
        if self.recompute != "selective":
            return ()
        return self.recompute_modules if self.recompute_modules is not None else ("core_attn",)

    def validate(self, num_attention_heads: int | None = None, experts: int = 0) -> TimeSettings:
        """Fail closed: every refusal names the setting (exit 2 / a 422 upstream)."""
        for name in ("tp", "cp", "pp", "vpp", "ep", "dp", "mbs", "seq_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TimeInputError(f"{name} must be a whole number >= 1, got {v!r}", name)
        for name in ("etp", "global_batch", "recompute_num_layers", "microbatch_group", "vocab_divisible_by"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise TimeInputError(f"{name} must be a whole number >= 1, got {v!r}", name)
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or self.mtp_layers < 0:
            raise TimeInputError(f"mtp_layers must be a whole number >= 0, got {self.mtp_layers!r}", "mtp_layers")
        if self.precision not in PRECISIONS:
            raise TimeInputError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}",
                                 "precision")
        if self.recompute not in RECOMPUTE:
            raise TimeInputError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}",
                                 "recompute")
        if self.recompute_method is not None and self.recompute_method not in RECOMPUTE_METHODS:
            raise TimeInputError(f"recompute_method must be uniform or block, got {self.recompute_method!r}",
                                 "recompute_method")
        bad = sorted(set(self.recompute_modules or ()) - set(RECOMPUTE_MODULES))
        if bad:
            raise TimeInputError(f"recompute_modules {bad} are not modules the time model knows; "
                                 f"use {', '.join(RECOMPUTE_MODULES)}", "recompute_modules")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise TimeInputError(f"moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}", "moe_dispatcher")
        if self.fp8_output_proj and self.precision != "mxfp8":
            raise TimeInputError("fp8_output_proj needs precision mxfp8 (Megatron: \"fp8_output_proj requires "
                                 "fp8_recipe='mxfp8'\")", "precision")
        if self.fp8_attention and self.precision == "bf16":
            raise TimeInputError("fp8_attention needs an FP8 or FP4 precision (Megatron's fp8_dot_product_attention "
                                 "runs under --fp8-format)", "precision")
        if self.cuda_graph not in CUDA_GRAPHS:
            raise TimeInputError(f"cuda_graph must be one of {', '.join(CUDA_GRAPHS)}", "cuda_graph")
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise TimeInputError(f"cp_comm_type must be one of {', '.join(CP_COMM_TYPES)}", "cp_comm_type")
        if self.gbs % (self.mbs * self.dp):
            raise TimeInputError(
                f"global batch {self.gbs} is not divisible by micro-batch size x DP = {self.mbs} x {self.dp} "
                "(Megatron refuses it)", "global_batch")
        if (self.world % (self.etp_ * self.ep * self.pp)) != 0:
            raise TimeInputError(
                f"ETP x EP x PP = {self.etp_} x {self.ep} x {self.pp} does not divide the world of {self.world} GPUs",
                "ep")
        if num_attention_heads is not None and num_attention_heads % self.tp:
            raise TimeInputError(f"{num_attention_heads} attention heads are not divisible by TP {self.tp}", "tp")
        if experts and experts % self.ep:
            raise TimeInputError(f"{experts} experts are not divisible by EP {self.ep}", "ep")
        if self.ep > 1 and not experts:
            raise TimeInputError("EP > 1 needs a model with routed experts", "ep")
        if self.seq_length % self.cp or (self.cp > 1 and self.seq_length % (2 * self.cp)):
            raise TimeInputError(f"seq_length {self.seq_length} must be divisible by 2 x CP = {2 * self.cp}",
                                 "seq_length")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        out["recompute_modules"] = list(self.modules) if self.recompute == "selective" else None
        out.update(world=self.world, edp=self.edp, etp=self.etp_, global_batch=self.gbs,
                   num_microbatches=self.num_microbatches)
        return out
