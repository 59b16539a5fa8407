"""The web app's routes: pages, fragments, uploads and every JSON twin of a CLI command.

JSON twins are compared with the real CLI's ``--format json`` output for the same inputs."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import parse_qsl

import pytest

from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.web.store import ConfigStore
from tests.cli.test_cli import isplan

SEED_BAD = "10,10,10,10,10,10,9,9"




def test_healthz_and_about(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    about = client.get("/api/v1/about").json()
    assert about["plotly"]["version"] == "4.1.1" and len(about["plotly"]["sha256"]) == 64


def test_vendored_plotly_matches_its_recorded_digest(client):
    import hashlib

    about = client.get("/api/v1/about").json()
    body = client.get(f"/static/vendor/{about['plotly']['file']}").content
    assert hashlib.sha256(body).hexdigest() == about["plotly"]["sha256"]


def test_security_headers(client):
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in r.text and " onclick=" not in r.text.lower()


def test_default_page_is_the_slime_profile(client):
    r = client.get("/")
    assert r.status_code == 200
    assert "TP 4 × CP 8 × PP 8 × DP 1 = 256 GPUs" in r.text
    assert re.search(r'id="verdict" class="verdict"><strong>GO</strong>', r.text)
    # seven boundaries, at the starts 15, 23, ..., 63
    assert re.findall(r'aria-valuenow="(\d+)"', r.text) == ["15", "23", "31", "39", "47", "55", "63"]


def test_fragment_replaces_url_and_lists_violations(client):
    r = client.get("/fragment", params={"model": "glm-5.2", "mode": "split", "split": SEED_BAD})
    assert r.status_code == 200
    assert r.headers["hx-replace-url"].startswith("/?")
    assert "split=10%2C10" in r.headers["hx-replace-url"]
    layers = re.findall(r'<li class="err" data-layer="(\d+)"', r.text)
    assert layers == ["21", "41", "61", "70"]
    assert 'hx-swap-oob="morph"' in r.text  # the summary and the form ride along out of band


def test_bad_values_render_the_page_with_messages(client):
    r = client.get("/", params={"pp": "abc", "tp": "0", "mode": "split", "split": "1,x", "gpu": "tpu"})
    assert r.status_code == 200
    for field, words in (("pp", "whole number"), ("tp", "between 1 and 1,024"), ("split", "entry 2"), ("gpu", "one of")):
        m = re.search(rf'id="err-{field}" role="alert">([^<]+)<', r.text)
        assert m and words in m.group(1), field


def test_actions_balance_and_nearest(client):
    for action in ("balance", "nearest"):
        r = client.get("/fragment", params={"model": "glm-5.2", "mode": "split", "split": SEED_BAD, "action": action})
        url = r.headers["hx-push-url"]  # a discrete action is a history entry: Back undoes it
        assert "split=" in url and "mode=" not in url  # the split implies the mode
        assert "split=10%2C10%2C10%2C10" not in url
        assert 'data-kind="boundary"' not in r.text, action


# --------------------------------------------------------------------------- JSON twins


def test_check_twin_equals_cli(client):
    api = client.get("/api/v1/check", params={"split": SEED_BAD}).json()
    cli = json.loads(isplan("check", "glm-5.2", "--split", SEED_BAD, "--format", "json").stdout)
    for key in ("valid", "stages", "violations", "errors", "megatron_flags", "layout_string", "model"):
        assert api[key] == cli[key], key


def test_roles_and_flops_twins_equal_cli(client):
    assert client.get("/api/v1/roles", params={"pattern": "FSSS"}).json() == json.loads(
        isplan("roles", "glm-5.2", "--pattern", "FSSS", "--format", "json").stdout)
    assert client.get("/api/v1/flops", params={"ctx": 32768}).json() == json.loads(
        isplan("flops", "glm-5.2", "--context", "32768", "--format", "json").stdout)


def test_plan_search_twin_equals_cli(client):
    api = client.get("/api/v1/plan-search", params={"pp": 8, "objective": "memory", "near": SEED_BAD}).json()
    cli = json.loads(isplan("plan", "glm-5.2", "--pp", "8", "--objective", "memory", "--near", SEED_BAD,
                            "--format", "json").stdout)
    assert api == cli


def test_params_twin(client):
    api = client.get("/api/v1/params").json()
    assert api["main_total"] == 743_377_000_704
    per_rank = client.get("/api/v1/params", params={"split": "14,8,8,8,8,8,8,16", "tp": 4, "ep": 32, "etp": 1}).json()
    assert len(per_rank["stages"]) == 8


def test_plan_memory_receipt_verify(client):
    plan = client.get("/api/v1/plan").json()  # an empty query is the page's default profile
    assert plan["parallel"]["gpus"] == 256 and plan["check"]["valid"] and plan["verdict"]["go"]
    profile = dict(parse_qsl(SLIME_GLM52_PROFILE.query()))
    mem = client.get("/api/v1/memory", params=profile).json()
    assert [s["pp_rank"] for s in mem["stages"]] == list(range(8)) and mem["fits"]
    receipt = client.get("/api/v1/receipt", params=profile).json()
    assert [lay["name"] for lay in receipt["layouts"]] == ["training", "conversion"]
    assert client.post("/api/v1/verify", json=receipt).json()["ok"] is True
    receipt["layouts"][0]["stages"][1]["first_layer"] = 16
    report = client.post("/api/v1/verify", json=receipt).json()
    assert report["ok"] is False and any("stage 2" in d for d in report["differences"])
    dl = client.get("/receipt")
    assert dl.headers["content-disposition"].startswith("attachment")


def test_search_api(client):
    r = client.get("/api/v1/search", params={"gpus": 256, "tokens_per_gpu": 8192, "top": 2})
    body = r.json()
    assert r.status_code == 200 and len(body["results"]) == 2
    assert all(x["tp"] * x["cp"] * x["pp"] * x["dp"] == 256 for x in body["results"])


@pytest.mark.parametrize("path, params, field", [
    ("/api/v1/check", {"model": "../../etc/passwd", "split": "78"}, "model"),
    ("/api/v1/check", {"split": "1,x"}, "split"),
    ("/api/v1/check", {"pp": "0"}, "pp"),
    ("/api/v1/roles", {"pattern": "FQ"}, None),
    ("/api/v1/plan-search", {"pp": 0}, "pp"),
    ("/api/v1/plan-search", {"near": "1,2"}, "near"),
    ("/api/v1/memory", {"mode": "split", "split": "78", "tp": "0"}, "tp"),
])
def test_api_bad_input_is_422_naming_the_field(client, path, params, field):
    r = client.get(path, params=params)
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0] if "errors" in r.json() else r.json()["detail"][0]
    if field:
        assert err.get("field") == field or field in json.dumps(err)


def test_verify_rejects_non_json(client):
    r = client.post("/api/v1/verify", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "receipt"
    # a body that does not say it is JSON is refused before it is read (a cross-site form cannot post it)
    assert client.post("/api/v1/verify", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415


# --------------------------------------------------------------------------- uploads


def _glm52() -> dict:
    from tests.conftest import REPO

    return json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())


def test_upload_is_content_addressed_and_survives_a_restart(client, tmp_path):
    raw = _glm52()
    raw["indexer_types"][14] = "shared"  # layer 15 shared: stage 2 of the slime profile starts on it
    data = json.dumps(raw).encode()
    r = client.post("/upload", files={"file": ("config.json", data, "application/json")},
                    data={"query": "pp=8&first=14&last=16&engine=hf"}, follow_redirects=False)
    assert r.status_code == 303
    loc = r.headers["location"]  # a plan that runs on the uploaded config, for the page's engine
    assert loc.startswith("/profile?") and ("model=sha256%3A" in loc or "model=sha256:" in loc) and "engine=hf" in loc
    model_id = re.search(r"model=(sha256(?:%3A|:)[0-9a-f]{64})", loc).group(1).replace("%3A", ":")
    page = client.get("/", params={"model": model_id, "pp": "8", "first": "14", "last": "16", "engine": "hf"})
    assert "starts at shared layer 15" in page.text
    # a fresh store on the same file (a restarted server) still knows it
    again = ConfigStore(client.app.state.store.path)
    assert again.get(model_id) is not None
    assert client.get("/api/v1/check", params={"model": model_id, "split": "14,8,8,8,8,8,8,16",
                                               "engine": "hf"}).json()["valid"] is False


@pytest.mark.parametrize("data, words", [
    (b"{not json", "not valid JSON"),
    (b'{"a": 1, "a": 2}', "repeats the key"),
    (b'{"num_hidden_layers": NaN}', "NaN"),
    (b"\xff\xfe", "not UTF-8"),
    (b" " * ((1 << 20) + 10), "limit"),
])
def test_bad_uploads_are_refused_with_a_message(client, data, words):
    r = client.post("/upload", files={"file": ("bad.json", data, "application/json")}, data={"query": ""},
                    follow_redirects=False)
    assert r.status_code == 422
    assert words in r.text


def test_hostile_strings_are_escaped(client):
    r = client.get("/", params={"model": "<script>alert(1)</script>", "pattern": '"><img src=x onerror=alert(1)>'})
    assert r.status_code == 200
    assert "<script>alert(1)" not in r.text and "<img src=x" not in r.text
    assert "&lt;script&gt;" in r.text


def test_launcher_form_redirects_to_the_derived_plan(client):
    from tests.cli.test_cli import SLIME_GLM52

    r = client.post("/launcher", data={"script": SLIME_GLM52, "model": "glm-5.2"}, follow_redirects=False)
    assert r.status_code == 200  # the page on the imported plan, with the import's report and the plan's URL
    loc = unescape(re.search(r'<a id="launcher-plan" href="([^"]+)"', r.text).group(1))
    for part in ("pp=8", "first=14", "last=16", "tp=4", "cp=8", "ep=32", "sp=1"):
        assert part in loc, part
    bad = client.post("/launcher", data={"script": SLIME_GLM52.replace("$PP", "$NOPE"), "model": "glm-5.2"})
    assert bad.status_code == 422 and "$NOPE is not assigned" in bad.text


def test_parallel_checks_are_listed_with_their_outcome(client):
    r = client.get("/")
    # the profile builds no MTP layer (no --mtp-num-layers), so the MTP-with-CP caveat is gone; DSA with
    # CP is a rule its --allgather-cp satisfies (transformer_config.py:3162-3177), not a caveat
    assert "Parallelism checks: 0 failing, 0 warning(s)" in r.text
    assert "pass · dsa_cp" in r.text and "pass · world_size" in r.text and "mtp_cp" not in r.text
    bad = client.get("/", params={"model": "glm-5.2", "pp": 8, "first": 14, "last": 16, "tp": 4, "ep": 48})
    assert "FAIL · experts_ep: EP=48 does not divide 256 experts" in bad.text
    assert "try 32 or 64" in bad.text


def test_no_path_from_user_input_reaches_the_filesystem(client, tmp_path):
    from tests.conftest import REPO

    real = tmp_path / "config.json"
    real.write_bytes((REPO / "app/core/presets/glm-5.2.json").read_bytes())
    for model in (str(real), str(tmp_path), "app/core/presets/glm-5.2.json", "file://" + str(real)):
        r = client.get("/api/v1/check", params={"model": model, "split": "78"})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "model", model
        page = client.get("/", params={"model": model, "split": "78"})
        # refused with a message beside the model field (unknown model, or too long to be an id)
        assert re.search(r'id="err-model" role="alert">[^<]+<', page.text), model
    # static files cannot be used to climb out of the static folder
    for path in ("/static/../app/main.py", "/static/%2e%2e/app/main.py", "/static/..%2fpyproject.toml"):
        assert client.get(path).status_code == 404, path


def test_actions_with_an_unknown_model_render_a_field_message(client):
    r = client.get("/fragment", params={"model": "sha256:" + "0" * 64, "mode": "split", "split": SEED_BAD,
                                        "action": "balance"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert re.search(r'<li class="kind-input"><span class="kind">input</span> [^<]*neither a preset', r.text)


@pytest.mark.parametrize("query, shown, absent", [
    ({"engine": "vllm", "pp": "8"}, ["VLLM_PP_LAYER_PARTITION", 'id="engine_version"', 'id="concurrency"'],
     ['id="first"', 'id="layout"', 'id="recompute"']),
    ({"engine": "sglang", "pp": "4"}, ["SGLANG_PP_LAYER_PARTITION", "--pp-size", "--tp-size"], ['id="first"']),
    ({"engine": "maxtext", "ici_pp": "4", "lps": "4"}, ["num_layers_per_pipeline_stage", "index_share_pattern"],
     ['id="first"', 'id="split"', 'id="concurrency"']),
    ({"engine": "megatron", "pp": "8"}, ['id="first"', 'id="layout"', "--mtp-num-layers"], ['id="concurrency"']),
])
def test_each_engine_speaks_its_own_vocabulary(client, query, shown, absent):
    page = client.get("/", params=query).text
    assert all(s in page for s in shown), [s for s in shown if s not in page]
    assert not any(s in page for s in absent), [s for s in absent if s in page]


def test_settings_of_another_engine_ride_along_hidden(client):
    """Switching to vLLM keeps the Megatron settings in the form (hidden), so switching back loses nothing."""
    page = client.get("/", params={"engine": "vllm", "pp": "8", "first": "14", "cp": "8"}).text
    assert '<input type="hidden" name="first" value="14">' in page
    assert '<input type="hidden" name="cp" value="8">' in page


def test_the_page_explains_every_memory_term_of_the_largest_rank(client):
    """Issue 11: the page says how each term is counted; the terms shown add up to the rank's total."""
    page = client.get("/").text  # the slime profile: rank 7 is the largest
    assert 'id="memory-explanation"' in page and "report_theoretical_memory" in page
    terms = re.search(r'id="memory-terms">.*?</details>', page, re.S).group(0)
    assert "the largest)" in terms and "pp rank 7" in terms
    shown = [float(x) for x in re.findall(r"<td>([0-9.]+)</td><td class=\"left\">", terms)]
    total = client.get("/api/v1/plan").json()["memory"]["stages"][7]["total_bytes"] / 1e9
    assert len(shown) == 11 and abs(sum(shown) - total) < 0.01 * len(shown)  # 2-decimal rounding per row
    assert "16 B per sharded parameter" in terms  # the offloaded optimizer's host copy


