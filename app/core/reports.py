"""One report per command: ``(plan, config, options) -> (JSON body, text lines, verdict)``.

``isplan <command> --format json`` prints :attr:`Report.body`; ``GET /api/v1/<command>`` returns
the same object (compared in tests/verdict/test_twins.py); ``--format text`` prints :attr:`Report.lines`.
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


def plan_context(ev: Evaluation) -> int:
    """The evaluated plan's context (:meth:`Engine.context`: stated, else the model's maximum as
    its engine derives it); one the model does not state is a problem on ``context``."""
    try:
        return ev.engine.context(ev.cfg, ev.plan)
    except ValueError as exc:
        raise PlanError([FieldProblem("context", str(exc))]) from None


def _finish(body: dict[str, Any], lines: list[str], verdict: Verdict, ev: Evaluation | None = None) -> Report:
    body["verdict"] = verdict.to_dict()
    if ev is not None:
        body["not_judged"] = ev.not_judged
        lines = lines + ([f"note: {ev.not_judged}"] if ev.not_judged else [])
    return Report(body, lines + verdict_lines(verdict), verdict)


def verdict_lines(verdict: Verdict) -> list[str]:
    out = [f"verdict: {verdict.headline()}"]
    out += [f"  blocking ({r.kind}{', field ' + r.field if r.field else ''}): {r.message}" for r in verdict.blocking]
    out += [f"  warning ({r.kind}): {r.message}" for r in verdict.notes]   # the checks print theirs with their lines
    return out


def recommended(plan: Plan, cfg: ModelConfig, model_arg: str | None = None) -> dict[str, Any]:
    """A plan a command recommends, judged by :func:`evaluate` like any other: its URL query, its
    verdict, the ``isplan check`` line that reproduces that verdict and, where it is timed, how
    fast it trains."""
    ev = evaluate(plan, cfg)
    verdict = ev.verdict if not ev.problems else verdict_of(
        [Reason("model", "unusable", p.message, p.field) for p in ev.problems])
    out = {"query": plan.query(), "verdict": verdict.to_dict(), "check_command": plan.cli_command(model=model_arg)}
    if ev.time and "unavailable" not in ev.time:
        out["time"] = {k: ev.time[k] for k in ("step_seconds", "tokens_per_second_per_gpu", "model_tflops_per_gpu",
                                                "mfu", "bubble_fraction")}
    return out


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
    lines += ["note: " + n for n in body["notes"]]
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
                           "components": dict(sp.components)} for r, sp in enumerate(ranks)]
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
    if "unsupported" in mt:
        lines.append(f"Megatron report_theoretical_memory: {mt['unsupported']}")
    else:
        lines.append(f"Megatron report_theoretical_memory (even split, no indexer/uneven terms): most-loaded shard "
                     f"{mt['params_most_loaded_shard'] / 1e9:.2f}B params, {mt['weight_and_optimizer_gib']:.1f} GiB "
                     "weights + optimizer state")
    lines.append(body["explanation"])
    return _finish(body, lines, ev.verdict, ev)


def inference_report(plan: Plan, cfg: ModelConfig, *, context: int | None, batch: int, kv_dtype: str,
                     weight_dtype: str | None, dp_attention: bool, include_mtp: bool) -> Report:
    """``isplan memory --inference``: weights + KV cache of the whole model on one TP group, with
    a verdict: the plan's layout reasons and whether that memory fits the GPU (a training job's
    parallel constraints and memory are not this question).

    On a serving engine (vLLM, SGLang) that question is the plan's own: the answer is
    :func:`memory_report`'s - weights + KV cache per pipeline rank at the engine's usable capacity,
    the memory ``isplan check`` judges - so the two commands never disagree on one plan (issue 16:
    one verdict per plan). Only ``--dp-attention`` (attention replicated on every GPU; a plan's own
    ``--enable-dp-attention`` is the per-rank model's) and ``--include-mtp`` keep the whole-model figure."""
    from app.core.model.memory import inference_memory
    from app.core.model.serving_memory import WeightFormatError, served_weight_dtype

    ev = evaluated(plan, cfg)
    if ev.engine.workflow == "serving" and not (dp_attention or include_mtp):
        return memory_report(plan, cfg)
    context = context if context is not None else plan_context(ev)
    try:
        weight_dtype = served_weight_dtype(cfg, weight_dtype)
    except WeightFormatError as exc:
        raise PlanError([FieldProblem(exc.field, str(exc))]) from None
    try:
        body = inference_memory(cfg, tp=plan.tp, ep=plan.ep, dp_attention=dp_attention, kv_dtype=kv_dtype,
                                context=context, batch=batch, gpu=plan.gpu,
                                gpu_capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None,
                                weight_dtype=weight_dtype, include_mtp=include_mtp)
    except ValueError as exc:
        raise PlanError([FieldProblem("context", str(exc))]) from None
    lines = [f"{cfg.id} served on TP {plan.tp} x EP {plan.ep}: {json_bytes(body.get('total_bytes_per_gpu'))} per GPU "
             f"of {json_bytes(body.get('capacity_bytes'))}: " + ("fits" if body.get("fits", True) else "OVERFLOWS")]
    if body.get("context"):
        lines.append(f"  KV cache: {body['kv_bytes_per_sequence'] // body['context']:,} B/token ({body['kv_dtype']})")
    lines += [f"  {k}: {v}" for k, v in body.items() if isinstance(v, (int, float, str)) and k != "fits"]
    blocking = [] if body.get("fits", True) else [Reason(
        "memory", "over_capacity", f"the model needs {json_bytes(body.get('total_bytes_per_gpu'))} per GPU for weights "
        f"and KV cache; the GPU holds {json_bytes(body.get('capacity_bytes'))}: raise tp or lower the context", "tp")]
    layout = [r for r in ev.verdict.blocking if r.kind not in ("parallel", "memory", "gpus")]
    return _finish(body, lines, verdict_of(layout + blocking, judged=("layout", "memory")))


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
             f"MFU {t['mfu']:.1%}, bubble {t['bubble_fraction']:.1%} ({_bubble_parts(t)})"]
    lines += [f"  {k:<10} exposed {v['exposed']:9.3f} s   total {v['total']:9.3f} s" for k, v in b.items()]
    lines += [f"  assumed: {a}" for a in t.get("assumed", [])]
    lines += [f"  note: {n}" for n in t.get("notes", [])]
    if t.get("accuracy"):
        lines.append(f"  accuracy: {t['accuracy']['text']}")
    return _finish(body, lines, ev.verdict, ev)


