"""The page: ``/`` (the whole dashboard for a plan URL), ``/fragment`` (the results block for
the page's live updates), ``/fragment/search`` (the GPU budget search, ranked, each result a
plan URL), plus the receipt download.

Every change on the page (typing, drag, keys, Balance, Nearest valid) goes through one request
queue in ``static/app.js`` to ``/fragment``; the answer draws the results and carries the
canonical URL (``HX-Replace-Url``, or ``HX-Push-Url`` for a discrete action), so the URL always
reproduces the screen. A pinned plan A for the compare panel rides along as ``a=<A's plan
query>``; it is a page key, never part of the plan.

Bounded like the API (issue 20, findings 1 and 2): a page is one :class:`PageJob` rendered by
:func:`page_html` - in the request thread pool for a plan of an ordinary model (a few ms of
rendering: the event loop keeps answering ``/healthz`` meanwhile), in the worker pool for a huge one (:func:`app.web.deps.in_process_or_pool`: gated per client, with the deadline; the HTML
is compressed there too), so a 4,096-layer upload split into 4,096 stages no longer costs the
server process seconds of CPU per request. The GPU budget search runs exactly as
``/api/v1/search`` does (work budget, pool, deadline, cancellation, the per-client gate); a
refusal is the search block's message.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import StrictUndefined
from starlette.concurrency import run_in_threadpool

from app import settings as app_settings
from app.core import reports
from app.core.engines import DEFAULT_PLAN, ignored_fields
from app.core.model.config import ConfigError, ModelConfig, load_manifest, load_preset, preset_ids
from app.core.optimise.actions import ACTIONS, apply_action
from app.core.plan import GPUS, TABLE, FieldProblem, Plan, PlanError, plan_from_query
from app.web.assets import asset_dir
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
from app.web.store import BaseStore
from app.web.view import PlanView, build_view, resolve_model
from app.web.workers import TooBusy, TooMuchWork, WorkerLost, WorkTimeout

router = APIRouter(include_in_schema=False)

PAGE_KEYS = ("action", "a")  # page-only URL keys: a one-shot action, the pinned compare plan A


def page_plan(request: Request) -> tuple[Plan, list[FieldProblem]]:
    """The page's plan: lenient (a bad value keeps its default and gets a field message); an
    empty query is the pinned slime GLM-5.2 profile."""
    params = {k: v for k, v in request.query_params.items() if k not in PAGE_KEYS}
    return plan_from_query(params, empty=DEFAULT_PLAN, ignored=ignored_fields)


def _a_plan(a_query: str | None) -> tuple[Plan, list[FieldProblem]] | None:
    """The pinned plan A (``a=<A's plan query>``), read like any page URL."""
    if not a_query:
        return None
    return plan_from_query(dict(parse_qsl(a_query[:8000])), empty=DEFAULT_PLAN, ignored=ignored_fields)


# --------------------------------------------------------------------------- rendering


@lru_cache(maxsize=1)
def templates() -> Jinja2Templates:
    """The page's templates (one environment per process: the server's and each worker's)."""
    t = Jinja2Templates(directory=str(asset_dir("templates")))
    t.env.undefined = StrictUndefined  # a template naming a missing attribute fails loudly in tests
    return t


def page_context(request: Request | None, v: PlanView, **extra: Any) -> dict[str, Any]:
    """Everything a page template reads, for the view ``v``; ``extra`` overrides."""
    from app.web.caching import ASSET_VERSION, PLOTLY_FILE  # versioned asset URLs (long-lived caching)

    return {"request": request, "v": v, "presets": load_manifest()[1], "preset_ids": preset_ids(),
            "upload_token_required": bool(app_settings.current().upload_token),
            "table": TABLE, "gpus": GPUS, "figures": page_figures(v), "oob": False, "compare": None,
            "asset_v": ASSET_VERSION, "plotly_file": PLOTLY_FILE, **extra}


class _Configs:
    """The uploaded configs a page names, looked up by the server before the page is rendered
    (a worker process has no store): ``build_view`` reads them through ``get``."""

    def __init__(self, configs: tuple[ModelConfig, ...]):
        self._by_id = {c.id: c for c in configs}

    def get(self, model_id: str) -> ModelConfig | None:
        return self._by_id.get(model_id)


@dataclass(frozen=True)
class PageJob:
    """One page to render: picklable, so a worker process can render it."""

    template: str
    plan: Plan
    problems: tuple[FieldProblem, ...]
    a_query: str | None
    configs: tuple[ModelConfig, ...]
    context: tuple[tuple[str, Any], ...] = ()
    gzip: bool = False


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


def page_html(job: PageJob) -> bytes:
    """The page's HTML (gzip-compressed when ``job.gzip``): the view of the plan (and of a pinned
    plan A), rendered. Runs in the server process or in a worker."""
    store = cast(BaseStore, _Configs(job.configs))
    v = build_view(job.plan, list(job.problems), store)
    ctx = page_context(None, v, **{**dict(job.context), **_compare(job.a_query, v, store)})
    data = templates().get_template(job.template).render(ctx).encode()
    return gzip.compress(data, 6) if job.gzip else data


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
                      *, status_code: int = 200, a_query: str | None = None, **context: Any) -> Response:
    """The page ``template`` for ``plan`` (and a pinned plan A), rendered in a request thread or
    - a plan of a huge model - in the worker pool (:func:`app.web.deps.in_process_or_pool`)."""
    pinned = _a_plan(a_query)
    plans = [plan] + ([pinned[0]] if pinned else [])
    configs = await _uploaded(store, [p.model for p in plans])
    units = sum(plan_units(p, _shown_config(p.model, configs)) for p in plans)
    context.setdefault("upload_token_required", bool(app_settings.current().upload_token))
    compressed = units > INLINE_UNITS and "gzip" in request.headers.get("accept-encoding", "").lower()
    job = PageJob(template, plan, tuple(problems), a_query, configs, tuple(context.items()), compressed)
    if units <= INLINE_UNITS:
        body = await run_in_threadpool(page_html, job)
    else:
        body = await in_process_or_pool(request, units, page_html, job)
    headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if compressed else None
    return HTMLResponse(body, status_code=status_code, headers=headers)


