"""The GPU catalogue: one frozen :class:`Hardware` per accelerator, each value with its source.

Conventions (every value below follows them):

* **Peak tensor throughput is dense** (no 2:4 sparsity), in FLOP/s: ``bf16_flops``, ``fp8_flops``
  (FP8 and MXFP8 run at the same tensor rate) and ``fp4_flops`` (NVFP4; ``0`` where the GPU has
  no FP4 tensor path). Vendor sheets that print sparse figures are halved (their footnotes say
  "with sparsity").
* **HBM capacity is vendor decimal bytes**, ``N * 10**9`` (the memory model's convention,
  :mod:`app.core.model.parallelism`): H100 80GB = 80e9.
* **Bandwidths in bytes/s**: ``hbm_bw``; ``nvlink_bw`` is the *unidirectional* per-GPU NVLink
  (AMD: xGMI) bandwidth, i.e. half of the bidirectional figure vendors print (H100 "900 GB/s" =
  450e9 B/s each way); ``net_bw`` is the per-GPU scale-out NIC line rate in bytes/s (400 Gb/s =
  50e9 B/s), one NIC per GPU on every system listed.
* ``nvlink_domain``: GPUs that share one NVLink / xGMI switch domain (8 on a DGX/HGX node, 72 in
  a GB200/GB300 NVL72 rack). A group of ranks that fits in a domain talks over NVLink; one that
  spans domains is network-bound (:mod:`app.core.time.comm`).
* ``host_bw`` / ``h2d_bw``: host memory bandwidth per GPU (used by the CPU-offloaded optimizer
  step) and the GPU-host link per GPU (PCIe, or NVLink-C2C on Grace systems).
* ``sms``: streaming multiprocessors (AMD: compute units) enabled on the part; communication
  kernels that run beside compute take some of them (:mod:`app.core.time.model`).
* ``generation``: the architecture whose achieved-efficiency constants apply
  (:mod:`app.core.time.efficiency`); constants are shared across the GPUs of one generation.

Overrides (``--nvlink-domain``, ``--network-gbps`` ...) are :func:`dataclasses.replace` on a
catalogue entry (:func:`with_overrides`); a ``custom`` GPU starts from a named base.

Sources are per value in each entry's ``sources`` (pages stored for this project's search tool,
read 2026; where two sources disagree the entry says which one it uses). Values that could not
be checked against a stored page say so in their source text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

TERA = 10**12
GB = 10**9


@dataclass(frozen=True)
class Hardware:
    """One accelerator as the time model sees it (module docstring for units)."""

    id: str
    name: str  # short name, e.g. "NVIDIA H100 80GB" (the memory model's label)
    label: str
    generation: str  # ampere | hopper | blackwell | blackwell_ultra | cdna3
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float
    hbm_bytes: int
    hbm_bw: float
    nvlink_bw: float
    nvlink_domain: int
    net_bw: float
    host_bw: float
    h2d_bw: float
    sms: int = 0  # streaming multiprocessors (AMD: compute units); 0 = unknown
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor peak for GEMM inputs of ``dtype`` (``bf16``, ``fp8``, ``fp4``)."""
        peak = {"bf16": self.bf16_flops, "fp8": self.fp8_flops, "fp4": self.fp4_flops}[dtype]
        if peak <= 0:
            raise ValueError(f"{self.label} has no {dtype.upper()} tensor path; choose another precision")
        return peak

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["network_gbps"] = self.net_bw * 8 / GB
        out["nvlink_gbs_bidirectional"] = 2 * self.nvlink_bw / GB
        return out


_H100_SRC = {
    "bf16_flops": "989 TFLOPS dense BF16: https://ttsugriy.github.io/distributed-training-book/synthesis/34-case-study-llama3 "
                  "('Peak FP16/BF16: 989 TFLOPs, Peak FP8: 1,979 TFLOPs, HBM3 80 GB, 3.35 TB/s')",
    "fp8_flops": "1,979 TFLOPS dense FP8: same page",
    "hbm": "80 GB HBM3, 3.35 TB/s: same page; https://flashgenius.net/guides/ai-server-systems-amp-platform-design-ncp-aii-guide",
    "nvlink": "900 GB/s bidirectional per GPU (18 NVLink 4 links x 50 GB/s): "
              "https://petronellatech.com/hardware/h100-h200-nvlink-cluster-scaling/",
    "net": "8x ConnectX-7 400 Gb/s per DGX H100 (one per GPU): DGX H100 User Guide network modules table "
           "(https://www.easymanua.ls/nvidia/dgx-h100/manual?p=19) and "
           "https://fridayswithfaraday.com/posts/gpu-hw-nvlink-nvswitch-interconnect (NDR 400G per node link)",
    "sms": "132 SMs on H100 SXM5 (of 144 on the full GH100): https://glennklockwood.com/garden/processors/h100",
    "host": "PCIe Gen5 x16 64 GB/s per direction; host DRAM bandwidth per GPU assumed 40 GB/s (2 sockets of "
            "DDR5 shared by 8 GPUs; not from a datasheet)",
}

