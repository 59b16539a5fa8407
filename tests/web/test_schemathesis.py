"""Schemathesis against the app's own OpenAPI schema, in process (ASGI, no network).

Two runs, each one hypothesis test per operation and generation mode, failures collected across
every operation before the test fails:

* the schema exactly as ``app.openapi()`` publishes it (>= 1000 generated cases);
* the same schema with what it leaves out declared, so those code paths get fuzzed too: the query
  parameters that ``/api/v1/plan``, ``/check``, ``/memory`` and ``/receipt`` read from the raw
  request (the page's ``PlanState`` fields), a JSON body for ``POST /api/v1/verify``, the pages
  ``/``, ``/fragment`` and ``/receipt``, and the ``/launcher`` and ``/upload`` forms; parameter
  schemas are widened with realistic values (presets, an uploaded config, splits, layouts).

At least :data:`MIN_CASES` cases each, so >= 5,000 in all (issue 9), with 0 x 5xx; the peak
resident memory of the server (this process: the app runs in it) and of the planner's worker
processes stays under :data:`MAX_RSS_MB` through both runs.

Checks: schemathesis' ``not_a_server_error``, ``content_type_conformance`` and
``response_schema_conformance`` everywhere, ``status_code_conformance`` wherever the operation
declares its error responses; operations without response models (FastAPI declares no 4xx for a
route that reads ``request`` itself) must at least answer every 4xx with a JSON body carrying an
``errors`` or ``detail`` key (or, for pages, an HTML page). Undeclared status codes are printed.
"""

from __future__ import annotations

import copy
import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis  # test extra (pyproject [test]); imported plainly so a missing install fails loudly
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis import checks as st_checks

from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_preset, preset_ids
from app.core.plan import TABLE
from app.core.receipt import build_receipt
from app.web.app import create_app
from app.web.store import ConfigStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow

MIN_CASES = 2500  # per run: two runs, >= 5,000 cases in all
MAX_RSS_MB = 512
# derandomized (the same cases every run: no flaky CI), without the slow "explain" phase
PHASES = [Phase.explicit, Phase.generate, Phase.target, Phase.shrink]

# examples per (operation, mode); unlisted operations get DEFAULT. Search is ~0.1-0.8 s a call.
PUBLISHED_BUDGET = {"GET /api/v1/search": (40, 20)}
PUBLISHED_DEFAULT = (220, 70)
AUGMENTED_BUDGET = {"GET /api/v1/search": (20, 0), "POST /upload": (120, 0), "POST /launcher": (250, 0),
                    "POST /api/v1/verify": (250, 0), "GET /fragment": (250, 0), "GET /": (200, 0),
                    "GET /docs": (1, 0), "GET /profile": (25, 0),
                    "GET /fragment/search": (15, 0), "GET /fragment/schedule": (60, 0), "GET /about": (2, 0),
                    "GET /config/{model_id}": (10, 0)}
AUGMENTED_DEFAULT = (190, 0)


