"""Uploads: a ``config.json`` (stored content-addressed) and a pasted launcher script.

Both end on the page: success redirects to the plan URL that holds everything read (the URL is
the plan); a refusal renders the page with the message beside the field, never a raw JSON page.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.core.launcher_plan import LauncherImportError, import_launcher
from app.core.model_config import ConfigError
from app.core.plan import FieldProblem, Plan, plan_from_query
from app.web.deps import Store
from app.web.routers.pages import render
from app.web.view import build_view, resolve_model

router = APIRouter(include_in_schema=False)


def _plan_of(query: str) -> tuple[Plan, list[FieldProblem]]:
    return plan_from_query(dict(parse_qsl(query)))


@router.post("/upload")
async def upload(request: Request, store: Store, file: UploadFile = File(...), query: str = Form("")) -> Response:
    data = await file.read()  # at most 2 MiB: BodySizeLimit refuses larger requests before they arrive
    plan, problems = _plan_of(query)
    try:
        cfg = await run_in_threadpool(store.put, data, name=file.filename)
    except ConfigError as exc:
        problems.append(FieldProblem("model", f"upload {str(file.filename)[:80]!r} refused: {exc}"))
        return render(request, "index.html", build_view(plan, problems, store), status_code=422)
    return RedirectResponse("/?" + plan.query(model=cfg.id), status_code=303)


@router.post("/launcher")
async def launcher(request: Request, store: Store, script: str = Form(""), query: str = Form("")) -> Response:
    plan, problems = _plan_of(query)
    cfg, _ = resolve_model(plan.model, store)
    try:
        imported = await run_in_threadpool(import_launcher, script, cfg,
                                           Plan(model=plan.model, engine=plan.engine, pattern=plan.pattern))
    except LauncherImportError as exc:
        problems.append(FieldProblem("launcher", f"launcher: {exc}"))
        return render(request, "index.html", build_view(plan, problems, store), status_code=422)
    return RedirectResponse("/?" + imported.plan.query(), status_code=303)
