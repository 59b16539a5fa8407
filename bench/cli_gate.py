"""``isplan check`` as a launch-script gate vs seed 000's dependency-free Node checker.

Both run as fresh processes on the same config and split, alternating, N times; the target is a
wall-time ratio (isplan / node) of at most 2 at the median.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ms, percentiles, save

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG = REPO / "app" / "core" / "presets" / "glm-5.2.json"
SPLIT = "14,8,8,8,8,8,8,16"


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} exited {p.returncode}")
    return elapsed


def main(n: int = 30) -> dict:
    node = shutil.which("node")
    isplan = [sys.executable, "-m", "app", "check", str(CONFIG), "--split", SPLIT]
    py, js = [], []
    for _ in range(n):
        py.append(_run(isplan))
        if node:
            js.append(_run([node, str(HERE / "seed_checker.mjs"), str(CONFIG), SPLIT]))
    result = {"isplan": percentiles(py)}
    if js:
        result["node"] = percentiles(js)
        result["ratio_p50"] = result["isplan"]["p50"] / result["node"]["p50"]
        result["target_ratio"] = 2.0
        result["meets_target"] = result["ratio_p50"] <= 2.0
    save("cli_gate", result)
    print(f"cli_gate: isplan check p50 {ms(result['isplan']['p50'])} p99 {ms(result['isplan']['p99'])}", end="")
    if js:
        print(f" | node checker p50 {ms(result['node']['p50'])} | ratio {result['ratio_p50']:.2f}x (target <= 2x)")
    else:
        print(" | node not installed: no ratio")
    return result


if __name__ == "__main__":
    main()
