"""One report per command: ``(plan, config, options) -> (JSON body, text lines)``.

``isplan <command> --format json`` prints :attr:`Report.body`; ``GET /api/v1/<command>`` returns
the same object (compared in tests/test_twins.py); ``--format text`` prints :attr:`Report.lines`.
Every body carries ``verdict`` (:mod:`app.core.verdict`) and the CLI exits 1 exactly when its
``go`` is false. Unusable input raises :class:`app.core.plan.PlanError` (exit 2 / a 422), naming
the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.evaluate import Evaluation, evaluate, pipeline_spec, plan_roles
from app.core.layer_roles import roles_report
from app.core.layout_check import CheckResult
from app.core.model_config import ModelConfig
from app.core.plan import SERVING_ENGINES, FieldProblem, Plan, PlanError
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
    """Evaluate ``plan``; input problems become a :class:`PlanError` (exit 2 / 422). Memory and GPUs
    join the verdict when the plan states its parallelism (:attr:`Plan.given_parallelism`)."""
    ev = evaluate(plan, cfg, parallel=plan.given_parallelism, **kw)
    if ev.problems:
        raise PlanError(ev.problems)
    return ev


def _finish(body: dict[str, Any], lines: list[str], verdict: Verdict) -> Report:
    body["verdict"] = verdict.to_dict()
    lines = lines + verdict_lines(verdict)
    return Report(body, lines, verdict)


def verdict_lines(verdict: Verdict) -> list[str]:
    out = [f"verdict: {verdict.headline()}"]
    out += [f"  blocking ({r.kind}{', field ' + r.field if r.field else ''}): {r.message}" for r in verdict.blocking]
    return out


def parallel_summary(ev: Evaluation) -> dict[str, Any] | None:
    """TP/CP/PP/DP/EP/ETP, the GPU equation and the fit of every rank (when parallelism is stated)."""
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
    lines = ev.check.text_lines() if hasattr(ev.check, "text_lines") else stage_lines(ev.check)
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
    return _finish(body, lines, ev.verdict)


def stage_lines(check: Any) -> list[str]:
    """``stage k: a-b (role)`` lines for an engine check without its own text (MaxText)."""
    body = check.to_json()
    lines = [f"model {body['model']['id']}, engine {body['engine']}, {body['pp']} stage(s) x {body['vpp']} repeat(s)"]
    lines += [f"warning: {w}" for w in body["warnings"]]
    lines += [f"stage {r['stage']} (stage {r['pp_rank']}, repeat {r['vp_stage']}): {r['first_layer']}-{r['last_layer']} "
              f"({r['start_role']})" for r in body["stages"] if r["num_layers"]]
    lines += [f"INVALID: {e['message']}" for e in body["errors"]]
    lines += [f"INVALID: {v['message']}" for v in body["violations"]]
    if body["valid"]:
        lines.append("VALID: every stage of every repeat starts on a full indexer layer")
    return lines


def _roles(plan: Plan, cfg: ModelConfig) -> tuple[Any, list[int]]:
    """The plan's engine roles; an unusable pattern or engine setting is a field problem."""
    from app.core.engines.rules import EngineInputError
    from app.core.layer_roles import PatternError

    try:
        return plan_roles(plan, cfg)
    except (PatternError, EngineInputError) as exc:
        raise PlanError([FieldProblem("pattern", str(exc))]) from None


# ----------------------------------------------------------------------------- roles
def roles_command_report(plan: Plan, cfg: ModelConfig) -> Report:
    """``isplan roles``: per-layer roles, sources and disagreements between engines."""
    roles, differences = _roles(plan, cfg)
    body = roles_report(cfg, plan.engine, pattern=plan.pattern, freq=plan.dsa_freq, offset=plan.dsa_offset,
                        roles=roles)
    if plan.engine in SERVING_ENGINES or plan.engine == "maxtext":
        body["engine_differs_from_checkpoint"] = differences
    lines = [f"model {cfg.id}: {body['num_layers']} layers, {body['num_full']} full, {body['num_shared']} shared "
             f"(rule: {body['rule']}, engine {body['engine']})", body["pattern"],
             "full layers: " + ", ".join(str(x) for x in body["full_layers"])]
    lines += ["disagreement: " + d["message"] for d in body["disagreements"]]
    if body["pattern_differences"] is not None:
        lines.append("pattern differs from the config on layers: "
                     + (", ".join(map(str, body["pattern_differences"])) or "none"))
    lines += ["ERROR: " + e["message"] for e in body["errors"]]
    verdict = verdict_of([Reason("model", e["code"], e["message"], "pattern" if plan.pattern else "model")
                          for e in body["errors"]])
    return _finish(body, lines, verdict)