_B200_SRC = {
    "flops": "HGX B200 (1,000 W): BF16 2,250 / FP8 4,500 / FP4 9,000 TFLOPS dense: "
             "https://glennklockwood.com/garden/processors/B200; NVIDIA HGX B200 sheet (18 / 9 / 4.5 PFLOPS "
             "FP4 / FP8 / BF16 with sparsity) reproduced at https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html",
    "hbm": "180 GB HBM3E, 7.7 TB/s: HGX B200 column of the NVIDIA sheet at the zdszero page; "
           "https://verda.com/blog/gb300-nvl72-architecture (B200: 180 GB, 7.7 TB/s)",
    "nvlink": "5th-gen NVLink 1.8 TB/s total (900 GB/s unidirectional): https://verda.com/blog/gb300-nvl72-architecture",
    "net": "8x ConnectX-7 400 Gb/s on HGX/DGX B200: https://rillor.com/insights/connectx-7-vs-connectx-8-and-nvlink5",
    "host": "PCIe Gen5 x16 64 GB/s per direction; host DRAM per GPU assumed 40 GB/s (not from a datasheet)",
    "sms": "148 SMs (74 enabled of 80 per die, two dies): Chips and Cheese 'Nvidia's B200: Keeping the CUDA Juggernaut "
           "Rolling' (https://vuink.com/post/puvcfnaqpurrfr-d-dpbz/p/nvidias-b200-keeping-the-cuda-juggernaut)",
}

