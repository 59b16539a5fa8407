"""The plan: every setting of a layout plan, defined once.

A :class:`Plan` is a frozen dataclass whose fields carry their whole description in metadata
(:class:`Field`: type, bounds, default, URL key, CLI flag, the Megatron/slime flag names they
correspond to, the layout modes they apply in, help text). Everything that reads or writes a
plan is generated from this one table:

* :func:`plan_from_query` / :meth:`Plan.query` - the page URL and every ``/api/v1`` route;
* :func:`add_cli_arguments` / :func:`plan_from_cli` / :meth:`Plan.cli_args` - the ``isplan`` CLI;
* :func:`plan_from_flags` - a launcher's expanded Megatron/slime flags (launcher import);
* the web layer's pydantic query model (``app.web.schemas.PlanQuery``) and the plan a receipt
  records (its canonical query).

Each field has one bound, checked here before any work is done (a stage size of 10^8 never
reaches the stage builder). A value that breaks a bound is a :class:`FieldProblem` naming the
field, the value and the fix. Cross-field rules (which layout description is in use, the world
size) live in :func:`plan_conflicts`, once.

The core stays free of pydantic so ``isplan check`` starts fast (docs/DESIGN.md).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlencode

# one upper bound per count, enforced here before any work (issue 9): app/core/bounds.py
from app.core.bounds import MAX_CONTEXT as MAX_TOKENS
from app.core.bounds import MAX_CP, MAX_EP, MAX_GPUS, MAX_LAYERS, MAX_MODEL_ID, MAX_PP, MAX_STAGES, MAX_TP, MAX_VPP
from app.core.bounds import MAX_MTP_LAYERS as MAX_MTP
from app.core.bounds import MAX_PLAN_PATTERN as MAX_PATTERN
from app.core.bounds import MAX_PLAN_TEXT as MAX_TEXT
from app.core.model.hardware import CATALOGUE

LAYOUT_MODES = ("flags", "split", "layout")
CONVERSION_MODES = ("none", "flags", "split")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
GPUS = (*CATALOGUE, "custom")  # the GPU catalogue (app/core/model/hardware.py) + a custom capacity
TRAINING_ENGINES = ("megatron", "slime", "hf", "maxtext")
SERVING_ENGINES = ("vllm", "sglang")
ENGINES = ("megatron", "slime", "hf", "vllm", "sglang", "maxtext")
KV_DTYPES = ("bf16", "fp8")
WEIGHT_DTYPES = ("bf16", "fp8")

_WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: str.isdigit() also accepts superscripts


@dataclass(frozen=True)
class Field:
    """How one plan setting is named, bounded and documented everywhere."""

    kind: str  # int | float | bool | choice | text | sizes
    url: str  # query key (page, API, share URL)
    cli: str | None  # isplan flag; None: derived on the CLI (the layout mode)
    help: str
    group: str  # model | layout | parallel | memory | conversion | flops
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    max_len: int = 1000
    megatron: tuple[str, ...] = ()  # flag names a Megatron launcher uses (import and export)
    slime: tuple[str, ...] = ()  # slime-only flag names (import; slime export)
    modes: tuple[str, ...] = ()  # layout modes the field applies in; () = all
    metavar: str | None = None

    def bounds_text(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.lo is not None and self.hi is not None:
            return f"{self.lo:.15g} to {self.hi:.15g}"
        return ""


def _f(kind: str, default: Any, url: str, cli: str | None, help: str, group: str, **kw: Any) -> Any:
    return field(default=default, metadata={"isplan": Field(kind, url, cli, help, group, **kw)})


@dataclass(frozen=True)
class Plan:
    """One layout plan: the model, its layout, parallelism and the memory/FLOPs settings."""

    # model ------------------------------------------------------------------------------
    model: str = _f("text", "glm-5.2", "model", None, "a preset id or an uploaded config (sha256:...)",
                    "model", max_len=MAX_MODEL_ID)
    engine: str = _f("choice", "megatron", "engine", "--engine",
                     "the engine that builds the stages and derives full/shared roles (training: megatron, slime, "
                     "hf, maxtext; serving: vllm, sglang)", "model", choices=ENGINES)
    engine_version: str | None = _f("text", None, "engine_version", "--engine-version",
                                    "serving engine build date YYYY-MM-DD (default: latest); the partition rule "
                                    "and the shared-start behaviour follow it", "model", max_len=40, metavar="DATE")
    pattern: str | None = _f("text", None, "pattern", "--pattern",
                             "what-if role override: F/S letters, periodic from layer 1 (FSSS) or one per layer",
                             "model", max_len=MAX_PATTERN, metavar="P")
    num_layers: int | None = _f("int", None, "layers", "--num-layers",
                                "decoder layers the job builds (must equal the config's num_hidden_layers)",
                                "model", lo=1, hi=MAX_LAYERS, megatron=("--num-layers",), metavar="N")
    hidden_size: int | None = _f("int", None, "hidden", "--hidden-size", "the job's hidden size (must equal the "
                                 "config's)", "model", lo=1, hi=1 << 20, megatron=("--hidden-size",), metavar="N")
    heads: int | None = _f("int", None, "heads", "--num-attention-heads", "the job's attention heads (must equal "
                           "the config's)", "model", lo=1, hi=MAX_LAYERS, megatron=("--num-attention-heads",),
                           metavar="N")
    experts: int | None = _f("int", None, "experts", "--num-experts", "the job's routed experts (must equal the "
                             "config's)", "model", lo=1, hi=1 << 16, megatron=("--num-experts",), metavar="N")
    moe_ffn: int | None = _f("int", None, "moe_ffn", "--moe-ffn-hidden-size", "the job's expert FFN width (must "
                             "equal the config's)", "model", lo=1, hi=1 << 22, megatron=("--moe-ffn-hidden-size",),
                             metavar="N")
    dsa_freq: int | None = _f("int", None, "dsa_freq", "--dsa-topk-freq",
                              "the engine's top-k frequency (default: the config's index_topk_freq)", "model",
                              lo=1, hi=MAX_LAYERS, megatron=("--dsa-indexer-topk-freq",), metavar="N")
    dsa_offset: int | None = _f("int", None, "dsa_offset", "--dsa-skip-topk-offset",
                                "the engine's skip offset (default: the config's index_skip_topk_offset)", "model",
                                lo=0, hi=MAX_LAYERS, megatron=("--dsa-indexer-skip-topk-offset",), metavar="N")
    # layout -----------------------------------------------------------------------------
    mode: str = _f("choice", "flags", "mode", None, "how the layout is described: flags, split or layout",
                   "layout", choices=LAYOUT_MODES)
    split: tuple[int, ...] | None = _f("sizes", None, "split", "--split",
                                       "stage sizes, vp-major, e.g. 14,8,8,8,8,8,8,16", "layout",
                                       lo=0, hi=MAX_LAYERS, max_len=MAX_TEXT, modes=("split",), metavar="LIST")
    pp: int = _f("int", 1, "pp", "--pp", "pipeline-parallel size", "layout", lo=1, hi=MAX_PP,
                 megatron=("--pipeline-model-parallel-size",), metavar="N")
    first: int | None = _f("int", None, "first", "--first", "decoder layers on the first pipeline stage",
                           "layout", lo=1, hi=MAX_LAYERS, megatron=("--decoder-first-pipeline-num-layers",),
                           modes=("flags",), metavar="F")
    last: int | None = _f("int", None, "last", "--last", "decoder layers on the last pipeline stage", "layout",
                          lo=1, hi=MAX_LAYERS, megatron=("--decoder-last-pipeline-num-layers",), modes=("flags",),
                          metavar="L")
    vpp: int | None = _f("int", None, "vpp", "--vpp", "virtual stages per pipeline rank", "layout", lo=1,
                         hi=MAX_VPP, megatron=("--num-virtual-stages-per-pipeline-rank",
                                               "--virtual-pipeline-model-parallel-size"), metavar="V")
    layers_per_vstage: int | None = _f("int", None, "lpvs", "--layers-per-vstage",
                                       "decoder layers per virtual stage (VPP follows)", "layout", lo=1,
                                       hi=MAX_LAYERS, megatron=("--num-layers-per-virtual-pipeline-stage",),
                                       modes=("flags",), metavar="K")
    account_for_embedding: bool = _f("bool", False, "emb", "--account-for-embedding",
                                     "the embedding takes one layer slot on the first stage", "layout",
                                     megatron=("--account-for-embedding-in-pipeline-split",), modes=("flags",))
    account_for_loss: bool = _f("bool", False, "loss", "--account-for-loss",
                                "the loss takes one layer slot on the last stage", "layout",
                                megatron=("--account-for-loss-in-pipeline-split",), modes=("flags",))
    layout: str | None = _f("text", None, "layout", "--layout", "Megatron layout string, e.g. 'Et*3|(tt|)*29,m|L'",
                            "layout", max_len=MAX_TEXT, megatron=("--pipeline-model-parallel-layout",),
                            modes=("layout",), metavar="STR")
    mtp: int | None = _f("int", None, "mtp", "--mtp-layers",
                         "MTP layers the job builds (none unless given: Megatron's and slime's default)", "layout",
                         lo=0, hi=MAX_MTP, megatron=("--mtp-num-layers",), metavar="M")
    no_overlap_p2p: bool = _f("bool", False, "no_p2p_overlap", "--no-overlap-p2p-communication",
                              "turn off P2P overlap (then interleaving needs PP > 2)", "layout",
                              megatron=("--no-overlap-p2p-communication",))
    # parallelism -----------------------------------------------------------------------
    parallel: bool = _f("bool", False, "parallel", "--parallel",
                        "judge the GPU count, parallel constraints and memory too (implied by any parallel or "
                        "memory setting, and by a launcher)", "parallel")
    tp: int = _f("int", 1, "tp", "--tp", "tensor-parallel size", "parallel", lo=1, hi=MAX_TP,
                 megatron=("--tensor-model-parallel-size",))
    cp: int = _f("int", 1, "cp", "--cp", "context-parallel size", "parallel", lo=1, hi=MAX_CP,
                 megatron=("--context-parallel-size",))
    ep: int = _f("int", 1, "ep", "--ep", "expert-parallel size", "parallel", lo=1, hi=MAX_EP,
                 megatron=("--expert-model-parallel-size",))
    etp: int | None = _f("int", None, "etp", "--etp", "expert tensor-parallel size (default: TP)", "parallel",
                         lo=1, hi=MAX_TP, megatron=("--expert-tensor-parallel-size",))
    dp: int | None = _f("int", None, "dp", "--dp", "data-parallel size (or give --gpus)", "parallel", lo=1,
                        hi=MAX_GPUS)
    gpus: int | None = _f("int", None, "gpus", "--gpus", "the GPU budget; it must equal TP x CP x PP x DP",
                          "parallel", lo=1, hi=MAX_GPUS)
    sp: bool = _f("bool", False, "sp", "--sp", "sequence parallelism", "parallel", megatron=("--sequence-parallel",))
    mbs: int = _f("int", 1, "mbs", "--mbs", "micro-batch size", "parallel", lo=1, hi=1024,
                  megatron=("--micro-batch-size",))
    microbatches: int | None = _f("int", None, "mb", "--num-microbatches", "micro-batches per step per DP rank",
                                  "parallel", lo=1, hi=1 << 16)
    global_batch: int | None = _f("int", None, "gbs", "--global-batch", "global batch size (micro-batches follow)",
                                  "parallel", lo=1, hi=MAX_TOKENS, megatron=("--global-batch-size",))
    seq_length: int | None = _f("int", None, "seq", "--seq-length", "tokens per sample", "parallel", lo=1,
                                hi=MAX_TOKENS, megatron=("--seq-length",))
    tokens_per_gpu: int | None = _f("int", None, "tpg", "--tokens-per-gpu",
                                    "tokens per GPU after the CP split (slime --max-tokens-per-gpu)", "parallel",
                                    lo=1, hi=MAX_TOKENS, slime=("--max-tokens-per-gpu",))
    # memory ----------------------------------------------------------------------------
    recompute: str = _f("choice", "none", "recompute", "--recompute", "activation recompute granularity",
                        "memory", choices=RECOMPUTE, megatron=("--recompute-granularity",))
    recompute_method: str = _f("choice", "uniform", "rmethod", "--recompute-method", "full recompute method",
                               "memory", choices=RECOMPUTE_METHODS, megatron=("--recompute-method",))
    recompute_num_layers: int = _f("int", 1, "rnl", "--recompute-num-layers", "layers per recompute unit",
                                   "memory", lo=1, hi=MAX_LAYERS, megatron=("--recompute-num-layers",))
    offload: bool = _f("bool", False, "offload", "--optimizer-cpu-offload",
                       "optimizer states on the host (HybridDeviceOptimizer)", "memory",
                       megatron=("--optimizer-cpu-offload",))
    overlap_cpu_optimizer: bool = _f("bool", False, "d2h", "--overlap-cpu-optimizer-d2h-h2d",
                                     "overlap the offloaded optimizer's copies", "memory",
                                     megatron=("--overlap-cpu-optimizer-d2h-h2d",))
    precision_aware: bool = _f("bool", False, "pao", "--use-precision-aware-optimizer",
                               "precision-aware optimizer (needed with CPU offload)", "memory",
                               megatron=("--use-precision-aware-optimizer",))
    no_distributed_optimizer: bool = _f("bool", False, "no_dist_opt", "--no-distributed-optimizer",
                                        "plain Adam states on every DP rank", "memory")
    gpu: str = _f("choice", "h100-80gb", "gpu", "--gpu", "GPU preset", "memory", choices=GPUS)
    gpu_gb: float | None = _f("float", None, "gpu_gb", "--gpu-memory-gb", "GPU capacity in GB for --gpu custom",
                              "memory", lo=1, hi=10_000)
    host_gb: float = _f("float", 2048.0, "host_gb", "--host-memory-gb",
                        "host memory per node in GB (CPU optimizer offload lives there)", "memory", lo=1, hi=1 << 20)
    gpus_per_node: int = _f("int", 8, "gpn", "--gpus-per-node", "GPUs per node (host memory is per node)",
                            "memory", lo=1, hi=1024)
    vocab_divisible_by: int = _f("int", 128, "vocab_div", "--make-vocab-size-divisible-by",
                                 "Megatron pads the vocabulary to a multiple of this (times TP)", "memory", lo=1,
                                 hi=1 << 16, megatron=("--make-vocab-size-divisible-by",))
    # FLOPs -----------------------------------------------------------------------------
    context: int = _f("int", 1_048_576, "ctx", "--context",
                      "context length (tokens per sequence): per-token FLOPs and the serving KV cache", "flops",
                      lo=1024, hi=MAX_TOKENS)
    # conversion (a second layout slot, e.g. slime's checkpoint conversion) ---------------
    conv: str = _f("choice", "none", "conv", None, "conversion layout: none, flags or split", "conversion",
                   choices=CONVERSION_MODES)
    conv_split: tuple[int, ...] | None = _f("sizes", None, "conv_split", "--conv-split",
                                            "conversion stage sizes", "conversion", lo=0, hi=MAX_LAYERS,
                                            max_len=MAX_TEXT, metavar="LIST")
    conv_pp: int | None = _f("int", None, "conv_pp", "--conv-pp", "conversion pipeline-parallel size",
                             "conversion", lo=1, hi=MAX_PP, metavar="N")
    conv_first: int | None = _f("int", None, "conv_first", "--conv-first", "conversion first-stage layers",
                                "conversion", lo=1, hi=MAX_LAYERS, metavar="F")
    conv_last: int | None = _f("int", None, "conv_last", "--conv-last", "conversion last-stage layers",
                               "conversion", lo=1, hi=MAX_LAYERS, metavar="L")

    # serving (vllm, sglang): the partition is ``split`` (the engine's PP_LAYER_PARTITION) --------
    concurrency: int = _f("int", 1, "concurrency", "--concurrency", "sequences served at once (KV cache)",
                          "serving", lo=1, hi=1 << 16)
    kv_dtype: str = _f("choice", "bf16", "kv_dtype", "--kv-dtype", "KV cache dtype (fp8: vLLM fp8_ds_mla)",
                       "serving", choices=KV_DTYPES)
    weight_dtype: str = _f("choice", "bf16", "weight_dtype", "--weight-dtype", "weight dtype", "serving",
                           choices=WEIGHT_DTYPES)
    # MaxText pipeline (src/maxtext/configs/types.py keys) -----------------------------------
    ici_pp: int = _f("int", 1, "ici_pp", "--ici-pipeline-parallelism", "MaxText ici_pipeline_parallelism",
                     "maxtext", lo=1, hi=MAX_PP)
    dcn_pp: int = _f("int", 1, "dcn_pp", "--dcn-pipeline-parallelism", "MaxText dcn_pipeline_parallelism",
                     "maxtext", lo=1, hi=MAX_PP)
    layers_per_stage: int = _f("int", 1, "lps", "--layers-per-pipeline-stage",
                               "MaxText num_layers_per_pipeline_stage", "maxtext", lo=1, hi=MAX_LAYERS)
    repeats: int | None = _f("int", None, "repeats", "--num-pipeline-repeats",
                             "MaxText num_pipeline_repeats (default: derived)", "maxtext", lo=1, hi=MAX_LAYERS)
    pipeline_layers: int | None = _f("int", None, "pipeline_layers", "--pipeline-parallel-layers",
                                     "MaxText pipeline_parallel_layers (default: the MoE layers)", "maxtext",
                                     lo=1, hi=MAX_LAYERS)

    def __post_init__(self) -> None:
        # one rule: a plan with any parallel or memory setting states its parallelism
        if not self.parallel and _implied_parallel(self):
            object.__setattr__(self, "parallel", True)

    # ------------------------------------------------------------------------- adapters
    def query(self, **overrides: Any) -> str:
        """The canonical query string (neutral defaults left out; ``model`` always present)."""
        plan = replace(self, **overrides) if overrides else self
        derived = {"mode": _derived_mode(plan.layout, plan.split), "conv": _derived_conv(plan.conv_split, plan.conv_pp),
                   "parallel": _implied_parallel(plan)}
        out: list[tuple[str, str]] = []
        for name, spec in TABLE.items():
            value = getattr(plan, name)
            if name in derived:
                if value == derived[name]:
                    continue
            elif name != "model" and value == NEUTRAL_VALUES[name]:
                continue
            if value is None:
                continue
            out.append((spec.url, format_value(spec, value)))
        return urlencode(out)

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v) for name, v in
                ((n, getattr(self, n)) for n in TABLE)}

    def cli_args(self) -> list[str]:
        """``isplan check`` arguments that rebuild this plan (model first)."""
        args = [self.model]
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
            elif text.startswith("-"):  # argparse would read it as an option
                args.append(f"{spec.cli}={text}")
            else:
                args += [spec.cli, text]
        return args

    def cli_command(self) -> str:
        """The shell-safe ``isplan check`` line that rebuilds this plan (every value quoted)."""
        return shlex.join(["isplan", "check", *self.cli_args()])

    @property
    def states_layout(self) -> bool:
        """Whether the plan describes a pipeline layout beyond the neutral single stage."""
        return self.split is not None or self.layout is not None or self.pp != 1

    @property
    def given_parallelism(self) -> bool:
        """Whether the plan states its parallelism (memory and GPUs then join the verdict): set by a
        launcher, by giving any parallel/memory setting, or implied by one that is not neutral."""
        return self.parallel


TABLE: dict[str, Field] = {f.name: f.metadata["isplan"] for f in fields(Plan)}
#: every field's neutral value: what an absent URL key or CLI flag means
NEUTRAL_VALUES: dict[str, Any] = {f.name: f.default for f in fields(Plan)}


_PARALLEL_GROUPS = ("parallel", "memory")


def _implied_parallel(plan: Plan) -> bool:
    """Any parallel or memory setting other than ``parallel`` itself differs from the neutral plan."""
    return any(getattr(plan, n) != NEUTRAL_VALUES[n] for n, s in TABLE.items()
               if s.group in _PARALLEL_GROUPS and n != "parallel")


def _states_parallelism(given: Iterable[str]) -> bool:
    """Whether any of the given fields (by name) is a parallel or memory setting: giving one, even
    at its neutral value (``--tp 1``, ``gpu=h100-80gb``), states the plan's parallelism."""
    return any(TABLE[n].group in _PARALLEL_GROUPS for n in given)


