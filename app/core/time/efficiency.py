"""The time model's physical constants: achieved fractions of peak, per GPU generation.

Every op's time is its work over a rate (:mod:`app.core.time.ops`, :mod:`app.core.time.comm`):

* GEMM ``t = 2MNK / (peak[dtype] * gemm[dtype]) + bytes / (hbm_bw * mem) + kernel``: the tensor
  rate reaches the fraction ``gemm[dtype]`` of the dense peak on large GEMMs; the operand and
  result traffic (``(MK + KN) * in_bytes + MN * out_bytes``) is added, so a small or skinny GEMM
  (an expert with few tokens, a LoRA-rank projection) runs at its arithmetic intensity's rate,
  below the ceiling. ``kernel`` is a fixed cost per kernel launch on the GPU stream.
* flash attention forward / backward: kernel FLOPs (backward = 2.5 x forward: five GEMMs against
  two) over ``peak[bf16] * attn_fwd`` / ``attn_bwd``.
* memory-bound kernels (norms, residual adds, activations, RoPE, quantisation casts, MoE
  permutation, cross-entropy, optimizer): bytes over ``hbm_bw * mem``.
* collectives: bytes over the link's bandwidth times ``nvlink`` / ``net`` (ring collectives) or
  ``a2a_nvlink`` / ``a2a_net`` (all-to-all), plus a latency per collective.

* routed experts' grouped GEMMs: the same with their own ceiling ``gemm_grouped[dtype]`` where
  stated (an op class of its own).

Fitted vs stated: see :data:`FITTED` (which constants were fitted, on which rows of
``bench/steptime_calibration.json`` and the development half of ``bench/steptime_holdout.json``,
by ``python -m bench.steptime --fit-dev``); every other value is stated from public kernel
measurements and is not tuned per model or per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import cast


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak for one GPU generation (module docstring)."""

    generation: str
    gemm: dict[str, float] = field(default_factory=dict)  # by GEMM dtype: bf16 | fp8 | fp4
    #: routed experts' grouped GEMMs by dtype (default: ``gemm``): one kernel over E/EP experts'
    #: problems reaches a smaller share of the peak than one large GEMM
    gemm_grouped: dict[str, float] = field(default_factory=dict)
    attn_fwd: float = 0.6
    attn_bwd: float = 0.45
    mem: float = 0.75
    kernel: float = 2e-6  # seconds of GPU-side gap per kernel (launch latency, tail)
    host_op: float = 20e-6  # seconds the host spends issuing one operation (eager mode)
    nvlink: float = 0.75
    net: float = 0.8
    a2a_nvlink: float = 0.8
    a2a_net: float = 0.85
    #: (forward, backward) share of ``attn_fwd`` / ``attn_bwd`` a flash kernel keeps at head
    #: dimension 64 (:func:`app.core.time.ops.head_dim_factor`); 1 where no measurement is stated
    attn_head64: tuple[float, float] = (1.0, 1.0)
    #: a GEMM kernel's output tile, (weight side, token side): the kernel computes whole tiles, so an
    #: output dimension that is not a multiple of its side pays for the rest of the last tile
    #: (:func:`app.core.time.ops.tile_factor`)
    gemm_tile: tuple[int, int] = (128, 128)
    #: the share of ``mem`` that a hybrid model's Mamba-2 kernels (mamba_ssm's Triton conv and SSD
    #: chunk kernels) reach on the bytes they move: fitted (:data:`FITTED`, :data:`SSD_BANDWIDTH`)
    ssd_bw: float = 1.0
    lat_nvlink: float = 10e-6
    lat_net: float = 25e-6
    #: the attention core as Megatron's unfused ``DotProductAttention`` (batched GEMMs over the whole
    #: ``s x s`` score matrix, which is written and re-read by the softmax and dropout kernels) rather
    #: than flash attention (:func:`app.core.time.ops.unfused_attention_seconds`)
    attn_unfused: bool = False

    def gemm_ceiling(self, dtype: str, grouped: bool = False) -> float:
        """The share of the dense ``dtype`` peak a large GEMM reaches (``grouped``: a routed-expert
        grouped GEMM, :attr:`gemm_grouped`, when stated)."""
        if grouped and dtype in self.gemm_grouped:
            return self.gemm_grouped[dtype]
        return self.gemm[dtype]

    def key(self) -> tuple[object, ...]:
        """Every constant, hashable (a cache key); built once (each evaluation asks for it twice:
        the layer costs' and the data-parallel terms' scope)."""
        found = self.__dict__.get("_key")
        if found is None:
            found = self.__dict__["_key"] = tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                                                  for v in (getattr(self, f.name) for f in fields(self)))
        return cast(tuple[object, ...], found)


