"""Every figure the page draws is a valid Plotly figure (checked with plotly.graph_objects) and
says in text what its colours say."""

from __future__ import annotations

import plotly.graph_objects as go

from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.web.figures import compute_figure, context_figure, memory_figure, schedule_figure
from app.web.store import ConfigStore
from app.web.view import build_view


def test_default_profile_figures_are_valid_plotly(tmp_path):
    v = build_view(SLIME_GLM52_PROFILE, [], ConfigStore(tmp_path / "s.sqlite3"))
    figs = {
        "memory": memory_figure(v.ev.memory),
        "compute": compute_figure(v.ev.stage_flops),
        "context": context_figure(v.cfg, v.check.roles, 1 << 20),
        "schedule": schedule_figure(8, 64, 7 / 71),
    }
    for name, fig in figs.items():
        go.Figure(fig)  # raises on any invalid property
        assert fig["layout"]["title"]["text"], name
        assert all(trace.get("name") for trace in fig["data"]), name  # every colour has a legend name
    mem = figs["memory"]
    # stacked bars sum to each rank's total (GB), and the capacity line is the H100's 80 GB
    for i, stage in enumerate(v.ev.memory["stages"]):
        stacked = sum(t["y"][i] for t in mem["data"] if t["type"] == "bar")
        assert abs(stacked - stage["total_bytes"] / 1e9) < 1e-6
    assert mem["data"][-1]["y"][0] == 80.0
    assert figs["context"]["layout"]["xaxis"]["type"] == "log"


def test_schedule_has_every_forward_and_backward_once():
    fig = schedule_figure(4, 6, 3 / 9)
    fwd, bwd = fig["data"]
    assert len(fwd["x"]) == 4 * 6 and len(bwd["x"]) == 4 * 6
    assert set(fwd["x"]) == {1} and set(bwd["x"]) == {2}
    # rank 0 starts micro-batch 1 at time 0; the last rank can start only after 3 forwards upstream
    starts = {(y, t): b for y, t, b in zip(fwd["y"], fwd["text"], fwd["base"])}
    assert starts[("rank 0", "1")] == 0 and starts[("rank 3", "1")] == 3
