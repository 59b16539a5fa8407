"""Megatron-Core: its role rule, stage placement, acceptance, parallel constraints, memory
conventions, flags and exports (NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553).

The pieces, each in its own module of this package:

* :mod:`.placement` - the stages Megatron builds from ``--pipeline-model-parallel-size``,
  first/last, VPP or a layout string, with ``validate_args`` / ``TransformerConfig``'s refusals;
* :mod:`.check` - the release-gate check of one layout (roles built from freq/offset, the
  checkpoint comparison, the boundary rule);
* :mod:`.parallel` - the parallel constraints (world, heads, experts, CP, SP, micro-batches,
  optimizer flags);
* :mod:`.export` - Megatron arguments and slime's ``PERF_ARGS``, shell-safe.

Memory per pipeline rank is :func:`app.core.model.memory.training_memory` (Megatron's allocator
conventions: BF16 params, FP32 main grads, the distributed optimizer's shards). slime
(:mod:`app.core.engines.slime`) and the transformers-role what-if (:mod:`app.core.engines.hf`) are
this engine with their own role rule and flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any, ClassVar

from app.core.content_cache import remember
from app.core.engines.base import Engine, Judgement, LaunchSyntax, LayoutCheck
from app.core.engines.megatron.check import MEGATRON_SHARED_START, CheckResult, engine_roles, run_check
from app.core.engines.megatron.export import ExportSettings, exports
from app.core.engines.megatron.hybrid_placement import read_pattern_flag
from app.core.engines.megatron.parallel import RULES, Rule, check_parallel
from app.core.engines.megatron.placement import interleave_error, materialise
from app.core.engines.megatron.timing import (
    MAX_EVENTS,
    MAX_LIVE_EVENTS,
    plan_time,
    recipe_stages,
    time_layer_costs,
    untimed_flags,
)
from app.core.engines.rules import ShareBehaviour
from app.core.layout.stages import LayoutInputError, PipelineSpec, PlanError, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import ParallelConfig
from app.core.model.roles import RoleMap, RoleRule, derive_roles, parse_pattern
from app.core.plan import TABLE, FieldProblem, Plan
from app.core.time.precision import get_precision, precision_of_flags
from app.core.verdict import Reason, ranges


def _megatron_full(n: int, freq: int, offset: int) -> bool:
    return max(n - max(offset, 1), 0) % freq == 0


#: ``megatron/core/transformer/experimental_attention_variant/dsa.py: is_dsa_skip_topk_layer``: 1-based
#: layer ``n`` skips (is shared) iff ``max(n - max(offset, 1), 0) % freq != 0``; flags
#: ``--dsa-indexer-topk-freq`` (default 1) / ``--dsa-indexer-skip-topk-offset`` (default 0). Megatron never
#: reads ``indexer_types``; MTP depth ``k`` applies the rule to ``k`` (``multi_token_prediction.py``).
MEGATRON_RULE = RoleRule(
    "megatron", (1, 0), _megatron_full, reads_declared=False, mtp_follows_rule=True,
    source="NVIDIA/Megatron-LM megatron/core/transformer/experimental_attention_variant/dsa.py @ d98e8a64",
    set_by="--dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset", flag="--dsa-indexer-topk-freq")

#: Megatron's own spelling of every plan setting it reads (``megatron/training/arguments.py``)
MEGATRON_FLAGS: dict[str, str] = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--num-attention-heads": "num_attention_heads",
    "--num-experts": "num_experts", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--dsa-indexer-topk-freq": "dsa_topk_freq", "--dsa-indexer-skip-topk-offset": "dsa_skip_topk_offset",
    "--pipeline-model-parallel-size": "pp", "--decoder-first-pipeline-num-layers": "first",
    "--decoder-last-pipeline-num-layers": "last", "--num-virtual-stages-per-pipeline-rank": "vpp",
    "--virtual-pipeline-model-parallel-size": "vpp", "--num-layers-per-virtual-pipeline-stage": "layers_per_vstage",
    "--account-for-embedding-in-pipeline-split": "account_for_embedding",
    "--account-for-loss-in-pipeline-split": "account_for_loss", "--pipeline-model-parallel-layout": "layout",
    "--mtp-num-layers": "mtp_layers", "--no-overlap-p2p-communication": "no_overlap_p2p_communication",
    "--tensor-model-parallel-size": "tp", "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp", "--sequence-parallel": "sp", "--micro-batch-size": "mbs",
    "--global-batch-size": "global_batch", "--seq-length": "seq_length", "--recompute-granularity": "recompute",
    "--recompute-method": "recompute_method", "--recompute-num-layers": "recompute_num_layers",
    "--optimizer-cpu-offload": "optimizer_cpu_offload",
    "--overlap-cpu-optimizer-d2h-h2d": "overlap_cpu_optimizer_d2h_h2d",
    "--use-precision-aware-optimizer": "use_precision_aware_optimizer",
    "--main-grads-dtype": "main_grads_dtype",
    "--main-params-dtype": "main_params_dtype",
    "--exp-avg-dtype": "exp_avg_dtype",
    "--exp-avg-sq-dtype": "exp_avg_sq_dtype",
    "--make-vocab-size-divisible-by": "make_vocab_size_divisible_by",
    "--recompute-modules": "recompute_modules", "--tp-comm-overlap": "tp_comm_overlap",
    "--overlap-grad-reduce": "overlap_grad_reduce", "--overlap-param-gather": "overlap_param_gather",
    "--cp-comm-type": "cp_comm_type", "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
    "--cuda-graph-impl": "cuda_graph_impl", "--fp8-output-proj": "fp8_output_proj",
    "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    # issue 19: the training settings Megatron accepts and refuses (engines/megatron/parallel.py)
    "--hierarchical-context-parallel-sizes": "hierarchical_context_parallel_sizes",
    "--max-position-embeddings": "max_position_embeddings",
    "--distribute-saved-activations": "distribute_saved_activations", "--moe-grouped-gemm": "moe_grouped_gemm",
    "--group-query-attention": "group_query_attention", "--num-query-groups": "num_query_groups",
    "--multi-latent-attention": "multi_latent_attention", "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim",
    "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim", "--v-head-dim": "v_head_dim",
}

#: layouts the time objective simulates (the min-max best ones by per-layer time)
TIME_CANDIDATES = 8

#: Megatron's switches that set a plan field to one value (``megatron/training/arguments.py`` @ d98e8a64):
#: ``--recompute-activations`` is the old spelling of selective recompute (lines 607-609: "if
#: args.recompute_activations: args.recompute_granularity = 'selective'", applied after parsing);
#: ``--use-distributed-optimizer`` (line 3156) turns the distributed optimizer on.
MEGATRON_FLAG_SETTINGS: dict[str, tuple[str, Any]] = {
    "--recompute-activations": ("recompute", "selective"),
    "--use-distributed-optimizer": ("no_distributed_optimizer", False),
}
#: What a Megatron command line means where Megatron's default differs from isplan's: without
#: ``--use-distributed-optimizer`` (``action='store_true'``, arguments.py:3156;
#: ``OptimizerConfig.use_distributed_optimizer = False``, megatron/core/optimizer/optimizer_config.py:324)
#: there is no distributed optimizer. isplan's own plans (URL, CLI) keep assuming it unless
#: ``no_distributed_optimizer``, as they always have.
MEGATRON_ABSENT_DEFAULTS: dict[str, Any] = {"no_distributed_optimizer": True}

#: the plan fields a training engine of the Megatron family reads
TRAINING_FIELDS = frozenset(n for n, s in TABLE.items() if s.group not in ("serving", "maxtext")) - {"engine_version"}


def pipeline_spec(plan: Plan) -> PipelineSpec:
    """The Megatron pipeline description of the plan's layout mode.

    In split mode PP is implied by the sizes; a PP other than the neutral 1 must agree with them.
    Without ``mtp_layers`` no MTP layer is built: ``--mtp-num-layers`` defaults to None in Megatron
    and slime (THUDM/slime ``slime/utils/arguments.py``).
    """
    common: dict[str, Any] = {"vpp": plan.vpp, "mtp_layers": plan.mtp_layers or 0,
                              "overlap_p2p": not plan.no_overlap_p2p_communication}
    if plan.mode == "split":
        return PipelineSpec(split=plan.split or (), pp=plan.pp if plan.pp != 1 else None, **common)
    if plan.mode == "layout":   # Megatron refuses a layout with first/last/account_for_* (placement says so)
        return PipelineSpec(pp=plan.pp, layout=plan.layout or "", first=plan.first, last=plan.last,
                            layers_per_vstage=plan.layers_per_vstage, account_for_embedding=plan.account_for_embedding,
                            account_for_loss=plan.account_for_loss, **common)
    return PipelineSpec(pp=plan.pp, first=plan.first, last=plan.last, layers_per_vstage=plan.layers_per_vstage,
                        account_for_embedding=plan.account_for_embedding, account_for_loss=plan.account_for_loss,
                        **common)


def conversion_spec(plan: Plan) -> PipelineSpec | None:
    mtp = plan.mtp_layers or 0
    if plan.conv == "split" and plan.conv_split:
        return PipelineSpec(split=plan.conv_split, mtp_layers=mtp)
    if plan.conv == "flags" and plan.conv_pp:
        return PipelineSpec(pp=plan.conv_pp, first=plan.conv_first, last=plan.conv_last, mtp_layers=mtp)
    return None


#: the MLA shape flags (read by Megatron only with ``--multi-latent-attention``)
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def states_attention(plan: Plan) -> bool:
    """Whether the plan defines the job's attention: any of Megatron's attention flags, or
    ``--num-attention-heads`` (a launcher's model arguments: without ``--group-query-attention`` or
    ``--multi-latent-attention`` beside it Megatron builds multi-head attention)."""
    return (plan.group_query_attention or plan.multi_latent_attention or plan.num_query_groups is not None
            or plan.num_attention_heads is not None or any(getattr(plan, n) is not None for n in MLA_FIELDS))


def built_query_groups(plan: Plan, heads: int) -> int:
    """The query groups Megatron builds: ``--num-query-groups`` only with ``--group-query-attention``
    (``megatron/training/argument_utils.py:330-333``), else ``None`` and so one per head
    (``transformer_config.py:1458-1459``)."""
    return plan.num_query_groups if plan.group_query_attention and plan.num_query_groups else heads


#: :func:`parallel_config`'s launches, each kept as its own key: a drag re-evaluates the same launch
#: with other stage sizes, and the caches keyed on it (a rule's checks, a rank's memory, the time
#: model's scopes) then find it by identity, its hash and derived sizes already computed. Bounded.
_LAUNCHES: dict[ParallelConfig, ParallelConfig] = {}
LAUNCHES_SIZE = 1024


def parallel_config(plan: Plan, stages: StagePlan, cfg: ModelConfig | None = None) -> ParallelConfig:
    """Megatron's parallel settings for the plan (``ValueError`` names a bad combination), the one
    kept in :data:`_LAUNCHES` when an equal launch was built before. The job's attention (MLA or
    not, query groups) is the plan's when it gives attention flags, else the config's."""
    par = _launch(plan, stages, cfg)
    found = _LAUNCHES.get(par)
    return found if found is not None else remember(_LAUNCHES, par, par, LAUNCHES_SIZE)


def _launch(plan: Plan, stages: StagePlan, cfg: ModelConfig | None) -> ParallelConfig:
    attention: dict[str, Any] = {}
    if cfg is not None and states_attention(plan):
        heads = plan.num_attention_heads or cfg.num_attention_heads
        attention = {"multi_latent_attention": plan.multi_latent_attention,
                     "query_groups": built_query_groups(plan, heads)}
    return ParallelConfig(**attention,
        tp=plan.tp, cp=plan.cp, pp=stages.pp, dp=plan.dp, gpus=plan.gpus, ep=plan.ep, etp=plan.etp,
        vpp=stages.vpp if stages.vpp > 1 else None, overlap_p2p_comm=not plan.no_overlap_p2p_communication,
        sp=plan.sp, mbs=plan.mbs, num_microbatches=plan.num_microbatches, global_batch=plan.global_batch,
        seq_length=plan.seq_length if (plan.seq_length or plan.tokens_per_gpu) else 4096,
        tokens_per_gpu=plan.tokens_per_gpu, recompute=plan.recompute, recompute_method=plan.recompute_method,
        recompute_num_layers=plan.recompute_num_layers, optimizer_cpu_offload=plan.optimizer_cpu_offload,
        use_precision_aware_optimizer=plan.use_precision_aware_optimizer,
        main_grads_dtype=plan.main_grads_dtype, main_params_dtype=plan.main_params_dtype,
        exp_avg_dtype=plan.exp_avg_dtype, exp_avg_sq_dtype=plan.exp_avg_sq_dtype,
        distributed_optimizer=not plan.no_distributed_optimizer, gpu=plan.gpu,
        gpu_capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None,
        host_memory_gb=plan.host_memory_gb, gpus_per_node=plan.gpus_per_node,
        make_vocab_size_divisible_by=plan.make_vocab_size_divisible_by, recompute_modules=plan.recompute_modules,
        distribute_saved_activations=plan.distribute_saved_activations, moe_grouped_gemm=plan.moe_grouped_gemm,
        cp_comm_type=plan.cp_comm_type, hierarchical_context_parallel_sizes=plan.hierarchical_context_parallel_sizes,
        tp_comm_overlap=plan.tp_comm_overlap, overlap_grad_reduce=plan.overlap_grad_reduce,
        overlap_param_gather=plan.overlap_param_gather,
        overlap_moe_expert_parallel_comm=plan.overlap_moe_expert_parallel_comm, fp8_output_proj=plan.fp8_output_proj,
        moe_token_dispatcher_type=plan.moe_token_dispatcher_type,
        precision=plan.precision,
        # compared with the sequence length the plan states (not the 4096 assumed without one)
        max_position_embeddings=plan.max_position_embeddings if plan.seq_length else None,
        expert_weight_bytes=get_precision(plan.precision).param_gather_bytes)


def memory_reasons(memory: dict[str, Any]) -> list[Reason]:
    """One reason for every pipeline rank over capacity (naming the ranks and the worst), one for
    host memory of the offloaded optimizer."""
    out = []
    host = memory.get("host_memory") or {}
    if host.get("offload_on") and not host.get("fits", True):
        out.append(Reason("memory", "host_over_capacity",
                          f"a node needs {host['max_node_bytes'] / 1e9:.1f} GB of host memory for the offloaded "
                          f"optimizer ({host['bytes_per_sharded_param']} B per sharded parameter, "
                          f"{host['gpus_per_node']} GPUs per node); it has {host['capacity_bytes_per_node'] / 1e9:.0f} GB",
                          "host_memory_gb"))
    over = [st for st in memory.get("stages", []) if not st.get("fits", True)]
    if over:
        worst = max(over, key=lambda st: st["total_bytes"])
        label = memory.get("gpu", {}).get("label", "the GPU")
        ranks = ranges([st["pp_rank"] for st in over])
        out.append(Reason("memory", "rank_over_capacity",
                          f"pp rank{'s' * (len(over) > 1)} {ranks} need{'s' * (len(over) == 1)} up to "
                          f"{worst['total_bytes'] / 1e9:.1f} GB per GPU (pp rank {worst['pp_rank']}); {label} holds "
                          f"{worst['capacity_bytes'] / 1e9:.0f} GB (largest term: {worst.get('dominant_label', '?')}); "
                          "recompute, offload the optimizer, or raise tp, pp or ep", "gpu"))
    return out


#: Megatron options (``megatron/training/arguments.py`` @ d98e8a64, ``app/core/data/megatron_arguments.txt``)
#: that change what a rank holds in memory but that no plan field carries (the optimizer dtypes are
#: plan settings: ``--main-grads-dtype`` ... ``--exp-avg-sq-dtype``)
MEMORY_UNREAD_FLAGS: tuple[tuple[str, bool, str], ...] = (
    ("--use-torch-fsdp2", False, "Megatron's own data parallelism (weights and gradients not sharded by FSDP)"),
    ("--use-megatron-fsdp", False, "Megatron's own data parallelism (weights and gradients not sharded by FSDP)"),
    ("--num-distributed-optimizer-instances", True, "one distributed-optimizer instance over the whole DP group"),
    ("--use-checkpoint-args", False, "the model shape of the config given (Megatron takes the layer count, widths, "
                                     "experts ... from the checkpoint's saved arguments, over the command line's)"),
)
#: Megatron-LM @ d98e8a64: ``parse_args`` replaces the whole namespace with ``--yaml-cfg``'s file
#: (``args = load_yaml(args.yaml_cfg)``, megatron/training/arguments.py); with ``--use-checkpoint-args``,
#: ``--use-mp-args-from-checkpoint-args`` forces TP, PP, VPP and EP from the checkpoint's saved arguments
#: (``load_args_from_checkpoint``, megatron/training/checkpointing.py)
REPLACING_FLAGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("--yaml-cfg", (), "Megatron replaces every command-line argument with that YAML file's (megatron/training/"
                       "arguments.py parse_args: args = load_yaml(args.yaml_cfg)), which isplan does not read"),
    ("--use-mp-args-from-checkpoint-args", ("--use-checkpoint-args",),
     "with --use-checkpoint-args Megatron takes TP, PP, VPP and EP from the checkpoint's saved arguments "
     "(megatron/training/checkpointing.py load_args_from_checkpoint), which isplan cannot read; state them on "
     "the command line instead"),
)


class MegatronEngine(Engine):
    """Megatron-Core (``pretrain_gpt.py``)."""

    name = "megatron"
    label = "Megatron-LM"
    acceptance_kind = "megatron"
    role_rule: ClassVar[RoleRule | None] = MEGATRON_RULE
    fields = TRAINING_FIELDS
    flags: ClassVar[dict[str, str]] = MEGATRON_FLAGS
    flag_settings: ClassVar[dict[str, tuple[str, Any]]] = MEGATRON_FLAG_SETTINGS
    absent_defaults: ClassVar[dict[str, Any]] = MEGATRON_ABSENT_DEFAULTS
    #: the parallel and training-setting rules the engine judges (engines/megatron/parallel.py)
    rules: ClassVar[tuple[Rule, ...]] = RULES
    source = "NVIDIA/Megatron-LM @ d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    #: what a stage that starts on a shared layer does in this engine
    shared_start: ClassVar[ShareBehaviour] = MEGATRON_SHARED_START
    budget_search = True
    #: the schedule simulation's bound for time computed with every verdict (timing.MAX_LIVE_EVENTS)
    max_time_events: ClassVar[int] = MAX_LIVE_EVENTS
    #: Megatron-LM's entry points are ``pretrain_*.py`` at the repository's root (``pretrain_gpt.py``, ...)
    launch: ClassVar[LaunchSyntax] = LaunchSyntax(entry_points=("pretrain_*.py",), untimed_flags=untimed_flags(),
                                                  unread_flags=MEMORY_UNREAD_FLAGS, replacing_flags=REPLACING_FLAGS,
                                                  options_file="megatron_arguments.txt")

    def overrides(self, plan: Plan) -> tuple[int | None, int | None]:
        """The freq/offset the engine is launched with (``None``: the config's)."""
        return plan.dsa_topk_freq, plan.dsa_skip_topk_offset

    def roles(self, cfg: ModelConfig, plan: Plan) -> tuple[RoleMap, list[int]]:
        freq, offset = self.overrides(plan)
        assert self.role_rule is not None
        return derive_roles(cfg, self.role_rule, pattern=plan.pattern, freq=freq, offset=offset), []

    def check(self, cfg: ModelConfig, plan: Plan, *, extra_errors: tuple[PlanError, ...] = (),
              extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> CheckResult:
        return self._run(cfg, plan, pipeline_spec(plan), extra_errors=extra_errors, extra_warnings=extra_warnings,
                         extra=extra)

    def conversion(self, cfg: ModelConfig, plan: Plan) -> CheckResult | None:
        spec = conversion_spec(plan)
        return None if spec is None else self._run(cfg, plan, spec)

    def _run(self, cfg: ModelConfig, plan: Plan, spec: PipelineSpec, **kw: Any) -> CheckResult:
        if plan.pattern is not None:
            parse_pattern(plan.pattern, cfg.num_hidden_layers)  # PatternError names --pattern
        freq, offset = self.overrides(plan)
        assert self.role_rule is not None
        return run_check(cfg, spec, self.role_rule, rules=(self.role_rule,), pattern=plan.pattern, freq=freq,
                         offset=offset, shared_start=self.shared_start, **kw)

    def model_reasons(self, cfg: ModelConfig, plan: Plan) -> list[Reason]:
        """The attention the plan's flags build against the config's (only when it gives attention
        flags): ``--multi-latent-attention`` (the MLA flags are read only with it,
        ``megatron/training/argument_utils.py:313-314``), the query groups (``--num-query-groups`` only
        with ``--group-query-attention``, 330-333), and GQA with MLA, which Megatron refuses
        (``arguments.py:1973-1974``: "Group query attention is mutually exclusive with multi latent
        attention.")."""
        if not states_attention(plan):
            return []
        out = []
        if plan.multi_latent_attention and plan.group_query_attention:
            out.append(Reason(self.acceptance_kind, "gqa_with_mla", "Group query attention is mutually exclusive with "
                              "multi latent attention; drop --group-query-attention", "group_query_attention"))
        if plan.multi_latent_attention and cfg.attention != "mla":
            out.append(Reason("model", "attention_mismatch", f"--multi-latent-attention builds MLA but the config has "
                              f"{cfg.attention} attention with {cfg.num_key_value_heads} key-value heads; drop "
                              "--multi-latent-attention", "multi_latent_attention"))
        elif not plan.multi_latent_attention and cfg.attention == "mla":
            out.append(Reason("model", "attention_mismatch", "the job builds no multi-latent attention "
                              "(--multi-latent-attention is not given, and Megatron reads the MLA flags only with "
                              "it) but the config is an MLA model; add --multi-latent-attention", "multi_latent_attention"))
        elif not plan.multi_latent_attention:
            groups = built_query_groups(plan, plan.num_attention_heads or cfg.num_attention_heads)
            if groups != cfg.num_key_value_heads:
                why = (" (--num-query-groups is read only with --group-query-attention)"
                       if plan.num_query_groups and not plan.group_query_attention else "")
                out.append(Reason("model", "num_query_groups_mismatch", f"the job builds {groups} query groups{why}; "
                                  f"the config has num_key_value_heads {cfg.num_key_value_heads}",
                                  "group_query_attention" if why else "num_query_groups"))
        return out

    def launch_precision(self, values: Mapping[str, str]) -> tuple[str | None, str | None]:
        """Megatron's ``--fp8-format`` / ``--fp8-recipe`` / ``--fp4-format`` / ``--fp4-recipe``
        (``app.core.time.precision.precision_of_flags``: the inverse of the exported presets)."""
        return precision_of_flags(values)

    def launch_pipeline(self, values: Mapping[str, str], at: Any, plan: Plan, cfg: ModelConfig
                        ) -> tuple[Plan, list[PlanError]]:
        """A hybrid model's ``--hybrid-layer-pattern`` (:func:`hybrid_placement.read_pattern_flag`):
        its ``|`` segments are the plan's stage sizes."""
        fields, errors = read_pattern_flag(values, at, plan.pp or 1, plan.first is not None or plan.last is not None,
                                           cfg.hybrid_pattern)
        return (replace(plan, **fields) if fields else plan), errors

    # ------------------------------------------------------------------ parallelism and memory
    def judge(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck) -> Judgement:
        from app.core.model.flops import stage_flops
        from app.core.model.memory import training_memory

        out = Judgement()
        stages = check.plan
        try:
            par = parallel_config(plan, stages, cfg)
        except ValueError as exc:
            out.problems.append(FieldProblem(getattr(exc, "field", "tp"), f"parallel settings: {exc}"))
            return out
        out.parallel = par
        if not stages.stages:   # the placement refused: its errors are the verdict; time as the recipes place it
            out.time = self._refused_time(cfg, plan, check, par)
            return out
        out.checks = check_parallel(cfg, par, stages, self.rules)
        for c in out.checks:
            if not c.ok and c.level == "error":
                out.blocking.append(Reason(c.kind, c.name, c.message, c.field))
            elif c.warning or (not c.ok and c.level == "warning"):
                out.warnings.append(Reason("parallel", c.name, c.message, c.field))
        if stages.errors:   # Megatron refuses the stages: no memory; the time of what was described
            out.time = self._refused_time(cfg, plan, check, par)
            return out
        try:
            out.memory = training_memory(cfg, stages, par, check.roles)
        except ValueError as exc:
            out.problems.append(FieldProblem("pp", str(exc)))
            return out
        out.blocking += memory_reasons(out.memory)
        out.stage_flops = stage_flops(cfg, check.roles, stages, seq_length=par.sample_length, mbs=par.mbs)
        out.time = plan_time(cfg, plan, stages, check.roles, par, timeline=False, max_events=self.max_time_events)
        return out

    def _refused_time(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, par: ParallelConfig,
                      max_events: int | None = None) -> dict[str, Any]:
        """The time of a plan Megatron refuses as given (the verdict says why): the stages it
        describes when they place every layer (e.g. a layout string beside a VPP flag), else the
        stages Megatron-Bridge's recipes would build for its PP x VPP. ``max_events``: the
        simulation bound (default the live one)."""
        built = check.plan
        if built.stages and sum(built.sizes) == cfg.num_hidden_layers:
            found: tuple[StagePlan, str] | None = (replace(built, errors=()), "as described")
        else:
            recipe = recipe_stages(cfg, plan)
            found = (recipe[0], f"as Megatron-Bridge's recipes place them ({recipe[1]})") if recipe else None
        if found is None:
            return {"unavailable": "no step time: Megatron refuses these stages (the verdict says why)",
                    "field": self.layout_field(plan)}
        stages, how = found
        body = plan_time(cfg, plan, stages, check.roles, replace(par, pp=stages.pp), timeline=False,
                         max_events=self.max_time_events if max_events is None else max_events)
        body.setdefault("assumed", []).insert(0, f"Megatron refuses the stages as given; timed {how}")
        return body

    def timeline(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement) -> dict[str, Any]:
        if judgement.parallel is None or not judgement.time or "unavailable" in judgement.time:
            return {}
        return dict(plan_time(cfg, plan, check.plan, check.roles, judgement.parallel,
                              max_events=MAX_LIVE_EVENTS).get("timeline", {}))

    def full_time(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement) -> dict[str, Any] | None:
        """The step time with ``isplan time``'s larger simulation bound (the live one may have declined)."""
        if judgement.parallel is None or judgement.time is None or "unavailable" not in judgement.time:
            return judgement.time
        stages = check.plan
        if not stages.stages or stages.errors:   # refused as given: timed as judge times it, with the larger bound
            return self._refused_time(cfg, plan, check, judgement.parallel, MAX_EVENTS)
        return plan_time(cfg, plan, stages, check.roles, judgement.parallel, timeline=False, max_events=MAX_EVENTS)

    def exports(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement,
                conversion: LayoutCheck | None = None) -> dict[str, str]:
        assert isinstance(check, CheckResult)
        par = judgement.parallel
        if par is None:   # not judged: the plan's own settings still make the export
            try:
                par = parallel_config(plan, check.plan, cfg)
            except ValueError:
                return {}
        conv = conversion if isinstance(conversion, CheckResult) else None
        return exports(check, ExportSettings.from_plan(plan, par), conversion=conv)

    # ------------------------------------------------------------------ plans
    def best_layouts(self, cfg: ModelConfig, plan: Plan, *, objective: str = "balanced", top: int = 1) -> list[Plan]:
        """The ``top`` best valid layouts for the plan's PP x VPP (every physical and virtual stage
        starting on a full layer), as split plans; none when Megatron refuses that PP x VPP (the
        placement's interleave rule). ``objective="time"``: by simulated step time (see
        :meth:`layout_report`)."""
        return self.layout_report(cfg, plan, objective=objective, top=top)[1]

    def layout_report(self, cfg: ModelConfig, plan: Plan, *, objective: str, top: int) -> tuple[dict[str, Any], list[Plan]]:
        """The optimiser's body (per-layer costs, the number of valid layouts C(F-1, S-1), each
        layout's stage costs and Megatron flags) for the plan's PP x VPP. The compute objective
        weighs layers at the training sequence length. ``time``: the min-max layouts of each layer's
        forward + backward seconds (the time model, the plan's settings), the best
        ``max(top, TIME_CANDIDATES)`` of them then simulated and ranked by step time."""
        from app.core.optimise.plan_search import plan_report

        pp, vpp = plan.pp, plan.vpp or 1
        if interleave_error(pp, vpp, not plan.no_overlap_p2p_communication, "--vpp") is not None:
            return {"best": None, "alternatives": [], "valid_layout_count": 0}, []
        roles = self.check_roles(cfg, plan)
        costs = None
        if objective == "time":
            try:
                costs = time_layer_costs(cfg, plan, roles)
            except ValueError as exc:
                raise ValueError(f"--objective time needs a plan the time model can time: {exc}") from exc
        wanted = max(top, TIME_CANDIDATES) if costs is not None else top
        body = plan_report(cfg, roles, pp=pp, vpp=vpp, objective=objective if costs is None else "balanced",
                           context=plan.seq_length or 4096, top=max(0, wanted - 1), mtp_layers=plan.mtp_layers or 0,
                           costs=costs)
        entries = [e for e in [body["best"], *body["alternatives"]] if e]
        plans = [self.with_split(plan, tuple(e["split"]), pp, vpp) for e in entries]
        if costs is not None:
            entries, plans = self._by_simulated_time(cfg, plan, entries, plans, top)
            body["best"], body["alternatives"] = (entries[0] if entries else None), entries[1:]
        return body, plans

    def _by_simulated_time(self, cfg: ModelConfig, plan: Plan, entries: list[dict[str, Any]], plans: list[Plan],
                           top: int) -> tuple[list[dict[str, Any]], list[Plan]]:
        from app.core.evaluate import evaluate

        timed = []
        for entry, candidate in zip(entries, plans):
            t = evaluate(replace(candidate, parallel=True), cfg).time or {}
            seconds = t.get("step_seconds")
            timed.append((seconds if seconds is not None else float("inf"), {**entry, "step_seconds": seconds},
                          candidate))
        timed.sort(key=lambda x: x[0])
        return [e for _, e, _ in timed[:top]], [p for _, _, p in timed[:top]]

    def nearest(self, cfg: ModelConfig, plan: Plan) -> Plan | None:
        from app.core.optimise.optimiser import nearest_valid

        try:
            stages = materialise(pipeline_spec(plan), cfg.num_hidden_layers)
        except LayoutInputError:
            return None
        if not stages.stages or sum(stages.sizes) != cfg.num_hidden_layers:
            return None
        full = [r.role == "full" for r in self.check_roles(cfg, plan).layers]
        nv = nearest_valid(stages.sizes, full, stages.vpp)
        return None if nv is None else self.with_split(plan, tuple(nv.split), stages.pp, stages.vpp)

    def check_roles(self, cfg: ModelConfig, plan: Plan) -> RoleMap:
        """The roles the boundary rule is judged with (what the engine builds)."""
        freq, offset = self.overrides(plan)
        assert self.role_rule is not None
        return engine_roles(cfg, self.role_rule, plan.pattern, freq, offset, plan.mtp_layers or 0)[0]

    @staticmethod
    def with_split(plan: Plan, split: tuple[int, ...], pp: int, vpp: int) -> Plan:
        return replace(plan, mode="split", split=split, pp=pp, vpp=vpp if vpp > 1 else None, first=None, last=None,
                       layers_per_vstage=None, account_for_embedding=False, account_for_loss=False, layout=None)

    def profile(self, cfg: ModelConfig, plan: Plan) -> Plan:
        """The best plan the GPU-budget search finds on the smallest budget that fits (cached)."""
        return training_profile(self.name, cfg, plan.gpu, plan.gpu_memory_gb, plan.model)


#: GPU budgets the training profile tries, smallest first
BUDGETS = tuple(2**k for k in range(3, 14))
SEQ_LENGTH = 4096


def _go(plan: Plan, cfg: ModelConfig) -> bool:
    from app.core.evaluate import evaluate

    ev = evaluate(plan, cfg)
    return not ev.problems and ev.verdict.go


def _training_plan(row: dict[str, Any], engine: str, model: str, gpu: str, gpu_memory_gb: float | None) -> Plan:
    return Plan(model=model, engine=engine, mode="split", split=tuple(row["split"]), pp=row["pp"],
                vpp=row["vpp"] if row["vpp"] > 1 else None, tp=row["tp"], cp=row["cp"], ep=row["ep"], etp=row["etp"],
                dp=row["dp"], sp=row["sp"], recompute=row["recompute"], recompute_method=row.get("recompute_method"),
                recompute_num_layers=row.get("recompute_num_layers"), cp_comm_type=row.get("cp_comm_type", "p2p"),
                optimizer_cpu_offload=row["optimizer_cpu_offload"],
                use_precision_aware_optimizer=row["use_precision_aware_optimizer"], seq_length=SEQ_LENGTH,
                global_batch=row["dp"] * 8 * row["pp"], gpu=gpu, gpu_memory_gb=gpu_memory_gb, parallel=True)


@lru_cache(maxsize=64)
def training_profile(engine: str, cfg: ModelConfig, gpu: str, gpu_memory_gb: float | None, model: str) -> Plan:
    """The recommended training plan of ``cfg`` on ``engine``: the GPU-budget search's best
    configuration (judged by :func:`app.core.evaluate.evaluate`: the first whose verdict is go) on
    the smallest power-of-two budget from 8 to 8192 GPUs where one fits ``gpu``, at 4096 tokens per
    sample and 8 micro-batches per pipeline rank; the neutral plan when nothing fits."""
    from app.core.model.parallelism import resolve_gpu
    from app.core.model.parameters import count_parameters
    from app.core.optimise.search import search

    capacity = int(gpu_memory_gb * 1e9) if gpu_memory_gb else None
    # a lower bound: BF16 weights + FP32 main grads (6 B per parameter) stay on the GPUs whatever
    # is sharded or offloaded, so smaller budgets cannot fit
    floor = count_parameters(cfg).main_total * 6 / resolve_gpu(gpu, capacity).capacity_bytes
    fallback: Plan | None = None
    for gpus in (b for b in BUDGETS if b >= floor):
        found = search(cfg, gpus, gpu=gpu, gpu_capacity_bytes=capacity, seq_length=SEQ_LENGTH, top=5,
                       engine=engine)
        for row in found["results"]:
            plan = _training_plan(row, engine, model, gpu, gpu_memory_gb)
            if _go(plan, cfg):
                return plan
            fallback = fallback or plan
    return fallback or Plan(model=model, engine=engine, gpu=gpu, gpu_memory_gb=gpu_memory_gb, parallel=True)




ENGINE = MegatronEngine()
