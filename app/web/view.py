"""The dashboard's view model: one :class:`PlanView` from a :class:`PlanState`.

Everything shown is computed by :mod:`app.core`; this module only gathers it, turns failures into
per-field messages and prepares what the templates and figures need. It never raises for bad
input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.flops import bubble_fraction, stage_flops
from app.core.layer_roles import PatternError, derive_roles
from app.core.layout_check import CheckResult, run_check
from app.core.memory import training_memory
from app.core.model_config import ConfigError, ModelConfig, load_preset, preset_ids
from app.core.parallelism import ParallelConfig, check_parallel
from app.core.parameters import stage_params
from app.core.stages import LayoutInputError, PipelineSpec, parse_split
from app.web.plan_state import PlanState
from app.web.store import ConfigStore


@dataclass
class LayerCell:
    layer: int
    role: str  # full | shared
    letter: str  # F | S | M (MTP)
    ffn: str
    source: int | None
    stage: int | None  # 1-based stage index
    start: bool
    invalid: bool
    mtp: bool = False

    @property
    def title(self) -> str:
        kind = "MTP layer" if self.mtp else f"layer {self.layer}"
        src = (" computes its own top-k" if self.role == "full" else
               f" reuses top-k of full layer {self.source}" if self.source else " has no full layer before it")
        where = f", stage {self.stage}" if self.stage else ""
        return f"{kind}: {self.role}, {self.ffn} FFN{where};{src}"


@dataclass
class PlanView:
    state: PlanState
    cfg: ModelConfig
    check: CheckResult | None
    conversion: CheckResult | None
    par: ParallelConfig | None
    memory: dict[str, Any] | None
    flops: dict[str, Any] | None
    cells: list[LayerCell]
    rows: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    field_errors: dict[str, str]
    messages: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return bool(self.check and self.check.valid and not self.field_errors)

    @property
    def starts(self) -> list[int]:
        if not self.check:
            return []
        return [s.first_layer for s in self.check.plan.stages if s.first_layer is not None]

    @property
    def gpu_line(self) -> str:
        p = self.par
        if p is None:
            return "GPU count unavailable: fix the parallel settings above"
        return f"TP {p.tp} × CP {p.cp} × PP {p.pp} × DP {p.data_parallel} = {p.world} GPUs"

    @property
    def expert_line(self) -> str:
        p = self.par
        if p is None:
            return ""
        return f"expert grid ETP {p.expert_tp} × EP {p.ep} × PP {p.pp} = {p.expert_grid_size}; EDP {p.edp}"


def resolve_model(state: PlanState, store: ConfigStore) -> tuple[ModelConfig, str | None]:
    if state.model in preset_ids():
        return load_preset(state.model), None
    try:
        cfg = store.get(state.model)
    except ConfigError as exc:
        cfg, err = None, str(exc)
    else:
        err = None
    if cfg is None:
        err = err or (f"model {state.model[:80]!r} is neither a preset ({', '.join(preset_ids())}) nor an "
                      "uploaded config (sha256:...); showing glm-5.2")
        return load_preset("glm-5.2"), err
    return cfg, None


def spec_from_state(state: PlanState) -> PipelineSpec:
    vpp = state.vpp if state.vpp > 1 else None
    if state.mode == "split":
        return PipelineSpec(split=parse_split(state.split or ""), vpp=vpp, mtp_layers=state.mtp)
    if state.mode == "layout":
        return PipelineSpec(pp=state.pp, layout=state.layout or "", vpp=vpp, mtp_layers=state.mtp)
    return PipelineSpec(pp=state.pp, first=state.first, last=state.last, vpp=vpp, mtp_layers=state.mtp)


def conversion_spec(state: PlanState) -> PipelineSpec | None:
    if state.conv == "split" and state.conv_split:
        return PipelineSpec(split=parse_split(state.conv_split), mtp_layers=state.mtp)
    if state.conv == "flags" and state.conv_pp:
        return PipelineSpec(pp=state.conv_pp, first=state.conv_first, last=state.conv_last, mtp_layers=state.mtp)
    return None


def _cells(check: CheckResult) -> list[LayerCell]:
    stage_of: dict[int, int] = {}
    starts: set[int] = set()
    for s in check.plan.stages:
        for n in s.layers:
            stage_of[n] = s.index + 1
        if s.first_layer is not None:
            starts.add(s.first_layer)
    bad = {v.layer for v in check.boundary.violations}
    cells = [LayerCell(r.layer, r.role, "F" if r.role == "full" else "S", r.ffn, r.source,
                       stage_of.get(r.layer), r.layer in starts, r.layer in bad) for r in check.roles.layers]
    mtp_stage = next((s.index + 1 for s in check.plan.stages if s.mtp_layers), None)
    for r in check.roles.mtp[: check.plan.mtp_layers]:
        cells.append(LayerCell(r.layer, "full", "M", r.ffn, r.layer, mtp_stage, False, False, mtp=True))
    return cells


def build_view(state: PlanState, store: ConfigStore) -> PlanView:
    errors = dict(state.errors)
    cfg, model_err = resolve_model(state, store)
    if model_err:
        errors["model"] = f"{errors['model']}; {model_err}" if "model" in errors else model_err
    pattern = state.pattern
    check = None
    try:
        spec = spec_from_state(state)
    except LayoutInputError as exc:
        errors.setdefault(state.mode if state.mode != "flags" else "pp", str(exc))
        spec = None
    if spec is not None:
        try:
            derive_roles(cfg, state.engine, pattern=pattern)
        except PatternError as exc:
            errors["pattern"] = str(exc)
            pattern = None
        try:
            check = run_check(cfg, spec, state.engine, pattern=pattern)
        except LayoutInputError as exc:
            errors.setdefault(state.mode if state.mode != "flags" else "pp", str(exc))
    conversion = None
    try:
        cspec = conversion_spec(state)
        if cspec is not None:
            conversion = run_check(cfg, cspec, state.engine, pattern=pattern)
    except (LayoutInputError, PatternError) as exc:
        errors["conv_split" if state.conv == "split" else "conv_pp"] = str(exc)

    par = None
    plan = check.plan if check else None
    if plan is not None and plan.stages:
        try:
            par = ParallelConfig(
                tp=state.tp, cp=state.cp, pp=plan.pp, dp=state.dp, gpus=state.gpus, ep=state.ep, etp=state.etp,
                vpp=plan.vpp if plan.vpp > 1 else None, sp=state.sp, mbs=state.mbs, num_microbatches=state.mb,
                seq_length=state.seq if (state.seq or state.tpg) else 4096, tokens_per_gpu=state.tpg,
                recompute=state.recompute, recompute_num_layers=state.rnl, optimizer_cpu_offload=state.offload,
                use_precision_aware_optimizer=state.offload, gpu=state.gpu,
                gpu_capacity_bytes=int(state.gpu_gb * 1e9) if state.gpu_gb else None)
        except ValueError as exc:
            errors["tp"] = f"parallel settings: {exc}"
    checks: list[dict[str, Any]] = []
    memory = flops = None
    rows: list[dict[str, Any]] = []
    if par is not None and plan is not None:
        checks = [c.to_dict() for c in check_parallel(cfg, par, plan)]
        if not plan.errors:
            try:
                memory = training_memory(cfg, plan, par, check.roles)
            except ValueError as exc:
                errors["pp"] = str(exc)
            flops = stage_flops(cfg, check.roles, plan, seq_length=par.sample_length, mbs=par.mbs)
    if check is not None:
        n_layers = cfg.num_hidden_layers
        sized = not check.plan.errors  # a plan with errors may reach past the last layer
        rank_mem = {s["pp_rank"]: s for s in memory["stages"]} if memory else {}
        stage_fl = {s["index"]: s["flops"] for s in flops["stages"]} if flops else {}
        for rec in check.boundary.records:
            s = rec.stage
            sp_ = stage_params(cfg, check.roles, [s], tp=par.tp if par else 1, ep=par.ep if par else 1,
                               etp=par.expert_tp if par else None) if sized else None
            rm = rank_mem.get(s.pp_rank)
            rows.append({
                "stage": s.index + 1, "pp_rank": s.pp_rank, "vp_stage": s.vp_stage,
                "range": f"{s.first_layer}–{s.last_layer}" if s.num_layers else "—",
                "num_layers": s.num_layers, "start_role": rec.start_role, "source": rec.source_layer,
                "source_stage": rec.source_stage.index + 1 if rec.source_stage else None,
                "full_layers": [n for n in s.layers if n <= n_layers and check.roles.role(n).role == "full"],
                "params_per_gpu": sp_.per_gpu if sp_ else None,
                "rank_memory_bytes": rm["total_bytes"] if rm else None,
                "rank_fits": rm["fits"] if rm else None,
                "flops": stage_fl.get(s.index),
                "extras": ", ".join(x for x in ("embedding" if s.embedding else "",
                                                f"MTP ×{s.mtp_layers}" if s.mtp_layers else "",
                                                "loss" if s.loss else "") if x),
                "invalid": any(v.stage.index == s.index for v in check.boundary.violations),
            })
    view = PlanView(state, cfg, check, conversion, par, memory, flops, _cells(check) if check else [], rows,
                    checks, errors)
    view.exports = exports(view)
    if par is not None and plan is not None:
        m = par.microbatches or 8 * plan.pp
        view.messages.append(f"pipeline bubble {(bubble_fraction(plan.pp, plan.vpp, m)) * 100:.1f}% "
                             f"of wall time with {m} micro-batches" + ("" if par.microbatches else " (assumed 8 × PP)"))
    return view


def exports(view: PlanView) -> dict[str, str]:
    out: dict[str, str] = {}
    check, par, st = view.check, view.par, view.state
    if check is None or not check.megatron_flags:
        return out
    flags = list(check.megatron_flags)
    if par is not None:
        flags += ["--tensor-model-parallel-size", str(par.tp), "--context-parallel-size", str(par.cp),
                  "--expert-model-parallel-size", str(par.ep), "--expert-tensor-parallel-size", str(par.expert_tp)]
        if par.sp:
            flags.append("--sequence-parallel")
        if par.recompute == "full":
            flags += ["--recompute-granularity", "full", "--recompute-method", par.recompute_method,
                      "--recompute-num-layers", str(par.recompute_num_layers)]
        elif par.recompute == "selective":
            flags += ["--recompute-granularity", "selective"]
        if par.optimizer_cpu_offload:
            flags += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
        if par.cp > 1 and view.cfg.has_indexer:
            flags.append("--allgather-cp")
    if view.cfg.has_indexer and check.roles.freq:
        flags += ["--dsa-indexer-topk-freq", str(check.roles.freq),
                  "--dsa-indexer-skip-topk-offset", str(check.roles.offset)]
    pairs: list[str] = []
    i = 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            pairs.append(f"{flags[i]} {_shell(flags[i + 1])}")
            i += 2
        else:
            pairs.append(flags[i])
            i += 1
    out["megatron"] = " \\\n    ".join(pairs)
    out["slime"] = "PERF_ARGS=(\n" + "".join(f"   {p}\n" for p in pairs) + ")"
    out["layout"] = check.layout_string
    if view.conversion is not None and view.conversion.megatron_flags:
        out["conversion"] = " ".join(_shell(a) for a in view.conversion.megatron_flags)
    out["cli"] = (f"isplan check {st.model} --split {','.join(map(str, check.plan.sizes))}"
                  + (f" --vpp {check.plan.vpp}" if check.plan.vpp > 1 else "")
                  + (f" --engine {st.engine}" if st.engine != "megatron" else ""))
    return out


def _shell(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in "|*(), ") else arg
