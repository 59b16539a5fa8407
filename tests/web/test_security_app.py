"""Issue 9's findings, one regression test each, against the real app (``create_app``, in process).

Every input here is small and hits a bound or the work budget; none of them reproduces the
blow-up. The numbers in the assertions come from the issue (the requests it sent) and from
:mod:`app.core.plan.bounds` (the limits the messages must name), never from the code under test.
Tests that need a real server (concurrency, slow clients) are in tests/web/test_security_live.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from fastapi.testclient import TestClient

from app.core.plan import bounds, plan_from_query
from app.web.app import create_app
from app.web.store import ConfigStore, Quotas, StoreUnavailable
from app.web.view import build_view
from tests.conftest import tiny_config

HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")
JSON = {"content-type": "application/json"}
BUDGET = "20,000,000"  # app.web.workers.DEFAULT_BUDGET as the refusal prints it


@pytest.fixture(scope="module")
def big_upload(tmp_path_factory):
    """The app with a 4,096-layer upload in which every layer computes indices (no IndexShare:
    the optimiser's and Nearest valid's worst case, issue 9 finding 1)."""
    store = ConfigStore(tmp_path_factory.mktemp("big") / "configs.sqlite3")
    cfg = store.put(json.dumps(tiny_config(bounds.MAX_LAYERS)).encode(), name="big.json")
    return TestClient(create_app(store=store), raise_server_exceptions=False), cfg.id


@pytest.fixture(scope="module")
def client(big_upload):
    return big_upload[0]


def _quick(fn, seconds: float = 10.0):
    t0 = time.monotonic()
    result = fn()
    assert time.monotonic() - t0 < seconds, f"took {time.monotonic() - t0:.1f} s"
    return result


# ----------------------------------------------------------------------------- 1. unbounded work


def test_nine_digit_stage_size_is_refused_before_work(client):
    r = _quick(lambda: client.get("/api/v1/check?model=glm-5.2&split=100000000"))
    assert r.status_code == 422
    err = r.json()["errors"][0]
    assert err["field"] == "split" and f"{bounds.MAX_LAYERS:,}" in err["message"].replace("4096", "4,096")
    page = _quick(lambda: client.get("/?model=glm-5.2&split=100000000"))
    assert page.status_code == 200 and "split" in page.text  # the page keeps a default and names the field


def test_many_stage_sizes_within_each_bound_are_answered_without_expansion(client):
    """Each entry under the per-stage bound, the list at the URL text bound (4,000 x 4,096 =
    16,384,000 layers asked for): the sum is checked against the model before any expansion."""
    split = ",".join(["4096"] * (bounds.MAX_PLAN_TEXT // 5))
    r = _quick(lambda: client.get(f"/api/v1/check?model=glm-5.2&split={split}"), seconds=15)
    assert r.status_code in (200, 422)
    if r.status_code == 200:
        blocking = r.json()["verdict"]["blocking"]
        assert r.json()["valid"] is False and blocking[0]["field"] == "split" and "16384000" in blocking[0]["message"]


def test_plan_search_pp256_vpp8_answers_quickly_on_glm52(client):
    """The issue's request: 2,048 stages for 21 full layers has no valid layout, said at once."""
    r = _quick(lambda: client.get("/api/v1/plan-search?model=glm-5.2&pp=256&vpp=8"))
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        assert r.json()["best"] is None


def test_plan_search_over_the_budget_is_a_422_naming_the_limit(big_upload):
    client, model = big_upload
    r = _quick(lambda: client.get(f"/api/v1/plan-search?model={model}&pp=256&vpp=8"))
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "pp" and f"the limit is {BUDGET}" in err["message"] and "fewer stages" in err["message"]


