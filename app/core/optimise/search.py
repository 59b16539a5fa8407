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
With VPP > 1 the exact rank optimum is searched within :data:`SEARCH_RANK_DP_WORK` (a dense model,
every layer a valid start, can need a million candidate cuts per shape: seconds for one search);
beyond it the shape takes the exact per-stage optimum.

Ranking: the predicted tokens/s/GPU of the time model (:mod:`app.core.time`: per-stage op costs
and communication, the pipeline in closed form; each listed plan is then timed with the simulated
schedule). Ties go to the estimated relative step time

    time = imbalance * recompute_factor * offload_factor / (1 - bubble)

where ``imbalance`` is the busiest pipeline rank's forward FLOPs over the mean
(:func:`app.core.model.flops.stage_flops`), ``bubble`` = (PP-1)/(VPP*m + PP-1) with m micro-batches,
``recompute_factor`` is 1 (none), 1.05 (selective) or 4/3 (full: one more forward on top of
forward + 2x backward), and ``offload_factor`` 1.10 (host Adam step, partly overlapped), then to the
smaller model-parallel group (TP*CP*PP) and then to more memory headroom.

Memory only falls along none -> selective -> full recompute and without -> with offload, so each
shape is probed once with its leanest option (all overflow if that does) and then walked from the
cheapest option up; the options costlier than the first that fits are counted as ``dominated``
(they fit, but the cheaper one of the same shape always ranks above them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from app.core.engines.megatron.parallel import check_parallel
from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.layout.stages import PipelineSpec, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.flops import stage_flops
from app.core.model.layer_costs import memory_costs
from app.core.model.memory import activation_totals, rank_activations, state_totals
from app.core.model.parallelism import ParallelConfig, divisors, resolve_gpu
from app.core.model.parameters import per_rank_params
from app.core.model.roles import RoleMap
from app.core.optimise.optimiser import optimal_layout
from app.core.plan import Plan
from app.core.time.schedule import closed_form_bubble

RECOMPUTE_FACTOR = {"none": 1.0, "selective": 1.05, "full": 4.0 / 3.0}
#: The rank DP's work limit for one shape's layout in the search (a quarter of
#: :data:`app.core.optimise.optimiser.RANK_DP_MAX_WORK`, which Balance and ``isplan plan`` keep): the
#: search solves up to a dozen shapes, and a shape over the limit had spent the whole million
#: before falling back to the per-stage optimum (Llama-3.1-70B on 64 GPUs: 2.5 s of its 3 s).
SEARCH_RANK_DP_WORK = 250_000
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


@dataclass(frozen=True)
class _Shape:
    """One parallel shape of the enumeration; the recompute x offload options are walked inside it."""

    pp: int
    tp: int
    cp: int
    ep: int
    etp: int
    vpp: int


class _BudgetSearch:
    """The search's state for one model and budget: the candidate axes, the memory and FLOP inputs,
    the caches (layout per (PP, VPP), parameters per shape, activations per setting) and the counts
    of what was dropped and why."""

    def __init__(self, cfg: ModelConfig, gpus: int, roles: RoleMap, space: SearchSpace, capacity: int,
                 workload: dict[str, Any], mtp_layers: int, timer: Any):
        self.cfg, self.gpus, self.roles, self.space, self.capacity = cfg, gpus, roles, space, capacity
        self.workload, self.mtp_layers, self.timer = workload, mtp_layers, timer
        self.full = [r.role == "full" for r in roles.layers]
        mem = memory_costs(cfg, roles, mtp_layers=mtp_layers)
        self.costs, self.first_extra, self.last_extra = list(mem.costs), mem.first_stage_extra, mem.last_stage_extra
        heads, experts = cfg.num_attention_heads, cfg.n_routed_experts
        # TP must divide the heads, and a GQA model's key-value heads g must be a multiple or a divisor of
        # TP (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py __post_init__)
        kv_heads = cfg.num_key_value_heads if cfg.attention == "gqa" else heads
        self.tps = space.tp or tuple(t for t in divisors(heads) if t <= 8 and (kv_heads % t == 0 or t % kv_heads == 0))
        self.cps = space.cp or (1, 2, 4, 8, 16)
        self.pps = space.pp or tuple(p for p in (1, 2, 4, 8, 16) if p <= len(roles.full_layers))
        self.eps = space.ep or tuple(divisors(experts) if experts else (1,))
        self.counts = {"combinations": 0, "constraint": 0, "no_layout": 0, "memory": 0, "feasible": 0, "dominated": 0}
        # cheapest first; the last option saves the most memory (full recompute + offload)
        self.options = sorted(((rc, off) for rc in space.recompute for off in space.offload),
                              key=lambda o: RECOMPUTE_FACTOR[o[0]] * (OFFLOAD_FACTOR if o[1] else 1.0))
        self.leanest = max(self.options, key=lambda o: (RECOMPUTE_ORDER.index(o[0]), o[1]))
        self.plans: dict[tuple[int, int], StagePlan | None] = {}
        self.imbalance: dict[tuple[int, int], float] = {}
        self.flags: dict[tuple[int, int], list[str]] = {}  # the layout's Megatron flags, as a row shows them
        self.params_cache: dict[tuple[int, ...], list] = {}
        self.acts_cache: dict[tuple[Any, ...], list[int]] = {}
        self.state_cache: dict[tuple[Any, ...], list[int]] = {}

    def _drop(self, why: str, n: int, *, counted: bool = False) -> None:
        """``n`` combinations dropped for ``why`` (already in ``combinations`` when ``counted``)."""
        if not counted:
            self.counts["combinations"] += n
        self.counts[why] += n

    def shapes(self):
        """Every shape whose groups fit the budget (GPUs / (TP*CP*PP) whole, ETP*EP*PP dividing the
        world) and whose VPP can interleave (PP > 2); the others are counted as ``constraint``."""
        n_opts, n_vpp = len(self.options), len(self.space.vpp)
        for pp in self.pps:
            for tp in self.tps:
                etps = sorted({1, tp})
                for cp in self.cps:
                    if self.gpus % (tp * cp * pp):  # world = TP*CP*PP*DP: DP would not be whole
                        self._drop("constraint", len(self.eps) * len(etps) * n_vpp * n_opts)
                        continue
                    for ep in self.eps:
                        for etp in etps:
                            if self.gpus % (etp * ep * pp):  # the expert grid must divide the world
                                self._drop("constraint", n_vpp * n_opts)
                                continue
                            for vpp in self.space.vpp:
                                self.counts["combinations"] += n_opts
                                if vpp > 1 and pp <= 2:  # interleaving needs PP > 2
                                    self._drop("constraint", n_opts, counted=True)
                                    continue
                                yield _Shape(pp, tp, cp, ep, etp, vpp)

    def plan_for(self, pp: int, vpp: int) -> StagePlan | None:
        """The optimal valid layout for memory at (PP, VPP), placed as Megatron builds it (cached,
        with its FLOP imbalance); ``None`` when no valid layout exists."""
        key = (pp, vpp)
        if key not in self.plans:
            lay = optimal_layout(self.costs, self.full, pp, vpp, first_stage_extra=self.first_extra,
                                 last_stage_extra=self.last_extra, work=SEARCH_RANK_DP_WORK)
            plan = None if lay is None else materialise(PipelineSpec(split=tuple(lay.split), vpp=vpp, overlap_p2p=True),
                                                        self.cfg.num_hidden_layers, default_mtp=self.mtp_layers)
            self.plans[key] = None if plan is None or plan.errors else plan
            built = self.plans[key]
            if built is not None:
                sample = self.workload["seq_length"] or self.workload["tokens_per_gpu"] or 4096
                self.imbalance[key] = stage_flops(self.cfg, self.roles, built, seq_length=sample)["imbalance"]
                self.flags[key] = megatron_flags(built)[0]
        return self.plans[key]

    def config(self, sh: _Shape, rc: str, off: bool) -> ParallelConfig:
        """The parallel config the search launches ``sh`` with, at one recompute / offload option."""
        w = self.workload
        return ParallelConfig(
            tp=sh.tp, cp=sh.cp, pp=sh.pp, gpus=self.gpus, ep=sh.ep, etp=sh.etp,
            vpp=sh.vpp if sh.vpp > 1 else None, sp=sh.tp > 1, mbs=w["mbs"],
            num_microbatches=w["num_microbatches"], seq_length=w["seq_length"],
            tokens_per_gpu=w["tokens_per_gpu"], recompute=rc, **recompute_flags(rc),
            optimizer_cpu_offload=off, use_precision_aware_optimizer=off,
            cp_comm_type=cp_comm_type(self.cfg, sh.cp), gpu=w["gpu"], gpu_capacity_bytes=w["gpu_capacity_bytes"])

    def totals_for(self, sh: _Shape, plan: StagePlan, option: tuple[str, bool], params: list,
                   par: ParallelConfig | None = None) -> list[int]:
        """:func:`app.core.model.memory.rank_totals` of ``sh`` at ``option`` from its two parts, each
        kept by what it depends on: the activations by the shape's sizes and recompute (not EP), the
        states by the shape's sizes and the optimizer option (every other optimizer setting is the
        workload's, the same for all). The option's launch (``par``) is built only for a part not
        kept yet."""
        rc, off = option
        akey = (sh.pp, sh.vpp, sh.tp, sh.etp, sh.cp, rc)
        if akey not in self.acts_cache:
            par = par or self.config(sh, rc, off)
            self.acts_cache[akey] = activation_totals(rank_activations(self.cfg, self.roles, plan, par))
        skey = (sh.pp, sh.vpp, sh.tp, sh.cp, sh.ep, sh.etp, off)
        if skey not in self.state_cache:
            par = par or self.config(sh, rc, off)
            self.state_cache[skey] = state_totals(params, par)
        return [s + a for s, a in zip(self.state_cache[skey], self.acts_cache[akey], strict=True)]

    def evaluate(self, sh: _Shape) -> dict[str, Any] | None:
        """The result row of ``sh`` at its cheapest option that fits, or ``None`` (counted: no valid
        layout, a Megatron constraint, or memory). Memory only falls from the cheapest option to the
        leanest, so the leanest is probed first: if it overflows, every option does."""
        n_opts = len(self.options)
        plan = self.plan_for(sh.pp, sh.vpp)
        if plan is None:
            self._drop("no_layout", n_opts, counted=True)
            return None
        try:
            probe = self.config(sh, *self.leanest)
        except ValueError:
            self._drop("constraint", n_opts, counted=True)
            return None
        if any(not c.ok and not c.warning for c in check_parallel(self.cfg, probe, plan)):
            self._drop("constraint", n_opts, counted=True)
            return None
        pkey = (sh.pp, sh.vpp, sh.tp, sh.ep, sh.etp)
        if pkey not in self.params_cache:
            self.params_cache[pkey] = per_rank_params(self.cfg, self.roles, plan, tp=sh.tp, ep=sh.ep, etp=sh.etp)
        params = self.params_cache[pkey]
        if max(self.totals_for(sh, plan, self.leanest, params, probe)) > self.capacity:
            self._drop("memory", n_opts, counted=True)
            return None
        return self.cheapest_fit(sh, plan, probe, params)

    def cheapest_fit(self, sh: _Shape, plan: StagePlan, probe: ParallelConfig, params: list) -> dict[str, Any] | None:
        """Walk the options from the cheapest up; the first that fits is the shape's row, the
        costlier ones are counted as ``dominated`` (they fit but always rank below it)."""
        for k, option in enumerate(self.options):
            par = probe if option == self.leanest else None
            totals = self.totals_for(sh, plan, option, params, par)
            if max(totals) > self.capacity:
                self.counts["memory"] += 1
                continue
            self.counts["feasible"] += 1
            self.counts["dominated"] += len(self.options) - k - 1
            return self.row(sh, plan, option, par or self.config(sh, *option), max(totals))
        return None

    def row(self, sh: _Shape, plan: StagePlan, option: tuple[str, bool], par: ParallelConfig,
            max_bytes: int) -> dict[str, Any]:
        """One result: the shape, its settings, layout, memory and the ranking model's estimates."""
        rc, off = option
        m = par.microbatches or max(8 * sh.pp, 1)
        bubble = closed_form_bubble(sh.pp, sh.vpp, m)
        imbalance = self.imbalance[(sh.pp, sh.vpp)]
        score = imbalance * RECOMPUTE_FACTOR[rc] * (OFFLOAD_FACTOR if off else 1.0) / (1 - bubble)
        row = {
            "tp": sh.tp, "cp": sh.cp, "pp": sh.pp, "dp": par.data_parallel, "ep": sh.ep, "etp": sh.etp,
            "vpp": sh.vpp, "edp": par.edp, "sp": par.sp, "recompute": rc,
            "recompute_method": par.recompute_method,
            "recompute_num_layers": par.recompute_num_layers, "cp_comm_type": par.cp_comm_type,
            "optimizer_cpu_offload": off, "use_precision_aware_optimizer": off,
            "split": plan.sizes, "megatron_flags": list(self.flags[(sh.pp, sh.vpp)]),
            "max_rank_bytes": max_bytes, "headroom_bytes": self.capacity - max_bytes,
            "imbalance": imbalance, "bubble": bubble,
            "microbatches": m, "relative_step_time": score,
        }
        row["predicted_tokens_per_second_per_gpu"] = self.timer(row, plan, par)
        return row


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
    t0 = time.perf_counter()
    from app.core.engines import engine_for

    found = engine_for(engine)
    if not found.budget_search:
        raise ValueError(f"the GPU-budget search plans Megatron-family training jobs; {found.label} is not one")
    roles = found.check_roles(cfg, Plan(model=cfg.id, engine=engine, mtp_layers=mtp_layers or None))
    workload = {"gpu": gpu, "gpu_capacity_bytes": gpu_capacity_bytes, "seq_length": seq_length,
                "tokens_per_gpu": tokens_per_gpu, "mbs": mbs, "num_microbatches": num_microbatches}
    timer = _timer(cfg, roles, gpus, engine, base, mtp_layers=mtp_layers,
                   **{k: v for k, v in workload.items() if k != "gpu_capacity_bytes"})
    run = _BudgetSearch(cfg, gpus, roles, space or SearchSpace(), capacity, workload, mtp_layers, timer)
    feasible = [row for sh in run.shapes() if (row := run.evaluate(sh)) is not None]
    feasible.sort(key=lambda r: (-(r["predicted_tokens_per_second_per_gpu"] or 0.0), round(r["relative_step_time"], 9),
                                 r["tp"] * r["cp"] * r["pp"], -r["headroom_bytes"]))
    elapsed = time.perf_counter() - t0
    return {
        "model": cfg.id,
        "gpus": gpus,
        "gpu": resolve_gpu(gpu, gpu_capacity_bytes).__dict__,
        "seq_length": seq_length,
        "tokens_per_gpu": tokens_per_gpu,
        "counts": run.counts,
        "evaluated_per_second": run.counts["combinations"] / elapsed if elapsed > 0 else None,
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
