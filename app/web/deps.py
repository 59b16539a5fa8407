"""FastAPI dependencies shared by the routers: the config store, the model, the plan, and the
bounded run of an expensive operation (issue 9).

Expensive operations (plan-search, search, verify, the launcher import, Balance / Nearest valid)
never run in the server process: :func:`bounded` first checks the operation's cost estimate
(:mod:`app.web.workers`) against the work budget - a :class:`~app.web.workers.TooMuchWork` 422
naming the limit and the field to change - then runs it in the worker pool with a deadline, a
per-client limit, and cancellation when the client disconnects.

Evaluating one plan (the page, ``/api/v1/plan``, ``check``, ``memory``, ``receipt``) is cheap for
every published model - about a millisecond for GLM-5.2 - and is done on the event loop, with
no thread hop (issue 17: the web layer cost more than the evaluation). A plan of a huge model is
not: a 4,096-layer upload split into 4,096 stages took 0.4 s to evaluate and 1.5 s to render as
a 4.5 MB page (issue 20, finding 2). :func:`plan_units` is the size that decides, one rule for
every route: at most :data:`INLINE_UNITS` in the server process, anything larger in the pool
(:func:`in_process_or_pool`), where it is gated per client and bounded by the deadline.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic_core import PydanticSerializationError, to_json
from starlette.concurrency import run_in_threadpool

from app.core.model.config import ModelConfig, load_preset, preset_ids
from app.core.plan import Plan, PlanError, bounds, strict_plan
from app.web.schemas import PlanQuery
from app.web.store import BaseStore
from app.web.workers import (
    WorkBudget,
    estimate_nearest_work,
    estimate_optimiser_work,
    estimate_search_work,
    estimate_verify_work,
    run_bounded,
)

#: Plans of at most this many units (:func:`plan_units`) are evaluated in the server process:
#: GLM-5.2 with 8 stages is 86 (about 1 ms to evaluate, 3 ms to render the page); 512 is about
#: 5-10 ms. Larger plans go to the worker pool.
INLINE_UNITS = 512


def _json_escape(err: UnicodeError) -> tuple[str, int]:
    """The ``"isplan-json-escape"`` codec error handler: every character ASCII cannot hold as
    JSON's ``\\uXXXX`` escape (a surrogate pair above U+FFFF), so ``text.encode("ascii",
    "isplan-json-escape")`` of a JSON text is the same JSON value in ASCII. Valid only for JSON
    text: outside a string a JSON text holds ASCII alone, so only string contents get escaped."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out = []
    for ch in err.object[err.start:err.end]:
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), err.end


