"""Exact layout optimiser (:func:`app.core.optimise.optimiser.optimal_layout`) vs brute force.

1. Brute force enumerates every valid cut set (``C(F - 1, S - 1)`` layouts: the starts of stages
   ``1 .. S-1`` among the full layers after layer 1) and keeps the least key (max rank cost, sum
   of squared rank costs, sum of squared stage costs, smallest split), the optimiser's documented
   order. Random instances: N = 16 .. 28 layers, random full masks (layer 1 full, others full with
   probability 3/4), integer layer costs 1..100 and integer first/last-stage extras (so float sums
   are exact and both sides must agree on the split), PP 2..4, VPP 1..2. Reported per N: layouts
   enumerated, brute-force and DP time (DP: p50 over repeats) and the speed ratio brute / DP
   (median over the instances); every DP answer is checked against the brute force.
2. DP alone, p50 over repeats: GLM-5.2 PP8 VPP2 with uniform costs and with the real
   ``layer_costs(cfg, roles, "balanced")``; a synthetic 1024-layer mask (first 3 full, then every
   4th; 258 full layers) at PP64 VPP1 and PP16 VPP2 with uniform costs.

Target: the DP agrees with brute force on every instance, beats it by a growing factor as the
layout count grows, and answers GLM-5.2 in milliseconds and 1024 layers in about a second or less.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time

from bench.common import ms, save

SIZES = (16, 20, 24, 28)
PPS = (2, 3, 4)
VPPS = (1, 2)
SEEDS_PER_CASE = 3
MAX_BRUTE_LAYOUTS = 1_000_000
FULL_PROBABILITY = 0.75


def brute_force(costs: list[int], full: list[bool], pp: int, vpp: int, fe: int, le: int) -> tuple[list[int], int]:
    """The least-key valid layout by enumerating every cut set; returns (split, layouts seen)."""
    n, s = len(costs), pp * vpp
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    cands = [i for i in range(1, n) if full[i]]
    best_key, best_split, seen = None, None, 0
    for cuts in itertools.combinations(cands, s - 1):
        seen += 1
        bounds = (0, *cuts, n)
        stage = [prefix[bounds[j + 1]] - prefix[bounds[j]] for j in range(s)]
        stage[0] += fe
        stage[-1] += le
        rank = [sum(stage[v * pp + r] for v in range(vpp)) for r in range(pp)] if vpp > 1 else stage
        split = [bounds[j + 1] - bounds[j] for j in range(s)]
        key = (max(rank), sum(u * u for u in rank), sum(c * c for c in stage), split)
        if best_key is None or key < best_key:
            best_key, best_split = key, split
    return best_split, seen


def _p50_time(fn, repeats: int, seconds: float) -> tuple[float, int, object]:
    samples, out, t_end = [], None, time.monotonic() + seconds
    while len(samples) < repeats and (not samples or time.monotonic() < t_end):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), len(samples), out


def vs_brute(seed: int = 0, budget_seconds: float = 90.0) -> dict:
    from app.core.optimise.optimiser import count_valid_layouts, optimal_layout

    rng = random.Random(seed)
    t_start = time.monotonic()
    per_size: dict[str, dict] = {}
    mismatches = 0
    for n in SIZES:
        rows = []
        for pp, vpp, _ in itertools.product(PPS, VPPS, range(SEEDS_PER_CASE)):
            if time.monotonic() - t_start > budget_seconds:
                break
            s = pp * vpp
            while True:
                full = [True] + [rng.random() < FULL_PROBABILITY for _ in range(n - 1)]
                if s <= sum(full) and count_valid_layouts(full, s) <= MAX_BRUTE_LAYOUTS:
                    break
            costs = [rng.randint(1, 100) for _ in range(n)]
            fe, le = rng.randint(0, 200), rng.randint(0, 200)
            t0 = time.perf_counter()
            want, seen = brute_force(costs, full, pp, vpp, fe, le)
            t_brute = time.perf_counter() - t0
            t_dp, reps, lay = _p50_time(lambda c=costs, f=full, p=pp, v=vpp, a=fe, b=le: optimal_layout(c, f, p, v, a, b), 20, 0.5)
            ok = lay is not None and lay.exact and lay.split == want
            mismatches += not ok
            rows.append({"n": n, "full": sum(full), "pp": pp, "vpp": vpp, "layouts": seen, "brute_s": t_brute,
                         "dp_p50_s": t_dp, "dp_repeats": reps, "ratio": t_brute / t_dp, "agree": ok})
        if not rows:
            continue
        ratios = [r["ratio"] for r in rows]
        per_size[str(n)] = {
            "instances": len(rows), "layouts_median": statistics.median(r["layouts"] for r in rows),
            "layouts_max": max(r["layouts"] for r in rows),
            "brute_median_s": statistics.median(r["brute_s"] for r in rows),
            "dp_median_s": statistics.median(r["dp_p50_s"] for r in rows),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "agree": all(r["agree"] for r in rows), "rows": rows,
        }
        d = per_size[str(n)]
        print(f"optimiser N={n}: {d['instances']} instances, layouts median {d['layouts_median']:,.0f} "
              f"(max {d['layouts_max']:,}), brute {ms(d['brute_median_s'])} vs DP {ms(d['dp_median_s'])} "
              f"-> brute/DP x{d['ratio_median']:.1f} median (x{d['ratio_min']:.1f}..x{d['ratio_max']:.1f}), "
              f"{'all agree' if d['agree'] else 'DISAGREE'}")
    return {"per_size": per_size, "mismatches": mismatches, "seconds": time.monotonic() - t_start}


def dp_alone(repeats: int = 11, seconds: float = 10.0) -> dict:
    from app.core.engines import role_rule
    from app.core.model.config import load_config_bytes, load_preset
    from app.core.model.layer_costs import layer_costs
    from app.core.model.roles import derive_roles
    from app.core.optimise.optimiser import optimal_layout
    from bench.scaling import full_mask, synthetic_config

    glm = load_preset("glm-5.2")
    roles = derive_roles(glm, role_rule("megatron"))
    glm_full = [r.role == "full" for r in roles.layers]
    lc = layer_costs(glm, roles, "balanced")
    big = synthetic_config(1024)
    big_full = full_mask(big)
    assert load_config_bytes(big).num_hidden_layers == 1024
    cases = [
        ("glm-5.2 PP8 VPP2 uniform", lambda: optimal_layout([1.0] * 78, glm_full, 8, 2)),
        ("glm-5.2 PP8 VPP2 balanced", lambda: optimal_layout(list(lc.costs), glm_full, 8, 2,
                                                              lc.first_stage_extra, lc.last_stage_extra)),
        ("1024 layers PP64 VPP1 uniform", lambda: optimal_layout([1.0] * 1024, big_full, 64, 1)),
        ("1024 layers PP16 VPP2 uniform", lambda: optimal_layout([1.0] * 1024, big_full, 16, 2)),
    ]
    out = {}
    for name, fn in cases:
        p50, reps, lay = _p50_time(fn, repeats, seconds)
        out[name] = {"p50_s": p50, "repeats": reps, "exact": lay.exact, "unit": lay.unit, "note": lay.note,
                     "max_cost": lay.max_cost, "split": lay.split}
        print(f"optimiser DP {name}: p50 {ms(p50)} over {reps} runs"
              + ("" if lay.exact else f" (not exact: fell back to the stage objective; {lay.note.split(';')[0]})"))
    return out


def main() -> dict:
    t0 = time.monotonic()
    result = {"vs_brute_force": vs_brute(), "dp_alone": dp_alone()}
    result["seconds"] = time.monotonic() - t0
    save("optimiser_speed", result)
    vb = result["vs_brute_force"]
    sizes = ", ".join(f"N={n} x{d['ratio_median']:.0f}" for n, d in vb["per_size"].items())
    print(f"optimiser brute/DP median speed ratio: {sizes}; DP disagreements with brute force: {vb['mismatches']}")
    return result


if __name__ == "__main__":
    main()