BY_URL: dict[str, str] = {spec.url: name for name, spec in TABLE.items()}

#: The page's plan for an empty query: THUDM/slime ``scripts/run-glm5.2-744B-A40B.sh`` as launched
#: (TP4 CP8 PP8 EP32 ETP1 SP, first 14 / last 16, full uniform recompute of 1 layer, 8192 tokens
#: per GPU, optimizer CPU offload with the precision-aware optimizer, no ``--mtp-num-layers``), with
#: its conversion layout (TP8 PP2 last 40) in the second slot.
SLIME_GLM52_PROFILE = Plan(
    model="glm-5.2", engine="slime", mode="flags", pp=8, first=14, last=16, tp=4, cp=8, ep=32, etp=1, dp=1,
    sp=True, tokens_per_gpu=8192, recompute="full", recompute_method="uniform", recompute_num_layers=1,
    offload=True, overlap_cpu_optimizer=True, precision_aware=True, conv="flags", conv_pp=2, conv_last=40,
)


def _derived_mode(layout: str | None, split: tuple[int, ...] | None) -> str:
    """The layout mode a URL or command line without ``mode`` means: a layout string, else stage
    sizes, else Megatron flags."""
    return "layout" if layout else "split" if split is not None else "flags"


def _derived_conv(conv_split: tuple[int, ...] | None, conv_pp: int | None) -> str:
    return "split" if conv_split is not None else "flags" if conv_pp is not None else "none"


