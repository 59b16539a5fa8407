"""The web app: ``uvicorn app.main:app`` (``make serve``).

A thin shell over :mod:`app.core`. The page URL holds the whole plan (query parameters named like
the CLI flags, see :mod:`app.web.plan_state`); ``/fragment`` answers the page's htmx updates with
the results block and out-of-band field messages; every view has a JSON twin under ``/api/v1/``
returning what the CLI's ``--format json`` prints. Bad input is a page with a message per field,
or a 4xx naming the field from the API: never a 500.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

import plotly
from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool
from pydantic import BaseModel

from app import __version__
from app.core.flops import flops_report
from app.core.launcher import LauncherError, launcher_request, parse_launcher
from app.core.layer_roles import ENGINES, PatternError, derive_roles, roles_report
from app.core.model_config import ConfigError, ModelConfig, load_manifest, load_preset, preset_ids
from app.core.optimiser import k_best_layouts, nearest_valid
from app.core.layer_costs import layer_costs
from app.core.parameters import count_parameters, per_rank_params
from app.core.plan_search import plan_report
from app.core.receipt import ReceiptError, build_receipt, verify_receipt
from app.core.search import search
from app.core.stages import LayoutInputError, parse_split
from app.web.assets import asset_dir
from app.web.figures import compute_figure, context_figure, memory_figure, schedule_figure
from app.web.plan_state import GPUS, PlanState, parse_state
from app.web.plan_state import error_fields as plan_fields
from app.web.store import ConfigStore
from app.web.view import PlanView, build_view, conversion_spec, resolve_model, spec_from_state

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
VENDOR = json.loads((asset_dir("static") / "vendor" / "VENDOR.json").read_text())
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")

class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate copied from hostile input cannot break
    encoding the answer (it would be a 500 with UTF-8 output)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


app = FastAPI(
    default_response_class=SafeJSONResponse,
    title="isplan",
    version=__version__,
    description="IndexShare layout planner: validate and plan pipeline layouts of GLM-5.2-class DSA models. "
                "Every endpoint returns the same JSON as the matching `isplan ... --format json` command.",
)
app.mount("/static", StaticFiles(directory=asset_dir("static")), name="static")
templates = Jinja2Templates(directory=str(asset_dir("templates")))
store = ConfigStore()


@app.middleware("http")
async def security_headers(request: Request, call_next):
    response = await call_next(request)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


from app.web.limits import BodySizeLimit  # request bodies: 2 MiB for uploads, 64 KiB elsewhere

app.add_middleware(BodySizeLimit)


class BadInput(ValueError):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@app.exception_handler(BadInput)
@app.exception_handler(ConfigError)
@app.exception_handler(LayoutInputError)
@app.exception_handler(PatternError)
@app.exception_handler(ReceiptError)
async def _bad_input(request: Request, exc: Exception) -> JSONResponse:
    return SafeJSONResponse(status_code=422, content={
        "valid": False,
        "errors": [{"code": "bad_input", "message": str(exc), "field": getattr(exc, "field", None)}],
    })


@app.exception_handler(RequestValidationError)
async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's own parameter validation, in the same shape as every other isplan 4xx."""
    errors = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "body", "path")]
        field = loc[-1] if loc else None
        errors.append({"code": "bad_input", "field": field,
                       "message": f"{field or 'request'}: {err.get('msg', 'invalid value')}"})
    return SafeJSONResponse(status_code=422, content={"valid": False, "errors": errors})


# --------------------------------------------------------------------------- helpers


def _model(model: str) -> ModelConfig:
    """A preset or an uploaded config (``sha256:<hex>``); a user string never reaches the filesystem."""
    if model in preset_ids():
        return load_preset(model)
    cfg = store.get(model)
    if cfg is None:
        raise BadInput(f"unknown model {model[:80]!r}; use a preset ({', '.join(preset_ids())}) or upload a "
                       "config (POST /upload) and use its sha256:... id", "model")
    return cfg


