"""The plan API: every command that evaluates a plan, as ``GET /api/v1/<command>?<plan query>``.

Each route returns the report of :mod:`app.core.reports` - the same object as
``isplan <command> --format json`` for the same plan (tests/verdict/test_twins.py) - with its verdict.

The routes that evaluate one plan are ``async`` and return their JSON serialised once
(:class:`app.web.deps.SafeJSONResponse`): no thread hop and no second validation of a 30 KB body
through the response model, which still documents it in OpenAPI (issue 17). A plan of a huge
model is evaluated in the worker pool instead (:func:`app.web.deps.in_process_or_pool`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from app.core import reports
from app.core.engines import DEFAULT_PLAN, ignored_fields
from app.core.plan import parse_sizes, strict_plan
from app.core.plan.bounds import MAX_GPUS, MAX_PLAN_TEXT, MAX_TOP
from app.core.receipt import ReceiptError, load_receipt_bytes, verify_receipt
from app.web.deps import (
    PLAN_QUERY_OPENAPI,
    BadInput,
    PlanDep,
    SafeJSONResponse,
    Store,
    bounded,
    get_plan,
    get_store,
    in_process_or_pool,
    model_config,
    model_for,
    plan_search_cost,
    plan_units,
    report_body,
    search_cost,
    time_cost,
    verify_cost,
)
from app.web.schemas import ERRORS, CheckReport, ErrorBody, PlanPage, ReceiptReport, Report, VerifyReport
from app.web.view import page_data

router = APIRouter(prefix="/api/v1", tags=["plan"], responses=ERRORS)

#: What a route that runs in the worker pool may answer besides its report (app.web.workers).
BOUNDED: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorBody, "description": "this client already has its share of expensive requests running, "
                                             "or the queue is full; retry shortly"},
    503: {"model": ErrorBody, "description": "the request did not finish within the deadline and was stopped"},
}
#: POST /api/v1/verify also refuses a cross-site request and a body that is not JSON.
VERIFY: dict[int | str, dict[str, Any]] = {
    **BOUNDED,
    403: {"model": ErrorBody, "description": "a cross-site request (Origin / Sec-Fetch-Site)"},
    408: {"model": ErrorBody, "description": "the body did not arrive within the deadline"},
    415: {"model": ErrorBody, "description": "the body must be sent as Content-Type: application/json"},
}


#: What a route that evaluates one plan may answer besides its report: a huge plan runs in the pool.
EVALUATED: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorBody, "description": "a plan of a huge model runs in the worker pool, and this client "
                                             "already has its share of it running; retry shortly"},
    503: {"model": ErrorBody, "description": "a plan of a huge model did not finish within the deadline"},
}


async def _report(request: Request, fn: Any) -> Response:
    """``fn(plan, cfg).body`` of the query's plan as JSON, evaluated here or (a huge plan) in the
    pool. The hot routes take no FastAPI dependencies: resolving them cost a tenth of a request."""
    plan = get_plan(request)
    cfg = await model_for(plan.model, get_store(request))
    body = await in_process_or_pool(request, plan_units(plan, cfg), report_body, fn, plan, cfg)
    return SafeJSONResponse(body)


@router.get("/plan", response_model=PlanPage, responses=EVALUATED, openapi_extra=PLAN_QUERY_OPENAPI)
async def plan_page(request: Request) -> Response:
    """The page's whole data for a plan URL (same query as ``/``; an empty query is the page's
    pinned slime GLM-5.2 profile): the plan, its verdict, the check, the conversion slot,
    parallelism, per-rank memory, per-stage FLOPs and the exports."""
    plan = strict_plan(request.query_params, empty=DEFAULT_PLAN, ignored=ignored_fields)
    cfg = await model_for(plan.model, get_store(request))  # an unknown model is a 422 here, not a fallback
    return SafeJSONResponse(await in_process_or_pool(request, plan_units(plan, cfg), page_data, plan, cfg))


@router.get("/check", response_model=CheckReport, responses=EVALUATED, openapi_extra=PLAN_QUERY_OPENAPI)
async def check(request: Request) -> Response:
    """``isplan check --format json``: stages, boundary, acceptance and the plan's verdict (with
    GPUs, parallel constraints and memory when the query states any parallel/memory setting)."""
    return await _report(request, reports.check_report)


@router.get("/memory", response_model=Report, responses=EVALUATED, openapi_extra=PLAN_QUERY_OPENAPI)
async def memory(request: Request) -> Response:
    """``isplan memory --format json``: training memory per GPU of every pipeline rank."""
    return await _report(request, reports.memory_report)


@router.get("/time", response_model=Report, responses=BOUNDED, openapi_extra=PLAN_QUERY_OPENAPI)
async def time(request: Request, plan: PlanDep, store: Store, timeline: bool = False) -> Response:
    """``isplan time --format json``: how fast the plan trains - ``time: {step_seconds,
    tokens_per_second_per_gpu, model_tflops_per_gpu, mfu, bubble_fraction, breakdown, per_stage}``
    with the verdict (``timeline=1`` adds the simulated schedule). Run in the worker pool."""
    cfg = await run_in_threadpool(model_config, plan.model, store)
    body: dict[str, Any] = await bounded(request, time_cost(plan, cfg), report_body, reports.time_report, plan, cfg,
                                         timeline=timeline)
    return SafeJSONResponse(body)


@router.get("/receipt", response_model=ReceiptReport, responses=EVALUATED, openapi_extra=PLAN_QUERY_OPENAPI)
async def receipt(request: Request) -> Response:
    """``isplan receipt``: a verifiable record of the plan's layouts (training + conversion slot)."""
    return await _report(request, reports.receipt_report)


