"""Concurrent load on the real server: ``uvicorn app.main:app`` in a subprocess on a free loopback
port (127.0.0.1 only, ``ISPLAN_DATA_DIR`` in a temp dir), then 64 concurrent clients (threads,
one keep-alive ``http.client`` connection each, stdlib only) request ``GET /fragment?...`` for the
GLM-5.2 slime profile (``BASE`` of ``bench/live_update.py``), cycling through valid and invalid
splits, for ``--seconds`` (default 30) or ``--max-requests`` (default 200,000), whichever comes
first. The clients and the server share this machine's cores.

Reports throughput (requests/s), latency p50/p99 (client-side, queueing included) and the error
count (non-200 answers and exceptions). Target: 0 errors; ``python -m bench.load`` exits 1
otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import ms, percentiles, save
from bench.live_update import BASE, SPLITS
from tests.browser_support import AppServer  # the one way the project starts a real server

# SPLITS: two valid layouts and one invalid (stage 3 starts on shared layer 24); two more of each.
LOAD_SPLITS = SPLITS + ["18,8,8,8,8,8,8,12", "14,8,8,8,8,8,9,15", "10,12,8,8,8,8,8,16", "13,9,8,8,8,8,8,16"]
QUERIES = [f"/fragment?{BASE}&split={s}" for s in LOAD_SPLITS]


def _hammer(port: int, clients: int, seconds: float, max_requests: int) -> dict:
    slots = itertools.count()  # next() is atomic under the GIL: a global request budget
    start = threading.Barrier(clients + 1)
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    deadline = [0.0]

    def client(i: int) -> None:
        mine: list[float] = []
        bad: list[str] = []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        start.wait()
        k = i
        while time.monotonic() < deadline[0] and next(slots) < max_requests:
            path = QUERIES[k % len(QUERIES)]
            k += 1
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200 or not body:
                    bad.append(f"HTTP {resp.status} for {path[-40:]}")
                else:
                    mine.append(time.perf_counter() - t0)
            except (OSError, http.client.HTTPException) as exc:
                bad.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    done = len(latencies) + len(errors)
    return {"clients": clients, "seconds": elapsed, "requests": done, "ok": len(latencies),
            "errors": len(errors), "error_samples": errors[:10], "throughput_rps": done / elapsed,
            "latency": percentiles(latencies) if latencies else None}


def main(seconds: float = 30.0, clients: int = 64, max_requests: int = 200_000) -> dict:
    with AppServer(Path(tempfile.mkdtemp(prefix="isplan-bench-"))) as srv:
        for q in QUERIES:  # warm up imports and caches
            urllib.request.urlopen(f"{srv.url}{q}", timeout=30).read()
        result = _hammer(srv.port, clients, seconds, max_requests)
        log_tail = srv.log()
    result.update({"target_seconds": seconds, "max_requests": max_requests, "splits": LOAD_SPLITS,
                   "server_log_tail": log_tail[-2000:]})
    save("load", result)
    lat = result["latency"] or {"p50": float("nan"), "p99": float("nan")}
    print(f"load ({clients} clients, {result['seconds']:.1f} s, {result['requests']:,} requests): "
          f"{result['throughput_rps']:.1f} req/s, latency p50 {ms(lat['p50'])} p99 {ms(lat['p99'])}, "
          f"errors {result['errors']} (target 0)")
    if result["errors"]:
        print("load errors, e.g.: " + "; ".join(result["error_samples"][:3]), file=sys.stderr)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to load the server (default 30)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    ap.add_argument("--max-requests", type=int, default=200_000, help="stop after this many requests")
    args = ap.parse_args()
    raise SystemExit(1 if main(args.seconds, args.clients, args.max_requests)["errors"] else 0)
