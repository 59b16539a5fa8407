"""Server time of one live plan update (``build_view`` + rendering ``_results.html``, the work of
``/fragment``, timed in process by ``bench.common.update_seconds``) against model depth: synthetic GLM-5.2 configs with 78, 256
and 1024 decoder layers (the preset with ``num_hidden_layers``, ``indexer_types`` -- first 3 full,
then every 4th -- and ``mlp_layer_types`` changed), uploaded to a :class:`ConfigStore` in a temp
directory and addressed as ``model=sha256:...``, PP in {8, 16, 32, 64} x VPP in {1, 2, 4} wherever
``PP * VPP`` stages fit the full layers. Each PP x VPP uses ``mode=split`` with the even valid
split :func:`app.core.optimise.optimiser.optimal_layout` finds for uniform costs; updates cycle through
that split, a valid neighbour (one stage start moved to the next full layer) and an invalid one
(a start moved onto a shared layer), as in ``bench/live_update.py``.

p50/p99 per (layers, PP, VPP) over up to 200 updates (at most ``seconds_per_case`` each), and the
time per layer (p50 / layers). Target: the cost grows about linearly in the number of layers,
i.e. the time per layer at 1024 layers is no more than at 78 (ratio <= ~1).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench.common import ms, percentiles, save, update_seconds

REPO = Path(__file__).resolve().parent.parent
PRESET = REPO / "app" / "core" / "presets" / "glm-5.2.json"
LAYERS = (78, 256, 1024)
PPS = (8, 16, 32, 64)
VPPS = (1, 2, 4)
PARALLEL = "mode=split&tp=4&cp=8&ep=32&etp=1&sp=1&tpg=8192&recompute=full&offload=1"


def synthetic_config(layers: int) -> bytes:
    """GLM-5.2's config.json with ``layers`` decoder layers (same IndexShare and dense/MoE pattern)."""
    raw = json.loads(PRESET.read_text("utf-8"))
    raw["num_hidden_layers"] = layers
    raw["indexer_types"] = ["full" if i < 3 or (i - 2) % 4 == 0 else "shared" for i in range(layers)]
    raw["mlp_layer_types"] = ["dense" if i < raw["first_k_dense_replace"] else "sparse" for i in range(layers)]
    return json.dumps(raw, indent=2).encode()


def full_mask(data: bytes) -> list[bool]:
    return [t == "full" for t in json.loads(data)["indexer_types"]]


def _starts(split: list[int]) -> list[int]:
    out, at = [], 0
    for s in split:
        out.append(at)
        at += s
    return out


def _split_from_starts(starts: list[int], n: int) -> list[int]:
    return [b - a for a, b in zip(starts, starts[1:] + [n])]


def variants(split: list[int], full: list[bool]) -> list[list[int]]:
    """``split``, a valid neighbour (one start moved to another full layer) and an invalid one
    (a start moved onto a shared layer), where they exist."""
    n, starts = len(full), _starts(split)
    out = [split]
    valid_nb = invalid = None
    for j in range(1, len(starts)):
        lo, hi = starts[j - 1] + 1, (starts[j + 1] if j + 1 < len(starts) else n) - 1
        for cand in list(range(starts[j] + 1, hi + 1)) + list(range(starts[j] - 1, lo - 1, -1)):
            moved = starts[:j] + [cand] + starts[j + 1:]
            if full[cand] and valid_nb is None:
                valid_nb = _split_from_starts(moved, n)
            if not full[cand] and invalid is None:
                invalid = _split_from_starts(moved, n)
        if valid_nb and invalid:
            break
    return out + [s for s in (valid_nb, invalid) if s]


def cases(full: list[bool]) -> list[tuple[int, int]]:
    f = sum(full)
    return [(pp, vpp) for pp in PPS for vpp in VPPS if pp * vpp <= f]


def main(n: int = 200, seconds_per_case: float = 5.0, budget_seconds: float = 150.0) -> dict:
    from app.core.model.config import load_config_bytes
    from app.core.optimise.optimiser import optimal_layout
    from app.web.app import create_app
    from app.web.store import ConfigStore

    store = ConfigStore(Path(tempfile.mkdtemp(prefix="isplan-bench-")) / "configs.sqlite3")
    app = create_app(store=store)  # model=sha256:... resolves through this store

    def update(query: str) -> float:
        return update_seconds(app, query)

    t_start = time.monotonic()
    out: dict = {"updates_per_case": n, "seconds_per_case": seconds_per_case, "parallel": PARALLEL, "cases": []}
    by_key: dict[tuple[int, int, int], dict] = {}
    for layers in LAYERS:
        data = synthetic_config(layers)
        cfg = load_config_bytes(data, label=f"synthetic {layers} layers")
        store.put(data, name=f"synthetic-{layers}.json")
        full = full_mask(data)
        assert cfg.num_hidden_layers == layers
        for pp, vpp in cases(full):
            if time.monotonic() - t_start > budget_seconds:
                out.setdefault("skipped_over_budget", []).append([layers, pp, vpp])
                continue
            lay = optimal_layout([1.0] * layers, full, pp, vpp, unit="stage")
            queries = [f"model={cfg.id}&{PARALLEL}&vpp={vpp}&split={','.join(map(str, s))}"
                       for s in variants(lay.split, full)]
            for q in queries:  # warm up (roles, caches of this model)
                update(q)
            samples: list[float] = []
            t_case = time.monotonic()
            while len(samples) < n and time.monotonic() - t_case < seconds_per_case:
                samples.append(update(queries[len(samples) % len(queries)]))
            st = percentiles(samples)
            rec = {"layers": layers, "full_layers": sum(full), "pp": pp, "vpp": vpp, "split": lay.split,
                   "variants": len(queries), **st, "p50_per_layer": st["p50"] / layers}
            out["cases"].append(rec)
            by_key[(layers, pp, vpp)] = rec
            print(f"scaling {layers:>4} layers PP{pp:<2} VPP{vpp}: p50 {ms(st['p50'])} p99 {ms(st['p99'])} "
                  f"({st['n']} updates), {st['p50'] / layers * 1e6:.1f} us/layer")
    ratios = {}
    for (layers, pp, vpp), rec in by_key.items():
        small = by_key.get((LAYERS[0], pp, vpp))
        if layers == LAYERS[-1] and small:
            ratios[f"pp{pp}_vpp{vpp}"] = {"time": rec["p50"] / small["p50"],
                                          "per_layer": rec["p50_per_layer"] / small["p50_per_layer"],
                                          "marginal_per_layer": (rec["p50"] - small["p50"]) / (layers - LAYERS[0])}
    out["ratio_1024_vs_78"] = ratios
    out["layers_ratio"] = LAYERS[-1] / LAYERS[0]
    out["seconds"] = time.monotonic() - t_start
    save("scaling", out)
    parts = ", ".join(f"PP{k.split('_')[0][2:]} VPP{k.split('_')[1][3:]} time x{v['time']:.1f} "
                      f"per-layer x{v['per_layer']:.2f} (marginal {v['marginal_per_layer'] * 1e6:.0f} us/layer)"
                      for k, v in ratios.items())
    print(f"scaling 1024 vs 78 layers (x{LAYERS[-1] / LAYERS[0]:.1f} layers): {parts} "
          f"(per-layer ratio <= ~1: at most linear)")
    return out


if __name__ == "__main__":
    main()
