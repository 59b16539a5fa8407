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

#: No height: a figure fills its container (``static/app.css``: 330 px, 280 px on a phone, 480 px
#: ``.tall``), which Plotly measures when it draws (``autosize``); a fixed height overflowed the
#: phone's shorter containers and cut the axis titles off.
_BASE_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 10, "b": 50},
    "legend": {"orientation": "h", "y": -0.25},
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
}


def _layout(**extra: Any) -> dict[str, Any]:
    """The shared layout; the page's caption is the figure's title (no title inside the plot)."""
    return {**_BASE_LAYOUT, **extra}


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
    # up to nine legend entries: a tall figure (its container is ``.plotly-figure.tall``) with room
    # below the plot for them - two columns beside each other, one on a phone - so the legend is
    # never cut to a scrolling box
    return {"data": data, "layout": _layout(barmode="stack", yaxis={"title": {"text": "GB (1e9 bytes)"}},
                                            margin={"l": 60, "r": 20, "t": 10, "b": 200},
                                            legend={"orientation": "h", "y": -0.1, "yanchor": "top",
                                                    "font": {"size": 11}})}


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
    ], "layout": _layout(yaxis={"title": {"text": "TFLOPs"}})}


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
    ], "layout": _layout(xaxis={"type": "log", "title": {"text": "context (tokens)"}, "domain": [0, 0.9]},
                         # inside the plot's empty upper left (the curves rise to the right), so a
                         # phone's shorter figure does not put it over the axis title
                         legend={"x": 0.02, "y": 0.98, "xanchor": "left", "yanchor": "top",
                                 "bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 11}},
                         yaxis={"title": {"text": "GFLOPs / token"}}, margin={"l": 60, "r": 70, "t": 10, "b": 50},
                         yaxis2={"title": {"text": "every layer / configured", "standoff": 8},
                                 "overlaying": "y", "side": "right", "anchor": "free", "position": 0.93,
                                 "tickmode": "auto", "showgrid": False,
                                 "rangemode": "tozero"})}


#: step-time items in the order the breakdown figure stacks them (app.core.time: ``breakdown`` keys)
TIME_ORDER = ["compute", "recompute", "host", "tp", "cp", "ep", "pp", "bubble", "dp", "optimizer"]
TIME_LABELS = {"compute": "compute", "recompute": "recompute", "host": "host-bound work", "tp": "TP communication",
               "cp": "CP communication", "ep": "EP all-to-all", "pp": "PP sends", "bubble": "pipeline bubble",
               "dp": "DP / EDP collectives", "optimizer": "optimizer step"}


def time_figure(time: dict[str, Any]) -> dict[str, Any]:
    """The step time's breakdown (``time.breakdown``: seconds exposed on the critical path, and in
    total, per item): exposed time as bars, the part hidden behind other work as a lighter bar."""
    bd = time["breakdown"]
    items = [k for k in TIME_ORDER if k in bd] + [k for k in bd if k not in TIME_ORDER]
    labels = [TIME_LABELS.get(k, k) for k in items]
    exposed = [bd[k]["exposed"] for k in items]
    hidden = [max(0.0, bd[k]["total"] - bd[k]["exposed"]) for k in items]
    return {"data": [
        {"type": "bar", "orientation": "h", "name": "exposed (on the step's critical path)", "y": labels, "x": exposed,
         "marker": {"color": OKABE_ITO[0]}, "text": [f"{x:.2f} s" for x in exposed], "textposition": "auto",
         "hovertemplate": "%{y}: %{x:.3f} s exposed<extra></extra>"},
        {"type": "bar", "orientation": "h", "name": "overlapped (hidden behind other work)", "y": labels, "x": hidden,
         "marker": {"color": OKABE_ITO[4]}, "hovertemplate": "%{y}: %{x:.3f} s overlapped<extra></extra>"},
    ], "layout": _layout(barmode="stack", margin={"l": 20, "r": 20, "t": 10, "b": 50},  # labels size it (automargin)
                         xaxis={"title": {"text": "seconds per step"}}, yaxis={"autorange": "reversed", "automargin": True})}


#: above this many forward/backward entries the schedule is drawn as each rank's busy intervals
DETAILED_ENTRIES = 4000


