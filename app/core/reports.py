"""One report per command: ``(plan, config, options) -> (JSON body, text lines, verdict)``.

``isplan <command> --format json`` prints :attr:`Report.body`; ``GET /api/v1/<command>`` returns
the same object (compared in tests/test_twins.py); ``--format text`` prints :attr:`Report.lines`.
Every report is built on :func:`app.core.evaluate.evaluate` - the plan's own evaluation, or one
per plan a search recommends - so every body's ``verdict`` is that plan's, and the CLI exits 1
exactly when its ``go`` is false. Unusable input raises :class:`app.core.plan.PlanError` (exit 2 /
a 422), naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.core.engines import EngineInputError, role_rules
from app.core.evaluate import Evaluation, evaluate
from app.core.model.config import ModelConfig
from app.core.model.roles import PatternError, roles_report
from app.core.plan import FieldProblem, Plan, PlanError
from app.core.verdict import Reason, Verdict, verdict_of

#: body keys whose value depends on the wall clock, not on the plan (left out of twin comparisons)
VOLATILE_KEYS = ("seconds", "evaluated_per_second", "created_utc", "body_sha256", "body_hmac_sha256")


@dataclass
class Report:
    body: dict[str, Any]
    lines: list[str]
    verdict: Verdict

    @property
    def go(self) -> bool:
        return self.verdict.go


def evaluated(plan: Plan, cfg: ModelConfig, **kw: Any) -> Evaluation:
    """Evaluate ``plan``; input problems become a :class:`PlanError` (exit 2 / 422)."""
    ev = evaluate(plan, cfg, **kw)
    if ev.problems:
        raise PlanError(ev.problems)
    return ev


def _finish(body: dict[str, Any], lines: list[str], verdict: Verdict, ev: Evaluation | None = None) -> Report:
    body["verdict"] = verdict.to_dict()
    if ev is not None:
        body["not_judged"] = ev.not_judged
        lines = lines + ([f"note: {ev.not_judged}"] if ev.not_judged else [])
    return Report(body, lines + verdict_lines(verdict), verdict)


def verdict_lines(verdict: Verdict) -> list[str]:
    out = [f"verdict: {verdict.headline()}"]
    out += [f"  blocking ({r.kind}{', field ' + r.field if r.field else ''}): {r.message}" for r in verdict.blocking]
    return out


def recommended(plan: Plan, cfg: ModelConfig, model_arg: str | None = None) -> dict[str, Any]:
    """A plan a command recommends, judged by :func:`evaluate` like any other: its URL query, its
    verdict and the ``isplan check`` line that reproduces that verdict."""
    ev = evaluate(plan, cfg)
    verdict = ev.verdict if not ev.problems else verdict_of(
        [Reason("model", "unusable", p.message, p.field) for p in ev.problems])
    return {"query": plan.query(), "verdict": verdict.to_dict(), "check_command": plan.cli_command(model=model_arg)}


def parallel_summary(ev: Evaluation) -> dict[str, Any] | None:
    """TP/CP/PP/DP/EP/ETP, the GPU equation and the fit of every rank (when parallelism is judged)."""
    if ev.par is None:
        return None
    p = ev.par
    return {"tp": p.tp, "cp": p.cp, "pp": p.pp, "dp": p.data_parallel, "ep": p.ep, "etp": p.expert_tp,
            "vpp": p.vpp or 1, "gpus": p.world, "gpus_stated": p.gpus, "expert_grid": p.expert_grid,
            "equation": gpu_equation(ev), "checks": [c.to_dict() for c in ev.checks],
            "fits": ev.memory["fits"] if ev.memory else None,
            "rank_bytes": [s["total_bytes"] for s in ev.memory["stages"]] if ev.memory else None}


def gpu_equation(ev: Evaluation) -> str:
    p = ev.par
    if p is None:
        return ""
    text = f"TP {p.tp} × CP {p.cp} × PP {p.pp} × DP {p.data_parallel} = {p.world} GPUs"
    if p.gpus is not None and p.gpus != p.world:
        text += f" ≠ the stated {p.gpus}"
    return text


# ----------------------------------------------------------------------------- check
def check_report(plan: Plan, cfg: ModelConfig, **kw: Any) -> Report:
    """``isplan check``: the layout verdict (``valid``: boundary + acceptance, as seed 000's
    checker) and, beside it, the whole plan's ``verdict``."""
    ev = evaluated(plan, cfg, **kw)
    assert ev.check is not None
    body = ev.check.to_json()
    body.setdefault("megatron_flags", [])  # launch scripts read these keys for every engine
    body.setdefault("layout_string", "")
    lines = ev.check.text_lines()
    if ev.serving_memory is not None:
        body["serving_memory"] = ev.serving_memory
        lines += [f"pp rank {r['pp_rank']}: {r['total_bytes'] / 2**30:.1f} GiB of {r['usable_bytes'] / 2**30:.1f} GiB "
                  + ("fits" if r["fits"] else "OVERFLOWS") for r in ev.serving_memory["ranks"]]
    summary = parallel_summary(ev)
    if summary is not None:
        body["parallel"] = summary
        lines.insert(1, f"{summary['equation']}; EP {summary['ep']} ETP {summary['etp']}")
        if ev.memory is not None:
            lines += [f"pp rank {s['pp_rank']}: {s['total_bytes'] / 1e9:.1f} GB of {s['capacity_bytes'] / 1e9:.0f} GB "
                      + ("fits" if s["fits"] else "OVERFLOWS") for s in ev.memory["stages"]]
    if ev.conversion is not None:
        body["conversion"] = ev.conversion.to_json()
        lines.append("conversion layout: " + ("VALID" if ev.conversion.valid else "INVALID"))
    body["exports"] = ev.exports()
    return _finish(body, lines, ev.verdict, ev)


