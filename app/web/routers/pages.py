"""The page: ``/`` (the whole dashboard for a plan URL), ``/fragment`` (the results block for
the page's live updates), ``/fragment/search`` (the GPU budget search, ranked, each result a
plan URL), plus the receipt download and the full Plotly bundle (no longer used by the page).

Every change on the page (typing, drag, keys, Balance, Nearest valid) goes through one request
queue in ``static/app.js`` to ``/fragment``; the answer draws the results and carries the
canonical URL (``HX-Replace-Url``, or ``HX-Push-Url`` for a discrete action), so the URL always
reproduces the screen. A pinned plan A for the compare panel rides along as ``a=<A's plan
query>``; it is a page key, never part of the plan.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from app.core import reports
from app.core.engines import DEFAULT_PLAN, ignored_fields
from app.core.optimise.actions import ACTIONS, apply_action
from app.core.plan import FieldProblem, Plan, PlanError, plan_from_query
from app.web.deps import Store, action_cost, bounded_from_thread, model_config
from app.web.view import PlanView, build_view, resolve_model

router = APIRouter(include_in_schema=False)


def page_plan(request: Request) -> tuple[Plan, list[FieldProblem]]:
    """The page's plan: lenient (a bad value keeps its default and gets a field message); an
    empty query is the pinned slime GLM-5.2 profile."""
    params = {k: v for k, v in request.query_params.items() if k not in PAGE_KEYS}
    return plan_from_query(params, empty=DEFAULT_PLAN, ignored=ignored_fields)


PAGE_KEYS = ("action", "a")  # page-only URL keys: a one-shot action, the pinned compare plan A


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


def render(request: Request, template: str, v: PlanView, status_code: int = 200, **extra: Any) -> HTMLResponse:
    from app.web.caching import ASSET_VERSION, PLOTLY_FILE  # versioned asset URLs (long-lived caching)

    extra.setdefault("compare", None)
    ctx = request.app.state.page_context(request, v, asset_v=ASSET_VERSION, plotly_file=PLOTLY_FILE, **extra)
    resp: HTMLResponse = request.app.state.templates.TemplateResponse(request, template, ctx, status_code=status_code)
    return resp


@router.get("/", response_class=HTMLResponse)
def index(request: Request, store: Store) -> HTMLResponse:
    plan, problems = page_plan(request)
    v = build_view(plan, problems, store)
    return render(request, "index.html", v, **compare_context(request, v, store))


@router.get("/fragment", response_class=HTMLResponse)
def fragment(request: Request, store: Store, action: str | None = None) -> HTMLResponse:
    plan, problems = page_plan(request)
    if action:
        if action in ACTIONS:
            cfg, _ = resolve_model(plan.model, store)
            try:  # in the worker pool, within the work budget (issue 9)
                plan, problem = bounded_from_thread(request, action_cost(plan, cfg, action), apply_action, plan,
                                                    cfg, action)
            except ValueError as exc:  # over the work budget, or a plan the action cannot rewrite
                problem = FieldProblem(getattr(exc, "field", None) or "split", f"{action}: {exc}")
        else:
            problem = FieldProblem("split", f"unknown action {action[:40]!r}")
        if problem is not None:
            problems = [*problems, problem]
    v = build_view(plan, problems, store)
    resp = render(request, "_results.html", v, oob=True, **compare_context(request, v, store))
    resp.headers["HX-Push-Url" if action else "HX-Replace-Url"] = "/?" + plan.query()
    return resp


SEARCH_TOP = 10


@router.get("/fragment/search", response_class=HTMLResponse)
def search_fragment(request: Request, store: Store) -> HTMLResponse:
    """The GPU budget search on the page: ranked configurations for ``gpus`` (the same
    :func:`app.core.reports.search_report` as ``isplan search`` and ``/api/v1/search``), each a
    link to the plan URL that loads it. A problem is a message in the block (status 200, so the
    page draws it in place)."""
    plan, problems = page_plan(request)
    error, rows = None, []
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


@router.get("/receipt")
def receipt_download(request: Request, store: Store) -> Response:
    plan, problems = page_plan(request)
    if problems:
        from app.web.deps import BadInput

        raise BadInput(problems[0].message, problems[0].field)
    body = reports.receipt_report(plan, model_config(plan.model, store)).body
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})
