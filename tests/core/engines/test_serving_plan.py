"""Best serving partitions and their export, checked against brute force over all valid partitions."""

from __future__ import annotations

import itertools
import json
import shlex

import pytest

from app.core.engines.serving import (
    best_serving_partition,
    engine_roles,
    export_partition,
    serving_check,
    serving_plan,
)
from app.core.model.config import load_model
from app.core.model.serving_memory import ServingMemorySettings, serving_memory
from tests.conftest import REPO

GLM52 = load_model("glm-5.2")
RAW = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())
FULL = [i + 1 for i, t in enumerate(RAW["indexer_types"]) if t == "full"]


def valid_partitions(pp: int):
    """Every partition whose rank starts are all full layers: choose pp-1 starts after layer 1."""
    for starts in itertools.combinations(FULL[1:], pp - 1):
        bounds = [1, *starts, 79]
        yield [b - a for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_layers_objective_reaches_the_brute_force_minimum(pp):
    best = min(max(p) for p in valid_partitions(pp))
    found = best_serving_partition(GLM52, "vllm", pp, objective="layers")[0]
    assert max(found.sizes) == best
    assert found.check.valid and not found.check.boundary.violations


def test_layers_objective_examples():
    assert best_serving_partition(GLM52, "vllm", 2, objective="layers")[0].sizes == (38, 40)
    assert best_serving_partition(GLM52, "vllm", 4, objective="layers")[0].sizes == (18, 20, 20, 20)
    assert max(best_serving_partition(GLM52, "vllm", 8, objective="layers")[0].sizes) <= 12


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_memory_objective_is_valid_for_every_default_that_is_not(pp):
    assert not serving_check(GLM52, "vllm", pp).valid
    for c in best_serving_partition(GLM52, "vllm", pp, k=3):
        assert c.check.valid, c.sizes


def test_memory_objective_minimises_the_largest_rank_pp4():
    settings = ServingMemorySettings(tp=8, context=65536, concurrency=8)
    roles, _ = engine_roles(GLM52, "vllm")

    def worst(sizes):
        plan = serving_plan(GLM52, "vllm", 4, sizes)
        return max(r.total for r in serving_memory(GLM52, plan, roles, settings).ranks)

    brute = min(worst(p) for p in valid_partitions(4))
    found = best_serving_partition(GLM52, "vllm", 4, memory=settings)[0]
    assert worst(list(found.sizes)) == brute


def test_export_quotes_and_round_trips_through_shlex():
    e = export_partition(GLM52, "vllm", 4, [18, 20, 20, 20], tp=8)
    assert e["env_line"] == "VLLM_PP_LAYER_PARTITION=18,20,20,20"
    assert shlex.split(e["command"]) == ["vllm", "serve", "zai-org/GLM-5.2", "--tensor-parallel-size", "8",
                                         "--pipeline-parallel-size", "4"]
    odd = export_partition(GLM52, "sglang", 2, [38, 40], tp=4, model="/models/GLM 5.2; rm -rf")
    assert shlex.split(odd["command"]) == ["python", "-m", "sglang.launch_server", "--model-path",
                                           "/models/GLM 5.2; rm -rf", "--tp-size", "4", "--pp-size", "2"]
    assert odd["script"].splitlines()[0] == "export SGLANG_PP_LAYER_PARTITION=38,40"


def test_plan_report_shape_and_no_valid_partition():
    """``isplan plan --engine sglang --pp 4 --tp 8`` and its API twin: the best partition, evaluated
    again as ``isplan check`` (the check's shape, the export), beside the engine's default."""
    from urllib.parse import parse_qsl

    from app.core.evaluate import evaluate
    from app.core.plan import strict_plan, unknown_keys
    from app.core.reports import check_report, plan_search_report

    query = {"model": "glm-5.2", "engine": "sglang", "pp": "4", "tp": "8"}
    body = plan_search_report(strict_plan(query), GLM52, objective="layers").body
    assert body["best"]["split"] == [18, 20, 20, 20]
    best = strict_plan(dict(parse_qsl(body["best"]["query"])))
    checked = check_report(best, GLM52).body
    assert checked["valid"] and {"valid", "stages", "violations", "errors", "exports"} <= set(checked)
    assert evaluate(best, GLM52).exports()["serve_command"].startswith("python -m sglang.launch_server")
    default = evaluate(strict_plan(query), GLM52).check
    assert [s.num_layers for s in default.plan.stages] == [19, 19, 20, 20]
    none = plan_search_report(strict_plan({"model": "glm-5.2", "engine": "vllm", "pp": str(len(FULL) + 1)}), GLM52)
    assert not none.verdict.go and [r.code for r in none.verdict.blocking] == ["no_valid_layout"]
    assert body["best"] and none.body["best"] is None
    assert [p.field for p in unknown_keys(["contxt"])] == ["contxt"]   # an unknown serving setting
