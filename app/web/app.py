"""The web app factory: ``create_app()`` wires the routers, the store, templates and middleware.

A thin shell over :mod:`app.core`: the page URL holds the whole plan (the plan table's URL keys),
``/fragment`` answers the page's live updates, and every command has a JSON twin under
``/api/v1`` returning what ``isplan <command> --format json`` prints. Bad input is a page with a
message per field, or a 422 naming the field from the API: never a 500.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import __version__
from app import settings as app_settings
from app.core.launcher import LauncherImportError
from app.core.layout.stages import LayoutInputError
from app.core.model.config import ConfigError, load_preset, preset_ids
from app.core.model.roles import PatternError
from app.core.plan import PlanError
from app.core.plan.bounds import BoundError
from app.core.receipt import ReceiptError
from app.web.assets import asset_dir
from app.web.caching import StaticCacheHeaders
from app.web.compression import GZip
from app.web.deps import BadInput, SafeJSONResponse
from app.web.limits import BodySizeLimit, UploadRate
from app.web.routers import models_api, pages, plan_api, uploads
from app.web.schemas import Health
from app.web.security import CSP, ASGIApp, secure, swagger_ui_html
from app.web.store import BaseStore, QuotaExceeded, StoreUnavailable, UploadForbidden, open_store
from app.web.workers import (
    ClientGate,
    ClientGone,
    TooBusy,
    TooMuchWork,
    WorkerLost,
    WorkTimeout,
    default_pool,
    shutdown_default_pool,
)

log = logging.getLogger("isplan.web")

#: The routes that run in the worker pool or parse an upload (``/fragment`` only with an
#: ``action``; ``/profile``, whose first call for a training model searches GPU budgets): at most
#: ``ISPLAN_WORK_PER_CLIENT`` in flight per client (:class:`ClientGate`).
EXPENSIVE_PATHS = ("/api/v1/plan-search", "/api/v1/search", "/api/v1/verify", "/launcher", "/upload",
                   "/fragment/search", "/fragment?action", "/profile")
#: The store's health probe runs here, never on the event loop nor in the request thread pool
#: (which busy requests can fill), so ``/healthz`` answers while the server is loaded; a cached
#: answer (``BaseStore.fresh_health``) is given on the loop.
_HEALTH_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isplan-health")


def _error_body(errors: list[dict[str, Any]]) -> SafeJSONResponse:
    return SafeJSONResponse(status_code=422, content={"valid": False, "errors": errors})


async def _bad_input(request: Request, exc: Exception) -> Response:
    problems = getattr(exc, "problems", None)
    if problems:
        return _error_body([{"code": "bad_input", "message": p.message, "field": p.field} for p in problems])
    return _error_body([{"code": "bad_input", "message": str(exc), "field": getattr(exc, "field", None)}])


def _status_error(status: int, code: str, field: str | None = None) -> Any:
    """A handler answering ``status`` with the exception's message in the usual error body."""

    async def handler(request: Request, exc: Exception) -> Response:
        headers = {"Retry-After": "2"} if status in (429, 503) else None
        return SafeJSONResponse(status_code=status, headers=headers, content={"valid": False, "errors": [
            {"code": code, "message": str(exc), "field": getattr(exc, "field", field)}]})

    return handler


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (404, 405, a malformed multipart body, ...) in isplan's error shape."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return SafeJSONResponse(status_code=exc.status_code, headers=exc.headers, content={"valid": False, "errors": [
        {"code": "not_found" if exc.status_code == 404 else "bad_request", "message": str(exc.detail)[:300],
         "field": None}]})


async def _forbidden(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, UploadForbidden)
    return await _status_error(exc.status_code, "upload_token", "token")(request, exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """Nobody reads this answer: one log line, no traceback."""
    log.info("client disconnected during %s %s; its work was stopped", request.method, request.url.path[:200])
    return Response(status_code=499)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug: the JSON every isplan error carries (the traceback goes to the server log)."""
    return SafeJSONResponse(status_code=500, content={"valid": False, "errors": [
        {"code": "internal_error", "message": "internal error; the server log has the details", "field": None}]})


async def _invalid_request(request: Request, exc: Exception) -> Response:
    """FastAPI's own parameter validation, in the same shape as every other isplan 4xx."""
    assert isinstance(exc, RequestValidationError)
    errors = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "body", "path", "_query")]
        field = loc[-1] if loc else None
        errors.append({"code": "bad_input", "field": field,
                       "message": f"{field or 'request'}: {err.get('msg', 'invalid value')}"})
    return _error_body(errors)


