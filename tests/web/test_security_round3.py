"""Issue 20 (security round 3): the findings that need no server process, each with the small
input that hits it - receipts through ``isplan`` run as processes (findings 9-11), the Host
allow-list (12), the worker pool (13, 15, worker memory), the store (14, 16, PostgreSQL's first
upload after a restart), uploads (3, multipart refusals), the per-client gate's decoding, and the
fast API paths, which must give the same data as the slow ones they replace (issue 17 item 4).
The findings that need ``python -m app.serve`` are in tests/web/test_security_round3_live.py."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.model.config import load_preset
from app.core.plan import bounds, plan_from_query, strict_plan
from app.core.receipt import canonical_body_digest
from app.web.app import create_app
from app.web.deps import INLINE_UNITS, plan_units
from app.web.limits import UploadRate
from app.web.security import AllowedHosts, peer_key
from app.web.store import ConfigStore, StoreUnavailable, check_config_shape
from app.web.view import build_view, page_data
from app.web.workers import ClientGate, WorkerLost, WorkerPool, has_action, run_bounded
from tests.conftest import tiny_config

#: a live server, worker processes or latency under load: run on its own (the Makefile's second part)
pytestmark = pytest.mark.exclusive

REPO = Path(__file__).resolve().parents[2]
SLIME_NO_OFFLOAD = ["--engine", "slime", "--pp", "8", "--first", "14", "--last", "16", "--tp", "4", "--cp", "8",
                    "--ep", "32", "--etp", "1", "--dp", "1", "--sp", "--tokens-per-gpu", "8192", "--recompute", "full",
                    "--recompute-method", "uniform", "--recompute-num-layers", "1", "--cp-comm-type", "allgather"]
GO = {"go": True, "blocking": [], "warnings": [], "judged": ["layout", "parallelism", "memory"]}  # a forged GO


def isplan(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, capture_output=True, timeout=60,
                          cwd=REPO, text=True)


@pytest.fixture(scope="module")
def nogo_receipt() -> dict:
    """A receipt of the slime GLM-5.2 profile without CPU offload: memory NO-GO (rank 7 needs
    102 GB of an 80 GB H100, README), written by ``isplan receipt`` (exit 1: no-go)."""
    out = isplan("receipt", "glm-5.2", *SLIME_NO_OFFLOAD)
    assert out.returncode == 1, out.stderr
    receipt = json.loads(out.stdout)
    assert receipt["verdict"]["go"] is False and receipt["plan"]["verdict"]["go"] is False
    assert [r["kind"] for r in receipt["verdict"]["blocking"]] == ["memory"]
    return receipt


def _verify(receipt: dict | str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "r.json"
    path.write_text(receipt if isinstance(receipt, str) else json.dumps(receipt))
    return isplan("verify", str(path), *extra)


def _resigned(receipt: dict, edit) -> dict:
    r = json.loads(json.dumps(receipt))
    edit(r)
    r["body_sha256"] = canonical_body_digest(r)
    return r


# --------------------------------------------------------------------------- findings 9-11: receipts


def test_the_honest_no_go_receipt_verifies(nogo_receipt, tmp_path):
    out = _verify(nogo_receipt, tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("VERIFIED"), out.stdout + out.stderr


@pytest.mark.parametrize(("name", "edit", "needle"), [
    ("top-level verdict GO", lambda r: r.update(verdict=GO), "verdict: receipt has"),
    ("a verdict without its plan", lambda r: (r.update(verdict=GO), r.pop("plan")), "not the plan it belongs to"),
    ("parallel false and GO verdicts", lambda r: (r["plan"].update(parallel=False, verdict=GO), r.update(verdict=GO)),
     "plan parallel: receipt has false"),
    ("valid as 1", lambda r: r.update(valid=1), "valid: receipt says 1"),
    ("num_layers as 78.0", lambda r: r["model"].update(num_layers=78.0), "model.num_layers: receipt has 78.0"),
    ("a plan query of another model", lambda r: r["plan"].update(query=r["plan"]["query"].replace("glm-5.2", "glm-5.1")),
     "plan query model"),
    ("the plan's layout edited", lambda r: r["layouts"][0]["inputs"].update(first=10, last=12),
     "is not the layout of the recorded plan query"),
])
def test_every_recorded_verdict_is_recomputed_type_strictly(nogo_receipt, tmp_path, name, edit, needle):
    out = _verify(_resigned(nogo_receipt, edit), tmp_path)
    assert out.returncode == 1 and out.stdout.startswith("DIFFERS"), (name, out.stdout)
    assert needle in out.stdout, (name, out.stdout)


def test_a_repeated_key_is_refused(nogo_receipt, tmp_path):
    text = json.dumps(nogo_receipt)
    assert text.startswith("{")
    out = _verify('{"verdict": {"go": true, "blocking": [], "warnings": []}, ' + text[1:], tmp_path)
    assert out.returncode == 2 and "repeats the key \"verdict\"" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_api_twin_recomputes_the_verdict_too(nogo_receipt, tmp_path):
    client = TestClient(create_app(store=ConfigStore(tmp_path / "c.sqlite3")))
    edited = _resigned(nogo_receipt, lambda r: r.update(verdict=GO))
    r = client.post("/api/v1/verify", content=json.dumps(edited), headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["ok"] is False
    assert r.json()["verdict"]["go"] is False  # the recomputed verdict rides along
    dup = '{"valid": true, ' + json.dumps(nogo_receipt)[1:]
    assert client.post("/api/v1/verify", content=dup, headers={"Content-Type": "application/json"}).status_code == 422


def test_a_byte_identical_config_verifies_a_preset_receipt(nogo_receipt, tmp_path):
    """Configs are compared by their digests, not by description strings (issue 16 item 9)."""
    copy = tmp_path / "glm-5.2.json"
    copy.write_bytes((REPO / "app/core/presets/glm-5.2.json").read_bytes())
    out = _verify(nogo_receipt, tmp_path, "--config", str(copy))
    assert out.returncode == 0 and out.stdout.startswith("VERIFIED"), out.stdout
    other = tmp_path / "other.json"
    other.write_bytes(copy.read_bytes().replace(b'"vocab_size": 154880', b'"vocab_size": 154881'))
    assert other.read_bytes() != copy.read_bytes()
    out = _verify(nogo_receipt, tmp_path, "--config", str(other))
    assert out.returncode == 1 and "model.sha256" in out.stdout


def test_named_extra_layouts_join_the_recomputed_top_level_verdict(tmp_path):
    out = isplan("receipt", "glm-5.2", "--pp", "8", "--first", "14", "--last", "16", "--also", "x=--pp 2 --first 40")
    receipt = json.loads(out.stdout)
    assert out.returncode == 1 and receipt["plan"]["verdict"]["go"] is True and receipt["verdict"]["go"] is False
    assert _verify(receipt, tmp_path).returncode == 0
    hidden = _resigned(receipt, lambda r: r.update(verdict=r["plan"]["verdict"]))
    assert "verdict: receipt has" in _verify(hidden, tmp_path).stdout


# --------------------------------------------------------------------------- finding 12: the Host header


@pytest.mark.parametrize(("host", "ok"), [
    ("localhost:8000", True), ("LOCALHOST", True), ("app.localhost:1", True), ("127.0.0.1:8000", True),
    ("127.0.0.2", True), ("[::1]:8000", True), ("10.1.2.3:8000", True), ("plans.example.com", True),
    ("a.corp.example:443", True), ("corp.example", True), ("rebind.evil.example:8000", False), ("", False),
    (None, False), ("localhost.evil.example", False), ("example.com", False), ("plans.example.com.evil", False),
])
def test_the_host_allow_list(host, ok):
    gate = AllowedHosts(None, ["plans.example.com", ".corp.example"])  # type: ignore[arg-type]
    assert gate.allows(host) is ok
    assert AllowedHosts(None, ["*"]).allows(host) is True  # type: ignore[arg-type]


def test_the_app_refuses_an_unknown_host_with_a_json_400(tmp_path, monkeypatch):
    monkeypatch.setenv("ISPLAN_ALLOWED_HOSTS", "plans.example.com")
    client = TestClient(create_app(store=ConfigStore(tmp_path / "c.sqlite3")), base_url="http://rebind.evil.example")
    r = client.post("/upload", files={"file": ("c.json", json.dumps(tiny_config(8)).encode())},
                    headers={"Origin": "http://rebind.evil.example", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "unknown_host"
    assert "x-frame-options" in r.headers and "rebind" not in r.text
    assert client.app.state.store.count() == 0  # type: ignore[attr-defined]
    allowed = TestClient(client.app, base_url="http://plans.example.com")
    assert allowed.get("/healthz").status_code == 200


# --------------------------------------------------------------------------- the per-client gate decodes the query


@pytest.mark.parametrize(("query", "gated"), [
    (b"action=balance", True), (b"%61ction=balance", True), (b"%61%63%74%69%6f%6e=nearest&split=1", True),
    (b"split=1&action=", False), (b"transaction=1", False), (b"split=14,8", False), (b"", False),
])
def test_the_gate_finds_an_encoded_action(query, gated):
    assert has_action(query) is gated
    gate = ClientGate(None, paths=("/fragment?action",), per_client=1)
    assert gate._gated({"path": "/fragment", "query_string": query}) is gated


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["action", "%61ction", "act%69on", "a%63tion", "transaction", "split",
                                           "%2561ction", "ac+tion", "acti%6Fn", "x"]),
                          st.sampled_from(["", "balance", "14%2C8", "%20", "+", "n%65arest"])),
                max_size=5))
def test_the_gate_agrees_with_starlettes_reading(pairs):
    """The gate's shortcut (no ``ction`` once percent-decoded: no parsing) against the query as
    Starlette parses it (``parse_qsl`` of the latin-1 text, blank values kept), on generated
    queries with encoded keys and values."""
    from urllib.parse import parse_qsl

    query = "&".join(f"{k}={v}" for k, v in pairs).encode()
    expected = any(k == "action" and v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    assert has_action(query) is expected


# --------------------------------------------------------------------------- finding 3 and multipart refusals


def test_the_container_bound_refuses_before_parsing_and_keeps_real_configs():
    hostile = b'{"a":[' + b",".join([b"[0]"] * 200_000) + b"]}"
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="200,002 arrays and objects; a config has a few dozen"):
        check_config_shape(hostile)
    assert time.perf_counter() - t0 < 0.05
    check_config_shape((REPO / "app/core/presets/deepseek-v3.json").read_bytes())
    check_config_shape(json.dumps({"table": list(range(100_000))}).encode())  # long flat arrays stay fine
    with pytest.raises(ValueError, match="nests deeper than 64 levels"):
        check_config_shape(b"[" * 5000 + b"]" * 5000)


@pytest.fixture
def client(tmp_path):
    return TestClient(create_app(store=ConfigStore(tmp_path / "c.sqlite3")), raise_server_exceptions=False)


def test_a_multipart_refusal_is_the_page_with_the_fields_message(client):
    too_many = {f"f{i}": "x" for i in range(40)}
    r = client.post("/upload", data=too_many, files={"file": ("c.json", b"{}")})
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert "upload refused: Too many fields" in r.text and '"detail"' not in r.text
    files = [("files", (f"s{i}.sh", b"X=1\n")) for i in range(40)]
    r = client.post("/launcher", data={"script": "torchrun x.py"}, files=files)
    assert r.status_code == 400 and "launcher refused: Too many files" in r.text


def test_starlettes_own_refusals_have_the_isplan_error_shape(client):
    r = client.get("/no-such-page")
    assert r.status_code == 404 and r.json()["errors"][0]["code"] == "not_found"


def test_the_upload_rate_counts_refused_bytes_and_refills():
    now = [0.0]
    rate = UploadRate(None, rate=2 << 20, clock=lambda: now[0])  # type: ignore[arg-type]
    rate.charge("a", 1 << 20)
    rate.charge("a", 1 << 20)  # two refused megabyte uploads
    assert rate.tokens("a") <= 0 and rate.tokens("b") == 2 << 20  # another client is not charged
    now[0] = 30.0  # half a minute refills half the rate
    assert rate.tokens("a") == pytest.approx(1 << 20)


# --------------------------------------------------------------------------- findings 13 and 15, worker memory


def spin(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    while True:
        pass


_HELD: list[bytearray] = []


def hold(n: int) -> int:
    _HELD.append(bytearray(n))  # stays allocated in the worker after the job
    return os.getpid()


def test_a_killed_worker_is_a_worker_lost_503_and_the_pool_recovers(tmp_path):
    pool = WorkerPool(1, per_client=2)
    pid_file = tmp_path / "pid"

    async def scenario() -> None:
        job = asyncio.ensure_future(run_bounded(spin, str(pid_file), client="c", deadline=30, pool=pool))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if pid_file.exists() and pid_file.read_text():
                break
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with pytest.raises(WorkerLost, match=r"was lost .* retry") as exc:
            await job
        assert exc.value.status_code == 503
        assert await run_bounded(hold, 1, client="c", deadline=30, pool=pool)

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown()


def test_a_worker_grown_past_its_memory_is_replaced():
    pool = WorkerPool(1, per_client=2, recycle_rss=128 << 20)

    async def scenario() -> tuple[int, int, int]:
        small = await run_bounded(hold, 1 << 20, client="c", deadline=30, pool=pool)
        big = await run_bounded(hold, 200 << 20, client="c", deadline=30, pool=pool)
        after = await run_bounded(hold, 1, client="c", deadline=30, pool=pool)
        return small, big, after

    try:
        small, big, after = asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert small == big != after and pool.recycled == 1


def test_pool_shutdown_stops_the_forkserver_and_removes_its_directory(tmp_path):
    script = ("import asyncio, os\nfrom app.web.workers import WorkerPool\n"
              "p = WorkerPool(1)\nasyncio.run(p.start())\nprint(len(os.listdir(os.environ['TMPDIR'])))\n"
              "p.shutdown()\nprint(len(os.listdir(os.environ['TMPDIR'])))\n"
              "import signal; os.kill(os.getpid(), signal.SIGTERM)\n")  # no atexit, as under uvicorn
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(tmp_path)}, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "0"], out.stdout + out.stderr
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- findings 14 and 16: the store


def test_a_deleted_sqlite_file_is_detected_on_write_and_by_health(tmp_path):
    store = ConfigStore(tmp_path / "configs.sqlite3")
    store.put(json.dumps(tiny_config(8)).encode())
    assert store.health()["ok"]
    for f in tmp_path.glob("configs.sqlite3*"):
        f.unlink()
    with pytest.raises(StoreUnavailable, match="removed or replaced") as exc:
        store.put(json.dumps(tiny_config(9)).encode())
    assert str(tmp_path) not in str(exc.value)
    health = store.health()
    assert health["ok"] is False and "removed or replaced" in health["detail"]


def test_an_uncreatable_data_dir_names_no_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    client = TestClient(create_app(store=ConfigStore(blocker / "sub" / "configs.sqlite3")))
    for r in (client.get("/healthz"), client.post("/upload", files={"file": ("c.json", json.dumps(tiny_config(8)))})):
        assert r.status_code == 503 and str(tmp_path) not in r.text and "ISPLAN_DATA_DIR" in r.text


def test_an_unreachable_postgresql_names_no_socket_path(tmp_path):
    pytest.importorskip("psycopg")
    from app.web.store_postgres import PostgresConfigStore

    socket_dir = tmp_path / "no-server-here"
    store = PostgresConfigStore(f"postgresql:///isplan?host={socket_dir}", connect_timeout=2)
    with pytest.raises(StoreUnavailable) as exc:
        store.count()
    assert str(socket_dir) not in str(exc.value) and "ISPLAN_DATABASE_URL" in str(exc.value)
    assert str(socket_dir) not in store.health()["detail"]


def test_the_first_upload_after_postgresql_restarts_is_stored(tmp_path):
    """Right after PostgreSQL comes back, the store's old connection is dead; the upload is run
    once more on a fresh connection instead of a 503 "connection is bad" (issue 20)."""
    pytest.importorskip("psycopg")
    if not Path("/usr/local/bin/pg_ctl").exists() and not list(Path("/usr/lib/postgresql").glob("*/bin")):
        pytest.skip("no PostgreSQL server binaries")
    import shutil
    import tempfile

    from app.web.store_postgres import PostgresConfigStore

    pg = Path(tempfile.mkdtemp(prefix="isplan-pg.", dir="/tmp"))  # the server's user must reach it
    start = subprocess.run(["bash", str(REPO / "scripts/pg_test_server.sh"), "start", str(pg)], capture_output=True,
                           text=True, timeout=120)
    if start.returncode != 0:
        pytest.skip(f"cannot start a throw-away PostgreSQL: {start.stderr[-300:]}")
    url = start.stdout.strip()
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    try:
        store = PostgresConfigStore(url)
        store.put(json.dumps(tiny_config(8)).encode())
        before = store._conn
        subprocess.run([*as_owner, str(pg_ctl), "-D", str(pg / "data"), "-l", str(pg / "server.log"), "-m", "fast",
                        "-w", "restart"], check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cfg = store.put(json.dumps(tiny_config(9)).encode())  # on the connection the restart dropped: retried
        assert store._conn is not before
        assert store.get(cfg.id) is not None and store.count() == 2
        store.close()
    finally:
        subprocess.run(["bash", str(REPO / "scripts/pg_test_server.sh"), "stop", str(pg)], timeout=120,
                       capture_output=True)
        shutil.rmtree(pg, ignore_errors=True)


# --------------------------------------------------------------------------- the fast paths give the same data


@pytest.mark.parametrize("query", [
    {}, {"model": "glm-5.2", "pp": "8", "first": "14", "last": "16"},
    {"model": "glm-5.2", "split": "10,10,10,10,10,10,9,9", "tp": "4"},
    {"model": "qwen3-235b-a22b", "engine": "vllm", "pp": "2"}, {"model": "glm-5.2", "engine": "maxtext"},
    {"model": "deepseek-v3", "pp": "4", "vpp": "2", "conv_pp": "2", "conv_last": "30"},
])
def test_page_data_is_the_page_views_json(query, tmp_path):
    """``GET /api/v1/plan`` now skips the page's display parts; its JSON must not change."""
    from app.core.engines.slime import SLIME_GLM52_PROFILE

    store = ConfigStore(tmp_path / "c.sqlite3")
    plan = strict_plan(query, empty=SLIME_GLM52_PROFILE)
    cfg = load_preset(plan.model)
    assert page_data(plan, cfg) == build_view(plan, [], store).page_json()


