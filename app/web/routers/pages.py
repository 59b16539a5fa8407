"""The page: ``/`` (the whole dashboard for a plan URL), ``/fragment`` (what htmx swaps in after
every change), ``/profile`` (a plan that runs for a model, engine and GPU), ``/fragment/search``
(the GPU budget search), ``/fragment/schedule`` (the simulated pipeline schedule, loaded when it
scrolls into view), ``/about``, and the receipt download.

htmx drives every request (``static/vendor/htmx-*.min.js``; docs/DESIGN.md "The page on htmx"):
the settings form carries ``hx-get="/fragment"`` with ``hx-sync="this:queue last"`` (one request
in flight, the latest state next: a queued request collects the form's values when it leaves),
and the answer is morphed into the page (idiomorph), its summary and the form out of band
(``hx-swap-oob``). The answer carries the URL that reproduces the screen: ``HX-Push-Url`` for a
discrete change (an action, a new drag or key burst: the page asks with ``X-Isplan-History:
push``), ``HX-Replace-Url`` otherwise. A pinned plan A for the compare panel rides along as
``a=<A's plan query>``: a page key, never part of the plan, but part of the URL.

Bounded like the API (issue 20, findings 1 and 2): every page is one :class:`PageJob` rendered by
:func:`page_html` - in the request thread pool for a plan of an ordinary model (a few ms: the
event loop keeps answering ``/healthz`` meanwhile), in the worker pool for a huge one
(:func:`app.web.deps.in_process_or_pool`: gated per client, with the deadline; the HTML is
compressed there too). Balance / Nearest valid, ``/profile`` and the GPU budget search run in the
worker pool within the work budget, exactly as their API twins do; a refusal is a message on the
page.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, NamedTuple, cast
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template, select_autoescape
from markupsafe import Markup, escape
from pydantic_core import PydanticSerializationError, to_json
from starlette.concurrency import run_in_threadpool

from app import __version__
from app import settings as app_settings
from app.core import reports
from app.core.engines import DEFAULT_PLAN, ENGINES, engine_for, ignored_fields
from app.core.evaluate import evaluate
from app.core.layout.stages import PlanError as Finding  # a blocking finding (a launcher's)
from app.core.model.config import ConfigError, ModelConfig, load_manifest, load_preset, preset_ids
from app.core.optimise.actions import ACTIONS, apply_action
from app.core.plan import (
    BY_URL,
    GPUS,
    NEUTRAL_VALUES,
    TABLE,
    FieldProblem,
    Plan,
    PlanError,
    plan_from_query,
    unknown_keys,
)
from app.core.plan import ignored_fields as plan_ignored
from app.web.assets import asset_dir
from app.web.compression import gzip_bytes
from app.web.deps import (
    INLINE_UNITS,
    Store,
    action_cost,
    bounded,
    get_store,
    in_process_or_pool,
    model_for,
    plan_units,
    report_body,
    search_cost,
)
from app.web.figures import page_figures
from app.web.security import other_requests_waiting
from app.web.store import BaseStore
from app.web.view import PlanView, build_view, resolve_model
from app.web.workers import TooBusy, TooMuchWork, WorkerLost, WorkTimeout

router = APIRouter(include_in_schema=False)

#: page-only URL keys: a one-shot action, the pinned compare plan A
PAGE_KEYS = ("action", "a")
#: keys one route reads besides the plan: the search's GPU budget
ROUTE_KEYS = {"/fragment/search": ("budget",)}


def page_plan(request: Request, *, route_keys: tuple[str, ...] = ()) -> tuple[Plan, list[FieldProblem], dict[str, str]]:
    """The page's plan: lenient (a bad value keeps its default and gets a field message; its text
    is kept for the share URL), every unknown key said; an empty query is the pinned slime
    GLM-5.2 profile. Returns ``(plan, problems, raw text of the fields with problems)``."""
    params = {k: v for k, v in request.query_params.items() if k not in PAGE_KEYS and k not in route_keys}
    plan, problems = plan_from_query(params, empty=DEFAULT_PLAN, ignored=ignored_fields)
    problems += unknown_keys(params)
    bad = {p.field for p in problems}
    raw = {}
    for key, value in params.items():
        name = BY_URL.get(key)
        if name in bad and (key == name or name not in raw):
            raw[name] = value[:TABLE[name].max_len]
    return plan, problems, raw


def _a_plan(a_query: str | None) -> tuple[Plan, list[FieldProblem]] | None:
    """The pinned plan A (``a=<A's plan query>``), read like any page URL."""
    if not a_query:
        return None
    return plan_from_query(dict(parse_qsl(a_query[:8000])), empty=DEFAULT_PLAN, ignored=ignored_fields)


# --------------------------------------------------------------------------- rendering


#: the attributes a ``dict`` has (its methods): ``d.items`` in a template is the method, as in Jinja
_DICT_ATTRS = frozenset(dir(dict))


try:  # markupsafe >= 3.0: the escaping routine ``escape`` wraps (C, or its pure-Python twin)
    from markupsafe import _escape_inner
except ImportError:  # pragma: no cover - an older or newer markupsafe: the public function, its text
    def _escape_inner(s: str, /) -> str:
        return str(escape(s))


def output_escape(value: Any) -> str:
    """markupsafe's :func:`~markupsafe.escape` for what a template writes out: the same text (a
    plain string escaped by markupsafe's own C routine, an ``__html__`` object as it says, anything
    else as its ``str`` escaped; ``markupsafe/__init__.py`` ``escape``, 3.0), returned as a ``str``
    (an ``__html__`` object's text as that gives it) instead of a new :class:`~markupsafe.Markup`. Jinja's compiled templates call ``escape`` only
    on what they output (``jinja2/compiler.py`` ``CodeGenerator._output_child_pre``, 3.1), and
    join the pieces into one string (``Environment.concat``; a captured ``{% set %}`` block or a
    macro wraps the joined text in ``Markup`` itself), so the type is never read. Building ~230
    ``Markup`` objects in Python was ~15 % of a fragment's render."""
    if type(value) is str:
        return _escape_inner(value)
    if hasattr(value, "__html__"):
        return cast(str, value.__html__())   # already HTML (a Markup: the layer map, the stage rows)
    return _escape_inner(str(value))


class PageTemplate(Template):
    """A template whose output escaping is :func:`output_escape` (set in the namespace its compiled
    code runs in: its render functions read ``escape`` from there)."""

    @classmethod
    def _from_namespace(cls, environment: Environment, namespace: MutableMapping[str, Any],
                        globals: MutableMapping[str, Any]) -> Template:
        namespace["escape"] = output_escape
        return super()._from_namespace(environment, namespace, globals)


class PageEnvironment(Environment):
    """Jinja's environment with a cheaper ``x.key`` on a plain ``dict``: the page reads most of
    its numbers from the JSON-ready dicts of the evaluation (``mem.host_memory``, a row's
    ``r.memory``), and Jinja's :meth:`~jinja2.Environment.getattr` first tries the attribute,
    raising and catching an ``AttributeError`` for every such read (~500 per fragment). The answer
    is the same: a dict has no attributes but its methods, so a name that is not one of them is
    looked up as a key first, exactly what Jinja does after the failed attribute. Anything else
    takes Jinja's own rule (``jinja2/environment.py`` ``Environment.getattr``, 3.1), written out
    here: the template calls this for every ``x.name``. Its templates are :class:`PageTemplate`."""

    template_class = PageTemplate

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        try:
            return getattr(obj, attribute)
        except AttributeError:
            pass
        try:
            return obj[attribute]
        except (TypeError, LookupError, AttributeError):
            return self.undefined(obj=obj, name=attribute)


def figure_json(obj: Any, **_: Any) -> str:
    """Jinja's ``tojson`` for the page: the figures' data (every figure is a few KB of plain
    lists and dicts, ~10 % of a fragment's render in :mod:`json` with sorted keys) in
    pydantic-core's encoder, a NaN or infinity written as ``null`` (which ``JSON.parse`` reads;
    :mod:`json`'s ``NaN`` it does not), keys in the dicts' own order. Jinja still makes the text
    HTML-safe (``jinja2.utils.htmlsafe_json_dumps``). A value pydantic-core cannot encode (a lone
    surrogate) takes :mod:`json`."""
    try:
        return to_json(obj, inf_nan_mode="null").decode("utf-8")
    except PydanticSerializationError:
        return json.dumps(obj)


#: What ``tojson`` makes HTML-safe (``jinja2.utils.htmlsafe_json_dumps``, 3.1) and then ``forceescape``
#: escapes (of those left, only ``"``, as markupsafe's ``&#34;``), in the order they apply.
_ATTRIBUTE_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027"), ('"', "&#34;"))


def figure_attribute(obj: Any) -> Markup:
    """``obj|tojson|forceescape`` in one step, the same text: a figure's JSON (:func:`figure_json`)
    as the value of a double-quoted HTML attribute (``data-figure``). The two filters built three
    strings of each figure's few KB and scanned it twice, ~5 % of a fragment's render."""
    text = figure_json(obj)
    for char, escaped in _ATTRIBUTE_ESCAPES:
        text = text.replace(char, escaped)
    return Markup(text)


@lru_cache(maxsize=1)
def templates() -> Jinja2Templates:
    """The page's templates (one environment per process: the server's and each worker's), with
    Starlette's own settings (autoescape by file name), :class:`PageEnvironment`'s reads,
    :func:`figure_json` as ``tojson``'s encoder, the ``figure_attribute`` filter
    (:func:`figure_attribute`), and no per-render check that a template file
    changed (Jinja's ``auto_reload``: a ``stat`` of every included template on every render)."""
    env = PageEnvironment(loader=FileSystemLoader(str(asset_dir("templates"))), autoescape=select_autoescape(),
                          auto_reload=False)  # templates ship with the code: no stat() of each one per render
    env.undefined = StrictUndefined  # a template naming a missing attribute fails loudly in tests
    env.policies["json.dumps_function"] = figure_json
    env.policies["json.dumps_kwargs"] = {}
    env.filters["figure_attribute"] = figure_attribute
    return Jinja2Templates(env=env)


@lru_cache(maxsize=1)
def vendor() -> dict[str, Any]:
    """``static/vendor/VENDOR.json``: each vendored file with its version and SHA-256."""
    data: dict[str, Any] = json.loads((asset_dir("static") / "vendor" / "VENDOR.json").read_text())
    return data


def assets() -> dict[str, Any]:
    """What every page links: versioned assets (long-lived caching) and the engines to choose from."""
    from app.web.caching import ASSET_VERSION, PLOTLY_FILE

    v = vendor()
    return {"asset_v": ASSET_VERSION, "plotly_file": PLOTLY_FILE, "htmx_file": v["htmx"]["file"],
            "morph_file": v["idiomorph"]["file"], "engines": [
                {"name": n, "label": e.label, "workflow": e.workflow, "source": e.source} for n, e in ENGINES.items()]}


def page_context(request: Request | None, v: PlanView, **extra: Any) -> dict[str, Any]:
    """Everything a page template reads, for the view ``v``; ``extra`` overrides."""
    return {"request": request, "v": v, "presets": load_manifest()[1], "preset_ids": preset_ids(),
            "upload_token_required": bool(app_settings.current().upload_token),
            "table": TABLE, "gpus": GPUS, "figures": page_figures(v), "oob": False, "compare": None,
            **assets(), **extra}


class _Configs:
    """The uploaded configs a page names, looked up by the server before the page is rendered
    (a worker process has no store): ``build_view`` reads them through ``get``."""

    def __init__(self, configs: tuple[ModelConfig, ...]):
        self._by_id = {c.id: c for c in configs}

    def get(self, model_id: str) -> ModelConfig | None:
        return self._by_id.get(model_id)


@dataclass(frozen=True)
class PageJob:
    """One page to render: picklable, so a worker process can render it.

    ``launcher``/``extra_errors``: a launcher import's report and the errors it found (they block
    like the engine's own); ``form_shown``/``sent``: the form the page says it drew
    (``X-Isplan-Form``) and the settings the request sent, to leave the form out of an answer that
    would not change it (:func:`form_unchanged`)."""

    template: str
    plan: Plan
    problems: tuple[FieldProblem, ...]
    configs: tuple[ModelConfig, ...]
    raw: tuple[tuple[str, str], ...] = ()
    a_query: str | None = None
    context: tuple[tuple[str, Any], ...] = ()
    launcher: dict[str, Any] | None = None
    extra_errors: tuple[Finding, ...] = ()
    action_note: dict[str, Any] | None = None
    form_shown: str | None = None
    sent: tuple[tuple[str, str], ...] | None = None
    gzip: bool = False


class RenderedPage(NamedTuple):
    body: bytes
    share_query: str  # the URL query that reproduces the screen


def _compare(a_query: str | None, b: PlanView, store: BaseStore) -> dict[str, Any]:
    """The compare panel when the URL pins a plan A: A and B side by side. A's problems are
    shown, never dropped."""
    from app.web.view import flag_diff, plan_summary  # the compare panel's display helpers

    pinned = _a_plan(a_query)
    if pinned is None:
        return {"compare": None}
    a = build_view(pinned[0], pinned[1], store)
    return {"compare": {"a": a, "sa": plan_summary(a), "sb": plan_summary(b), "diff": flag_diff(a.plan, b.plan),
                        "a_query": a.plan.query()}}


def page_html(job: PageJob) -> RenderedPage:
    """The page's HTML (gzip-compressed when ``job.gzip``) and its share query: the view of the
    plan (and of a pinned plan A), rendered. Runs in the server process or in a worker."""
    store = cast(BaseStore, _Configs(job.configs))
    ev = None
    if job.launcher is not None:  # evaluated with what the script said (its errors block)
        cfg, _ = resolve_model(job.plan.model, store)
        ev = evaluate(job.plan, cfg, extra_errors=job.extra_errors, extra={"launcher": job.launcher})
    v = build_view(job.plan, list(job.problems), store, raw=dict(job.raw), launcher=job.launcher, evaluation=ev)
    if job.a_query:
        v.page_keys["a"] = job.a_query[:8000]
    v.action_note = job.action_note
    extra = dict(job.context)
    if job.sent is not None:
        extra["same_form"] = form_unchanged(job.form_shown, dict(job.sent), v)
    ctx = page_context(None, v, **{**extra, **_compare(job.a_query, v, store)})
    data = templates().get_template(job.template).render(ctx).encode()
    return RenderedPage(gzip_bytes(data, 3) if job.gzip else data, v.share_query)


def form_unchanged(shown: str | None, sent: dict[str, str], v: PlanView) -> bool:
    """Whether the settings form the page shows is already the one this answer would draw, so it
    is not sent again: the page says it drew the form for this layout mode with no message
    (``X-Isplan-Form: <mode>:clean``), this answer has no field message, and the form as this
    answer draws it sends exactly what the request sent (:meth:`PlanView.form_sends`: no value
    was rewritten to its canonical form)."""
    if shown != f"{v.plan.mode}:clean" or v.field_errors:
        return False
    given = {k: val for k, val in sent.items() if k in TABLE and val != "" and k not in ("model", "engine")}
    return given == v.form_sends()


async def _uploaded(store: BaseStore, model_ids: list[str]) -> tuple[ModelConfig, ...]:
    out = []
    for mid in dict.fromkeys(model_ids):
        if mid in preset_ids() or not mid.startswith("sha256:"):
            continue
        try:
            cfg = await run_in_threadpool(store.get, mid)
        except ConfigError:
            cfg = None
        if cfg is not None:
            out.append(cfg)
    return tuple(out)


def _shown_config(model: str, configs: tuple[ModelConfig, ...]) -> ModelConfig:
    """The config the page shows for ``model`` (GLM-5.2 for an unknown one, as build_view does)."""
    if model in preset_ids():
        return load_preset(model)
    return next((c for c in configs if c.id == model), None) or load_preset("glm-5.2")


async def render_page(request: Request, template: str, plan: Plan, problems: list[FieldProblem], store: BaseStore,
                      *, status_code: int = 200, a_query: str | None = None, url_header: str | None = None,
                      **job: Any) -> Response:
    """The page ``template`` for ``plan`` (and a pinned plan A), rendered on the event loop when
    no other request waits in this process (no thread hop: ~0.5 ms of a live update), in a request
    thread when others do (so the loop keeps answering them and ``/healthz`` between renders), or
    - a plan of a huge model - in the worker pool (:func:`app.web.deps.in_process_or_pool`).
    ``url_header`` (``HX-Push-Url`` / ``HX-Replace-Url``) carries the screen's share URL; ``job``:
    the other :class:`PageJob` fields."""
    pinned = _a_plan(a_query)
    plans = [plan] + ([pinned[0]] if pinned else [])
    configs = await _uploaded(store, [p.model for p in plans])
    units = sum(plan_units(p, _shown_config(p.model, configs)) for p in plans)
    compressed = units > INLINE_UNITS and "gzip" in request.headers.get("accept-encoding", "").lower()
    page = PageJob(template, plan, tuple(problems), configs, a_query=a_query, gzip=compressed, **job)
    if units <= INLINE_UNITS:  # rendered on the loop when alone, else in a request thread (DESIGN.md)
        out = await run_in_threadpool(page_html, page) if other_requests_waiting() else page_html(page)
    else:
        out = await in_process_or_pool(request, units, page_html, page)
    headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if compressed else {}
    if url_header:
        headers[url_header] = "/?" + out.share_query
    return HTMLResponse(out.body, status_code=status_code, headers=headers)


# --------------------------------------------------------------------------- routes


@router.get("/", response_class=HTMLResponse)
async def index(request: Request, store: Store) -> Response:
    plan, problems, raw = page_plan(request)
    return await render_page(request, "index.html", plan, problems, store, a_query=request.query_params.get("a"),
                             raw=tuple(raw.items()))


def action_outcome(plan: Plan, cfg: ModelConfig, action: str) -> tuple[Plan, FieldProblem | None, dict[str, Any] | None]:
    """Balance / Nearest valid (in the worker pool): the plan it found when that plan's own
    evaluation is GO; otherwise the plan unchanged and a note offering the one found as a link."""
    found, problem = apply_action(plan, cfg, action)
    if problem is not None:
        return plan, problem, None
    candidate = evaluate(found, cfg)
    if not candidate.problems and candidate.verdict.go:
        return found, None, None
    note = {"action": action, "query": found.query(), "split": ",".join(map(str, found.split or ())),
            "headline": candidate.verdict.headline(), "reasons": [r.message for r in candidate.verdict.blocking][:3]}
    return plan, None, note


#: ``/fragment``'s own parameter, documented here: the route reads it from the query itself
FRAGMENT_OPENAPI: dict[str, Any] = {"parameters": [{
    "name": "action", "in": "query", "required": False, "schema": {"type": "string", "enum": sorted(ACTIONS)},
    "description": "Balance or Nearest valid: the page after the action (the plan it found when that plan is GO)"}]}


@router.get("/fragment", response_class=HTMLResponse, openapi_extra=FRAGMENT_OPENAPI)
async def fragment(request: Request) -> Response:
    """What htmx swaps in after every change of the plan form (``?action=`` runs Balance / Nearest
    valid first). No FastAPI parameters or dependencies: resolving them cost a tenth of the live
    update; the store and ``action`` are read here."""
    store = get_store(request)
    action = request.query_params.get("action")
    plan, problems, raw = page_plan(request)
    note, applied = None, False
    if action:
        problem: FieldProblem | None = None
        if action not in ACTIONS:
            problem = FieldProblem("split", f"unknown action {action[:40]!r}")
        else:
            cfg, _ = await run_in_threadpool(resolve_model, plan.model, store)
            try:  # in the worker pool, within the work budget (issue 9)
                found, problem, note = await bounded(request, action_cost(plan, cfg, action), action_outcome,
                                                     plan, cfg, action)
            except ValueError as exc:  # over the work budget, or a plan the action cannot rewrite
                problem = FieldProblem(getattr(exc, "field", None) or "split", f"{action}: {exc}")
            else:
                applied = problem is None and note is None
                if applied:
                    plan, problems, raw = found, [], {}
        if problem is not None:
            problems = [*problems, problem]
    push = applied or (not action and request.headers.get("x-isplan-history") == "push")
    sent = None if applied else tuple(request.query_params.items())
    return await render_page(request, "_fragment.html", plan, problems, store, a_query=request.query_params.get("a"),
                             url_header="HX-Push-Url" if push else "HX-Replace-Url", raw=tuple(raw.items()),
                             action_note=note, form_shown=request.headers.get("x-isplan-form"), sent=sent,
                             context=(("same_form", False),))


#: the profiles found, by (engine, model, GPU, GPU memory): a profile's first search takes seconds
_PROFILES: OrderedDict[tuple[str, str, str, float | None], str] = OrderedDict()


def profile_query(cfg: ModelConfig, base: Plan) -> str:
    """The query of ``engine_for(base.engine).profile`` for ``cfg`` (in the worker pool)."""
    found = engine_for(base.engine).profile(cfg, Plan(model=base.model, engine=base.engine, gpu=base.gpu,
                                                      gpu_memory_gb=base.gpu_memory_gb))
    return replace(found, model=base.model).query()


@router.get("/profile")
async def profile(request: Request, store: Store) -> Response:
    """**Start from a plan that runs**: the recommended plan of a model on an engine and GPU
    (``engine_for(engine).profile``: the pinned launcher where one exists, else the planner's
    best plan that fits), opened as a full URL. Load preset, switching the model or the engine and
    an uploaded config come here; any other URL means exactly what it says. Input it cannot use
    (or a profile over the work budget, or a busy server) opens the page on exactly that input,
    where each field says what is wrong. The search runs in the worker pool like ``/api/v1/search``
    (the largest budget a profile may try is its cost)."""
    given = {k: v for k, v in request.query_params.items() if k in ("model", "engine", "gpu", "gpu_memory_gb") and v}
    url = "/?" + urlencode(given)
    base, problems = plan_from_query(given)
    key = (base.engine, base.model, base.gpu, base.gpu_memory_gb)
    if not problems and key in _PROFILES:
        url = "/?" + _PROFILES[key]
    elif not problems:
        try:
            cfg = await model_for(base.model, store)
            query = await bounded(request, search_cost(base, cfg, PROFILE_MAX_GPUS, 1), profile_query, cfg, base)
        except (ValueError, TooBusy, WorkTimeout, WorkerLost):
            pass
        else:
            url = "/?" + query
            _PROFILES[key] = query
            while len(_PROFILES) > 64:
                _PROFILES.popitem(last=False)
    if request.headers.get("hx-request") == "true" and request.headers.get("hx-history-restore-request") != "true":
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


#: the largest GPU budget a training profile tries (app.core.engines.megatron.BUDGETS)
PROFILE_MAX_GPUS = 8192
SEARCH_TOP = 10


@router.get("/fragment/search", response_class=HTMLResponse)
async def search_fragment(request: Request, store: Store) -> Response:
    """The GPU budget search on the page: ranked configurations for ``budget`` GPUs on the plan on
    screen, each a link to the plan URL that loads it - the same
    :func:`app.core.reports.search_report` as ``isplan search`` and ``/api/v1/search``, with the
    same defences: the work budget, the worker pool with its deadline, cancellation when the client
    goes away and the per-client gate. A problem or a refusal is a message in the block (the page
    draws it in place): 200 for a problem with the search, 422 over the work budget, 429 / 503 when
    the server is busy."""
    plan, problems, _ = page_plan(request, route_keys=ROUTE_KEYS["/fragment/search"])
    budget = request.query_params.get("budget") or request.query_params.get("gpus")
    error, rows, status = None, [], 200
    if budget:
        plan, more = plan_from_query({**dict(parse_qsl(plan.query())), "gpus": budget})
        problems = [p for p in problems if p.field != "gpus"] + more
    problems = [p for p in problems if p.field in TABLE]
    if problems:
        error = "; ".join(p.message for p in problems)
    elif plan.gpus is None:
        error = "give a GPU budget: the number of GPUs to search configurations for"
    else:
        cfg, model_err = await run_in_threadpool(resolve_model, plan.model, store)
        try:
            body = await bounded(request, search_cost(plan, cfg, plan.gpus, SEARCH_TOP), report_body,
                                 reports.search_report, plan, cfg, gpus=plan.gpus, top=SEARCH_TOP)
        except PlanError as exc:
            error = "; ".join(p.message for p in exc.problems)
        except TooMuchWork as exc:
            error, status = str(exc), 422
        except TooBusy as exc:
            error, status = str(exc), 429
        except (WorkTimeout, WorkerLost) as exc:
            error, status = str(exc), 503
        else:
            rows = body["results"]   # each a plan the search recommends, evaluated: its query and verdict
            if not rows:
                error = (f"no configuration of {plan.gpus} GPUs passes the constraints, has a valid layout and "
                         "fits in memory")
            error = model_err or error
    html = templates().get_template("_search.html").render(
        {"request": request, "rows": rows, "error": error, "gpus": plan.gpus, "model": plan.model})
    return HTMLResponse(html, status_code=status, headers={"Retry-After": "2"} if status in (429, 503) else None)


def schedule_html(plan: Plan, problems: tuple[FieldProblem, ...], raw: tuple[tuple[str, str], ...],
                  configs: tuple[ModelConfig, ...]) -> bytes:
    """The schedule block's HTML (in a request thread or the worker pool)."""
    from app.web.figures import timeline_figure

    v = build_view(plan, list(problems), cast(BaseStore, _Configs(configs)), raw=dict(raw))
    tl = v.ev.timeline() if v.ev.time and "unavailable" not in v.ev.time else {}
    fig = timeline_figure(tl, v.ev.time) if tl else None
    return templates().get_template("_schedule.html").render({"request": None, "fig": fig, "v": v}).encode()


@router.get("/fragment/schedule", response_class=HTMLResponse)
async def schedule_fragment(request: Request, store: Store) -> Response:
    """The simulated pipeline schedule of the plan (``Evaluation.timeline()``: every micro-batch's
    forward and backward on every (pp rank, vp stage), real durations), as a figure; htmx loads it
    when the block scrolls into view, so a live update does not simulate it twice. The simulation
    is bounded by the time model's own event caps; a huge plan renders in the worker pool."""
    plan, problems, raw = page_plan(request)
    configs = await _uploaded(store, [plan.model])
    units = plan_units(plan, _shown_config(plan.model, configs))
    args = (plan, tuple(problems), tuple(raw.items()), configs)
    if units <= INLINE_UNITS:
        body = await run_in_threadpool(schedule_html, *args)
    else:
        body = await in_process_or_pool(request, units, schedule_html, *args)
    return HTMLResponse(body)


@router.get("/about", response_class=HTMLResponse)
def about_page(request: Request) -> HTMLResponse:
    """What isplan is, its sources and versions, as a page (the JSON stays at ``/api/v1/about``)."""
    html = templates().get_template("about.html").render(
        {"request": request, "version": __version__, "vendor": vendor(), **assets()})
    return HTMLResponse(html)


@router.get("/receipt")
async def receipt_download(request: Request, store: Store) -> Response:
    plan, problems, _ = page_plan(request)
    if problems:
        from app.web.deps import BadInput

        raise BadInput(problems[0].message, problems[0].field)
    # a receipt records the plan as judged: settings its layout mode does not use are left out, so
    # verify (which parses the recorded query strictly) reads it back
    plan = replace(plan, **{n: NEUTRAL_VALUES[n] for n in plan_ignored(plan)})
    cfg = await model_for(plan.model, store)
    body = await in_process_or_pool(request, plan_units(plan, cfg), report_body, reports.receipt_report, plan, cfg)
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})
