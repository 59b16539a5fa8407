"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)

    def pct(p: float) -> float:
        k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
        return s[k]

    return {"n": len(s), "p50": pct(50), "p90": pct(90), "p99": pct(99), "mean": statistics.fmean(s),
            "min": s[0], "max": s[-1]}


def time_calls(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def update_seconds(app: object, query: str) -> float:
    """Server time of one live page update of ``query`` in ``app`` (a ``create_app()`` app): parse
    the plan, evaluate it, render the results fragment - what ``/fragment`` does, without HTTP."""
    from urllib.parse import parse_qsl

    from starlette.requests import Request

    from app.core.engines.slime import SLIME_GLM52_PROFILE
    from app.core.plan import plan_from_query
    from app.web.view import build_view

    state = app.state  # type: ignore[attr-defined]
    request = Request({"type": "http", "method": "GET", "path": "/fragment", "query_string": query.encode(),
                       "headers": [], "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "", "app": app})
    t0 = time.perf_counter()
    plan, problems = plan_from_query(dict(parse_qsl(query)), empty=SLIME_GLM52_PROFILE)
    view = build_view(plan, problems, state.store)
    state.templates.get_template("_fragment.html").render(state.page_context(request, view, compare=None, same_form=False))
    return time.perf_counter() - t0
