"""The models API: presets, roles, parameter counts and FLOPs of a model (``/api/v1``)."""

from __future__ import annotations

from typing import Annotated, Any

import plotly
from fastapi import APIRouter, Depends, Query, Request

from app import __version__
from app.core import reports
from app.core.layer_roles import Engine
from app.core.model_config import load_manifest
from app.core.plan import Plan
from app.web.deps import BadInput, PlanDep, Store, model_config
from app.web.schemas import ERRORS, About, Report

router = APIRouter(prefix="/api/v1", tags=["models"], responses=ERRORS)


def roles_plan(plan: PlanDep) -> Plan:
    """The plan, for routes that derive layer roles: those follow one of the engines of
    :class:`app.core.layer_roles.Engine` (Megatron, slime, HF); any other engine is a 422 naming
    ``engine`` (issue 9 schemathesis run: ``engine=vllm`` reached ``Engine(...)`` as a 500)."""
    known = [e.value for e in Engine]
    if plan.engine not in known:
        raise BadInput(f"engine {plan.engine!r}: layer roles, parameters and FLOPs follow the {', '.join(known)} "
                       f"rules; use engine={known[0]} (or {', '.join(known[1:])})", "engine")
    return plan


RolesPlan = Annotated[Plan, Depends(roles_plan)]


@router.get("/about", response_model=About)
def about(request: Request, store: Store) -> dict[str, Any]:
    """Versions of isplan and of the assets the page serves (htmx is vendored with its SHA-256)."""
    return {"isplan": __version__, "plotly": plotly.__version__, "htmx": request.app.state.vendor["htmx"],
            "presets": [p.__dict__ for p in load_manifest()[1]], "uploaded_configs": store.count()}


@router.get("/roles", response_model=Report)
def roles(plan: RolesPlan, store: Store) -> dict[str, Any]:
    """``isplan roles --format json``: per-layer roles, sources and engine disagreements."""
    return reports.roles_command_report(plan, model_config(plan.model, store)).body


@router.get("/params", response_model=Report)
def params(plan: RolesPlan, store: Store, per_layer: Annotated[bool, Query()] = False) -> dict[str, Any]:
    """``isplan params --format json``; per pipeline rank when the query gives a layout."""
    return reports.params_report(plan, model_config(plan.model, store), per_layer=per_layer,
                                 with_layout=plan.states_layout).body


@router.get("/flops", response_model=Report)
def flops(plan: RolesPlan, store: Store) -> dict[str, Any]:
    """``isplan flops --format json``: per-token FLOPs at ``ctx``; training FLOPs with ``gbs``."""
    return reports.flops_command_report(plan, model_config(plan.model, store)).body
