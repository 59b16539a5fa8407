"""The web layer's own cost: ``/healthz``, ``GET /api/v1/plan`` and the page fragment side by side.

Starts the real server as ``make serve`` does (``python -m app.serve``, :func:`bench.worst_load.served`)
and sends, over one keep-alive loopback connection, ``--rounds`` rounds of the three requests in
turn (``/healthz``, ``/api/v1/plan?<plan>``, ``/fragment?<plan>``, the plan being the GLM-5.2
slime profile of ``bench/live_update.py``, one boundary moved by one layer each round as a drag
does (:func:`bench.live_update.drag_walk`: a layout recurs only when the walk returns to it, so a
cache keyed on the whole plan serves few requests; caches keyed on a stage's contents serve the
stages the move left alone, as on the page). ``/fragment`` is asked as the page asks it after an edit (the
fields the form sends, :func:`bench.page_speed.page_query`, and the page's headers
:data:`bench.page_speed.PAGE_HEADERS`: htmx, history replace, the form it shows, gzip). Interleaving puts the three under the same machine load, so
their ratios mean something on a shared machine. Then ``--clients`` (default 8) clients send
live updates (``/fragment``) as fast as they can for ``--seconds`` and their latency p99 is taken,
while one more connection asks ``/healthz`` every 20 ms (does the server stay responsive?).

Targets (issue 17 item 4): plan p50 <= 3x /healthz p50, fragment p50 <= 5x, 8 clients p99 <= 100 ms.
``python -m bench.api_latency`` exits 1 when a target is missed or a request failed.
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import threading
import time
from pathlib import Path
from typing import cast

from bench.common import ms, percentiles, save
from bench.live_update import BASE, drag_walk
from bench.page_speed import PAGE_HEADERS, page_query
from bench.worst_load import served

ROUTES = ("/healthz", "/api/v1/plan?", "/fragment?")
TARGETS = {"plan_ratio": 3.0, "fragment_ratio": 5.0, "clients_p99_seconds": 0.100}


#: the layouts of one drag session (the live clients each start at their own place in it)
WALK = drag_walk(2000)


def _query(i: int) -> str:
    return f"{BASE}&split={WALK[i % len(WALK)]}"


#: what the page sends after an edit, one per layout (the fields its form sends, :func:`bench.page_speed.page_query`)
FRAGMENTS = [f"/fragment?{page_query(s)}" for s in WALK]


def _path(route: str, i: int) -> tuple[str, dict[str, str]]:
    if route == "/fragment?":
        return FRAGMENTS[i % len(FRAGMENTS)], PAGE_HEADERS
    return route + (_query(i) if route.endswith("?") else ""), {}


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    return resp.status, time.perf_counter() - t0


def side_by_side(port: int, rounds: int) -> tuple[dict[str, list[float]], list[str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    samples: dict[str, list[float]] = {r: [] for r in ROUTES}
    errors: list[str] = []
    for i in range(rounds + 20):  # the first 20 rounds warm up imports and caches
        for route in ROUTES:
            status, seconds = _get(conn, *_path(route, i))
            if status != 200:
                errors.append(f"{route} HTTP {status}")
            elif i >= 20:
                samples[route].append(seconds)
    conn.close()
    return samples, errors


def _probe(port: int, stop: threading.Event, out: list[float], bad: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.wait(0.02):
        status, took = _get(conn, "/healthz")
        out.append(took)
        if status != 200:
            bad.append(f"/healthz HTTP {status}")
    conn.close()


def live_clients(port: int, clients: int, seconds: float) -> tuple[list[float], list[str], list[float]]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        bad: list[str] = []
        start.wait()
        i = k * len(WALK) // clients  # each client drags its own part of the walk
        while time.monotonic() < deadline[0]:
            try:
                status, took = _get(conn, *_path("/fragment?", i))
                mine.append(took)
                if status != 200:
                    bad.append(f"/fragment HTTP {status}")
            except (OSError, http.client.HTTPException) as exc:
                bad.append(f"/fragment {type(exc).__name__}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    stop, probes = threading.Event(), cast(list[float], [])
    probe = threading.Thread(target=_probe, args=(port, stop, probes, errors), daemon=True)
    start.wait()
    probe.start()
    for t in threads:
        t.join(seconds + 60)
    stop.set()
    probe.join(60)
    return latencies, errors, probes


def main(rounds: int = 300, clients: int = 8, seconds: float = 10.0) -> dict:
    with served(Path(tempfile.mkdtemp(prefix="isplan-api-latency-"))) as (port, _log):
        samples, errors = side_by_side(port, rounds)
        live, live_errors, probes = live_clients(port, clients, seconds)
    stats = {route.rstrip("?"): percentiles(s) for route, s in samples.items() if s}
    hz, plan, frag = (stats.get(r.rstrip("?"), {"p50": float("nan")}) for r in ROUTES)
    live_stats = percentiles(live) if live else {"p50": float("inf"), "p99": float("inf"), "n": 0}
    probe = percentiles(probes) if probes else {"p50": float("inf"), "p99": float("inf")}
    result = {
        "rounds": rounds, "routes": stats, "plan_ratio": plan["p50"] / hz["p50"],
        "fragment_ratio": frag["p50"] / hz["p50"], "clients": clients, "client_seconds": seconds,
        "live_updates": live_stats, "healthz_during_live_updates": probe,
        "errors": len(errors) + len(live_errors),
        "error_samples": (errors + live_errors)[:10], "targets": TARGETS,
    }
    result["passed"] = (not result["errors"] and result["plan_ratio"] <= TARGETS["plan_ratio"]
                        and result["fragment_ratio"] <= TARGETS["fragment_ratio"]
                        and live_stats["p99"] <= TARGETS["clients_p99_seconds"])
    save("api_latency", result)
    print(f"api_latency ({rounds} rounds): /healthz p50 {ms(hz['p50'])} | /api/v1/plan p50 {ms(plan['p50'])} "
          f"({result['plan_ratio']:.1f}x, target <= 3x) | /fragment p50 {ms(frag['p50'])} "
          f"({result['fragment_ratio']:.1f}x, target <= 5x) | {clients} clients of live updates for {seconds:g} s: "
          f"p50 {ms(live_stats['p50'])} p99 {ms(live_stats['p99'])} over {live_stats['n']} (target p99 <= 100 ms)"
          f" | /healthz meanwhile p50 {ms(probe['p50'])} p99 {ms(probe['p99'])}"
          f" | errors {result['errors']}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.api_latency", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300, help="rounds of the three requests (default 300)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent live-update clients (default 8)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the clients run (default 10)")
    args = ap.parse_args()
    raise SystemExit(0 if main(args.rounds, args.clients, args.seconds)["passed"] else 1)
