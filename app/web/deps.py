"""FastAPI dependencies shared by the routers: the config store, the model, the plan, and the
bounded run of an expensive operation (issue 9).

Expensive operations (plan-search, search, verify, the launcher import, Balance / Nearest valid)
never run in the server process: :func:`bounded` first checks the operation's cost estimate
(:mod:`app.web.workers`) against the work budget - a :class:`~app.web.workers.TooMuchWork` 422
naming the limit and the field to change - then runs it in the worker pool with a deadline, a
per-client limit, and cancellation when the client disconnects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, Query, Request

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


def get_plan(request: Request, _query: Annotated[PlanQuery, Query()]) -> Plan:  # type: ignore[valid-type]
    """The plan in the query string, parsed strictly (any field problem is a 422 naming it).

    ``_query`` is the generated model: it publishes every plan field in OpenAPI and pre-validates;
    the plan itself comes from :func:`app.core.plan.strict_plan`, the one parser of a plan."""
    from app.core.engines import ignored_fields

    return strict_plan(request.query_params, ignored=ignored_fields)


PlanDep = Annotated[Plan, Depends(get_plan)]


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


def bounded_from_thread(request: Request, cost: Cost, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """:func:`bounded` for a synchronous route (it runs in a worker thread of the event loop)."""
    from anyio.from_thread import run

    return run(partial(bounded, request, cost, fn, *args, **kw))


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
