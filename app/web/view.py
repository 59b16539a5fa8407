"""The dashboard's view model: one :class:`PlanView` from a plan and its evaluation.

Everything shown is computed once by :func:`app.core.evaluate.evaluate`; this module only
gathers it for the templates (the engine's form, layer cells, stage rows, exports, step time) and
turns input problems into per-field messages. It never raises for bad input, and it never
branches on an engine's name: the form is the engine's own fields (:attr:`Engine.fields`) under
the engine's own flag names (:attr:`Engine.flags`), the stage table says what the engine does at
a shared start (:attr:`LayoutCheck.share`), the exports are whatever the engine exports.

**The form holds what the URL holds.** A field shows the value the plan's canonical query holds
(or, for a value that could not be used, the text the URL carried, so the share URL keeps it);
every other field is blank with its neutral default as the placeholder. A blank field is not sent
as a setting, so the page never states (and so never judges) a setting its URL does not hold -
the one rule of what is judged (:attr:`app.core.evaluate.Evaluation.judged`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from html import escape
from typing import Any

from markupsafe import Markup

from app.core.content_cache import remember
from app.core.engines import Engine, LayoutCheck
from app.core.engines.serving import serving_terms_held
from app.core.evaluate import Evaluation, evaluate
from app.core.model.config import ConfigError, ModelConfig, load_preset, preset_ids
from app.core.model.parameters import stage_params
from app.core.model.roles import RoleMap
from app.core.plan import NEUTRAL_VALUES, TABLE, FieldProblem, Plan, applies, encode_query, format_value, mode_note
from app.core.reports import bubble_waiting, gpu_equation, parallel_summary
from app.core.time.schedule import closed_form_bubble
from app.core.verdict import Verdict
from app.web.store import BaseStore

#: the form's fieldsets, in the order the workflow reads them, with their legends (plan-table groups)
GROUPS: tuple[tuple[str, str], ...] = (
    ("model", "Model and roles"), ("layout", "Layout"), ("parallel", "Parallelism"), ("memory", "Memory"),
    ("serving", "Serving"), ("maxtext", "MaxText pipeline"), ("time", "Step time"), ("flops", "FLOPs"),
    ("conversion", "Conversion layout (a second slot)"),
)
#: words for the terms the groups use, shown under their legend when the engine's form has the field
#: they explain (a serving form has no virtual stages and no expert data parallelism)
GROUP_HINTS = {
    "layout": ("vpp", "Stage sizes are vp-major: virtual stage 0 of every pipeline rank first (ranks 0, 1, ...), "
                      "then virtual stage 1 of every rank, and so on; with VPP V the list has PP × V entries."),
    "parallel": ("etp", "EDP (expert data parallel) = GPUs / (ETP × EP × PP): the group that shards the experts' "
                        "optimizer state."),
    "conversion": ("conv", "The conversion layout is the pipeline split a checkpoint conversion runs with (e.g. "
                           "slime converts GLM-5.2 with PP 2, last 40): its stages must also start on full layers."),
}
#: the plan-table groups whose settings state a plan's parallelism (app.core.plan.table)
PARALLEL_GROUPS = ("parallel", "memory", "time")
#: the fields drawn by the model picker (``#pick``), not by the generic form
PICKED = ("model", "engine")
#: what each export is called on the page (an engine exports any subset of these)
EXPORT_LABELS = {"megatron": "Megatron arguments", "slime": "slime PERF_ARGS", "layout": "layout string",
                 "conversion": "conversion layout", "serve": "serve launch (env + command)",
                 "serve_env": "partition env line", "serve_command": "serve command", "cli": "CLI equivalent"}


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
    pp_rank: int | None = None
    vp_stage: int | None = None
    #: a hybrid model's layer: "mamba", "attention" or "none" (an FFN block); "gdn": a gated DeltaNet layer
    mixer: str = "attention"

    @property
    def glyph(self) -> str:
        """The module mark under the number: d dense FFN, e MoE; a hybrid model's Mamba (m) and
        attention-only (a) layers have no FFN."""
        return {"dense": "d", "moe": "e"}.get(self.ffn) or ("m" if self.mixer == "mamba" else "a")

    @property
    def title(self) -> str:
        kind = "MTP layer" if self.mtp else f"layer {self.layer}"
        src = (" computes its own top-k" if self.role == "full" else
               f" reuses top-k of full layer {self.source}" if self.source else " has no full layer before it")
        where = f", stage {self.stage} (pp rank {self.pp_rank}, vp stage {self.vp_stage})" if self.stage else ""
        bad = "; INVALID stage start" if self.invalid else ""
        module = (f"{self.ffn} FFN" if self.mixer == "attention" and self.ffn != "none" else
                  f"a gated DeltaNet, {self.ffn} FFN" if self.mixer == "gdn" else
                  "a Mamba-2 mixer" if self.mixer == "mamba" else "attention only" if self.mixer == "attention"
                  else f"{'an MoE' if self.ffn == 'moe' else 'a dense MLP'} block")
        return f"{kind}: {self.role}, {module}{where};{src}{bad}"


#: A layer cell's HTML by everything it shows (:func:`_cell_html`): a drag redraws the map after
#: every move, and all cells but the few around the moved boundary are drawn as before. Bounded.
_CELL_HTML: dict[tuple[Any, ...], str] = {}
CELL_HTML_SIZE = 16384


def _cell_html(c: LayerCell, first: bool, tagged: bool) -> str:
    """One cell of the layer map: a focusable image named by its ``title`` (role, stage, top-k
    source), its letter, number and FFN kind, the rank tag on a stage start when VPP > 1
    (``tagged``), the "!" of an invalid start, a gated DeltaNet layer's number underlined (``linear``);
    only the map's first cell is in the tab order."""
    key = (c.layer, c.role, c.letter, c.ffn, c.source, c.stage, c.start, c.invalid, c.mtp, c.pp_rank, c.vp_stage,
           c.mixer, first, tagged)
    found = _CELL_HTML.get(key)
    if found is None:
        cls = (f"cell {c.role}{' mtp' if c.mtp else ''}{' start' if c.start else ''}{' invalid' if c.invalid else ''}"
               f"{' linear' if c.mixer == 'gdn' else ''} "
               f"band{(c.stage or 0) % 2}" + (f" rank{c.pp_rank % 8}" if c.pp_rank is not None else ""))
        tag = f'<span class="rk">r{c.pp_rank}</span>' if c.start and c.pp_rank is not None and tagged else ""
        mark = '<span class="mark">!</span>' if c.invalid else ""
        found = (f'<div id="L{"m" if c.mtp else ""}{c.layer}" class="{cls}" data-layer="{c.layer}" role="img" '
                 f'tabindex="{0 if first else -1}" title="{escape(c.title)}"><span class="letter" aria-hidden="true">'
                 f'{c.letter}</span><span class="num" aria-hidden="true">{c.layer}</span><span class="ffn" '
                 f'aria-hidden="true">{c.glyph}</span>{tag}{mark}</div>')
        remember(_CELL_HTML, key, found, CELL_HTML_SIZE)
    return found


