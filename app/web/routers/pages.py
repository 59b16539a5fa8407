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
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app import __version__
from app.core import reports
from app.core.engines import DEFAULT_PLAN, engine_for, ignored_fields
from app.core.evaluate import Evaluation
from app.core.optimise.actions import ACTIONS, apply_action
from app.core.plan import BY_URL, NEUTRAL_VALUES, TABLE, FieldProblem, Plan, PlanError, plan_from_query, unknown_keys
from app.core.plan import ignored_fields as plan_ignored
from app.web.deps import Store, action_cost, bounded_from_thread, model_config
from app.web.view import PlanView, build_view, resolve_model

router = APIRouter(include_in_schema=False)

#: page-only URL keys: a one-shot action, the pinned compare plan A; the search's GPU budget
PAGE_KEYS = ("action", "a")
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


def page_view(request: Request, store: Store, plan: Plan, problems: list[FieldProblem], raw: dict[str, str],
              **kw: Any) -> PlanView:
    v = build_view(plan, problems, store, raw=raw, **kw)
    a = request.query_params.get("a")
    if a:
        v.page_keys["a"] = a[:8000]
    return v


def compare_context(request: Request, b: PlanView, store: Store) -> dict[str, Any]:
    """The compare panel when the URL pins a plan A (``a=<A's plan query, URL-encoded>``): A and
    B side by side. A's query is read like any page URL; its problems are shown, never dropped."""
    from app.web.view import flag_diff, plan_summary  # the compare panel's display helpers

    a_query = request.query_params.get("a")
    if not a_query:
        return {"compare": None}
    a_plan, a_problems = plan_from_query(dict(parse_qsl(a_query[:8000])), empty=DEFAULT_PLAN, ignored=ignored_fields)
    a = build_view(a_plan, a_problems, store)
    return {"compare": {"a": a, "sa": plan_summary(a), "sb": plan_summary(b), "diff": flag_diff(a.plan, b.plan),
                        "a_query": a.plan.query()}}


def assets(request: Request) -> dict[str, Any]:
    """What every page links: versioned assets (long-lived caching) and the engines to choose from."""
    from app.web.caching import ASSET_VERSION, PLOTLY_FILE

    vendor = request.app.state.vendor
    return {"asset_v": ASSET_VERSION, "plotly_file": PLOTLY_FILE, "htmx_file": vendor["htmx"]["file"],
            "morph_file": vendor["idiomorph"]["file"], "engines": [
                {"name": n, "label": e.label, "workflow": e.workflow, "source": e.source} for n, e in _engines().items()]}


def render(request: Request, template: str, v: PlanView, status_code: int = 200, **extra: Any) -> HTMLResponse:
    extra.setdefault("compare", None)
    ctx = request.app.state.page_context(request, v, **assets(request), **extra)
    resp: HTMLResponse = request.app.state.templates.TemplateResponse(request, template, ctx, status_code=status_code)
    return resp


def _wants_fragment(request: Request) -> bool:
    """An htmx request (not a history restore, which wants the whole page)."""
    return request.headers.get("hx-request") == "true" and request.headers.get("hx-history-restore-request") != "true"


@router.get("/", response_class=HTMLResponse)
def index(request: Request, store: Store) -> HTMLResponse:
    plan, problems, raw = page_plan(request)
    v = page_view(request, store, plan, problems, raw)
    return render(request, "index.html", v, **compare_context(request, v, store))


def _run_action(request: Request, store: Store, plan: Plan, action: str) -> tuple[Plan, FieldProblem | None, Any]:
    """Balance / Nearest valid in the worker pool; the plan it found is applied only when its own
    evaluation is GO (otherwise the page keeps the plan and offers the one found as a link)."""
    if action not in ACTIONS:
        return plan, FieldProblem("split", f"unknown action {action[:40]!r}"), None
    cfg, _ = resolve_model(plan.model, store)
    try:  # in the worker pool, within the work budget (issue 9)
        found, problem = bounded_from_thread(request, action_cost(plan, cfg, action), apply_action, plan, cfg, action)
    except ValueError as exc:  # over the work budget, or a plan the action cannot rewrite
        return plan, FieldProblem(getattr(exc, "field", None) or "split", f"{action}: {exc}"), None
    if problem is not None:
        return plan, problem, None
    candidate = build_view(found, [], store)
    if candidate.go:
        return found, None, candidate.ev
    note = {"action": action, "query": found.query(), "split": ",".join(map(str, found.split or ())),
            "headline": candidate.verdict.headline(), "reasons": [r.message for r in candidate.verdict.blocking][:3]}
    return plan, None, note


@router.get("/fragment", response_class=HTMLResponse)
def fragment(request: Request, store: Store, action: str | None = None) -> HTMLResponse:
    plan, problems, raw = page_plan(request)
    note = None
    evaluation: Evaluation | None = None
    if action:
        plan, problem, found = _run_action(request, store, plan, action)
        if problem is not None:
            problems = [*problems, problem]
        elif isinstance(found, Evaluation):
            evaluation, raw = found, {}
        else:
            note = found
    v = page_view(request, store, plan, [] if evaluation is not None else problems, raw, evaluation=evaluation)
    v.action_note = note
    resp = render(request, "_fragment.html", v, same_form=evaluation is None and form_unchanged(request, v),
                  **compare_context(request, v, store))
    push = evaluation is not None or (not action and request.headers.get("x-isplan-history") == "push")
    resp.headers["HX-Push-Url" if push else "HX-Replace-Url"] = "/?" + v.share_query
    return resp