def applies(spec: Field, mode: str) -> bool:
    return not spec.modes or mode in spec.modes


def format_value(spec: Field, value: Any) -> str:
    if spec.kind == "bool":
        return "1" if value else "0"
    if spec.kind == "sizes":
        return ",".join(map(str, value))
    if spec.kind == "float":
        return f"{value:.15g}"
    return str(value)


# ----------------------------------------------------------------------------- parsing
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


def _label(spec: Field) -> str:
    return spec.cli or spec.url


def parse_value(spec: Field, raw: object) -> Any:
    """One value from text (URL, CLI) or JSON (receipts), bounded before any work; ValueError names it."""
    label = _label(spec)
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text not in ("0", "1", "true", "false", "on", "off"):
            raise ValueError(f"{label} must be 1 or 0, got {str(raw)[:40]!r}")
        return text in ("1", "true", "on")
    if spec.kind == "choice":
        if raw not in spec.choices:
            raise ValueError(f"{label} must be one of {', '.join(spec.choices)}, got {str(raw)[:40]!r}")
        return raw
    if spec.kind == "text":
        text = str(raw)
        if len(text) > spec.max_len:
            raise ValueError(f"{label} is {len(text):,} characters; the limit is {spec.max_len:,}")
        return text
    if spec.kind == "sizes":
        return parse_sizes(raw, label, hi=int(spec.hi or MAX_LAYERS))
    if spec.kind == "float":
        try:
            number = float(str(raw))
        except ValueError:
            raise ValueError(f"{label} must be a number, got {str(raw)[:40]!r}") from None
        if not (spec.lo is not None and spec.hi is not None and spec.lo <= number <= spec.hi):
            raise ValueError(f"{label} must be between {spec.lo:.15g} and {spec.hi:.15g}, got {str(raw)[:40]}")
        return number
    return parse_int(raw, label, int(spec.lo or 0), int(spec.hi or 0))


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


