"""The dashboard's view model: one :class:`PlanView` from a plan and its evaluation.

Everything shown is computed once by :func:`app.core.evaluate.evaluate`; this module only
gathers it for the templates (layer cells, stage rows, exports) and turns input problems into
per-field messages. It never raises for bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.core.engines import LayoutCheck
from app.core.evaluate import Evaluation, evaluate
from app.core.model.config import ConfigError, ModelConfig, load_preset, preset_ids
from app.core.model.flops import bubble_fraction
from app.core.model.parameters import stage_params
from app.core.plan import NEUTRAL_VALUES, TABLE, FieldProblem, Plan, applies, format_value, mode_note
from app.core.reports import gpu_equation, parallel_summary
from app.core.verdict import Verdict
from app.web.store import BaseStore


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
    plan: Plan
    ev: Evaluation
    field_errors: dict[str, str]
    cells: list[LayerCell] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)

    @property
    def cfg(self) -> ModelConfig:
        return self.ev.cfg

    @property
    def check(self) -> Any:
        """The engine's check: CheckResult (Megatron/slime/hf), ServingCheck or MaxTextCheck."""
        return self.ev.check

    @property
    def conversion(self) -> LayoutCheck | None:
        return self.ev.conversion

    @property
    def verdict(self) -> Verdict:
        return self.ev.verdict

    @property
    def go(self) -> bool:
        """The page headline: GO only when every field is usable and the verdict is go."""
        return self.verdict.go and not self.field_errors and self.check is not None

    @property
    def values(self) -> dict[str, str]:
        """Every plan field's value as the form shows it, by URL key ("" when unset)."""
        out = {}
        for name, spec in TABLE.items():
            value = getattr(self.plan, name)
            out[spec.url] = "" if value is None else format_value(spec, value)
        return out

    @property
    def hidden_values(self) -> dict[str, str]:
        """The set (non-neutral) values of the fields the form does not show for the plan's
        engine: they ride along as hidden inputs, so switching engines loses nothing."""
        hidden = self.hidden_keys
        return {spec.url: format_value(spec, getattr(self.plan, name)) for name, spec in TABLE.items()
                if spec.url in hidden and getattr(self.plan, name) not in (None, NEUTRAL_VALUES[name])}

    @property
    def hidden_keys(self) -> set[str]:
        """URL keys the form does not show for the plan's engine (each engine has its own
        vocabulary)."""
        return set(TABLE) - set(self.ev.engine.fields) - {"mode", "engine", "model"}

    @property
    def inactive(self) -> set[str]:
        """URL keys of the fields the plan's layout mode does not use (shown greyed, explained)."""
        return {spec.url for spec in TABLE.values() if not applies(spec, self.plan.mode)}

    @property
    def checks(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.ev.checks]

    @property
    def starts(self) -> list[int]:
        if not self.check:
            return []
        return [s.first_layer for s in self.check.plan.stages if s.first_layer is not None]

    @property
    def gpu_line(self) -> str:
        return gpu_equation(self.ev) or "GPU count unavailable: fix the layout and parallel settings"

    @property
    def expert_line(self) -> str:
        p = self.ev.par
        if p is None:
            return ""
        return f"expert grid ETP {p.expert_tp} × EP {p.ep} × PP {p.pp} = {p.expert_grid_size}; EDP {p.edp}"

    @property
    def fit_line(self) -> str:
        mem = self.ev.memory
        if not mem:
            return ""
        worst = max(mem["stages"], key=lambda s: s["total_bytes"])
        return (f"largest rank: pp rank {worst['pp_rank']} needs {worst['total_bytes'] / 1e9:.1f} GB of "
                f"{worst['capacity_bytes'] / 1e9:.0f} GB ({mem['gpu']['label']}): "
                + ("every rank fits" if mem["fits"] else "does NOT fit"))

    @property
    def memory_terms(self) -> dict[str, Any]:
        """Every memory term of the largest rank: its label, bytes and how it is counted."""
        from app.core.model.memory import TERM_EXPLANATIONS, TERM_LABELS

        mem = self.ev.memory
        if not mem:
            return {"rank": None, "terms": []}
        worst = max(mem["stages"], key=lambda s: s["total_bytes"])
        return {"rank": worst["pp_rank"], "terms": [
            {"label": TERM_LABELS[k], "bytes": b, "how": TERM_EXPLANATIONS[k]}
            for k, b in worst["breakdown_detail"].items() if k in TERM_LABELS]}

    def page_json(self) -> dict[str, Any]:
        """``GET /api/v1/plan``: the plan, its verdict and every panel."""
        ev = self.ev
        return {
            "plan": self.plan.to_dict(), "query": self.plan.query(), "verdict": ev.verdict.to_dict(),
            "check": ev.check.to_json() if ev.check else None,
            "conversion": ev.conversion.to_json() if ev.conversion else None,
            "parallel": parallel_summary(ev), "memory": ev.memory, "stage_flops": ev.stage_flops,
            "exports": self.exports,
        }