def _roles(plan: Plan, cfg: ModelConfig) -> tuple[Any, list[int]]:
    """The plan's engine roles; an unusable pattern or engine setting is a field problem."""
    from app.core.engines import engine_for

    try:
        return engine_for(plan).roles(cfg, plan)
    except (PatternError, EngineInputError) as exc:
        raise PlanError([FieldProblem("pattern", str(exc))]) from None


# ----------------------------------------------------------------------------- roles
def roles_command_report(plan: Plan, cfg: ModelConfig) -> Report:
    """``isplan roles``: per-layer roles, sources and disagreements between engines."""
    roles, differences = _roles(plan, cfg)
    ev = evaluated(plan, cfg)
    body = roles_report(cfg, roles, role_rules(), pattern=plan.pattern, freq=plan.dsa_topk_freq,
                        offset=plan.dsa_skip_topk_offset)
    body["engine"] = plan.engine
    body["engine_differs_from_checkpoint"] = differences
    lines = [f"model {cfg.id}: {body['num_layers']} layers, {body['num_full']} full, {body['num_shared']} shared "
             f"(rule: {body['rule']}, engine {body['engine']})", body["pattern"],
             "full layers: " + ", ".join(str(x) for x in body["full_layers"])]
    lines += ["disagreement: " + d["message"] for d in body["disagreements"]]
    if body["pattern_differences"] is not None:
        lines.append("pattern differs from the config on layers: "
                     + (", ".join(map(str, body["pattern_differences"])) or "none"))
    lines += ["ERROR: " + e["message"] for e in body["errors"]]
    return _finish(body, lines, ev.verdict, ev)


