"""Run benchmarks: ``python -m bench`` runs all, ``python -m bench cli_gate`` one."""

from __future__ import annotations

import importlib
import sys

BENCHES = ["cli_gate", "live_update", "api_latency", "scaling", "optimiser_speed", "search_speed", "load", "worst_load", "steptime",
           "steptime_speed",
           "browser_timing", "page_speed"]


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(f"{__doc__}\nbenchmarks: {', '.join(BENCHES)}")
        return 0
    names = argv or BENCHES
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHES}", file=sys.stderr)
        return 2
    status = 0
    for name in names:
        result = importlib.import_module(f"bench.{name}").main()
        if isinstance(result, dict) and result.get("errors"):
            print(f"{name}: {result['errors']} error(s)", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