def plan_from_query(params: Mapping[str, str], *, empty: Plan | None = None) -> tuple[Plan, list[FieldProblem]]:
    """The plan a URL describes, and every field problem (a bad value keeps the field's default).

    An empty query is ``empty`` (the page passes :data:`SLIME_GLM52_PROFILE`); otherwise an absent
    key takes its neutral default, so a share URL always means the same plan. Without ``mode`` the
    layout is whatever was given (layout string > split > flags).
    """
    given = {BY_URL[k]: v for k, v in params.items() if k in BY_URL}
    if not given and empty is not None:
        return empty, []
    values: dict[str, Any] = {}
    problems: list[FieldProblem] = []
    for name, raw in given.items():
        spec = TABLE[name]
        if str(raw).strip() == "":
            continue
        try:
            values[name] = parse_value(spec, raw)
        except ValueError as exc:
            problems.append(FieldProblem(spec.url, f"{exc} ({spec.help})"))
    values.setdefault("mode", _derived_mode(values.get("layout"), values.get("split")))
    values.setdefault("conv", _derived_conv(values.get("conv_split"), values.get("conv_pp")))
    if _states_parallelism(values):  # a usable parallel/memory value, even a neutral one
        values["parallel"] = True
    plan = Plan(**values)
    conflicts = plan_conflicts(plan, strict=False)
    # bounded before any work: the page shows the offending setting unset
    if any(p.field == "split" and "stages: PP would be over" in p.message for p in conflicts):
        plan = replace(plan, split=None)
    if any(p.field == "dp" for p in conflicts):
        plan = replace(plan, dp=None)
    return plan, problems + conflicts