CATALOGUE: dict[str, Hardware] = {
    "a100-80gb": Hardware(
        "a100-80gb", "NVIDIA A100 80GB", "NVIDIA A100 80GB SXM4 (DGX A100 / Selene)", "ampere",
        bf16_flops=312 * TERA, fp8_flops=0.0, fp4_flops=0.0,
        hbm_bytes=80 * GB, hbm_bw=2.039e12, nvlink_bw=300e9, nvlink_domain=8, net_bw=25e9,
        host_bw=40e9, h2d_bw=32e9, sms=108,
        sources={
            "flops": "312 TFLOPS dense FP16/BF16 (624 sparse), no FP8: https://glennklockwood.com/garden/processors/A100 "
                     "(citing the NVIDIA A100 datasheet)",
            "hbm": "80 GB HBM2e, 2.039 TB/s: same page; calculon-ai/calculon systems/a100_80e.json uses 2,048 GB/s",
            "nvlink": "600 GB/s NVLink 3 (300 + 300): same page; https://jingchaozhang.github.io/A100-white-paper/",
            "net": "Selene: 8x HDR InfiniBand 200 Gb/s per DGX A100 node (one per GPU): calculon-ai/calculon "
                   "systems/a100_80e.json network[1] 25 GB/s (not re-checked against an NVIDIA page here)",
            "host": "PCIe Gen4 x16 32 GB/s per direction: glennklockwood A100 page; host DRAM per GPU assumed",
            "sms": "108 SMs: https://notes.haroldbenoit.com/ML/Engineering/GPUs/Hardware ('A100-80GB has ... 108 Streaming "
                   "Multiprocessors')",
        },
    ),
    "h100-80gb": Hardware(
        "h100-80gb", "NVIDIA H100 80GB", "NVIDIA H100 80GB SXM5 (DGX/HGX H100)", "hopper",
        bf16_flops=989 * TERA, fp8_flops=1979 * TERA, fp4_flops=0.0,
        hbm_bytes=80 * GB, hbm_bw=3.35e12, nvlink_bw=450e9, nvlink_domain=8, net_bw=50e9,
        host_bw=40e9, h2d_bw=64e9, sms=132, sources=_H100_SRC,
    ),
    "h200-141gb": Hardware(
        "h200-141gb", "NVIDIA H200 141GB", "NVIDIA H200 141GB SXM (DGX/HGX H200)", "hopper",
        bf16_flops=989 * TERA, fp8_flops=1979 * TERA, fp4_flops=0.0,
        hbm_bytes=141 * GB, hbm_bw=4.8e12, nvlink_bw=450e9, nvlink_domain=8, net_bw=50e9,
        host_bw=40e9, h2d_bw=64e9, sms=132,
        sources={**_H100_SRC,
                 "flops": "same GH100 compute die as H100, 989 / 1,979 TFLOPS dense BF16 / FP8: "
                          "https://flashgenius.net/guides/ai-server-systems-amp-platform-design-ncp-aii-guide "
                          "('H200 has same GH100 compute die as H100')",
                 "hbm": "141 GB HBM3e, 4.8 TB/s: same page ('4.8 TB/s vs 3.35 TB/s'); DGX H200 1,128 GB / 8"},
    ),
    "b200-180gb": Hardware(
        "b200-180gb", "NVIDIA B200 180GB", "NVIDIA B200 180GB (DGX/HGX B200, 1,000 W)", "blackwell",
        bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, fp4_flops=9000 * TERA,
        hbm_bytes=180 * GB, hbm_bw=7.7e12, nvlink_bw=900e9, nvlink_domain=8, net_bw=50e9,
        host_bw=40e9, h2d_bw=64e9, sms=148, sources=_B200_SRC,
    ),
    "b300-288gb": Hardware(
        "b300-288gb", "NVIDIA B300 288GB", "NVIDIA B300 Blackwell Ultra 288GB (DGX/HGX B300)", "blackwell_ultra",
        bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, fp4_flops=14000 * TERA,
        hbm_bytes=288 * GB, hbm_bw=8.0e12, nvlink_bw=900e9, nvlink_domain=8, net_bw=100e9,
        host_bw=40e9, h2d_bw=128e9, sms=160,
        sources={
            "flops": "HGX B300: BF16 2,250 / FP8 4,500 TFLOPS dense: https://glennklockwood.com/garden/processors/B300 "
                     "and https://verda.com/blog/gb300-nvl72-architecture (B300 column, 'without sparsity'); FP4 dense "
                     "14 PFLOPS from verda (glennklockwood lists 13,125: the two pages disagree; verda used)",
            "hbm": "288 GB HBM3e (12-high), 8 TB/s max: glennklockwood B300 page (verda lists 270 GB usable / 7.7 TB/s)",
            "nvlink": "5th-gen NVLink 1.8 TB/s per GPU: verda page",
            "net": "8x ConnectX-8 SuperNIC 800 Gb/s on HGX/DGX B300: https://rillor.com/insights/connectx-7-vs-connectx-8-and-nvlink5",
            "host": "PCIe Gen6 x16 (2x 256 GB/s per glennklockwood, i.e. 128 GB/s per direction); host DRAM per GPU assumed",
            "sms": "160 SMs (Blackwell Ultra enables all of them; Blackwell 144-148): NVIDIA 'Inside NVIDIA Blackwell "
                   "Ultra' as reported at https://www.sheroking.site/2025/08/nvidia-blackwell-ultra-gpu-details.html",
        },
    ),
    "gb200-186gb": Hardware(
        "gb200-186gb", "NVIDIA GB200 186GB", "NVIDIA GB200 NVL72 (Blackwell, 1,200 W, 186 GB)", "blackwell",
        bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, fp4_flops=9000 * TERA,
        hbm_bytes=186 * GB, hbm_bw=8.0e12, nvlink_bw=900e9, nvlink_domain=72, net_bw=50e9,
        host_bw=250e9, h2d_bw=450e9, sms=148,
        sources={
            "flops": "BF16 2,250 / FP8 4,500 / FP4 9,000 TFLOPS dense per GPU: https://verda.com/blog/gb300-nvl72-architecture "
                     "(per-GPU table 'without sparsity', GB200 column; the value hardware.json cites). NVIDIA's GB200 NVL72 "
                     "sheet implies 2,500 / 5,000 / 10,000 at 1,200 W (20 / 10 / 5 PFLOPS FP4 / FP8 / BF16 with sparsity, "
                     "https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html; "
                     "https://glennklockwood.com/garden/processors/B200): the sources disagree by 11 %. The operator's "
                     "per-GPU figures are used: measured GB200 throughput equals HGX B200's on identical launches "
                     "(Megatron-Bridge 25.11 Llama-3 8B FP8: 31,508 vs 30,624 tokens/s/GPU), which the sheet's 11 % "
                     "higher peak would contradict",
            "hbm": "186 GB HBM3E, 8 TB/s per GPU: NVIDIA GB200 NVL72 sheet at the zdszero page",
            "nvlink": "72-GPU NVLink 5 domain, 1.8 TB/s per GPU: "
                      "https://docs.nvidia.com/multi-node-nvlink-systems/multi-node-tuning-guide/system.html; "
                      "Megatron-Bridge perf recipes set NVLINK_DOMAIN_SIZE=72 for GB200 "
                      "(src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v3.py @ v0.6.0)",
            "net": "ConnectX-7 400 Gb/s per GPU (4 per compute tray of 4 GPUs): NVIDIA multi-node tuning guide "
                   "(compute trays with CX7); per-GPU count from the reference architecture, not re-checked",
            "sms": "148 SMs per GPU, as B200 (the same part; Chips and Cheese B200 article, see b200-180gb)",
            "host": "NVLink-C2C 900 GB/s per Grace superchip (2 GPUs): https://setloop.io/blog/gb200-nvl72-architecture; "
                    "Grace LPDDR5X ~500 GB/s shared by 2 GPUs (assumed)",
        },
    ),
    "gb300-288gb": Hardware(
        "gb300-288gb", "NVIDIA GB300 288GB", "NVIDIA GB300 NVL72 (Blackwell Ultra, 1,400 W, 288 GB)", "blackwell_ultra",
        bf16_flops=2500 * TERA, fp8_flops=5000 * TERA, fp4_flops=15000 * TERA,
        hbm_bytes=288 * GB, hbm_bw=8.0e12, nvlink_bw=900e9, nvlink_domain=72, net_bw=100e9,
        host_bw=250e9, h2d_bw=450e9, sms=160,
        sources={
            "flops": "GB300: BF16 2.5 / FP8 5 / FP4 15 PFLOPS dense: https://verda.com/blog/gb300-nvl72-architecture "
                     "(per-GPU table 'without sparsity'; rack 1,080 PF FP4 / 360 PF FP8 dense); "
                     "https://glennklockwood.com/garden/processors/B300 ('1.1 EF dense FP4', '360 PF FP8 for training')",
            "hbm": "288 GB HBM3e: glennklockwood B300 page (verda lists 279 GB usable); 8 TB/s (verda; 576 TB/s / 72)",
            "nvlink": "single 72-GPU NVLink 5 domain, 1.8 TB/s per GPU: https://ai-infrastructure.net/nvidia-blackwell-platform/",
            "net": "4 ConnectX-8 per 4-GPU compute tray (800 Gb/s per GPU): "
                   "https://docs.nvidia.com/enterprise-reference-architectures/nvl72-ai-factory/latest/components.html",
            "host": "NVLink-C2C to Grace as GB200 (assumed equal)",
            "sms": "160 SMs (Blackwell Ultra): https://thefilibusterblog.com/nvidia-blackwell-ultra-gb300-gpu-unveiling-the-"
                   "fastest-ai-chip-with-dual-reticle-20k-cores-288-gb-hbm3e-memory-at-8-tb-s-50-faster-than-gb200",
        },
    ),
    "mi300x-192gb": Hardware(
        "mi300x-192gb", "AMD MI300X 192GB", "AMD Instinct MI300X 192GB (8-GPU xGMI platform)", "cdna3",
        bf16_flops=1307 * TERA, fp8_flops=2615 * TERA, fp4_flops=0.0,
        hbm_bytes=192 * GB, hbm_bw=5.3e12, nvlink_bw=448e9, nvlink_domain=8, net_bw=50e9,
        host_bw=40e9, h2d_bw=64e9, sms=304,
        sources={
            "flops": "~1.3 PFLOPS FP16/BF16 and ~2.6 PFLOPS FP8 dense: "
                     "https://www.jaredwatkins.com/research/ai-accelerators/amd-instinct/mi300-series/ "
                     "(AMD's datasheet figures 1,307.4 / 2,614.9 TFLOPS; the datasheet itself not stored here)",
            "hbm": "192 GB HBM3, 5.3 TB/s: same page; https://www.codesota.com/hardware/mi300x",
            "nvlink": "Infinity Fabric (xGMI) 896 GB/s aggregate per GPU, fully connected 8-GPU mesh: "
                      "https://gpu.blog/gpus/instinct-mi300x-mi300x",
            "net": "one 400 Gb/s NIC per GPU assumed (typical MI300X platforms; not from a vendor page here)",
            "host": "PCIe Gen5 x16; host DRAM per GPU assumed",
            "sms": "304 compute units (AMD's figure; not re-checked against a stored AMD page)",
        },
    ),
}

