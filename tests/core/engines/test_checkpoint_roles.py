"""Megatron / slime build indexers from freq/offset, never from ``indexer_types``: the verdict uses
the engine's roles and every layer where they differ from the checkpoint is a blocking model error.
Expected layers are worked out by hand from Megatron's rule (dsa.py ``is_dsa_skip_topk_layer``:
skip iff ``max(n - max(offset, 1), 0) % freq != 0``) and slime's (no clamp of the offset)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.check import run_check
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from tests.conftest import GLM52_FULL, make_config, tiny_config

SEED_VALID = (14, 8, 8, 8, 8, 8, 8, 16)


def model_errors(result):
    return [e for e in result.errors if e.code == "roles_disagree_checkpoint"]


def test_issue_example_freq2_offset1_split_1_77_is_invalid_for_megatron():
    # freq 2, offset 1: full iff (n - 1) % 2 == 0 -> the odd layers; layer 2 (checkpoint full) is
    # built shared, layer 5 (checkpoint shared) is built full; stage 2 starts on layer 2
    r = run_check(load_model("glm-5.2"), PipelineSpec(split=(1, 77)), "megatron", freq=2, offset=1)
    assert not r.valid
    (err,) = model_errors(r)
    assert err.kind == "model" and err.flag == "--dsa-indexer-topk-freq"
    odd = set(range(1, 79, 2))
    expected = sorted(n for n in range(1, 79) if (n in odd) != (n in GLM52_FULL))
    assert f"on {len(expected)} layer(s)" in err.message
    assert "built shared but full in the checkpoint (its indexer weights go unused): layer 2." in err.message
    assert "built full but shared in the checkpoint (no indexer weights to load): layers 5, 9, 13," in err.message
    assert r.roles.role(2).role == "shared"     # the verdict uses what Megatron builds
    assert r.to_json()["errors"][0]["kind"] == "model"


def test_checkpoint_freq_offset_agree_with_the_array_so_nothing_is_reported():
    # freq 4 / offset 3 reproduce indexer_types on all 78 layers for every engine (FACTS.md 1)
    for engine in ("megatron", "slime", "hf"):
        r = run_check(load_model("glm-5.2"), PipelineSpec(split=SEED_VALID), engine)
        assert r.valid and not model_errors(r), (engine, r.errors)


def test_tiny_array_that_the_rule_does_not_reproduce():
    # array: F F S S F S S S ; config rule freq 4 offset 1: Megatron full iff (n - 1) % 4 == 0 ->
    # 1, 5; slime full iff max(n - 1, 0) % 4 == 0 -> 1, 5 as well. Differences: layer 2 only.
    types = ["full", "full", "shared", "shared", "full", "shared", "shared", "shared"]
    cfg = make_config(tiny_config(8, indexer_types=types, index_topk_freq=4, index_skip_topk_offset=1,
                                  num_nextn_predict_layers=0))
    for engine in ("megatron", "slime"):
        (err,) = model_errors(run_check(cfg, PipelineSpec(split=(4, 4)), engine))
        assert "on 1 layer(s): built shared but full in the checkpoint (its indexer weights go unused): layer 2." \
            in err.message
    hf = run_check(cfg, PipelineSpec(split=(4, 4)), "hf")
    assert not model_errors(hf) and hf.roles.rule == "indexer_types"


def test_mtp_depth_built_shared_while_the_checkpoint_stores_an_indexer():
    # four MTP depths, freq 4 / offset 3: depth 4 skips (max(4 - 3, 0) % 4 = 1); the checkpoint
    # gives every MTP layer an indexer -> MTP layer 8 + 4 = 12 disagrees
    types = ["full", "full", "full", "shared", "shared", "shared", "full", "shared"]
    cfg = make_config(tiny_config(8, indexer_types=types, index_topk_freq=4, index_skip_topk_offset=3,
                                  num_nextn_predict_layers=4))
    r = run_check(cfg, PipelineSpec(split=(7, 1), mtp_layers=4), "megatron")
    (err,) = model_errors(r)
    assert "built shared but full in the checkpoint (its indexer weights go unused): MTP layer 12" \
        in err.message and "on 1 layer(s)" in err.message
    # with one MTP depth (the plan builds 1) nothing differs
    r = run_check(cfg, PipelineSpec(split=(7, 1), mtp_layers=1), "megatron")
    assert not model_errors(r)


@settings(max_examples=200, deadline=None)
@given(freq=st.integers(1, 6), offset=st.integers(0, 6), engine=st.sampled_from(["megatron", "slime"]),
       cuts=st.lists(st.integers(1, 77), max_size=7, unique=True))
def test_overrides_against_the_glm52_array_list_exactly_the_differing_layers(freq, offset, engine, cuts):
    # oracle: Megatron full iff max(n - max(offset, 1), 0) % freq == 0 (dsa.py); slime without the
    # clamp (glm5.py); slime reads freq/offset from the HF config, so the override stands in for an
    # edited config. The checkpoint's full layers are GLM52_FULL (FACTS.md 1).
    clamp = max(offset, 1) if engine == "megatron" else offset
    built = {n for n in range(1, 79) if max(n - clamp, 0) % freq == 0}
    differ = [n for n in range(1, 79) if (n in built) != (n in GLM52_FULL)]
    bounds = [0, *sorted(cuts), 78]
    split = tuple(b - a for a, b in itertools.pairwise(bounds))
    r = run_check(load_model("glm-5.2"), PipelineSpec(split=split, mtp_layers=0), engine, freq=freq, offset=offset)
    errs = model_errors(r)
    if not differ:
        assert errs == []
    else:
        (err,) = errs
        assert f"on {len(differ)} layer(s)" in err.message
        for role in ("full", "shared"):
            listed = [str(n) for n in differ if (n in built) == (role == "full")][:12]
            if listed:
                assert f"built {role} but" in err.message and ", ".join(listed) in err.message
        assert not r.valid
    starts = [1 + sum(split[:i]) for i in range(len(split)) if split[i]]
    no_source = any(n not in built and not any(m in built for m in range(1, n)) for n in range(1, 79))
    boundary_ok = all(s in built for s in starts)
    assert (not r.boundary.violations) == boundary_ok or no_source
