"""The page's server side (issues 16 and 17), without a browser: what the form holds, what the URL
keeps, what is judged, each engine's own form and the serving workflow, the profiles the start
actions open, the launcher import's report and the uploaded config's download.

Expected values are written here by hand (flag names from each engine's documentation, layer
arithmetic of GLM-5.2's full layers ``GLM52_FULL`` from seed 000), or read from another route of
the app that is not the page (``/api/v1/check``, ``/api/v1/time``)."""

from __future__ import annotations

import hashlib
import json
import re
from html import unescape
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from app.core.engines import ENGINES
from app.core.model.config import preset_ids
from tests.conftest import GLM52_FULL, REPO


def page(client, query: str) -> str:
    r = client.get("/?" + query)
    assert r.status_code == 200, r.text[:300]
    return unescape(r.text)


def fragment(client, query: str, **headers: str):
    r = client.get("/fragment?" + query, headers={"HX-Request": "true", **headers})
    assert r.status_code == 200, r.text[:300]
    return r


def shown_url(resp) -> dict[str, str]:
    url = resp.headers.get("hx-replace-url") or resp.headers["hx-push-url"]
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def form_controls(html: str) -> dict[str, str]:
    """id -> tag of every control of the settings form (``#controls``) in ``html``."""
    form = re.search(r'<form id="controls".*?</form>', html, re.S).group(0)
    return {m.group(2): m.group(1) for m in re.finditer(r'<(input|select)[^>]*\bid="([^"]+)"', form)}


# --------------------------------------------------------------------------- the URL and the form


def test_an_unknown_key_is_said(client):
    html = page(client, "pp=8&first=14&last=16&frist=14")
    assert "unknown setting 'frist'; did you mean first?" in html


def test_a_bad_value_stays_in_the_share_url_and_the_field(client):
    r = fragment(client, "pp=abc&tp=4&split=14,8,8,8,8,8,8,16")
    assert shown_url(r)["pp"] == "abc"  # the recipient sees the same message, not a silently different plan
    assert re.search(r'<input id="pp" name="pp" type="text"[^>]*value="abc"', r.text)
    assert "whole number" in unescape(r.text)


def test_the_form_sends_each_setting_once(client):
    """No hidden 0 beside a checkbox (it wrote sp=0&sp=1): an unchecked box sends nothing."""
    html = page(client, "")  # the slime profile: sp is on
    form = re.search(r'<form id="controls".*?</form>', html, re.S).group(0)
    names = re.findall(r'<(?:input|select)[^>]*\bname="([^"]+)"', form)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert re.search(r'<input id="sp" name="sp" type="checkbox" value="1" checked', form)


def test_a_field_the_url_does_not_hold_is_blank(client):
    """Load the plain layout URL: no parallel setting shown, so none is sent back, and none judged."""
    html = page(client, "pp=8&first=14&last=16")
    assert re.search(r'<input id="tp" name="tp" type="text"[^>]*value=""', html)
    assert re.search(r'<select id="gpu" name="gpu"[^>]*><option value="" selected>unset', html)
    assert "Not judged:" in html and "GPU count not judged" in html
    # the page's verdict is the CLI's for the same URL (both judge the layout only): GO
    check = client.get("/api/v1/check?pp=8&first=14&last=16").json()
    assert check["verdict"]["go"] is True and check["verdict"]["judged"] == ["layout"]
    assert "<strong>GO</strong>" in html


@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_engine_form_is_its_own_fields(client, engine):
    html = page(client, f"engine={engine}")
    controls = set(form_controls(html))
    assert controls - {"action", "compare-a"} == set(ENGINES[engine].fields) - {"model", "engine"}