def test_a_pasted_launcher_brings_the_files_it_sources(client):
    """Issue 10: a launcher that sources a model file is read with that file (uploaded beside it);
    without it the page names what is missing instead of a verdict."""
    script = ('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"\n'
              'source "${SCRIPT_DIR}/models/glm5.sh"\n'
              "python3 train.py ${MODEL_ARGS[@]} --pipeline-model-parallel-size 8 "
              "--decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 16\n")
    model = "MODEL_ARGS=(\n   --num-layers 78\n   --mtp-num-layers 1\n)\n"
    missing = client.post("/launcher", data={"script": script, "query": ""}, follow_redirects=False)
    assert missing.status_code == 422 and "models/glm5.sh" in missing.text
    r = client.post("/launcher", data={"script": script, "query": ""},
                    files=[("files", ("glm5.sh", model.encode(), "text/plain"))], follow_redirects=False)
    assert r.status_code == 200, r.text[:500]
    loc = re.search(r'<a id="launcher-plan" href="([^"]+)"', r.text).group(1)
    assert "mtp_layers=1" in loc and "num_layers=78" in loc


def test_the_benchmark_times_the_real_fragment_render(tmp_path):
    """bench.common.update_seconds renders what /fragment renders (it broke once when the
    template gained a variable the benchmark did not pass)."""
    from app.web.app import create_app
    from bench.common import update_seconds

    assert update_seconds(create_app(store=ConfigStore(tmp_path / "s.sqlite3")), "split=14,8,8,8,8,8,8,16") > 0


