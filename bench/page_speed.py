"""The page fragment against the server's floor, side by side in one run (issue 17 item 4).

The real server (``uvicorn app.main:app`` through :class:`tests.browser_support.AppServer`, one
process, loopback only) answers, on one keep-alive connection and interleaved request by request,
``GET /healthz`` (the floor: routing, middleware, one JSON answer) and ``GET /fragment?<plan>``
(what htmx asks after every edit, with the fields the page's form sends: parse, evaluate, render
the results with the summary out of band; the settings form, unchanged by a move, is not sent
back) for the GLM-5.2 slime profile, one boundary moved by one layer each round as a drag does
(:func:`bench.live_update.drag_walk`: valid and invalid layouts, a layout recurring only when the
walk returns to it, so no cache keyed on the whole plan hides the work). ``X-Isplan-History:
replace`` is sent as the page sends it. Target: fragment p50 <= 5 x healthz p50.

Also reported: the fragment's server time in process (no HTTP), split into the evaluation and the
view (``build_view``) and the template render.
"""

from __future__ import annotations

import http.client
import statistics
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from bench.common import ms, percentiles, save
from bench.live_update import BASE, SPLITS, drag_walk
from tests.browser_support import AppServer  # the one way the project starts a real server

ROUNDS = 400
TARGET_RATIO = 5.0
#: the headers the page sends with ``/fragment`` after a boundary move (static/app.js,
#: ``htmx:configRequest``): htmx, replace the history entry, the form it shows (unchanged: not sent back)
PAGE_HEADERS = {"HX-Request": "true", "X-Isplan-History": "replace", "X-Isplan-Form": "split:clean",
                "Accept-Encoding": "gzip"}


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"GET {path[:80]} answered {resp.status}")
    return time.perf_counter() - t0


def page_query(split: str) -> str:
    """The query the settings form sends for the benchmark's plan with ``split``: what the form
    the server draws for it sends (:meth:`app.web.view.PlanView.form_sends`, every field as the
    browser's ``FormData`` holds it, blanks dropped) with the model and engine pickers, so the
    server answers without the form as it answers the page."""
    from urllib.parse import urlencode

    values = dict(_form_values())
    values["split"] = split   # a boundary move changes the stage sizes alone
    return urlencode(values)


@lru_cache(maxsize=1)
def _form_values() -> tuple[tuple[str, str], ...]:
    from urllib.parse import parse_qsl

    from app.core.evaluate import evaluate
    from app.core.model.config import load_preset
    from app.core.plan import plan_from_query
    from app.web.view import PlanView

    plan, _ = plan_from_query(dict(parse_qsl(f"{BASE}&split={SPLITS[0]}")))   # the walk's start
    view = PlanView(plan, evaluate(plan, load_preset(plan.model)), {})
    return (("model", plan.model), ("engine", plan.engine), *view.form_sends().items())


def over_http(rounds: int) -> dict:
    with AppServer(Path(tempfile.mkdtemp(prefix="isplan-bench-page-"))) as srv:
        assert srv.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        page = PAGE_HEADERS
        walk = drag_walk(rounds + 20)
        paths = [f"/fragment?{page_query(s)}" for s in walk]
        for p in paths[:20]:  # warm up: imports, presets, caches of immutable work
            _get(conn, p, page)
            _get(conn, "/healthz", {})
        health, fragment = [], []
        for i in range(rounds):
            health.append(_get(conn, "/healthz", {}))
            fragment.append(_get(conn, paths[20 + i], page))
        conn.close()
    return {"healthz": percentiles(health), "fragment": percentiles(fragment)}


def in_process(rounds: int) -> dict:
    from urllib.parse import parse_qsl

    from starlette.requests import Request

    from app.core.engines.slime import SLIME_GLM52_PROFILE
    from app.core.plan import plan_from_query
    from app.web.app import create_app
    from app.web.view import build_view

    app = create_app()
    state = app.state
    template = state.templates.get_template("_fragment.html")
    view_s, render_s = [], []
    walk = drag_walk(rounds + 10)
    for i in range(rounds + 10):
        q = f"{BASE}&split={walk[i]}"
        request = Request({"type": "http", "method": "GET", "path": "/fragment", "query_string": q.encode(),
                           "headers": [], "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "", "app": app})
        t0 = time.perf_counter()
        plan, problems = plan_from_query(dict(parse_qsl(q)), empty=SLIME_GLM52_PROFILE)
        view = build_view(plan, problems, state.store)
        t1 = time.perf_counter()
        template.render(state.page_context(request, view, compare=None, same_form=False))
        t2 = time.perf_counter()
        if i >= 10:
            view_s.append(t1 - t0)
            render_s.append(t2 - t1)
    return {"evaluate_and_view_p50": statistics.median(view_s), "render_p50": statistics.median(render_s)}


def main(rounds: int = ROUNDS) -> dict:
    http_ = over_http(rounds)
    local = in_process(rounds // 2)
    ratio = http_["fragment"]["p50"] / http_["healthz"]["p50"]
    result = {"rounds": rounds, **http_, "in_process": local, "fragment_over_healthz_p50": ratio,
              "target_ratio": TARGET_RATIO, "meets_target": ratio <= TARGET_RATIO}
    save("page_speed", result)
    h, f = http_["healthz"], http_["fragment"]
    print(f"page_speed ({rounds} rounds, interleaved, one connection): /healthz p50 {ms(h['p50'])} p99 {ms(h['p99'])} | "
          f"/fragment p50 {ms(f['p50'])} p99 {ms(f['p99'])} | ratio {ratio:.1f}x (target <= {TARGET_RATIO:.0f}x) | "
          f"in process: evaluate + view {ms(local['evaluate_and_view_p50'])}, render {ms(local['render_p50'])}")
    return result


if __name__ == "__main__":
    main()