@pytest.mark.parametrize("engine, field, flag", [
    ("megatron", "tp", "--tensor-model-parallel-size"), ("megatron", "pp", "--pipeline-model-parallel-size"),
    ("slime", "tokens_per_gpu", "--max-tokens-per-gpu"), ("vllm", "tp", "--tensor-parallel-size"),
    ("vllm", "split", "VLLM_PP_LAYER_PARTITION"), ("sglang", "pp", "--pp-size"),
    ("sglang", "split", "SGLANG_PP_LAYER_PARTITION"), ("maxtext", "layers_per_pipeline_stage",
                                                       "num_layers_per_pipeline_stage"),
])
def test_fields_carry_the_engines_own_names(client, engine, field, flag):
    """Each flag as the engine's own documentation spells it (vLLM's engine args, SGLang's server
    args, MaxText's base.yml, Megatron's arguments.py, slime's arguments.py)."""
    html = page(client, f"engine={engine}")
    assert re.search(rf'<label for="{field}"><b>{field}</b> <code>{re.escape(flag)}</code></label>', html), (engine, field)


def test_serving_is_a_serving_workflow(client):
    """SGLang (latest build hands the top-k over) at PP 8 on GLM-5.2's default partition: only serving
    settings and exports; the stages that start on a shared layer are not called invalid."""
    html = page(client, "model=glm-5.2&engine=sglang&pp=8&tp=8")
    controls = set(form_controls(html))
    assert not controls & {"cp", "recompute", "optimizer_cpu_offload", "use_precision_aware_optimizer", "conv_pp"}
    exports = set(re.findall(r'<pre id="export-([a-z_]+)"', html))
    assert exports <= {"serve", "serve_env", "serve_command", "cli"} and "megatron" not in exports
    stages = re.search(r'<table id="stage-table">.*?</table>', html, re.S).group(0)
    assert "invalid" not in stages and "shared (handoff)" in stages
    # SGLang's default for 78 layers over 8 ranks gives the last 78 % 8 = 6 ranks one extra: 9,9,10,...
    sizes = [9, 9, 10, 10, 10, 10, 10, 10]
    starts = [1 + sum(sizes[:i]) for i in range(8)]
    assert [s for s in starts if s not in GLM52_FULL], "the default puts some stage on a shared layer"


def test_a_model_without_an_indexer_is_not_said_to_start_stages_on_indexer_layers(client):
    """The boundary line, the checks list and the map's legend of a model without a DSA indexer
    (Llama 3.1 70B: no ``index_*`` sizes) say no layer reuses another's top-k; GLM-5.2's say
    full indexer layers and explain F / S as top-k computed / reused."""
    llama = page(client, "model=llama-3.1-70b&engine=megatron&split=7,13,11,9,10,10,10,10")
    free = "no layer reuses another's top-k (no DSA indexer), so a stage may start on any layer"
    assert f"Boundary: {free}." in llama
    assert f'<li class="okline">{free}</li>' in llama
    assert ("F = full: llama-3.1-70b has no DSA indexer, so no layer shares top-k and any layer may start a "
            "stage") in llama
    assert "indexer layer" not in llama and "computes top-k" not in llama
    glm = page(client, "model=glm-5.2&split=14,8,8,8,8,8,8,16")
    assert "Boundary: every stage starts on a full indexer layer." in glm
    assert '<li class="okline">every stage starts on a full indexer layer</li>' in glm
    assert "F = full (computes top-k), S = shared (reuses the top-k of the full layer before it)" in glm
    vpp = page(client, "model=llama-3.1-70b&engine=megatron&split=10,10,10,10,10,10,10,10&vpp=2")
    assert "so a physical and virtual stage may start on any layer" in vpp


@pytest.mark.parametrize(("query", "line"), [
    ("model=glm-5.2&engine=sglang&pp=8&tp=8&gpu=b200-180gb", "TP 8 × PP 8 = 64 GPUs (one SGLang server)"),
    ("model=glm-5.2&engine=vllm&pp=2&tp=8&gpu=b200-180gb", "TP 8 × PP 2 = 16 GPUs (one vLLM server)"),
    ("model=glm-5.2&engine=vllm&mode=split&split=15,20,24,19&tp=4", "TP 4 × PP 4 = 16 GPUs (one vLLM server)"),
    ("model=glm-5.2&engine=vllm", "TP 1 × PP 1 = 1 GPU (one vLLM server)"),
    ("model=glm-5.2&engine=maxtext&ici_pipeline_parallelism=4&layers_per_pipeline_stage=4",
     "GPU count not judged: MaxText's mesh (data, FSDP, tensor, expert axes) is not modelled; the pipeline has "
     "ICI 4 × DCN 1 = 4 stage(s)"),
    ("model=glm-5.2&engine=vllm&mode=split&split=20,20,20", "GPU count unavailable: fix the layout and parallel settings"),
])
def test_the_gpu_line_of_serving_and_maxtext_plans(client, query, line):
    """A serving plan occupies TP x PP GPUs (one server; the partition's length is PP); MaxText's mesh is
    not modelled, and the line says so rather than asking to fix settings that are fine. Only a
    partition the engine refuses (20+20+20 is not GLM-5.2's 78 layers) has no count."""
    html = page(client, query)
    assert f'<p class="gpus" id="gpu-count">{line}</p>' in html