# --------------------------------------------------------------------------- routes


@router.get("/", response_class=HTMLResponse)
async def index(request: Request, store: Store) -> Response:
    plan, problems = page_plan(request)
    return await render_page(request, "index.html", plan, problems, store, a_query=request.query_params.get("a"))


@router.get("/fragment", response_class=HTMLResponse)
async def fragment(request: Request, action: str | None = None) -> Response:
    store = get_store(request)  # not a dependency: the live update's hot path
    plan, problems = page_plan(request)
    if action:
        if action in ACTIONS:
            cfg, _ = await run_in_threadpool(resolve_model, plan.model, store)
            try:  # in the worker pool, within the work budget (issue 9)
                plan, problem = await bounded(request, action_cost(plan, cfg, action), apply_action, plan, cfg, action)
            except ValueError as exc:  # over the work budget, or a plan the action cannot rewrite
                problem = FieldProblem(getattr(exc, "field", None) or "split", f"{action}: {exc}")
        else:
            problem = FieldProblem("split", f"unknown action {action[:40]!r}")
        if problem is not None:
            problems = [*problems, problem]
    resp = await render_page(request, "_results.html", plan, problems, store, a_query=request.query_params.get("a"),
                             oob=True)
    resp.headers["HX-Push-Url" if action else "HX-Replace-Url"] = "/?" + plan.query()
    return resp


SEARCH_TOP = 10


@router.get("/fragment/search", response_class=HTMLResponse)
async def search_fragment(request: Request, store: Store) -> Response:
    """The GPU budget search on the page: ranked configurations for ``gpus``, each a link to the
    plan URL that loads it - the same :func:`app.core.reports.search_report` as ``isplan search``
    and ``/api/v1/search``, with the same defences: the work budget, the worker pool with its
    deadline, cancellation when the client goes away and the per-client gate. A problem or a
    refusal is a message in the block (the page draws it in place): 200 for a problem with the
    search, 422 over the work budget, 429 / 503 when the server is busy."""
    plan, problems = page_plan(request)
    error, rows, status = None, [], 200
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


@router.get("/receipt")
async def receipt_download(request: Request, store: Store) -> Response:
    plan, problems = page_plan(request)
    if problems:
        from app.web.deps import BadInput

        raise BadInput(problems[0].message, problems[0].field)
    cfg = await model_for(plan.model, store)
    body = await in_process_or_pool(request, plan_units(plan, cfg), report_body, reports.receipt_report, plan, cfg)
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})
