"""Training parallelism: one :class:`ParallelConfig` and every Megatron constraint as a named check.

A :class:`ParallelConfig` describes one Megatron(-Core) / slime training launch: TP, CP, PP, DP
(or the total ``gpus`` from which DP follows), EP, ETP, VPP, sequence parallelism, micro-batching,
tokens per micro-batch, activation recomputation, the optimizer flags that change memory, and the
GPU. :func:`check_parallel` turns the constraints of FACTS.md section 3 (and the Megatron argument
checks they come from) into :class:`Check` objects, each with a message that says how to fix it.

Conventions
-----------
* ``world = TP * CP * PP * DP`` (Megatron ``initialize_model_parallel``). When ``gpus`` is given,
  DP is ``gpus / (TP * CP * PP)`` and must divide; when neither ``dp`` nor ``gpus`` is given DP is 1.
* MoE parallel folding: the expert grid is ``ETP * EP * PP`` and must divide the world;
  ``EDP = world / (ETP * EP * PP)`` is the data-parallel group of the routed experts (their
  distributed-optimizer shard group). ``ETP`` defaults to ``TP`` as in Megatron.
* Tokens per GPU per micro-batch ``t``: ``mbs * seq_length / CP``; or, with slime's
  ``--max-tokens-per-gpu`` (``tokens_per_gpu``), exactly that number (slime packs each micro-batch
  up to it after the CP split, so ``mbs`` does not multiply it). The per-sample length used by
  the CP divisibility check is ``seq_length``, or ``tokens_per_gpu * CP``.
* Micro-batches per step ``m``: ``num_microbatches``, or ``global_batch / (mbs * DP)``;
  ``None`` when neither is given (memory then assumes ``m >= PP``, the worst case).

Check levels: ``error`` checks are Megatron (or slime) refusals; ``ok`` is False when they fail.
``warning`` checks never fail (``ok`` stays True, so a launch that slime runs successfully passes);
their ``warning`` flag is set and the message explains the caveat when it applies. ``info`` checks
report derived values (EDP).

GPU capacity convention: vendor decimal gigabytes, ``capacity = N * 10**9`` bytes: H100 80GB =
80e9, H200 = 141e9, B200 = 180e9, MI300X = 192e9; ``custom`` takes ``gpu_capacity_bytes``. This is
deliberately conservative: an H100 80GB reports 81,559 MiB (about 85.5e9 bytes) in ``nvidia-smi``,
of which the CUDA context, NCCL buffers and allocator fragmentation take a few GB that the
memory model does not itemise; the headroom must absorb them.

The constraints themselves are Megatron's rules, one function each with the source line it was
read from, in :mod:`app.core.engines.megatron.parallel`; the settings here use Megatron's defaults
(``recompute_method`` / ``recompute_num_layers`` ``None`` unless given, ``recompute_modules``
``["core_attn"]`` under selective, ``cp_comm_type`` p2p: one type, or one per layer comma-joined).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from app.core.content_cache import hash_once, state_without_hash
from app.core.model.hardware import ALIASES as HARDWARE_ALIASES
from app.core.model.hardware import CATALOGUE, CustomGpuError

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
#: bytes per element of the optimizer dtypes Megatron's precision-aware optimizer accepts
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
#: the precision-aware optimizer's dtype choices as Megatron's parser offers them
#: (``--main-grads-dtype`` / ``--main-params-dtype`` / ``--exp-avg(-sq)-dtype``,
#: ``app/core/data/megatron_arguments.txt`` @ d98e8a64)
MAIN_GRADS_DTYPES = ("fp32", "bf16")
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
EXP_AVG_DTYPES = ("fp32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class GpuPreset:
    id: str
    label: str
    capacity_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "capacity_bytes": self.capacity_bytes,
                "capacity_gb": self.capacity_bytes / 1e9, "capacity_gib": self.capacity_bytes / 2**30}


#: Vendor decimal capacities (see the module docstring), read from the one GPU catalogue
#: (:mod:`app.core.model.hardware`).
GPU_PRESETS: dict[str, GpuPreset] = {
    hw.id: GpuPreset(hw.id, f"{hw.name} ({hw.hbm_bytes // 10**9}e9 bytes)", hw.hbm_bytes) for hw in CATALOGUE.values()
}
GPU_ALIASES = dict(HARDWARE_ALIASES)


def resolve_gpu(gpu: str, capacity_bytes: int | None = None) -> GpuPreset:
    """A preset by id (or short alias), or ``custom`` with ``capacity_bytes``."""
    key = GPU_ALIASES.get(gpu, gpu)
    if key == "custom":
        if capacity_bytes is None or capacity_bytes <= 0:
            raise CustomGpuError("--gpu custom needs the GPU's capacity: give --gpu-memory-gb GB "
                                 "(URL key gpu_memory_gb), e.g. 80", "gpu_memory_gb")
        return GpuPreset("custom", f"custom ({capacity_bytes / 1e9:g} GB)", int(capacity_bytes))
    if key not in GPU_PRESETS:
        raise ValueError(f"unknown gpu {gpu!r}; use one of {', '.join(GPU_PRESETS)} or 'custom'")
    preset = GPU_PRESETS[key]
    if capacity_bytes is not None:
        return GpuPreset(preset.id, preset.label + f" overridden to {capacity_bytes / 1e9:g} GB", int(capacity_bytes))
    return preset


@dataclass(frozen=True)
class ParallelConfig:
    """One training launch. Sizes are Megatron's flags; see the module docstring for derived values."""

    __hash__ = hash_once  # hashed once: a launch is in the cache keys of every pipeline rank's memory
    __getstate__ = state_without_hash

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int | None = None
    gpus: int | None = None
    ep: int = 1
    etp: int | None = None  # default: tp
    vpp: int | None = None
    #: Megatron's ``overlap_p2p_comm`` (on by default; ``--no-overlap-p2p-communication``)
    overlap_p2p_comm: bool = True
    sp: bool = False
    mbs: int = 1
    num_microbatches: int | None = None
    global_batch: int | None = None
    seq_length: int | None = None
    tokens_per_gpu: int | None = None  # slime --max-tokens-per-gpu
    recompute: str = "none"  # none | selective | full
    #: ``--recompute-method`` uniform | block, ``None`` when not given (Megatron's default; full
    #: recompute then is refused, selective recompute refuses a method: engines/megatron/parallel.py)
    recompute_method: str | None = None
    recompute_num_layers: int | None = None  # --recompute-num-layers (None: not given)
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    distributed_optimizer: bool = True
    gpu: str = "h100-80gb"
    gpu_capacity_bytes: int | None = None
    #: Megatron ``OptimizerConfig.store_param_remainders`` (default True; False on Transformer
    #: Engine < 2.1): with ``--use-precision-aware-optimizer`` and BF16 params the FP32 master
    #: weight is stored as its 16-bit remainder (NVIDIA/Megatron-LM
    #: ``megatron/core/optimizer/optimizer_config.py``, ``distrib_optimizer.py`` ``init_shard(torch.int16)``).
    store_param_remainders: bool = True
    #: GPUs per node and host memory per node, for ``--optimizer-cpu-offload`` (DGX H100: 8 GPUs, 2 TB).
    gpus_per_node: int = 8
    host_memory_gb: float = 2048.0
    #: Megatron ``--make-vocab-size-divisible-by`` (``megatron/training/arguments.py``, default 128).
    make_vocab_size_divisible_by: int = 128
    #: bytes per routed-expert weight on the GPU: 2 (BF16), or the low-precision copy the FP8 / FP4
    #: recipes keep instead with ``--fp8-param-gather`` / ``--fp4-param-gather`` (Megatron-Bridge's
    #: presets; ``app/core/time/precision.py``). Dense weights, norms and embeddings stay at 2 B here
    #: (conservative: TE keeps some of them in BF16).
    expert_weight_bytes: float = 2.0
    #: ``--recompute-modules`` under selective recompute (``None``: Megatron's default ``["core_attn"]``,
    #: ``transformer_config.py:1940-1941``); ``--distribute-saved-activations``; ``--moe-grouped-gemm``
    recompute_modules: tuple[str, ...] | None = None
    distribute_saved_activations: bool = False
    moe_grouped_gemm: bool = False
    #: ``--cp-comm-type`` (one type for every layer) and ``--hierarchical-context-parallel-sizes``
    cp_comm_type: str = "p2p"
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    #: ``--max-position-embeddings`` (None: not given)
    max_position_embeddings: int | None = None
    #: the job's attention as its flags build it, when it states them (None: the config's):
    #: ``--multi-latent-attention``, and the query groups Megatron uses (``--num-query-groups`` with
    #: ``--group-query-attention``, else the head count)
    multi_latent_attention: bool | None = None
    query_groups: int | None = None
    #: the overlap switches, ``--fp8-output-proj`` and the GEMM precision (``--precision``), for
    #: Megatron's refusals of them (engines/megatron/parallel.py)
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    moe_token_dispatcher_type: str | None = None  # --moe-token-dispatcher-type (None: not given)
    fp8_output_proj: bool = False
    precision: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "ep", "mbs", "gpus_per_node", "make_vocab_size_divisible_by"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        for name in ("dp", "gpus", "etp", "vpp", "num_microbatches", "global_batch", "seq_length",
                     "tokens_per_gpu", "gpu_capacity_bytes", "recompute_num_layers", "max_position_embeddings",
                     "query_groups"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a whole number >= 1 when given, got {v!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.recompute_method is not None and self.recompute_method not in RECOMPUTE_METHODS:
            raise ValueError(f"recompute_method must be one of {RECOMPUTE_METHODS}, got {self.recompute_method!r}")
        if isinstance(self.host_memory_gb, bool) or not isinstance(self.host_memory_gb, (int, float)) \
                or not self.host_memory_gb > 0:
            raise ValueError(f"host_memory_gb must be a number > 0 (GB of host memory per node), "
                             f"got {self.host_memory_gb!r}")
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise ValueError(f"optimizer_offload_fraction must be in [0, 1], got {self.optimizer_offload_fraction}")
        for name, allowed in (("main_grads_dtype", MAIN_GRADS_DTYPES), ("main_params_dtype", MAIN_PARAMS_DTYPES),
                              ("exp_avg_dtype", EXP_AVG_DTYPES), ("exp_avg_sq_dtype", EXP_AVG_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.seq_length is None and self.tokens_per_gpu is None:
            raise ValueError("give seq_length (tokens per sample) or tokens_per_gpu (--max-tokens-per-gpu)")
        resolve_gpu(self.gpu, self.gpu_capacity_bytes)

    # ---------------------------------------------------------------- derived sizes

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules selective recompute recomputes: ``--recompute-modules``, else Megatron's default
        ``["core_attn"]`` (``transformer_config.py:1940-1941``); none unless the granularity is selective."""
        if self.recompute != "selective":
            return ()
        return self.recompute_modules if self.recompute_modules is not None else ("core_attn",)

    @cached_property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @cached_property
    def model_parallel(self) -> int:
        """TP * CP * PP: GPUs of one data-parallel replica."""
        return self.tp * self.cp * self.pp

    @cached_property
    def data_parallel(self) -> int:
        if self.dp is not None:
            return self.dp
        if self.gpus is not None:
            return max(1, self.gpus // self.model_parallel)
        return 1

    @cached_property
    def world(self) -> int:
        """TP * CP * PP * DP (the GPU count the launch needs)."""
        return self.model_parallel * self.data_parallel

    @cached_property
    def expert_grid_size(self) -> int:
        return self.expert_tp * self.ep * self.pp

    @cached_property
    def edp(self) -> int:
        """Expert data parallel = world / (ETP * EP * PP) (floored at 1 when it does not divide)."""
        return max(1, self.world // self.expert_grid_size)

    @property
    def expert_grid(self) -> dict[str, int]:
        return {"etp": self.expert_tp, "ep": self.ep, "pp": self.pp, "edp": self.edp}

    @cached_property
    def dense_optimizer_shards(self) -> int:
        """Shard group of the distributed optimizer for non-expert params: DP * CP."""
        return self.data_parallel * self.cp

    @property
    def microbatches(self) -> int | None:
        if self.num_microbatches is not None:
            return self.num_microbatches
        if self.global_batch is not None:
            return max(1, self.global_batch // (self.mbs * self.data_parallel))
        return None

    @property
    def tokens_per_microbatch(self) -> int:
        """Tokens one GPU holds per micro-batch after the CP split (before the SP split)."""
        if self.tokens_per_gpu is not None:
            return self.tokens_per_gpu
        assert self.seq_length is not None
        return -(-self.mbs * self.seq_length // self.cp)

    @property
    def sample_length(self) -> int:
        """Tokens of one sample (packed micro-batch) over the whole CP group."""
        if self.seq_length is not None:
            return self.seq_length
        assert self.tokens_per_gpu is not None
        return self.tokens_per_gpu * self.cp

    @property
    def host_capacity_bytes(self) -> int:
        """Host memory of one node in bytes (``host_memory_gb`` decimal GB)."""
        return int(self.host_memory_gb * 10**9)

    @property
    def gpus_per_pp_rank(self) -> int:
        """GPUs that hold one pipeline rank: ``world / PP`` = TP * CP * DP."""
        return self.world // self.pp

    @property
    def precision_aware_master_bytes(self) -> int | None:
        """Bytes of one FP32 master weight on the GPU with ``--use-precision-aware-optimizer``
        and BF16 params: 2 (its 16-bit remainder; the other 16 bits are the BF16 param) when
        ``store_param_remainders`` and ``main_params_dtype`` is fp32, else ``None`` (dtype size)."""
        if self.use_precision_aware_optimizer and self.store_param_remainders and self.main_params_dtype == "fp32":
            return 2
        return None

    @property
    def gpu_preset(self) -> GpuPreset:
        return resolve_gpu(self.gpu, self.gpu_capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, then the derived sizes. The fields are flat (numbers, strings and tuples of
        them), so a field copy is :func:`dataclasses.asdict`'s answer without its recursion (a
        quarter of a training memory estimate's time). Built once per launch (an evaluation asks
        ~15 times); each call returns a fresh copy."""
        found = self.__dict__.get("_dict")
        if found is None:
            found = {f.name: getattr(self, f.name) for f in fields(self)}
            found.update({
                "etp": self.expert_tp, "dp": self.data_parallel, "gpus": self.world, "edp": self.edp,
                "expert_grid": self.expert_grid, "microbatches": self.microbatches,
                "tokens_per_microbatch": self.tokens_per_microbatch, "sample_length": self.sample_length,
            })
            self.__dict__["_dict"] = found
        return {**found, "expert_grid": dict(found["expert_grid"])}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    level: str = "error"  # error | warning | info
    warning: bool = False  # a warning-level caveat applies
    field: str | None = None  # the plan field (URL key) that fixes it
    kind: str = "parallel"  # the verdict kind of a failure: parallel, or gpus (the GPU budget)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "level": self.level, "warning": self.warning,
                "message": self.message, "field": self.field}


# --------------------------------------------------------------------------- helpers


def divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def nearest_divisors(n: int, x: int) -> tuple[int | None, int | None]:
    """The largest divisor of ``n`` below ``x`` and the smallest above it."""
    ds = divisors(n)
    below = max((d for d in ds if d < x), default=None)
    above = min((d for d in ds if d > x), default=None)
    return below, above


def _try(values: tuple[int | None, int | None]) -> str:
    vs = [str(v) for v in values if v is not None]
    return " or ".join(vs) if vs else "another value"


# --------------------------------------------------------------------------- checks