# ----------------------------------------------------------------------------- params
def params_report(plan: Plan, cfg: ModelConfig, *, per_layer: bool = False, with_layout: bool = False) -> Report:
    """``isplan params``: totals, active, components; per pipeline rank when a layout is given."""
    from app.core.model.parameters import count_parameters, per_rank_params

    roles, _ = _roles(plan, cfg)
    ev = evaluated(plan, cfg)
    body: dict[str, Any] = {"model": cfg.summary(), **count_parameters(cfg, roles).to_json()}
    if not per_layer:
        body.pop("per_layer")
    if with_layout:
        assert ev.check is not None
        stages = ev.check.plan
        if stages.errors or not stages.stages:
            raise PlanError([FieldProblem(ev.engine.layout_field(plan), "; ".join(e.message for e in stages.errors)
                                          or "the layout has no stages")])
        ranks = per_rank_params(cfg, ev.check.roles, stages, tp=plan.tp, ep=plan.ep, etp=plan.etp)
        body["stages"] = [{"pp_rank": r, "total": sp.total, "dense_total": sp.dense_total,
                           "expert_total": sp.expert_total, "per_gpu": sp.per_gpu,
                           "dense_per_gpu": sp.dense_per_gpu, "expert_per_gpu": sp.expert_per_gpu,
                           "components": sp.components} for r, sp in enumerate(ranks)]
        body["sharding"] = {"tp": plan.tp, "ep": plan.ep, "etp": plan.etp if plan.etp is not None else plan.tp}
    lines = [f"model {cfg.id}", f"main_total       {body['main_total']:>20,}  (no MTP, no router bias)",
             f"checkpoint_total {body['checkpoint_total']:>20,}  (+ MTP layers and router biases)",
             f"active           {body['active']:>20,}  per token", f"indexer_layers   {body['indexer_layers']:>20}"]
    lines += [f"  {k:<16}{v:>20,}" for k, v in body["breakdown"].items()]
    lines += [f"pp rank {st['pp_rank']}: {st['total']:,} params, {st['per_gpu']:,} per GPU"
              for st in body.get("stages", [])]
    return _finish(body, lines, ev.verdict, ev)


# ----------------------------------------------------------------------------- memory
def memory_report(plan: Plan, cfg: ModelConfig, **kw: Any) -> Report:
    """``isplan memory``: memory per GPU of every pipeline rank (training: beside Megatron's own
    estimate; serving engines: weights + KV cache). The command asks for memory, so the plan it
    judges states its parallelism (its check line carries ``--parallel``)."""
    plan = replace(plan, parallel=True)
    ev = evaluated(plan, cfg, **kw)
    if ev.serving_memory is not None:
        body = dict(ev.serving_memory)
        lines = [f"pp rank {r['pp_rank']}: {r['total_bytes'] / 2**30:7.1f} GiB of {r['usable_bytes'] / 2**30:.1f} GiB "
                 + ("fits" if r["fits"] else "OVERFLOWS") for r in body["ranks"]]
        return _finish(body, lines, ev.verdict, ev)
    if ev.memory is None:
        assert ev.check is not None
        raise PlanError([FieldProblem(ev.engine.layout_field(plan), "no memory estimate: the layout is not one the "
                                      "engine accepts: " + "; ".join(e.message for e in ev.check.plan.errors))])
    body = dict(ev.memory)
    body["checks"] = [c.to_dict() for c in ev.checks]
    lines = [f"{body['gpus']} GPUs ({body['gpu']['label']}), expert grid {body['expert_grid']}"]
    lines += [f"pp rank {st['pp_rank']}: {st['total_bytes'] / 1e9:7.1f} GB of {st['capacity_bytes'] / 1e9:.0f} GB "
              + ("fits" if st["fits"] else "OVERFLOWS") + f"  (largest term: {st['dominant_label']})"
              for st in body["stages"]]
    mt = body["megatron_theoretical"]
    lines.append(f"Megatron report_theoretical_memory (even split, no indexer/uneven terms): most-loaded shard "
                 f"{mt['params_most_loaded_shard'] / 1e9:.2f}B params, {mt['weight_and_optimizer_gib']:.1f} GiB "
                 "weights + optimizer state")
    lines.append(body["explanation"])
    return _finish(body, lines, ev.verdict, ev)


