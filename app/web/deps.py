"""FastAPI dependencies shared by the routers: the config store, the model and the plan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from app.core.model_config import ModelConfig, load_preset, preset_ids
from app.core.plan import Plan, strict_plan
from app.web.schemas import PlanQuery
from app.web.store import ConfigStore


class BadInput(ValueError):
    """A 422 naming the field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def get_store(request: Request) -> ConfigStore:
    store: ConfigStore = request.app.state.store
    return store


Store = Annotated[ConfigStore, Depends(get_store)]


def model_config(model: str, store: ConfigStore) -> ModelConfig:
    """A preset or an uploaded config (``sha256:<hex>``); a user string never reaches the filesystem."""
    if model in preset_ids():
        return load_preset(model)
    cfg = store.get(model)
    if cfg is None:
        raise BadInput(f"unknown model {model[:80]!r}; use a preset ({', '.join(preset_ids())}) or upload a "
                       "config (POST /upload) and use its sha256:... id", "model")
    return cfg


def get_plan(request: Request, _query: Annotated[PlanQuery, Query()]) -> Plan:  # type: ignore[valid-type]
    """The plan in the query string, parsed strictly (any field problem is a 422 naming it).

    ``_query`` is the generated model: it publishes every plan field in OpenAPI and pre-validates;
    the plan itself comes from :func:`app.core.plan.strict_plan`, the one parser of a plan."""
    return strict_plan(request.query_params)


PlanDep = Annotated[Plan, Depends(get_plan)]
