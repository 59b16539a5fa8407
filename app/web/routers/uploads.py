"""Uploads: a ``config.json`` (stored content-addressed) and a pasted launcher script.

Both end on the page: success redirects to the plan URL that holds everything read (the URL is
the plan); a refusal renders the page with the message beside the field, never a raw JSON page:
422 for an invalid config or launcher, 400 for a form Starlette's multipart parser refuses (too
many fields or files, a malformed body), 401/403 without the upload token
(``ISPLAN_UPLOAD_TOKEN``), 413 over an upload quota, 503 when the store cannot write.

Both are gated per client before any parsing (:data:`app.web.app.EXPENSIVE_PATHS`) and their
bytes count against the client's upload rate whether they are accepted or not
(:class:`app.web.limits.UploadRate`); an upload's JSON is checked for its container count before
it is parsed (:func:`app.web.store.check_config_shape`).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as FormFile  # what a parsed form holds
from starlette.exceptions import HTTPException  # what request.form() raises (FastAPI's is a subclass)

from app.core.launcher import LauncherImportError, import_launcher
from app.core.model.config import MAX_CONFIG_BYTES, ConfigError
from app.core.plan import FieldProblem, Plan, plan_from_query
from app.web.deps import Store, bounded, client_of, launcher_cost
from app.web.routers.pages import render_page
from app.web.store import BaseStore, QuotaExceeded, StoreUnavailable, UploadForbidden, check_token
from app.web.view import resolve_model

#: sourced files one launcher form may carry
MAX_SOURCED_FILES = 32

router = APIRouter(include_in_schema=False)

#: The upload form has ``file``, ``query`` and ``token``; a few more fields are tolerated.
MAX_FORM_FIELDS = 16


def _plan_of(query: str) -> tuple[Plan, list[FieldProblem]]:
    return plan_from_query(dict(parse_qsl(query)))


async def _refused(request: Request, store: BaseStore, query: str, field: str, message: str, status: int) -> Response:
    """The page for ``query`` with ``message`` beside ``field``, answered with ``status``."""
    plan, problems = _plan_of(query)
    problems.append(FieldProblem(field, message))
    return await render_page(request, "index.html", plan, problems, store, status_code=status)


@router.post("/upload")
async def upload(request: Request, store: Store) -> Response:
    """Store a config (``file``) and open the page on it; ``query`` is the page's plan to keep.

    With ``ISPLAN_UPLOAD_TOKEN`` set, an ``Authorization: Bearer`` header is checked before a
    byte of the body is read; a browser form sends the token as the ``token`` field instead."""
    header = request.headers.get("authorization")
    if header is not None:
        try:
            check_token(header)
        except UploadForbidden as exc:
            return await _refused(request, store, "", "model", f"upload refused: {exc}", exc.status_code)
    form = await _form(request, max_files=1)
    if isinstance(form, str):
        return await _refused(request, store, "", "model", f"upload refused: {form}", 400)
    query = form.get("query")
    query = query if isinstance(query, str) else ""
    if header is None:
        token = form.get("token")
        try:
            check_token(token if isinstance(token, str) else None)
        except UploadForbidden as exc:
            return await _refused(request, store, query, "model", f"upload refused: {exc}", exc.status_code)
    file = form.get("file")
    if not isinstance(file, FormFile):
        return await _refused(request, store, query, "model", "upload: choose a config.json file (form field 'file')", 422)
    data = await file.read(MAX_CONFIG_BYTES + 1)
    name = (file.filename or "")[:200]
    try:
        cfg = await run_in_threadpool(store.put, data, name=name, client=client_of(request))
    except ConfigError as exc:
        return await _refused(request, store, query, "model", f"upload {name[:80]!r} refused: {exc}", 422)
    except (QuotaExceeded, StoreUnavailable) as exc:
        return await _refused(request, store, query, "model", f"upload {name[:80]!r} not stored: {exc}", exc.status_code)
    plan, _ = _plan_of(query)
    return RedirectResponse("/?" + plan.query(model=cfg.id), status_code=303)


async def _form(request: Request, max_files: int) -> FormData | str:
    """The request's form (urlencoded or multipart, at most 2 MiB: BodySizeLimit), or the reason
    Starlette's parser refused it (too many fields or files, a malformed body)."""
    try:
        return await request.form(max_files=max_files, max_fields=MAX_FORM_FIELDS)
    except HTTPException as exc:
        return str(exc.detail)[:200]


def _text_field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


@router.post("/launcher")
async def launcher(request: Request, store: Store) -> Response:
    """Import a pasted Megatron/slime launcher (form field ``script``) as a plan, in the worker
    pool (bounded like every expensive operation). ``files`` are the files it ``source``s (a
    multipart form): a sourced path is found by its path relative to the launcher, else by its
    base name; one that is missing is named in the refusal (fail closed)."""
    form = await _form(request, max_files=MAX_SOURCED_FILES)
    if isinstance(form, str):
        return await _refused(request, store, "", "launcher", f"launcher refused: {form}", 400)
    script, query = _text_field(form, "script"), _text_field(form, "query")
    plan, problems = _plan_of(query)
    cfg, _ = await run_in_threadpool(resolve_model, plan.model, store)
    sourced: dict[str, str | bytes] = {}
    for f in form.getlist("files")[:MAX_SOURCED_FILES]:
        if isinstance(f, FormFile) and f.filename:
            sourced[f.filename] = await f.read(MAX_CONFIG_BYTES + 1)  # BodySizeLimit caps the whole form
    try:
        imported = await bounded(request, launcher_cost(script, cfg, sum(len(v) for v in sourced.values())),
                                 import_launcher, script, cfg,
                                 Plan(model=plan.model, engine=plan.engine, pattern=plan.pattern),
                                 files=sourced or None, keep_engine="engine" in dict(parse_qsl(query)))
    except LauncherImportError as exc:
        problems.append(FieldProblem("launcher", f"launcher: {exc}"))
        return await render_page(request, "index.html", plan, problems, store, status_code=422)
    return RedirectResponse("/?" + imported.plan.query(), status_code=303)