#: How the summary words a parallelism check (:attr:`PlanView.checks_html`).
CHECK_WORDS = {"warn": "warning", "pass": "pass", "fail": "FAIL"}


def _stage_row_html(r: dict[str, Any]) -> str:
    """One row of the stage table (:attr:`PlanView.stage_rows_html`), its text escaped."""
    start = escape(str(r["start"]))
    source, source_stage = r["source"], r["source_stage"]
    if not source:
        source = "—"
    elif source_stage and source_stage != r["stage"]:
        source = f"{source} (stage {source_stage})"
    params = f'{r["params_per_gpu"] / 1e9:.2f}B' if r["params_per_gpu"] is not None else "—"
    flops = f'{r["flops"] / 1e12:.0f}' if r["flops"] is not None else "—"
    seconds = f'{r["seconds"]:.3f}' if r["seconds"] is not None else "—"
    return (f'<tr class="{"invalid" if r["invalid"] else ""}"><th scope="row">{r["stage"]}</th>'
            f'<td>{r["pp_rank"]} / {r["vp_stage"]}</td><td>{escape(str(r["range"]))}</td><td>{r["num_layers"]}</td>'
            f'<td>{f"<strong>{start}</strong>" if r["invalid"] else start}</td><td>{source}</td>'
            f'<td>{", ".join(map(str, r["full_layers"]))}</td><td>{params}</td><td>{escape(str(r["memory"]))}</td>'
            f'<td>{flops}</td><td>{seconds}</td><td>{escape(str(r["extras"]))}</td></tr>')


@dataclass
class FieldView:
    """One control of the engine's form."""

    name: str
    kind: str
    label: str      # the URL key
    flag: str       # the engine's own name for it (its flag, config key or env var)
    help: str
    value: str      # what the URL holds ("" when absent)
    placeholder: str
    choices: tuple[str, ...]
    blank_choice: bool   # a select that may be left unset (states nothing)
    inactive: bool
    error: str | None
    lo: float | None
    hi: float | None
    max_len: int
    sets_mode: str | None
    modes: tuple[str, ...] = ()


