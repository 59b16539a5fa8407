"""``python -m tests.healthz_probe PORT EVERY``: ``GET /healthz`` every ``EVERY`` seconds on one
keep-alive connection until SIGTERM, then one JSON line ``{"samples": [...], "failures": [...]}``.

It runs in its own process so that what it measures is the server's answer time, not the wait of
a thread for the GIL of a test process whose dozens of load threads hold it (on a slow 2-core CI
machine that wait alone was 50-150 ms at p99). Nothing here imports pytest.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time


def probe(port: int, every: float) -> dict[str, list]:
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    samples: list[float] = []
    failures: list[str] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    print("ready", flush=True)
    while not stopped:
        t0 = time.perf_counter()
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                failures.append(f"HTTP {resp.status}")
        except (OSError, http.client.HTTPException) as exc:
            failures.append(type(exc).__name__)
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        samples.append(time.perf_counter() - t0)
        time.sleep(every)
    conn.close()
    return {"samples": samples, "failures": failures}


if __name__ == "__main__":
    print(json.dumps(probe(int(sys.argv[1]), float(sys.argv[2]))), flush=True)