def test_the_plan_routes_still_publish_their_query_and_response_in_openapi(client):
    spec = client.get("/openapi.json").json()
    for path in ("/api/v1/plan", "/api/v1/check", "/api/v1/memory", "/api/v1/receipt", "/api/v1/roles",
                 "/api/v1/search", "/api/v1/plan-search"):
        op = spec["paths"][path]["get"]
        names = [p["name"] for p in op["parameters"]]
        assert {"model", "pp", "split", "tp", "engine"} <= set(names), path
        assert len(names) == len(set(names)), path  # each parameter once
        assert "$ref" in json.dumps(op["responses"]["200"]), path
    pp = next(p for p in spec["paths"]["/api/v1/check"]["get"]["parameters"] if p["name"] == "pp")
    assert pp["schema"]["anyOf"][0]["maximum"] == bounds.MAX_PP


def test_a_plan_query_error_is_still_a_422_naming_the_field(client):
    for route in ("/api/v1/plan", "/api/v1/check", "/api/v1/memory", "/api/v1/receipt"):
        r = client.get(f"{route}?model=glm-5.2&pp=abc")
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "pp", (route, r.text[:200])


def test_plan_units_send_huge_plans_to_the_pool():
    glm = load_preset("glm-5.2")
    big = dataclasses.replace(glm, num_hidden_layers=4096)
    assert plan_units(plan_from_query({"pp": "8"})[0], glm) == 78 + 8 <= INLINE_UNITS
    assert plan_units(plan_from_query({"pp": "256", "vpp": "16"})[0], big) == 4096 + 4096 > INLINE_UNITS
    layout = plan_from_query({"pp": "16", "layout": "Et*3|(tt|)*29,m|L", "mtp": "1"})[0]
    assert plan_units(layout, glm) == 78 + 1 + 32