def inference_report(plan: Plan, cfg: ModelConfig, *, context: int | None, batch: int, kv_dtype: str,
                     weight_dtype: str, dp_attention: bool, include_mtp: bool) -> Report:
    """``isplan memory --inference``: weights + KV cache of the whole model on one TP group, with
    a verdict (memory blocks when it does not fit the GPU)."""
    from app.core.model.memory import inference_memory

    ev = evaluated(plan, cfg)
    try:
        body = inference_memory(cfg, tp=plan.tp, ep=plan.ep, dp_attention=dp_attention, kv_dtype=kv_dtype,
                                context=context, batch=batch, gpu=plan.gpu,
                                gpu_capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None,
                                weight_dtype=weight_dtype, include_mtp=include_mtp)
    except ValueError as exc:
        raise PlanError([FieldProblem("context", str(exc))]) from None
    lines = [f"{cfg.id} served on TP {plan.tp} x EP {plan.ep}: {json_bytes(body.get('total_bytes_per_gpu'))} per GPU "
             f"of {json_bytes(body.get('capacity_bytes'))}: " + ("fits" if body.get("fits", True) else "OVERFLOWS")]
    lines += [f"  {k}: {v}" for k, v in body.items() if isinstance(v, (int, float, str)) and k != "fits"]
    blocking = [] if body.get("fits", True) else [Reason(
        "memory", "over_capacity", f"the model needs {json_bytes(body.get('total_bytes_per_gpu'))} per GPU for weights "
        f"and KV cache; the GPU holds {json_bytes(body.get('capacity_bytes'))}: raise tp or lower the context", "tp")]
    return _finish(body, lines, ev.verdict.merged(verdict_of(blocking)), ev)


def json_bytes(value: Any) -> str:
    return f"{value / 1e9:.1f} GB" if isinstance(value, (int, float)) else "?"


# ----------------------------------------------------------------------------- time
def time_report(plan: Plan, cfg: ModelConfig, *, timeline: bool = False, **kw: Any) -> Report:
    """``isplan time``: how fast the plan trains - step time, tokens/s/GPU, model TFLOP/s/GPU
    (Megatron-Bridge's model-FLOPs convention), MFU, the measured pipeline bubble, the breakdown
    (exposed and total seconds per item) and per-stage costs - with the plan's verdict. The command
    asks for time, so the plan it judges states its parallelism (its check line carries
    ``--parallel``). Exit 2 when the plan cannot be timed (the field to change is named)."""
    plan = replace(plan, parallel=True)
    ev = evaluated(plan, cfg, **kw)
    t = ev.engine.full_time(cfg, plan, ev.check, ev.judgement) if ev.check is not None else None
    if t is None and ev.engine.judges_parallelism and ev.engine.workflow == "training":
        t = {"unavailable": "no step time: the layout is not one the engine can build", "field": "pp"}
    if t is None:
        raise PlanError([FieldProblem("engine", f"isplan time times training steps; {ev.engine.label} has no time "
                                                "model here")])
    if "unavailable" in t:
        raise PlanError([FieldProblem(t.get("field") or ev.engine.layout_field(plan), t["unavailable"])])
    body: dict[str, Any] = {"model": cfg.summary(), "engine": plan.engine, "query": plan.query(),
                            "check_command": plan.cli_command("time"), "time": dict(t),
                            "parallel": parallel_summary(ev)}
    if timeline:
        body["time"]["timeline"] = ev.timeline()
    b = t["breakdown"]
    lines = [f"{cfg.id} on {t['settings']['world']} x {t['gpu']} ({t['precision']}): step {t['step_seconds']:.3f} s, "
             f"{t['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU, {t['model_tflops_per_gpu']:.0f} model TFLOP/s/GPU, "
             f"MFU {t['mfu']:.1%}, bubble {t['bubble_fraction']:.1%} ({t['num_microbatches']} micro-batches)"]
    lines += [f"  {k:<10} exposed {v['exposed']:9.3f} s   total {v['total']:9.3f} s" for k, v in b.items()]
    lines += [f"  assumed: {a}" for a in t.get("assumed", [])]
    lines += [f"  note: {n}" for n in t.get("notes", [])]
    return _finish(body, lines, ev.verdict, ev)