# ----------------------------------------------------------------------------- params
def params_report(plan: Plan, cfg: ModelConfig, *, per_layer: bool = False, with_layout: bool = False) -> Report:
    """``isplan params``: totals, active, components; per pipeline rank when a layout is given."""
    from app.core.parameters import count_parameters, per_rank_params

    roles, _ = _roles(plan, cfg)
    body: dict[str, Any] = {"model": cfg.summary(), **count_parameters(cfg, roles).to_json()}
    if not per_layer:
        body.pop("per_layer")
    verdict = Verdict()
    if with_layout:
        ev = evaluated(plan, cfg)
        assert ev.check is not None
        verdict = ev.verdict
        stages = ev.check.plan
        if stages.errors:
            raise PlanError([FieldProblem("split", "; ".join(e.message for e in stages.errors))])
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
    return _finish(body, lines, verdict)


# ----------------------------------------------------------------------------- memory
def memory_report(plan: Plan, cfg: ModelConfig, **kw: Any) -> Report:
    """``isplan memory``: training memory per GPU of every pipeline rank, beside Megatron's own
    estimate. Memory always joins this command's verdict."""
    kw.pop("parallel", None)  # memory always states parallelism
    ev = evaluate(plan, cfg, parallel=True, **kw)
    if ev.problems:
        raise PlanError(ev.problems)
    if ev.memory is None:
        assert ev.check is not None
        raise PlanError([FieldProblem("pp", "no memory estimate: the layout is not one Megatron accepts: "
                                      + "; ".join(e.message for e in ev.check.plan.errors))])
    body = dict(ev.memory)
    lines = [f"{body['gpus']} GPUs ({body['gpu']['label']}), expert grid {body['expert_grid']}"]
    lines += [f"pp rank {st['pp_rank']}: {st['total_bytes'] / 1e9:7.1f} GB of {st['capacity_bytes'] / 1e9:.0f} GB "
              + ("fits" if st["fits"] else "OVERFLOWS") + f"  (largest term: {st['dominant_label']})"
              for st in body["stages"]]
    mt = body["megatron_theoretical"]
    lines.append(f"Megatron report_theoretical_memory (even split, no indexer/uneven terms): most-loaded shard "
                 f"{mt['params_most_loaded_shard'] / 1e9:.2f}B params, {mt['weight_and_optimizer_gib']:.1f} GiB "
                 "weights + optimizer state")
    lines.append(body["explanation"])
    return _finish(body, lines, ev.verdict)


# ----------------------------------------------------------------------------- flops
def flops_command_report(plan: Plan, cfg: ModelConfig, *, global_batch: int | None = None) -> Report:
    """``isplan flops``: per-token forward FLOPs with and without IndexShare at ``plan.context``;
    with a global batch, training FLOPs per step at ``plan.seq_length`` (default 4096)."""
    from app.core.flops import flops_report, training_flops

    roles, _ = _roles(plan, cfg)
    body = flops_report(cfg, plan.context, roles=roles)
    seq = plan.seq_length or 4096
    gbs = global_batch if global_batch is not None else plan.global_batch
    if gbs is not None:
        recompute = "full" if plan.recompute == "full" else "none"
        try:
            body["training"] = training_flops(cfg, roles, seq_length=seq, global_batch_size=gbs, recompute=recompute)
        except ValueError as exc:
            raise PlanError([FieldProblem("gbs", str(exc))]) from None
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
    return _finish(body, lines, Verdict())