#: Short names accepted wherever a GPU id is (the memory model's aliases plus the new ids).
ALIASES = {"a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200-141gb", "b200": "b200-180gb",
           "b300": "b300-288gb", "gb200": "gb200-186gb", "gb300": "gb300-288gb", "mi300x": "mi300x-192gb"}

#: The fields a user may override (``--nvlink-domain``, ``--network-gbps`` ...), in their units.
OVERRIDABLE = ("bf16_flops", "fp8_flops", "fp4_flops", "hbm_bytes", "hbm_bw", "nvlink_bw", "nvlink_domain",
               "net_bw", "host_bw", "h2d_bw")


#: The GPU generations the time model has constants for (``app.core.time.efficiency.CONSTANTS``): what a
#: ``--gpu custom`` is timed as (``--gpu-generation``).
GENERATIONS = ("ampere", "hopper", "blackwell", "blackwell_ultra", "cdna3")


def gpu_ids() -> tuple[str, ...]:
    return tuple(CATALOGUE)


def get_hardware(gpu: str) -> Hardware:
    """A catalogue entry by id or alias; ``ValueError`` naming the choices otherwise."""
    key = ALIASES.get(gpu, gpu)
    if key not in CATALOGUE:
        raise ValueError(f"unknown gpu {gpu!r}; use one of {', '.join(CATALOGUE)}")
    return CATALOGUE[key]