def _state(request: Request) -> PlanState:
    return parse_state(dict(request.query_params))


def _figures(v: PlanView) -> dict[str, Any]:
    figs: dict[str, Any] = {}
    if v.memory:
        figs["memory"] = memory_figure(v.memory)
    if v.flops:
        figs["compute"] = compute_figure(v.flops)
    if v.check is not None:
        figs["context"] = context_figure(v.cfg, v.check.roles, v.state.ctx)
    if v.par is not None and v.check is not None and v.check.plan.stages:
        from app.core.flops import bubble_fraction

        m = v.par.microbatches or 8 * v.check.plan.pp
        figs["schedule"] = schedule_figure(v.check.plan.pp, m, bubble_fraction(v.check.plan.pp, v.check.plan.vpp, m))
    return figs


def _context(request: Request, v: PlanView, **extra: Any) -> dict[str, Any]:
    _, presets = load_manifest()
    error_fields = plan_fields()
    return {"request": request, "v": v, "presets": presets, "preset_ids": preset_ids(), "engines": ENGINES,
            "gpus": GPUS, "figures": _figures(v), "error_fields": error_fields, "oob": False, **extra}


def _apply_action(state: PlanState, action: str | None) -> PlanState:
    """``balance``: the optimal valid layout (balanced objective) for the current PP x VPP;
    ``nearest``: the valid layout closest to the current stages."""
    if action not in ("balance", "nearest"):
        return state
    cfg, _ = resolve_model(state, store)  # the page's own resolver: an unknown model is a field message
    try:
        roles = derive_roles(cfg, state.engine, pattern=state.pattern)
        plan_spec = spec_from_state(state)
    except (PatternError, LayoutInputError) as exc:
        state.errors["split"] = f"{action}: {exc}"
        return state
    from app.core.stages import materialise

    plan = materialise(plan_spec, cfg.num_hidden_layers, default_mtp=cfg.num_nextn_predict_layers)
    pp, vpp = plan.pp, plan.vpp
    full = [r.role == "full" for r in roles.layers]
    if action == "balance":
        lc = layer_costs(cfg, roles, "balanced")
        best = k_best_layouts(list(lc.costs), full, pp, vpp, k=1, first_stage_extra=lc.first_stage_extra,
                              last_stage_extra=lc.last_stage_extra)
        split = best[0].split if best else None
    else:
        sizes = plan.sizes if plan.stages and sum(plan.sizes) == cfg.num_hidden_layers else None
        nv = nearest_valid(sizes, full, vpp) if sizes else None
        split = nv.split if nv else None
    if split is None:
        state.errors["split"] = f"{action}: no valid layout with {pp * vpp} stages for this model"
        return state
    state.mode, state.split, state.pp, state.vpp = "split", ",".join(map(str, split)), pp, vpp
    return state


# --------------------------------------------------------------------------- pages


@app.get("/", response_class=HTMLResponse, include_in_schema=False)
def index(request: Request) -> HTMLResponse:
    v = build_view(_state(request), store)
    return templates.TemplateResponse(request, "index.html", _context(request, v))


@app.get("/fragment", response_class=HTMLResponse, include_in_schema=False)
def fragment(request: Request, action: str | None = None) -> HTMLResponse:
    params = dict(request.query_params)
    params.pop("action", None)
    state = _apply_action(parse_state(params), action)
    v = build_view(state, store)
    resp = templates.TemplateResponse(request, "_results.html", _context(request, v, oob=True))
    resp.headers["HX-Replace-Url"] = "/?" + state.query()
    return resp


