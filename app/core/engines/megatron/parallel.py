"""Megatron's parallel and training-setting constraints: one rule per function, each a named
:class:`~app.core.model.parallelism.Check` with Megatron's own words and the plan field that fixes it.

Every rule cites the line it was read from in NVIDIA/Megatron-LM at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (``arguments.py`` is ``megatron/training/arguments.py``,
``transformer_config.py`` is ``megatron/core/transformer/transformer_config.py``). Megatron stops at
the first refusal it meets; isplan reports every one, so a launch is fixed in one pass.
:func:`check_parallel` runs :data:`RULES` in order.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from operator import attrgetter
from typing import Any

from app.core.content_cache import remember
from app.core.engines.megatron.placement import interleave_error
from app.core.layout.stages import StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import Check, ParallelConfig, _try, divisors, nearest_divisors

#: plan field of each check (the field a failure links to)
CHECK_FIELD = {
    "world_size": "gpus", "heads_tp": "tp", "kv_heads_tp": "tp", "ffn_width": "tp", "experts_ep": "ep",
    "expert_grid": "ep", "expert_data_parallel": "ep", "cp_seq": "cp", "dsa_cp": "cp_comm_type", "sp_tp": "sp",
    "sp_moe_tp": "sp", "mtp_cp": "mtp_layers", "interleave_pp": "vpp", "pipeline_plan": "pp", "vpp_divides": "vpp",
    "global_batch": "global_batch", "microbatches": "num_microbatches", "interleave_microbatches": "num_microbatches",
    "pipeline_fill": "num_microbatches", "cpu_offload_flags": "use_precision_aware_optimizer",
    "precision_aware_dtypes": "use_precision_aware_optimizer", "precision_aware_distributed": "no_distributed_optimizer",
    "hierarchical_cp": "hierarchical_context_parallel_sizes",
    "a2a_p2p_hierarchical": "hierarchical_context_parallel_sizes", "seq_max_positions": "max_position_embeddings",
    "selective_method": "recompute_method", "full_method": "recompute_method",
    "full_num_layers": "recompute_num_layers", "selective_num_layers": "recompute_num_layers",
    "distribute_saved_activations": "distribute_saved_activations",
    "distribute_saved_activations_sp": "distribute_saved_activations", "recompute_moe_act": "moe_grouped_gemm",
    "recompute_mla_up_proj": "recompute_modules", "recompute_gdn_norm_out": "recompute_modules",
    "recompute_mhc": "recompute_modules", "mtp_recompute_layers": "recompute_num_layers",
    "mtp_block_recompute": "recompute_method", "allgather_cp_non_dsa": "cp_comm_type",
    "te_cp_comm_type": "cp_comm_type", "per_layer_cp_comm_type": "cp_comm_type",
    "mamba_heads_tp": "tp", "mamba_groups_tp": "tp", "mamba_heads_cp": "cp", "mamba_groups_cp": "cp",
    "gdn_key_heads_tp": "tp", "gdn_value_heads_tp": "tp", "gdn_key_heads_cp": "cp", "gdn_value_heads_cp": "cp",
    "ep_overlap_vpp": "vpp", "ep_overlap_ep": "ep", "ep_overlap_recompute": "recompute",
    "ep_overlap_recompute_method": "recompute_method", "ep_overlap_recompute_num_layers": "recompute_num_layers",
    "ep_overlap_recompute_moe": "recompute_modules", "ep_overlap_mtp": "mtp_layers",
    "ep_overlap_dispatcher": "moe_token_dispatcher_type", "fp8_output_proj": "precision",
    "tp_comm_overlap_sp": "tp_comm_overlap", "param_gather_optimizer": "no_distributed_optimizer",
    "param_gather_grad_reduce": "overlap_grad_reduce",
}
#: checks whose failure is about the GPU budget, not a constraint between sizes
GPU_CHECKS = ("world_size",)

Rule = Callable[[ModelConfig, ParallelConfig, StagePlan | None], list[Check]]


def _placed(checks: list[Check]) -> list[Check]:
    """Each check with the plan field that fixes it and its verdict kind (built directly: ``replace``
    reads the dataclass's fields on every call, twice the cost, and a search places ~10 per shape)."""
    return [Check(c.name, c.ok, c.message, c.level, c.warning, CHECK_FIELD.get(c.name),
                  "gpus" if c.name in GPU_CHECKS else "parallel") for c in checks]


def _mtp(cfg: ModelConfig, plan: StagePlan | None) -> int:
    return plan.mtp_layers if plan is not None else cfg.num_nextn_predict_layers


# ----------------------------------------------------------------------------- sizes
def world_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/parallel_state.py:822-823``: "world_size (W) is not divisible by TP*PP*CP"."""
    tp, cp, pp, mp = par.tp, par.cp, par.pp, par.model_parallel
    if par.gpus is not None and par.gpus % mp != 0:
        lo = (par.gpus // mp) * mp
        return [Check("world_size", False, f"world_size ({par.gpus}) is not divisible by {mp} (TP*CP*PP = "
                                           f"{tp}*{cp}*{pp}); use {_try((lo or None, lo + mp))} GPUs, or change TP/CP/PP")]
    if par.gpus is not None and par.dp is not None and par.gpus != mp * par.dp:
        return [Check("world_size", False, f"gpus = {par.gpus} but TP*CP*PP*DP = {mp}*{par.dp} = {mp * par.dp}; "
                                           f"give DP = {par.gpus // mp} or {mp * par.dp} GPUs")]
    return [Check("world_size", True, f"world = TP*CP*PP*DP = {tp}*{cp}*{pp}*{par.data_parallel} = {par.world} GPUs")]


def heads_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``transformer_config.py:1446-1450``: "num_attention_heads (h) must be a multiple of
    tensor_model_parallel_size (TP)"."""
    heads, tp = cfg.num_attention_heads, par.tp
    if heads % tp != 0:
        return [Check("heads_tp", False, f"num_attention_heads ({heads}) must be a multiple of "
                                         f"tensor_model_parallel_size ({tp}); try TP={_try(nearest_divisors(heads, tp))}")]
    return [Check("heads_tp", True, f"{heads} attention heads / TP={tp} = {heads // tp} per GPU")]


def query_groups(cfg: ModelConfig, par: ParallelConfig) -> int | None:
    """The query groups Megatron checks against TP: the job's (``par.query_groups``, from
    ``--num-query-groups`` / ``--group-query-attention``) when it states them, else the config's
    key-value heads; ``None`` for MLA (one group per head: the head rule covers it)."""
    if par.query_groups is not None:
        return par.query_groups
    return cfg.num_key_value_heads if cfg.attention == "gqa" and not par.multi_latent_attention else None


def kv_heads_tp_check(cfg: ModelConfig, par: ParallelConfig) -> Check | None:
    """``transformer_config.py:1458-1467``: "num_query_groups (g) must be a multiple or divisor of
    tensor_model_parallel_size (TP)". ``None`` for MLA models."""
    g = query_groups(cfg, par)
    if g is None:
        return None
    tp = par.tp
    if g % tp == 0 or tp % g == 0:
        per_gpu = f"{g // tp} per GPU" if g % tp == 0 else f"each of the {g} replicated over {tp // g} GPUs"
        return Check("kv_heads_tp", True, f"{g} key-value heads with TP={tp}: {per_gpu}")
    ok = [t for t in divisors(cfg.num_attention_heads) if g % t == 0 or t % g == 0]
    below = max((t for t in ok if t < tp), default=None)
    above = min((t for t in ok if t > tp), default=None)
    return Check("kv_heads_tp", False, f"num_query_groups ({g}) must be a multiple or divisor of "
                                       f"tensor_model_parallel_size ({tp}); try TP={_try((below, above))}")


def kv_heads_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    found = kv_heads_tp_check(cfg, par)
    return [found] if found is not None else []


def ffn_width_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/tensor_parallel/layers.py:1038`` (``divide(output_size, world_size)``) and
    ``megatron/core/utils.py:590-592``: "{width} is not divisible by {TP}" for the dense FFN and the
    shared expert over TP, the expert FFN over ETP."""
    widths = [("intermediate_size", cfg.intermediate_size, par.tp, "TP"),
              ("shared expert width", cfg.n_shared_experts * cfg.moe_intermediate_size, par.tp, "TP"),
              ("moe_intermediate_size", cfg.moe_intermediate_size, par.expert_tp, "ETP")]
    bad = [(name, w, d, f) for name, w, d, f in widths if w and w % d != 0]
    if bad:
        name, w, d, f = bad[0]
        return [Check("ffn_width", False, f"the {name} {w} is not divisible by {f}={d}; try "
                                          f"{f}={_try(nearest_divisors(w, d))}")]
    return [Check("ffn_width", True, "FFN widths divide by TP (dense, shared expert) and ETP (experts)")]


def mamba_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """A hybrid model's Mamba mixer splits its heads and groups over TP, then over CP
    (``megatron/core/ssm/mamba_mixer.py:262`` "nheads must be evenly divisble by tp_size" [sic],
    ``:270`` "ngroups must be evenly divisible by tp_size"; ``megatron/core/ssm/mamba_context_parallel.py``
    ``:108`` "nheads must be evenly divisible by tp_size * cp_size", ``:122`` "cp_size must be evenly
    divisible by ngroups/tp_size" when the groups per TP rank are fewer than CP, else ``:129``
    "ngroups must be evenly divisible by tp_size * cp_size")."""
    m = cfg.mamba
    if m is None:
        return []
    tp, cp, out = par.tp, par.cp, []
    if m.heads % tp:
        out.append(Check("mamba_heads_tp", False, f"nheads must be evenly divisble by tp_size (mamba_num_heads "
                                                  f"{m.heads}, TP {tp}); try TP={_try(nearest_divisors(m.heads, tp))}"))
    if m.groups % tp:
        out.append(Check("mamba_groups_tp", False, f"ngroups must be evenly divisible by tp_size (n_groups "
                                                   f"{m.groups}, TP {tp}); try TP={_try(nearest_divisors(m.groups, tp))}"))
    if out or cp == 1:
        return out
    if (m.heads // tp) % cp:
        out.append(Check("mamba_heads_cp", False, f"nheads must be evenly divisible by tp_size * cp_size "
                                                  f"(mamba_num_heads {m.heads}, TP {tp}, CP {cp})"))
    local = m.groups // tp
    if local < cp and cp % local:
        out.append(Check("mamba_groups_cp", False, f"cp_size must be evenly divisible by ngroups/tp_size "
                                                   f"(n_groups {m.groups} / TP {tp} = {local}, CP {cp})"))
    elif local >= cp and local % cp:
        out.append(Check("mamba_groups_cp", False, f"ngroups must be evenly divisible by tp_size * cp_size "
                                                   f"(n_groups {m.groups}, TP {tp}, CP {cp})"))
    return out


def gdn_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """A gated DeltaNet splits its key and value heads over TP x CP (``TransformerConfig.__post_init__``,
    ``megatron/core/transformer/transformer_config.py`` @ d98e8a64: "self.linear_num_key_heads=... must
    be a multiple of (self.tensor_model_parallel_size=... * self.context_parallel_size=...)", and the
    same for ``linear_num_value_heads``)."""
    g = cfg.gdn
    if g is None:
        return []
    tp, cp, out = par.tp, par.cp, []
    for kind, name, heads in (("key", "linear_num_key_heads", g.key_heads),
                              ("value", "linear_num_value_heads", g.value_heads)):
        if heads % (tp * cp):
            by_tp = heads % tp != 0   # the field to change: TP when it alone does not divide, else CP
            fix = (f"TP={_try(nearest_divisors(heads, tp))}" if by_tp
                   else f"CP={_try(nearest_divisors(heads // tp, cp))}")
            out.append(Check(f"gdn_{kind}_heads_{'tp' if by_tp else 'cp'}", False,
                             f"self.{name}={heads} must be a multiple of (self.tensor_model_parallel_size={tp} * "
                             f"self.context_parallel_size={cp}); try {fix}"))
    return out


def experts_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/transformer/moe/moe_layer.py:186`` (``num_moe_experts % ep_size == 0``) and
    ``transformer_config.py:1595-1596``: "num_moe_experts must be non None to use expert-parallel"."""
    experts, ep = cfg.n_routed_experts, par.ep
    if experts and experts % ep != 0:
        return [Check("experts_ep", False, f"EP={ep} does not divide {experts} experts (num_moe_experts % ep_size "
                                           f"!= 0); try {_try(nearest_divisors(experts, ep))}")]
    if experts:
        return [Check("experts_ep", True, f"{experts} experts / EP={ep} = {experts // ep} per GPU")]
    if ep > 1:
        return [Check("experts_ep", False, f"EP={ep}: num_moe_experts must be non None to use expert-parallel (this "
                                           "config has no routed experts); use EP=1")]
    return []


def expert_grid_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/parallel_state.py:874-884``: "world_size (W) is not divisible by
    expert_tensor_model_pipeline_parallel size (ETP*EP*PP)"; EDP = W / (ETP*EP*PP) (info)."""
    etp, ep, pp, experts = par.expert_tp, par.ep, par.pp, cfg.n_routed_experts
    grid = par.expert_grid_size
    if par.world % grid != 0:
        cands = [d for d in divisors(max(1, par.world // max(1, etp * pp))) if not experts or experts % d == 0]
        below = max((d for d in cands if d < ep), default=None)
        above = min((d for d in cands if d > ep), default=None)
        return [Check("expert_grid", False, f"world_size ({par.world}) is not divisible by "
                                            f"expert_tensor_model_pipeline_parallel size (ETP*EP*PP = {etp}*{ep}*{pp} = "
                                            f"{grid}); try EP={_try((below, above))} or change ETP"),
                Check("expert_data_parallel", False, f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} is not a whole "
                      "number, so there is no expert data-parallel group until the expert grid divides the world",
                      level="info")]
    msg = (f"EDP = world/(ETP*EP*PP) = {par.world}/{grid} = {par.edp}: routed-expert optimizer state is sharded "
           f"{par.edp} way(s)")
    if par.edp == 1 and experts:
        msg += " (not at all: every GPU keeps full FP32 master + Adam state of its experts)"
    return [Check("expert_grid", True, f"ETP*EP*PP = {etp}*{ep}*{pp} = {grid} divides the world of {par.world} GPUs"),
            Check("expert_data_parallel", True, msg, level="info")]


# ----------------------------------------------------------------------------- context parallelism
def cp_seq_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1335-1338``: "seq-length should be a multiple of 2 * context-parallel-size if
    context-parallel-size > 1" (load-balanced CP splits each sequence into 2*CP chunks)."""
    cp, s = par.cp, par.sample_length
    if cp == 1:
        return []
    if s % (2 * cp) != 0:
        lo = (s // (2 * cp)) * 2 * cp
        return [Check("cp_seq", False, f"seq-length {s} should be a multiple of 2 * context-parallel-size = {2 * cp}; "
                                       f"pad to {lo + 2 * cp}" + (f" or cut to {lo}" if lo else ""))]
    return [Check("cp_seq", True, f"sequence length {s} divides by 2*CP = {2 * cp}")]


#: the all-gather CP communication as Megatron's DSA attention reads it (``cp_comm_type.replace("_",
#: "").lower() == "allgather"``, transformer_config.py:3170-3173)
ALLGATHER = ("allgather", "all_gather")


def comm_types(par: ParallelConfig) -> list[str]:
    """The CP communication of every layer: one type, or the per-layer list (layer 1 first)."""
    return par.cp_comm_type.split(",")


def per_layer_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/transformer/transformer_layer.py:378-385``: with CP > 1 a per-layer
    ``--cp-comm-type`` list is indexed by the decoder layer's global number
    (``config.cp_comm_type[self.layer_number - 1]``), so it needs an entry for every layer (an
    IndexError when the model is built otherwise)."""
    types = comm_types(par)
    if par.cp == 1 or len(types) == 1 or len(types) >= cfg.num_hidden_layers:
        return []
    return [Check("per_layer_cp_comm_type", False, f"--cp-comm-type gives {len(types)} per-layer types for "
                                                   f"{cfg.num_hidden_layers} layers: layer {len(types) + 1} has none "
                                                   "(list index out of range when the model is built); give one type "
                                                   "or one per layer")]


def dsa_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``transformer_config.py:3162-3177``: with ``experimental_attention_variant == "dsa"`` and CP > 1
    every layer's ``cp_comm_type`` must be allgather: "DSAttention context parallelism currently
    supports cp_comm_type=allgather only." (slime's GLM-5 model: ``--allgather-cp``)."""
    if par.cp == 1 or not cfg.has_indexer:
        return []
    if any(t not in ALLGATHER for t in comm_types(par)):
        given = ", ".join(dict.fromkeys(comm_types(par)))
        return [Check("dsa_cp", False, f"DSAttention context parallelism currently supports cp_comm_type=allgather "
                                       f"only (CP={par.cp}, --cp-comm-type {given}); use --cp-comm-type allgather "
                                       "(slime: --allgather-cp)")]
    return [Check("dsa_cp", True, f"DSA with CP={par.cp}: the all-gather CP layout (--cp-comm-type allgather)")]


def te_cp_comm_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """Attention other than DSA runs context parallelism in Transformer Engine, whose dispatcher knows
    p2p, a2a+p2p, all_gather and a2a and raises "Unsupported communication type: allgather!" for the
    unspelled form at the first forward (NVIDIA/TransformerEngine
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:5096-5139`` @
    d0067d0da6cb01811b8072a7d304f0e00344ce2b; Megatron passes the type through,
    ``megatron/core/extensions/transformer_engine.py:2140-2153``)."""
    if par.cp == 1 or cfg.has_indexer or "allgather" not in comm_types(par):
        return []
    return [Check("te_cp_comm_type", False, "Transformer Engine's attention raises 'Unsupported communication type: "
                                            "allgather!' (it spells it all_gather; only DSA attention reads both); "
                                            "use --cp-comm-type all_gather")]


def hierarchical_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:580-585``: the hierarchical sizes must multiply to CP
    (``assert args.context_parallel_size == prod(args.hierarchical_context_parallel_sizes)``), and
    "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"."""
    sizes = par.hierarchical_context_parallel_sizes
    out = []
    if sizes and prod(sizes) != par.cp:
        out.append(Check("hierarchical_cp", False, f"--hierarchical-context-parallel-sizes {' '.join(map(str, sizes))} "
                                                   f"multiply to {prod(sizes)}, not the context-parallel size {par.cp}; "
                                                   "give sizes whose product is CP"))
    if "a2a+p2p" in comm_types(par) and sizes is None:
        out.append(Check("a2a_p2p_hierarchical", False, "--hierarchical-context-parallel-sizes must be set when "
                                                        "a2a+p2p is used in cp comm (the a2a size, then the p2p size)"))
    return out


def seq_positions_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1353-1356``: "max_position_embeddings (P) must be greater than or equal to
    seq_length (S)"; ``--max-position-embeddings`` is required (1313-1317), so the launch gives one."""
    m, s = par.max_position_embeddings, par.seq_length
    if m is None or s is None:
        return []
    if m < s:
        return [Check("seq_max_positions", False, f"max_position_embeddings ({m}) must be greater than or equal to "
                                                  f"seq_length ({s}); raise --max-position-embeddings to {s} or "
                                                  f"lower --seq-length")]
    return [Check("seq_max_positions", True, f"seq_length {s} <= max_position_embeddings {m}")]


# ----------------------------------------------------------------------------- SP, MTP, pipeline
def sequence_parallel_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1433-1439`` (TP = 1 turns SP off with "Disabling sequence parallelism because
    tensor model parallelism is disabled"), ``model_parallel_config.py:560-565`` (EP and TP without
    SP only warns) and ``moe/moe_layer.py:636-640`` (training MoE with TP > 1 and no SP raises "During
    training, performance may degrade if MoE and tensor parallelism are enabled without also
    enabling sequence parallelism", for any EP)."""
    out = []
    if par.sp and par.tp == 1:
        out.append(Check("sp_tp", True, "sequence parallelism needs TP > 1: 'Disabling sequence parallelism because "
                                        "tensor model parallelism is disabled' (drop --sequence-parallel)",
                         level="warning", warning=True))
    if cfg.n_routed_experts and par.tp > 1 and not par.sp:
        out.append(Check("sp_moe_tp", False, f"MoE with TP={par.tp} and no --sequence-parallel: ModelParallelConfig "
                                             "only warns, but MoELayer.forward raises 'During training, performance "
                                             "may degrade if MoE and tensor parallelism are enabled without also "
                                             "enabling sequence parallelism'; add --sequence-parallel"))
    elif cfg.n_routed_experts and par.tp > 1:
        out.append(Check("sp_moe_tp", True, f"sequence parallelism is on with MoE and TP={par.tp}", level="warning"))
    return out


def mtp_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """MTP with CP is accepted: ``arguments.py`` at d98e8a64 has no MTP/CP refusal (removed Aug 2025)."""
    mtp = _mtp(cfg, plan)
    if not (mtp and par.cp > 1):
        return []
    return [Check("mtp_cp", True, f"MTP ({mtp} layer(s)) with CP={par.cp}: accepted by Megatron's validate_args "
                                  "(megatron/training/arguments.py @ d98e8a6 has no MTP/CP refusal)", level="info")]


def pipeline_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """The stage plan agrees with the parallel sizes. With a stage plan, interleaving is the
    placement's rule (``placement.interleave_error``: ``arguments.py:1000-1009``, one home); without
    one (a bare parallel config) the same rule is applied to ``par``'s sizes here."""
    pp, v = par.pp, par.vpp or 1
    if plan is None:
        out = []
        if v > 1:
            rule = interleave_error(pp, v, par.overlap_p2p_comm, "--num-virtual-stages-per-pipeline-rank")
            out.append(Check("interleave_pp", rule is None, rule.message if rule else f"interleaving VPP={v} with PP={pp}"))
            n = cfg.num_hidden_layers
            if n % pp != 0 or (n // pp) % v != 0:
                out.append(Check("vpp_divides", False, f"{n} layers over PP={pp} x VPP={v} do not split evenly; per-rank "
                                 f"layers must divide by VPP: try VPP={_try(nearest_divisors(n // pp, v)) if n % pp == 0 else 1}"
                                 " or give a stage plan"))
            else:
                out.append(Check("vpp_divides", True, f"{n // pp} layers per rank divide by VPP={v}"))
        return out
    if plan.pp != pp:
        return [Check("pipeline_plan", False, f"the stage plan has PP={plan.pp} but the parallel config has PP={pp}; "
                                              "use one PP")]
    if (plan.vpp or 1) != v:
        return [Check("pipeline_plan", False, f"the stage plan has VPP={plan.vpp} but the parallel config has VPP={v}; "
                                              "use one VPP")]
    if not plan.stages:   # the placement's own errors are the engine's verdict, not repeated here
        return [Check("pipeline_plan", False, "the pipeline plan has no stages")]
    return [Check("pipeline_plan", True, f"{len(plan.stages)} stage(s): layers per rank "
                                         f"{[sum(s.num_layers for s in plan.rank_stages(r)) for r in range(pp)]}")]


def microbatch_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/num_microbatches_calculator.py:381-386``: "global batch size (B) is not
    divisible by micro batch size (b) times data parallel size (d)"; interleaving and a pipeline
    that never fills are warnings."""
    out = []
    dp, pp, v = par.data_parallel, par.pp, par.vpp or 1
    if par.global_batch is not None:
        unit = par.mbs * dp
        if par.global_batch % unit != 0:
            lo = (par.global_batch // unit) * unit
            out.append(Check("global_batch", False, f"global batch size ({par.global_batch}) is not divisible by micro "
                                                    f"batch size ({par.mbs}) times data parallel size ({dp}); use "
                                                    f"{_try((lo or None, lo + unit))}"))
        else:
            out.append(Check("global_batch", True, f"global batch {par.global_batch} = {par.global_batch // unit} "
                                                   f"micro-batches x mbs {par.mbs} x DP {dp}"))
        if par.num_microbatches is not None and par.num_microbatches * unit != par.global_batch:
            out.append(Check("microbatches", False, f"num_microbatches {par.num_microbatches} disagrees with global "
                                                    f"batch {par.global_batch}/(mbs*DP) = {par.global_batch / unit:g}; "
                                                    "give one of them"))
    m = par.microbatches
    if m is not None and v > 1 and m % pp != 0:
        out.append(Check("interleave_microbatches", True, f"{m} micro-batches is not a multiple of PP={pp}; older "
                         f"Megatron interleaved schedules refuse it: use {_try(((m // pp) * pp or None, (m // pp + 1) * pp))}",
                         level="warning", warning=True))
    if m is not None and pp > 1 and m < pp:
        out.append(Check("pipeline_fill", True, f"{m} micro-batches < PP={pp}: the pipeline never fills (bubble "
                         f"{(pp - 1) / (v * m + pp - 1):.0%}); use at least {pp}", level="warning", warning=True))
    return out


# ----------------------------------------------------------------------------- recompute
def recompute_method_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1425-1428``: selective with a method: "recompute method is not yet supported
    for selective recomputing granularity"; ``transformer_config.py:1913-1917``: full without one:
    "Using recompute_granularity: full so recompute_method must be "block" or "uniform"."."""
    if par.recompute == "selective" and par.recompute_method is not None:
        return [Check("selective_method", False, f"recompute method is not yet supported for selective recomputing "
                                                 f"granularity (--recompute-method {par.recompute_method}); drop "
                                                 "--recompute-method")]
    if par.recompute == "full" and par.recompute_method is None:
        return [Check("full_method", False, 'Using recompute_granularity: full so recompute_method must be "block" '
                                            'or "uniform"; add --recompute-method uniform (or block)')]
    return []


def recompute_layers_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``transformer_config.py:1919-1932``: full needs ``--recompute-num-layers`` ("When using
    recompute_granularity: full recompute_num_layers must be between 1 and
    num_layers_per_pipeline_rank"), selective refuses it ("... recompute_num_layers must be None").
    Megatron checks only that it is set: a block count above a stage's layers recomputes every layer
    (``megatron/core/recompute.py:174-181``), a uniform one is clipped to the stage (157-166)."""
    n = par.recompute_num_layers
    if par.recompute == "full" and n is None:
        per_rank = cfg.num_hidden_layers // par.pp
        return [Check("full_num_layers", False, f"When using recompute_granularity: full recompute_num_layers must be "
                                                f"between 1 and num_layers_per_pipeline_rank: {per_rank}; add "
                                                "--recompute-num-layers 1")]
    if par.recompute == "selective" and n is not None:
        return [Check("selective_num_layers", False, "When using recompute_granularity: selective recompute_num_layers "
                                                     f"must be None (--recompute-num-layers {n}); drop it")]
    return []


def distribute_saved_activations_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1410-1419``: ``--distribute-saved-activations`` needs TP > 1 ("can distribute
    recomputed activations only across tensor model parallel groups"), full granularity ("...only
    application to full recompute granularity") and a method; ``transformer_config.py:1934-1938``:
    "distribute_saved_activations: True must be false when sequence parallel is enabled"."""
    if not par.distribute_saved_activations:
        return []
    if par.tp == 1:
        why = "can distribute recomputed activations only across tensor model parallel groups (TP=1)"
    elif par.recompute != "full":
        why = "distributed recompute activations is only application to full recompute granularity"
    elif par.recompute_method is None:
        why = "for distributed recompute activations to work you need to use a recompute method"
    else:
        why = None
    out = [Check("distribute_saved_activations", why is None,
                 f"{why}; drop --distribute-saved-activations or fix it" if why else
                 f"full-recompute checkpoints split over TP={par.tp}")]
    # TransformerConfig checks it whenever a granularity is set, with SP as validate_args left it (off at TP 1)
    if par.recompute != "none" and par.sp and par.tp > 1:
        out.append(Check("distribute_saved_activations_sp", False, "distribute_saved_activations: True must be false "
                                                                   "when sequence parallel is enabled: True; drop one "
                                                                   "of them"))
    return out


def recompute_modules_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``transformer_config.py:1964-1981`` and ``2028-2030``, under selective recompute: "moe_act in
    recompute_modules is only supported with moe_grouped_gemm", "mla_up_proj in recompute_modules is
    only supported with multi_latent_attention", "gdn_norm_out in recompute_modules is only supported
    with experimental_attention_variant='gdn' or 'gdn2'" (a model without gated DeltaNet layers), "'mhc'
    in recompute_modules requires enable_mhc_connections=True" (no model isplan loads has them)."""
    modules = par.modules
    mla = par.multi_latent_attention if par.multi_latent_attention is not None else cfg.attention == "mla"
    out = []
    if "moe_act" in modules and not par.moe_grouped_gemm:
        out.append(Check("recompute_moe_act", False, "moe_act in recompute_modules is only supported with "
                                                     "moe_grouped_gemm; add --moe-grouped-gemm or drop moe_act"))
    if "mla_up_proj" in modules and not mla:
        out.append(Check("recompute_mla_up_proj", False, "mla_up_proj in recompute_modules is only supported with "
                                                         "multi_latent_attention; drop mla_up_proj"))
    if "gdn_norm_out" in modules and cfg.gdn is None:
        out.append(Check("recompute_gdn_norm_out", False, "gdn_norm_out in recompute_modules is only supported with "
                                                          "experimental_attention_variant='gdn' or 'gdn2'; drop it"))
    if "mhc" in modules:
        out.append(Check("recompute_mhc", False, "'mhc' in recompute_modules requires enable_mhc_connections=True; "
                                                 "drop it"))
    return out


def mtp_recompute_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``megatron/core/transformer/multi_token_prediction.py:1621-1634``: under full recompute an MTP
    layer asserts "recompute_num_layers must be 1 for MTP recompute" with the uniform method (at the
    first training forward, 1705), and with block warns "recompute_method == 'block' is not supported
    for MTP yet. Skipping recompute."."""
    mtp = _mtp(cfg, plan)
    if not mtp or par.recompute != "full":
        return []
    if par.recompute_method == "uniform" and par.recompute_num_layers != 1:
        given = par.recompute_num_layers if par.recompute_num_layers is not None else "not given"
        return [Check("mtp_recompute_layers", False, f"recompute_num_layers must be 1 for MTP recompute "
                                                     f"({mtp} MTP layer(s), --recompute-method uniform, "
                                                     f"--recompute-num-layers {given}); use 1")]
    if par.recompute_method == "block":
        return [Check("mtp_block_recompute", True, "recompute_method == 'block' is not supported for MTP yet. "
                                                   "Skipping recompute (the MTP layer keeps all its activations)",
                      level="warning", warning=True)]
    return []


# ----------------------------------------------------------------------------- optimizer
def optimizer_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``arguments.py:1884-1888`` ("The optimizer cpu offload must be used in conjunction with
    `--use-precision-aware-optimizer`"), ``megatron/core/optimizer/optimizer_config.py:468-480``
    (lowered dtypes: "... can only be fp32 when not using precision-aware optimizer") and
    ``megatron/core/optimizer/__init__.py:1057-1060`` ("--use-precision-aware-optimizer only
    supported with distributed optimizer", with or without CPU offload)."""
    out = []
    if par.optimizer_cpu_offload and not par.use_precision_aware_optimizer:
        out.append(Check("cpu_offload_flags", False, "The optimizer cpu offload must be used in conjunction with "
                                                     "`--use-precision-aware-optimizer`; add it"))
    lowered = [n for n in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
               if getattr(par, n) != "fp32"]
    if lowered and not par.use_precision_aware_optimizer:
        out.append(Check("precision_aware_dtypes", False, f"{', '.join(lowered)} can only be fp32 when not using "
                                                          "precision-aware optimizer; add --use-precision-aware-optimizer"))
    if par.use_precision_aware_optimizer and not par.distributed_optimizer:
        out.append(Check("precision_aware_distributed", False, "--use-precision-aware-optimizer only supported with "
                                                               "distributed optimizer; add --use-distributed-optimizer"))
    return out


def overlap_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``validate_args``' refusals of the overlap switches (NVIDIA/Megatron-LM ``megatron/training/
    arguments.py`` @ d98e8a64): ``--tp-comm-overlap`` needs sequence parallelism, which Megatron turns
    off at TP 1 ("Tensor parallel communication/GEMM overlap can happen only when sequence parallelism
    is enabled"); ``--overlap-param-gather`` needs the distributed optimizer and
    ``--overlap-grad-reduce``."""
    out = []
    if par.tp_comm_overlap and not (par.sp and par.tp > 1):
        out.append(Check("tp_comm_overlap_sp", False, "Tensor parallel communication/GEMM overlap can happen only "
                         f"when sequence parallelism is enabled (TP={par.tp}, SP {'on' if par.sp else 'off'}; "
                         "Megatron turns SP off at TP 1): add --sp with TP > 1 or drop --tp-comm-overlap"))
    if par.overlap_param_gather and not par.distributed_optimizer:
        out.append(Check("param_gather_optimizer", False, "--overlap-param-gather only supported with distributed "
                         "optimizer, megatron fsdp, or dist_muon: drop --no-distributed-optimizer"))
    if par.overlap_param_gather and not par.overlap_grad_reduce:
        out.append(Check("param_gather_grad_reduce", False, "Must use --overlap-param-gather with "
                         "--overlap-grad-reduce"))
    return out


def ep_overlap_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``--overlap-moe-expert-parallel-comm``'s refusals, as ``TransformerConfig.__post_init__`` asserts
    them (NVIDIA/Megatron-LM ``megatron/core/transformer/transformer_config.py`` @ d98e8a64, the
    ``if self.overlap_moe_expert_parallel_comm:`` block): VPP with PP > 1, EP > 1, no full recompute,
    no recompute method or layer count, no ``moe`` in ``--recompute-modules``, at most one MTP layer,
    an alltoall or flex dispatcher (a plan that names none has Megatron's default, allgather)."""
    if not par.overlap_moe_expert_parallel_comm:
        return []
    flag = "--overlap-moe-expert-parallel-comm"
    out = []
    for name, bad, message in (
        ("ep_overlap_vpp", par.pp > 1 and par.vpp is None,
         "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified when "
         f"pipeline_model_parallel_size > 1 (PP={par.pp}): give --vpp or drop {flag}"),
        ("ep_overlap_ep", par.ep <= 1, f"overlap_moe_expert_parallel_comm is only supported with expert model "
                                       f"parallelism (EP={par.ep}): raise --ep or drop {flag}"),
        ("ep_overlap_recompute", par.recompute == "full",
         f"disable full recomputation when enabling overlap_moe_expert_parallel_comm ({flag})"),
        ("ep_overlap_recompute_method", par.recompute_method is not None,
         f"disable recomputation method when enabling overlap_moe_expert_parallel_comm ({flag})"),
        ("ep_overlap_recompute_num_layers", par.recompute_num_layers is not None,
         f"recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm ({flag})"),
        ("ep_overlap_recompute_moe", "moe" in (par.recompute_modules or ()),
         f"disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm ({flag})"),
        ("ep_overlap_mtp", _mtp(cfg, plan) > 1,
         f"MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm ({flag})"),
    ):
        if bad:
            out.append(Check(name, False, message))
    if par.moe_token_dispatcher_type in (None, "allgather"):
        given = par.moe_token_dispatcher_type or "not given: Megatron's default allgather"
        out.append(Check("ep_overlap_dispatcher", False, "overlap_moe_expert_parallel_comm is supported with "
                         f"alltoall/flex token dispatcher ({given}): set --moe-token-dispatcher-type alltoall or "
                         "flex"))
    return out


def fp8_output_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``--fp8-output-proj`` needs the MXFP8 recipe: ``TransformerConfig.__post_init__`` raises
    "fp8_output_proj must be used together with fp8 mode." / "fp8_output_proj requires
    fp8_recipe='mxfp8'" (``transformer_config.py`` @ d98e8a64)."""
    if not par.fp8_output_proj or par.precision == "mxfp8":
        return []
    why = ("fp8_output_proj must be used together with fp8 mode." if par.precision in ("bf16", "nvfp4") else
           "fp8_output_proj requires fp8_recipe='mxfp8', got 'tensorwise'.")  # isplan's fp8 = current scaling
    return [Check("fp8_output_proj", False, f"{why} Use --precision mxfp8 or drop --fp8-output-proj")]


#: every rule, in the order Megatron meets them at startup (roughly: parallel state, validate_args,
#: TransformerConfig, the optimizer, the first training forward)
RULES: tuple[Rule, ...] = (
    world_rule, heads_rule, kv_heads_rule, ffn_width_rule, mamba_rule, gdn_rule, experts_rule, expert_grid_rule, cp_seq_rule,
    per_layer_cp_rule, dsa_cp_rule, te_cp_comm_rule, hierarchical_cp_rule, seq_positions_rule, sequence_parallel_rule, mtp_cp_rule,
    pipeline_rule, microbatch_rule, recompute_method_rule, recompute_layers_rule, distribute_saved_activations_rule,
    recompute_modules_rule, mtp_recompute_rule, optimizer_rule, overlap_rule, ep_overlap_rule, fp8_output_rule,
)


#: The rules that read the model and the launch alone, never the stage plan (their source names no
#: ``plan``: tests/core/engines/test_parallel_rule_cache.py reads it), with what each reads of the launch
#: (``par.<name>``, directly or in the helper it hands the launch to). :func:`check_parallel` keeps a
#: rule's checks by the rule, the model and those values: the same on every update of a drag, and
#: shared by a search's launches that differ only elsewhere. The test derives each set from the
#: rule's source and checks that launches agreeing on it get the same checks.
LAUNCH_READS: dict[Rule, tuple[str, ...]] = {
    world_rule: ("tp", "cp", "pp", "dp", "gpus", "model_parallel", "data_parallel", "world"),
    heads_rule: ("tp",),
    kv_heads_rule: ("tp", "query_groups", "multi_latent_attention"),
    ffn_width_rule: ("tp", "expert_tp"),
    mamba_rule: ("tp", "cp"),
    gdn_rule: ("tp", "cp"),
    experts_rule: ("ep",),
    expert_grid_rule: ("ep", "pp", "expert_tp", "world", "expert_grid_size", "edp"),
    cp_seq_rule: ("cp", "sample_length"),
    per_layer_cp_rule: ("cp", "cp_comm_type"),
    dsa_cp_rule: ("cp", "cp_comm_type"),
    te_cp_comm_rule: ("cp", "cp_comm_type"),
    hierarchical_cp_rule: ("cp", "cp_comm_type", "hierarchical_context_parallel_sizes"),
    seq_positions_rule: ("seq_length", "max_position_embeddings"),
    sequence_parallel_rule: ("tp", "sp"),
    microbatch_rule: ("pp", "vpp", "mbs", "data_parallel", "global_batch", "num_microbatches", "microbatches"),
    recompute_method_rule: ("recompute", "recompute_method"),
    recompute_layers_rule: ("pp", "recompute", "recompute_num_layers"),
    distribute_saved_activations_rule: ("tp", "sp", "recompute", "recompute_method", "distribute_saved_activations"),
    recompute_modules_rule: ("modules", "moe_grouped_gemm", "multi_latent_attention"),
    optimizer_rule: ("optimizer_cpu_offload", "use_precision_aware_optimizer", "distributed_optimizer",
                     "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"),
    overlap_rule: ("tp_comm_overlap", "sp", "tp", "overlap_param_gather", "distributed_optimizer",
                   "overlap_grad_reduce"),
    fp8_output_rule: ("fp8_output_proj", "precision"),
}
LAUNCH_RULES: frozenset[Rule] = frozenset(LAUNCH_READS)
#: each launch rule's read values of a launch, in one C call
_READ: dict[Rule, Callable[[ParallelConfig], Any]] = {rule: attrgetter(*names) for rule, names in LAUNCH_READS.items()}
#: a launch rule's placed checks (immutable) by ``(rule, cfg, the values it reads)``; bounded
_RULE_CACHE: dict[tuple[Any, ...], tuple[Check, ...]] = {}
RULE_CACHE_SIZE = 2048


def check_parallel(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None = None,
                   rules: tuple[Rule, ...] = RULES) -> list[Check]:
    """Every rule of ``rules`` (Megatron's :data:`RULES`; an engine built on Megatron adds its own)
    for ``par`` (and the stage plan, when there is one), each check carrying the plan field that fixes it."""
    out: list[Check] = []
    for rule in rules:
        read = _READ.get(rule)
        if read is not None:
            key = (rule, cfg, read(par))
            found = _RULE_CACHE.get(key)
            if found is None:
                found = remember(_RULE_CACHE, key, tuple(_placed(rule(cfg, par, plan))), RULE_CACHE_SIZE)
            out += found
        else:
            out += _placed(rule(cfg, par, plan))
    return out