def with_overrides(hw: Hardware, *, network_gbps: float | None = None, **values: Any) -> Hardware:
    """``hw`` with some values replaced (``dataclasses.replace``); ``network_gbps`` is the NIC rate
    in Gb/s (``--network-gbps``), the others are :data:`OVERRIDABLE` fields in their own units."""
    bad = sorted(set(values) - set(OVERRIDABLE))
    if bad:
        raise ValueError(f"cannot override {bad}; overridable: {', '.join(OVERRIDABLE)} and network_gbps")
    changes: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    if network_gbps is not None:
        changes["net_bw"] = network_gbps * GB / 8
    for name, value in changes.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                name in ("nvlink_domain", "hbm_bytes") and (value < 1 or int(value) != value)):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if "nvlink_domain" in changes:
        changes["nvlink_domain"] = int(changes["nvlink_domain"])
    if not changes:
        return hw
    note = ", ".join(f"{k}={v:g}" for k, v in sorted(changes.items()))
    return replace(hw, **changes, label=f"{hw.label} (overridden: {note})",
                   sources={**hw.sources, "overrides": f"user-supplied: {note}"})


class CustomGpuError(ValueError):
    """A ``--gpu custom`` figure the time model needs is missing or wrong; ``field`` is the plan setting."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def custom_hardware(*, generation: str | None, capacity_bytes: int | None, bf16_flops: float | None,
                    hbm_bw: float | None, nvlink_bw: float | None) -> Hardware:
    """A GPU outside the catalogue (``--gpu custom``), as the time model needs it: its generation (the
    achieved-efficiency constants it is timed with), capacity, dense BF16 peak, HBM and NVLink bandwidth
    must be given - a ``ValueError`` names the first missing flag; FP8 / FP4 peaks are absent until given
    (``--fp8-tflops`` / ``--fp4-tflops``, applied by :func:`with_overrides`), and the system is an HGX-like
    node unless overridden: NVLink domain 8, 400 Gb/s per GPU to the network, the host as the H100's
    (40 GB/s to its memory, 64 GB/s PCIe 5 to the GPU), SM count unknown (the EP overlap then takes none)."""
    required = (("--gpu-generation", generation), ("--gpu-memory-gb", capacity_bytes),
                ("--bf16-tflops", bf16_flops), ("--hbm-tbps", hbm_bw), ("--nvlink-gbs", nvlink_bw))
    missing = [flag for flag, value in required if not value]
    if missing:
        raise CustomGpuError(f"--gpu custom is timed from its own figures: give {', '.join(missing)} (generation "
                             f"one of {', '.join(GENERATIONS)}; or pick a catalogue GPU and override it)",
                             missing[0].removeprefix("--").replace("-", "_"))
    assert generation is not None and capacity_bytes and bf16_flops and hbm_bw and nvlink_bw
    if generation not in GENERATIONS:
        raise CustomGpuError(f"--gpu-generation must be one of {', '.join(GENERATIONS)}, got {generation!r}",
                             "gpu_generation")
    name = f"custom {generation} GPU ({capacity_bytes / 1e9:g} GB)"
    return Hardware("custom", name, name, generation, bf16_flops=bf16_flops, fp8_flops=0.0, fp4_flops=0.0,
                    hbm_bytes=int(capacity_bytes), hbm_bw=hbm_bw, nvlink_bw=nvlink_bw, nvlink_domain=8,
                    net_bw=400 * GB / 8, host_bw=40e9, h2d_bw=64e9, sms=0,
                    sources={"custom": "user-supplied: --gpu custom with --gpu-generation, --gpu-memory-gb, "
                                       "--bf16-tflops, --hbm-tbps, --nvlink-gbs"})