def form_unchanged(request: Request, v: PlanView) -> bool:
    """Whether the settings form the page shows is already the one this answer would draw, so it
    is not sent again: the page says it drew the form for this layout mode with no message
    (``X-Isplan-Form: <mode>:clean``), this answer has no field message, and every field holds what
    the request sent (no value was rewritten to its canonical form)."""
    if request.headers.get("x-isplan-form") != f"{v.plan.mode}:clean" or v.field_errors:
        return False
    sent = {k: val for k, val in request.query_params.items() if k in TABLE and val != ""}
    shown = {k: val for k, val in v.values.items() if val != "" and k not in ("model", "engine")}
    shown.update({k: val for k, val in v.hidden_values.items()})
    sent.pop("model", None)
    sent.pop("engine", None)
    if "mode" not in v.query_values:   # the form always sends its mode; the canonical URL leaves out a derived one
        shown["mode"] = v.plan.mode
    return sent == shown


@router.get("/profile")
def profile(request: Request, store: Store) -> Response:
    """**Start from a plan that runs**: the recommended plan of a model on an engine and GPU
    (``engine_for(engine).profile``: the pinned launcher where one exists, else the planner's
    best plan that fits), opened as a full URL. Load preset, switching the model or the engine and
    an uploaded config come here; any other URL means exactly what it says. Input it cannot use
    opens the page on exactly that input, where each field says what is wrong."""
    given = {k: v for k, v in request.query_params.items() if k in ("model", "engine", "gpu", "gpu_memory_gb") and v}
    url = "/?" + urlencode(given)
    base, problems = plan_from_query(given)
    if not problems:
        try:
            cfg = model_config(base.model, store)
            found = engine_for(base.engine).profile(cfg, Plan(model=base.model, engine=base.engine, gpu=base.gpu,
                                                              gpu_memory_gb=base.gpu_memory_gb))
            url = "/?" + replace(found, model=base.model).query()
        except ValueError:
            pass
    if _wants_fragment(request):
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


SEARCH_TOP = 10


@router.get("/fragment/search", response_class=HTMLResponse)
def search_fragment(request: Request, store: Store) -> HTMLResponse:
    """The GPU budget search on the page: ranked configurations for ``budget`` GPUs (the same
    :func:`app.core.reports.search_report` as ``isplan search`` and ``/api/v1/search``) on the plan
    on screen, each a link to the plan URL that loads it. A problem is a message in the block
    (status 200, so the page draws it in place)."""
    plan, problems, _ = page_plan(request, route_keys=ROUTE_KEYS["/fragment/search"])
    budget = request.query_params.get("budget") or request.query_params.get("gpus")
    error, rows = None, []
    if budget:
        plan, more = plan_from_query({**dict(parse_qsl(plan.query())), "gpus": budget})
        problems = [p for p in problems if p.field != "gpus"] + more
    problems = [p for p in problems if p.field in TABLE]
    if problems:
        error = "; ".join(p.message for p in problems)
    elif plan.gpus is None:
        error = "give a GPU budget: the number of GPUs to search configurations for"
    else:
        cfg, model_err = resolve_model(plan.model, store)
        try:
            body = reports.search_report(plan, cfg, gpus=plan.gpus, top=SEARCH_TOP).body
        except PlanError as exc:
            error = "; ".join(p.message for p in exc.problems)
        else:
            rows = body["results"]   # each a plan the search recommends, evaluated: its query and verdict
            if not rows:
                error = (f"no configuration of {plan.gpus} GPUs passes the constraints, has a valid layout and "
                         "fits in memory")
            error = model_err or error
    return request.app.state.templates.TemplateResponse(
        request, "_search.html", {"rows": rows, "error": error, "gpus": plan.gpus, "model": plan.model})


@router.get("/fragment/schedule", response_class=HTMLResponse)
def schedule_fragment(request: Request, store: Store) -> HTMLResponse:
    """The simulated pipeline schedule of the plan (``Evaluation.timeline()``: every micro-batch's
    forward and backward on every (pp rank, vp stage), real durations), as a figure; htmx loads it
    when the block scrolls into view, so a live update does not simulate it twice."""
    from app.web.figures import timeline_figure

    plan, problems, raw = page_plan(request)
    v = build_view(plan, problems, store, raw=raw)
    tl = v.ev.timeline() if v.ev.time and "unavailable" not in v.ev.time else {}
    fig = timeline_figure(tl, v.ev.time) if tl else None
    return request.app.state.templates.TemplateResponse(request, "_schedule.html", {"fig": fig, "v": v})


@router.get("/about", response_class=HTMLResponse)
def about_page(request: Request) -> HTMLResponse:
    """What isplan is, its sources and versions, as a page (the JSON stays at ``/api/v1/about``)."""
    return request.app.state.templates.TemplateResponse(request, "about.html", {
        "version": __version__, "vendor": request.app.state.vendor, **assets(request)})


def _engines() -> dict[str, Any]:
    from app.core.engines import ENGINES

    return dict(ENGINES)


@router.get("/receipt")
def receipt_download(request: Request, store: Store) -> Response:
    plan, problems, _ = page_plan(request)
    if problems:
        from app.web.deps import BadInput

        raise BadInput(problems[0].message, problems[0].field)
    # a receipt records the plan as judged: settings its layout mode does not use are left out, so
    # verify (which parses the recorded query strictly) reads it back
    unused = {n: NEUTRAL_VALUES[n] for n in plan_ignored(plan)}
    body = reports.receipt_report(replace(plan, **unused), model_config(plan.model, store)).body
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})
