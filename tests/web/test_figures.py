"""Every figure the page draws is a valid Plotly figure (checked with plotly.graph_objects), says in
text what its colours say, and draws exactly the numbers it is given (checked against hand-made
inputs, never against the figure code's own output)."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.web import figures
from app.web.figures import page_figures, time_figure, timeline_figure
from app.web.routers.pages import templates
from app.web.store import ConfigStore
from app.web.view import build_view


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    return build_view(SLIME_GLM52_PROFILE, [], ConfigStore(tmp_path_factory.mktemp("s") / "s.sqlite3"))


def test_default_profile_figures_are_valid_plotly(view):
    figs = page_figures(view)
    assert set(figs) == {"memory", "compute", "time", "context"}
    for name, entry in figs.items():
        fig = entry["figure"]
        go.Figure(fig)  # raises on any invalid property
        assert entry["caption"] and entry["alt"], name
        assert "title" not in fig["layout"], name  # the caption is the title: said once
        assert all(trace.get("name") for trace in fig["data"]), name  # every colour has a legend name
    mem = figs["memory"]["figure"]
    # stacked bars sum to each rank's total (GB), and the capacity line is the H100's 80 GB
    for i, stage in enumerate(view.ev.memory["stages"]):
        stacked = sum(t["y"][i] for t in mem["data"] if t["type"] == "bar")
        assert abs(stacked - stage["total_bytes"] / 1e9) < 1e-6
    assert mem["data"][-1]["y"][0] == 80.0
    ctx = figs["context"]["figure"]["layout"]
    assert ctx["xaxis"]["type"] == "log"
    # the right axis sits beside the plot area, not on top of it (issue 17: its label overlapped)
    assert ctx["yaxis2"]["position"] > ctx["xaxis"]["domain"][1]


def test_time_breakdown_draws_exposed_and_overlapped_seconds():
    time = {"step_seconds": 3.0, "breakdown": {"compute": {"exposed": 2.0, "total": 2.0},
                                               "dp": {"exposed": 0.25, "total": 1.0},
                                               "bubble": {"exposed": 0.75, "total": 0.75}}}
    fig = time_figure(time)
    go.Figure(fig)
    exposed, hidden = fig["data"]
    # stacking order is the figure's own (compute, bubble, dp); the values are the input's
    assert exposed["y"] == ["compute", "pipeline bubble", "DP / EDP collectives"]
    assert exposed["x"] == [2.0, 0.75, 0.25]
    assert hidden["x"] == [0.0, 0.0, 0.75]  # dp: 1.0 total, 0.25 exposed -> 0.75 hidden behind backward


def _timeline(entries):
    cols = {k: [] for k in ("rank", "chunk", "microbatch", "kind", "start", "end")}
    for rank, mb, kind, start, end in entries:
        for k, v in zip(cols, (rank, 0, mb, kind, start, end)):
            cols[k].append(v)
    return cols


def test_timeline_draws_every_pass_at_its_real_time():
    # two ranks, two micro-batches of 1F1B with forward 1 s and backward 2 s, written out by hand
    entries = [(0, 0, "F", 0, 1), (0, 1, "F", 1, 2), (1, 0, "F", 1, 2), (1, 0, "B", 2, 4), (1, 1, "F", 4, 5),
               (0, 0, "B", 4, 6), (1, 1, "B", 5, 7), (0, 1, "B", 7, 9)]
    out = timeline_figure(_timeline(entries), {"bubble_fraction": 0.2})
    go.Figure(out["figure"])
    fwd, bwd = out["figure"]["data"]
    segments = {name: list(zip(t["x"][0::3], t["x"][1::3], t["y"][0::3])) for name, t in (("F", fwd), ("B", bwd))}
    assert sorted(segments["F"]) == sorted((s, e, f"rank {r}") for r, _, k, s, e in entries if k == "F")
    assert sorted(segments["B"]) == sorted((s, e, f"rank {r}") for r, _, k, s, e in entries if k == "B")
    assert "bubble 20.0%" in out["alt"] and "8 forward and backward" in out["caption"]


def test_a_large_timeline_is_drawn_as_busy_intervals(monkeypatch):
    monkeypatch.setattr(figures, "DETAILED_ENTRIES", 2)
    # rank 0 works 0-1, 1-2 (touching: one interval) and 5-6; rank 1 works 1-3
    out = timeline_figure(_timeline([(0, 0, "F", 0, 1), (0, 1, "F", 1, 2), (0, 0, "B", 5, 6), (1, 0, "F", 1, 3)]), None)
    (busy,) = out["figure"]["data"]
    assert list(zip(busy["x"][0::3], busy["x"][1::3], busy["y"][0::3])) == [
        (0, 2, "rank 0"), (5, 6, "rank 0"), (1, 3, "rank 1")]
    assert "busy intervals" in out["caption"]


def test_a_figure_on_the_page_reads_back_as_the_figure_it_was_built_from(view):
    """The page embeds each figure as ``data-figure="<JSON>"`` through Jinja's ``tojson`` (with
    pydantic-core's encoder, :func:`app.web.routers.pages.figure_json`) and ``forceescape``: the
    attribute, HTML-unescaped as the browser does, is JSON whose value is the figure; text that
    could end the attribute or a script stays escaped, and a NaN arrives as ``null`` (which the
    browser's ``JSON.parse`` reads) instead of :mod:`json`'s ``NaN``."""
    import html
    import json
    import math
    import re

    from app.web.routers.pages import page_context, templates

    body = templates().get_template("_fragment.html").render(page_context(None, view, same_form=True))
    found = dict(re.findall(r'id="fig-(\w+)" data-figure="([^"]*)"', body))
    for name, entry in page_figures(view).items():
        assert json.loads(html.unescape(found[name])) == entry["figure"], name
    tpl = templates().env.from_string('<div data-figure="{{ x|tojson|forceescape }}"></div>')
    hostile = {"name": "</script><b a='1'>&", "y": [1.5, math.nan, math.inf]}
    out = tpl.render(x=hostile)
    assert "<b" not in out and "</script>" not in out and "'" not in out
    value = json.loads(html.unescape(re.search(r'data-figure="([^"]*)"', out).group(1)))
    assert value == {"name": hostile["name"], "y": [1.5, None, None]}


# --------------------------------------------------------------------------- the data-figure attribute
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


def test_figure_attribute_hand_case():
    """Each character JSON can carry that HTML would read: ``<`` ``>`` ``&`` ``'`` as JSON's
    ``\\u`` escapes (``tojson``), then ``"`` as ``&#34;`` (``forceescape``), worked out by hand."""
    got = templates().env.from_string("{{ x|figure_attribute }}").render(x={"a": "<b>'x' & \"y\""})
    assert got == r"{&#34;a&#34;:&#34;\u003cb\u003e\u0027x\u0027 \u0026 \&#34;y\&#34;&#34;}"


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_figure_attribute_is_tojson_then_forceescape(value):
    """The page's one-step filter writes exactly what Jinja's ``tojson|forceescape`` wrote before
    it (the same environment, so the same JSON encoder), for any JSON value - markup characters,
    quotes, non-ASCII, lone surrogates (the :mod:`json` fallback) and NaN included."""
    env = templates().env
    assert (env.from_string("{{ x|figure_attribute }}").render(x=value)
            == env.from_string("{{ x|tojson|forceescape }}").render(x=value))