@app.post("/upload", include_in_schema=False)
async def upload(request: Request, file: UploadFile = File(...), query: str = Form("")) -> Response:
    data = await file.read()  # at most 2 MiB: BodySizeLimit refuses larger requests before they arrive
    try:
        cfg = await run_in_threadpool(store.put, data, name=file.filename)
    except ConfigError as exc:
        state = parse_state(dict(parse_qsl(query)))
        state.errors["model"] = f"upload {file.filename!r} refused: {exc}"
        v = build_view(state, store)
        return templates.TemplateResponse(request, "index.html", _context(request, v), status_code=422)
    params = dict(parse_qsl(query))
    params["model"] = cfg.id
    return RedirectResponse("/?" + urlencode(params), status_code=303)


@app.post("/launcher", include_in_schema=False)
async def launcher_form(request: Request, script: str = Form(""), model: str = Form("glm-5.2")) -> Response:
    try:
        cfg = _model(model)
        parsed = parse_launcher(script)
    except (BadInput, LauncherError, ConfigError) as exc:
        state = PlanState(model="glm-5.2", errors={"model": f"launcher: {exc}"})
        return templates.TemplateResponse(request, "index.html", _context(request, build_view(state, store)),
                                          status_code=422)
    req = launcher_request(parsed, cfg)
    spec = req.spec
    vals = parsed.values
    st = PlanState(model=model, pp=spec.pp or 1, first=spec.first, last=spec.last, vpp=spec.vpp or 1,
                   mtp=spec.mtp_layers, mode="layout" if spec.layout else "flags", layout=spec.layout)

    def num(flag: str) -> int | None:
        try:
            return parsed.int_value(flag)
        except ValueError:
            return None

    st.tp = num("--tensor-model-parallel-size") or 1
    st.cp = num("--context-parallel-size") or 1
    st.ep = num("--expert-model-parallel-size") or 1
    st.etp = num("--expert-tensor-parallel-size")
    st.mbs = num("--micro-batch-size") or 1
    st.seq = num("--seq-length")
    st.tpg = num("--max-tokens-per-gpu")
    st.sp = "--sequence-parallel" in parsed.switches
    st.offload = "--optimizer-cpu-offload" in parsed.switches
    if vals.get("--recompute-granularity") in ("full", "selective"):
        st.recompute = vals["--recompute-granularity"]
    nodes = num("--actor-num-nodes") or num("--nnodes")
    per = num("--actor-num-gpus-per-node") or num("--nproc-per-node") or num("--num-gpus-per-node")
    if nodes and per:
        st.gpus = nodes * per
    if req.unresolved:
        st.errors["pp"] = "launcher: " + "; ".join(req.unresolved)
        return templates.TemplateResponse(request, "index.html", _context(request, build_view(st, store)),
                                          status_code=422)
    return RedirectResponse("/?" + st.query(), status_code=303)


@app.get("/receipt", include_in_schema=False)
def receipt_download(request: Request) -> Response:
    body = _receipt_for(_state(request))
    return Response(json.dumps(body, indent=2), media_type="application/json",
                    headers={"Content-Disposition": 'attachment; filename="isplan-receipt.json"'})


@app.get("/assets/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


# --------------------------------------------------------------------------- JSON API


class ErrorItem(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    """Every 4xx from isplan: what is wrong and which field to fix."""

    valid: bool = False
    errors: list[ErrorItem]


#: declared on every JSON route: bad input is a 422 naming the field, an oversized body a 413
ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "bad input; the message names the field and the fix"},
    413: {"model": ErrorBody, "description": "request body over the size limit"},
}


class Health(BaseModel):
    status: Literal["ok"]
    version: str


@app.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok", version=__version__)


@app.get("/api/v1/about", responses=ERRORS)
def about() -> dict[str, Any]:
    """Versions of isplan and of the assets the page serves (htmx is vendored with its SHA-256)."""
    return {"isplan": __version__, "plotly": plotly.__version__, "htmx": VENDOR["htmx"],
            "presets": [p.__dict__ for p in load_manifest()[1]], "uploaded_configs": store.count()}


