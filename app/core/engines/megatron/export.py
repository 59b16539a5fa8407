"""Exports of a checked plan: Megatron arguments, a slime ``PERF_ARGS`` block, the layout string,
the conversion flags and an ``isplan check`` command line - every one safe to paste into bash.

Spellings follow each engine's own parser:

* Megatron (NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at commit
  d98e8a64ddf34856e74b24714e3bedb2f5a39553; the option strings are listed in
  ``app/core/data/megatron_arguments.txt``): the plan's ``--cp-comm-type`` (emitted with CP > 1;
  DSA with CP needs ``allgather``, the verdict says so); the recompute flags exactly as the plan
  states them (``--recompute-granularity``, and ``--recompute-method`` / ``--recompute-num-layers`` /
  ``--recompute-modules`` / ``--distribute-saved-activations`` only when given: Megatron's
  defaults are None); ``--hierarchical-context-parallel-sizes``, ``--seq-length``,
  ``--max-position-embeddings`` and the attention flags (``--group-query-attention``,
  ``--num-query-groups``, ``--multi-latent-attention``, the MLA dims) when the plan gives them;
  ``--use-distributed-optimizer`` unless the plan has none; DSA index sharing is ``--dsa-indexer-topk-freq`` /
  ``--dsa-indexer-skip-topk-offset``; p2p overlap is on by default and only
  ``--no-overlap-p2p-communication`` exists; ``--mtp-num-layers N`` is emitted only when the plan
  builds N > 0 MTP layers.
* slime (THUDM/slime ``slime/utils/arguments.py`` at commit
  624b824a898ab0ec1fcb4d373004c7f3852bf515, ``scripts/run-glm5.2-744B-A40B.sh``): its own
  ``--allgather-cp`` switch for the all-gather CP layout, and no ``--dsa-indexer-*`` flags (slime's
  GLM-5 model reads ``index_topk_freq`` / ``index_skip_topk_offset`` from the HF config); the
  Megatron flags slime forwards keep Megatron's names; ``--use-dynamic-batch-size
  --max-tokens-per-gpu N`` when a token budget is given (slime reads the budget only with dynamic
  batching).

Every value goes through :func:`shlex.quote`, so model ids or values holding ``$(...)``, backticks
or ``;`` stay literal text. Exports exist only for a plan Megatron accepts (``check.megatron_flags``
is empty otherwise), and are built from plain settings: this module never imports the web layer.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from functools import lru_cache

from app.core.engines.megatron.check import CheckResult
from app.core.model.parallelism import ParallelConfig
from app.core.plan import Plan

CP_COMM_FLAG = "--cp-comm-type"
#: the precision-aware optimizer's dtype settings (plan fields and Megatron flags of the same names)
OPTIMIZER_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
SLIME_ALLGATHER_CP = "--allgather-cp"
NO_OVERLAP_FLAG = "--no-overlap-p2p-communication"


@dataclass(frozen=True)
class ExportSettings:
    """The parallel settings an export adds to the pipeline flags (Megatron's names in comments)."""

    tp: int = 1                                # --tensor-model-parallel-size
    cp: int = 1                                # --context-parallel-size
    ep: int = 1                                # --expert-model-parallel-size
    etp: int | None = None                     # --expert-tensor-parallel-size (None: not emitted)
    sp: bool = False                           # --sequence-parallel
    recompute: str = "none"                    # --recompute-granularity: none | selective | full
    recompute_method: str | None = None        # --recompute-method (None: not given, not emitted)
    recompute_num_layers: int | None = None    # --recompute-num-layers (None: not given, not emitted)
    optimizer_cpu_offload: bool = False        # --optimizer-cpu-offload
    overlap_cpu_optimizer_d2h_h2d: bool = False
    use_precision_aware_optimizer: bool = False
    #: --main-grads-dtype, --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype (emitted when not fp32)
    optimizer_dtypes: tuple[tuple[str, str], ...] = ()
    distributed_optimizer: bool = False        # --use-distributed-optimizer
    max_tokens_per_gpu: int | None = None      # slime only
    precision: str = "bf16"                    # --bf16 [--fp8-format/--fp8-recipe | --fp4-format/--fp4-recipe]
    recompute_modules: tuple[str, ...] | None = None   # --recompute-modules (selective only)
    distribute_saved_activations: bool = False          # --distribute-saved-activations
    moe_grouped_gemm: bool = False                      # --moe-grouped-gemm
    cp_comm_type: str = "p2p"                           # --cp-comm-type (slime: --allgather-cp for allgather)
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    seq_length: int | None = None                       # --seq-length
    max_position_embeddings: int | None = None          # --max-position-embeddings
    #: the attention flags the plan gives, as Megatron spells them (``[]``: the model's own arguments)
    model_argv: tuple[str, ...] = ()
    #: the overlap, CUDA-graph and FP8 switches the plan turns on (how fast it runs, not where layers go)
    time_argv: tuple[str, ...] = ()

    @classmethod
    def from_parallel(cls, par: ParallelConfig) -> ExportSettings:
        """The export settings of a :class:`~app.core.model.parallelism.ParallelConfig` (ETP is emitted
        only when it differs from TP, Megatron's default)."""
        return cls(tp=par.tp, cp=par.cp, ep=par.ep, etp=par.etp if par.etp not in (None, par.tp) else None,
                   sp=par.sp, recompute=par.recompute, recompute_method=par.recompute_method,
                   recompute_num_layers=par.recompute_num_layers, optimizer_cpu_offload=par.optimizer_cpu_offload,
                   overlap_cpu_optimizer_d2h_h2d=par.optimizer_cpu_offload,
                   use_precision_aware_optimizer=par.use_precision_aware_optimizer,
                   optimizer_dtypes=tuple((name, getattr(par, name)) for name in OPTIMIZER_DTYPES
                                          if getattr(par, name) != "fp32"),
                   distributed_optimizer=par.distributed_optimizer, max_tokens_per_gpu=par.tokens_per_gpu,
                   recompute_modules=par.recompute_modules, distribute_saved_activations=par.distribute_saved_activations,
                   moe_grouped_gemm=par.moe_grouped_gemm, cp_comm_type=par.cp_comm_type,
                   hierarchical_context_parallel_sizes=par.hierarchical_context_parallel_sizes)

    @classmethod
    def from_plan(cls, plan: Plan, par: ParallelConfig) -> ExportSettings:
        """:meth:`from_parallel` plus what only the plan states: its ``--seq-length``,
        ``--max-position-embeddings`` and attention flags (each emitted only when given)."""
        model: list[str] = []
        if plan.group_query_attention:
            model.append("--group-query-attention")
        if plan.multi_latent_attention:
            model.append("--multi-latent-attention")
        for name in ("num_query_groups", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                     "v_head_dim"):
            value = getattr(plan, name)
            if value is not None:
                model += ["--" + name.replace("_", "-"), str(value)]
        return replace(cls.from_parallel(par), seq_length=plan.seq_length,
                       max_position_embeddings=plan.max_position_embeddings, model_argv=tuple(model),
                       precision=plan.precision, time_argv=tuple(_time_argv(plan)))


#: the plan's on/off speed switches, as Megatron spells them (each emitted only when on). FP8 attention
#: is not among them: Megatron-LM keeps ``fp8_dot_product_attention`` out of its arguments
#: (``arguments.py`` @ d98e8a64 lists it among the config fields it does not expose; Megatron-Bridge
#: sets it in its mixed-precision config).
TIME_SWITCHES = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "overlap_moe_expert_parallel_comm",
                 "fp8_output_proj")


