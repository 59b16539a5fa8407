"""Parameter counts against published figures and hand arithmetic."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_config_bytes, load_model
from app.core.model.parameters import count_parameters, per_rank_params
from app.core.model.roles import derive_roles
from tests.conftest import REPO, make_config, tiny_config


def test_glm52_main_total_matches_facts():
    # FACTS.md section 4: GLM-5.2 main model (no MTP, no router bias) with 21 indexer layers
    r = count_parameters(load_model("glm-5.2"))
    assert r.main_total == 743_377_000_704
    assert r.indexer_layers == 21
    # published "~40B" activated; FACTS derives about 40.3B
    assert 40.2e9 < r.active < 40.4e9


def test_glm51_totals_match_facts():
    r = count_parameters(load_model("glm-5.1"))
    assert r.main_total == 743_911_199_232
    assert r.checkpoint_total == 753_864_139_008  # matches a public tensor listing
    assert r.indexer_layers == 78


def test_deepseek_v3_without_indexer_gives_its_published_671b():
    raw = json.loads((REPO / "app/core/presets/deepseek-v3.2.json").read_text())
    raw["model_type"] = "deepseek_v3"
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        raw.pop(k)
    r = count_parameters(load_config_bytes(json.dumps(raw).encode()))
    assert round(r.main_total / 1e9) == 671


def test_tiny_config_by_hand():
    # H=64 h=4 rq=32 rkv=16 dn=8 dr=4 dv=8 Hi=2 di=8 I=128 i=32 E=8 S=1 V=1000, 4 layers, 1 dense
    cfg = make_config(tiny_config(4, indexer_types=["full", "shared", "full", "shared"],
                                  num_nextn_predict_layers=0))
    mla = 64 * 32 + 32 + 32 * 4 * 12 + 64 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 64  # 2048+32+1536+1280+16+1024+2048
    assert mla == 7984
    idx = 32 * 2 * 8 + 64 * 8 + 64 * 2 + 2 * 8  # 512 + 512 + 128 + 16
    assert idx == 1168
    expert = 3 * 64 * 32
    moe = 9 * expert + 8 * 64
    dense = 3 * 64 * 128
    expected = 4 * (mla + 128) + 2 * idx + dense + 3 * moe + 2 * 1000 * 64 + 64
    r = count_parameters(cfg)
    assert r.main_total == expected
    assert r.breakdown["indexer"] == 2 * idx
    assert r.checkpoint_total == expected + 3 * 8


def test_per_rank_split_sums_to_the_model_and_shards():
    cfg = load_model("glm-5.2")
    roles = derive_roles(cfg)
    plan = materialise(PipelineSpec(pp=8, first=14, last=16), 78, default_mtp=0)
    ranks = per_rank_params(cfg, roles, plan)
    assert sum(r.total for r in ranks) == count_parameters(cfg, roles).main_total
    one = per_rank_params(cfg, roles, plan, tp=1, ep=1)
    sharded = per_rank_params(cfg, roles, plan, tp=4, ep=32, etp=1)
    for a, b in zip(one, sharded):
        assert b.per_gpu < a.per_gpu
        assert b.expert_per_gpu * 32 == a.expert_per_gpu  # 256 experts split 32 ways exactly


_FAMILIES = {
    "glm-5.2": lambda: load_model("glm-5.2"),
    "llama-3.1-70b": lambda: load_model("llama-3.1-70b"),
    "qwen3-235b-a22b": lambda: load_model("qwen3-235b-a22b"),
    "deepseek-v3": lambda: load_model("deepseek-v3"),
    "tiny-dense": lambda: make_config(tiny_config(8, n_routed_experts=0, num_experts_per_tok=0, first_k_dense_replace=8,
                                                  num_nextn_predict_layers=0)),
    "gpt2": lambda: make_config({"model_type": "gpt2", "n_layer": 6, "n_embd": 64, "n_head": 4, "vocab_size": 100}),
}


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(sorted(_FAMILIES)), data=st.data())
def test_stage_params_on_generated_splits_sum_to_the_model_and_split_experts_by_hand(family, data):
    """Any split, any TP / EP / ETP: the ranks' parameters add up to the model's count (no MTP
    layer built), TP 1 EP 1 puts everything on the GPU, the routed experts on a GPU are
    ``ceil(E / EP)`` whole experts of ``3 H i`` per MoE layer, each split over ETP, and more TP
    never adds parameters to a GPU."""
    cfg = _FAMILIES[family]()
    roles = derive_roles(cfg)
    n = cfg.num_hidden_layers
    pp = data.draw(st.sampled_from([1, 2, 3, 4]))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=pp - 1, max_size=pp - 1)))
    split = tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))
    plan = materialise(PipelineSpec(split=split), n, default_mtp=0)
    tp_lo, tp_hi = sorted(data.draw(st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=2, max_size=2)))
    ep, etp = data.draw(st.sampled_from([1, 2, 3, 8])), data.draw(st.sampled_from([1, 2]))
    whole = per_rank_params(cfg, roles, plan)
    assert sum(r.total for r in whole) == count_parameters(cfg, roles).main_total
    assert all(r.per_gpu == r.total for r in whole)
    lo = per_rank_params(cfg, roles, plan, tp=tp_lo, ep=ep, etp=etp)
    hi = per_rank_params(cfg, roles, plan, tp=tp_hi, ep=ep, etp=etp)
    for rank, (a, b) in enumerate(zip(lo, hi)):
        assert b.per_gpu <= a.per_gpu
        moe_layers = sum(1 for s in plan.rank_stages(rank) for layer in s.layers if roles.role(layer).ffn == "moe")
        E = cfg.n_routed_experts
        per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * moe_layers
        want = -(-per_expert * -(-E // ep) // etp) if E else 0
        assert a.expert_per_gpu == want