def test_search_over_the_budget_is_a_422(big_upload):
    client, model = big_upload
    r = _quick(lambda: client.get(f"/api/v1/search?model={model}&gpus=1048576&top=100"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "gpus"
    assert f"the limit is {BUDGET}" in r.json()["errors"][0]["message"]


def test_nearest_valid_on_a_4096_layer_upload_is_refused_on_the_page(big_upload):
    client, model = big_upload
    split = ",".join(["512"] * 8)
    r = _quick(lambda: client.get(f"/fragment?model={model}&split={split}&action=nearest"))
    assert r.status_code == 200
    assert "Nearest valid over 8 stages of 4,096 layers" in r.text and BUDGET in r.text


def test_balance_and_nearest_still_work_on_glm52(client):
    """The bounded path gives real answers: Nearest valid of 10,10,10,10,10,10,9,9 (invalid by
    seed 000) moves to a valid split of the same 78 layers."""
    r = client.get("/fragment?model=glm-5.2&split=10,10,10,10,10,10,9,9&action=nearest")
    assert r.status_code == 200, r.text
    url = r.headers["hx-push-url"]
    assert "split=" in url and "split=10%2C10%2C10%2C10%2C10%2C10%2C9%2C9" not in url
    sizes = [int(x) for x in url.split("split=")[1].split("&")[0].split("%2C")]
    assert sum(sizes) == 78 and len(sizes) == 8


# ----------------------------------------------------------------------------- 2./3. receipts


def _receipt(**inputs) -> dict:
    return {"model": {"id": "glm-5.2", "source": "preset"}, "engine": {"semantics": "megatron"},
            "layouts": [{"name": "training", "inputs": {"pp": 8, "first": 14, "last": 16, **inputs}}]}


def test_58kB_receipt_is_refused_quickly(client):
    body = json.dumps(_receipt(split=list(range(1, 10_000)))).encode()
    assert 50_000 < len(body) < 70_000
    r = _quick(lambda: client.post("/api/v1/verify", content=body, headers=JSON))
    assert r.status_code == 422, r.text[:300]


@pytest.mark.parametrize("mtp", [10**9, 1e9, -1, 10**30])
def test_huge_mtp_layers_is_refused(client, mtp):
    r = _quick(lambda: client.post("/api/v1/verify", content=json.dumps(_receipt(mtp_layers=mtp)), headers=JSON))
    assert r.status_code == 422 and "mtp_layers" in r.text


def test_deep_nesting_huge_integers_and_negative_split_are_422_not_500(client):
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/api/v1/verify", content=deep, headers=JSON)
    assert r.status_code == 422 and f"deeper than {bounds.MAX_RECEIPT_DEPTH}" in r.text
    huge = b'{"model": {"id": "glm-5.2", "source": "preset"}, "n": ' + b"9" * 5000 + b"}"
    assert client.post("/api/v1/verify", content=huge, headers=JSON).status_code == 422
    r = client.post("/api/v1/verify", content=json.dumps(_receipt(split=[40, -2, 40])), headers=JSON)
    assert r.status_code == 422


def test_a_path_in_model_source_is_never_opened(client, tmp_path, monkeypatch):
    # Paths relative to the working directory: short enough that the message quotes them whole
    # (it shortens a long id), and the server would find the file there if it opened it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.json").write_text(json.dumps({"num_hidden_layers": 7, "password": "hunter2"}))
    answers = []
    for path in ("secret.json", "missing.json"):
        receipt = _receipt()
        receipt["model"] = {"id": path, "source": "path"}
        r = client.post("/api/v1/verify", content=json.dumps(receipt), headers=JSON)
        assert r.status_code == 422 and "hunter2" not in r.text
        answers.append(r.json()["errors"][0]["message"].replace(path, "PATH"))
    assert answers[0] == answers[1]  # an existing and a missing file cannot be told apart


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_verify_needs_a_json_content_type(client, ctype):
    r = client.post("/api/v1/verify", content=json.dumps(_receipt()), headers={"content-type": ctype})
    assert r.status_code == 415
    assert all(h in r.headers for h in HEADERS)


def test_a_real_receipt_still_verifies(client):
    receipt = client.get("/api/v1/receipt?model=glm-5.2&pp=8&first=14&last=16").json()
    r = client.post("/api/v1/verify", content=json.dumps(receipt), headers=JSON)
    assert r.status_code == 200 and r.json()["ok"] is True


# ----------------------------------------------------------------------------- 4. shell-safe exports


HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "' ; touch PWNED ; '", '" ; touch PWNED ; "',
           "x\ntouch PWNED", "$(IFS=_;touch${IFS}PWNED)", "a|touch PWNED", "a&&touch PWNED", "a>PWNED"]
EXPORTS = {"cli", "megatron", "slime", "layout", "conversion", "serve", "serve_env", "serve_command"}


def _hostile_plans():
    """Every text field of the plan with each hostile value, plus plans that show each export."""
    base = [{"model": "glm-5.2", "conv_split": "20,20,20,18"}, {"model": "glm-5.2", "engine": "vllm", "pp": "4"},
            {"model": "glm-5.2", "engine": "sglang", "pp": "4"}]
    for value in HOSTILE:
        for field in ("model", "engine_version", "pattern", "layout"):
            for b in base:
                yield {**b, field: value}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_every_export_is_shell_safe_with_hostile_values(tmp_path):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    seen: set[str] = set()
    scripts = {}
    for query in _hostile_plans():
        plan, problems = plan_from_query(query)
        for name, text in build_view(plan, problems, store).exports.items():
            seen.add(name)
            scripts[text] = name
    assert seen == EXPORTS, seen
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for i, (text, name) in enumerate(scripts.items()):
        script = tmp_path / f"export{i}.sh"
        script.write_text(text + "\n")
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert syntax.returncode == 0, (name, text, syntax.stderr)
        # run it: commands are missing (isplan, vllm, ...) but touch is on PATH, so an injection would work
        subprocess.run(["bash", str(script)], cwd=run_dir, capture_output=True, timeout=20,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(run_dir)})
        assert not any(run_dir.iterdir()), (name, text, list(run_dir.iterdir()))


