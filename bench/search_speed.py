"""Parallel-configuration search: configurations evaluated per second and wall time for 256,
2048 and 8192 GPUs (GLM-5.2, H100 80 GB, 8192 tokens per GPU), median of 3 runs."""

from __future__ import annotations

import statistics

from bench.common import save


def main(repeats: int = 3) -> dict:
    from app.core.model.config import load_model
    from app.core.optimise.search import search

    cfg = load_model("glm-5.2")
    out = {}
    for gpus in (256, 2048, 8192):
        runs = [search(cfg, gpus, tokens_per_gpu=8192, top=1) for _ in range(repeats)]
        secs = statistics.median(r["seconds"] for r in runs)
        combos = runs[0]["counts"]["combinations"]
        out[str(gpus)] = {"seconds_p50": secs, "combinations": combos, "per_second": combos / secs,
                          "feasible": runs[0]["counts"]["feasible"]}
        print(f"search {gpus:>5} GPUs: {combos:,} combinations in {secs:.2f} s "
              f"({combos / secs:,.0f}/s), {runs[0]['counts']['feasible']} feasible")
    save("search_speed", out)
    return out


if __name__ == "__main__":
    main()
