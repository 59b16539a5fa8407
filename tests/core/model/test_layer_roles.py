"""Layer roles under the three engines' semantics, pattern overrides and disagreements."""

from __future__ import annotations

import pytest

from app.core.engines import role_rule, role_rules
from app.core.model.config import load_model
from app.core.model.roles import (
    PatternError,
    derive_roles,
    role_disagreements,
    roles_report,
)
from tests.conftest import GLM52_FULL, make_config, tiny_config


@pytest.mark.parametrize("engine", ["megatron", "slime", "hf"])
def test_glm52_full_layers_match_seed_000_under_every_engine(engine):
    rm = derive_roles(load_model("glm-5.2"), role_rule(engine))
    assert list(rm.full_layers) == GLM52_FULL
    assert rm.rule == "indexer_types"
    # a shared layer's source is the nearest preceding full layer (hand-picked cases)
    assert rm.role(21).source == 19 and rm.role(70).source == 67 and rm.role(78).source == 75
    assert rm.role(4).source == 3 and rm.role(7).source == 7
    assert [r.layer for r in rm.mtp] == [79] and rm.mtp[0].has_indexer
    # shared layers carry no indexer weights
    assert sum(r.has_indexer for r in rm.layers) == 21
    assert [r.ffn for r in rm.layers[:4]] == ["dense", "dense", "dense", "moe"]


def test_freq_offset_rule_reproduces_the_glm52_array_for_every_engine():
    raw = tiny_config(78, index_topk_freq=4, index_skip_topk_offset=3)
    cfg = make_config(raw)
    for engine in ("megatron", "slime", "hf"):
        assert list(derive_roles(cfg, role_rule(engine)).full_layers) == GLM52_FULL
    assert role_disagreements(cfg, role_rules()) == []
    # and the preset's array agrees with its own freq/offset for every engine
    assert role_disagreements(load_model("glm-5.2"), role_rules()) == []


def test_offset_zero_engines_disagree_exactly_as_each_rule_says():
    # freq 4, offset 0 over 12 layers, by hand:
    # megatron clamps the offset to 1: full iff (n - 1) % 4 == 0 -> 1, 5, 9
    # slime: full iff n % 4 == 0 -> 4, 8, 12; layers 1-3 are shared with no source
    # hf (0-based i): full iff (i + 1) % 4 == 0 -> n = 4, 8, 12 (same as slime)
    cfg = make_config(tiny_config(12, index_topk_freq=4, index_skip_topk_offset=0))
    meg = derive_roles(cfg, role_rule("megatron"))
    slime = derive_roles(cfg, role_rule("slime"))
    hf = derive_roles(cfg, role_rule("hf"))
    assert list(meg.full_layers) == [1, 5, 9] and not meg.errors
    assert list(slime.full_layers) == [4, 8, 12]
    assert list(hf.full_layers) == [4, 8, 12]
    assert slime.role(1).role == "shared" and slime.role(1).source is None
    # the MTP layer (depth 1) is numbered 1 by Megatron's MTP block, so slime's rule makes it
    # shared too, with no earlier MTP depth to reuse (layer 12 + 1 = 13)
    assert [e.layer for e in slime.errors] == [1, 2, 3, 13]
    assert "no full layer precedes it" in slime.errors[0].message
    kinds = {(d["a"], d["b"]): d["layers"] for d in role_disagreements(cfg, role_rules()) if d["kind"] == "engines"}
    assert kinds[("megatron", "slime")] == [1, 4, 5, 8, 9, 12]
    assert kinds[("megatron", "hf")] == [1, 4, 5, 8, 9, 12]
    assert ("slime", "hf") not in kinds


def test_engine_defaults_differ_when_offset_is_absent():
    # freq 2 without offset: hf default offset 2 -> full iff max(n - 2, 0) % 2 == 0 -> 1, 2, 4, 6
    # megatron default offset 0 (clamped to 1) -> full iff (n - 1) % 2 == 0 -> 1, 3, 5
    cfg = make_config(tiny_config(6, index_topk_freq=2))
    assert list(derive_roles(cfg, role_rule("hf")).full_layers) == [1, 2, 4, 6]
    assert list(derive_roles(cfg, role_rule("megatron")).full_layers) == [1, 3, 5]