def _time_argv(plan: Plan) -> list[str]:
    """The plan's speed settings as Megatron's flags: the switches that are on, the MoE dispatcher
    when the plan names one and a CUDA-graph implementation other than ``none`` (``full_iteration``
    with ``--no-check-for-nan-in-loss-and-grad``, which ``validate_args`` asserts for it)."""
    argv = ["--" + name.replace("_", "-") for name in TIME_SWITCHES if getattr(plan, name)]
    if plan.moe_token_dispatcher_type is not None:
        argv += ["--moe-token-dispatcher-type", plan.moe_token_dispatcher_type]
    if plan.cuda_graph_impl != "none":
        argv += ["--cuda-graph-impl", plan.cuda_graph_impl]
    if plan.cuda_graph_impl == "full_iteration":
        argv.append("--no-check-for-nan-in-loss-and-grad")
    return argv


#: ``shlex.quote`` kept by the word: the exports quote the same ~70 flags and values on every update
_quote = lru_cache(maxsize=4096)(shlex.quote)


def shell_join(argv: list[str] | tuple[str, ...]) -> str:
    """One bash command line whose words are exactly ``argv`` (every word quoted as needed)."""
    return " ".join(map(_quote, argv))


def _groups(argv: list[str]) -> list[list[str]]:
    """Split ``argv`` into [flag, values...] groups for one-flag-per-line layouts."""
    out: list[list[str]] = []
    for a in argv:
        if a.startswith("--") or not out:
            out.append([a])
        else:
            out[-1].append(a)
    return out