def resolve_model(model: str, store: BaseStore) -> tuple[ModelConfig, str | None]:
    """A preset or an uploaded config; an unknown id shows GLM-5.2 with a message on ``model``."""
    if model in preset_ids():
        return load_preset(model), None
    err: str | None = None
    try:
        cfg = store.get(model)
    except ConfigError as exc:
        cfg, err = None, str(exc)
    if cfg is None:
        err = err or (f"model {model[:80]!r} is neither a preset ({', '.join(preset_ids())}) nor an "
                      "uploaded config (sha256:...); showing glm-5.2")
        return load_preset("glm-5.2"), err
    return cfg, None


def build_view(plan: Plan, problems: list[FieldProblem], store: BaseStore) -> PlanView:
    """Evaluate ``plan`` for the page. Fields with problems keep their defaults (already in
    ``plan``) and carry a message; the verdict is always that of the plan shown."""
    errors: dict[str, str] = {}
    for p in problems:  # the first problem of a field is the one to fix first
        errors.setdefault(p.field, p.message)
    cfg, model_err = resolve_model(plan.model, store)
    if model_err:
        errors["model"] = f"{errors['model']}; {model_err}" if "model" in errors else model_err
        plan = replace(plan, model=cfg.id)
    ev = evaluate(plan, cfg)
    for p in ev.problems:
        errors.setdefault(p.field, p.message)
    view = PlanView(plan, ev, errors)
    if ev.check is not None:
        view.cells = _cells(ev.check)
        view.rows = _rows(ev)
    view.exports = exports(view)
    note = mode_note(plan)
    if note:
        view.messages.append(note)
    if ev.not_judged:
        view.messages.append(ev.not_judged)
    if ev.par is not None and ev.stage_plan is not None:
        m = ev.par.microbatches or 8 * ev.stage_plan.pp
        view.messages.append(f"pipeline bubble {bubble_fraction(ev.stage_plan.pp, ev.stage_plan.vpp, m) * 100:.1f}% "
                             f"of wall time with {m} micro-batches" + ("" if ev.par.microbatches else " (assumed 8 × PP)"))
    return view


def page_data(plan: Plan, cfg: ModelConfig) -> dict[str, Any]:
    """``GET /api/v1/plan``: :meth:`PlanView.page_json` of ``plan`` on ``cfg`` (a known model),
    the same evaluation as :func:`build_view` without the display-only parts that JSON does not
    carry (layer cells, stage rows, messages). Module-level, so the worker pool can run it."""
    view = PlanView(plan, evaluate(plan, cfg), {})
    view.exports = exports(view)
    return view.page_json()


def _cells(check: LayoutCheck) -> list[LayerCell]:
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


