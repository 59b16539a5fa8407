"""Parallel-configuration search for a GPU budget: enumerate, drop what Megatron refuses or what
overflows a GPU, rank the rest.

Enumerated: TP (divisors of the head count; for GQA a multiple or divisor of the key-value heads;
at most 8 = one NVLink domain), CP (powers of two up
to 16, dividing the sample length in chunks of 2*CP), PP (powers of two up to 16 with a valid
IndexShare layout), EP (divisors of the expert count), ETP in {1, TP}, VPP in {1, 2, 4} (PP > 2),
recompute in {none, selective (Megatron's default modules), full (uniform, 1 layer)}, optimizer CPU
offload off/on; DSA models with CP > 1 use ``--cp-comm-type allgather`` (the only CP
communication Megatron accepts for DSA). DP follows
from the budget: GPUs / (TP*CP*PP) must be whole, and ETP*EP*PP must divide the world.

Each (PP, VPP) uses the optimal valid layout for memory (:func:`app.core.optimise.optimiser.optimal_layout`
over per-layer parameter counts, embedding on the first stage, lm_head + the launch's MTP layers
(``mtp_layers``, default 0) + their embedding copy on the last), so every physical and virtual stage starts on a full layer.

Ranking model (stated, simple, deterministic): the estimated relative step time is

    time = imbalance * recompute_factor * offload_factor / (1 - bubble)

where ``imbalance`` is the busiest pipeline rank's forward FLOPs over the mean
(:func:`app.core.model.flops.stage_flops`), ``bubble`` = (PP-1)/(VPP*m + PP-1) with m micro-batches,
``recompute_factor`` is 1 (none), 1.05 (selective) or 4/3 (full: one more forward on top of
forward + 2x backward), and ``offload_factor`` 1.10 (host Adam step, partly overlapped). Lower is
better; ties go to the smaller model-parallel group (TP*CP*PP: more data parallelism, less
communication) and then to more memory headroom. Communication volume is not modelled beyond that
tie-break. Memory only falls along none -> selective -> full recompute and without -> with
offload, so each shape is probed once with its leanest option (all overflow if that does) and then
walked from the cheapest option up; the options costlier than the first that fits are counted as
``dominated`` (they fit, but the cheaper one of the same shape always ranks above them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from app.core.engines.megatron.parallel import check_parallel
from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.layout.stages import PipelineSpec, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.flops import bubble_fraction, stage_flops
from app.core.model.layer_costs import memory_costs
from app.core.model.memory import rank_activations, rank_totals
from app.core.model.parallelism import ParallelConfig, divisors, resolve_gpu
from app.core.model.parameters import per_rank_params
from app.core.model.roles import RoleMap
from app.core.optimise.optimiser import optimal_layout
from app.core.plan import Plan

RECOMPUTE_FACTOR = {"none": 1.0, "selective": 1.05, "full": 4.0 / 3.0}
OFFLOAD_FACTOR = 1.10
RECOMPUTE_ORDER = ("none", "selective", "full")  # stored activations only fall along this order



def recompute_flags(recompute: str) -> dict[str, Any]:
    """The method and layer count a searched granularity launches with: full recompute needs both
    (Megatron refuses it without, ``transformer_config.py:1913-1925``), selective refuses both
    (``arguments.py:1425-1428``, ``transformer_config.py:1926-1932``)."""
    return {"recompute_method": "uniform", "recompute_num_layers": 1} if recompute == "full" else {}


def cp_comm_type(cfg: ModelConfig, cp: int) -> str:
    """The CP communication a searched plan launches with: allgather for DSA with CP > 1, the only one
    Megatron accepts there (``transformer_config.py:3162-3177``), else Megatron's default p2p."""
    return "allgather" if cfg.has_indexer and cp > 1 else "p2p"


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    vpp: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    offload: tuple[bool, ...] = (False, True)