def bubble_waiting(t: dict[str, Any]) -> float:
    """The part of a step time's bubble its fill and drain do not explain - ranks waiting on slower
    stages, sends and parameter gathers - or 0 below what one decimal of a percentage shows."""
    rest = t["bubble_fraction"] - t["bubble_fill_drain"]
    return rest if rest >= 0.0005 else 0.0


def _bubble_parts(t: dict[str, Any]) -> str:
    """``64 micro-batches: 9.9% fill and drain, the rest waiting on slower stages, sends and
    parameter gathers`` (the parts the schedule has: no fill and drain with one stage)."""
    parts = [f"{t['bubble_fill_drain']:.1%} fill and drain"] if t["bubble_fill_drain"] > 0 else []
    if bubble_waiting(t):
        parts.append(("the rest " if parts else "") + "waiting on slower stages, sends and parameter gathers")
    return f"{t['num_microbatches']} micro-batches" + (": " + ", ".join(parts) if parts else "")


# ----------------------------------------------------------------------------- flops
def flops_command_report(plan: Plan, cfg: ModelConfig, *, global_batch: int | None = None) -> Report:
    """``isplan flops``: per-token forward FLOPs with and without IndexShare at the plan's context
    (default: the model's maximum); with a global batch, training FLOPs per step at
    ``plan.seq_length`` (default 4096)."""
    from app.core.model.flops import flops_report, training_flops

    roles, _ = _roles(plan, cfg)
    ev = evaluated(plan, cfg)
    context = plan_context(ev)
    body = flops_report(cfg, context, roles=roles)
    seq = plan.seq_length or 4096
    gbs = global_batch if global_batch is not None else plan.global_batch
    if gbs is not None:
        recompute = "full" if plan.recompute == "full" else "none"
        try:
            body["training"] = training_flops(cfg, roles, seq_length=seq, global_batch_size=gbs, recompute=recompute)
        except ValueError as exc:
            raise PlanError([FieldProblem("global_batch", str(exc))]) from None
    n_idx = body.get("indexer_layers", {})
    lines = [f"per-token forward FLOPs of {cfg.id} at context {context:,}",
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
        speed = f", {c['time']['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU" if "time" in c else ""
        lines.append(f"{'best' if k == 1 else f'#{k}  '}: --split {','.join(map(str, c['split']))}  [{go}{speed}]")
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
def search_report(plan: Plan, cfg: ModelConfig, *, gpus: int, top: int = 10, model_arg: str | None = None,
                  pareto: bool = False) -> Report:
    """``isplan search``: parallel configurations for a GPU budget, ranked by predicted tokens/s/GPU;
    every result is a plan evaluated like any other (only those whose verdict is go are listed, in
    the order of their timed tokens/s/GPU). ``pareto``: the frontier of GPUs x tokens/s/GPU x memory
    headroom over this budget and each smaller power of two down to the smallest that fits."""
    from app.core.optimise.search import row_plan

    body = _search(plan, cfg, gpus, top)
    kept = _evaluated_rows(plan, cfg, body["results"], gpus, model_arg)
    body["counts"]["refused_by_verdict"] = len(body["results"]) - len(kept)
    body["results"] = kept
    if pareto:
        body["pareto"] = pareto_frontier(plan, cfg, gpus, model_arg)
    if plan.states_layout and plan.given_parallelism:   # where the plan asked about sits in the ranking
        body["current"] = _current_rank(plan, cfg, kept)
    c = body["counts"]
    lines = [f"{cfg.id} on {gpus} x {body['gpu']['label']}: {c['combinations']:,} combinations in "
             f"{body['seconds']:.2f} s; dropped {c['constraint']:,} (constraints), {c['no_layout']:,} (no valid "
             f"layout), {c['memory']:,} (memory); {c['feasible']:,} feasible (+{c['dominated']:,} dominated)",
             "ranking: " + body["ranking_model"]]
    for k, r in enumerate(kept, start=1):
        speed = f"{r['time']['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU" if "time" in r else "not timed"
        lines.append(f"#{k} TP{r['tp']} CP{r['cp']} PP{r['pp']} DP{r['dp']} EP{r['ep']} ETP{r['etp']} VPP{r['vpp']} "
                     f"recompute={r['recompute']} offload={'on' if r['optimizer_cpu_offload'] else 'off'}: "
                     f"{speed}, {r['max_rank_bytes'] / 1e9:.1f} GB peak")
        lines.append(f"    {r['check_command']}")
    if body.get("current"):
        c = body["current"]
        lines.append(f"your plan: {c['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU, rank {c['rank']} of "
                     f"{len(kept) + 1}" if c.get("tokens_per_second_per_gpu") else "your plan is not timed")
    for p in body.get("pareto", []):
        lines.append(f"pareto: {p['gpus']} GPUs, {p['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU, "
                     f"{p['headroom_bytes'] / 1e9:.1f} GB headroom: {p['check_command']}")
    if kept:
        ev = evaluate(row_plan(plan, kept[0], gpus), cfg)
        return _finish(body, lines, ev.verdict, ev)
    blocking = [Reason("parallel", "no_feasible_configuration", f"no configuration of {gpus} GPUs passes the "
                       "constraints, has a valid layout and fits in memory", "gpus")]
    return _finish(body, lines, verdict_of(blocking, judged=("layout", "parallelism", "memory")))


def _search(plan: Plan, cfg: ModelConfig, gpus: int, top: int) -> dict[str, Any]:
    from app.core.optimise.search import search

    try:
        return search(cfg, gpus, gpu=plan.gpu,
                      gpu_capacity_bytes=int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None,
                      seq_length=plan.seq_length, tokens_per_gpu=plan.tokens_per_gpu, mbs=plan.mbs,
                      num_microbatches=plan.num_microbatches, top=top, engine=plan.engine,
                      mtp_layers=plan.mtp_layers or 0, base=plan)
    except ValueError as exc:
        raise PlanError([FieldProblem("gpus", str(exc))]) from None


def _speed(row: dict[str, Any]) -> float:
    return float(row.get("time", {}).get("tokens_per_second_per_gpu") or 0.0)


def _evaluated_rows(plan: Plan, cfg: ModelConfig, rows: list[dict[str, Any]], gpus: int,
                    model_arg: str | None) -> list[dict[str, Any]]:
    """The search's rows that evaluate GO, each with its verdict, check line and timed speed, fastest first."""
    from app.core.optimise.search import row_plan

    kept = []
    for row in rows:
        row.update(recommended(row_plan(plan, row, gpus), cfg, model_arg))
        if row["verdict"]["go"]:
            kept.append(row)
    return sorted(kept, key=lambda r: -_speed(r))


def pareto_frontier(plan: Plan, cfg: ModelConfig, gpus: int, model_arg: str | None = None) -> list[dict[str, Any]]:
    """The plans no other plan beats on all three of: fewer GPUs, more tokens/s/GPU, more memory
    headroom - over the search's best GO plans at ``gpus`` and each smaller power of two that fits."""
    points: list[dict[str, Any]] = []
    budget = gpus
    while budget >= 1:
        try:
            body = _search(plan, cfg, budget, 10)
        except PlanError:
            break
        rows = _evaluated_rows(plan, cfg, body["results"], budget, model_arg)
        if not rows:
            break
        points += [{"gpus": budget, "tokens_per_second_per_gpu": _speed(r), "headroom_bytes": r["headroom_bytes"],
                    "query": r["query"], "check_command": r["check_command"]} for r in rows if "time" in r]
        budget = budget // 2 if budget % 2 == 0 else 0

    def beaten(p: dict[str, Any]) -> bool:
        return any(q is not p and q["gpus"] <= p["gpus"] and q["tokens_per_second_per_gpu"] >= p["tokens_per_second_per_gpu"]
                   and q["headroom_bytes"] >= p["headroom_bytes"] and (q["gpus"], q["tokens_per_second_per_gpu"],
                   q["headroom_bytes"]) != (p["gpus"], p["tokens_per_second_per_gpu"], p["headroom_bytes"])
                   for q in points)
    return sorted((p for p in points if not beaten(p)), key=lambda p: (p["gpus"], -p["tokens_per_second_per_gpu"]))


def _current_rank(plan: Plan, cfg: ModelConfig, kept: list[dict[str, Any]]) -> dict[str, Any]:
    """The asked-about plan's own timed speed and where it would rank among the results."""
    ev = evaluate(plan, cfg)
    speed = ev.time.get("tokens_per_second_per_gpu") if ev.time and "unavailable" not in ev.time else None
    rank = 1 + sum(1 for r in kept if speed is not None and _speed(r) > speed)
    return {"query": plan.query(), "go": ev.verdict.go, "tokens_per_second_per_gpu": speed, "rank": rank}


# ----------------------------------------------------------------------------- receipt
def receipt_report(plan: Plan, cfg: ModelConfig, *, name: str = "training",
                   also: list[tuple[str, Any]] | None = None, model_revision: str | None = None,
                   engine_commit: str | None = None, created_utc: str | None = None) -> Report:
    """``isplan receipt``: a verifiable record of the plan's layouts (training, the conversion
    slot, and any ``also`` layouts) and the plan's verdict. The receipt's top-level verdict is
    :func:`app.core.receipt.receipt_verdict` (the plan's and every ``also`` layout's), the rule
    ``isplan verify`` recomputes."""
    from app.core.engines.megatron import conversion_spec, pipeline_spec
    from app.core.engines.megatron.check import CheckResult
    from app.core.receipt import build_receipt, verdict_from_dict

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
    own = len(layouts)
    layouts += also or []
    record = {"query": plan.query(), "parallel": ev.judged, "verdict": ev.verdict.to_dict()}
    body = build_receipt(cfg, layouts, engine=plan.engine, pattern=plan.pattern, model_revision=model_revision,
                         engine_commit=engine_commit, created_utc=created_utc, plan=record, plan_layouts=own)
    verdict = verdict_from_dict(body["verdict"])
    lines = [f"receipt for {cfg.id}: " + ("valid" if body["valid"] else "INVALID")]
    return Report(body, lines + verdict_lines(verdict), verdict)