def _receipt_for(state: PlanState) -> dict[str, Any]:
    cfg = _model(state.model)
    layouts = [("training", spec_from_state(state), None, None, ())]
    conv = conversion_spec(state)
    if conv is not None:
        layouts.append(("conversion", conv, None, None, ()))
    return build_receipt(cfg, layouts, engine=state.engine, pattern=state.pattern)


def _strict_state(request: Request) -> PlanState:
    state = _state(request)
    if state.errors:
        field, message = next(iter(state.errors.items()))
        raise BadInput(message, field)
    return state


def _strict_view(request: Request) -> PlanView:
    """The view of the plan in the query; any field problem is a 422 naming the field."""
    v = build_view(_strict_state(request), store)
    if v.field_errors:
        field, message = next(iter(v.field_errors.items()))
        raise BadInput(message, field)
    return v


@app.get("/api/v1/plan", responses=ERRORS)
def api_plan(request: Request) -> dict[str, Any]:
    """The page's data for a plan URL (same query parameters as ``/``): the check (as
    ``isplan check --format json``), parallel checks, per-rank memory, per-stage FLOPs, exports."""
    v = _strict_view(request)
    state = v.state
    return {
        "state": state.to_dict(), "query": state.query(),
        "check": v.check.to_json() if v.check else None,
        "conversion": v.conversion.to_json() if v.conversion else None,
        "parallel": {"gpus": v.par.world if v.par else None, "expert_grid": v.par.expert_grid if v.par else None,
                     "checks": v.checks},
        "memory": v.memory, "stage_flops": v.flops, "exports": v.exports,
    }


@app.get("/api/v1/check", responses=ERRORS)
def api_check(request: Request) -> dict[str, Any]:
    """``isplan check --format json`` for the plan in the query (page parameters)."""
    v = _strict_view(request)
    if v.check is None:
        raise BadInput("no layout: give split=, pp= with first/last/vpp, or pp= with layout=", "split")
    return v.check.to_json()


@app.get("/api/v1/roles", responses=ERRORS)
def api_roles(model: str = "glm-5.2", engine: Literal["megatron", "slime", "hf"] = "megatron",
              pattern: str | None = Query(None, max_length=4096)) -> dict[str, Any]:
    """``isplan roles --format json``."""
    return roles_report(_model(model), engine, pattern=pattern)


@app.get("/api/v1/params", responses=ERRORS)
def api_params(model: str = "glm-5.2", engine: Literal["megatron", "slime", "hf"] = "megatron",
               pattern: str | None = Query(None, max_length=4096), split: str | None = Query(None, max_length=20000),
               vpp: int = Query(1, ge=1, le=16), tp: int = Query(1, ge=1, le=64), ep: int = Query(1, ge=1, le=4096),
               etp: int | None = Query(None, ge=1, le=64)) -> dict[str, Any]:
    """``isplan params --format json`` (per-rank counts when ``split`` is given)."""
    cfg = _model(model)
    roles = derive_roles(cfg, engine, pattern=pattern)
    body: dict[str, Any] = {"model": cfg.summary(), **count_parameters(cfg, roles).to_json()}
    body.pop("per_layer")
    if split:
        from app.core.stages import PipelineSpec, materialise

        plan = materialise(PipelineSpec(split=parse_split(split), vpp=vpp if vpp > 1 else None),
                           cfg.num_hidden_layers, default_mtp=cfg.num_nextn_predict_layers)
        if plan.errors:
            raise BadInput("; ".join(e.message for e in plan.errors), "split")
        body["stages"] = [{"pp_rank": r, "total": sp.total, "per_gpu": sp.per_gpu, "components": sp.components}
                          for r, sp in enumerate(per_rank_params(cfg, roles, plan, tp=tp, ep=ep, etp=etp))]
    return body


@app.get("/api/v1/memory", responses=ERRORS)
def api_memory(request: Request) -> dict[str, Any]:
    """``isplan memory --format json`` for the plan in the query (page parameters)."""
    v = _strict_view(request)
    if v.memory is None:
        raise BadInput("no memory estimate: the layout is not one Megatron accepts", "pp")
    return v.memory


