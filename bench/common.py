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
