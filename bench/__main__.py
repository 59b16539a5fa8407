"""Run benchmarks: ``python -m bench`` runs all, ``python -m bench cli_gate`` one."""

from __future__ import annotations

import importlib
import sys

BENCHES = ["cli_gate", "live_update", "search_speed"]


def main(argv: list[str]) -> int:
    names = argv or BENCHES
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {BENCHES}", file=sys.stderr)
        return 2
    for name in names:
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