@app.get("/api/v1/flops", responses=ERRORS)
def api_flops(model: str = "glm-5.2", context: int = Query(1_048_576, ge=1, le=1 << 24),
              pattern: str | None = Query(None, max_length=4096)) -> dict[str, Any]:
    """``isplan flops --format json``."""
    return flops_report(_model(model), context, pattern=pattern)


@app.get("/api/v1/plan-search", responses=ERRORS)
def api_plan_search(model: str = "glm-5.2", engine: Literal["megatron", "slime", "hf"] = "megatron",
                    pp: int = Query(8, ge=1, le=256), vpp: int = Query(1, ge=1, le=16),
                    objective: Literal["compute", "memory", "balanced"] = "balanced",
                    context: int = Query(4096, ge=1, le=1 << 24), top: int = Query(3, ge=0, le=100),
                    near: str | None = Query(None, max_length=20000)) -> dict[str, Any]:
    """``isplan plan --format json``: the optimal valid layout, alternatives, nearest valid."""
    cfg = _model(model)
    try:
        return plan_report(cfg, derive_roles(cfg, engine), pp=pp, vpp=vpp, objective=objective, context=context,
                           top=top, near=parse_split(near) if near else None)
    except ValueError as exc:
        raise BadInput(str(exc), "near" if "near" in str(exc) else "pp") from None


@app.get("/api/v1/search", responses=ERRORS)
def api_search(model: str = "glm-5.2", gpus: int = Query(256, ge=1, le=1 << 20),
               gpu: Literal["h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb"] = "h100-80gb",
               seq_length: int | None = Query(None, ge=1, le=1 << 24),
               tokens_per_gpu: int | None = Query(None, ge=1, le=1 << 24),
               top: int = Query(10, ge=0, le=100)) -> dict[str, Any]:
    """``isplan search --format json``: parallel configurations for a GPU budget."""
    return search(_model(model), gpus, gpu=gpu, seq_length=seq_length, tokens_per_gpu=tokens_per_gpu, top=top)


@app.get("/api/v1/receipt", responses=ERRORS)
def api_receipt(request: Request) -> dict[str, Any]:
    """``isplan receipt`` for the plan in the query (training + the conversion slot if set)."""
    return _receipt_for(_strict_state(request))


@app.post("/api/v1/verify", responses=ERRORS)
async def api_verify(request: Request) -> dict[str, Any]:
    """``isplan verify --format json``: POST a receipt (JSON body, at most 2 MiB: larger bodies get
    a 413 from :class:`app.web.limits.BodySizeLimit`)."""
    raw = await request.body()
    try:
        receipt = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise BadInput(f"the body is not JSON (a receipt is a JSON object): {str(exc)[:200]}", "receipt") from None
    cfg = None
    if isinstance(receipt, dict) and isinstance(receipt.get("model"), dict):
        mid = receipt["model"].get("id")
        if isinstance(mid, str) and mid.startswith("sha256:"):
            cfg = store.get(mid)
    return verify_receipt(receipt, config=cfg)


@app.get("/api/v1/timing", include_in_schema=False)
def timing(request: Request) -> dict[str, Any]:
    """Server time of one live update of the plan in the query (for benchmarks)."""
    t0 = time.perf_counter()
    v = build_view(_state(request), store)
    templates.get_template("_results.html").render(_context(request, v, oob=True))
    return {"seconds": time.perf_counter() - t0}


# Everything imported so far (FastAPI, Plotly, Jinja, the presets) lives for the whole process:
# move it out of the cyclic collector's view so a full collection during a live update stays
# cheap (it cut the p99 of a plan update by ~40% in bench/live_update.py).
for _preset in preset_ids():
    load_preset(_preset)
gc.collect()
gc.freeze()
