"""Plotly figures, built in Python as plain figure dicts (``{"data": [...], "layout": {...}}``).

The page's static JS hands them to ``Plotly.react`` from a ``data-figure`` JSON attribute, so no
inline script is needed (strict CSP). Building the dicts directly instead of through
``plotly.graph_objects`` keeps a live update within single-digit milliseconds; the tests feed
every figure through ``plotly.graph_objects.Figure`` to check it is a valid figure.

Palette: Okabe-Ito (colour-blind safe); every series also has a name, and bars carry text.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from app.core.model.flops import flops_vs_context

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
MEMORY_ORDER = ["weights", "gradients", "optimizer_states", "activations", "recompute_working_set",
                "topk_indices", "indexer_logits", "logits"]
MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
                 "activations": "activations", "recompute_working_set": "recompute working set",
                 "topk_indices": "IndexShare top-k indices", "indexer_logits": "indexer FP32 logits (transient)",
                 "logits": "logits"}

_BASE_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 320,
    "legend": {"orientation": "h", "y": -0.25},
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {**_BASE_LAYOUT, "title": {"text": title, "font": {"size": 14}}, **extra}


def memory_figure(memory: dict[str, Any]) -> dict[str, Any]:
    ranks = [f"rank {s['pp_rank']}" for s in memory["stages"]]
    data = []
    for i, key in enumerate(MEMORY_ORDER):
        ys = [s["breakdown"].get(key, 0) / 1e9 for s in memory["stages"]]
        if not any(ys):
            continue
        data.append({"type": "bar", "name": MEMORY_LABELS[key], "x": ranks, "y": ys,
                     "marker": {"color": OKABE_ITO[i % len(OKABE_ITO)]},
                     "hovertemplate": "%{x}: %{y:.1f} GB " + MEMORY_LABELS[key] + "<extra></extra>"})
    cap = memory["stages"][0]["capacity_bytes"] / 1e9 if memory["stages"] else 0
    data.append({"type": "scatter", "mode": "lines", "name": f"GPU capacity {cap:.0f} GB", "x": ranks,
                 "y": [cap] * len(ranks), "line": {"color": "#000000", "dash": "dash", "width": 2}})
    return {"data": data, "layout": _layout("Memory per GPU by pipeline rank (GB)", barmode="stack",
                                            yaxis={"title": {"text": "GB (1e9 bytes)"}})}


def compute_figure(flops: dict[str, Any]) -> dict[str, Any]:
    stages = flops["stages"]
    xs = [f"s{s['index'] + 1} (r{s['pp_rank']}" + (f" v{s['vp_stage']})" if flops["vpp"] > 1 else ")") for s in stages]
    ys = [s["flops"] / 1e12 for s in stages]
    mean = sum(ys) / len(ys) if ys else 0
    return {"data": [
        {"type": "bar", "name": "forward TFLOPs per micro-batch", "x": xs, "y": ys,
         "marker": {"color": OKABE_ITO[0]}, "text": [f"{y:.0f}" for y in ys], "textposition": "outside",
         "hovertemplate": "%{x}: %{y:.1f} TFLOPs<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": f"mean {mean:.0f}", "x": xs, "y": [mean] * len(xs),
         "line": {"color": OKABE_ITO[5], "dash": "dot"}},
    ], "layout": _layout(f"Compute balance per stage (imbalance {flops.get('imbalance', 1):.2f}×)",
                         yaxis={"title": {"text": "TFLOPs"}})}


@lru_cache(maxsize=64)
def _context_curve(cfg, roles, max_context: int) -> tuple[list[int], dict[str, Any]]:
    contexts = []
    c = 1024
    while c <= max_context:
        contexts.append(c)
        c *= 2
    if contexts[-1] != max_context:
        contexts.append(max_context)
    return contexts, flops_vs_context(cfg, contexts, roles=roles)


def context_figure(cfg, roles, max_context: int) -> dict[str, Any]:
    contexts, fc = _context_curve(cfg, roles, max_context)
    return {"data": [
        {"type": "scatter", "mode": "lines+markers", "name": "IndexShare (as configured)", "x": contexts,
         "y": [v / 1e9 for v in fc["indexshare_flops"]], "line": {"color": OKABE_ITO[0]}},
        {"type": "scatter", "mode": "lines+markers", "name": "indexer on every layer", "x": contexts,
         "y": [v / 1e9 for v in fc["every_layer_flops"]], "line": {"color": OKABE_ITO[1], "dash": "dash"},
         "marker": {"symbol": "square"}},
        {"type": "scatter", "mode": "lines", "name": "ratio (right axis)", "x": contexts, "y": fc["ratio"],
         "yaxis": "y2", "line": {"color": OKABE_ITO[2], "dash": "dot"}},
    ], "layout": _layout("Forward GFLOPs per token vs context", xaxis={"type": "log", "title": {"text": "context (tokens)"}},
                         yaxis={"title": {"text": "GFLOPs / token"}},
                         yaxis2={"title": {"text": "ratio"}, "overlaying": "y", "side": "right", "rangemode": "tozero"})}


def schedule_figure(pp: int, microbatches: int, bubble: float) -> dict[str, Any]:
    """A 1F1B schedule (forward 1 unit, backward 2) for up to 8 micro-batches, by simulation."""
    m = max(1, min(microbatches, 8))
    free = [0.0] * pp
    f_done: dict[tuple[int, int], float] = {}
    b_done: dict[tuple[int, int], float] = {}
    orders = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        seq = [("F", i) for i in range(warm)]
        fi, bi = warm, 0
        while fi < m or bi < m:
            if fi < m:
                seq.append(("F", fi))
                fi += 1
            if bi < m:
                seq.append(("B", bi))
                bi += 1
        orders.append(seq)
    pos = [0] * pp
    bars: list[tuple[int, str, int, float, float]] = []
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, i = orders[r][pos[r]]
                if kind == "F":
                    dep = f_done.get((r - 1, i), 0.0) if r > 0 else 0.0
                    if r > 0 and (r - 1, i) not in f_done:
                        break
                    start = max(free[r], dep)
                    end = start + 1
                    f_done[(r, i)] = end
                else:
                    if (r, i) not in f_done or (r < pp - 1 and (r + 1, i) not in b_done):
                        break
                    dep = b_done.get((r + 1, i), f_done[(r, i)]) if r < pp - 1 else f_done[(r, i)]
                    start = max(free[r], dep)
                    end = start + 2
                    b_done[(r, i)] = end
                free[r] = end
                bars.append((r, kind, i, start, end))
                pos[r] += 1
                progress = True
    data = []
    for kind, color, name in (("F", OKABE_ITO[4], "forward"), ("B", OKABE_ITO[1], "backward")):
        sel = [b for b in bars if b[1] == kind]
        data.append({"type": "bar", "orientation": "h", "name": name, "y": [f"rank {b[0]}" for b in sel],
                     "x": [b[4] - b[3] for b in sel], "base": [b[3] for b in sel],
                     "text": [str(b[2] + 1) for b in sel], "textposition": "inside",
                     "marker": {"color": color, "line": {"color": "#000000", "width": 0.5}},
                     "hovertemplate": name + " micro-batch %{text}<extra></extra>"})
    return {"data": data, "layout": _layout(
        f"1F1B schedule, {m} micro-batches (bubble {bubble * 100:.1f}% as configured)",
        barmode="overlay", yaxis={"autorange": "reversed"}, xaxis={"title": {"text": "time (forward = 1)"}})}


def page_figures(v: Any) -> dict[str, Any]:
    """The page's figures for a :class:`app.web.view.PlanView` (only those with data)."""
    from app.core.model.flops import bubble_fraction

    ev = v.ev
    figs: dict[str, Any] = {}
    if ev.memory:
        figs["memory"] = memory_figure(ev.memory)
    if ev.stage_flops:
        figs["compute"] = compute_figure(ev.stage_flops)
    if ev.check is not None:
        figs["context"] = context_figure(ev.cfg, ev.check.roles, v.plan.context)
        stages = ev.check.plan
        if ev.par is not None and stages.stages:
            m = ev.par.microbatches or 8 * stages.pp
            figs["schedule"] = schedule_figure(stages.pp, m, bubble_fraction(stages.pp, stages.vpp, m))
    return figs