def strict_plan(params: Mapping[str, str], *, empty: Plan | None = None) -> Plan:
    """:func:`plan_from_query` for the API: any problem is a :class:`PlanError` (a 422)."""
    plan, problems = plan_from_query(params, empty=empty)
    if problems:
        raise PlanError(problems)
    return plan


def plan_conflicts(plan: Plan, *, strict: bool) -> list[FieldProblem]:
    """Cross-field rules: the layout description in use must be complete, the world TP x CP x PP x
    DP is bounded, and settings of another mode are named.

    ``strict`` (the CLI, the API): a setting that cannot apply in the plan's mode is an error;
    otherwise (the page) it is kept in the URL and explained, never silently used.
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
    if strict:
        for name in ignored_fields(plan):
            spec = TABLE[name]
            out.append(FieldProblem(spec.url, f"{_label(spec)} does not apply when the layout is given by "
                                              f"{_MODE_WORDS[plan.mode]}; drop it"))
        stray = [n for n in ("conv_pp", "conv_first", "conv_last") if getattr(plan, n) is not None]
        if plan.conv == "none" and stray:
            out.append(FieldProblem(TABLE[stray[0]].url, f"{TABLE[stray[0]].cli} needs --conv-pp N (the conversion "
                                                         "pipeline size)"))
        elif plan.conv == "split" and stray:
            out.append(FieldProblem(TABLE[stray[0]].url, f"{TABLE[stray[0]].cli} does not apply with --conv-split; "
                                                         "drop one of them"))
    if plan.conv == "split" and plan.conv_split is None:
        out.append(FieldProblem("conv_split", "conv=split needs conv_split=LIST of conversion stage sizes"))
    if plan.conv == "flags" and plan.conv_pp is None:
        out.append(FieldProblem("conv_pp", "conv=flags needs conv_pp=N (the conversion pipeline size)"))
    return out


_MODE_WORDS = {"flags": "Megatron flags", "split": "stage sizes (--split)", "layout": "a layout string (--layout)"}


def ignored_fields(plan: Plan) -> list[str]:
    """Fields set to a non-neutral value that the plan's layout mode does not use."""
    return [name for name, spec in TABLE.items()
            if not applies(spec, plan.mode) and getattr(plan, name) != NEUTRAL_VALUES[name]]