def _recompute_argv(s: ExportSettings) -> list[str]:
    """``--recompute-granularity`` and what goes with it, as the plan states them (Megatron refuses a
    method or a layer count with selective, and needs both with full: the verdict says so)."""
    if s.recompute == "none":
        return ["--distribute-saved-activations"] if s.distribute_saved_activations else []
    argv = ["--recompute-granularity", s.recompute]
    if s.recompute_method is not None:
        argv += ["--recompute-method", s.recompute_method]
    if s.recompute_num_layers is not None:
        argv += ["--recompute-num-layers", str(s.recompute_num_layers)]
    if s.recompute == "selective" and s.recompute_modules is not None:
        argv += ["--recompute-modules", *s.recompute_modules]
    if s.distribute_saved_activations:
        argv.append("--distribute-saved-activations")
    return argv


def _parallel_argv(s: ExportSettings) -> list[str]:
    argv = ["--tensor-model-parallel-size", str(s.tp), "--context-parallel-size", str(s.cp),
            "--expert-model-parallel-size", str(s.ep)]
    if s.etp is not None:
        argv += ["--expert-tensor-parallel-size", str(s.etp)]
    if s.hierarchical_context_parallel_sizes is not None:
        argv += ["--hierarchical-context-parallel-sizes", *map(str, s.hierarchical_context_parallel_sizes)]
    if s.sp:
        argv.append("--sequence-parallel")
    for value, flag in ((s.seq_length, "--seq-length"), (s.max_position_embeddings, "--max-position-embeddings")):
        if value is not None:
            argv += [flag, str(value)]
    argv += list(s.model_argv)
    argv += _recompute_argv(s)
    argv += list(s.time_argv)
    if s.moe_grouped_gemm:
        argv.append("--moe-grouped-gemm")
    for on, flag in ((s.distributed_optimizer, "--use-distributed-optimizer"),
                     (s.optimizer_cpu_offload, "--optimizer-cpu-offload"),
                     (s.overlap_cpu_optimizer_d2h_h2d, "--overlap-cpu-optimizer-d2h-h2d"),
                     (s.use_precision_aware_optimizer, "--use-precision-aware-optimizer")):
        if on:
            argv.append(flag)
    for name, dtype in s.optimizer_dtypes:
        argv += ["--" + name.replace("_", "-"), dtype]
    return argv


def _pipeline_argv(check: CheckResult) -> list[str]:
    """The plan's pipeline flags; ``--no-overlap-p2p-communication`` when the plan was checked with
    p2p overlap off (Megatron ignores it without interleaving, so only then)."""
    argv = list(check.megatron_flags)
    if argv and not check.spec.overlap_p2p and check.plan.vpp > 1:
        argv.append(NO_OVERLAP_FLAG)
    return argv