# ----------------------------------------------------------------------------- plan search
def plan_search_report(plan: Plan, cfg: ModelConfig, *, objective: str = "balanced", top: int = 3,
                       near: tuple[int, ...] | None = None) -> Report:
    """``isplan plan``: the exact optimal valid layout for ``plan.pp`` x ``plan.vpp``, the next
    best ones and, with ``near``, the valid layout closest to a given split."""
    from app.core.plan_search import plan_report

    if plan.engine in SERVING_ENGINES:
        return serving_plan_search_report(plan, cfg, top=top)
    if plan.engine == "maxtext":
        raise PlanError([FieldProblem("engine", "isplan plan searches Megatron/slime layouts and vLLM/SGLang "
                                                "partitions; for MaxText use isplan check --engine maxtext")])
    roles, _ = _roles(plan, cfg)
    vpp = plan.vpp or 1
    try:
        body = plan_report(cfg, roles, pp=plan.pp, vpp=vpp, objective=objective, context=plan.context,
                           top=top, near=near)
    except ValueError as exc:
        raise PlanError([FieldProblem("near" if "near" in str(exc) else "pp", str(exc))]) from None
    lines = [f"{cfg.id}: {body['valid_layout_count']:,} valid layouts for PP {plan.pp} x VPP {vpp} "
             f"(objective {body['objective']}: {body['cost_unit']})"]
    blocking = []
    if body["best"] is None:
        msg = f"no valid layout with {plan.pp * vpp} stages: fewer full layers than stages (or layer 1 is shared)"
        lines.append(msg)
        blocking.append(Reason("boundary", "no_valid_layout", msg, "pp"))
    else:
        b = body["best"]
        lines.append(f"best: --split {','.join(map(str, b['split']))}  (starts {b['starts']}; max {b['max_cost']:.6g})")
        lines.append("      " + " ".join(b["megatron_flags"]))
        lines += [f"#{k}:   --split {','.join(map(str, alt['split']))}  (max {alt['max_cost']:.6g})"
                  for k, alt in enumerate(body["alternatives"], start=2)]
    if body.get("near"):
        n = body["near"]
        lines.append(f"nearest valid to {','.join(map(str, n['from']))}: {','.join(map(str, n['split']))} "
                     f"({n['moved']} layer(s) move)")
    return _finish(body, lines, verdict_of(blocking))


def serving_plan_search_report(plan: Plan, cfg: ModelConfig, *, top: int = 3) -> Report:
    """``isplan plan --engine vllm|sglang --pp N``: the best valid serving partition (balanced
    weights + KV cache per rank, MTP draft and lm_head where the engine puts them) and its export."""
    from app.core.engines.rules import EngineInputError
    from app.core.engines.serving import serving_plan_report
    from app.core.parallelism import resolve_gpu

    try:
        gpu = resolve_gpu(plan.gpu, int(plan.gpu_gb * 1e9) if plan.gpu_gb else None)
        body = serving_plan_report(cfg, plan.engine, plan.pp, tp=plan.tp, ep=plan.ep, mtp=bool(plan.mtp),
                                   version=plan.engine_version, k=top + 1, gpu_memory=gpu.capacity_bytes / 2**30,
                                   weight_dtype=plan.weight_dtype, kv_dtype=plan.kv_dtype, context=plan.context,
                                   concurrency=plan.concurrency)
    except (EngineInputError, ValueError) as exc:
        raise PlanError([FieldProblem("pp", str(exc))]) from None
    best = body.get("best")
    lines = [f"{cfg.id} served by {plan.engine} with PP {plan.pp}: default partition "
             f"{','.join(map(str, body['default']['partition']))} is "
             + ("valid" if body["default"]["valid"] else "INVALID")]
    blocking = []
    if best:
        export = best.get("export") or {}
        lines += [f"best: {export.get('env_line', best.get('partition'))}", f"      {export.get('command', '')}"]
    else:
        msg = "; ".join(e["message"] for e in body.get("errors", [])) or "no valid partition"
        lines.append(msg)
        blocking.append(Reason("boundary", "no_valid_partition", msg, "pp"))
    return _finish(body, lines, verdict_of(blocking))