def _peak_rss_mb(pid: int | str) -> float:
    """Peak resident set size (``VmHWM``) of a process, in MB (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _check_memory(run_name: str) -> None:
    """The server process and every planner worker peaked under MAX_RSS_MB."""
    from app.web.workers import default_pool

    peaks = {"server (this process)": _peak_rss_mb("self")}
    peaks.update({f"worker {pid}": _peak_rss_mb(pid) for pid in default_pool().pids()})
    print(f"{run_name}: peak RSS " + ", ".join(f"{k} {v:.0f} MB" for k, v in peaks.items()))
    assert all(v < MAX_RSS_MB for v in peaks.values()), peaks


@dataclass
class Run:
    cases: int = 0
    per_operation: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, set[int]] = field(default_factory=dict)
    undeclared: dict[str, set[int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def app_store(tmp_path_factory):
    """The app with its config store in a temporary directory (and one uploaded config)."""
    mp = pytest.MonkeyPatch()
    data_dir = tmp_path_factory.mktemp("isplan-data")
    mp.setenv("ISPLAN_DATA_DIR", str(data_dir))
    store = ConfigStore(data_dir / "configs.sqlite3")
    uploaded = store.put(json.dumps(tiny_config(8)).encode(), name="tiny.json")
    yield create_app(store=store), uploaded.id
    mp.undo()


def _declared(operation: Any) -> dict[str, Any]:
    return operation.definition.raw.get("responses", {})


def _declares_errors(operation: Any) -> bool:
    return any(code.startswith("4") for code in _declared(operation))


def _exercise(schema: Any, app: Any, budgets: dict[str, tuple[int, int]], default: tuple[int, int]) -> Run:
    run = Run()
    for result in schema.get_all_operations():
        operation = result.ok()
        checks = [st_checks.not_a_server_error, st_checks.content_type_conformance,
                  st_checks.response_schema_conformance]
        if _declares_errors(operation):
            checks.append(st_checks.status_code_conformance)
        positive, negative = budgets.get(operation.label, default)
        for mode, n in ((GenerationMode.POSITIVE, positive), (GenerationMode.NEGATIVE, negative)):
            if n == 0 or (mode is GenerationMode.NEGATIVE and not operation.query and not operation.body):
                continue
            try:
                _fuzz_operation(operation, app, mode, n, checks, run)
            except Unsatisfiable:
                pass
            except Exception as exc:
                run.failures.append(f"--- {operation.label} ({mode.value}) ---\n{_describe(exc)}")
    return run


def _fuzz_operation(operation: Any, app: Any, mode: GenerationMode, n: int, checks: list[Any], run: Run) -> None:
    label = operation.label
    declared = {int(c) for c in _declared(operation) if c.isdigit()}

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize=True, phases=PHASES)
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case):
        run.cases += 1
        run.per_operation[label] = run.per_operation.get(label, 0) + 1
        response = case.call(app=app)
        run.statuses.setdefault(label, set()).add(response.status_code)
        if response.status_code not in declared:
            run.undeclared.setdefault(label, set()).add(response.status_code)
        case.validate_response(response, checks=checks)
        if 400 <= response.status_code < 500:
            ctype = response.headers.get("content-type", [""])[0]
            if "json" in ctype:
                body = response.json()
                assert isinstance(body, dict) and ("errors" in body or "detail" in body), (
                    f"{label} {response.status_code} JSON body has no errors/detail: {response.text[:300]}")
            else:
                assert "html" in ctype, f"{label} {response.status_code} answered {ctype!r}"

    one()


def _describe(exc: BaseException) -> str:
    """The exception, where in the app it was raised, and the notes hypothesis/schemathesis added
    (the request that triggered it, as a curl command)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/app/" in f.filename]
    where = "".join(f"\n    at {f.filename.split('/app/', 1)[-1]}:{f.lineno} in {f.name}: {f.line}" for f in frames[-4:])
    notes = "\n".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc}{where}\n{notes}"


def _report(name: str, run: Run, seconds: float) -> None:
    print(f"\n{name}: {run.cases} generated cases in {seconds:.1f} s")
    for label, n in sorted(run.per_operation.items()):
        print(f"  {label:32} {n:5} cases, statuses {sorted(run.statuses.get(label, ()))}")
    for label, codes in sorted(run.undeclared.items()):
        print(f"  schema gap: {label} answers undeclared status {sorted(codes)}")


def test_published_schema(app_store):
    """>= MIN_CASES cases over every operation of ``app.openapi()``: no 5xx, responses as declared."""
    app, _ = app_store
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = {r.ok().label for r in schema.get_all_operations()}
    assert operations == {f"{m.upper()} {p}" for p, item in app.openapi()["paths"].items() for m in item}
    t0 = time.perf_counter()
    run = _exercise(schema, app, PUBLISHED_BUDGET, PUBLISHED_DEFAULT)
    _report("published schema", run, time.perf_counter() - t0)
    assert set(run.per_operation) == operations, "some operation generated no case"
    assert run.cases >= MIN_CASES
    assert not run.failures, "\n\n".join(run.failures)
    _check_memory("published schema")


# --------------------------------------------------------------------------- the augmented schema


def _anything(*branches: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*branches, {"type": "string", "maxLength": 60}]}




def _state_parameters(uploaded: str) -> list[dict[str, Any]]:
    """The page's query parameters (``PlanState`` fields), mostly plausible, sometimes junk."""
    models = [*preset_ids(), uploaded, "sha256:" + "0" * 64]
    splits = ["14,8,8,8,8,8,8,16", "10,10,10,10,10,10,9,9", "78", "79", "80", "39,39", "4,4,4,4", "20,20,19,19"]
    layouts = ["Et*3|(tt|)*29,m|L", "Et*13|(t*8|)*6t*16mL", "Et|t*77mL", "E|t*78|mL", "Et*39|t*39mL"]
    special: dict[str, dict[str, Any]] = {
        "model": _anything({"enum": models}),
        "split": _anything({"enum": splits}, {"type": "string", "pattern": r"^[0-9]{1,2}(,[0-9]{1,2}){0,15}$"}),
        "conv_split": _anything({"enum": splits}),
        "layout": _anything({"enum": layouts}, {"type": "string", "pattern": r"^[EtmL|()*,0-9]{1,40}$"}),
        "pattern": _anything({"type": "string", "pattern": r"^[FS]{1,80}$"}),
        "gpu_gb": _anything({"type": "number", "minimum": 0, "maximum": 20000}),
        "sp": _anything({"enum": ["0", "1", "true", "false", "on", "off"]}),
        "offload": _anything({"enum": ["0", "1", "true", "false", "on", "off"]}),
    }
    params = []
    for spec in TABLE.values():
        key = spec.url
        if key in special:
            schema = special[key]
        elif spec.kind == "bool":
            schema = _anything({"enum": ["0", "1", "true", "false", "on", "off"]})
        elif spec.kind == "int":
            lo, hi = int(spec.lo or 0), int(spec.hi or 0)
            schema = _anything({"type": "integer", "minimum": lo - 1, "maximum": min(hi + 1, 1 << 20)},
                               {"type": "integer", "minimum": lo, "maximum": min(hi, 64)})
        elif spec.kind == "choice":
            schema = _anything({"enum": list(spec.choices)})
        else:
            schema = {"type": "string"}
        params.append({"name": key, "in": "query", "required": False, "schema": schema})
    return params