def test_a_serving_stage_row_counts_the_parameters_its_gpu_holds(client):
    """The stage table's "params / GPU" of a serving plan is each rank's share under the server's TP,
    the same count its memory line weighs (bf16: 2 bytes each), not the rank's whole parameters.
    Independently: at TP 1 the ranks hold the whole model once - GLM-5.2's 743,377,000,704 parameters
    without MTP (``isplan params``, README) - and TP 8 holds less on every rank."""
    def ranks(tp: int) -> list[dict]:
        q = {"model": "glm-5.2", "engine": "sglang", "pp": "8", "tp": str(tp), "gpu": "b200-180gb"}
        r = client.get("/api/v1/check", params=q)
        assert r.status_code == 200, r.text[:300]
        return r.json()["serving_memory"]["ranks"]

    one, eight = ranks(1), ranks(8)
    assert sum(r["params_per_gpu"] for r in one) == 743_377_000_704
    assert all(r["params_per_gpu"] * 2 == r["weights_bytes"] for r in one + eight)
    assert all(e["params_per_gpu"] < o["params_per_gpu"] / 4 for o, e in zip(one, eight))
    html = page(client, "model=glm-5.2&engine=sglang&pp=8&tp=8&gpu=b200-180gb")
    body = html[html.index("<tbody", html.index("params / GPU")):]
    shown = re.findall(r"<td>(\d+\.\d\d)B</td>", body)[:8]
    assert shown == [f"{r['params_per_gpu'] / 1e9:.2f}" for r in eight]


@pytest.mark.parametrize(("engine", "edp", "vp_major"), [
    ("megatron", True, True), ("slime", True, True), ("vllm", False, False), ("sglang", False, False),
    ("maxtext", False, False),
])
def test_a_form_explains_only_the_terms_its_fields_use(client, engine, edp, vp_major):
    """The Parallelism legend explains EDP (GPUs / (ETP x EP x PP), the experts' optimizer shards) and
    the Layout legend the vp-major order of stage sizes; a serving form (TP, EP; one stage per rank)
    and MaxText's have neither ETP nor VPP, so neither explanation."""
    html = page(client, f"model=glm-5.2&engine={engine}")
    assert ("EDP (expert data parallel) = GPUs / (ETP × EP × PP)" in html) is edp
    assert ("Stage sizes are vp-major" in html) is vp_major


@pytest.mark.parametrize(("query", "unit"), [
    ("model=glm-5.2&split=14,8,8,8,8,8,8,16", "stage"),
    ("model=glm-5.2&engine=megatron&split=2,4,8,12,8,12,16,16&vpp=2", "physical and virtual stage"),
    ("model=glm-5.2&engine=vllm&mode=split&split=14,20,24,20", "rank"),
    ("model=glm-5.2&engine=maxtext&ici_pipeline_parallelism=4&layers_per_pipeline_stage=4"
     "&pipeline_parallel_layers=64", "stage of every repeat"),
])
def test_the_boundary_line_speaks_of_what_the_engine_cuts(client, query, unit):
    """Every start of these GLM-5.2 layouts is a full layer (1, 3, 7, 15, 27, 35, 47, 63 for the
    VPP 2 split; ranks 1, 15, 35, 59; MaxText's 15 + 4k): the boundary line and the checks list name
    the engine's unit - stages, physical and virtual stages, serving ranks, MaxText's stages of
    every repeat."""
    html = page(client, query)
    assert f"Boundary: every {unit} starts on a full indexer layer." in html
    assert f'<li class="okline">every {unit} starts on a full indexer layer</li>' in html