# ----------------------------------------------------------------------------- 5. launcher


def _form(script: str) -> dict:
    return {"script": script, "query": "model=glm-5.2"}


def test_launcher_with_ten_million_mtp_layers_is_refused_quickly(client):
    script = "--mtp-num-layers 10000000 --pipeline-model-parallel-size $UNSET_PP"
    r = _quick(lambda: client.post("/launcher", data=_form(script), follow_redirects=False))
    assert r.status_code == 422 and "launcher" in r.text


@pytest.mark.parametrize("script", [
    "--pipeline-model-parallel-size " + "9" * 5000,
    "--num-layers-per-virtual-pipeline-stage " + "9" * 400 + " --pipeline-model-parallel-size 8",
    "--decoder-first-pipeline-num-layers 99999999999999999999 --pipeline-model-parallel-size 8",
    "--mtp-num-layers 99999999999999999999999 --pipeline-model-parallel-size 8",
    "PP=$((2**4096))\n--pipeline-model-parallel-size $PP",
    "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 1" + "0" * 30,
])
def test_launcher_huge_integers_are_not_500(client, script):
    r = _quick(lambda: client.post("/launcher", data=_form(script), follow_redirects=False))
    assert r.status_code in (303, 422), (r.status_code, r.text[:300])


# ----------------------------------------------------------------------------- 6. HTTP and storage


@pytest.mark.parametrize("path", ["/upload", "/launcher", "/api/v1/verify"])
@pytest.mark.parametrize("headers", [{"origin": "https://evil.example"}, {"sec-fetch-site": "cross-site"}])
def test_cross_site_posts_are_403(client, path, headers):
    r = client.post(path, data={"script": "x"}, headers=headers)
    assert r.status_code == 403 and r.json()["errors"][0]["code"] == "cross_site"
    assert all(h in r.headers for h in HEADERS)


def test_same_origin_form_post_passes(client):
    r = client.post("/launcher", data=_form("python3 train.py --pipeline-model-parallel-size 8 "
                                            "--decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 16"),
                    headers={"origin": "http://testserver", "sec-fetch-site": "same-origin"}, follow_redirects=False)
    assert r.status_code == 200 and "Launcher read:" in r.text  # the page on the imported plan, with its report


