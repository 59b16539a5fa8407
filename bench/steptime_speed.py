"""The step-time model's speed (issue 18): the time estimate inside ``evaluate(plan)`` and one
``isplan time`` of a 78-layer model at PP 16, VPP 4, 512 micro-batches.

``python -m bench.steptime_speed``. The estimate's cost is the median of ``evaluate`` on one parsed
plan (GLM-5.2 on H100 at PP 8) with the time model minus the median with the engine's ``plan_time``
replaced by a stub; the ``isplan time`` figure is in-process (after the import) and for the first
call (the schedule graph of that shape is built once, then cached).
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import ms, save, time_calls

#: GLM-5.2 (78 layers) at PP 8 on H100: the recipes' stages, 8 micro-batches per rank assumed
EVALUATE_PLAN = {"model": "glm-5.2", "mode": "flags", "pp": 8, "parallel": True, "tp": 8, "cp": 1, "ep": 8, "etp": 1,
                 "dp": 4, "mbs": 1, "gpu": "h100-80gb"}
TIME_ARGV = ["time", "glm-5.2", "--pp", "16", "--vpp", "4", "--tp", "8", "--ep", "8", "--etp", "1", "--dp", "4",
             "--global-batch", "2048", "--format", "json"]


def _median(fn: Callable[[], object], n: int) -> float:
    fn()
    return statistics.median(time_calls(fn, n))


def evaluate_cost(n: int = 200) -> dict[str, float]:
    """Median seconds of ``evaluate`` with and without the time model, and their difference."""
    import app.core.engines.megatron as megatron
    from app.core.evaluate import evaluate
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    cfg = load_preset("glm-5.2")
    plan = Plan(**EVALUATE_PLAN)  # type: ignore[arg-type]
    with_time = _median(lambda: evaluate(plan, cfg), n)
    real = megatron.plan_time

    def stub(*_a: Any, **_k: Any) -> dict[str, Any]:
        return {}

    megatron.plan_time = stub  # type: ignore[assignment]
    try:
        without = _median(lambda: evaluate(plan, cfg), n)
    finally:
        megatron.plan_time = real
    return {"evaluate_with_time": with_time, "evaluate_without_time": without, "time_estimate": with_time - without}


def isplan_time_seconds() -> dict[str, float]:
    """In-process seconds of ``isplan time`` at PP 16 x VPP 4 x 512 micro-batches: first call and repeat."""
    from app.cli import main

    def run() -> float:
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(list(TIME_ARGV))
        return time.perf_counter() - t0

    first = run()
    return {"isplan_time_first": first, "isplan_time_repeat": statistics.median(run() for _ in range(3))}


def main() -> dict[str, float]:
    out = evaluate_cost() | isplan_time_seconds()
    print(f"evaluate: {ms(out['evaluate_with_time'])} with the time model, {ms(out['evaluate_without_time'])} "
          f"without: the estimate costs {out['time_estimate'] * 1e6:.0f} µs (target 500 µs)")
    print(f"isplan time glm-5.2 PP 16 VPP 4, 512 micro-batches: {ms(out['isplan_time_first'])} first call, "
          f"{ms(out['isplan_time_repeat'])} repeated, in-process after the import (target 500 ms)")
    save("steptime_speed", out)
    return out


if __name__ == "__main__":
    main()