def _rows(ev: Evaluation) -> list[dict[str, Any]]:
    check, par, cfg = ev.check, ev.par, ev.cfg
    assert check is not None
    sized = not check.plan.errors  # a plan with errors may reach past the last layer
    rank_mem = {s["pp_rank"]: s for s in ev.memory["stages"]} if ev.memory else {}
    stage_fl = {s["index"]: s["flops"] for s in ev.stage_flops["stages"]} if ev.stage_flops else {}
    invalid = {v.stage.index for v in check.boundary.violations}
    rows = []
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
            "full_layers": [n for n in s.layers if n <= cfg.num_hidden_layers and check.roles.role(n).role == "full"],
            "params_per_gpu": sp_.per_gpu if sp_ else None,
            "rank_memory_bytes": rm["total_bytes"] if rm else None,
            "rank_fits": rm["fits"] if rm else None,
            "flops": stage_fl.get(s.index),
            "extras": ", ".join(x for x in ("embedding" if s.embedding else "",
                                            f"MTP ×{s.mtp_layers}" if s.mtp_layers else "",
                                            "loss" if s.loss else "") if x),
            "invalid": s.index in invalid,
        })
    return rows


def exports(view: PlanView) -> dict[str, str]:
    """What the page offers to copy, every value shell-quoted: Megatron arguments, slime
    ``PERF_ARGS``, the layout string and the conversion layout (:mod:`app.core.engines.megatron.export`), the
    serving env line and command (vLLM / SGLang), and the ``isplan check`` line of the whole plan."""
    out = dict(view.ev.exports())
    out["cli"] = view.plan.cli_command()
    return out


# ----------------------------------------------------------------------------- compare (display only)
def plan_summary(view: PlanView) -> dict[str, Any]:
    """The numbers the compare panel puts side by side, all read from the plan's one evaluation:
    the verdict, the largest rank's memory, the compute balance (slowest stage's forward FLOPs
    over the mean: 1.00 is perfectly even), the pipeline bubble and the GPU count."""
    ev = view.ev
    mem = ev.memory
    worst = max(mem["stages"], key=lambda s: s["total_bytes"]) if mem else None
    flops = [s["flops"] for s in ev.stage_flops["stages"]] if ev.stage_flops else []
    pp_flops: dict[int, float] = {}
    for s in (ev.stage_flops or {}).get("stages", []):
        pp_flops[s["pp_rank"]] = pp_flops.get(s["pp_rank"], 0) + s["flops"]
    balance = max(pp_flops.values()) / (sum(pp_flops.values()) / len(pp_flops)) if pp_flops and sum(flops) else None
    bubble = None
    if ev.par is not None and ev.stage_plan is not None:
        m = ev.par.microbatches or 8 * ev.stage_plan.pp
        bubble = bubble_fraction(ev.stage_plan.pp, ev.stage_plan.vpp, m)
    return {
        "go": view.go, "blocking": [r.kind for r in view.verdict.blocking] + (["input"] if view.field_errors else []),
        "layout": getattr(view.check, "layout_string", None),
        "max_rank_gb": worst["total_bytes"] / 1e9 if worst else None,
        "max_rank": worst["pp_rank"] if worst else None,
        "capacity_gb": worst["capacity_bytes"] / 1e9 if worst else None,
        "rank_gb": [s["total_bytes"] / 1e9 for s in mem["stages"]] if mem else [],
        "balance": balance, "bubble": bubble, "gpu_line": view.gpu_line,
    }


def flag_diff(a: Plan, b: Plan) -> list[tuple[str, str, str]]:
    """``(setting, A's value, B's value)`` for every plan field the two plans set differently,
    in the plan table's order, as the CLI spells the flag (``--tp``) or the URL key."""
    out = []
    for name, spec in TABLE.items():
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            label = spec.cli or spec.url
            out.append((label, "—" if va is None else format_value(spec, va), "—" if vb is None else format_value(spec, vb)))
    return out