def search(
    cfg: ModelConfig,
    gpus: int,
    *,
    gpu: str = "h100-80gb",
    gpu_capacity_bytes: int | None = None,
    seq_length: int | None = None,
    tokens_per_gpu: int | None = None,
    mbs: int = 1,
    num_microbatches: int | None = None,
    space: SearchSpace | None = None,
    top: int = 10,
    engine: str = "megatron",
    mtp_layers: int = 0,
    base: Any = None,
) -> dict[str, Any]:
    """Evaluate every combination in ``space`` for ``gpus`` GPUs; JSON-ready result.
    ``mtp_layers`` is the launch's ``--mtp-num-layers`` (0: slime and Megatron build no MTP layer
    without it)."""
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {gpus}")
    if mtp_layers < 0:
        raise ValueError(f"--mtp-num-layers cannot be negative, got {mtp_layers}")
    if seq_length is None and tokens_per_gpu is None:
        seq_length = 4096
    capacity = resolve_gpu(gpu, gpu_capacity_bytes).capacity_bytes
    space = space or SearchSpace()
    t0 = time.perf_counter()
    from app.core.engines import engine_for

    found = engine_for(engine)
    if not found.budget_search:
        raise ValueError(f"the GPU-budget search plans Megatron-family training jobs; {found.label} is not one")
    roles = found.check_roles(cfg, Plan(model=cfg.id, engine=engine, mtp_layers=mtp_layers or None))
    timer = _timer(cfg, roles, gpus, engine, base, gpu=gpu, seq_length=seq_length, tokens_per_gpu=tokens_per_gpu,
                   mbs=mbs, num_microbatches=num_microbatches, mtp_layers=mtp_layers)
    full = [r.role == "full" for r in roles.layers]
    mem = memory_costs(cfg, roles, mtp_layers=mtp_layers)
    costs, first_extra, last_extra = list(mem.costs), mem.first_stage_extra, mem.last_stage_extra
    heads, experts = cfg.num_attention_heads, cfg.n_routed_experts
    # TP must divide the heads, and a GQA model's key-value heads g must be a multiple or a divisor of
    # TP (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py __post_init__)
    kv_heads = cfg.num_key_value_heads if cfg.attention == "gqa" else heads
    tps = space.tp or tuple(t for t in divisors(heads) if t <= 8 and (kv_heads % t == 0 or t % kv_heads == 0))
    cps = space.cp or (1, 2, 4, 8, 16)
    pps = space.pp or tuple(p for p in (1, 2, 4, 8, 16) if p <= len(roles.full_layers))
    eps = space.ep or tuple(divisors(experts) if experts else (1,))
    counts = {"combinations": 0, "constraint": 0, "no_layout": 0, "memory": 0, "feasible": 0, "dominated": 0}
    plans: dict[tuple[int, int], StagePlan | None] = {}
    imbalance: dict[tuple[int, int], float] = {}
    sample = seq_length

    def plan_for(pp: int, vpp: int) -> StagePlan | None:
        key = (pp, vpp)
        if key not in plans:
            lay = optimal_layout(costs, full, pp, vpp, first_stage_extra=first_extra, last_stage_extra=last_extra)
            if lay is None:
                plans[key] = None
            else:
                plan = materialise(PipelineSpec(split=tuple(lay.split), vpp=vpp, overlap_p2p=True),
                                   cfg.num_hidden_layers, default_mtp=mtp_layers)
                plans[key] = None if plan.errors else plan
            built = plans[key]
            if built is not None:
                sf = stage_flops(cfg, roles, built, seq_length=sample or tokens_per_gpu or 4096)
                imbalance[key] = sf["imbalance"]
        return plans[key]

    # cheapest first; the last option saves the most memory (full recompute + offload)
    options = sorted(((rc, off) for rc in space.recompute for off in space.offload),
                     key=lambda o: RECOMPUTE_FACTOR[o[0]] * (OFFLOAD_FACTOR if o[1] else 1.0))
    leanest = max(options, key=lambda o: (RECOMPUTE_ORDER.index(o[0]), o[1]))
    params_cache: dict[tuple[int, ...], list] = {}
    acts_cache: dict[tuple[Any, ...], list] = {}

    def totals_for(plan: StagePlan, par: ParallelConfig, params: list) -> list[int]:
        akey = (par.pp, par.vpp, par.tp, par.expert_tp, par.cp, par.recompute, par.data_parallel)
        if akey not in acts_cache:
            acts_cache[akey] = rank_activations(cfg, roles, plan, par)
        return rank_totals(cfg, roles, plan, par, params, acts_cache[akey])
    feasible: list[dict[str, Any]] = []
    per_vpp = len(options)
    for pp in pps:
        for tp in tps:
            etps = sorted({1, tp})
            for cp in cps:
                mp = tp * cp * pp
                if gpus % mp:  # world = TP*CP*PP*DP: DP would not be whole
                    skipped = len(eps) * len(etps) * len(space.vpp) * per_vpp
                    counts["combinations"] += skipped
                    counts["constraint"] += skipped
                    continue
                for ep in eps:
                    for etp in etps:
                        if gpus % (etp * ep * pp):  # the expert grid must divide the world
                            skipped = len(space.vpp) * per_vpp
                            counts["combinations"] += skipped
                            counts["constraint"] += skipped
                            continue
                        for vpp in space.vpp:
                            counts["combinations"] += len(options)
                            if vpp > 1 and pp <= 2:  # interleaving needs PP > 2
                                counts["constraint"] += len(options)
                                continue
                            plan = plan_for(pp, vpp)
                            if plan is None:
                                counts["no_layout"] += len(options)
                                continue

                            def config(rc: str, off: bool, tp: int = tp, cp: int = cp, pp: int = pp, ep: int = ep,
                                       etp: int = etp, vpp: int = vpp) -> ParallelConfig:
                                return ParallelConfig(
                                    tp=tp, cp=cp, pp=pp, gpus=gpus, ep=ep, etp=etp,
                                    vpp=vpp if vpp > 1 else None, sp=tp > 1, mbs=mbs,
                                    num_microbatches=num_microbatches, seq_length=seq_length,
                                    tokens_per_gpu=tokens_per_gpu, recompute=rc, **recompute_flags(rc),
                                    optimizer_cpu_offload=off, use_precision_aware_optimizer=off,
                                    cp_comm_type=cp_comm_type(cfg, cp), gpu=gpu, gpu_capacity_bytes=gpu_capacity_bytes)

                            try:
                                probe = config(*leanest)
                            except ValueError:
                                counts["constraint"] += len(options)
                                continue
                            if any(not c.ok and not c.warning for c in check_parallel(cfg, probe, plan)):
                                counts["constraint"] += len(options)
                                continue
                            pkey = (pp, vpp, tp, ep, etp)
                            if pkey not in params_cache:
                                params_cache[pkey] = per_rank_params(cfg, roles, plan, tp=tp, ep=ep, etp=etp)
                            params = params_cache[pkey]
                            # memory only falls from the cheapest option to the leanest one: if the
                            # leanest overflows, every option does
                            if max(totals_for(plan, probe, params)) > capacity:
                                counts["memory"] += len(options)
                                continue
                            for k, (rc, off) in enumerate(options):
                                par = probe if (rc, off) == leanest else config(rc, off)
                                totals = totals_for(plan, par, params)
                                if max(totals) > capacity:
                                    counts["memory"] += 1
                                    continue
                                counts["feasible"] += 1
                                counts["dominated"] += len(options) - k - 1
                                m = par.microbatches or max(8 * pp, 1)
                                bubble = bubble_fraction(pp, vpp, m)
                                score = (imbalance[(pp, vpp)] * RECOMPUTE_FACTOR[rc]
                                         * (OFFLOAD_FACTOR if off else 1.0) / (1 - bubble))
                                row = {
                                    "tp": tp, "cp": cp, "pp": pp, "dp": par.data_parallel, "ep": ep, "etp": etp,
                                    "vpp": vpp, "edp": par.edp, "sp": par.sp, "recompute": rc,
                                    "recompute_method": par.recompute_method,
                                    "recompute_num_layers": par.recompute_num_layers, "cp_comm_type": par.cp_comm_type,
                                    "optimizer_cpu_offload": off, "use_precision_aware_optimizer": off,
                                    "split": plan.sizes, "megatron_flags": megatron_flags(plan)[0],
                                    "max_rank_bytes": max(totals), "headroom_bytes": capacity - max(totals),
                                    "imbalance": imbalance[(pp, vpp)], "bubble": bubble,
                                    "microbatches": m, "relative_step_time": score,
                                }
                                row["predicted_tokens_per_second_per_gpu"] = timer(row, plan, par)
                                feasible.append(row)
                                break  # the costlier options of this shape also fit but are dominated
    feasible.sort(key=lambda r: (-(r["predicted_tokens_per_second_per_gpu"] or 0.0), round(r["relative_step_time"], 9),
                                 r["tp"] * r["cp"] * r["pp"], -r["headroom_bytes"]))
    elapsed = time.perf_counter() - t0
    return {
        "model": cfg.id,
        "gpus": gpus,
        "gpu": resolve_gpu(gpu, gpu_capacity_bytes).__dict__,
        "seq_length": seq_length,
        "tokens_per_gpu": tokens_per_gpu,
        "counts": counts,
        "evaluated_per_second": counts["combinations"] / elapsed if elapsed > 0 else None,
        "seconds": elapsed,
        "ranking_model": ("predicted tokens/s/GPU (app/core/time: per-stage op costs and communication, the pipeline "
                          "in closed form; each listed plan is then timed with the simulated schedule); ties: the "
                          "relative step time (imbalance x recompute x offload / (1 - bubble)), a smaller TP*CP*PP, "
                          "more headroom"),
        "results": feasible[:top],
    }