def test_indexer_types_wins_and_disagreement_with_the_rule_is_reported():
    types = ["full", "shared", "full", "shared", "shared", "full", "shared", "shared"]
    cfg = make_config(tiny_config(8, indexer_types=types, index_topk_freq=4, index_skip_topk_offset=1))
    rm = derive_roles(cfg, role_rule("megatron"))
    assert list(rm.full_layers) == [1, 3, 6]
    # rule (megatron, freq 4, offset 1): full at 1, 5 -> differs at 3, 5, 6
    d = [x for x in role_disagreements(cfg, role_rules()) if x["kind"] == "array_vs_rule" and x["engine"] == "megatron"]
    assert d and d[0]["layers"] == [3, 5, 6]


def test_index_topk_pattern_is_used_when_no_array():
    cfg = make_config(tiny_config(8, index_topk_pattern="FSSFSSSS"))
    rm = derive_roles(cfg)
    assert rm.rule == "index_topk_pattern" and list(rm.full_layers) == [1, 4]


def test_maxtext_fsss_override_differs_from_the_checkpoint_on_39_layers():
    # FSSS from layer 1: full at 1, 5, ..., 77 (20 layers). Config: 1, 2, 3, 7, ..., 75 (21).
    # Symmetric difference: {2, 3} + {5, 9, ..., 77} (19) + {7, 11, ..., 75} (18) = 39 layers.
    glm = load_model("glm-5.2")
    rep = roles_report(glm, derive_roles(glm, pattern="FSSS"), role_rules(), pattern="FSSS")
    assert rep["num_full"] == 20
    expected = sorted({2, 3} | set(range(5, 78, 4)) | set(range(7, 76, 4)))
    assert rep["pattern_differences"] == expected and len(expected) == 39


def test_full_length_pattern_and_bad_patterns():
    cfg = make_config(tiny_config(4))
    assert list(derive_roles(cfg, pattern="FSFS").full_layers) == [1, 3]
    with pytest.raises(PatternError, match="F and S"):
        derive_roles(cfg, pattern="FXS")
    with pytest.raises(PatternError, match="at most 4"):
        derive_roles(cfg, pattern="FSSSS")
    rm = derive_roles(cfg, pattern="SFFF")
    assert rm.errors and rm.errors[0].code == "shared_without_source"


def test_glm51_has_an_indexer_on_every_layer():
    rm = derive_roles(load_model("glm-5.1"))
    assert len(rm.full_layers) == 78 and rm.rule == "freq_offset"


def test_launcher_overrides_of_freq_and_offset():
    cfg = make_config(tiny_config(8))  # no freq/offset in config: every layer full
    assert len(derive_roles(cfg).full_layers) == 8
    assert list(derive_roles(cfg, freq=4, offset=3).full_layers) == [1, 2, 3, 7]


@pytest.mark.parametrize("model", ["glm-5.2", "deepseek-v3", "llama-3.1-70b"])
def test_a_stages_kinds_are_its_layers_ffn_indexer_mtp_window_mixer_and_chunk(model):
    """``RoleMap.kinds_of`` (the time and FLOPs models' stage keys) is, for every span of layers a
    stage can hold - the empty one included - each layer's (FFN kind, owns an indexer, is MTP,
    attention window, mixer, attention chunk)."""
    roles = derive_roles(load_model(model), role_rule("megatron"))
    n = roles.num_layers
    for first in range(1, n + 1):
        for last in (first - 1, first, min(n, first + 6), n):
            span = range(first, last + 1) if last >= first else range(0)
            assert roles.kinds_of(span) == tuple((r.ffn, r.has_indexer, r.mtp, r.window, r.mixer, r.chunk)
                                                 for r in roles.of(span))
    assert roles.kinds_of(range(0)) == ()