@pytest.mark.parametrize("split", ["1,0,0,1", "0,78", "14,0,8,8,8,8,24,8", "78,0"])
def test_a_split_with_an_empty_stage_draws_fixed_boundaries(client, split):
    """A stage of no layers has no first layer, so the boundaries are not sliders (each slider is
    stage k's first layer, the page's starts[k]); the page answers (it was a 500 for 1,0,0,1, found by
    schemathesis) and every boundary it draws is a fixed mark."""
    r = fragment(client, f"model=glm-5.2&engine=megatron&split={split}")
    html = unescape(r.text)
    assert 'data-movable="0"' in html and 'role="slider"' not in html
    marks = re.findall(r'<div[^>]*class="boundary[ "][^>]*>', html)
    assert all('class="boundary fixed' in m for m in marks)


def test_the_map_stays_while_the_split_is_mid_typing(client):
    r = fragment(client, "mode=split&split=14,8,8,")  # as the form sends it while the sizes are typed
    html = unescape(r.text)
    assert 'id="layer-map"' in html and "no-stages" in html
    assert len(re.findall(r'<div id="L\d+" class="cell ', html)) == 78
    assert 'id="bnd-' not in html  # no stages to bound


def test_virtual_stages_say_their_rank(client):
    # PP 2, VPP 2: four vp-major stages 13,26,13,26 -> rank 0 holds stages 1 and 3, rank 1 stages 2 and 4
    html = page(client, "split=13,26,13,26&vpp=2")
    groups = re.findall(r"<li>(pp rank \d: [^<]+)</li>", html)
    assert groups == ["pp rank 0: stage 1 (vp 0: 1–13), stage 3 (vp 1: 40–52)",
                      "pp rank 1: stage 2 (vp 0: 14–39), stage 4 (vp 1: 53–78)"]


def test_compare_table_has_no_empty_header(client):
    a = quote("split=14,8,8,8,8,8,8,16")
    html = page(client, f"split=14,7,9,8,8,8,8,16&a={a}")
    table = re.search(r'<table id="compare-table">.*?</table>', html, re.S).group(0)
    assert "<th scope=\"col\"></th>" not in table and '<th scope="col">measure</th>' in table


def test_compare_shows_a_serving_plans_memory_and_partition(client):
    """A serving plan pinned as A: its largest rank and per-rank memory are the serving memory's
    (``/api/v1/check``, in GB against the usable share of the GPU), its layout the partition
    variable the engine reads; B, a Megatron plan, keeps its training memory and layout string."""
    a = "model=glm-5.2&engine=sglang&pp=8&tp=8&gpu=b200-180gb"
    body = client.get("/api/v1/check?" + a).json()
    ranks = body["serving_memory"]["ranks"]
    worst = max(ranks, key=lambda r: r["total_bytes"])
    html = page(client, f"model=glm-5.2&engine=megatron&split=14,8,8,8,8,8,8,16&tp=4&a={quote(a)}")
    table = re.search(r'<table id="compare-table">.*?</table>', html, re.S).group(0)
    cells = dict(re.findall(r'<th scope="row">([^<]+)</th><td[^>]*>(.*?)</td>', table, re.S))
    assert cells["largest rank memory"] == (f"{worst['total_bytes'] / 1e9:.1f} GB (pp rank {worst['pp_rank']}) of "
                                            f"{worst['usable_bytes'] / 1e9:.0f} GB usable")
    assert cells["memory per pp rank (GB)"] == " · ".join(str(round(r["total_bytes"] / 1e9, 1)) for r in ranks)
    assert cells["layout"] == "<code>SGLANG_PP_LAYER_PARTITION=" + ",".join(map(str, body["partition"])) + "</code>"


