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

Sources (NVIDIA/Megatron-LM): ``megatron/training/arguments.py: validate_args`` (SP disabled
with a warning when TP = 1; MTP refused with CP; ``--optimizer-cpu-offload`` needs
``--use-precision-aware-optimizer``; global batch divisible by ``mbs * DP``),
``megatron/core/model_parallel_config.py`` (EP > 1 and TP > 1 need SP),
``megatron/core/parallel_state.py`` (world and expert grid divisibility),
``megatron/core/pipeline_parallel/schedules.py`` (interleaving), Transformer Engine context
parallelism (load-balanced CP splits each sequence into ``2 * CP`` chunks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.core.model.hardware import ALIASES as HARDWARE_ALIASES
from app.core.model.hardware import CATALOGUE
from app.core.model_config import ModelConfig
from app.core.stages import PipelineSpec, StagePlan

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
#: bytes per element of the optimizer dtypes Megatron's precision-aware optimizer accepts
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
_MAIN_GRADS = ("fp32", "bf16")
_MAIN_PARAMS = ("fp32", "fp16")
_EXP_AVG = ("fp32", "fp16", "bf16", "fp8")


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
            raise ValueError("gpu 'custom' needs gpu_capacity_bytes > 0 (bytes per GPU)")
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

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int | None = None
    gpus: int | None = None
    ep: int = 1
    etp: int | None = None  # default: tp
    vpp: int | None = None
    sp: bool = False
    mbs: int = 1
    num_microbatches: int | None = None
    global_batch: int | None = None
    seq_length: int | None = None
    tokens_per_gpu: int | None = None  # slime --max-tokens-per-gpu
    recompute: str = "none"  # none | selective | full
    recompute_method: str = "uniform"  # uniform | block (full recompute only)
    recompute_num_layers: int = 1
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

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "ep", "mbs", "recompute_num_layers", "gpus_per_node",
                     "make_vocab_size_divisible_by"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        for name in ("dp", "gpus", "etp", "vpp", "num_microbatches", "global_batch", "seq_length",
                     "tokens_per_gpu", "gpu_capacity_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a whole number >= 1 when given, got {v!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ValueError(f"recompute_method must be one of {RECOMPUTE_METHODS}, got {self.recompute_method!r}")
        if isinstance(self.host_memory_gb, bool) or not isinstance(self.host_memory_gb, (int, float)) \
                or not self.host_memory_gb > 0:
            raise ValueError(f"host_memory_gb must be a number > 0 (GB of host memory per node), "
                             f"got {self.host_memory_gb!r}")
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise ValueError(f"optimizer_offload_fraction must be in [0, 1], got {self.optimizer_offload_fraction}")
        for name, allowed in (("main_grads_dtype", _MAIN_GRADS), ("main_params_dtype", _MAIN_PARAMS),
                              ("exp_avg_dtype", _EXP_AVG), ("exp_avg_sq_dtype", _EXP_AVG)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.seq_length is None and self.tokens_per_gpu is None:
            raise ValueError("give seq_length (tokens per sample) or tokens_per_gpu (--max-tokens-per-gpu)")
        resolve_gpu(self.gpu, self.gpu_capacity_bytes)

    # ---------------------------------------------------------------- derived sizes

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def model_parallel(self) -> int:
        """TP * CP * PP: GPUs of one data-parallel replica."""
        return self.tp * self.cp * self.pp

    @property
    def data_parallel(self) -> int:
        if self.dp is not None:
            return self.dp
        if self.gpus is not None:
            return max(1, self.gpus // self.model_parallel)
        return 1

    @property
    def world(self) -> int:
        """TP * CP * PP * DP (the GPU count the launch needs)."""
        return self.model_parallel * self.data_parallel

    @property
    def expert_grid_size(self) -> int:
        return self.expert_tp * self.ep * self.pp

    @property
    def edp(self) -> int:
        """Expert data parallel = world / (ETP * EP * PP) (floored at 1 when it does not divide)."""
        return max(1, self.world // self.expert_grid_size)

    @property
    def expert_grid(self) -> dict[str, int]:
        return {"etp": self.expert_tp, "ep": self.ep, "pp": self.pp, "edp": self.edp}

    @property
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
        out = asdict(self)
        out.update({
            "etp": self.expert_tp, "dp": self.data_parallel, "gpus": self.world, "edp": self.edp,
            "expert_grid": self.expert_grid, "microbatches": self.microbatches,
            "tokens_per_microbatch": self.tokens_per_microbatch, "sample_length": self.sample_length,
        })
        return out


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    level: str = "error"  # error | warning | info
    warning: bool = False  # a warning-level caveat applies

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "level": self.level, "warning": self.warning,
                "message": self.message}


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


def kv_heads_tp_check(cfg: ModelConfig, par: ParallelConfig) -> Check | None:
    """GQA: the key-value heads g must be a multiple or a divisor of TP (NVIDIA/Megatron-LM
    ``megatron/core/transformer/transformer_config.py`` ``__post_init__`` raises "num_query_groups
    (g) must be a multiple or divisor of tensor_model_parallel_size"). ``None`` for MLA models.
    Not yet part of :func:`check_parallel` (its owner wires it in)."""
    if cfg.attention != "gqa":
        return None
    g, tp = cfg.num_key_value_heads, par.tp
    if g % tp == 0 or tp % g == 0:
        per_gpu = f"{g // tp} per GPU" if g % tp == 0 else f"each of the {g} replicated over {tp // g} GPUs"
        return Check("kv_heads_tp", True, f"{g} key-value heads with TP={tp}: {per_gpu}")
    ok = [t for t in divisors(cfg.num_attention_heads) if g % t == 0 or t % g == 0]
    below = max((t for t in ok if t < tp), default=None)
    above = min((t for t in ok if t > tp), default=None)
    return Check("kv_heads_tp", False,
                 f"TP={tp} is neither a multiple nor a divisor of the {g} key-value heads (Megatron raises "
                 f"'num_query_groups must be a multiple or divisor of tensor_model_parallel_size'); "
                 f"try TP={_try((below, above))}")


def check_parallel(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None = None) -> list[Check]:
    """Every constraint of FACTS.md section 3 (and the Megatron flags around it) as a named check.

    Messages follow NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553:
    ``megatron/training/arguments.py: validate_args`` (interleaving needs PP > 1 with the default
    ``overlap_p2p_comm``, PP > 2 with ``--no-overlap-p2p-communication``; MTP with CP is not
    refused), ``megatron/core/model_parallel_config.py: __post_init__`` (EP and TP without SP only
    warns) and ``megatron/core/transformer/moe/moe_layer.py: MoELayer.forward`` (training MoE with
    TP > 1 and no SP raises ValueError, for any EP); CP all-gather is ``--cp-comm-type allgather``.
    """
    out: list[Check] = []
    tp, cp, pp, ep, etp = par.tp, par.cp, par.pp, par.ep, par.expert_tp
    mp = par.model_parallel
    heads, experts = cfg.num_attention_heads, cfg.n_routed_experts
    mtp = plan.mtp_layers if plan is not None else cfg.num_nextn_predict_layers

    # world size ---------------------------------------------------------------------------
    if par.gpus is not None and par.gpus % mp != 0:
        lo = (par.gpus // mp) * mp
        hi = lo + mp
        out.append(Check("world_size", False,
                         f"{par.gpus} GPUs is not a multiple of TP*CP*PP = {tp}*{cp}*{pp} = {mp}; "
                         f"use {_try((lo or None, hi))} GPUs, or change TP/CP/PP"))
    elif par.gpus is not None and par.dp is not None and par.gpus != mp * par.dp:
        out.append(Check("world_size", False,
                         f"gpus = {par.gpus} but TP*CP*PP*DP = {mp}*{par.dp} = {mp * par.dp}; "
                         f"give DP = {par.gpus // mp} or {mp * par.dp} GPUs"))
    else:
        out.append(Check("world_size", True,
                         f"world = TP*CP*PP*DP = {tp}*{cp}*{pp}*{par.data_parallel} = {par.world} GPUs"))

    # attention heads over TP ----------------------------------------------------------------
    if heads % tp != 0:
        out.append(Check("heads_tp", False,
                         f"TP={tp} does not divide {heads} attention heads; try TP={_try(nearest_divisors(heads, tp))}"))
    else:
        out.append(Check("heads_tp", True, f"{heads} attention heads / TP={tp} = {heads // tp} per GPU"))
    kv = kv_heads_tp_check(cfg, par)  # GQA only
    if kv is not None:
        out.append(kv)

    # dense FFN / shared expert widths over TP, expert FFN over ETP ------------------------------
    widths = [("intermediate_size", cfg.intermediate_size, tp, "TP"),
              ("shared expert width", cfg.n_shared_experts * cfg.moe_intermediate_size, tp, "TP"),
              ("moe_intermediate_size", cfg.moe_intermediate_size, etp, "ETP")]
    bad = [(name, w, d, f) for name, w, d, f in widths if w and w % d != 0]
    if bad:
        name, w, d, f = bad[0]
        out.append(Check("ffn_width", False,
                         f"{f}={d} does not divide the {name} {w}; try {f}={_try(nearest_divisors(w, d))}"))
    else:
        out.append(Check("ffn_width", True, "FFN widths divide by TP (dense, shared expert) and ETP (experts)"))

    # experts over EP ---------------------------------------------------------------------------
    if experts:
        if experts % ep != 0:
            out.append(Check("experts_ep", False,
                             f"EP={ep} does not divide {experts} experts; try {_try(nearest_divisors(experts, ep))}"))
        else:
            out.append(Check("experts_ep", True, f"{experts} experts / EP={ep} = {experts // ep} per GPU"))
    elif ep > 1:
        out.append(Check("experts_ep", False, f"EP={ep} needs a MoE model; this config has no routed experts, use EP=1"))

    # expert grid -------------------------------------------------------------------------------
    grid = par.expert_grid_size
    if par.world % grid != 0:
        cands = [d for d in divisors(max(1, par.world // max(1, etp * pp))) if not experts or experts % d == 0]
        below = max((d for d in cands if d < ep), default=None)
        above = min((d for d in cands if d > ep), default=None)
        out.append(Check("expert_grid", False,
                         f"ETP*EP*PP = {etp}*{ep}*{pp} = {grid} does not divide the world of {par.world} GPUs; "
                         f"try EP={_try((below, above))} or change ETP"))
    else:
        out.append(Check("expert_grid", True,
                         f"ETP*EP*PP = {etp}*{ep}*{pp} = {grid} divides the world of {par.world} GPUs"))
    if par.world % grid == 0:
        edp_msg = (f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} = {par.edp}: routed-expert optimizer state "
                   f"is sharded {par.edp} way(s)")
        if par.edp == 1 and experts:
            edp_msg += " (not at all: every GPU keeps full FP32 master + Adam state of its experts)"
    else:
        edp_msg = (f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} is not a whole number, so there is no expert "
                   "data-parallel group until the expert grid divides the world")
    out.append(Check("expert_data_parallel", par.world % grid == 0, edp_msg, level="info"))

    # context parallelism -------------------------------------------------------------------------
    if cp > 1:
        s = par.sample_length
        if s % (2 * cp) != 0:
            lo = (s // (2 * cp)) * 2 * cp
            out.append(Check("cp_seq", False,
                             f"sequence length {s} is not divisible by 2*CP = {2 * cp} (load-balanced CP splits each "
                             f"sequence into 2*CP chunks); pad to {lo + 2 * cp}" + (f" or cut to {lo}" if lo else "")))
        else:
            out.append(Check("cp_seq", True, f"sequence length {s} divides by 2*CP = {2 * cp}"))
        if cfg.has_indexer:
            out.append(Check("dsa_cp", True,
                             f"DSA with CP={cp} needs the all-gather CP layout: --cp-comm-type allgather in "
                             "Megatron, --allgather-cp in slime (as its GLM-5.2 script sets)",
                             level="warning", warning=True))

    # sequence parallelism --------------------------------------------------------------------------
    if par.sp and tp == 1:
        out.append(Check("sp_tp", True,
                         "sequence parallelism needs TP > 1; with TP=1 Megatron turns it off with a warning "
                         "(drop --sequence-parallel)", level="warning", warning=True))
    if experts and tp > 1 and not par.sp:
        out.append(Check("sp_moe_tp", False,
                         f"MoE with TP={tp} and no --sequence-parallel: Megatron-Core's ModelParallelConfig only "
                         "warns (model_parallel_config.py, EP > 1 and TP > 1), but MoELayer.forward raises "
                         "ValueError during training for any EP (megatron/core/transformer/moe/moe_layer.py, "
                         "'performance may degrade if MoE and tensor parallelism are enabled without also "
                         "enabling sequence parallelism'); add --sequence-parallel"))
    elif experts and tp > 1:
        out.append(Check("sp_moe_tp", True, f"sequence parallelism is on with MoE and TP={tp}", level="warning"))

    # MTP with CP: accepted (validate_args no longer refuses it; FACTS.md section 3) -----------------
    if mtp and cp > 1:
        out.append(Check("mtp_cp", True,
                         f"MTP ({mtp} layer(s)) with CP={cp}: accepted by Megatron's validate_args "
                         "(NVIDIA/Megatron-LM megatron/training/arguments.py @ d98e8a6 has no MTP/CP refusal)",
                         level="info"))

    # pipeline ---------------------------------------------------------------------------------------
    v = par.vpp or 1
    overlap = bool(getattr(par, "overlap_p2p", True))   # Megatron's overlap_p2p_comm defaults to on
    need = 1 if overlap else 2
    if v > 1 and pp <= need:
        out.append(Check("interleave_pp", False,
                         f"VPP={v} interleaves stages, which needs PP > {need}"
                         + ("" if overlap else " with --no-overlap-p2p-communication (PP > 1 without it)")
                         + f"; PP is {pp}: raise PP or drop VPP (megatron/training/arguments.py validate_args)"))
    elif v > 1:
        out.append(Check("interleave_pp", True, f"interleaving VPP={v} with PP={pp} > {need}"))
    if plan is not None:
        if plan.pp != pp:
            out.append(Check("pipeline_plan", False,
                             f"the stage plan has PP={plan.pp} but the parallel config has PP={pp}; use one PP"))
        elif (plan.vpp or 1) != v:
            out.append(Check("pipeline_plan", False,
                             f"the stage plan has VPP={plan.vpp} but the parallel config has VPP={v}; use one VPP"))
        elif plan.errors or not plan.stages:
            msg = "; ".join(e.message for e in plan.errors) or "the pipeline plan has no stages"
            out.append(Check("pipeline_plan", False, msg))
        else:
            out.append(Check("pipeline_plan", True,
                             f"{len(plan.stages)} stage(s): layers per rank "
                             f"{[sum(s.num_layers for s in plan.rank_stages(r)) for r in range(pp)]}"))
    elif v > 1:
        n = cfg.num_hidden_layers
        if n % pp != 0 or (n // pp) % v != 0:
            out.append(Check("vpp_divides", False,
                             f"{n} layers over PP={pp} x VPP={v} do not split evenly; per-rank layers must divide "
                             f"by VPP: try VPP={_try(nearest_divisors(n // pp, v)) if n % pp == 0 else 1} or give a stage plan"))
        else:
            out.append(Check("vpp_divides", True, f"{n // pp} layers per rank divide by VPP={v}"))

    # micro-batches ---------------------------------------------------------------------------------
    dp = par.data_parallel
    if par.global_batch is not None:
        unit = par.mbs * dp
        if par.global_batch % unit != 0:
            lo = (par.global_batch // unit) * unit
            out.append(Check("global_batch", False,
                             f"global batch {par.global_batch} is not divisible by mbs*DP = {par.mbs}*{dp} = {unit}; "
                             f"use {_try((lo or None, lo + unit))}"))
        else:
            out.append(Check("global_batch", True,
                             f"global batch {par.global_batch} = {par.global_batch // unit} micro-batches x mbs {par.mbs} x DP {dp}"))
        if par.num_microbatches is not None and par.num_microbatches * unit != par.global_batch:
            out.append(Check("microbatches", False,
                             f"num_microbatches {par.num_microbatches} disagrees with global batch "
                             f"{par.global_batch}/(mbs*DP) = {par.global_batch / unit:g}; give one of them"))
    m = par.microbatches
    if m is not None and v > 1 and m % pp != 0:
        out.append(Check("interleave_microbatches", True,
                         f"{m} micro-batches is not a multiple of PP={pp}; older Megatron interleaved schedules "
                         f"refuse it: use {_try(((m // pp) * pp or None, (m // pp + 1) * pp))}",
                         level="warning", warning=True))
    if m is not None and pp > 1 and m < pp:
        out.append(Check("pipeline_fill", True,
                         f"{m} micro-batches < PP={pp}: the pipeline never fills (bubble "
                         f"{(pp - 1) / (v * m + pp - 1):.0%}); use at least {pp}", level="warning", warning=True))

    # recompute -------------------------------------------------------------------------------------
    if par.recompute == "full" and plan is not None and plan.stages:
        biggest = max(s.num_layers for s in plan.stages)
        if par.recompute_method == "block" and par.recompute_num_layers > biggest:
            out.append(Check("recompute_layers", False,
                             f"--recompute-num-layers {par.recompute_num_layers} exceeds the {biggest} layers of the "
                             f"largest virtual stage (block method); use at most {biggest}"))

    # optimizer flags ----------------------------------------------------------------------------------
    if par.optimizer_cpu_offload and not par.use_precision_aware_optimizer:
        out.append(Check("cpu_offload_flags", False,
                         "--optimizer-cpu-offload must be used with --use-precision-aware-optimizer (Megatron "
                         "validate_args); add --use-precision-aware-optimizer"))
    lowered = [n for n in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
               if getattr(par, n) != "fp32"]
    if lowered and not par.use_precision_aware_optimizer:
        out.append(Check("precision_aware_dtypes", False,
                         f"lowered optimizer dtypes ({', '.join(lowered)}) need --use-precision-aware-optimizer; add it"))
    if (par.optimizer_cpu_offload or lowered) and not par.distributed_optimizer:
        out.append(Check("distributed_optimizer", False,
                         "--use-precision-aware-optimizer / --optimizer-cpu-offload need --use-distributed-optimizer; add it"))
    return out


def parallel_report(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None = None) -> dict[str, Any]:
    """JSON-ready: the config, ``gpus``, ``expert_grid`` and the checks."""
    checks = check_parallel(cfg, par, plan)
    return {
        "gpus": par.world,
        "dp": par.data_parallel,
        "expert_grid": par.expert_grid,
        "ok": all(c.ok for c in checks),
        "checks": [c.to_dict() for c in checks],
        "config": par.to_dict(),
    }


def slime_glm52_training() -> tuple[PipelineSpec, ParallelConfig]:
    """The slime GLM-5.2 training profile (THUDM/slime ``scripts/run-glm5.2-744B-A40B.sh``, FACTS.md
    section 1): TP4 CP8 PP8 (first 14, last 16) EP32 ETP1 SP on 256 H100s, full uniform recompute of
    1 layer, ``--max-tokens-per-gpu 8192``, mbs 1, distributed optimizer with
    ``--optimizer-cpu-offload --use-precision-aware-optimizer``."""
    spec = PipelineSpec(pp=8, first=14, last=16)
    par = ParallelConfig(tp=4, cp=8, pp=8, gpus=256, ep=32, etp=1, sp=True, mbs=1, tokens_per_gpu=8192,
                         recompute="full", recompute_method="uniform", recompute_num_layers=1,
                         optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                         distributed_optimizer=True, gpu="h100-80gb")
    return spec, par
