"""The page: ``/`` (the whole dashboard for a plan URL) and ``/fragment`` (the results block
for the page's live updates), plus the receipt download and the Plotly bundle.

Every change on the page (typing, drag, keys, Balance, Nearest valid) goes through one request
queue to ``/fragment``; the answer draws the results and carries the canonical URL
(``HX-Replace-Url``, or ``HX-Push-Url`` for a discrete action so Back undoes it), so the URL
always reproduces the screen.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from app.core import reports
from app.core.plan import SLIME_GLM52_PROFILE, FieldProblem, Plan, plan_from_query
from app.core.plan_actions import ACTIONS, apply_action
from app.web.deps import Store, action_cost, bounded_from_thread, model_config
from app.web.view import PlanView, build_view, resolve_model

router = APIRouter(include_in_schema=False)


def page_plan(request: Request) -> tuple[Plan, list[FieldProblem]]:
    """The page's plan: lenient (a bad value keeps its default and gets a field message); an
    empty query is the pinned slime GLM-5.2 profile."""
    params = {k: v for k, v in request.query_params.items() if k != "action"}
    return plan_from_query(params, empty=SLIME_GLM52_PROFILE)


def render(request: Request, template: str, v: PlanView, status_code: int = 200, **extra: Any) -> HTMLResponse:
    ctx = request.app.state.page_context(request, v, **extra)
    resp: HTMLResponse = request.app.state.templates.TemplateResponse(request, template, ctx, status_code=status_code)
    return resp


@router.get("/", response_class=HTMLResponse)
def index(request: Request, store: Store) -> HTMLResponse:
    plan, problems = page_plan(request)
    return render(request, "index.html", build_view(plan, problems, store))


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
    resp = render(request, "_results.html", v, oob=True)
    resp.headers["HX-Push-Url" if action else "HX-Replace-Url"] = "/?" + plan.query()
    return resp


@router.get("/receipt")
def receipt_download(request: Request, store: Store) -> Response:
    plan, problems = page_plan(request)
    if problems:
        from app.web.deps import BadInput

        raise BadInput(problems[0].message, problems[0].field)
    body = reports.receipt_report(plan, model_config(plan.model, store)).body
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})


@router.get("/assets/plotly.min.js")
def plotly_js(request: Request) -> FileResponse:
    return FileResponse(request.app.state.plotly_js, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})