@router.get("/plan-search", response_model=Report, responses=BOUNDED, openapi_extra=PLAN_QUERY_OPENAPI)
async def plan_search(request: Request, plan: PlanDep, store: Store,
                      objective: Literal["compute", "memory", "balanced", "time"] = "balanced",
                      top: Annotated[int, Query(ge=0, le=MAX_TOP)] = 3,
                      near: Annotated[str | None, Query(max_length=MAX_PLAN_TEXT)] = None) -> Response:
    """``isplan plan --format json``: the optimal valid layout for ``pp`` x ``vpp``, the next best
    ones and, with ``near``, the valid layout closest to a split. Refused (422) beyond the work
    budget; run in the worker pool (429 when this client already has its share running)."""
    try:
        near_sizes = parse_sizes(near, "near") if near is not None else None
    except ValueError as exc:
        raise BadInput(str(exc), "near") from None
    cfg = await run_in_threadpool(model_config, plan.model, store)
    body: dict[str, Any] = await bounded(request, plan_search_cost(plan, cfg, top), report_body,
                                         reports.plan_search_report, plan, cfg,
                                         objective=objective, top=top, near=near_sizes)
    return SafeJSONResponse(body)


@router.get("/search", response_model=Report, responses=BOUNDED, openapi_extra=PLAN_QUERY_OPENAPI)
async def search(request: Request, plan: PlanDep, store: Store,
                 top: Annotated[int, Query(ge=0, le=MAX_TOP)] = 10, pareto: bool = False) -> Response:
    """``isplan search --format json``: parallel configurations for the GPU budget ``gpus``.
    Refused (422) beyond the work budget; run in the worker pool."""
    if plan.gpus is None:
        raise BadInput(f"give gpus=N (1 to {MAX_GPUS:,}): the GPU budget to search", "gpus")
    cfg = await run_in_threadpool(model_config, plan.model, store)
    cost = search_cost(plan, cfg, plan.gpus, top)
    if pareto:   # the budget and each smaller power of two: at most twice the budget's own work
        cost = replace(cost, estimate=2 * cost.estimate)
    body: dict[str, Any] = await bounded(request, cost, report_body, reports.search_report, plan, cfg,
                                         gpus=plan.gpus, top=top, pareto=pareto)
    return SafeJSONResponse(body)


@router.post("/verify", response_model=VerifyReport, responses=VERIFY, openapi_extra={"requestBody": {
    "required": True, "description": "the receipt (from GET /api/v1/receipt or isplan receipt)",
    "content": {"application/json": {"schema": {"type": "object"}}}}})
async def verify(request: Request, store: Store) -> Response:
    """``isplan verify --format json``: POST a receipt (``Content-Type: application/json``, at most
    2 MiB and 64 levels deep). The config is a preset or an uploaded ``sha256:`` config; a receipt
    never names a path on the server."""
    try:
        body = load_receipt_bytes(await request.body())
    except ReceiptError as exc:
        raise BadInput(str(exc), "receipt") from None
    cfg = None
    if isinstance(body, dict) and isinstance(body.get("model"), dict):
        mid = body["model"].get("id")
        if isinstance(mid, str) and mid.startswith("sha256:"):
            cfg = await run_in_threadpool(store.get, mid)
    result: dict[str, Any] = await bounded(request, verify_cost(body, cfg), verify_receipt, body, config=cfg)
    return SafeJSONResponse(result)
