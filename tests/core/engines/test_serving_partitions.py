"""vLLM / SGLang layer partitions: default rules, the env-var list, and the boundary verdict.

Expected values are derived here independently: the default rules are re-implemented in the
engines' own per-rank (start, end) form, the full layers come from the checkpoint's
``indexer_types`` read directly from the preset's JSON, and published figures carry their source.
"""

from __future__ import annotations

import json
import re

import pytest

from app.core.engines.rules import EngineInputError
from app.core.engines.serving import (
    default_partition,
    serving_check,
    serving_plan,
)
from app.core.model.config import load_model
from tests.conftest import GLM52_FULL, REPO, make_config, tiny_config

GLM52 = load_model("glm-5.2")
RAW52 = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())
FULL52 = {i + 1 for i, t in enumerate(RAW52["indexer_types"]) if t == "full"}


def vllm_rank_range(layers: int, rank: int, pp: int) -> tuple[int, int]:
    """vLLM get_pp_indices, default branch: the list form with ``partitions[-i] += 1``."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    start = sum(parts[:rank])
    return start, start + parts[rank]


def sglang_rank_range(layers: int, rank: int, pp: int) -> tuple[int, int]:
    """SGLang after PR #13977: closed-form start of a rank when the last ``r`` ranks get one more."""
    base, r = divmod(layers, pp)
    if rank >= pp - r:
        start = rank * (base + 1) - (pp - r)
        return start, start + base + 1
    return rank * base, rank * base + base


def sizes_from(range_fn, layers: int, pp: int) -> list[int]:
    out = []
    for rank in range(pp):
        a, b = range_fn(layers, rank, pp)
        out.append(b - a)
    # the ranges tile [0, layers) without gaps
    assert range_fn(layers, 0, pp)[0] == 0 and range_fn(layers, pp - 1, pp)[1] == layers
    return out


@pytest.mark.parametrize("layers", [61, 78, 92])
@pytest.mark.parametrize("pp", range(2, 17))
def test_vllm_default_matches_get_pp_indices(layers, pp):
    assert default_partition("vllm", layers, pp) == sizes_from(vllm_rank_range, layers, pp)


@pytest.mark.parametrize("layers", [61, 78, 92])
@pytest.mark.parametrize("pp", range(2, 17))
def test_sglang_default_matches_get_pp_indices(layers, pp):
    assert default_partition("sglang", layers, pp) == sizes_from(sglang_rank_range, layers, pp)