#: allocations (net of frees) between two young-generation collections in a server process
GC_YOUNG_THRESHOLD = 10_000


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Everything loaded at start-up lives for the whole process: move it out of the cyclic
    # collector's view so a full collection during a live update stays cheap (it cut the p99 of a
    # plan update by ~40% in bench/live_update.py).
    for preset in preset_ids():
        load_preset(preset)
    await default_pool().start()  # the worker processes of the expensive operations, started now
    gc.collect()
    gc.freeze()
    # A live update allocates ~10^4 short-lived containers (dicts, lists of the page data), almost
    # all freed by reference counting: at CPython's default threshold (700) a fragment ran ~1
    # young collection each, about 0.2 ms that found next to nothing; at 10,000 almost none
    # runs (fragment 2-5 % faster in process on 2026-12-03's machine). Cycles are still collected.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    try:
        yield
    finally:
        # the planner workers, the forkserver and its pymp-* directory: nothing left after a stop
        shutdown_default_pool()


class SecuredFastAPI(FastAPI):
    """FastAPI whose whole middleware stack, Starlette's error middleware included, is wrapped in
    :func:`app.web.security.secure`: security headers on every answer (413 and 500 included),
    ``HEAD`` wherever ``GET`` works, same-origin state-changing requests, JSON-only verify, and a
    body-read deadline (issue 9)."""

    def build_middleware_stack(self) -> ASGIApp:  # type: ignore[override]
        s = app_settings.current()
        return secure(cast(ASGIApp, super().build_middleware_stack()), csp=CSP, body_seconds=s.body_seconds,
                      allowed_origins=s.allowed_origins, json_only=("/api/v1/verify",),
                      allowed_hosts=s.allowed_hosts)


def create_app(store: BaseStore | None = None) -> FastAPI:
    """The app; its store is ``store``, else :func:`app.web.store.open_store` (PostgreSQL when
    ``ISPLAN_DATABASE_URL`` is set, else SQLite in ``ISPLAN_DATA_DIR``)."""
    app = SecuredFastAPI(default_response_class=SafeJSONResponse, title="isplan", version=__version__,
                  lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="IndexShare layout planner: validate and plan pipeline layouts of GLM-5.2-class DSA "
                              "models. Every endpoint returns the same JSON as the matching `isplan ... --format "
                              "json` command, with the plan's verdict.")
    app.state.store = store if store is not None else open_store()
    app.state.templates = pages.templates()
    app.state.vendor = json.loads((asset_dir("static") / "vendor" / "VENDOR.json").read_text())
    app.state.page_context = pages.page_context
    app.mount("/static", StaticFiles(directory=asset_dir("static")), name="static")
    app.add_middleware(StaticCacheHeaders)  # versioned static files: cached for a year (app.web.caching)
    # text answers (HTML, JSON, JS, CSS) gzip-compressed when the client accepts it: the page's first
    # load is ~0.5 MB on the wire with its figures (bench/browser_timing.py measures it). Level 1 in
    # ISA-L (app.web.compression): a live update's 61 KB fragment in 0.10 ms (12.4 KB), where zlib's
    # level 1 took 0.8 ms (12.5 KB) and its level 6 1.9 ms (10.9 KB)
    app.add_middleware(GZip, minimum_size=1024, compresslevel=1)

    app.add_middleware(BodySizeLimit)  # request bodies: 2 MiB for uploads, 64 KiB elsewhere
    app.add_middleware(UploadRate)  # upload bytes per client and minute, refused ones included (429)
    app.add_middleware(ClientGate, paths=EXPENSIVE_PATHS)  # before any parsing: 429 beyond a client's share
    for exc_type in (BadInput, ConfigError, LayoutInputError, PatternError, ReceiptError, PlanError,
                     LauncherImportError, TooMuchWork, BoundError):
        app.add_exception_handler(exc_type, _bad_input)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(QuotaExceeded, _status_error(413, "quota_exceeded", "file"))
    app.add_exception_handler(StoreUnavailable, _status_error(503, "store_unavailable"))
    app.add_exception_handler(UploadForbidden, _forbidden)
    app.add_exception_handler(TooBusy, _status_error(429, "too_busy"))
    app.add_exception_handler(WorkTimeout, _status_error(503, "timeout"))
    app.add_exception_handler(WorkerLost, _status_error(503, "worker_lost"))
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(Exception, _internal_error)

    @app.get("/healthz", response_model=Health, tags=["health"],
             responses={503: {"description": "the upload store cannot write; the body says why"}})
    async def healthz() -> Response:
        """``ok`` while the upload store can write (a probe row, enough free disk), else 503."""
        store = app.state.store
        store_health = store.fresh_health() or await asyncio.get_running_loop().run_in_executor(_HEALTH_THREAD,
                                                                                                 store.health)
        ok = bool(store_health.get("ok"))
        return SafeJSONResponse(status_code=200 if ok else 503, content={
            "status": "ok" if ok else "unavailable", "version": __version__, "store": store_health})

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        """The API documentation on the vendored Swagger UI (no CDN: it works under the CSP)."""
        return HTMLResponse(swagger_ui_html(app.openapi_url or "/openapi.json"))

    for router in (pages.router, uploads.router, plan_api.router, models_api.router):
        app.include_router(router)
    return app