def _json_values():
    from hypothesis import strategies as st

    scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text())
    return st.recursive(scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(), c, max_size=5),
                        max_leaves=30)


def test_safe_json_keeps_the_value_escapes_and_refuses_what_json_refuses():
    """The plan routes' encoder (pydantic-core's, falling back to :mod:`json`): every JSON value
    (lone surrogates, non-ASCII, big ints, small floats) reads back the same through the standard
    library, as ASCII; NaN and infinities are refused with the standard library's ValueError;
    a string that spells ``NaN`` is just text."""
    from hypothesis import given, settings

    from app.web.deps import SafeJSONResponse

    render = SafeJSONResponse(None).render

    @settings(max_examples=300, deadline=None)
    @given(_json_values())
    def same_value(v):
        body = render(v)
        assert body.isascii()
        assert json.loads(body) == v

    same_value()
    for v in ({"x": "\ud800"}, ["é", "NaN", "Infinity"], {"t": 7.980766814814815e-05}):
        assert json.loads(render(v)) == v
    assert render({"x": "\ud800"}) == b'{"x":"\\ud800"}'
    for bad in (float("nan"), {"x": [float("inf")]}, -float("inf")):
        with pytest.raises(ValueError):
            render(bad)


def test_a_maxtext_launcher_imports_as_its_pipeline(client):
    """The page's launcher form reads a MaxText launch (key=value on the trainer's command) into the
    MaxText plan and its share URL."""
    script = ("python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml run_name=r "
              "ici_pipeline_parallelism=3 num_layers_per_pipeline_stage=5\n")
    r = client.post("/launcher", data={"script": script, "model": "glm-5.2"}, follow_redirects=False)
    assert r.status_code == 200, r.text[:300]
    loc = unescape(re.search(r'<a id="launcher-plan" href="([^"]+)"', r.text).group(1))
    for part in ("engine=maxtext", "ici_pipeline_parallelism=3", "layers_per_pipeline_stage=5"):
        assert part in loc, part
    assert "Launcher read: maxtext (a MaxText training command (config src/maxtext/configs/base.yml))" in unescape(r.text)


