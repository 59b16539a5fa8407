"""Typed request and response models of the JSON API.

:class:`PlanQuery` is generated from the plan table (:data:`app.core.plan.TABLE`): one query
parameter per plan field, with its URL key, type, bounds and help, so OpenAPI publishes exactly
what the page URL and the CLI accept. Parsing itself is :func:`app.core.plan.strict_plan` (the
same bounds; this model only documents and pre-validates).

Response models type the top level of every report (``verdict`` always) and let the report's
other keys through: each report's full shape is the CLI's ``--format json`` (docs/DESIGN.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from app.core.plan import TABLE
from app.core.plan import Field as PlanField
from app.core.verdict import KINDS


def _query_field(spec: PlanField) -> tuple[Any, Any]:
    """(type, pydantic Field) for one plan field as a query parameter (text, like a URL holds it)."""
    desc = spec.help + (f" ({spec.bounds_text()})" if spec.bounds_text() else "")
    kw: dict[str, Any] = {"default": None, "alias": spec.url, "description": desc}
    if spec.kind == "int":
        return int | None, Field(ge=spec.lo, le=spec.hi, **kw)
    if spec.kind == "float":
        return float | None, Field(ge=spec.lo, le=spec.hi, allow_inf_nan=False, **kw)
    if spec.kind == "choice":
        return Literal[spec.choices] | None, Field(**kw)
    if spec.kind == "bool":
        return Literal["0", "1", "true", "false", "on", "off"] | None, Field(**kw)
    if spec.kind == "sizes":
        return str | None, Field(max_length=spec.max_len, pattern=r"^[0-9 ,+-]*$", **kw)
    return str | None, Field(max_length=spec.max_len, **kw)


PlanQuery: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "PlanQuery",
    __config__=ConfigDict(populate_by_name=False, extra="ignore"),
    **{name: _query_field(spec) for name, spec in TABLE.items()},
)
PlanQuery.__doc__ = "Every plan setting, by its URL key (the page URL, the share URL and the API use the same keys)."


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


class ReasonModel(BaseModel):
    kind: Literal[KINDS]  # type: ignore[valid-type]
    code: str
    message: str
    field: str | None = None


class WarningModel(BaseModel):
    kind: str
    code: str
    message: str
    field: str | None = None


class VerdictModel(BaseModel):
    """go / no-go; every blocking reason with its kind and the plan field (URL key) to change."""

    go: bool
    blocking: list[ReasonModel]
    warnings: list[WarningModel]
    judged: list[Literal["layout", "parallelism", "memory"]]


class Report(BaseModel):
    """A command's report: the same object as ``isplan <command> --format json``."""

    model_config = ConfigDict(extra="allow")
    verdict: VerdictModel


class CheckReport(Report):
    """``isplan check --format json``: ``valid`` is the layout verdict (boundary + acceptance)."""

    valid: bool
    model: dict[str, Any]
    stages: list[dict[str, Any]]
    violations: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    megatron_flags: list[str]
    layout_string: str


class ReceiptReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    valid: bool
    body_sha256: str


class VerifyReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    ok: bool
    summary: str
    differences: list[str]


class PlanPage(BaseModel):
    """The page's whole data for a plan URL: the plan, its verdict and every panel."""

    model_config = ConfigDict(extra="allow")
    plan: dict[str, Any]
    query: str
    verdict: VerdictModel
    check: dict[str, Any] | None
    conversion: dict[str, Any] | None
    parallel: dict[str, Any] | None
    memory: dict[str, Any] | None
    stage_flops: dict[str, Any] | None
    exports: dict[str, str]


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class About(BaseModel):
    model_config = ConfigDict(extra="allow")
    isplan: str
    plotly: dict[str, Any]
    swagger_ui: str
    presets: list[dict[str, Any]]
