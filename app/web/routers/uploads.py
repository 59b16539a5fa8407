"""Uploads: a ``config.json`` (stored content-addressed) and a launcher script with the files it
sources, plus the download of an uploaded config (the page's CLI line reads it from a file).

* An accepted config opens a plan that runs on it (the engine's profile for the page's engine and
  GPU, as Load preset does); an htmx request is answered with ``HX-Redirect`` to that plan's URL.
* An accepted launcher renders the page on the plan it describes, with the import's report (the
  engine the script is written for, every value's file:line, the warnings) beside the verdict;
  an htmx request gets the page's ``<main>`` and ``HX-Push-Url`` with the plan's URL.
* A refusal is the message beside the field, never a raw JSON page: 422 for an invalid config or
  launcher, 401/403 without the upload token (``ISPLAN_UPLOAD_TOKEN``), 413 over an upload quota,
  503 when the store cannot write, 400 for a form Starlette's multipart parser refuses (too many
  fields or files, a malformed body). htmx requests get just the message (the form's error line).

Both are gated per client before any parsing (:data:`app.web.app.EXPENSIVE_PATHS`) and their
bytes count against the client's upload rate whether they are accepted or not
(:class:`app.web.limits.UploadRate`); an upload's JSON is checked for its container count before
it is parsed (:func:`app.web.store.check_config_shape`). A launcher's page renders like every page
(:func:`app.web.routers.pages.render_page`: in the worker pool for a huge model).
"""

from __future__ import annotations

import posixpath
import re
from html import escape
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as FormFile  # what a parsed form holds
from starlette.exceptions import HTTPException  # what request.form() raises (FastAPI's is a subclass)

from app.core.engines import ENGINES
from app.core.launcher import LauncherImportError, import_launcher
from app.core.model.config import MAX_CONFIG_BYTES, ConfigError
from app.core.plan import FieldProblem, Plan, plan_from_query
from app.web.deps import SafeJSONResponse, Store, bounded, client_of, launcher_cost
from app.web.routers.pages import render_page
from app.web.store import BaseStore, QuotaExceeded, StoreUnavailable, UploadForbidden, check_token
from app.web.view import config_file_name, resolve_model

#: sourced files one launcher form may carry
MAX_SOURCED_FILES = 32

router = APIRouter(include_in_schema=False)

#: The upload form has ``file``, the page's ``engine`` / ``gpu`` and ``token``; a few more are tolerated.
MAX_FORM_FIELDS = 16
#: the launcher form: ``script``, ``launcher_engine``, the page's model and engine, and its files
MAX_LAUNCHER_FIELDS = 16 + MAX_SOURCED_FILES


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _plan_of(query: str) -> tuple[Plan, list[FieldProblem]]:
    return plan_from_query(dict(parse_qsl(query)))


async def _refused(request: Request, store: BaseStore, query: str, field: str, message: str, status: int,
                   *, error_id: str | None = None) -> Response:
    """The page for ``query`` with ``message`` beside ``field``, answered with ``status``; for htmx,
    only the form's error line (``error_id``) with the message."""
    if error_id and _is_htmx(request):
        return HTMLResponse(f'<p class="field-error" id="{error_id}" role="alert">{escape(message)}</p>', status_code=status,
                            headers={"HX-Retarget": f"#{error_id}", "HX-Reswap": "outerHTML"})
    plan, problems = _plan_of(query)
    problems.append(FieldProblem(field, message))
    return await render_page(request, "index.html", plan, problems, store, status_code=status)


async def _form(request: Request, max_files: int, max_fields: int) -> FormData | str:
    """The request's form (urlencoded or multipart, at most 2 MiB: BodySizeLimit), or the reason
    Starlette's parser refused it (too many fields or files, a malformed body)."""
    try:
        return await request.form(max_files=max_files, max_fields=max_fields)
    except HTTPException as exc:
        return str(exc.detail)[:200]


def _page_query(form: object) -> str:
    """The page settings an upload form carries along (engine, GPU), as a query."""
    get = getattr(form, "get", None)
    if get is None:
        return ""
    keep = {k: get(k) for k in ("engine", "gpu", "gpu_memory_gb")}
    return urlencode({k: v for k, v in keep.items() if isinstance(v, str) and v})