#: All-to-all: DeepEP's dispatch / combine reach 726-740 GB/s "logical" NVLink bandwidth of 900 on
#: SM100 (EP 8) and 43-58 GB/s RDMA per 50 GB/s CX7 NIC on H800 (deepseek-ai/DeepEP README.md and
#: docs/legacy.md @ dd758caf): stated as 0.8 and 0.85 of the link.
#: Per generation. Stated values: flash attention forward ~60-70 % and backward ~45-50 % of the
#: BF16 peak on Hopper / Blackwell (FlashAttention-3 on H100: 740 TFLOPS fwd of 989, Dao et al. 2024,
#: arXiv 2407.08608; backward ~1.5-1.75x slower per FLOP), NCCL ring bus bandwidth ~75-80 % of the
#: NVLink line rate and ~80-90 % of the NIC rate (nccl-tests on DGX systems), memory-bound kernels
#: ~75 % of HBM bandwidth (STREAM-like copies on H100 / B200).
#: Fitted by ``python -m bench.steptime --fit-dev`` (least absolute log error, from the previous
#: values) on the six calibration rows and the 104 development rows - never the locked test rows
#: (see :data:`FITTED`); refitted in issue 18's fourth round with ``--tp-comm-overlap``'s
#: ring-exchange chunks (:data:`app.core.time.ops.UB_COLUMN`), which raised the dense ceilings.
#: Dense and grouped GEMMs are separate op classes on Blackwell: a grouped GEMM over the E/EP local
#: experts (one problem per expert, each with its tail wave and its own scales) reaches less of the
#: peak than one large dense GEMM (0.46 against 0.60 / 0.68). Hopper's cross-node all-to-all (EP 16
#: / 32 over 400 Gb/s InfiniBand, timed with the ``flex`` dispatcher's one copy per remote node)
#: reaches 0.51 of the NIC, not DeepEP's 0.85 on H800 (stated for the other generations).
_HOST_OP = 7.5e-05  # refitted with ops.HOST_EXPERT_LAUNCH (issue 18, ninth round)
#: Mamba-2's kernels run at 0.45 of a streaming kernel's bandwidth on the bytes they move
#: (``hybrid.MambaDims.scan_bytes_per_token``, three times backward: a kernel-by-kernel recount of
#: ``MambaSplitConv1dScanCombinedFn.backward`` in state-spaces/mamba ``mamba_ssm/ops/triton/ssd_combined.py``
#: @ e9594ce1 - the conv and the states recomputed, ~14 kernels, FP32 partial gradients of B, C and
#: C B^T - gives 2.6-3x). Fitted on the 20 Nemotron 3 Nano runs alone (a grid of 1 / 0.55 ... 0.35:
#: mean |error| 12.9 -> 3.4 %, max 24 -> 8 %) and checked on the 30 Nemotron 3 Super runs, which it was
#: not fitted on (12.7 -> 8.9 %); no kernel-level measurement of these kernels' bandwidth is published. Each
#: tile of them does small matrix products, exponentials and a sequential chunk scan between its
#: loads, so none streams at HBM speed. Every generation alike (one value for Hopper and Blackwell).
SSD_BANDWIDTH = 0.45
_BW_GEMM, _BWU_GEMM, _BW_GROUPED, _BW_FP4 = 0.5963, 0.6815, 0.4622, 0.5195
_HOPPER_GEMM, _HOPPER_A2A_NET = 0.7185, 0.5110
_AMPERE_GEMM = 0.81
#: Flash attention at head dimension 64 on Blackwell: cuDNN 9.19's training SDPA benchmark on GB200
#: (NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training/results/gb200_919_only_cudnn``
#: @ afa9f7c0 / df73764a, BF16, 32k tokens) runs GPT-OSS's shape (64 / 8 heads of 64, a 1,024-key
#: window) at 632 / 660 TFLOP/s forward / backward and Llama 3.1's (heads of 128, causal) at 1,720 /
#: 1,473; with the window's partly empty blocks counted (x 1.12, ``ops.window_tile_factor``) the
#: 64-wide heads keep 0.41 / 0.50 of the 128-wide ones' rate. Blackwell Ultra is taken to scale alike
#: (no 64-wide causal measurement of it is published there). Hopper and Ampere: none stated.
_BW_HEAD64 = (0.41, 0.50)
#: GEMM output tiles. Blackwell: tcgen05 MMA tiles of 256 x 128 computed across 2 SMs, M x N
#: (NVIDIA/cutlass ``examples/70_blackwell_gemm/70_blackwell_fp16_gemm.cu`` @ 389e4930,
#: ``MmaTileShape_MNK = Shape<_256,_128,_64>``); Hopper and Ampere: 128 x 128
#: (``examples/48_hopper_warp_specialized_gemm`` @ 18422531, ``TileShape = Shape<_128,_128,_32>``).
#: Transformer Engine calls cuBLAS with M the weight's side (``m`` = the output features forward,
#: the input features for the data and weight gradients) and N the tokens.
_BW_TILE = (256, 128)