# ----------------------------------------------------------------------------- GPU budget search
def search_report(plan: Plan, cfg: ModelConfig, *, gpus: int, top: int = 10) -> Report:
    """``isplan search``: parallel configurations for a GPU budget, ranked."""
    from app.core.search import search

    try:
        body = search(cfg, gpus, gpu=plan.gpu, gpu_capacity_bytes=int(plan.gpu_gb * 1e9) if plan.gpu_gb else None,
                      seq_length=plan.seq_length, tokens_per_gpu=plan.tokens_per_gpu, mbs=plan.mbs,
                      num_microbatches=plan.microbatches, top=top, engine=plan.engine)
    except ValueError as exc:
        raise PlanError([FieldProblem("gpus", str(exc))]) from None
    c = body["counts"]
    lines = [f"{cfg.id} on {gpus} x {body['gpu']['label']}: {c['combinations']:,} combinations in "
             f"{body['seconds']:.2f} s; dropped {c['constraint']:,} (constraints), {c['no_layout']:,} (no valid "
             f"layout), {c['memory']:,} (memory); {c['feasible']:,} feasible (+{c['dominated']:,} dominated)",
             "ranking: " + body["ranking_model"]]
    lines += [f"#{k} TP{r['tp']} CP{r['cp']} PP{r['pp']} DP{r['dp']} EP{r['ep']} ETP{r['etp']} VPP{r['vpp']} "
              f"recompute={r['recompute']} offload={'on' if r['optimizer_cpu_offload'] else 'off'}: "
              f"{r['max_rank_bytes'] / 1e9:.1f} GB peak, time x{r['relative_step_time']:.3f}, "
              f"split {','.join(map(str, r['split']))}" for k, r in enumerate(body["results"], start=1)]
    blocking = [] if body["results"] else [Reason("parallel", "no_feasible_configuration",
                                                  f"no configuration of {gpus} GPUs passes the constraints, has a "
                                                  "valid layout and fits in memory", "gpus")]
    return _finish(body, lines, verdict_of(blocking))


# ----------------------------------------------------------------------------- receipt
def receipt_report(plan: Plan, cfg: ModelConfig, *, name: str = "training",
                   also: list[tuple[str, Any]] | None = None, model_revision: str | None = None,
                   engine_commit: str | None = None, created_utc: str | None = None) -> Report:
    """``isplan receipt``: a verifiable record of the plan's layouts (training, the conversion
    slot, and any ``also`` layouts) and the plan's verdict. The receipt's top-level verdict is
    :func:`app.core.receipt.receipt_verdict` (the plan's and every ``also`` layout's), the rule
    ``isplan verify`` recomputes."""
    from app.core.evaluate import conversion_spec
    from app.core.receipt import build_receipt, verdict_from_dict

    ev = evaluated(plan, cfg)
    if not isinstance(ev.check, CheckResult):
        raise PlanError([FieldProblem("engine", "receipts record Megatron/slime/hf layouts; for a serving or "
                                                "MaxText plan use isplan check --format json")])
    warnings = ev.check.warnings
    layouts: list[Any] = [(name, pipeline_spec(plan), plan.dsa_freq, plan.dsa_offset, tuple(warnings))]
    conv = conversion_spec(plan)
    if conv is not None:
        layouts.append(("conversion", conv, plan.dsa_freq, plan.dsa_offset, ()))
    own = len(layouts)
    layouts += also or []
    record = {"query": plan.query(), "parallel": ev.parallel, "verdict": ev.verdict.to_dict()}
    body = build_receipt(cfg, layouts, engine=plan.engine, pattern=plan.pattern, model_revision=model_revision,
                         engine_commit=engine_commit, created_utc=created_utc, plan=record, plan_layouts=own)
    verdict = verdict_from_dict(body["verdict"])
    lines = [f"receipt for {cfg.id}: " + ("valid" if body["valid"] else "INVALID")]
    return Report(body, lines + verdict_lines(verdict), verdict)