def test_step_time_beside_the_verdict_is_the_time_routes(client):
    html = page(client, "")
    t = client.get("/api/v1/time?" + urlsplit(client.get("/fragment").headers["hx-replace-url"]).query).json()["time"]
    line = re.search(r'<p class="time" id="time-line">(.*?)</p>', html, re.S).group(1)
    assert f"{t['tokens_per_second_per_gpu']:,.0f}</strong> tokens/s/GPU" in line
    assert f"MFU <strong>{t['mfu'] * 100:.1f}%" in line and f"{t['step_seconds']:.2f} s" in line
    # the bubble is the simulated one, split: PP 8 over 8 x PP = 64 micro-batches fills and drains
    # 7 / 71 of the time (equal stages); the default 14 / 8 ... / 16 split waits for the rest
    assert f"bubble {t['bubble_fraction'] * 100:.1f}% (simulated; fill and drain {7 / 71 * 100:.1f}%)" in line
    note = f"pipeline bubble {t['bubble_fraction']:.1%} of the ranks' time (simulated): {7 / 71:.1%} is its fill and drain"
    assert note in html and f"{t['bubble_fraction'] - 7 / 71:.1%} waiting on slower stages" in html
    assert "(closed form" not in html
    assert 'id="fig-time"' in html and "What the time model counts" in html
    for item in t["not_modelled"]:
        assert item in html


def test_the_time_panel_shows_the_times_notes(client):
    """What the step time says about itself (``time.notes``, as ``isplan time`` prints them) is on the
    page: MoE with TP > 1 and no sequence parallelism is timed as if SP were on, and says so."""
    query = ("model=glm-5.2&engine=slime&pp=8&first=14&last=16&tp=4&cp=8&ep=32&etp=1&dp=1&sp=0&tokens_per_gpu=8192"
             "&recompute=full&recompute_method=uniform&recompute_num_layers=1&cp_comm_type=allgather")
    notes = client.get("/api/v1/time?" + query).json()["time"]["notes"]
    assert notes and all(f"note: {n}" in page(client, query) for n in notes)


def test_without_a_step_time_the_bubble_is_the_closed_form_said_so(client, monkeypatch):
    """A schedule over the live simulation's bound gets no step time on the page; the bubble line is
    then the closed form for its PP, VPP and micro-batches: PP 8 over 64 micro-batches, 7 / 71."""
    from app.core.engines.megatron import MegatronEngine

    monkeypatch.setattr(MegatronEngine, "max_time_events", 10)  # slime's engine is Megatron's
    html = page(client, "")
    assert "Step time: no step time here" in html
    assert f"pipeline bubble (closed form: equal stages, free sends) {7 / 71:.1%} with 64 micro-batches, assumed 8 × PP" in html


def test_the_schedule_is_drawn_from_the_simulation(client):
    r = client.get("/fragment/schedule")  # the default plan: 8 ranks, 64 micro-batches, 1F1B
    fig = json.loads(unescape(re.search(r'data-figure="([^"]+)"', r.text).group(1)))
    fwd, bwd = fig["data"]
    # every micro-batch's forward and backward on every rank, each one segment [start, end, gap]
    assert len(fwd["x"]) == len(bwd["x"]) == 8 * 64 * 3


def test_about_is_a_page(client):
    r = client.get("/about")
    assert r.headers["content-type"].startswith("text/html")
    assert 'href="/api/v1/about"' in r.text and "htmx" in r.text and "2.0.11" in r.text
    assert client.get("/api/v1/about").headers["content-type"].startswith("application/json")


# --------------------------------------------------------------------------- start from a plan that runs


@pytest.mark.parametrize("model", preset_ids())
def test_load_preset_opens_a_plan_that_runs(client, model):
    r = client.get(f"/profile?model={model}&engine=megatron", follow_redirects=False)
    assert r.status_code == 303
    query = urlsplit(r.headers["location"]).query
    assert dict(parse_qsl(query))["model"] == model
    check = client.get("/api/v1/check?" + query).json()  # the CLI's twin, not the page
    assert check["verdict"]["go"] is True and "memory" in check["verdict"]["judged"], (model, check["verdict"])


def test_profile_for_htmx_is_a_redirect_header(client):
    r = client.get("/profile?model=glm-5.2&engine=slime", headers={"HX-Request": "true"})
    assert r.status_code == 200 and r.headers["hx-redirect"].startswith("/?model=glm-5.2&engine=slime")