def test_a_huge_page_is_the_same_html_from_the_pool(tmp_path):
    """The pool renders exactly what the server process would (one page_html, two places)."""
    from app.web.routers.pages import PageJob, page_html

    store = ConfigStore(tmp_path / "c.sqlite3")
    cfg = store.put(json.dumps(tiny_config(600, indexer_types=["full"] * 600)).encode())
    plan, problems = plan_from_query({"model": cfg.id, "pp": "100"})
    job = PageJob("_results.html", plan, tuple(problems), (cfg,), context=(("oob", True),), gzip=True)
    pool = WorkerPool(1)
    try:
        remote = asyncio.run(run_bounded(page_html, job, client="c", deadline=60, pool=pool))
    finally:
        pool.shutdown()
    local = page_html(PageJob("_results.html", plan, tuple(problems), (cfg,), context=(("oob", True),)))
    assert remote.share_query == local.share_query
    assert gzip.decompress(remote.body) == local.body and local.body.count(b'class="cell full') == 600


def test_a_huge_launcher_page_from_the_pool_keeps_the_scripts_errors(tmp_path):
    """A launcher's page (its report and the errors the import found) is a PageJob too: the pool
    renders what the server process would, and an error of the script blocks the verdict there."""
    from app.core.launcher import import_launcher
    from app.core.layout.stages import PlanError as Finding
    from app.core.plan import Plan
    from app.web.routers.pages import PageJob, page_html

    store = ConfigStore(tmp_path / "c.sqlite3")
    cfg = store.put(json.dumps(tiny_config(600, indexer_types=["full"] * 600)).encode())
    imported = import_launcher("torchrun pretrain_gpt.py --pipeline-model-parallel-size 100\n", cfg,
                               Plan(model=cfg.id, engine="megatron"))
    assert imported.plan.pp == 100 and plan_units(imported.plan, cfg) > INLINE_UNITS
    report = {**imported.report, "warnings": list(imported.warnings)}
    error = Finding("launcher_model_mismatch", "launch.sh:7: --mtp-num-layers 5 exceeds the model's 1", "--mtp-num-layers",
                    kind="model")
    job = PageJob("index.html", imported.plan, (), (cfg,), launcher=report, extra_errors=(error,))
    pool = WorkerPool(1)
    try:
        remote = asyncio.run(run_bounded(page_html, job, client="c", deadline=60, pool=pool))
    finally:
        pool.shutdown()
    assert remote == page_html(job)
    html = remote.body.decode()
    assert "--mtp-num-layers 5 exceeds the model" in html and 'id="launcher-report"' in html
    assert "NO-GO" in html


def test_peer_keys_group_an_ipv6_host_and_keep_ipv4_addresses():
    assert peer_key(("127.0.0.2", 5)) == "127.0.0.2" and peer_key(None) == "local"
    assert peer_key(("2001:db8::1", 5)) == peer_key(("2001:db8::ffff", 6)) == "2001:db8::/64"
    assert peer_key(("::ffff:10.0.0.1", 5)) == "10.0.0.1"
