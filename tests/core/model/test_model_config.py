"""Model configs: presets with provenance and digests, loading, and refusal of bad configs."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.core.model.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    canonical_digest,
    load_config_bytes,
    load_manifest,
    load_model,
    load_preset,
)
from tests.conftest import REPO, SHARED, tiny_config


def test_shipped_presets_are_the_shared_reference_bytes():
    refs = SHARED / "reference" / "configs"
    if not refs.is_dir():
        pytest.skip(f"{refs} is not beside this checkout (CI and developer machines have it)")
    shared = [p for p in load_manifest()[1] if (refs / p.file).exists()]
    # the three DSA configs of FACTS.md are shared references; the other families' presets are not
    assert {"glm-5.2", "glm-5.1", "deepseek-v3.2"} <= {p.id for p in shared}
    for p in shared:
        assert hashlib.sha256((refs / p.file).read_bytes()).hexdigest() == p.sha256, p.id


def test_every_preset_matches_its_manifest_digest():
    default, presets = load_manifest()
    assert default == "glm-5.2"
    assert {p.id for p in presets} == {"glm-5.2", "glm-5.1", "deepseek-v3.2", "deepseek-v3", "kimi-k2",
                                       "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-30b-a3b",
                                       "qwen3-235b-a22b"}
    for p in presets:
        cfg = load_preset(p.id)
        assert cfg.sha256 == p.sha256
        assert cfg.provenance == "reconstructed from published fields"
        assert cfg.upstream_repo


def test_glm52_preset_fields():
    cfg = load_model("glm-5.2")
    assert cfg.num_hidden_layers == 78
    assert cfg.hidden_size == 6144
    assert cfg.indexer_types is not None and cfg.indexer_types.count("full") == 21
    assert cfg.num_nextn_predict_layers == 1
    # unknown fields are kept, untouched
    assert cfg.extra["rope_parameters"] == {"rope_theta": 8000000, "rope_type": "default"}
    assert cfg.extra["index_share_for_mtp_iteration"] is True


def test_canonical_digest_ignores_whitespace_and_key_order_but_sha256_does_not():
    raw = tiny_config()
    a = load_config_bytes(json.dumps(raw).encode())
    b = load_config_bytes(json.dumps(dict(reversed(list(raw.items()))), indent=4).encode())
    assert a.sha256 != b.sha256
    assert a.canonical_sha256 == b.canonical_sha256
    expected = hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert a.canonical_sha256 == expected == canonical_digest(raw)
    assert a.id == "sha256:" + hashlib.sha256(json.dumps(raw).encode()).hexdigest()


def test_path_and_folder_load(tmp_config):
    p = tmp_config(tiny_config())
    assert load_model(str(p)).num_hidden_layers == 8
    assert load_model(str(p.parent)).sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers", "required"),
        (lambda c: c.update(num_hidden_layers=-3), "num_hidden_layers", "negative"),
        (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers", "at least 1"),
        (lambda c: c.update(num_hidden_layers=10**9), "num_hidden_layers", "absurd"),
        (lambda c: c.update(hidden_size="big"), "hidden_size", "integer"),
        (lambda c: c.update(hidden_size=64.5), "hidden_size", "integer"),
        (lambda c: c.update(vocab_size=10**12), "vocab_size", "absurd"),
        (lambda c: c.update(indexer_types=["full"] * 7), "indexer_types", "7 entries"),
        (lambda c: c.update(indexer_types=["full"] * 7 + ["dense"]), "indexer_types", "entry 8"),
        (lambda c: c.update(indexer_types="FFFFFFFF"), "indexer_types", "list"),
        (lambda c: c.update(index_topk_pattern="FSX"), "index_topk_pattern", "3 characters"),
        (lambda c: c.update(index_topk_pattern="FSSSFSSX"), "index_topk_pattern", "'F' and 'S'"),
        (lambda c: c.update(mlp_layer_types=["dense"] * 9), "mlp_layer_types", "9 entries"),
        (lambda c: c.update(num_experts_per_tok=99), "num_experts_per_tok", "exceeds"),
        (lambda c: c.update(index_topk_freq=0), "index_topk_freq", "at least 1"),
    ],
)
def test_bad_fields_are_refused_with_the_field_named(mutate, field, words):
    raw = tiny_config()
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps(raw).encode())
    assert err.value.field == field
    assert field in str(err.value) and words in str(err.value)


@pytest.mark.parametrize(
    "data, words",
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"num_hidden_layers": NaN}', "NaN"),
        (b'{"num_hidden_layers": Infinity}', "Infinity"),
        (b'{"a": 1, "a": 2}', "repeats the key 'a'"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b'{"x":' + b"[" * 200 + b"]" * 200 + b"}", "nests deeper"),
        (b" " * (MAX_CONFIG_BYTES + 1), "limit is 1,048,576"),
    ],
)
def test_unusable_bytes_are_refused(data, words):
    with pytest.raises(ConfigError) as err:
        load_config_bytes(data)
    assert words in str(err.value)


def test_unknown_model_names_the_presets():
    with pytest.raises(ConfigError) as err:
        load_model("glm-9")
    assert "glm-5.2" in str(err.value) and err.value.field == "model"


def test_deepseek_v3_without_indexer_loads():
    raw = tiny_config(model_type="deepseek_v3")
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        raw.pop(k)
    cfg = load_config_bytes(json.dumps(raw).encode())
    assert not cfg.has_indexer


def test_unknown_non_mla_model_is_refused_naming_the_field():
    raw = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 32000,
           "num_attention_heads": 32}  # Falcon: parallel attention, multi-query: shapes isplan does not read
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps(raw).encode())
    assert err.value.field == "model_type" and "falcon" in str(err.value) and "llama" in str(err.value)
    # an MLA model type without its MLA fields names the first missing one
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps({**raw, "model_type": "deepseek_v3"}).encode())
    assert err.value.field == "kv_lora_rank"
    # a Llama config (GQA) loads since issue 11
    assert load_config_bytes(json.dumps({**raw, "model_type": "llama"}).encode()).attention == "gqa"
    # a DeepSeek-V3-shaped config under another model_type (e.g. kimi_k2) loads
    ok = tiny_config(model_type="kimi_k2")
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        ok.pop(k)
    assert not load_config_bytes(json.dumps(ok).encode()).has_indexer


@pytest.mark.parametrize(("field", "value", "builds"), [
    ("hc_mult", 4, True), ("hc_mult", 1, False),  # 1: the plain single residual stream
    ("compress_ratios", [0, 4, 128], True), ("compress_ratios", [0, 0, 0], False),
    ("num_hash_layers", 3, True), ("num_hash_layers", 0, False),
    ("linear_num_value_heads", 32, True), ("linear_attn_config", {"num_heads": 32}, True),
])
def test_a_field_building_what_isplan_does_not_model_is_refused_by_name(field, value, builds):
    """An MLA-shaped config (it would load as DeepSeek-V3) that also sets DeepSeek-V4's
    hyper-connections, compressed attention or hash routing, or Qwen3-Next / Kimi K3 linear
    attention, is refused naming that field; the same field at a value that builds nothing loads."""
    raw = tiny_config(model_type="deepseek_v3")
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        raw.pop(k)
    raw[field] = value
    if not builds:
        assert load_config_bytes(json.dumps(raw).encode()).attention == "mla"
        return
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps(raw).encode())
    assert err.value.field == field and "does not model" in str(err.value)


def test_a_multimodal_wrapper_points_to_its_text_config():
    raw = {"model_type": "kimi_k3", "text_config": tiny_config(model_type="deepseek_v3")}
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps(raw).encode())
    assert err.value.field == "text_config" and "use that object" in str(err.value)


def test_dsa_sizes_default_like_transformers_when_omitted():
    raw = tiny_config(8, indexer_types=["full", "shared"] * 4)
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        raw.pop(k)
    cfg = load_config_bytes(json.dumps(raw).encode())  # glm_moe_dsa: 32 x 128, top-k 2048
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (32, 128, 2048) and cfg.has_indexer


#: integer fields every config reader reads whatever the family (a DSA config also its indexer sizes)
_INT_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size",
               "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
               "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers", "index_topk_freq",
               "index_skip_topk_offset", "max_position_embeddings")
_DSA_FIELDS = ("index_n_heads", "index_head_dim", "index_topk")


@settings(max_examples=150, deadline=None)
@given(base=st.sampled_from(["glm-5.2", "deepseek-v3", "llama-3.1-70b", "qwen3-235b-a22b", "tiny"]),
       field=st.sampled_from(_INT_FIELDS + _DSA_FIELDS),
       bad=st.sampled_from([("x", "must be an integer"), (True, "must be an integer"), (2.5, "must be an integer"),
                            ([3], "must be an integer"), (-3, "must not be negative")]))
def test_one_bad_integer_field_is_refused_naming_that_field(base, field, bad):
    """A valid config with one integer field made wrong is refused with that field named (the
    reader's words: 'must be an integer' / 'must not be negative'), whichever family reads it."""
    raw = json.loads((REPO / f"app/core/presets/{base}.json").read_text()) if base != "tiny" else tiny_config(8)
    dsa = raw.get("model_type") in ("glm_moe_dsa", "deepseek_v32") or "index_n_heads" in raw
    assume(field not in _DSA_FIELDS or dsa)
    value, words = bad
    raw[field] = value
    with pytest.raises(ConfigError) as err:
        load_config_bytes(json.dumps(raw).encode())
    assert err.value.field == field and str(err.value).startswith(f"{field} {words}")


def test_preset_named_reads_an_id_or_a_repository_in_any_case(tmp_path, monkeypatch):
    from app.core.model.config import model_argument, preset_named

    expected = {"meta-llama/Llama-3.1-405B": "llama-3.1-405b", "LLAMA-3.1-8B": "llama-3.1-8b",
                "Kimi-K2-Instruct": "kimi-k2", "moonshotai/kimi-k2-instruct": "kimi-k2",
                "zai-org/GLM-5.2": "glm-5.2", " deepseek-v3 ": "deepseek-v3", "llama-3.1": None, "kimi": None}
    for spec, preset in expected.items():
        assert preset_named(spec) == preset, spec
    for p in load_manifest()[1]:   # every preset by its id and by its repository
        assert preset_named(p.id.upper()) == preset_named(p.upstream_repo) == p.id
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Llama-3.1-70B").mkdir()
    (tmp_path / "Llama-3.1-70B" / "config.json").write_text(json.dumps(tiny_config()))
    assert model_argument("Llama-3.1-70B") == "Llama-3.1-70B"   # the user's own snapshot, not the preset
    assert load_model("Llama-3.1-70B").source == "path"
    assert model_argument("meta-llama/Llama-3.1-70B") == load_model("meta-llama/Llama-3.1-70B").id == "llama-3.1-70b"
    assert model_argument("no-such-model") == "no-such-model"
