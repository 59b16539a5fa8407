"""One report per command: ``isplan <command> --format json`` and ``GET /api/v1/<command>`` give
the same object (the verdict included) for the same plan, for every command."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from app.core.reports import VOLATILE_KEYS

PROFILE_ARGS = ["--pp", "8", "--first", "14", "--last", "16", "--tp", "4", "--cp", "8", "--ep", "32", "--etp", "1",
                "--dp", "1", "--sp", "--tokens-per-gpu", "8192", "--recompute", "full", "--optimizer-cpu-offload",
                "--use-precision-aware-optimizer"]
PROFILE_QUERY = {"pp": "8", "first": "14", "last": "16", "tp": "4", "cp": "8", "ep": "32", "etp": "1", "dp": "1",
                 "sp": "1", "tpg": "8192", "recompute": "full", "offload": "1", "pao": "1"}
BAD = "10,10,10,10,10,10,9,9"

# (command line after the model, API path, API query): the same plan written both ways
CASES = [
    ("check", ["--split", BAD], "/api/v1/check", {"split": BAD}),
    ("check", PROFILE_ARGS, "/api/v1/check", PROFILE_QUERY),
    ("check", PROFILE_ARGS[:14] + PROFILE_ARGS[16:] + ["--gpus", "300"], "/api/v1/check",
     {**{k: v for k, v in PROFILE_QUERY.items() if k != "dp"}, "gpus": "300"}),
    ("check", ["--engine", "vllm", "--pp", "8"], "/api/v1/check", {"engine": "vllm", "pp": "8"}),
    ("check", ["--engine", "sglang", "--split", "10,8,8,8,8,12,12,12", "--engine-version", "2026-01-01"],
     "/api/v1/check", {"engine": "sglang", "split": "10,8,8,8,8,12,12,12", "engine_version": "2026-01-01"}),
    ("check", ["--engine", "maxtext", "--ici-pipeline-parallelism", "4", "--layers-per-pipeline-stage", "4"],
     "/api/v1/check", {"engine": "maxtext", "ici_pp": "4", "lps": "4"}),
    ("roles", ["--pattern", "FSSS"], "/api/v1/roles", {"pattern": "FSSS"}),
    ("roles", ["--engine", "vllm"], "/api/v1/roles", {"engine": "vllm"}),
    ("roles", ["--engine", "maxtext", "--pattern", "FSSS"], "/api/v1/roles", {"engine": "maxtext", "pattern": "FSSS"}),
    ("params", [], "/api/v1/params", {}),
    ("params", ["--split", "14,8,8,8,8,8,8,16", "--tp", "4", "--ep", "32", "--etp", "1"], "/api/v1/params",
     {"split": "14,8,8,8,8,8,8,16", "tp": "4", "ep": "32", "etp": "1"}),
    ("memory", PROFILE_ARGS, "/api/v1/memory", PROFILE_QUERY),
    ("memory", PROFILE_ARGS[:-1], "/api/v1/memory", {k: v for k, v in PROFILE_QUERY.items() if k != "pao"}),
    ("flops", ["--context", "32768"], "/api/v1/flops", {"ctx": "32768"}),
    ("flops", ["--global-batch", "4", "--seq-length", "1024"], "/api/v1/flops", {"gbs": "4", "seq": "1024"}),
    ("plan", ["--pp", "8", "--objective", "memory", "--near", BAD], "/api/v1/plan-search",
     {"pp": "8", "objective": "memory", "near": BAD}),
    ("plan", ["--engine", "vllm", "--pp", "4"], "/api/v1/plan-search", {"engine": "vllm", "pp": "4"}),
    ("search", ["--gpus", "256", "--tokens-per-gpu", "8192", "--top", "2"], "/api/v1/search",
     {"gpus": "256", "tpg": "8192", "top": "2"}),
    ("time", PROFILE_ARGS + ["--global-batch", "64"], "/api/v1/time", {**PROFILE_QUERY, "global_batch": "64"}),
    ("search", ["--gpus", "64", "--seq-length", "4096", "--top", "2", "--pareto"], "/api/v1/search",
     {"gpus": "64", "seq_length": "4096", "top": "2", "pareto": "1"}),
    ("receipt", ["--pp", "8", "--first", "14", "--last", "16", "--conv-pp", "2", "--conv-last", "40"],
     "/api/v1/receipt", {"pp": "8", "first": "14", "last": "16", "conv_pp": "2", "conv_last": "40"}),
]


def run_cli(argv: list[str]) -> tuple[int, dict]:
    from app.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, json.loads(out.getvalue())


def _stable(body: object) -> object:
    """The body without wall-clock values (search time, receipt timestamp and its digest)."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k not in VOLATILE_KEYS}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return body




@pytest.mark.parametrize("command, args, path, query", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_cli_json_equals_api_json(client, command, args, path, query):
    argv = [command, "glm-5.2", *args] + (["--format", "json"] if command != "receipt" else [])
    code, cli = run_cli(argv)
    r = client.get(path, params=query)
    assert r.status_code == 200, r.text
    api = r.json()
    assert "verdict" in cli and "verdict" in api
    assert _stable(api) == _stable(cli)
    assert code == (0 if cli["verdict"]["go"] else 1)  # the exit code is the verdict