@pytest.mark.parametrize("engine, query", [
    ("megatron", "split=14,8,8,8,8,8,8,16&tp=4"),
    ("vllm", "tp=8&pp=2"),
])
def test_a_custom_gpu_without_its_capacity_names_the_setting_to_give(client, engine, query):
    """``gpu=custom`` needs ``gpu_memory_gb``: the API's 422, the page's field message and the CLI's
    exit 2 all name that setting (it was a message about ``gpu_capacity_bytes`` on the ``tp`` field,
    a name no form, flag or URL key has)."""
    r = client.get(f"/api/v1/check?model=glm-5.2&engine={engine}&{query}&gpu=custom")
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["field"] == "gpu_memory_gb" and "--gpu-memory-gb" in err["message"], err
    page = unescape(client.get(f"/?model=glm-5.2&engine={engine}&{query}&gpu=custom").text)
    assert re.search(r'id="err-gpu_memory_gb" role="alert">[^<]*--gpu-memory-gb', page)
    flags = [f"--{k.replace('_', '-')}" if k != "split" else "--split" for k, _ in parse_qsl(query)]
    values = [v for _, v in parse_qsl(query)]
    argv = [x for pair in zip(flags, values) for x in pair]
    p = isplan("check", "glm-5.2", "--engine", engine, *argv, "--gpu", "custom")
    assert p.returncode == 2 and "--gpu-memory-gb" in p.stderr, p.stderr
    ok = client.get(f"/api/v1/check?model=glm-5.2&engine={engine}&{query}&gpu=custom&gpu_memory_gb=80")
    assert ok.status_code in (200, 409), ok.text  # given, it is read: a verdict, not a 422
    assert all(e.get("field") != "gpu_memory_gb" for e in ok.json().get("errors", []))