def row_plan(base: Plan, row: dict[str, Any], gpus: int) -> Plan:
    """The plan one search result stands for: ``base``'s workload settings (model, GPU, sequence,
    batch, precision, overlaps) with the result's parallelism and layout (the search runs them with
    the distributed optimizer, SP whenever TP > 1, full recompute as uniform over 1 layer, and the
    all-gather CP layout DSA needs)."""
    return replace(base, mode="split", split=tuple(row["split"]), pp=row["pp"], vpp=row["vpp"] if row["vpp"] > 1 else None,
                   first=None, last=None, layout=None, layers_per_vstage=None, account_for_embedding=False,
                   account_for_loss=False, tp=row["tp"], cp=row["cp"], ep=row["ep"], etp=row["etp"], dp=row["dp"],
                   gpus=gpus, sp=row["sp"], recompute=row["recompute"], recompute_method=row.get("recompute_method"),
                   recompute_num_layers=row.get("recompute_num_layers"),
                   cp_comm_type=row["cp_comm_type"] if row.get("cp_comm_type") == "allgather" else base.cp_comm_type,
                   optimizer_cpu_offload=row["optimizer_cpu_offload"],
                   use_precision_aware_optimizer=row["use_precision_aware_optimizer"], parallel=True)


def _timer(cfg: ModelConfig, roles: RoleMap, gpus: int, engine: str, base: Plan | None, **workload: Any) -> Any:
    """``timer(row, stages, par)`` -> the predicted tokens/s/GPU of a search result
    (:func:`app.core.time.model.quick_step_seconds`, layer costs shared across results), or None
    when the time model cannot time it (a custom GPU, settings it refuses)."""
    from app.core.engines.megatron.timing import hardware_of, time_settings
    from app.core.time.model import quick_step_seconds
    from app.core.time.settings import TimeInputError

    if base is None:
        base = Plan(model=cfg.id, engine=engine, gpu=workload["gpu"], seq_length=workload["seq_length"],
                    tokens_per_gpu=workload["tokens_per_gpu"], mbs=workload["mbs"],
                    num_microbatches=workload["num_microbatches"], mtp_layers=workload["mtp_layers"] or None)
    try:
        hw = hardware_of(base)
    except ValueError:
        return lambda row, stages, par: None
    cache: dict[Any, Any] = {}

    def timer(row: dict[str, Any], stages: StagePlan, par: ParallelConfig) -> float | None:
        plan = row_plan(base, row, gpus)
        settings, _ = time_settings(plan, stages, par)
        try:
            settings.validate(cfg.num_attention_heads, cfg.n_routed_experts)
        except TimeInputError:
            return None
        step = quick_step_seconds(cfg, roles, stages, settings, hw, cache)
        return settings.gbs * settings.seq_length / (step * settings.world) if step > 0 else None

    return timer