codecs.register_error("isplan-json-escape", _json_escape)


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate copied from hostile input cannot break
    encoding the answer (it would be a 500 with UTF-8 output). Routes return one to have their
    body serialised exactly once (a ``response_model`` still documents it in OpenAPI; FastAPI
    does not validate a ``Response`` again)."""

    def render(self, content: Any) -> bytes:
        """The body in pydantic-core's JSON encoder (already installed with FastAPI; 2.5-3x faster
        than :mod:`json` on the 40-115 KB plan bodies), else :func:`json_body`: a lone surrogate,
        which pydantic-core cannot encode, and a NaN or infinity, which it writes and JSON has not
        (:func:`json_body` refuses it, as before; ``NaN`` inside a string just takes the slow path).
        The JSON value is the same, the text differs only in small floats' spelling (``1e-7`` for
        ``1e-07``, ``0.00008`` for ``8e-05``). Dict keys are strings or numbers in every body (a
        ``None`` key would read ``"None"`` here, ``"null"`` in :mod:`json`). Non-ASCII (the plan
        page's messages carry a few ``×``) is escaped by re-encoding the UTF-8 text to ASCII with
        :func:`_json_escape`: 0.05 ms on a 42 KB plan body, where encoding it again with
        ``ensure_ascii`` cost 0.2 ms."""
        try:
            body = to_json(content, inf_nan_mode="constants")
        except PydanticSerializationError:
            return json_body(content)
        if _holds(body, b"NaN") or _holds(body, b"Infinity"):
            return json_body(content)
        if not body.isascii():
            body = body.decode("utf-8").encode("ascii", "isplan-json-escape")
        return body


def _holds(body: bytes, token: bytes) -> bool:
    """``token in body``, found from its first byte: ``bytes.find`` of one byte is a ``memchr``, a
    tenth of the substring search on a 42 KB plan body, where ``N`` and ``I`` occur about ten times
    each (a body with many candidates gets the substring search)."""
    first = token[:1]
    i = body.find(first)
    for _ in range(64):
        if i < 0:
            return False
        if body.startswith(token, i):
            return True
        i = body.find(first, i + 1)
    return token in body


def json_body(content: Any) -> bytes:
    """``content`` as ASCII JSON with :mod:`json`: non-ASCII (and a lone surrogate) escaped, NaN and
    infinities refused (``ValueError``), compact separators."""
    return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class BadInput(ValueError):
    """A 422 naming the field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def get_store(request: Request) -> BaseStore:
    store: BaseStore = request.app.state.store
    return store


Store = Annotated[BaseStore, Depends(get_store)]


def model_config(model: str, store: BaseStore) -> ModelConfig:
    """A preset or an uploaded config (``sha256:<hex>``); a user string never reaches the filesystem."""
    if model in preset_ids():
        return load_preset(model)
    cfg = store.get(model)
    if cfg is None:
        raise BadInput(f"unknown model {model[:80]!r}; use a preset ({', '.join(preset_ids())}) or upload a "
                       "config (POST /upload) and use its sha256:... id", "model")
    return cfg


async def model_for(model: str, store: BaseStore) -> ModelConfig:
    """:func:`model_config` without a thread hop for a preset (no I/O); an upload is read in the
    request thread pool (the store may be PostgreSQL, a network round trip)."""
    if model in preset_ids():
        return load_preset(model)
    return await run_in_threadpool(model_config, model, store)


def get_plan(request: Request) -> Plan:
    """The plan in the query string, parsed strictly by :func:`app.core.plan.strict_plan`, the
    one parser of a plan (any field problem is a 422 naming it; a setting the plan's engine does
    not read is one too). Routes publish the plan fields in OpenAPI with
    ``openapi_extra=PLAN_QUERY_OPENAPI`` (generated from :class:`app.web.schemas.PlanQuery`):
    having FastAPI validate that 60-field model on every request cost more than evaluating
    GLM-5.2's plan (issue 17)."""
    from app.core.engines import ignored_fields

    return strict_plan(request.query_params, ignored=ignored_fields, allowed=route_parameters(request))


def route_parameters(request: Request) -> tuple[str, ...]:
    """The query parameters the request's route declares itself (``top``, ``pareto``, ``timeline``
    ...): besides the plan's fields, the only keys a strict route accepts."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    names: list[str] = []
    todo = [dependant] if dependant is not None else []
    while todo:
        dep = todo.pop()
        names += [param.alias for param in dep.query_params]
        todo += dep.dependencies
    return tuple(names)


PlanDep = Annotated[Plan, Depends(get_plan)]


def _plan_query_parameters() -> list[dict[str, Any]]:
    """OpenAPI query parameters of every plan field: what FastAPI generates from ``PlanQuery``."""
    schema = PlanQuery.model_json_schema()
    out = []
    for name, prop in schema["properties"].items():
        param: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": prop}
        if "description" in prop:
            param["description"] = prop["description"]
        out.append(param)
    return out


#: ``openapi_extra`` of every route that reads a plan from its query string.
PLAN_QUERY_OPENAPI: dict[str, Any] = {"parameters": _plan_query_parameters()}


# --------------------------------------------------------------------------- how big a plan is


def _layout_stages(layout: str | None) -> int:
    from app.core.layout.pipeline_layout import parse_layout

    try:
        return len(parse_layout(layout or ""))
    except ValueError:
        return 0  # the evaluation refuses it at once


def plan_units(plan: Plan, cfg: ModelConfig) -> int:
    """The size of evaluating and showing ``plan``: layers plus stages (every rule the evaluation
    runs is linear in them: roles, placement, the boundary check, per-rank memory, per-stage
    FLOPs), the conversion slot's stages included."""
    stages = max(len(plan.split or ()), plan.pp * (plan.vpp or 1),
                 cfg.num_hidden_layers if plan.layers_per_vstage else 0,
                 _layout_stages(plan.layout) if plan.layout else 0,
                 # a MaxText pipeline: stages x repeats slots, at most one per layer
                 cfg.num_hidden_layers if plan.ici_pipeline_parallelism * plan.dcn_pipeline_parallelism > 1 else 0)
    conv = max(len(plan.conv_split or ()), plan.conv_pp or 0)
    return cfg.num_hidden_layers + (plan.mtp_layers or 0) + stages + conv


async def in_process_or_pool(request: Request, units: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: here (on the event loop) when ``units`` is at most :data:`INLINE_UNITS`, else
    in the worker pool (429 beyond the client's share, 503 past the deadline, killed when the
    client goes away). ``fn`` and its arguments must be picklable for the pool."""
    if units <= INLINE_UNITS:
        return fn(*args)
    ok, value = await run_bounded(partial(_in_worker, fn, *args), client=client_of(request),
                                  is_disconnected=request.is_disconnected)
    if not ok:
        raise PlanError(value)
    return value


# --------------------------------------------------------------------------- bounded work


@dataclass(frozen=True)
class Cost:
    """An operation's estimated work, what to call it in a refusal, the field to change and how."""

    estimate: int
    what: str
    field: str | None
    fix: str


def client_of(request: Request) -> str:
    """Who asked, for the per-client limit: the peer address (behind a proxy, run uvicorn with
    ``--proxy-headers`` so this is the real client)."""
    return request.client.host if request.client else "unknown"


def _in_worker(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[bool, Any]:
    """Runs in a worker process: ``(True, value)``, or ``(False, problems)`` for a
    :class:`PlanError` (whose constructor takes the problems, so it does not survive pickling)."""
    try:
        return True, fn(*args, **kw)
    except PlanError as exc:
        return False, exc.problems


def report_body(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw).body``: a report function of :mod:`app.core.reports`, in a worker."""
    return fn(*args, **kw).body


async def bounded(request: Request, cost: Cost, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` (module-level, picklable arguments) after ``cost`` passed the budget,
    in the worker pool: 422 over budget, 429 too busy, 503 past the deadline; killed when the
    client disconnects."""
    WorkBudget.from_env().check(cost.estimate, cost.what, field=cost.field, fix=cost.fix)
    ok, value = await run_bounded(partial(_in_worker, fn, *args, **kw), client=client_of(request),
                                  is_disconnected=request.is_disconnected)
    if not ok:
        raise PlanError(value)
    return value



# --------------------------------------------------------------------------- cost of one request


def full_layer_count(plan: Plan, cfg: ModelConfig) -> int | None:
    """Full (index-computing) layers of ``cfg`` under the plan's engine rules; None (the
    estimators then assume every layer is full, the worst case) when the roles cannot be derived
    - the operation itself will report why."""
    from app.core.engines import engine_for

    try:
        roles = engine_for(plan).check_roles(cfg, plan)
    except (ValueError, TypeError):
        return None
    return sum(1 for r in roles.layers if r.role == "full")


def plan_search_cost(plan: Plan, cfg: ModelConfig, top: int) -> Cost:
    """``isplan plan``: the optimiser's k-best search for ``top + 1`` layouts of PP x VPP (the
    serving partition search of vLLM/SGLang is the same stage DP with VPP 1)."""
    vpp = plan.vpp or 1
    return Cost(estimate_optimiser_work(cfg.num_hidden_layers, plan.pp, vpp, top + 1,
                                        num_full=full_layer_count(plan, cfg)),
                f"plan-search for PP {plan.pp} x VPP {vpp} with top {top} on {cfg.num_hidden_layers:,} layers",
                "pp", "ask for fewer stages (pp, vpp) or a smaller top")


def search_cost(plan: Plan, cfg: ModelConfig, gpus: int, top: int) -> Cost:
    return Cost(estimate_search_work(gpus, top, num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                                     num_experts=cfg.n_routed_experts, num_full=full_layer_count(plan, cfg)),
                f"search over {gpus:,} GPUs with top {top} on {cfg.num_hidden_layers:,} layers",
                "gpus", "ask for fewer GPUs or a smaller top")


def action_cost(plan: Plan, cfg: ModelConfig, action: str) -> Cost:
    """Balance: one optimal layout of the plan's stages; Nearest valid: the nearest-split DP over
    them. The stage count is the split's length in split mode, else PP x VPP."""
    stages = len(plan.split or ()) if plan.mode == "split" and plan.split else plan.pp * (plan.vpp or 1)
    full = full_layer_count(plan, cfg)
    n = cfg.num_hidden_layers
    if action == "nearest":
        estimate = estimate_nearest_work(n, stages, num_full=full)
    else:
        estimate = estimate_optimiser_work(n, max(stages // (plan.vpp or 1), 1), plan.vpp or 1, 1, num_full=full)
    return Cost(estimate, f"{'Nearest valid' if action == 'nearest' else 'Balance'} over {stages:,} stages of "
                f"{n:,} layers", "split", "use fewer stages")


def time_cost(plan: Plan, cfg: ModelConfig) -> Cost:
    """``isplan time``: one evaluation plus the schedule simulation, a forward and a backward per
    micro-batch per (pp_rank, vp_stage); the simulation refuses itself beyond
    :data:`app.core.engines.megatron.timing.MAX_EVENTS`, so this bounds it by that."""
    from app.core.engines.megatron.timing import ASSUMED_MICROBATCHES_PER_RANK, MAX_EVENTS

    stages = len(plan.split or ()) if plan.mode == "split" and plan.split else plan.pp * (plan.vpp or 1)
    dp = plan.dp or (plan.gpus // max(1, plan.tp * plan.cp * plan.pp) if plan.gpus else 1) or 1
    m = (plan.num_microbatches or (plan.global_batch // max(1, plan.mbs * dp) if plan.global_batch else 0)
         or ASSUMED_MICROBATCHES_PER_RANK * max(1, plan.pp))
    events = min(MAX_EVENTS, 2 * stages * m)
    return Cost(4 * events + 50 * (cfg.num_hidden_layers + stages), f"timing {m:,} micro-batches over {stages:,} stages",
                "global_batch", "time fewer micro-batches (global_batch, num_microbatches) or fewer stages")


def verify_cost(receipt: Any, cfg: ModelConfig | None) -> Cost:
    """Each recorded layout materialised once; ``pp``/``vpp`` that are not small whole numbers
    count at their bound (``verify_receipt`` refuses them itself)."""
    layouts = receipt.get("layouts") if isinstance(receipt, dict) else None
    pairs = []
    for entry in layouts[: bounds.MAX_RECEIPT_LAYOUTS + 1] if isinstance(layouts, list) else []:
        inputs = entry.get("inputs") if isinstance(entry, dict) else None
        inputs = inputs if isinstance(inputs, dict) else {}
        pairs.append((_count_or(inputs.get("pp"), bounds.MAX_PP), _count_or(inputs.get("vpp"), bounds.MAX_VPP)))
    layers = cfg.num_hidden_layers if cfg is not None else bounds.MAX_LAYERS
    return Cost(estimate_verify_work(pairs, layers), f"verifying {len(pairs)} layouts", "receipt",
                f"a receipt holds at most {bounds.MAX_RECEIPT_LAYOUTS} layouts")


def _count_or(value: Any, bound: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= bound
    return value if ok else bound


def launcher_cost(script: str, cfg: ModelConfig, sourced_chars: int = 0) -> Cost:
    """The launcher import's own upper bound of its work (:func:`app.core.launcher.import_work_estimate`)."""
    from app.core.launcher import import_work_estimate

    chars = len(script) + sourced_chars
    estimate = import_work_estimate(len(script), sourced_chars, cfg.num_hidden_layers)
    return Cost(estimate, f"importing a {chars:,}-character launcher", "launcher", "paste a shorter script")