@dataclass
class PlanView:
    plan: Plan
    ev: Evaluation
    field_errors: dict[str, str]
    raw: dict[str, str] = field(default_factory=dict)
    cells: list[LayerCell] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    launcher: dict[str, Any] | None = None
    #: the page-only keys of the URL (the pinned compare plan ``a``)
    page_keys: dict[str, str] = field(default_factory=dict)
    #: what a one-shot action (Balance, Nearest valid) found, when it was not applied
    action_note: dict[str, Any] | None = None

    @property
    def cfg(self) -> ModelConfig:
        return self.ev.cfg

    @property
    def engine(self) -> Engine:
        return self.ev.engine

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

    # ------------------------------------------------------------------ the URL and the form
    @cached_property
    def _query_pairs(self) -> list[tuple[str, str]]:
        return self.plan.query_pairs()

    @cached_property
    def plan_query(self) -> str:
        """The plan's canonical query (:meth:`Plan.query`), built once per view: the page reads it
        for the share URL, the pin button and the receipt link."""
        return encode_query(self._query_pairs)

    @cached_property
    def query_values(self) -> dict[str, str]:
        """URL key -> value of every setting the plan's canonical query holds (what ``parse_qsl``
        reads from :attr:`plan_query`), with the text the URL carried for a value that could not
        be used (so the share URL keeps it)."""
        out = dict(self._query_pairs)
        out.update(self.raw)
        return out

    @property
    def share_query(self) -> str:
        """The URL query that reproduces this screen: the plan, bad values as given, page keys."""
        items = list(self.query_values.items())
        items += [(k, v) for k, v in self.page_keys.items() if v]
        return encode_query(items)

    @cached_property
    def values(self) -> dict[str, str]:
        """Every plan field's value as the form shows it, by URL key ("" when the URL does not hold it)."""
        held = self.query_values
        return {spec.url: held.get(spec.url, "") for spec in TABLE.values()}

    @property
    def hidden_values(self) -> dict[str, str]:
        """What the URL holds for fields the engine's form does not show: they ride along as
        hidden inputs, so switching engines loses nothing and the URL keeps meaning the same."""
        shown = set(self.engine.fields) | {"mode", "conv"}
        return {k: v for k, v in self.query_values.items() if k in TABLE and k not in shown}

    @property
    def inactive(self) -> set[str]:
        """URL keys of the fields the plan's layout mode does not use (shown greyed, explained)."""
        return {spec.url for spec in TABLE.values() if not applies(spec, self.plan.mode)}

    def flag_of(self, name: str) -> str:
        """The engine's own name for a plan field (its flag, config key or environment variable)."""
        own = next((f for f, n in self.engine.flags.items() if n == name), None)
        return own or TABLE[name].cli or name

    @property
    def form(self) -> list[dict[str, Any]]:
        """The engine's form: its fields (exactly :attr:`Engine.fields`, less the model picker's),
        grouped as the plan table groups them, each under the engine's own flag name."""
        inactive = self.inactive
        out = []
        for group, legend, names in self._form_groups():
            fields_ = [self._field(n, self.shown_value(n), n in inactive) for n in names]
            field_, hint = GROUP_HINTS.get(group, (None, ""))
            out.append({"group": group, "legend": legend, "hint": hint if field_ in names else "", "fields": fields_})
        return out

    def _form_groups(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        return form_groups(frozenset(self.engine.fields))

    def shown_value(self, name: str) -> str:
        """What field ``name`` shows: the URL's text, or - a choice outside the parallel groups,
        which the URL leaves unset - the plan's own value (a select always shows an option; blank
        in a parallel group states nothing, so the plan's parallelism stays as the URL says, and
        blank in an optional one is its default in words, :attr:`Field.default_text`)."""
        value, spec = self.values[name], TABLE[name]
        if spec.kind == "choice" and not value and spec.group not in PARALLEL_GROUPS and not spec.optional:
            value = str(getattr(self.plan, name))
        return value

    def form_sends(self) -> dict[str, str]:
        """What the settings form drawn for this view sends, blanks dropped as the page drops them
        (``static/app.js``, ``htmx:configRequest``): each field as ``_fields.html`` draws it
        (:meth:`shown_value`; a checkbox ``1`` only when checked) and the hidden inputs of the
        fields the engine's form does not show."""
        out: dict[str, str] = {}
        for _, _, names in self._form_groups():
            for n in names:
                value = self.shown_value(n)
                if TABLE[n].kind == "bool" and value != "1":
                    value = ""
                if value != "":
                    out[n] = value
        out.update((k, val) for k, val in self.hidden_values.items() if val != "")
        return out

    def _field(self, name: str, value: str, inactive: bool) -> FieldView:
        spec = TABLE[name]
        neutral = NEUTRAL_VALUES[name]
        # blank states nothing: the plan's parallelism stays as the URL says, an optional field keeps its default
        unset = spec.group in PARALLEL_GROUPS or spec.optional
        placeholder = "" if neutral is None or spec.kind == "bool" else format_value(spec, neutral)
        return FieldView(name, spec.kind, name, self.flag_of(name), spec.help, value,
                         placeholder or spec.default_text or "unset", spec.choices, unset, inactive, self.field_errors.get(name),
                         spec.lo, spec.hi, spec.max_len, spec.modes[0] if len(spec.modes) == 1 else None, spec.modes)

    # ------------------------------------------------------------------ panels
    @cached_property
    def checks(self) -> list[dict[str, Any]]:
        """The parallel checks as the page lists them (read six times a render: built once)."""
        return [c.to_dict() for c in self.ev.checks]

    @property
    def checks_counts(self) -> tuple[int, int, int]:
        """(failing errors, warnings, all): the parallelism checks' summary line."""
        failing = sum(1 for c in self.checks if not c["ok"] and c["level"] == "error")
        return failing, sum(1 for c in self.checks if c["warning"]), len(self.checks)

    @property
    def checks_html(self) -> Markup:
        """Every parallelism check as the summary lists it, built here in one pass (a template loop
        escaped its name and message and built its word table per check): ``warning`` where its
        caveat applies, else ``pass`` or ``FAIL``, then its name and message."""
        out = []
        for c in self.checks:
            kind = "warn" if c["warning"] else ("pass" if c["ok"] else "fail")
            out.append(f'<li class="{kind}">{CHECK_WORDS[kind]} · {escape(c["name"])}: {escape(c["message"])}</li>')
        return Markup("".join(out))

    @cached_property
    def starts(self) -> list[int]:
        if not self.check:
            return []
        return [s.first_layer for s in self.check.plan.stages if s.first_layer is not None]

    @property
    def blocking_starts(self) -> bool:
        """Whether a stage starting on a shared layer blocks in this engine (build)."""
        return bool(self.check is None or self.check.share.blocking)

    @property
    def stage_rows_html(self) -> Markup:
        """The stage table's rows (:func:`_rows`), built here in one pass as :attr:`map_html` is (a
        template loop escaped each of their ~15 values a row): stage, PP / VP rank, layers, count,
        start (bold where it blocks), top-k source and its stage, full layers, parameters, memory,
        forward TFLOPs and forward + backward seconds per micro-batch, what the stage holds."""
        return Markup("".join(_stage_row_html(r) for r in self.rows))

    @property
    def map_html(self) -> Markup:
        """The layer map's cells and boundaries, built here in one pass (a template loop over 78+
        cells cost more than the rest of the fragment): each cell by :func:`_cell_html` (kept by
        what it shows, its text escaped). A cell is a focusable image named by its ``title`` (its
        role, stage and top-k source); a boundary is a
        slider over the layers its stage may start at, or a fixed mark where the engine's settings
        place the stages."""
        starts, n, movable = self.starts, self.cfg.num_hidden_layers, self.movable
        vpp = self.check.plan.vpp if self.check is not None else 1
        out = []
        for i, c in enumerate(self.cells):
            if c.start and c.layer > 1 and not c.mtp:
                bad = " invalid" if c.invalid else ""
                if not movable:
                    out.append(f'<div class="boundary fixed{bad}" aria-hidden="true" data-stage="{c.stage}"></div>')
                else:
                    k = (c.stage or 1) - 1
                    lo = starts[k - 1] + 1 if k >= 1 else 2
                    hi = starts[k + 1] - 1 if k + 1 < len(starts) else n
                    out.append(f'<div id="bnd-{c.stage}" class="boundary{bad}" role="slider" tabindex="0" aria-label="start of '
                               f'stage {c.stage}" aria-valuemin="{lo}" aria-valuemax="{hi}" aria-valuenow="{c.layer}" '
                               f'aria-valuetext="stage {c.stage} starts at layer {c.layer} ({c.role}{", invalid" if c.invalid else ""})" '
                               f'data-stage="{c.stage}"></div>')
            out.append(_cell_html(c, i == 0, vpp > 1))
        return Markup("\n".join(out))

    @cached_property
    def movable(self) -> bool:
        """Whether a boundary can be dragged: the engine takes stage sizes (its ``split`` field) and
        every stage holds a layer (a boundary is stage k's first layer, the page's ``starts[k]``; an
        empty stage has none, so its boundaries are drawn fixed)."""
        if "split" not in self.engine.fields:
            return False
        return self.check is None or all(s.num_layers for s in self.check.plan.stages)

    @property
    def rank_groups(self) -> list[str]:
        """With VPP > 1: which virtual stages each pipeline rank holds (the map's bands by rank)."""
        if not self.check or self.check.plan.vpp <= 1:
            return []
        by_rank: dict[int, list[str]] = {}
        for s in self.check.plan.stages:
            span = f"{s.first_layer}–{s.last_layer}" if s.num_layers else "no layers"
            by_rank.setdefault(s.pp_rank, []).append(f"stage {s.index + 1} (vp {s.vp_stage}: {span})")
        return [f"pp rank {r}: " + ", ".join(v) for r, v in sorted(by_rank.items())]

    @property
    def gpu_line(self) -> str:
        if self.ev.not_judged:
            return "GPU count not judged: the plan states no parallelism"
        return (gpu_equation(self.ev) or self.ev.engine.gpu_line(self.plan, self.ev.check)
                or "GPU count unavailable: fix the layout and parallel settings")

    @property
    def expert_line(self) -> str:
        p = self.ev.par
        if p is None:
            return ""
        return (f"expert grid ETP {p.expert_tp} × EP {p.ep} × PP {p.pp} = {p.expert_grid_size}; "
                f"EDP (expert data parallel, GPUs / expert grid) {p.edp}")

    @property
    def fit_line(self) -> str:
        mem = self.ev.memory
        if mem and mem["stages"]:
            worst = max(mem["stages"], key=lambda s: s["total_bytes"])
            return (f"largest rank: pp rank {worst['pp_rank']} needs {worst['total_bytes'] / 1e9:.1f} GB of "
                    f"{worst['capacity_bytes'] / 1e9:.0f} GB ({mem['gpu']['label']}): "
                    + ("every rank fits" if mem["fits"] else "does NOT fit"))
        sm = self.ev.serving_memory
        if sm and sm.get("ranks"):
            worst = max(sm["ranks"], key=lambda r: r["total_bytes"])
            fits = all(r["fits"] for r in sm["ranks"])
            s = sm["settings"]
            return (f"largest rank: pp rank {worst['pp_rank']} needs {worst['total_bytes'] / 2**30:.1f} GiB of "
                    f"{worst['usable_bytes'] / 2**30:.1f} GiB usable ({serving_terms_held(sm['ranks'])}; context "
                    f"{s['context']:,} × {s['concurrency']} sequence{'s' * (s['concurrency'] > 1)}): "
                    + ("every rank fits" if fits else "does NOT fit"))
        return ""

    @cached_property
    def memory_terms(self) -> dict[str, Any]:
        """Every memory term of the largest rank: its label, GB per GPU (``"12.34"``) and how it is
        counted (label and explanation are constants: escaped once, :func:`_term_text`)."""
        mem = self.ev.memory
        if not mem or not mem["stages"]:
            return {"rank": None, "terms": []}
        worst = max(mem["stages"], key=lambda s: s["total_bytes"])
        text = _term_text()
        return {"rank": worst["pp_rank"], "terms": [
            {"label": text[k][0], "gb": f"{b / 1e9:.2f}", "how": text[k][1]}
            for k, b in worst["breakdown_detail"].items() if k in text]}

    @property
    def time(self) -> dict[str, Any] | None:
        """How fast the plan trains (:attr:`Evaluation.time`): ``None`` when not judged."""
        return self.ev.time

    @property
    def export_items(self) -> list[tuple[str, str, str]]:
        """``(name, label, text)`` of every export, in the engine's order, the CLI line last."""
        return [(k, EXPORT_LABELS.get(k, k.replace("_", " ")), v) for k, v in self.exports.items() if v]

    @property
    def config_download(self) -> str | None:
        """The file name the CLI line reads an uploaded config from (offered for download)."""
        return config_file_name(self.cfg.id) if self.cfg.id not in preset_ids() else None

    def page_json(self) -> dict[str, Any]:
        """``GET /api/v1/plan``: the plan, its verdict and every panel."""
        ev = self.ev
        return {
            "plan": self.plan.to_dict(), "query": self.plan_query, "verdict": ev.verdict.to_dict(),
            "check": ev.check.to_json() if ev.check else None,
            "conversion": ev.conversion.to_json() if ev.conversion else None,
            "parallel": parallel_summary(ev), "memory": ev.memory, "stage_flops": ev.stage_flops,
            "serving_memory": ev.serving_memory, "time": ev.time, "not_judged": ev.not_judged,
            "judged": list(ev.verdict.judged), "exports": self.exports,
        }


@lru_cache(maxsize=16)
def form_groups(fields: frozenset[str]) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """An engine's form: the plan table's groups, in order, with the names of the engine's
    ``fields`` in each (less the model and engine pickers); groups without one are left out."""
    out = []
    for group, legend in GROUPS:
        names = tuple(n for n, s in TABLE.items() if s.group == group and n in fields and n not in PICKED)
        if names:
            out.append((group, legend, names))
    return tuple(out)


def config_file_name(model_id: str) -> str:
    """``sha256:<hex>`` -> the file name the page offers the uploaded config under."""
    return f"config-{model_id.removeprefix('sha256:')[:12]}.json"


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


def build_view(plan: Plan, problems: list[FieldProblem], store: BaseStore, *, raw: dict[str, str] | None = None,
               launcher: dict[str, Any] | None = None, evaluation: Evaluation | None = None) -> PlanView:
    """Evaluate ``plan`` for the page. Fields with problems keep their defaults (already in
    ``plan``) and carry a message; ``raw`` is the text the URL gave for them (kept in the share
    URL). ``launcher``: an import's report (warnings, each value's file:line); ``evaluation``: one
    already made for this plan (a launcher import evaluates with what the script said)."""
    errors: dict[str, str] = {}
    for p in problems:  # the first problem of a field is the one to fix first
        errors.setdefault(p.field, p.message)
    cfg, model_err = resolve_model(plan.model, store)
    if model_err:
        errors["model"] = f"{errors['model']}; {model_err}" if "model" in errors else model_err
        plan = replace(plan, model=cfg.id)
    ev = evaluation if evaluation is not None else evaluate(plan, cfg)
    for p in ev.problems:
        errors.setdefault(p.field, p.message)
    kept = {k: v for k, v in (raw or {}).items() if k in errors and k in TABLE and k != "model"}
    view = PlanView(plan, ev, errors, kept)
    if launcher is None and ev.check is not None:
        launcher = (getattr(ev.check, "extra", None) or {}).get("launcher")
    view.launcher = launcher
    roles = ev.check.roles if ev.check is not None else _roles(ev, cfg, plan)
    view.cells = _cells(ev.check, roles)
    if ev.check is not None:
        view.rows = _rows(ev)
    view.exports = exports(view)
    note = mode_note(plan)
    if note:
        view.messages.append(note)
    bubble = bubble_note(ev)
    if bubble:
        view.messages.append(bubble)
    return view


def _timed(ev: Evaluation) -> dict[str, Any] | None:
    """The plan's step time, when the evaluation has one."""
    return ev.time if ev.time and "unavailable" not in ev.time else None


def _closed_form(ev: Evaluation) -> tuple[float, int]:
    """The closed-form bubble of the plan's PP, VPP and micro-batches (8 x PP when the plan gives no
    global batch) and that micro-batch count: what the page says when there is no step time."""
    assert ev.par is not None and ev.stage_plan is not None
    m = ev.par.microbatches or 8 * ev.stage_plan.pp
    return closed_form_bubble(ev.stage_plan.pp, ev.stage_plan.vpp, m), m


def bubble_note(ev: Evaluation) -> str | None:
    """The page's line on the pipeline bubble (PP > 1 with parallel settings): the simulated one,
    split into what the pipeline's fill and drain explain (``time.bubble_fill_drain``) and the
    ranks' waiting on slower stages, sends and parameter gathers; without a step time, the closed
    form for the plan's PP, VPP and micro-batches, said to be one."""
    if ev.par is None or ev.stage_plan is None or ev.stage_plan.pp < 2:
        return None
    assumed = "" if ev.par.microbatches else ", assumed 8 × PP"
    t = _timed(ev)
    if t is None:
        bubble, m = _closed_form(ev)
        return f"pipeline bubble (closed form: equal stages, free sends) {bubble:.1%} with {m} micro-batches{assumed}"
    text = (f"pipeline bubble {t['bubble_fraction']:.1%} of the ranks' time (simulated): {t['bubble_fill_drain']:.1%} "
            f"is its fill and drain ((PP − 1)/(VPP·m + PP − 1), m = {t['num_microbatches']} micro-batches{assumed})")
    waiting = bubble_waiting(t)
    if waiting:
        text += f", {waiting:.1%} waiting on slower stages, sends and parameter gathers (Balance evens the stages)"
    return text


@lru_cache(maxsize=1)
def _term_text() -> dict[str, tuple[Markup, Markup]]:
    """Each memory term's label and explanation, HTML-escaped once (the page lists them on every render)."""
    from app.core.model.memory import TERM_EXPLANATIONS, TERM_LABELS

    return {k: (Markup.escape(label), Markup.escape(TERM_EXPLANATIONS[k]))
            for k, label in TERM_LABELS.items()}


def page_data(plan: Plan, cfg: ModelConfig) -> dict[str, Any]:
    """``GET /api/v1/plan``: :meth:`PlanView.page_json` of ``plan`` on ``cfg`` (a known model),
    the same evaluation as :func:`build_view` without the display-only parts that JSON does not
    carry (layer cells, stage rows, messages). Module-level, so the worker pool can run it."""
    view = PlanView(plan, evaluate(plan, cfg), {})
    view.exports = exports(view)
    return view.page_json()


def _roles(ev: Evaluation, cfg: ModelConfig, plan: Plan) -> RoleMap | None:
    """The engine's roles without a layout (the map stays while a layout field is mid-typing)."""
    try:
        return ev.engine.check_roles(cfg, plan)
    except (ValueError, NotImplementedError):
        return None


def _cells(check: LayoutCheck | None, roles: RoleMap | None) -> list[LayerCell]:
    if roles is None:
        return []
    stage_of: dict[int, Any] = {}
    starts: set[int] = set()
    stages = check.plan.stages if check is not None else ()
    for st in stages:
        for n in st.layers:
            stage_of[n] = st
        if st.first_layer is not None:
            starts.add(st.first_layer)
    bad = {v.layer for v in check.blocking_violations} if check is not None else set()
    cells = []
    for r in roles.layers:
        s = stage_of.get(r.layer)
        cells.append(LayerCell(r.layer, r.role, "F" if r.role == "full" else "S", r.ffn, r.source,
                               s.index + 1 if s else None, r.layer in starts, r.layer in bad,
                               pp_rank=s.pp_rank if s else None, vp_stage=s.vp_stage if s else None, mixer=r.mixer))
    if check is not None:
        mtp_stage = next((s for s in stages if s.mtp_layers), None)
        for r in roles.mtp[: check.plan.mtp_layers]:
            cells.append(LayerCell(r.layer, "full", "M", r.ffn, r.layer, mtp_stage.index + 1 if mtp_stage else None,
                                   False, False, mtp=True, pp_rank=mtp_stage.pp_rank if mtp_stage else None,
                                   vp_stage=mtp_stage.vp_stage if mtp_stage else None))
    return cells


def _rows(ev: Evaluation) -> list[dict[str, Any]]:
    check, par, cfg = ev.check, ev.par, ev.cfg
    assert check is not None
    sized = not check.plan.errors  # a plan with errors may reach past the last layer
    rank_mem = {s["pp_rank"]: s for s in ev.memory["stages"]} if ev.memory else {}
    serve_mem = {r["pp_rank"]: r for r in ev.serving_memory["ranks"]} if ev.serving_memory else {}
    stage_fl = {s["index"]: s["flops"] for s in ev.stage_flops["stages"]} if ev.stage_flops else {}
    stage_time = {s["index"]: s for s in (ev.time or {}).get("per_stage", [])}
    shared = {v.stage.index for v in check.boundary.violations}
    share = check.share
    full = set(check.roles.full_layers)   # decoder layers only: an MTP layer's number is past the last
    rows = []
    for rec in check.boundary.records:
        s = rec.stage
        rm, sm, st = rank_mem.get(s.pp_rank), serve_mem.get(s.pp_rank), stage_time.get(s.index)
        # parameters per GPU: a serving rank's share as its memory counts it (the engine's TP / EP),
        # else the training sharding (TP 1 when no parallelism is stated); none where the engine's
        # sharding is not modelled (MaxText's mesh)
        if sm:
            params = sm["params_per_gpu"]
        elif sized and ev.engine.judges_parallelism:
            params = stage_params(cfg, check.roles, [s], tp=par.tp if par else 1, ep=par.ep if par else 1,
                                  etp=par.expert_tp if par else None).per_gpu
        else:
            params = None
        start = rec.start_role or "—"
        if s.index in shared:   # what this engine build does there: crash, silently wrong, or hand-off
            start = f"shared ({'invalid: ' if share.blocking else ''}{share.code.replace('_', ' ')})"
        rows.append({
            "stage": s.index + 1, "pp_rank": s.pp_rank, "vp_stage": s.vp_stage,
            "range": f"{s.first_layer}–{s.last_layer}" if s.num_layers else "—",
            "num_layers": s.num_layers, "start": start, "source": rec.source_layer,
            "source_stage": rec.source_stage.index + 1 if rec.source_stage else None,
            "full_layers": [n for n in s.layers if n in full],
            "params_per_gpu": params,
            "memory": (f"{rm['total_bytes'] / 1e9:.1f} GB " + ("fits" if rm["fits"] else "OVERFLOWS")) if rm else
                      (f"{sm['total_bytes'] / 2**30:.1f} GiB " + ("fits" if sm["fits"] else "OVERFLOWS")) if sm else "—",
            "flops": stage_fl.get(s.index),
            "seconds": (st["forward_seconds"] + st["backward_seconds"]) if st else None,
            "extras": ", ".join(x for x in ("embedding" if s.embedding else "",
                                            f"MTP ×{s.mtp_layers}" if s.mtp_layers else "",
                                            "loss" if s.loss else "") if x),
            "invalid": s.index in shared and share.blocking,
        })
    return rows


def exports(view: PlanView) -> dict[str, str]:
    """What the page offers to copy, every value shell-quoted: the engine's exports (Megatron
    arguments, slime ``PERF_ARGS``, layout strings, or the serving env line and command) and the
    ``isplan check`` line of the whole plan (an uploaded config is read from its downloaded file)."""
    out = dict(view.ev.exports())
    out["cli"] = cli_line(view.plan, view.engine, view.config_download)
    return out


def cli_line(plan: Plan, engine: Engine, model: str | None = None) -> str:
    """``isplan check`` for the plan; a layout at its neutral value (a single stage) is spelled out,
    since the CLI asks for one (``--pp 1``, or the engine's own layout field)."""
    args = plan.cli_args(model=model)
    field_ = engine.layout_field(plan)
    flag = TABLE[field_].cli
    value = getattr(plan, field_)
    if flag and value is not None and not any(a.split("=")[0] == TABLE[n].cli for a in args for n in LAYOUT_GIVEN):
        args += [flag, format_value(TABLE[field_], value)]
    return shlex.join(["isplan", "check", *args])


#: the fields any of which gives ``isplan check`` its layout
LAYOUT_GIVEN = ("split", "pp", "layout", "ici_pipeline_parallelism", "dcn_pipeline_parallelism",
                "layers_per_pipeline_stage")


# ----------------------------------------------------------------------------- compare (display only)
def plan_summary(view: PlanView) -> dict[str, Any]:
    """The numbers the compare panel puts side by side, all read from the plan's one evaluation:
    the verdict, the largest rank's memory, the compute balance (slowest stage's forward FLOPs
    over the mean: 1.00 is perfectly even), the pipeline bubble, the step time and the GPU count."""
    ev = view.ev
    # per pipeline rank: training memory against the GPU's capacity, or serving memory against its
    # usable share (both in GB here, 1e9 bytes)
    if ev.serving_memory and ev.serving_memory["ranks"]:
        ranks, capacity_key, usable = ev.serving_memory["ranks"], "usable_bytes", True
    else:
        ranks, capacity_key, usable = (ev.memory or {}).get("stages", []), "capacity_bytes", False
    worst = max(ranks, key=lambda s: s["total_bytes"]) if ranks else None
    pp_flops: dict[int, float] = {}
    for s in (ev.stage_flops or {}).get("stages", []):
        pp_flops[s["pp_rank"]] = pp_flops.get(s["pp_rank"], 0) + s["flops"]
    total = sum(pp_flops.values())
    balance = max(pp_flops.values()) / (total / len(pp_flops)) if pp_flops and total else None
    t = _timed(ev)
    bubble, bubble_how = (t["bubble_fraction"], "simulated") if t else (None, None)
    if t is None and ev.par is not None and ev.stage_plan is not None:
        bubble, bubble_how = _closed_form(ev)[0], "closed form"
    return {
        "go": view.go, "blocking": [r.kind for r in view.verdict.blocking] + (["input"] if view.field_errors else []),
        "layout": view.check.layout_text if view.check else None,
        "max_rank_gb": worst["total_bytes"] / 1e9 if worst else None,
        "max_rank": worst["pp_rank"] if worst else None,
        "capacity_gb": worst[capacity_key] / 1e9 if worst and worst[capacity_key] is not None else None,
        "capacity_usable": usable,
        "rank_gb": [s["total_bytes"] / 1e9 for s in ranks],
        "balance": balance, "bubble": bubble, "bubble_how": bubble_how, "gpu_line": view.gpu_line,
        "step_seconds": t["step_seconds"] if t else None,
        "tokens_per_second_per_gpu": t["tokens_per_second_per_gpu"] if t else None,
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