# ----------------------------------------------------------------------------- flops
def flops_command_report(plan: Plan, cfg: ModelConfig, *, global_batch: int | None = None) -> Report:
    """``isplan flops``: per-token forward FLOPs with and without IndexShare at ``plan.context``;
    with a global batch, training FLOPs per step at ``plan.seq_length`` (default 4096)."""
    from app.core.model.flops import flops_report, training_flops

    roles, _ = _roles(plan, cfg)
    ev = evaluated(plan, cfg)
    body = flops_report(cfg, plan.context, roles=roles)
    seq = plan.seq_length or 4096
    gbs = global_batch if global_batch is not None else plan.global_batch
    if gbs is not None:
        recompute = "full" if plan.recompute == "full" else "none"
        try:
            body["training"] = training_flops(cfg, roles, seq_length=seq, global_batch_size=gbs, recompute=recompute)
        except ValueError as exc:
            raise PlanError([FieldProblem("global_batch", str(exc))]) from None
    n_idx = body.get("indexer_layers", {})
    lines = [f"per-token forward FLOPs of {cfg.id} at context {plan.context:,}",
             f"IndexShare ({n_idx.get('indexshare', '?')} indexer layers): {body['indexshare_flops']:>22,}",
             f"indexer on every layer ({n_idx.get('every_layer', '?')}): {body['every_layer_flops']:>22,}",
             f"ratio {body['ratio']:.3f} ({body['default_convention']}, the published 2.9x's convention)"]
    lines += [f"  ratio {v:.3f} counting {k}" for k, v in body["ratios"].items()]
    if "training" in body:
        t = body["training"]
        lines.append(f"training step ({gbs} x {seq} tokens, recompute {plan.recompute}): "
                     f"{t.get('step_flops', t.get('total', 0)):,} FLOPs")
    lines += ["", body["convention"]]
    return _finish(body, lines, ev.verdict, ev)


# ----------------------------------------------------------------------------- plan search
def plan_search_report(plan: Plan, cfg: ModelConfig, *, objective: str = "balanced", top: int = 3,
                       near: tuple[int, ...] | None = None, model_arg: str | None = None) -> Report:
    """``isplan plan``: the best valid layouts for the plan's PP (x VPP) as the engine builds them,
    best first, each evaluated like any plan (its verdict and its ``isplan check`` line); with
    ``near``, the valid layout closest to a given split. The report's verdict is the best plan's."""
    from app.core.engines import engine_for

    engine = engine_for(plan)
    try:
        details, found = engine.layout_report(cfg, plan, objective=objective, top=top + 1)
    except NotImplementedError:
        raise PlanError([FieldProblem("engine", f"isplan plan searches pipeline layouts; the {engine.label} "
                                                "pipeline is fixed by its own settings: use isplan check")]) from None
    except (ValueError, EngineInputError) as exc:
        raise PlanError([FieldProblem("pp", str(exc))]) from None
    entries = [e for e in [details.get("best"), *details.get("alternatives", [])] if e]
    candidates = [{**entry, "pp": p.pp, "vpp": p.vpp or 1, **recommended(p, cfg, model_arg)}
                  for entry, p in zip(entries, found)]
    body: dict[str, Any] = {"model": cfg.summary(), "engine": plan.engine, "pp": plan.pp, "vpp": plan.vpp or 1,
                            "objective": objective, **details, "best": candidates[0] if candidates else None,
                            "alternatives": candidates[1:]}
    lines = [f"{cfg.id} on {engine.label}: the best valid layouts for PP {plan.pp}"
             + (f" x VPP {plan.vpp}" if plan.vpp and plan.vpp > 1 else "") + f" (objective {objective})"]
    if near is not None:
        body["near"] = _near(engine, cfg, plan, near, model_arg)
        if body["near"]:
            lines.append(f"nearest valid to {','.join(map(str, near))}: {','.join(map(str, body['near']['split']))}"
                         f"  {body['near']['check_command']}")
    if not candidates:
        msg = (f"no valid layout with PP {plan.pp} x VPP {plan.vpp or 1}: fewer full layers than stages, layer 1 is "
               f"shared, or {engine.label} refuses that pipeline")
        lines.append(msg)
        return _finish(body, lines, verdict_of([Reason("boundary", "no_valid_layout", msg, "pp")]))
    for k, c in enumerate(candidates, start=1):
        go = "GO" if c["verdict"]["go"] else "NO-GO"
        lines.append(f"{'best' if k == 1 else f'#{k}  '}: --split {','.join(map(str, c['split']))}  [{go}]")
        lines.append(f"      {c['check_command']}")
    best = found[0]
    ev = evaluate(best, cfg)
    return _finish(body, lines, ev.verdict, ev)