CONSTANTS: dict[str, Efficiency] = {
    # Ampere: every measured A100 Megatron run (Narayanan et al. 2021, Korthikanti et al. 2022) predates
    # flash attention in Megatron and ran the unfused core attention (Efficiency.attn_unfused)
    "ampere": Efficiency("ampere", gemm={"bf16": _AMPERE_GEMM}, attn_fwd=0.55, attn_bwd=0.40, host_op=_HOST_OP,
                         attn_unfused=True, ssd_bw=SSD_BANDWIDTH),
    "hopper": Efficiency("hopper", gemm={"bf16": _HOPPER_GEMM, "fp8": _HOPPER_GEMM}, attn_fwd=0.60, attn_bwd=0.45,
                         host_op=_HOST_OP, a2a_net=_HOPPER_A2A_NET, ssd_bw=SSD_BANDWIDTH),
    "blackwell": Efficiency("blackwell", gemm={"bf16": _BW_GEMM, "fp8": _BW_GEMM, "fp4": _BW_FP4},
                            gemm_grouped={"bf16": _BW_GROUPED, "fp8": _BW_GROUPED}, attn_fwd=0.60,
                            attn_bwd=0.45, attn_head64=_BW_HEAD64, host_op=_HOST_OP, gemm_tile=_BW_TILE,
                            ssd_bw=SSD_BANDWIDTH),
    # Blackwell Ultra doubles the SFU (MUFU.EX2) throughput that bounds the softmax of attention on
    # Blackwell (NVIDIA, "Making Softmax More Efficient with NVIDIA Blackwell Ultra"; verda GB300 table:
    # 10.7 vs 5 TeraExponentials/s); FlashAttention-4 reports the exponentials taking 25-60 % longer
    # than the matmuls on B200: stated as 1.25 x Blackwell's attention efficiency.
    "blackwell_ultra": Efficiency("blackwell_ultra", gemm={"bf16": _BWU_GEMM, "fp8": _BWU_GEMM, "fp4": _BW_FP4},
                                  gemm_grouped={"bf16": _BW_GROUPED, "fp8": _BW_GROUPED}, attn_fwd=0.75, attn_bwd=0.5625,
                                  attn_head64=_BW_HEAD64, host_op=_HOST_OP, gemm_tile=_BW_TILE,
                                  ssd_bw=SSD_BANDWIDTH),
    # no calibration row: Hopper's fractions (stated, unvalidated)
    "cdna3": Efficiency("cdna3", gemm={"bf16": _HOPPER_GEMM, "fp8": _HOPPER_GEMM}, attn_fwd=0.45, attn_bwd=0.35,
                        host_op=_HOST_OP, ssd_bw=SSD_BANDWIDTH),
}

#: Which constants were fitted, on what (docs/MODELS.md "Step time" lists the rest with sources).
FITTED: dict[str, str] = {
    "blackwell gemm fp8 (= bf16)": "dense GEMMs of B200 / GB200: calibration + development rows (--fit-dev)",
    "blackwell_ultra gemm fp8 (= bf16)": "dense GEMMs of B300 / GB300: calibration + development rows (--fit-dev)",
    "blackwell / blackwell_ultra grouped fp8 (= bf16)": "routed experts' grouped GEMMs, both generations: "
                                                        "calibration + development rows (--fit-dev)",
    "blackwell / blackwell_ultra gemm fp4": "NVFP4 calibration + development rows (--fit-dev)",
    "hopper gemm fp8 (= bf16)": "calibration + development rows (--fit-dev)",
    "hopper a2a_net": "the H100 MoE runs among the development rows (EP 16 / 32 across nodes; --fit-dev)",
    "ampere gemm bf16": "the 17 A100 rows (Korthikanti Table 5, Narayanan Table 1; calibration + development), "
                        "with the unfused attention: 0.81 in the flat optimum 0.79-0.81 (docs/MODELS.md)",
    "host_op (every generation)": "calibration + development rows (--fit-dev; only micro-batch-1 MoE runs are "
                                  "host-bound); ninth round: 7.5e-05 with ops.HOST_EXPERT_LAUNCH 0.35 (a grid over "
                                  "both on the calibration and the 104 development rows' log error)",
    "ssd_bw (every generation)": "the 20 Nemotron 3 Nano development rows (a grid 1, 0.55 ... 0.35; 0.45); the 30 "
                                 "Nemotron 3 Super rows, not fitted on, check it (SSD_BANDWIDTH)",
}


def efficiency_for(generation: str, overrides: dict[str, float] | None = None) -> Efficiency:
    eff = CONSTANTS[generation]
    if overrides:
        gemm, grouped = dict(eff.gemm), dict(eff.gemm_grouped)
        plain: dict[str, float] = {}
        for k, v in overrides.items():
            if k.startswith("grouped_"):
                grouped[k[8:]] = v
            elif k.startswith("gemm_"):
                gemm[k[5:]] = v
            else:
                plain[k] = v
        eff = replace(eff, gemm=gemm, gemm_grouped=grouped, **plain)  # type: ignore[arg-type]
    return eff