def mode_note(plan: Plan) -> str | None:
    """Words for the page: which given settings the current layout mode does not use."""
    names = ignored_fields(plan)
    if not names:
        return None
    return (f"{', '.join(TABLE[n].url for n in names)} not used: the layout is given by "
            f"{_MODE_WORDS[plan.mode]}")


# ----------------------------------------------------------------------------- CLI
GROUP_TITLES = {
    "model": "model and roles",
    "layout": "layout (one of: --split, --pp with flags, --pp with --layout, --launcher)",
    "parallel": "parallelism (Megatron flag names in brackets; a --launcher supplies them)",
    "memory": "memory",
    "flops": "FLOPs",
    "conversion": "conversion layout (a second slot, e.g. --conv-pp 2 --conv-last 40)",
    "serving": "serving (--engine vllm|sglang: --pp N [--split PARTITION] is the engine's PP layer partition)",
    "maxtext": "MaxText pipeline (--engine maxtext)",
}


_METAVARS = {"int": "N", "float": "GB", "text": "TEXT", "sizes": "LIST"}


def add_cli_arguments(parser: Any, groups: Iterable[str] = tuple(GROUP_TITLES)) -> None:
    """argparse options for the plan fields of ``groups`` (default None: given vs absent is known)."""
    for group in groups:
        add_cli_fields(parser.add_argument_group(GROUP_TITLES[group]),
                       [n for n, s in TABLE.items() if s.group == group and s.cli is not None])