@router.post("/upload")
async def upload(request: Request, store: Store) -> Response:
    """Store a config (``file``) and open a plan that runs on it (``/profile`` for the page's engine
    and GPU, which the form carries along).

    With ``ISPLAN_UPLOAD_TOKEN`` set, an ``Authorization: Bearer`` header is checked before a
    byte of the body is read; a browser form sends the token as the ``token`` field instead."""
    err = "err-upload"
    header = request.headers.get("authorization")
    if header is not None:
        try:
            check_token(header)
        except UploadForbidden as exc:
            return await _refused(request, store, "", "model", f"upload refused: {exc}", exc.status_code, error_id=err)
    form = await _form(request, 1, MAX_FORM_FIELDS)
    if isinstance(form, str):
        return await _refused(request, store, "", "model", f"upload refused: {form}", 400, error_id=err)
    query = form.get("query")
    query = query if isinstance(query, str) else _page_query(form)
    if header is None:
        token = form.get("token")
        try:
            check_token(token if isinstance(token, str) else None)
        except UploadForbidden as exc:
            return await _refused(request, store, query, "model", f"upload refused: {exc}", exc.status_code, error_id=err)
    file = form.get("file")
    if not isinstance(file, FormFile) or not file.filename:
        return await _refused(request, store, query, "model", "upload: choose a config.json file (form field 'file')", 422,
                        error_id=err)
    data = await file.read(MAX_CONFIG_BYTES + 1)
    name = (file.filename or "")[:200]
    try:
        cfg = await run_in_threadpool(store.put, data, name=name, client=client_of(request))
    except ConfigError as exc:
        return await _refused(request, store, query, "model", f"upload {name[:80]!r} refused: {exc}", 422, error_id=err)
    except (QuotaExceeded, StoreUnavailable) as exc:
        return await _refused(request, store, query, "model", f"upload {name[:80]!r} not stored: {exc}", exc.status_code,
                        error_id=err)
    page = dict(parse_qsl(query))
    keep: dict[str, str] = {"model": cfg.id, **{k: page[k] for k in ("engine", "gpu", "gpu_memory_gb") if k in page}}
    url = "/profile?" + urlencode(keep)
    if _is_htmx(request):
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


#: ``source FILE`` / ``. FILE`` in a script: which chosen files another chosen file reads
_SOURCE = re.compile(r"(?m)^\s*(?:source|\.)\s+[\"']?([^\"'\s;]+)")


def _launcher_text(script: str, files: dict[str, str | bytes]) -> tuple[str | bytes, str, dict[str, str | bytes]]:
    """The launcher and the files it sources: the pasted text, else the chosen file that no other
    chosen file sources (the script), with the rest as its sourced files."""
    if script.strip() or not files:
        return script, "launcher.sh", files
    sourced = set()
    for body in files.values():
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        sourced |= {posixpath.basename(m) for m in _SOURCE.findall(text)}
    main = next((n for n in files if posixpath.basename(n) not in sourced), next(iter(files)))
    rest = {n: b for n, b in files.items() if n != main}
    return files[main], main, rest


@router.post("/launcher")
async def launcher(request: Request, store: Store) -> Response:
    """Import a launcher as a plan, in the worker pool (bounded like every expensive operation):
    ``script`` (pasted) or the chosen ``files`` (the script and the files it ``source``s: a sourced
    path is found by its path relative to the launcher, else by its base name; one that is missing
    is named in the refusal: fail closed). The plan takes the engine the script is written for,
    unless ``launcher_engine`` names one."""
    err = "err-launcher"
    form = await _form(request, MAX_SOURCED_FILES, MAX_LAUNCHER_FIELDS)
    if isinstance(form, str):
        return await _refused(request, store, "", "launcher", f"launcher refused: {form}", 400, error_id=err)
    script = form.get("script")
    script = script if isinstance(script, str) else ""
    query = form.get("query")
    page = dict(parse_qsl(query)) if isinstance(query, str) else {
        k: v for k in ("model", "engine", "pattern") if isinstance(v := form.get(k), str) and v}
    chosen: dict[str, str | bytes] = {}
    for f in form.getlist("files")[:MAX_SOURCED_FILES]:
        if isinstance(f, FormFile) and f.filename:
            chosen[f.filename] = await f.read(MAX_CONFIG_BYTES + 1)  # BodySizeLimit caps the whole form
    text, main, sourced = _launcher_text(script, chosen)
    if not (text.strip() if isinstance(text, str) else text):
        return await _refused(request, store, urlencode(page), "launcher",
                        "launcher: paste a launcher script (or choose its file) first", 422, error_id=err)
    plan, _problems = plan_from_query(page)
    cfg, _ = await run_in_threadpool(resolve_model, plan.model, store)
    engine = form.get("launcher_engine")
    keep = isinstance(engine, str) and engine in ENGINES
    base = Plan(model=plan.model, engine=engine if keep and isinstance(engine, str) else plan.engine,
                pattern=plan.pattern)
    size = sum(len(v) for v in sourced.values())
    try:
        imported = await bounded(request, launcher_cost(text if isinstance(text, str) else text.decode("utf-8", "replace"),
                                                        cfg, size),
                                 import_launcher, text, cfg, base, files=sourced or None, main=main, keep_engine=keep)
    except LauncherImportError as exc:
        return await _refused(request, store, urlencode(page), "launcher", f"launcher: {exc}", 422, error_id=err)
    report = {**imported.report, "warnings": list(imported.warnings)}
    htmx = _is_htmx(request)
    return await render_page(request, "_main.html" if htmx else "index.html", imported.plan, [], store,
                             url_header="HX-Push-Url" if htmx else None, launcher=report,
                             extra_errors=tuple(imported.errors))


@router.get("/config/{model_id}")
def config_download(model_id: str, store: Store) -> Response:
    """The bytes of an uploaded config (``sha256:<hex>``), as the file the page's CLI line reads."""
    data = store.data(model_id)
    if data is None:   # isplan's error shape, as every 4xx
        return SafeJSONResponse(status_code=404, content={"valid": False, "errors": [
            {"code": "not_found", "message": f"unknown config {model_id[:80]!r}: upload it first", "field": "model"}]})
    return Response(data, media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{config_file_name(model_id)}"'})
