"""The model families the step-time validation runs need: HF ``gpt2`` (dense GPT, 2-matrix GELU MLP,
learned positions, tied embeddings), Llama 3 8B / 405B, Qwen3-30B-A3B, and the presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.engines import role_rule
from app.core.model.config import ConfigError, load_config_bytes, load_model
from app.core.model.flops import sequence_layer_flops, token_flops
from app.core.model.parameters import count_parameters
from app.core.model.roles import derive_roles

CONFIGS = Path(__file__).resolve().parents[3] / "bench" / "steptime_configs"


def _gpt3_by_hand(h: int, layers: int, vocab: int = 51200, positions: int = 2048) -> int:
    """Per layer: c_attn 3H^2 + 3H, c_proj H^2 + H, c_fc 4H^2 + 4H, c_proj 4H^2 + H, two LayerNorms
    4H = 12H^2 + 13H; plus token and position embeddings and the final LayerNorm (tied head)."""
    return layers * (12 * h * h + 13 * h) + (vocab + positions) * h + 2 * h


def test_gpt3_175b_counts_like_the_paper() -> None:
    cfg = load_model(str(CONFIGS / "gpt3-175b.gpt2.json"))
    assert (cfg.model_type, cfg.gated_mlp, cfg.intermediate_size, cfg.tie_word_embeddings) == ("gpt2", False, 49152, True)
    total = count_parameters(cfg).main_total
    assert total == _gpt3_by_hand(12288, 96)
    assert total == pytest.approx(174.6e9, rel=0.001)  # GPT-3 175B, published ~174.6B


@pytest.mark.parametrize("name,h,layers", [("megatron-22B", 6144, 48), ("turing-530B", 20480, 105),
                                           ("megatron-1T", 25600, 128)])
def test_korthikanti_models_count_by_hand(name: str, h: int, layers: int) -> None:
    cfg = load_model(str(CONFIGS / f"{name}.gpt2.json"))
    assert count_parameters(cfg).main_total == _gpt3_by_hand(h, layers)


def test_a_gelu_mlp_is_two_matrices_not_swiglu() -> None:
    cfg = load_model(str(CONFIGS / "gpt3-175b.gpt2.json"))
    roles = derive_roles(cfg, role_rule("megatron"))
    H = 12288
    terms = sequence_layer_flops(cfg, roles.role(1), seq_length=1)
    # one token: 2 x (attention 4H^2 + 4H biases + MLP 8H^2 + 5H biases + LayerNorms 4H)
    assert terms["linear"] == 2 * (12 * H * H + 13 * H)
    assert token_flops(cfg, roles, 1)["linear"] < 2 * 96 * (4 * H * H + 3 * H * 4 * H)  # not 3 matrices


def test_gpt2_config_fails_closed() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config_bytes(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 50257}).encode())
    assert exc.value.field == "n_layer"
    small = load_config_bytes(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                                          "vocab_size": 50257, "n_positions": 1024}).encode())
    assert count_parameters(small).main_total == 124_439_808  # GPT-2 small, the published 124M


@pytest.mark.parametrize("model,total,active", [
    ("Llama-3.1-8B.json", 8.03e9, None),
    ("Llama-3.1-405B.json", 405.85e9, None),
    ("Qwen3-30B-A3B.json", 30.53e9, 3.04e9),  # published 30.5B total, 3.3B active with the embedding
    ("llama-3.1-70b", 70.55e9, None),
    ("qwen3-235b-a22b", 235.09e9, 21.57e9),
    ("deepseek-v3", 671.03e9, 36.63e9),  # 671B, "37B activated" (DeepSeek-V3 report)
    ("kimi-k2", 1026.4e9, 31.69e9),  # "1T total, 32B activated"
    ("glm-5.2", 743.38e9, 40.30e9),
])
def test_every_family_the_validation_needs_loads_and_counts(model: str, total: float, active: float | None) -> None:
    path = CONFIGS / model
    cfg = load_model(str(path) if path.exists() else model)
    r = count_parameters(cfg)
    assert r.main_total == pytest.approx(total, rel=0.001)
    if active is not None:
        assert r.active == pytest.approx(active, rel=0.002)


def _llama_by_hand(h: int, layers: int, ffn: int, heads: int, kv_heads: int, vocab: int = 128256) -> int:
    """Per layer: q and o ``H x heads*128``, k and v ``H x kv*128``, a SwiGLU MLP of three ``H x FFN``
    matrices, two RMSNorms; untied input and output embeddings and the final norm."""
    d = 128
    attention = 2 * h * heads * d + 2 * h * kv_heads * d
    return layers * (attention + 3 * h * ffn + 2 * h) + 2 * vocab * h + h


@pytest.mark.parametrize("preset,file,total", [
    ("llama-3.1-8b", "Llama-3.1-8B.json", _llama_by_hand(4096, 32, 14336, 32, 8)),
    ("llama-3.1-405b", "Llama-3.1-405B.json", _llama_by_hand(16384, 126, 53248, 128, 8)),
    # 48 x (q 2048x4096 + k, v 2048x512 + o 4096x2048 + QK-norms 2x128 + 128 experts x 3 x 2048x768
    #       + router 128x2048 + two RMSNorms) + untied embeddings 2 x 151936 x 2048 + final norm
    ("qwen3-30b-a3b", "Qwen3-30B-A3B.json",
     48 * (2048 * 4096 * 2 + 2 * 2048 * 512 + 256 + 128 * 3 * 2048 * 768 + 128 * 2048 + 2 * 2048)
     + 2 * 151936 * 2048 + 2048),
])
def test_the_validation_families_are_presets_too(preset: str, file: str, total: int) -> None:
    """Issue 18's Llama 3 8B / 405B and Qwen3-30B-A3B are presets (``isplan time llama-3.1-405b``),
    the same bytes as the configs the validation reads, counted by hand."""
    cfg = load_model(preset)
    assert cfg.sha256 == load_model(str(CONFIGS / file)).sha256
    assert count_parameters(cfg).main_total == total
    assert total in (8_030_261_248, 405_853_388_800, 30_532_122_624)  # the published totals