def test_an_uploaded_config_opens_a_plan_that_runs_and_can_be_downloaded(client):
    data = (REPO / "app" / "core" / "presets" / "llama-3.1-70b.json").read_bytes()
    r = client.post("/upload", files={"file": ("llama.json", data, "application/json")},
                    data={"engine": "megatron"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/profile?model=sha256%3A")
    target = client.get(r.headers["location"], follow_redirects=False).headers["location"]
    query = urlsplit(target).query
    model = dict(parse_qsl(query))["model"]
    assert model == "sha256:" + hashlib.sha256(data).hexdigest()
    assert client.get("/api/v1/check?" + query).json()["verdict"]["go"] is True
    html = page(client, query)
    name = f"config-{hashlib.sha256(data).hexdigest()[:12]}.json"
    assert f"<code>isplan check {name} " in html
    assert client.get(f"/config/{model}").content == data
    missing = client.get("/config/sha256:" + "0" * 64)
    assert missing.status_code == 404 and missing.json()["errors"][0]["field"] == "model"


def test_an_htmx_upload_refusal_is_the_error_line(client):
    r = client.post("/upload", files={"file": ("bad.json", b"{", "application/json")}, headers={"HX-Request": "true"})
    assert r.status_code == 422 and r.headers["hx-retarget"] == "#err-upload"
    assert r.text.startswith('<p class="field-error" id="err-upload"') and "refused" in r.text


# --------------------------------------------------------------------------- the launcher


SLIME_SCRIPT = """#!/bin/bash
PERF_ARGS=(
   --pipeline-model-parallel-size 4
   --tensor-model-parallel-size 2
)
python3 train.py "${PERF_ARGS[@]}" --hf-checkpoint /data/GLM-5.2
"""


def test_a_launcher_takes_its_engine_and_shows_where_each_value_came_from(client):
    r = client.post("/launcher", data={"script": SLIME_SCRIPT, "model": "glm-5.2", "engine": "megatron"},
                    files={"files": ("", b"")}, headers={"HX-Request": "true"})
    assert r.status_code == 200, r.text[:400]
    url = dict(parse_qsl(urlsplit(r.headers["hx-push-url"]).query))
    assert (url["engine"], url["pp"], url["tp"]) == ("slime", "4", "2")  # train.py + PERF_ARGS: slime's
    html = unescape(r.text)
    assert "Launcher read: slime" in html
    rows = dict(re.findall(r"<tr><th scope=\"row\"><code>([^<]+)</code></th><td class=\"left\">[^<]*</td>"
                           r"<td class=\"left\">([^<]+)</td></tr>", html))
    assert rows["--pipeline-model-parallel-size"].endswith(":3") and rows["--tensor-model-parallel-size"].endswith(":4")
    assert "--hf-checkpoint" in html  # the import's warnings: the checkpoint path cannot be read here


def test_the_layer_map_drawn_from_kept_cells_is_the_map_drawn_afresh(tmp_path):
    """The map's cells are kept by what they show (``view._cell_html``): over a drag session, with
    VPP and an MTP layer, and with invalid starts, every map is the one drawn with no cell kept."""
    from app.core.plan import plan_from_query
    from app.web import view
    from app.web.store import ConfigStore

    store = ConfigStore(tmp_path / "s.sqlite3")
    sizes = [14, 8, 8, 8, 8, 8, 8, 16]
    queries = []
    for k, step in [(0, 1), (0, 1), (3, -1), (5, 1), (1, -1), (6, 1)]:
        sizes[k], sizes[k + 1] = sizes[k] + step, sizes[k + 1] - step
        queries.append(f"model=glm-5.2&tp=4&ep=8&split={','.join(map(str, sizes))}")
    queries += ["model=glm-5.2&tp=4&ep=8&pp=4&vpp=2&mode=flags&mtp_layers=1",
                "model=glm-5.2&pp=4&vpp=2&split=10,10,10,10,10,10,10,8", "model=glm-5.2&pp=4&vpp=2&split=10,11,9,10,10,10,10,8"]
    kept = [view.build_view(plan_from_query(dict(parse_qsl(q)))[0], [], store).map_html for q in queries]
    for q, warm in zip(queries, kept, strict=True):
        view._CELL_HTML.clear()
        assert view.build_view(plan_from_query(dict(parse_qsl(q)))[0], [], store).map_html == warm, q
    assert any('class="cell' in m and " invalid" in m for m in kept) and any('class="rk"' in m for m in kept)


@pytest.mark.parametrize(("name", "other"), [
    ("layer", 13), ("role", "full"), ("letter", "F"), ("ffn", "dense"), ("source", 9), ("stage", 3), ("start", False),
    ("invalid", False), ("mtp", True), ("pp_rank", 2), ("vp_stage", 1)])
def test_a_kept_cell_is_never_another_cells(name, other):
    """Each thing a cell shows is in the key it is kept by: a cell that differs from a kept one in
    any single field is drawn as it is drawn afresh (and differently)."""
    from dataclasses import replace

    from app.web import view

    cell = view.LayerCell(12, "shared", "S", "moe", 10, 2, True, True, pp_rank=1, vp_stage=0)
    changed = replace(cell, **{name: other})
    view._CELL_HTML.clear()
    fresh = view._cell_html(changed, False, True)
    view._CELL_HTML.clear()
    first = view._cell_html(cell, False, True)
    assert view._cell_html(changed, False, True) == fresh != first
    for first_cell, tagged in ((True, True), (False, False)):
        view._CELL_HTML.clear()
        alone = view._cell_html(cell, first_cell, tagged)
        view._cell_html(cell, False, True)
        assert view._cell_html(cell, first_cell, tagged) == alone


#: The stage table's rows as the page's template drew them before :attr:`PlanView.stage_rows_html`:
#: the reference the Python rows are checked against.
_STAGE_ROWS_TEMPLATE = """{% for r in rows %}<tr class="{{ 'invalid' if r.invalid else '' }}">
<th scope="row">{{ r.stage }}</th><td>{{ r.pp_rank }} / {{ r.vp_stage }}</td><td>{{ r.range }}</td><td>{{ r.num_layers }}</td>
<td>{% if r.invalid %}<strong>{{ r.start }}</strong>{% else %}{{ r.start }}{% endif %}</td>
<td>{% if r.source %}{{ r.source }}{% if r.source_stage and r.source_stage != r.stage %} (stage {{ r.source_stage }}){% endif %}{% else %}—{% endif %}</td>
<td>{{ r.full_layers|join(', ') }}</td>
<td>{% if r.params_per_gpu is not none %}{{ '{:.2f}B'.format(r.params_per_gpu / 1e9) }}{% else %}—{% endif %}</td>
<td>{{ r.memory }}</td>
<td>{% if r.flops is not none %}{{ '{:.0f}'.format(r.flops / 1e12) }}{% else %}—{% endif %}</td>
<td>{% if r.seconds is not none %}{{ '{:.3f}'.format(r.seconds) }}{% else %}—{% endif %}</td>
<td>{{ r.extras }}</td>
</tr>{% endfor %}"""


def _table_cells(html: str) -> list[tuple[str, list[str]]]:
    """Each row's class and its cells' markup with entities resolved (``&#34;`` and ``&quot;`` alike)."""
    rows = re.findall(r'<tr class="([^"]*)">(.*?)</tr>', html.replace("\n", ""), re.S)
    return [(cls, [unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", body, re.S)]) for cls, body in rows]


@pytest.mark.parametrize("query", [
    "model=glm-5.2&tp=4&ep=8&split=14,8,8,8,8,8,8,16",
    "model=glm-5.2&tp=4&ep=8&split=15,8,8,8,8,8,8,15",          # a stage starting on a shared layer
    "model=glm-5.2&tp=4&ep=8&pp=4&vpp=2&split=10,10,10,10,10,10,10,8&mtp_layers=1",  # virtual stages, MTP
    "model=glm-5.2&engine=vllm&pp=4&tp=8",                       # serving: memory in GiB, no step time
    "model=deepseek-v3&pp=4&tp=8&ep=8&dp=8&split=16,15,15,15",
])
def test_the_stage_rows_drawn_in_python_are_the_template_loops(tmp_path, query):
    """:attr:`PlanView.stage_rows_html` draws the rows the template loop drew: the same classes and
    the same cells, text and markup, row by row."""
    from jinja2 import Environment

    from app.core.plan import plan_from_query
    from app.web import view
    from app.web.store import ConfigStore

    v = view.build_view(plan_from_query(dict(parse_qsl(query)))[0], [], ConfigStore(tmp_path / "s.sqlite3"))
    assert v.rows, query
    reference = Environment(autoescape=True).from_string(_STAGE_ROWS_TEMPLATE).render(rows=v.rows)
    assert _table_cells(str(v.stage_rows_html)) == _table_cells(reference)
    assert len(_table_cells(reference)) == len(v.rows)


#: The parallelism checks' summary as the template drew it before :attr:`PlanView.checks_html`.
_CHECKS_TEMPLATE = """Parallelism checks: {{ checks|rejectattr("ok")|selectattr("level", "equalto", "error")|list|length }} failing, {{ checks|selectattr("warning")|list|length }} warning(s), {{ checks|length }} in all
<ul>{% for chk in checks %}{% set kind = 'warn' if chk.warning else ('pass' if chk.ok else 'fail') %}<li class="{{ kind }}">{{ {'warn': 'warning', 'pass': 'pass', 'fail': 'FAIL'}[kind] }} · {{ chk.name }}: {{ chk.message }}</li>{% endfor %}</ul>"""


@pytest.mark.parametrize("query", [
    "model=glm-5.2&tp=4&ep=8&split=14,8,8,8,8,8,8,16&gpus=64",     # a GPU budget: a failing check
    "model=glm-5.2&tp=4&ep=8&split=14,8,8,8,8,8,8,16",
    "model=glm-5.2&engine=slime&tp=4&cp=8&ep=32&etp=1&sp=1&split=14,8,8,8,8,8,8,16&recompute=full",
    "model=deepseek-v3&pp=4&tp=8&ep=8&dp=8&split=16,15,15,15&tp_comm_overlap=1",
])
def test_the_checks_drawn_in_python_are_the_template_loops(tmp_path, query):
    """:attr:`PlanView.checks_html` and :attr:`PlanView.checks_counts` draw what the template did:
    the same counts, the same items with the same classes and text."""
    from jinja2 import Environment

    from app.core.plan import plan_from_query
    from app.web import view
    from app.web.store import ConfigStore

    v = view.build_view(plan_from_query(dict(parse_qsl(query)))[0], [], ConfigStore(tmp_path / "s.sqlite3"))
    assert v.checks, query
    reference = Environment(autoescape=True).from_string(_CHECKS_TEMPLATE).render(checks=v.checks)
    head, items = reference.split("\n", 1)
    failing, warnings, total = v.checks_counts
    assert head == f"Parallelism checks: {failing} failing, {warnings} warning(s), {total} in all"

    def parts(html: str) -> list[tuple[str, str]]:
        return [(cls, unescape(text)) for cls, text in re.findall(r'<li class="([^"]*)">(.*?)</li>', html)]

    assert parts(str(v.checks_html)) == parts(items) and len(parts(items)) == total


def test_a_serving_page_judges_the_models_maximum_context_and_says_so(client):
    """No context given: the memory line names the context judged - Qwen3-30B-A3B's maximum,
    40,960 (``max_position_embeddings``, no rope scaling), not another model's. A stated context
    above it is the engine's refusal on the context field, naming the override variable."""
    html = page(client, "model=qwen3-30b-a3b&engine=vllm&tp=2")
    assert "context 40,960 × 1 sequence)" in html
    assert 'id="context" name="context" type="text" inputmode="numeric" value="" placeholder="model\'s maximum"' \
        in html
    refused = page(client, "model=qwen3-30b-a3b&engine=vllm&tp=2&context=65536")
    assert "--max-model-len 65,536 is above qwen3-30b-a3b's maximum context 40,960" in refused
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in refused
    allowed = page(client, "model=qwen3-30b-a3b&engine=vllm&tp=2&context=65536&allow_long_context=1")
    assert '<p class="note verdict-note" data-code="context_above_model_maximum">--max-model-len 65,536' in allowed
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 VLLM_PP_LAYER_PARTITION" not in allowed   # the partition variable first
    assert "VLLM_PP_LAYER_PARTITION=48 VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in allowed
