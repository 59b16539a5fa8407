"""The models API: presets, roles, parameter counts and FLOPs of a model (``/api/v1``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app import __version__
from app.core import reports
from app.core.model.config import load_manifest
from app.web.deps import PLAN_QUERY_OPENAPI, PlanDep, Store, model_config
from app.web.schemas import ERRORS, About, Report

router = APIRouter(prefix="/api/v1", tags=["models"], responses=ERRORS)


@router.get("/about", response_model=About)
def about(request: Request, store: Store) -> dict[str, Any]:
    """Versions of isplan and of the assets the page serves (vendored, each with its SHA-256)."""
    vendor = request.app.state.vendor
    return {"isplan": __version__, "plotly": vendor["plotly"], "swagger_ui": vendor["swagger-ui"]["version"],
            "presets": [p.__dict__ for p in load_manifest()[1]], "uploaded_configs": store.count()}


@router.get("/roles", response_model=Report, openapi_extra=PLAN_QUERY_OPENAPI)
def roles(plan: PlanDep, store: Store) -> dict[str, Any]:
    """``isplan roles --format json``: per-layer roles, sources and engine disagreements."""
    return reports.roles_command_report(plan, model_config(plan.model, store)).body


@router.get("/params", response_model=Report, openapi_extra=PLAN_QUERY_OPENAPI)
def params(plan: PlanDep, store: Store, per_layer: Annotated[bool, Query()] = False) -> dict[str, Any]:
    """``isplan params --format json``; per pipeline rank when the query gives a layout."""
    return reports.params_report(plan, model_config(plan.model, store), per_layer=per_layer,
                                 with_layout=plan.states_layout).body


@router.get("/flops", response_model=Report, openapi_extra=PLAN_QUERY_OPENAPI)
def flops(plan: PlanDep, store: Store) -> dict[str, Any]:
    """``isplan flops --format json``: per-token FLOPs at ``ctx``; training FLOPs with ``gbs``."""
    return reports.flops_command_report(plan, model_config(plan.model, store)).body