def _receipt_body_schema() -> dict[str, Any]:
    real = build_receipt(load_preset("glm-5.2"), [("training", PipelineSpec(pp=8, first=14, last=16), None, None, ())])
    small_int = {"anyOf": [{"type": "integer", "minimum": -2, "maximum": 90}, {"type": "null"}, {}]}
    shaped = {
        "type": "object",
        "required": ["model", "layouts", "engine"],
        "properties": {
            "model": {"type": "object", "required": ["id", "source"], "properties": {
                "id": {"enum": list(preset_ids())}, "source": {"const": "preset"},
                "revision": {}, "sha256": {}}},
            "engine": {"type": "object", "required": ["semantics"], "properties": {
                "semantics": {"enum": ["megatron", "slime", "hf"]}, "commit": {}}},
            "layouts": {"type": "array", "maxItems": 3, "items": {"type": "object", "required": ["inputs"], "properties": {
                "name": {},
                "inputs": {
                    "type": "object", "required": ["pp", "first", "last"], "additionalProperties": False,
                    "properties": {
                        "pp": small_int, "vpp": small_int, "first": small_int, "last": small_int,
                        "mtp_layers": small_int, "layers_per_vstage": small_int, "layout": {},
                        "split": {"anyOf": [{"type": "array", "maxItems": 10, "items": small_int}, {}]}}},
                "stages": {}, "dsa_indexer_topk_freq": small_int, "dsa_indexer_skip_topk_offset": small_int}}},
            "pattern": {}, "checks": {}, "tool": {}, "body_sha256": {},
        },
    }
    return {"anyOf": [shaped, {"enum": [real]}]}  # arbitrary JSON: tests/cli/test_fuzz.py