@pytest.mark.parametrize("path", ["/healthz", "/", "/api/v1/about", "/docs", "/static/app.js"])
def test_head_where_get_works(client, path):
    get, head = client.get(path), client.head(path)
    assert get.status_code == head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_413_and_500_carry_the_security_headers(client, monkeypatch):
    r = client.post("/api/v1/verify", content=b"x" * (3 << 20), headers=JSON)
    assert r.status_code == 413 and all(h in r.headers for h in HEADERS)
    from app.core import reports

    def boom(*args, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(reports, "memory_report", boom)
    r = client.get("/api/v1/memory?model=glm-5.2")
    assert r.status_code == 500 and all(h in r.headers for h in HEADERS)
    assert r.json()["errors"][0]["code"] == "internal_error" and "a bug" not in r.text


def test_docs_is_served_from_the_vendored_swagger_ui(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "/static/vendor/swagger-ui/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/vendor/swagger-ui/swagger-ui-bundle.js").status_code == 200
    assert client.get("/redoc").status_code == 404


def _upload(client: TestClient, data: bytes, **headers: str):
    return client.post("/upload", files={"file": ("config.json", data, "application/json")},
                       data={"query": "model=glm-5.2"}, headers=headers, follow_redirects=False)


def test_upload_quota_is_a_413_naming_the_setting(tmp_path):
    store = ConfigStore(tmp_path / "configs.sqlite3", quotas=Quotas(total=1 << 20, per_client=700))
    client = TestClient(create_app(store=store))
    first = json.dumps(tiny_config(8)).encode()
    assert 350 < len(first) < 700 and _upload(client, first).status_code == 303
    r = _upload(client, json.dumps(tiny_config(9)).encode())
    assert r.status_code == 413 and "ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES" in r.text
    assert all(h in r.headers for h in HEADERS)
    assert _upload(client, first).status_code == 303  # re-uploading stored bytes costs nothing
    assert store.count() == 1


def test_upload_token(tmp_path, monkeypatch):
    monkeypatch.setenv("ISPLAN_UPLOAD_TOKEN", "s3cret")
    client = TestClient(create_app(store=ConfigStore(tmp_path / "configs.sqlite3")))
    data = json.dumps(tiny_config(8)).encode()
    assert _upload(client, data).status_code == 401
    assert _upload(client, data, authorization="Bearer wrong").status_code == 403
    assert _upload(client, data, authorization="Bearer s3cret").status_code == 303
    form = client.post("/upload", files={"file": ("c.json", data, "application/json")},
                       data={"token": "s3cret"}, follow_redirects=False)
    assert form.status_code == 303


def _broken(store: ConfigStore, how: str) -> ConfigStore:
    """A store that fails as issue 9 found: a read-only database, or a full disk."""
    import sqlite3

    db = store._db()
    if how == "read-only":
        store._conn = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, check_same_thread=False,
                                      isolation_level=None)
    else:
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    return store


@pytest.mark.parametrize("how", ["read-only", "disk full"])
def test_store_failures_are_503_and_healthz_says_so(tmp_path, how):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    store.put(json.dumps(tiny_config(8)).encode())
    client = TestClient(create_app(store=_broken(store, how)))
    big = json.dumps({**tiny_config(9), "padding": "x" * 20_000}).encode()
    r = _upload(client, big)
    assert r.status_code == 503 and "not stored" in r.text and all(h in r.headers for h in HEADERS)
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["store"]["ok"] is False
    assert client.head("/healthz").status_code == 503


def test_uncreatable_data_dir_is_503_not_500(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    client = TestClient(create_app(store=ConfigStore(blocker / "sub" / "configs.sqlite3")))
    r = _upload(client, json.dumps(tiny_config(8)).encode())
    assert r.status_code == 503
    assert client.get("/healthz").status_code == 503
    with pytest.raises(StoreUnavailable):
        ConfigStore(blocker / "sub" / "configs.sqlite3").count()


def test_the_app_opens_its_store_with_open_store(tmp_path, monkeypatch):
    monkeypatch.setenv("ISPLAN_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("ISPLAN_DATABASE_URL", raising=False)
    app = create_app()
    assert app.state.store.backend == "sqlite" and app.state.store.path == tmp_path / "configs.sqlite3"


@pytest.mark.parametrize("query", ["tp=8&cp=1024&dp=1048576", "tp=1024&cp=1024&pp=2", "cp=2&split=" + ",".join(["1"] * 78)
                                   + "&dp=8192"])
def test_a_world_over_the_gpu_bound_is_refused_before_work(client, query):
    """Each factor is within its bound, the product is not: 8 x 1,024 x 1,048,576 = 8,589,934,592
    GPUs, 1,024 x 1,024 x 2 = 2,097,152, and 2 x 78 x 8,192 = 1,277,952 are all over 2^20."""
    for route in ("/api/v1/check", "/api/v1/memory", "/api/v1/plan"):
        r = _quick(lambda route=route: client.get(f"{route}?model=glm-5.2&{query}"), seconds=5)
        assert r.status_code == 422, (route, r.text[:200])
        err = r.json()["errors"][0]
        assert err["field"] == "dp" and f"the limit is {bounds.MAX_GPUS:,} GPUs" in err["message"]


def test_the_upload_form_asks_for_the_token_only_when_one_is_configured(tmp_path, monkeypatch):
    from tests.conftest import app_client

    client = app_client(tmp_path)
    assert 'name="token"' not in client.get("/").text
    monkeypatch.setenv("ISPLAN_UPLOAD_TOKEN", "s3cret")
    assert 'id="upload-token" name="token" type="password"' in client.get("/").text