@pytest.mark.parametrize("layers", [61, 78, 92])
@pytest.mark.parametrize("pp", range(2, 17))
def test_old_builds_put_the_remainder_on_the_last_rank(layers, pp):
    # vLLM v0.6.x and SGLang before PR #13282: start = rank * (L // P); the last rank ends at L
    expected = [layers // pp] * (pp - 1) + [layers - (pp - 1) * (layers // pp)]
    assert default_partition("vllm", layers, pp, "2025-01-01") == expected
    assert default_partition("sglang", layers, pp, "2025-10-01") == expected


def test_published_examples():
    # vllm-project/vllm PR #46217's "before" column (current rule): 61 layers PP 4, 94 layers PP 4
    assert default_partition("vllm", 61, 4) == [15, 15, 16, 15]
    assert default_partition("vllm", 94, 4) == [23, 24, 24, 23]
    # sgl-project/sglang PR #6666 / #13282 threads: DeepSeek 61 layers, PP 8
    assert default_partition("sglang", 61, 8, "2025-06-01") == [7, 7, 7, 7, 7, 7, 7, 12]
    assert default_partition("sglang", 61, 8, "2025-11-20") == [8, 8, 8, 8, 8, 7, 7, 7]
    assert default_partition("sglang", 61, 8) == [7, 7, 7, 8, 8, 8, 8, 8]


def shared_starts(sizes: list[int]) -> list[int]:
    starts, nxt = [], 1
    for s in sizes:
        starts.append(nxt)
        nxt += s
    return [x for x in starts if x not in FULL52]


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_glm52_vllm_defaults_are_invalid(pp):
    r = serving_check(GLM52, "vllm", pp)
    expected = shared_starts(sizes_from(vllm_rank_range, 78, pp))
    assert expected, "the fixture itself: every listed PP size must have a shared start"
    assert not r.valid
    assert [v.layer for v in r.boundary.violations] == expected
    body = r.to_json()
    assert body["blocking_reason"] and "silently wrong attention" in body["blocking_reason"]
    assert all(v["engine_behaviour"] == "silent_wrong" for v in body["violations"])


def test_glm52_vllm_pp8_every_later_rank_starts_shared():
    # issue 13: "PP 8: all seven later ranks start on shared layers"
    r = serving_check(GLM52, "vllm", 8)
    assert r.sizes == (9, 10, 10, 10, 10, 10, 10, 9)
    assert [v.stage.pp_rank for v in r.boundary.violations] == [1, 2, 3, 4, 5, 6, 7]


def test_indexer_types_fixture_matches_seed():
    assert sorted(FULL52) == GLM52_FULL


@pytest.mark.parametrize("text", ["38,40", "18,20,20,20", "10,8,8,8,8,12,12,12", "14,8,8,8,8,8,8,16"])
def test_valid_overrides(text):
    sizes = [int(x) for x in text.split(",")]
    assert shared_starts(sizes) == []
    for engine in ("vllm", "sglang"):
        r = serving_check(GLM52, engine, len(sizes), text)
        assert r.valid, r.to_json()
        assert r.partition_source == "explicit"
        assert r.to_json()["env"] == {r.env_var: text}


def test_placement_lm_head_and_mtp_on_last_rank():
    plan = serving_plan(GLM52, "vllm", 4, "18,20,20,20")
    assert [s.embedding for s in plan.stages] == [True, False, False, False]
    assert [s.loss for s in plan.stages] == [False, False, False, True]
    assert [s.mtp_layers for s in plan.stages] == [0, 0, 0, RAW52["num_nextn_predict_layers"]]
    assert serving_plan(GLM52, "vllm", 4, "18,20,20,20", mtp=False).stages[-1].mtp_layers == 0
    assert [(s.first_layer, s.last_layer) for s in plan.stages] == [(1, 18), (19, 38), (39, 58), (59, 78)]


def _partition_errors(text: str, pp: int, engine: str = "vllm") -> str:
    """The errors the engine's check gives for a ``*_PP_LAYER_PARTITION`` text (the launcher reader's path)."""
    return "; ".join(e["message"] for e in serving_check(GLM52, engine, pp, text).to_json()["errors"])


def test_partition_text_errors_name_the_variable_length_and_sum():
    assert serving_check(GLM52, "vllm", 4, " 18, 20,20 ,20").sizes == (18, 20, 20, 20)  # int() strips blanks
    assert re.search(r"VLLM_PP_LAYER_PARTITION has 3 entries.*4 ranks.*pp_size=4", _partition_errors("26,26,26", 4))
    assert re.search(r"SGLANG_PP_LAYER_PARTITION entries sum to 77.*78 decoder layers",
                     _partition_errors("19,19,20,19", 4, "sglang"))
    with pytest.raises(EngineInputError, match=r"VLLM_PP_LAYER_PARTITION entry 2 is 'x'.*Invalid partition string"):
        serving_check(GLM52, "vllm", 4, "18,x,20,20")
    with pytest.raises(EngineInputError, match="entry 2 is ''"):
        serving_check(GLM52, "vllm", 4, "18,,20,20")
    with pytest.raises(EngineInputError, match="negative"):
        serving_check(GLM52, "vllm", 4, "-2,40,20,20")
    with pytest.raises(EngineInputError, match="empty"):
        serving_check(GLM52, "vllm", 4, "  ")
    with pytest.raises(EngineInputError, match="not a serving engine"):
        serving_check(GLM52, "megatron", 1, "78")


def test_wrong_sum_or_length_is_an_error_in_the_check_not_a_verdict():
    r = serving_check(GLM52, "vllm", 4, "18,20,20,19")
    assert not r.valid
    assert [e["code"] for e in r.to_json()["errors"]] == ["partition_sum"]
    short = serving_check(GLM52, "sglang", 4, "26,26,26")
    assert not short.valid and not short.plan.stages
    assert [e["code"] for e in short.to_json()["errors"]] == ["partition_length"]


def test_more_ranks_than_layers_leaves_empty_ranks_with_a_warning():
    cfg = make_config(tiny_config(4))
    r = serving_check(cfg, "vllm", 6)
    assert r.sizes == (0, 1, 1, 1, 1, 0)  # b = 0, r = 4 -> ranks 1..4 get one layer
    assert any("hold no decoder layer" in w for w in r.warnings)


def test_sglang_version_decides_the_shared_start_verdict():
    new = serving_check(GLM52, "sglang", 2, "39,39")
    assert new.boundary.violations and new.valid  # handoff since PR #28532 + #28785
    assert new.to_json()["shared_start_behaviour"]["code"] == "handoff"
    assert new.to_json()["blocking_reason"] is None
    old = serving_check(GLM52, "sglang", 2, "39,39", version="2026-06-01")
    assert not old.valid
    reason = old.to_json()["blocking_reason"]
    for err in ("page_table_1=None", "batch_size must be equal to batch_size_k", "KeyError: 'topk_indices'"):
        assert err in reason
    with pytest.raises(EngineInputError, match="YYYY-MM-DD"):
        serving_check(GLM52, "sglang", 2, version="v0.5")


def test_vllm_ignores_indexer_types_and_says_where_it_disagrees():
    # 8 layers, freq 2 offset 2 under the HF rule: full iff max(i-1,0) % 2 == 0 (0-based i)
    # -> 1-based full 1, 2, 4, 6, 8. The array below declares 1, 2, 3, 5, 7 instead.
    array = ["full", "full", "full", "shared", "full", "shared", "full", "shared"]
    cfg = make_config(tiny_config(8, index_topk_freq=2, index_skip_topk_offset=2, indexer_types=array))
    r = serving_check(cfg, "vllm", 2, "3,5")
    assert list(r.role_differences) == [3, 4, 5, 6, 7, 8]
    # vLLM's own roles decide the verdict: layer 4 is full for vLLM (starts rank 1)
    assert r.valid and not r.boundary.violations
    assert any("never reads indexer_types" in w for w in r.warnings)
    # SGLang reads the array: layer 4 is shared there
    s = serving_check(cfg, "sglang", 2, "3,5", version="2026-01-01")
    assert [v.layer for v in s.boundary.violations] == [4] and not s.valid


def test_bad_sizes_are_input_errors():
    with pytest.raises(EngineInputError, match="--pp"):
        serving_check(GLM52, "vllm", 0)
    with pytest.raises(EngineInputError, match="--tp"):
        serving_check(GLM52, "vllm", 2, tp=0)


def test_text_lines():
    lines = serving_check(GLM52, "vllm", 2).text_lines()
    assert lines[1:] == [
        ("warning: vLLM builds the MTP drafter on the last pipeline rank only; MTP with PP > 1 is still being "
         "fixed upstream (vllm issues #49355, #52069)"),
        "stage 1: 1-39 (full) [embedding]",
        "stage 2: 40-78 (shared) [lm_head, MTP x1]",
        "INVALID: stage 2 starts at shared layer 40; source is 39",
        f"INVALID: {serving_check(GLM52, 'vllm', 2).behaviour.message}",
    ]
    assert serving_check(GLM52, "vllm", 2, "38,40").text_lines()[-1].startswith("VALID: every rank")