def _near(engine: Any, cfg: ModelConfig, plan: Plan, near: tuple[int, ...], model_arg: str | None) -> dict[str, Any] | None:
    vpp = plan.vpp or 1
    if len(near) != plan.pp * vpp:
        raise PlanError([FieldProblem("near", f"--near has {len(near)} stages; --pp {plan.pp} x --vpp {vpp} = "
                                              f"{plan.pp * vpp}")])
    if sum(near) != cfg.num_hidden_layers:
        raise PlanError([FieldProblem("near", f"--near sums to {sum(near)}, but the model has "
                                              f"{cfg.num_hidden_layers} layers")])
    found = engine.nearest(cfg, replace(plan, mode="split", split=near))
    if found is None:
        return None
    return {"from": list(near), "split": list(found.split or ()), "moved": moved_layers(near, found.split or ()),
            **recommended(found, cfg, model_arg)}


def moved_layers(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Layers whose stage index differs between two splits of the same layers."""
    def stage_of(sizes: tuple[int, ...]) -> list[int]:
        return [k for k, size in enumerate(sizes) for _ in range(size)]
    return sum(x != y for x, y in zip(stage_of(a), stage_of(b)))


# ----------------------------------------------------------------------------- GPU budget search
def search_report(plan: Plan, cfg: ModelConfig, *, gpus: int, top: int = 10, model_arg: str | None = None) -> Report:
    """``isplan search``: parallel configurations for a GPU budget, ranked; every result is a
    plan evaluated like any other (only those whose verdict is go are listed)."""
    from app.core.optimise.search import search

    try:
        body = search(cfg, gpus, gpu=plan.gpu,
                      gpu_capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None,
                      seq_length=plan.seq_length, tokens_per_gpu=plan.tokens_per_gpu, mbs=plan.mbs,
                      num_microbatches=plan.num_microbatches, top=top, engine=plan.engine,
                      mtp_layers=plan.mtp_layers or 0)
    except ValueError as exc:
        raise PlanError([FieldProblem("gpus", str(exc))]) from None
    kept = []
    for row in body["results"]:
        candidate = search_plan(plan, row, gpus)
        row.update(recommended(candidate, cfg, model_arg))
        if row["verdict"]["go"]:
            kept.append(row)
    body["counts"]["refused_by_verdict"] = len(body["results"]) - len(kept)
    body["results"] = kept
    c = body["counts"]
    lines = [f"{cfg.id} on {gpus} x {body['gpu']['label']}: {c['combinations']:,} combinations in "
             f"{body['seconds']:.2f} s; dropped {c['constraint']:,} (constraints), {c['no_layout']:,} (no valid "
             f"layout), {c['memory']:,} (memory); {c['feasible']:,} feasible (+{c['dominated']:,} dominated)",
             "ranking: " + body["ranking_model"]]
    for k, r in enumerate(kept, start=1):
        lines.append(f"#{k} TP{r['tp']} CP{r['cp']} PP{r['pp']} DP{r['dp']} EP{r['ep']} ETP{r['etp']} VPP{r['vpp']} "
                     f"recompute={r['recompute']} offload={'on' if r['optimizer_cpu_offload'] else 'off'}: "
                     f"{r['max_rank_bytes'] / 1e9:.1f} GB peak, time x{r['relative_step_time']:.3f}")
        lines.append(f"    {r['check_command']}")
    if kept:
        ev = evaluate(search_plan(plan, kept[0], gpus), cfg)
        return _finish(body, lines, ev.verdict, ev)
    blocking = [Reason("parallel", "no_feasible_configuration", f"no configuration of {gpus} GPUs passes the "
                       "constraints, has a valid layout and fits in memory", "gpus")]
    return _finish(body, lines, verdict_of(blocking, judged=("layout", "parallelism", "memory")))


def search_plan(plan: Plan, row: dict[str, Any], gpus: int) -> Plan:
    """The plan of one search result: the plan's own workload settings with the result's parallelism
    and layout (the search ran them with the distributed optimizer and SP whenever TP > 1)."""
    return replace(plan, mode="split", split=tuple(row["split"]), pp=row["pp"], vpp=row["vpp"] if row["vpp"] > 1 else None,
                   first=None, last=None, layout=None, layers_per_vstage=None, tp=row["tp"], cp=row["cp"],
                   ep=row["ep"], etp=row["etp"], dp=row["dp"], gpus=gpus, sp=row["sp"], recompute=row["recompute"],
                   recompute_method=row.get("recompute_method"), recompute_num_layers=row.get("recompute_num_layers"),
                   cp_comm_type=row["cp_comm_type"] if row.get("cp_comm_type") == "allgather" else plan.cp_comm_type,
                   optimizer_cpu_offload=row["optimizer_cpu_offload"],
                   use_precision_aware_optimizer=row["use_precision_aware_optimizer"], parallel=True)


# ----------------------------------------------------------------------------- receipt
def receipt_report(plan: Plan, cfg: ModelConfig, *, name: str = "training",
                   also: list[tuple[str, Any]] | None = None, model_revision: str | None = None,
                   engine_commit: str | None = None, created_utc: str | None = None) -> Report:
    """``isplan receipt``: a verifiable record of the plan's layouts (training, the conversion
    slot, and any ``also`` layouts) and the plan's verdict."""
    from app.core.engines.megatron import conversion_spec, pipeline_spec
    from app.core.engines.megatron.check import CheckResult, run_check
    from app.core.receipt import build_receipt

    ev = evaluated(plan, cfg)
    if not isinstance(ev.check, CheckResult):
        raise PlanError([FieldProblem("engine", "receipts record Megatron/slime/hf layouts; for a serving or "
                                                "MaxText plan use isplan check --format json")])
    warnings = ev.check.warnings
    freq, offset = plan.dsa_topk_freq, plan.dsa_skip_topk_offset
    layouts: list[Any] = [(name, pipeline_spec(plan), freq, offset, tuple(warnings))]
    conv = conversion_spec(plan)
    if conv is not None:
        layouts.append(("conversion", conv, freq, offset, ()))
    layouts += also or []
    blocking = list(ev.verdict.blocking)
    for lay_name, spec, *_ in also or []:  # a named extra layout blocks the launch like the plan's own
        extra = run_check(cfg, spec, plan.engine, pattern=plan.pattern, freq=freq, offset=offset)
        blocking += [Reason("boundary", "shared_start", f"{lay_name} layout: {v.message}", None)
                     for v in extra.boundary.violations]
        blocking += [Reason("model" if e.kind == "model" else ev.engine.acceptance_kind, e.code,
                            f"{lay_name} layout: {e.message}", None) for e in extra.errors]
    verdict = verdict_of(blocking, ev.verdict.warnings, judged=ev.verdict.judged)
    record = {"query": plan.query(), "parallel": ev.judged, "verdict": ev.verdict.to_dict()}
    body = build_receipt(cfg, layouts, engine=plan.engine, pattern=plan.pattern, model_revision=model_revision,
                         engine_commit=engine_commit, created_utc=created_utc, plan=record,
                         verdict=verdict.to_dict())
    lines = [f"receipt for {cfg.id}: " + ("valid" if body["valid"] else "INVALID")]
    return Report(body, lines + verdict_lines(verdict), verdict)