def add_cli_fields(group: Any, names: Iterable[str]) -> None:
    """One argparse option per named plan field, from the table (flag, type, bounds, help)."""
    for name in names:
        spec = TABLE[name]
        assert spec.cli is not None, name
        flags = " / ".join(spec.megatron + spec.slime)
        text = spec.help + (f" [{flags}]" if flags else "")
        if spec.kind == "bool":
            group.add_argument(spec.cli, dest=name, action="store_true", default=None, help=text)
        elif spec.kind == "choice":
            group.add_argument(spec.cli, dest=name, choices=spec.choices, default=None, help=text)
        else:
            group.add_argument(spec.cli, dest=name, default=None, metavar=spec.metavar or _METAVARS[spec.kind],
                               help=text + (f" ({spec.bounds_text()})" if spec.bounds_text() else ""))


def plan_from_cli(namespace: Any, model: str) -> Plan:
    """The plan the CLI flags describe; every problem is a :class:`PlanError` (exit 2)."""
    values: dict[str, Any] = {"model": model}
    problems: list[FieldProblem] = []
    for name, spec in TABLE.items():
        raw = getattr(namespace, name, None)
        if raw is None or spec.cli is None:
            continue
        try:
            values[name] = parse_value(spec, raw)
        except ValueError as exc:
            problems.append(FieldProblem(spec.url, str(exc)))
    if problems:
        raise PlanError(problems)
    values["mode"] = _derived_mode(values.get("layout"), values.get("split"))
    values["conv"] = _derived_conv(values.get("conv_split"), values.get("conv_pp"))
    if _states_parallelism(values):
        values["parallel"] = True
    plan = Plan(**values)
    problems = plan_conflicts(plan, strict=True)
    if problems:
        raise PlanError(problems)
    return plan


# ----------------------------------------------------------------------------- launcher flags
FLAG_FIELDS: dict[str, str] = {flag: name for name, spec in TABLE.items() for flag in spec.megatron + spec.slime}


def plan_from_flags(values: Mapping[str, str], switches: Iterable[str], base: Plan) -> tuple[Plan, list[FieldProblem]]:
    """A plan from a launcher's final command line: every table field whose Megatron/slime flag
    appears takes its value (switches set booleans); the rest keep ``base``. The layout mode
    follows the flags (a layout string wins, else Megatron flags)."""
    out: dict[str, Any] = {}
    problems: list[FieldProblem] = []
    for flag, raw in values.items():
        name = FLAG_FIELDS.get(flag)
        if name is None or name in out:
            continue
        spec = TABLE[name]
        try:
            out[name] = parse_value(spec, raw)
        except ValueError as exc:
            problems.append(FieldProblem(spec.url, f"{flag} {str(raw)[:40]}: {exc}"))
    for flag in switches:
        name = FLAG_FIELDS.get(flag)
        if name is not None and TABLE[name].kind == "bool":
            out[name] = True
    out["mode"] = "layout" if out.get("layout") else "flags"
    return replace(base, **out), problems