def _augmented_schema(app: Any, uploaded: str) -> dict[str, Any]:
    spec = copy.deepcopy(app.openapi())
    paths = spec["paths"]
    state = _state_parameters(uploaded)
    json_ok = {"description": "OK", "content": {"application/json": {"schema": {}}}}
    bad = {"description": "bad input", "content": {"application/json": {"schema": {}}, "text/html": {"schema": {}}}}
    html_ok = {"description": "page", "content": {"text/html": {"schema": {"type": "string"}}}}
    models = _anything({"enum": [*preset_ids(), uploaded]})
    # routes that read request.query_params themselves
    for path in ("/api/v1/plan", "/api/v1/check", "/api/v1/memory", "/api/v1/receipt"):
        paths[path]["get"]["parameters"] = copy.deepcopy(state)
        paths[path]["get"]["responses"]["422"] = bad
    # widen the model / split / pattern / near parameters of the typed routes with realistic values
    for item in paths.values():
        for op in item.values():
            for p in op.get("parameters", []):
                if p["name"] == "model":
                    p["schema"] = models
                elif p["name"] in ("split", "near"):
                    p["schema"] = _anything({"enum": ["14,8,8,8,8,8,8,16", "10,10,10,10,10,10,9,9", "79", "²"]},
                                            {"type": "string", "pattern": r"^[0-9]{1,2}(,[0-9]{1,2}){0,15}$"})
                elif p["name"] == "pattern":
                    p["schema"] = _anything({"type": "string", "pattern": r"^[FS]{1,80}$"})
    paths["/api/v1/verify"]["post"]["requestBody"] = {
        "required": True, "content": {"application/json": {"schema": _receipt_body_schema()}}}
    paths["/api/v1/verify"]["post"]["responses"]["422"] = bad
    # the pages (include_in_schema=False in the app)
    state = _state_parameters(uploaded)  # the page parser bounds the world as the API does
    paths["/"] = {"get": {"operationId": "index", "parameters": copy.deepcopy(state),
                          "responses": {"200": html_ok, "422": bad}}}
    paths["/fragment"] = {"get": {"operationId": "fragment", "parameters": [
        *copy.deepcopy(state),
        {"name": "action", "in": "query", "required": False, "schema": _anything({"enum": ["balance", "nearest"]})},
    ], "responses": {"200": html_ok, "422": bad}}}
    paths["/receipt"] = {"get": {"operationId": "receipt_download", "parameters": copy.deepcopy(state),
                                 "responses": {"200": json_ok, "422": bad}}}
    launcher_script = _anything(
        {"enum": [("--pipeline-model-parallel-size 8 --decoder-first-pipeline-num-layers 14 "
                   "--decoder-last-pipeline-num-layers 16"),
                  "PP=8\nARGS=(--pipeline-model-parallel-size $PP --num-virtual-stages-per-pipeline-rank 2)",
                  "--pipeline-model-parallel-size 0", "--pipeline-model-parallel-size $((1/0))",
                  "--dsa-indexer-topk-freq 0 --pipeline-model-parallel-size 2",
                  "--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L' --pipeline-model-parallel-size 8",
                  "--actor-num-nodes 4 --actor-num-gpus-per-node 8 --tensor-model-parallel-size 0"]},
        {"type": "string", "pattern": r"^(--[a-z-]{3,40} [-0-9$(){}A-Z]{0,8}\n?){1,6}$"})
    paths["/launcher"] = {"post": {"operationId": "launcher_form", "requestBody": {"required": True, "content": {
        "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
            "script": launcher_script, "model": models}}}}},
        "responses": {"200": html_ok, "303": {"description": "redirect to the page"}, "422": bad}}}
    paths["/upload"] = {"post": {"operationId": "upload", "requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "string", "format": "binary"}, "query": {"type": "string", "maxLength": 80},
            "token": {"type": "string", "maxLength": 20}}}}}},
        "responses": {"200": html_ok, "303": {"description": "redirect to the page"}, "422": bad}}}
    redirect = {"200": {"description": "an htmx redirect (HX-Redirect)"}, "303": {"description": "redirect to the page"}}
    picks = [p for p in state if p["name"] in ("model", "engine", "gpu", "gpu_memory_gb")]
    paths["/profile"] = {"get": {"operationId": "profile", "parameters": copy.deepcopy(picks), "responses": redirect}}
    paths["/fragment/search"] = {"get": {"operationId": "search_fragment", "parameters": [
        *copy.deepcopy(state),
        {"name": "budget", "in": "query", "required": False,
         "schema": _anything({"type": "integer", "minimum": 1, "maximum": 512}, {"enum": ["8", "64", "0", "x"]})},
    ], "responses": {"200": html_ok, "422": bad, "429": bad, "503": bad}}}
    paths["/fragment/schedule"] = {"get": {"operationId": "schedule_fragment", "parameters": copy.deepcopy(state),
                                           "responses": {"200": html_ok}}}
    paths["/about"] = {"get": {"operationId": "about_page", "responses": {"200": html_ok}}}
    paths["/config/{model_id}"] = {"get": {"operationId": "config_download", "parameters": [
        {"name": "model_id", "in": "path", "required": True,
         "schema": _anything({"enum": [uploaded, "sha256:" + "0" * 64, "glm-5.2"]})}],
        "responses": {"200": json_ok, "404": bad}}}
    static = {"200": {"description": "OK"}}
    paths["/docs"] = {"get": {"operationId": "docs", "responses": static}}
    return spec


def test_schema_with_request_parameters_declared(app_store):
    """The operations and parameters the published schema leaves out, fuzzed the same way: every
    route the app serves (a new page route cannot be left out)."""
    app, uploaded = app_store
    raw = _augmented_schema(app, uploaded)
    served = {(m, r.path) for r in app.routes for m in getattr(r, "methods", None) or () if m not in ("HEAD",)}
    served = {(m, p) for m, p in served if p not in ("/openapi.json", "/healthz") and not p.startswith("/static")}
    fuzzed = {(m.upper(), p) for p, item in raw["paths"].items() for m in item}
    assert served <= fuzzed, sorted(served - fuzzed)
    schema = schemathesis.openapi.from_dict(raw)
    t0 = time.perf_counter()
    run = _exercise(schema, app, AUGMENTED_BUDGET, AUGMENTED_DEFAULT)
    _report("schema with request parameters declared", run, time.perf_counter() - t0)
    assert len(run.per_operation) == sum(len(item) for item in raw["paths"].values())
    assert run.cases >= MIN_CASES
    assert not run.failures, "\n\n".join(run.failures)
    _check_memory("augmented schema")
