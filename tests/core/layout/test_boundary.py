"""Boundary validation: seed 000's cases, virtual stages, and a brute-force oracle property."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.check import run_check
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_config_bytes, load_model
from app.core.plan import parse_sizes
from tests.conftest import tiny_config

GLM52 = load_model("glm-5.2")


def test_seed_valid_pp8_profile():
    r = run_check(GLM52, PipelineSpec(split=parse_sizes("14,8,8,8,8,8,8,16")))
    assert r.valid
    assert [s["first_layer"] for s in r.to_json()["stages"]] == [1, 15, 23, 31, 39, 47, 55, 63]
    assert all(s["start_role"] == "full" for s in r.to_json()["stages"])


def test_seed_negative_control_has_exactly_four_invalid_starts():
    r = run_check(GLM52, PipelineSpec(split=parse_sizes("10,10,10,10,10,10,9,9")))
    body = r.to_json()
    assert not r.valid
    # seed 000: 21 <- 19, 41 <- 39, 61 <- 59, 70 <- 67
    assert [(v["layer"], v["source_layer"]) for v in body["violations"]] == [(21, 19), (41, 39), (61, 59), (70, 67)]
    assert [v["stage"] for v in body["violations"]] == [3, 5, 7, 8]
    v = body["violations"][0]
    assert v["short"] == "stage 3 starts at shared layer 21; source is 19"
    assert "its source, full layer 19, is on stage 2 (pp rank 1, vp stage 0)" in v["message"]
    s3 = body["stages"][2]
    assert (s3["start_role"], s3["source_layer"], s3["source_pp_rank"], s3["source_vp_stage"]) == ("shared", 19, 1, 0)
    assert "INVALID: stage 3 starts at shared layer 21; source is 19" in r.text_lines()


def test_seed_sum_77_is_invalid():
    r = run_check(GLM52, PipelineSpec(split=parse_sizes("10,10,10,10,10,10,9,8")))
    assert not r.valid and r.to_json()["errors"][0]["code"] == "layer_sum"


def test_physically_valid_pp8_becomes_invalid_with_vpp2():
    # first 14 / last 16 with VPP 2: chunk sizes per rank 7 | 4 x6 | 8, so vp1 starts at layer 40
    r = run_check(GLM52, PipelineSpec(pp=8, first=14, last=16, vpp=2))
    starts = [s["first_layer"] for s in r.to_json()["stages"]]
    assert starts == [1, 8, 12, 16, 20, 24, 28, 32, 40, 47, 51, 55, 59, 63, 67, 71]
    bad = [(v["pp_rank"], v["vp_stage"], v["layer"]) for v in r.to_json()["violations"]]
    assert (0, 1, 40) in bad and len(bad) == 8


def test_conversion_layout_is_valid():
    assert run_check(GLM52, PipelineSpec(pp=2, last=40)).valid


def test_empty_stage_has_null_fields():
    cfg = load_config_bytes(json.dumps(tiny_config(4, indexer_types=["full"] * 4)).encode())
    r = run_check(cfg, PipelineSpec(pp=2, layout="E|t*4mL"))
    s0 = r.to_json()["stages"][0]
    assert (s0["first_layer"], s0["last_layer"], s0["start_role"], s0["num_layers"]) == (None, None, None, 0)
    assert r.valid


def test_megatron_rule_error_makes_the_plan_invalid():
    r = run_check(GLM52, PipelineSpec(pp=8))
    assert not r.valid and r.to_json()["errors"][0]["code"] == "even_divisibility"
    assert r.to_json()["megatron_flags"] == []


def oracle_valid(types: list[str], sizes: list[int]) -> bool:
    """Megatron's own formulation: every shared layer finds its source inside its stage."""
    if sum(sizes) != len(types):
        return False
    start = 0
    for size in sizes:
        stage = range(start, start + size)
        for i in stage:
            if types[i] == "shared":
                src = i - 1
                while src >= 0 and types[src] != "full":
                    src -= 1
                if src < 0 or src not in stage:
                    return False
        start += size
    return True


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_valid_iff_every_stage_starts_full_against_brute_force(data):
    n = data.draw(st.integers(1, 40))
    types = data.draw(st.lists(st.sampled_from(["full", "shared"]), min_size=n, max_size=n))
    types[0] = "full"  # a config whose first layer is shared is a config error, tested elsewhere
    k = data.draw(st.integers(1, min(n, 10)))
    cuts = sorted(data.draw(st.lists(st.integers(1, n - 1), min_size=k - 1, max_size=k - 1, unique=True))) if n > 1 else []
    bounds = [0, *cuts, n]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    if data.draw(st.booleans()):
        sizes[-1] += data.draw(st.integers(-1, 1))  # sometimes a wrong sum
        sizes[-1] = max(sizes[-1], 0)
    cfg = load_config_bytes(json.dumps(tiny_config(n, indexer_types=types)).encode())
    # engine hf reads the array itself (Megatron and slime build from freq/offset and would report
    # the array as a checkpoint disagreement instead; tests/core/engines/test_checkpoint_roles.py covers that)
    r = run_check(cfg, PipelineSpec(split=tuple(sizes), mtp_layers=0), engine="hf")
    assert r.valid == oracle_valid(types, sizes)
    if sum(sizes) == n:
        starts = [s.first_layer for s in r.plan.stages if s.num_layers]
        assert r.valid == all(types[s - 1] == "full" for s in starts)
