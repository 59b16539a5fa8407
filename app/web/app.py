"""The web app factory: ``create_app()`` wires the routers, the store, templates and middleware.

A thin shell over :mod:`app.core`: the page URL holds the whole plan (the plan table's URL keys),
``/fragment`` answers the page's live updates, and every command has a JSON twin under
``/api/v1`` returning what ``isplan <command> --format json`` prints. Bad input is a page with a
message per field, or a 422 naming the field from the API: never a 500.
"""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import plotly
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.gzip import GZipMiddleware

from app import __version__
from app.core.launcher_plan import LauncherImportError
from app.core.layer_roles import PatternError
from app.core.model_config import ConfigError, load_manifest, load_preset, preset_ids
from app.core.plan import GPUS, TABLE, PlanError
from app.core.receipt import ReceiptError
from app.core.stages import LayoutInputError
from app.web.assets import asset_dir
from app.web.caching import StaticCacheHeaders
from app.web.deps import BadInput
from app.web.figures import page_figures
from app.web.limits import BodySizeLimit
from app.web.routers import models_api, pages, plan_api, uploads
from app.web.schemas import Health
from app.web.store import ConfigStore
from app.web.view import PlanView

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"}


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate copied from hostile input cannot break
    encoding the answer (it would be a 500 with UTF-8 output)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error_body(errors: list[dict[str, Any]]) -> SafeJSONResponse:
    return SafeJSONResponse(status_code=422, content={"valid": False, "errors": errors})


async def _bad_input(request: Request, exc: Exception) -> Response:
    problems = getattr(exc, "problems", None)
    if problems:
        return _error_body([{"code": "bad_input", "message": p.message, "field": p.field} for p in problems])
    return _error_body([{"code": "bad_input", "message": str(exc), "field": getattr(exc, "field", None)}])


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


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Everything loaded at start-up lives for the whole process: move it out of the cyclic
    # collector's view so a full collection during a live update stays cheap (it cut the p99 of a
    # plan update by ~40% in bench/live_update.py).
    for preset in preset_ids():
        load_preset(preset)
    gc.collect()
    gc.freeze()
    yield


def create_app(store: ConfigStore | None = None) -> FastAPI:
    app = FastAPI(default_response_class=SafeJSONResponse, title="isplan", version=__version__, lifespan=lifespan,
                  description="IndexShare layout planner: validate and plan pipeline layouts of GLM-5.2-class DSA "
                              "models. Every endpoint returns the same JSON as the matching `isplan ... --format "
                              "json` command, with the plan's verdict.")
    templates = Jinja2Templates(directory=str(asset_dir("templates")))
    app.state.store = store if store is not None else ConfigStore()
    app.state.templates = templates
    app.state.plotly_js = PLOTLY_JS
    app.state.vendor = json.loads((asset_dir("static") / "vendor" / "VENDOR.json").read_text())

    def page_context(request: Request, v: PlanView, **extra: Any) -> dict[str, Any]:
        return {"request": request, "v": v, "presets": load_manifest()[1], "preset_ids": preset_ids(),
                "table": TABLE, "gpus": GPUS, "figures": page_figures(v), "oob": False, **extra}

    app.state.page_context = page_context
    app.mount("/static", StaticFiles(directory=asset_dir("static")), name="static")
    app.add_middleware(StaticCacheHeaders)  # versioned static files: cached for a year (app.web.caching)
    # text answers (HTML, JSON, JS, CSS) gzip-compressed when the client accepts it: the page's first
    # load is ~0.4 MB on the wire with its figures (bench/browser_timing.py measures it)
    app.add_middleware(GZipMiddleware, minimum_size=1024, compresslevel=6)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    app.add_middleware(BodySizeLimit)  # request bodies: 2 MiB for uploads, 64 KiB elsewhere
    for exc_type in (BadInput, ConfigError, LayoutInputError, PatternError, ReceiptError, PlanError,
                     LauncherImportError):
        app.add_exception_handler(exc_type, _bad_input)
    app.add_exception_handler(RequestValidationError, _invalid_request)

    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz() -> Health:
        return Health(status="ok", version=__version__)

    for router in (pages.router, uploads.router, plan_api.router, models_api.router):
        app.include_router(router)
    return app