def _shared_argv(check: CheckResult, s: ExportSettings) -> list[str]:
    """The pipeline, parallel and precision flags both exports begin with; ``[]`` for a plan Megatron
    refuses. Precision as Megatron-Bridge's mixed-precision presets spell it (``app/core/time/precision.py``:
    ``--bf16`` and, for FP8 / FP4, the format, recipe and parameter gather)."""
    from app.core.time.precision import megatron_flags as precision_flags

    pipeline = _pipeline_argv(check)
    if not pipeline:
        return []
    return pipeline + _parallel_argv(s) + precision_flags(s.precision, distributed_optimizer=s.distributed_optimizer)


def megatron_argv(check: CheckResult, settings: ExportSettings | None = None) -> list[str]:
    """Megatron's arguments for ``check`` as an argv list; ``[]`` when Megatron would refuse the plan.

    DSA flags carry the freq/offset the verdict's roles were built from (not emitted for a what-if
    pattern override, which no freq/offset can express)."""
    s = settings or ExportSettings()
    argv = _shared_argv(check, s)
    if not argv:
        return []
    if s.cp > 1 or s.cp_comm_type != "p2p":   # the plan's type (DSA with CP > 1 must be allgather: the verdict)
        argv += [CP_COMM_FLAG, *s.cp_comm_type.split(",")]   # one type, or one per layer
    roles = check.roles
    if check.model.has_indexer and roles.rule != "pattern_override" and roles.freq is not None:
        argv += ["--dsa-indexer-topk-freq", str(roles.freq), "--dsa-indexer-skip-topk-offset", str(roles.offset)]
    return argv


def megatron_text(check: CheckResult, settings: ExportSettings | None = None) -> str:
    """:func:`megatron_argv` as shell-safe text, one flag per line joined by `` \\`` continuations."""
    return " \\\n    ".join(shell_join(g) for g in _groups(megatron_argv(check, settings)))


def slime_argv(check: CheckResult, settings: ExportSettings | None = None) -> list[str]:
    """The flags of a slime ``PERF_ARGS`` array, in slime's spellings; ``[]`` for a refused plan."""
    s = settings or ExportSettings()
    argv = _shared_argv(check, s)
    if not argv:
        return []
    if set(s.cp_comm_type.split(",")) == {"allgather"}:
        argv.append(SLIME_ALLGATHER_CP)   # slime's spelling of the all-gather CP layout
    elif s.cp_comm_type != "p2p":
        argv += [CP_COMM_FLAG, *s.cp_comm_type.split(",")]   # forwarded to Megatron
    if s.max_tokens_per_gpu is not None:   # only read with dynamic batching (slime arguments.py)
        argv += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(s.max_tokens_per_gpu)]
    return argv


def slime_perf_args(check: CheckResult, settings: ExportSettings | None = None) -> str:
    """A bash ``PERF_ARGS=( ... )`` block as in slime's ``scripts/run-*.sh``; ``""`` for a refused plan."""
    argv = slime_argv(check, settings)
    if not argv:
        return ""
    return "PERF_ARGS=(\n" + "".join(f"   {shell_join(g)}\n" for g in _groups(argv)) + ")"


def layout_string(check: CheckResult) -> str:
    """The plan as a ``--pipeline-model-parallel-layout`` value (unquoted; quote it for a shell)."""
    return check.layout_string


def conversion_argv(conversion: CheckResult) -> list[str]:
    """The pipeline flags of a conversion layout (checkpoint conversion runs its own PP split)."""
    return list(conversion.megatron_flags)


def conversion_text(conversion: CheckResult) -> str:
    return shell_join(conversion_argv(conversion))


def exports(check: CheckResult, settings: ExportSettings | None = None, *,
            conversion: CheckResult | None = None) -> dict[str, str]:
    """Every export of ``check`` by name (``megatron``, ``slime``, ``layout``, ``conversion``);
    empty when Megatron would refuse the plan. The ``isplan check`` line of a whole plan is
    :meth:`app.core.plan.Plan.cli_command`."""
    if not check.megatron_flags:
        return {}
    out = {"megatron": megatron_text(check, settings), "slime": slime_perf_args(check, settings),
           "layout": layout_string(check)}
    if conversion is not None and conversion.megatron_flags:
        out["conversion"] = conversion_text(conversion)
    return out
