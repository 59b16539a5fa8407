"""Serving memory per PP rank: KV latent, indexer key cache, top-k buffer and weights.

Expected values are hand arithmetic on the preset's own JSON fields, or FACTS.md's derived figures
(section 4: 743,377,000,704 main-model parameters; section 5: 92,628 B per token in BF16).
"""

from __future__ import annotations

import json

import pytest

from app.core.engines.serving import engine_roles, serving_plan
from app.core.model.config import load_model
from app.core.model.serving_memory import (
    ServingMemoryError,
    ServingMemorySettings,
    latent_bytes_per_token,
    serving_memory,
)
from tests.conftest import REPO

GLM52 = load_model("glm-5.2")
RAW = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())
N_FULL = RAW["indexer_types"].count("full")
ROLES, _ = engine_roles(GLM52, "vllm")


def report(partition="18,20,20,20", mtp=False, **kw):
    plan = serving_plan(GLM52, "vllm", len(partition.split(",")), partition, mtp=mtp)
    return serving_memory(GLM52, plan, ROLES, ServingMemorySettings(**kw))


def test_latent_sizes():
    assert RAW["kv_lora_rank"] + RAW["qk_rope_head_dim"] == 576
    assert latent_bytes_per_token(GLM52, "bf16") == 576 * 2 == 1152
    assert latent_bytes_per_token(GLM52, "fp8_ds_mla") == 512 + 4 * 4 + 64 * 2 == 656


def test_kv_per_token_over_all_ranks_matches_facts():
    r = report(context=1, concurrency=1)
    total = sum(x.kv_latent + x.indexer_cache for x in r.ranks)
    assert N_FULL == 21
    assert total == 78 * 1152 + 21 * 132 == 92_628  # FACTS.md section 5
    fp8 = report(context=1, concurrency=1, kv_dtype="fp8_ds_mla")
    assert sum(x.kv_latent + x.indexer_cache for x in fp8.ranks) == 78 * 656 + 21 * 132


def test_one_million_token_sequence_is_about_97_gb():
    r = report(context=1_048_576, concurrency=1)
    total = sum(x.kv_latent + x.indexer_cache for x in r.ranks)
    assert total == 92_628 * 1_048_576
    assert 97.0e9 < total < 97.2e9  # "about 97 GB" (FACTS.md section 5)


def test_indexer_cache_only_on_full_layers_of_each_rank():
    r = report(context=1, concurrency=1)
    # 18,20,20,20 -> ranks hold layers 1-18, 19-38, 39-58, 59-78; full 1,2,3,7,11,15 | 19..35 | 39..55 | 59..75
    full = [i + 1 for i, t in enumerate(RAW["indexer_types"]) if t == "full"]
    bounds = [(1, 18), (19, 38), (39, 58), (59, 78)]
    expected = [sum(1 for f in full if a <= f <= b) for a, b in bounds]
    assert expected == [6, 5, 5, 5]
    assert [x.indexer_layers for x in r.ranks] == expected
    assert [x.indexer_cache for x in r.ranks] == [132 * n for n in expected]
    every = report(context=1, concurrency=1, indexer_cache_on_all_layers=True)
    assert [x.indexer_cache for x in every.ranks] == [132 * n for n in (18, 20, 20, 20)]


def test_mtp_adds_its_layer_to_the_last_rank_only():
    base = report(context=1, concurrency=1)
    mtp = report(context=1, concurrency=1, mtp=True)
    deltas = [(b.kv_latent + b.indexer_cache, m.kv_latent + m.indexer_cache) for b, m in zip(base.ranks, mtp.ranks)]
    assert [m - b for b, m in deltas] == [0, 0, 0, 1152 + 132]
    assert [m.weights > b.weights for b, m in zip(base.ranks, mtp.ranks)] == [False, False, False, True]


def test_weights_sum_to_the_main_model_at_tp1():
    r = report()
    assert sum(x.weights for x in r.ranks) == 2 * 743_377_000_704  # BF16, FACTS.md section 4
    fp8 = report(weight_dtype="fp8")
    assert sum(x.weights for x in fp8.ranks) == 743_377_000_704


def test_tp_shards_weights_but_not_the_mla_latent():
    one = report(context=4096, concurrency=2)
    eight = report(context=4096, concurrency=2, tp=8)
    assert [x.kv_latent for x in one.ranks] == [x.kv_latent for x in eight.ranks]
    assert all(e.weights * 7 < o.weights for o, e in zip(one.ranks, eight.ranks))


def test_topk_buffer_per_rank():
    r = report(max_batched_tokens=8192)
    assert {x.topk_buffer for x in r.ranks} == {8192 * RAW["index_topk"] * 4} == {67_108_864}


def test_fit_against_capacity():
    r = report(tp=8, context=131072, concurrency=4)
    worst = max(x.total for x in r.ranks)
    just = worst / 0.9 / (1 << 30)
    assert report(tp=8, context=131072, concurrency=4, capacity_gib=just * 1.001).fits is True
    tight = report(tp=8, context=131072, concurrency=4, capacity_gib=just * 0.999)
    assert tight.fits is False
    assert [x.fits for x in tight.ranks].count(False) >= 1
    assert report().fits is None


@pytest.mark.parametrize("kw,flag", [
    ({"context": 0}, "--context"), ({"kv_dtype": "fp4"}, "--kv-dtype"), ({"weight_dtype": "int3"}, "--weight-dtype"),
    ({"capacity_gib": -1}, "--gpu-memory"), ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
])
def test_bad_settings_name_the_flag(kw, flag):
    with pytest.raises(ServingMemoryError, match=flag):
        report(**kw)
