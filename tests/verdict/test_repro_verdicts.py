"""Re-run of issue 16's reproductions on the current code: what still disagreed, as regression
tests. Expectations are hand arithmetic on the preset's published shape and vLLM's own default
(``--gpu-memory-utilization 0.9``, vllm ``vllm/engine/arg_utils.py``), never isplan's output."""

from __future__ import annotations

import json
from html import unescape

import pytest

from tests.cli.test_cli import isplan

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


def _glm52_full(n: int) -> bool:
    """GLM-5.2's full layers (1-based), Megatron's rule with index_topk_freq 4, skip offset 3
    (FACTS: skip iff max(n - 3, 0) % 4 != 0): 1, 2, 3, 7, 11, ..., 75."""
    return max(n - 3, 0) % 4 == 0


def _starts(sizes: list[int]) -> list[int]:
    out, nxt = [], 1
    for s in sizes:
        out.append(nxt)
        nxt += s
    return out


# issue 16's first bullet: "the same split happens for plain splits, a conversion slot, pp=2&vpp=2,
# and serving plans" - each URL, as the page, its JSON twin, /api/v1/check and the page's own CLI line
# (run as a process) answer it, against a verdict derived by hand
PAGE_CASES = [
    # every stage of 14,8,8,8,8,8,8,16 starts on a full layer, nothing else is stated: GO
    ({"model": "glm-5.2", "pp": "8", "split": "14,8,8,8,8,8,8,16"}, True, []),
    # the conversion slot 10,8,8,12,12,12,8,8 starts on full layers too: GO
    ({"model": "glm-5.2", "pp": "8", "first": "14", "last": "16", "conv": "split",
      "conv_split": "10,8,8,12,12,12,8,8"}, True, []),
    # 78 layers on PP 2 are 39 per rank, which 2 virtual stages cannot divide: Megatron refuses
    ({"model": "glm-5.2", "pp": "2", "vpp": "2"}, False, ["megatron"]),
    # Qwen3-235B on vLLM, PP 2 x TP 1: ~235 GB of bf16 weights per GPU on an 80 GB GPU
    ({"model": "qwen3-235b-a22b", "engine": "vllm", "pp": "2"}, False, ["memory"]),
]


@pytest.mark.parametrize(("q", "go", "kinds"), PAGE_CASES)
def test_the_page_its_twin_the_check_route_and_its_cli_line_agree(tmp_path, q, go, kinds):
    import html
    import re
    import shlex

    from tests.conftest import app_client

    for key in ("split", "conv_split"):
        if key in q:   # the hand check behind those GO cases: every stage starts on a full layer
            assert all(_glm52_full(s) for s in _starts([int(x) for x in q[key].split(",")]))
    client = app_client(tmp_path)
    page = client.get("/", params=q).text
    headline = re.search(r'<h2 id="verdict" class="verdict"><strong>([A-Z-]+)</strong>', page)
    assert headline is not None and headline.group(1) == ("GO" if go else "NO-GO")
    answers = [client.get(route, params=q).json()["verdict"] for route in ("/api/v1/plan", "/api/v1/check")]
    line = html.unescape(re.search(r"isplan check [^<]*", page).group(0))
    p = isplan(*shlex.split(line)[1:], "--format", "json")
    answers.append(json.loads(p.stdout)["verdict"])
    assert p.returncode == (0 if go else 1)
    for v in answers:
        assert v["go"] is go and sorted({r["kind"] for r in v["blocking"]}) == kinds


@pytest.mark.parametrize("query, field", [
    ("model=llama-3.1-70b&engine=sglang&pp=2&vpp=2&tp=8", "vpp"),
    ("model=glm-5.2&engine=vllm&pp=4&tp=8&recompute=full", "recompute"),
])
def test_a_setting_the_engine_does_not_read_is_the_same_problem_on_the_page_and_the_api(client, query, field):
    """SGLang and vLLM build no virtual stages and no recompute (their serving fields, issue 16
    item 8): the API refuses the URL (422 naming the field) and the page's CLI line exits 2, so the
    page may not say GO as if the setting were absent; it says NO-GO with the same message."""
    api = client.get("/api/v1/plan?" + query)
    assert api.status_code == 422
    (error,) = [e for e in api.json()["errors"] if e["field"] == field]
    assert error["message"].endswith("does not apply to engine " + query.split("engine=")[1].split("&")[0]
                                     + "; drop it")
    page = client.get("/?" + query).text
    assert '<strong>NO-GO</strong>' in page and unescape(page).count(error["message"]) >= 1
