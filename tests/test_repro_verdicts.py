"""Re-run of issue 16's reproductions on the current code: what still disagreed, as regression
tests. Expectations are hand arithmetic on the preset's published shape and vLLM's own default
(``--gpu-memory-utilization 0.9``, vllm ``vllm/engine/arg_utils.py``), never isplan's output."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import isplan

# Llama-3.1-70B (the preset's config.json): 80 layers, hidden 8192, FFN 28672, 64 heads, 8 KV heads
# of 128, vocab 128256, untied embeddings, bf16
H, F, L, KV_HEADS, HEAD, VOCAB = 8192, 28672, 80, 8, 128, 128256
LAYER = H * H * 2 + 2 * H * KV_HEADS * HEAD + 3 * H * F + 2 * H   # q, o, k, v, SwiGLU, two norms
PARAMS = L * LAYER + 2 * VOCAB * H + H                            # + embedding, lm_head, final norm
KV_PER_TOKEN = L * 2 * KV_HEADS * HEAD * 2                         # K and V, bf16
H100 = 80e9


def test_the_hand_count_is_the_published_70_6b():
    assert PARAMS == 70_553_706_496


def _verdict(*args: str) -> tuple[int, dict]:
    p = isplan(*args, "--format", "json")
    return p.returncode, json.loads(p.stdout)["verdict"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_memory_inference_and_check_give_one_verdict_between_usable_and_raw_capacity(engine):
    # TP 2, 16,384 tokens: weights + KV = 73.2 GB per GPU, over vLLM's usable 0.9 x 80 GB = 72 GB
    # but under the raw 80 GB. `memory --inference` said GO (it judged the raw 80 GB) while
    # `check` on the same plan said NO-GO.
    per_gpu = PARAMS * 2 / 2 + 16384 * KV_PER_TOKEN / 2
    assert 0.9 * H100 < per_gpu < H100
    plan = ["llama-3.1-70b", "--engine", engine, "--split", "80", "--tp", "2", "--context", "16384"]
    check = _verdict("check", *plan)
    inference = _verdict("memory", *plan, "--inference")
    assert check == inference
    assert inference[0] == 1 and not inference[1]["go"]
    assert [r["kind"] for r in inference[1]["blocking"]] == ["memory"]


def test_memory_inference_on_a_pipelined_serving_plan_is_judged_per_rank_like_check():
    # the vLLM GLM-5.2 profile (PP 8, TP 8): check says GO; `memory --inference` judged the whole
    # 744B model on one TP group (285.7 GB per GPU) and said NO-GO
    plan = ["glm-5.2", "--engine", "vllm", "--split", "10,8,8,8,12,12,12,8", "--pp", "8", "--tp", "8"]
    check = _verdict("check", *plan)
    inference = _verdict("memory", *plan, "--inference")
    assert check == inference
    text = isplan("memory", *plan, "--inference").stdout.splitlines()
    assert sum(line.startswith("pp rank ") for line in text) == 8   # one line per pipeline rank


# vLLM's get_pp_indices (vllm/distributed/utils.py) refuses an explicit partition before placing a
# layer: `if sum(partitions) != num_hidden_layers: raise ValueError(f"{sum(partitions)=} does not
# match {num_hidden_layers=}.")`; SGLang reads SGLANG_PP_LAYER_PARTITION the same way.
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("split", ["42,36", "40,40,40", "30,30"])
def test_a_partition_that_does_not_sum_to_the_layers_is_a_no_go_not_a_500(tmp_path, engine, split):
    # issue 16: /api/v1/plan?model=deepseek-v3&engine=vllm&pp=2&mode=split&split=42,36 was a 500;
    # with cp=2 it is now a 422 for cp, but without cp the same IndexError remained (page, API, CLI)
    from tests.conftest import app_client

    sizes = [int(x) for x in split.split(",")]
    client = app_client(tmp_path, raise_server_exceptions=False)
    q = {"model": "deepseek-v3", "engine": engine, "pp": str(len(sizes)), "mode": "split", "split": split}
    for route in ("/", "/api/v1/plan", "/api/v1/check"):
        assert client.get(route, params=q).status_code == 200, route
    assert sum(sizes) != 61   # DeepSeek-V3 has 61 decoder layers: 30,30 misses one, the others overshoot
    body = client.get("/api/v1/check", params=q).json()
    assert body["verdict"]["go"] is False
    assert [r["kind"] for r in body["verdict"]["blocking"]] == [engine]
    assert f"sum(partitions)={sum(sizes)} does not match num_hidden_layers=61." in body["verdict"]["blocking"][0][
        "message"]
    p = isplan("check", "deepseek-v3", "--engine", engine, "--split", split, "--format", "json")
    assert p.returncode == 1 and json.loads(p.stdout)["verdict"] == body["verdict"]