def timeline_figure(tl: dict[str, Any], time: dict[str, Any] | None) -> dict[str, Any]:
    """The simulated pipeline schedule (``Evaluation.timeline()``: columns rank, chunk,
    microbatch, kind F/B, start, end): every micro-batch's forward and backward on every rank at
    its real start and duration, as line segments (one trace per kind, segments separated by
    gaps), so 100k entries stay a few traces. Beyond :data:`DETAILED_ENTRIES` entries, each rank's
    consecutive work is merged into busy intervals (gaps shorter than 1/2000 of the step are
    closed) and the idle time left is the bubble."""
    n = len(tl["rank"])
    ranks = sorted(set(tl["rank"]))
    makespan = max(tl["end"]) if n else 0.0
    data: list[dict[str, Any]] = []
    if n <= DETAILED_ENTRIES:
        for kind, colour, name in (("F", OKABE_ITO[4], "forward"), ("B", OKABE_ITO[1], "backward")):
            xs: list[float | None] = []
            ys: list[str | None] = []
            for i in range(n):
                if tl["kind"][i] == kind:
                    xs += [tl["start"][i], tl["end"][i], None]
                    ys += [f"rank {tl['rank'][i]}"] * 2 + [None]
            data.append({"type": "scatter", "mode": "lines", "name": name, "x": xs, "y": ys,
                         "line": {"color": colour, "width": 14}, "hoverinfo": "skip"})
        caption = (f"The simulated schedule: {n} forward and backward passes (every micro-batch, real durations); "
                   "a gap on a rank is pipeline bubble.")
    else:
        gap = makespan / 2000
        xs, ys = [], []
        for r in ranks:
            spans = sorted((s, e) for rk, s, e in zip(tl["rank"], tl["start"], tl["end"]) if rk == r)
            cur_s, cur_e = spans[0]
            for s, e in spans[1:]:
                if s - cur_e > gap:
                    xs += [cur_s, cur_e, None]
                    ys += [f"rank {r}"] * 2 + [None]
                    cur_s = s
                cur_e = max(cur_e, e)
            xs += [cur_s, cur_e, None]
            ys += [f"rank {r}"] * 2 + [None]
        data.append({"type": "scatter", "mode": "lines", "name": "busy (forward or backward)", "x": xs, "y": ys,
                     "line": {"color": OKABE_ITO[0], "width": 14}, "hoverinfo": "skip"})
        caption = (f"The simulated schedule: {n:,} forward and backward passes, drawn as each rank's busy intervals; "
                   "the gaps are pipeline bubble.")
    bubble = (time or {}).get("bubble_fraction")
    alt = (f"pipeline schedule over {len(ranks)} ranks, {makespan:.2f} s of compute and communication"
           + (f", bubble {bubble * 100:.1f}% of the ranks' time" if bubble is not None else ""))
    return {"figure": {"data": data, "layout": _layout(
        height=max(220, 80 + 28 * len(ranks)), showlegend=True, margin={"l": 70, "r": 20, "t": 30, "b": 50},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
        yaxis={"autorange": "reversed", "type": "category"}, xaxis={"title": {"text": "seconds"}})},
        "caption": caption, "alt": alt}


def _context_of(ev: Any) -> int | None:
    """The plan's context for the FLOPs-against-context figure (``None``: the model states no
    maximum and the plan no context; the figure is left out and the field says why)."""
    try:
        return int(ev.engine.context(ev.cfg, ev.plan))
    except ValueError:
        return None


def page_figures(v: Any) -> dict[str, Any]:
    """The page's figures for a :class:`app.web.view.PlanView` (only those with data), each
    ``{figure, caption, alt}``: the caption says what the figure shows (the figures carry no title
    of their own), ``alt`` is its text equivalent in one line."""
    ev = v.ev
    figs: dict[str, Any] = {}
    if ev.memory and ev.memory["stages"]:
        worst = max(ev.memory["stages"], key=lambda s: s["total_bytes"])
        figs["memory"] = {"figure": memory_figure(ev.memory), "tall": True,
                          "caption": "Memory per GPU by pipeline rank (GB), stacked by term, against the GPU's capacity.",
                          "alt": f"largest rank {worst['pp_rank']}: {worst['total_bytes'] / 1e9:.1f} GB of "
                                 f"{worst['capacity_bytes'] / 1e9:.0f} GB"}
    if ev.stage_flops:
        figs["compute"] = {"figure": compute_figure(ev.stage_flops),
                           "caption": f"Forward TFLOPs per micro-batch of each stage (imbalance "
                                      f"{ev.stage_flops.get('imbalance', 1):.2f}×: slowest over mean).",
                           "alt": "forward TFLOPs per stage"}
    if ev.time and "unavailable" not in ev.time:
        figs["time"] = {"figure": time_figure(ev.time),
                        "caption": f"Where a step's {ev.time['step_seconds']:.2f} s go: exposed seconds per item, and "
                                   "the part overlapped with other work.",
                        "alt": "step time breakdown: " + ", ".join(
                            f"{TIME_LABELS.get(k, k)} {d['exposed']:.2f} s" for k, d in ev.time["breakdown"].items()
                            if d["exposed"] > 0)}
    context = _context_of(ev)
    if ev.check is not None and context is not None:
        figs["context"] = {"figure": context_figure(ev.cfg, ev.check.roles, context),
                           "caption": "Forward GFLOPs per token against context length, as configured and with an "
                                      "indexer on every layer, and their ratio (right axis).",
                           "alt": "per-token FLOPs against context"}
    return figs
