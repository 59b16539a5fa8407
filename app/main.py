"""The web shell: ``uvicorn app.main:app``.

A thin layer over :mod:`app.core`: every route parses its parameters (named like the CLI flags),
calls the core and returns the same JSON as ``isplan ... --format json``. Bad input is a 4xx with a
message naming the field, never a 500.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app import __version__
from app.core.layer_roles import PatternError, roles_report
from app.core.layout_check import run_check
from app.core.model_config import DEFAULT_PRESET, ConfigError, ModelConfig, load_preset, preset_ids
from app.core.stages import LayoutInputError, PipelineSpec, parse_split

app = FastAPI(
    title="isplan",
    version=__version__,
    description="IndexShare layout planner: validate pipeline layouts of GLM-5.2-class DSA models.",
)


@app.exception_handler(ConfigError)
@app.exception_handler(LayoutInputError)
@app.exception_handler(PatternError)
async def _bad_input(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=422, content={
        "valid": False,
        "errors": [{"code": "bad_input", "message": str(exc), "field": getattr(exc, "field", None)}],
    })


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


def _spec(split: str | None, pp: int | None, first: int | None, last: int | None, vpp: int | None,
          layout: str | None, mtp: int | None) -> PipelineSpec:
    if split is not None:
        return PipelineSpec(pp=pp, vpp=vpp, split=parse_split(split), mtp_layers=mtp)
    if pp is None:
        raise LayoutInputError("give a layout: split=LIST, or pp=N with first/last/vpp, or pp=N with layout=STR")
    return PipelineSpec(pp=pp, first=first, last=last, vpp=vpp, layout=layout, mtp_layers=mtp)


@app.get("/api/v1/check")
def api_check(
    model: str = DEFAULT_PRESET,
    engine: Literal["megatron", "slime", "hf"] = "megatron",
    pattern: str | None = None,
    split: str | None = None,
    pp: int | None = Query(None, ge=1, le=4096),
    first: int | None = None,
    last: int | None = None,
    vpp: int | None = Query(None, ge=1, le=4096),
    layout: str | None = Query(None, max_length=100_000),
    mtp: int | None = Query(None, ge=0, le=64),
) -> dict[str, Any]:
    """Materialise and validate a layout; the body of ``isplan check --format json``."""
    cfg = _model(model)
    return run_check(cfg, _spec(split, pp, first, last, vpp, layout, mtp), engine, pattern=pattern).to_json()


@app.get("/api/v1/roles")
def api_roles(
    model: str = DEFAULT_PRESET,
    engine: Literal["megatron", "slime", "hf"] = "megatron",
    pattern: str | None = None,
) -> dict[str, Any]:
    """Per-layer roles and disagreements; the body of ``isplan roles --format json``."""
    cfg = _model(model)
    return roles_report(cfg, engine, pattern=pattern)


def _model(model: str) -> ModelConfig:
    """Presets only: a user-supplied string never reaches the filesystem."""
    if model not in preset_ids():
        raise ConfigError(f"unknown model {model[:80]!r}; presets: {', '.join(preset_ids())}", "model")
    return load_preset(model)


@app.get("/", response_class=HTMLResponse)
def index() -> str:
    result = run_check(load_preset(DEFAULT_PRESET), PipelineSpec(pp=8, first=14, last=16))
    rows = "\n".join(f"<li>{line}</li>" for line in result.text_lines())
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>isplan</title></head>"
        f"<body><h1>isplan {__version__}</h1><p>GLM-5.2, slime PP8 training profile:</p><ul>{rows}</ul>"
        '<p>JSON API: <a href="/docs">/docs</a></p></body></html>'
    )
