"""Every model family a Megatron / slime user trains: dense GQA, GQA MoE, MLA MoE without DSA, MLA + DSA.

Configs are written here (or shipped as presets) from published field values; expected parameter
counts are re-derived by hand from the module shapes of each family's transformers modeling file
and compared with the figure its publisher gives (cited at each test).
"""

from __future__ import annotations

import json

import pytest

from app.core.engines import role_rules
from app.core.engines.megatron.parallel import kv_heads_tp_check
from app.core.engines.megatron.placement import materialise
from app.core.layout.boundary import validate_boundaries
from app.core.layout.stages import PipelineSpec
from app.core.model.config import ConfigError, load_config_bytes, load_model
from app.core.model.flops import token_flops
from app.core.model.memory import inference_memory, kv_bytes_per_token_layer, training_memory
from app.core.model.parallelism import ParallelConfig
from app.core.model.parameters import count_parameters, stage_params
from app.core.model.roles import derive_roles, ffn_kinds, roles_report
from app.core.optimise.search import SearchSpace, search
from tests.conftest import REPO


def load(raw: dict):
    return load_config_bytes(json.dumps(raw).encode())


def gqa_layer(H: int, h: int, g: int, d: int, *, qkv_bias: bool = False, o_bias: bool = False,
              qk_norm: bool = False) -> int:
    """q, k, v, o projections (+ biases, + QK-norm) of one GQA layer, by hand."""
    return (H * h * d + 2 * H * g * d + h * d * H + (h * d + 2 * g * d if qkv_bias else 0)
            + (H if o_bias else 0) + (2 * d if qk_norm else 0))


# published configs (config.json field values on each model's Hugging Face page)
MIXTRAL_8X7B = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                "tie_word_embeddings": False, "max_position_embeddings": 32768}
QWEN2_7B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN3_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "head_dim": 128,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 151936, "tie_word_embeddings": False}
MISTRAL_7B = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 32000, "tie_word_embeddings": False}
GLM45_AIR = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 4096,
             "head_dim": 128, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 46,
             "num_attention_heads": 96, "num_key_value_heads": 8, "n_routed_experts": 128, "n_shared_experts": 1,
             "num_experts_per_tok": 8, "first_k_dense_replace": 1, "vocab_size": 151552, "attention_bias": True,
             "use_qk_norm": False, "num_nextn_predict_layers": 1, "tie_word_embeddings": False}


# --------------------------------------------------------------------------- parameter counts


def test_llama_3_70b_exact():
    # published: 70,553,706,496 parameters (meta-llama/Meta-Llama-3-70B on Hugging Face, quoted in
    # issue 11); Llama-3.1-70B has the same shapes (3.1 changes RoPE scaling and context only)
    cfg = load_model("llama-3.1-70b")
    assert cfg.attention == "gqa" and (cfg.num_key_value_heads, cfg.head_dim) == (8, 128)
    H, I, V = 8192, 28672, 128256
    layer = gqa_layer(H, 64, 8, 128) + 3 * H * I + 2 * H
    assert count_parameters(cfg).main_total == 80 * layer + 2 * V * H + H == 70_553_706_496
    assert count_parameters(cfg).checkpoint_total == 70_553_706_496  # no MTP, no router


def test_mixtral_8x7b_exact_and_moe_without_shared_experts():
    # published: 46,702,792,704 (mistralai/Mixtral-8x7B-v0.1, "46.7B params"; quoted in issue 11)
    cfg = load(MIXTRAL_8X7B)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.moe_intermediate_size) == (8, 0, 14336)
    H = 4096
    layer = gqa_layer(H, 32, 8, 128) + 8 * 3 * H * 14336 + 8 * H + 2 * H  # experts + router + norms
    r = count_parameters(cfg)
    assert r.main_total == 32 * layer + 2 * 32000 * H + H == 46_702_792_704
    assert r.breakdown["router_bias"] == 0 and r.checkpoint_total == r.main_total  # no score-correction bias
    # published "12.9B active" counts the input embedding; ours does not (module docstring)
    active = 32 * (gqa_layer(H, 32, 8, 128) + 2 * 3 * H * 14336 + 8 * H + 2 * H) + H + 32000 * H
    assert r.active == active and round((active + 32000 * H) / 1e9, 1) == 12.9


def test_qwen3_235b_a22b_total_and_active():
    # published: "235B in total and 22B activated" (Qwen/Qwen3-235B-A22B model card)
    cfg = load_model("qwen3-235b-a22b")
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.n_shared_experts == 0
    H, V = 4096, 151936
    attn = gqa_layer(H, 64, 4, 128, qk_norm=True)
    layer = attn + 128 * 3 * H * 1536 + 128 * H + 2 * H
    r = count_parameters(cfg)
    assert r.main_total == 94 * layer + 2 * V * H + H == 235_093_634_560
    assert round(r.main_total / 1e9) == 235
    assert r.active == 94 * (attn + 8 * 3 * H * 1536 + 128 * H + 2 * H) + H + V * H
    assert round(r.active / 1e9) == 22


def test_deepseek_v3_main_671b_and_checkpoint_685b():
    # published: "685B ... 671B of the Main Model weights and 14B of the Multi-Token Prediction
    # (MTP) Module weights" (deepseek-ai/DeepSeek-V3 README.md)
    cfg = load_model("deepseek-v3")
    assert cfg.attention == "mla" and not cfg.has_indexer and cfg.mtp_stores_embedding_and_head
    r = count_parameters(cfg)
    H, h, V, E = 7168, 128, 129280, 256
    mla = (H * 1536 + 1536 + 1536 * h * 192 + H * 576 + 512 + 512 * h * 256 + h * 128 * H)
    moe = (E + 1) * 3 * H * 2048 + E * H
    main = 61 * (mla + 2 * H) + 3 * 3 * H * 18432 + 58 * moe + 2 * V * H + H
    assert r.main_total == main and round(main / 1e9) == 671
    # the MTP module: one MoE layer with router bias + enorm/hnorm/eh_proj/shared-head norm, and its
    # own copies of the embedding and the head
    mtp = mla + 2 * H + moe + E + 2 * H + 2 * H * H + H + 2 * V * H
    assert r.breakdown["mtp"] == mtp and round(mtp / 1e9, 1) == 13.5  # published "14B"
    assert r.checkpoint_total == main + 58 * E + mtp
    # 684.49B; the published 685B (and Hugging Face's 684.5B) also count the FP8 block scales
    # (one FP32 per 128x128 block of every quantised weight, ~41M) that this count leaves out
    assert abs(r.checkpoint_total - 685e9) < 0.6e9


def test_glm_checkpoint_mtp_has_no_own_embedding_or_head():
    cfg = load_model("glm-5.2")
    r = count_parameters(cfg)
    assert not cfg.mtp_stores_embedding_and_head
    assert r.checkpoint_total == 753_329_940_480 - 0  # unchanged by issue 11 item 7
    assert r.breakdown["mtp"] < 154880 * 6144 * 2 + 10e9  # a layer, no embedding/head copies


def test_kimi_k2_one_trillion_32b_active():
    # published: "1 trillion total parameters ... 32 billion activated" (moonshotai/Kimi-K2-Instruct)
    cfg = load_model("kimi-k2")
    assert cfg.model_type == "kimi_k2" and cfg.attention == "mla" and not cfg.has_indexer
    assert cfg.num_nextn_predict_layers == 0 and cfg.n_routed_experts == 384
    r = count_parameters(cfg)
    assert round(r.main_total / 1e12, 2) == 1.03 and round(r.active / 1e9) == 32


@pytest.mark.parametrize("raw,published", [
    (QWEN2_7B, 7_615_616_512),  # Qwen/Qwen2-7B: "7.62B params"
    (MISTRAL_7B, 7_241_732_096),  # mistralai/Mistral-7B-v0.1: "7.24B params"
])
def test_dense_gqa_exact(raw, published):
    cfg = load(raw)
    H, I, V, L, h, g = (raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"], raw["num_hidden_layers"],
                        raw["num_attention_heads"], raw["num_key_value_heads"])
    qkv_bias = raw["model_type"] == "qwen2"  # Qwen2Attention: q/k/v bias=True, o_proj bias=False
    layer = gqa_layer(H, h, g, H // h, qkv_bias=qkv_bias) + 3 * H * I + 2 * H
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == published


# config.json field values of microsoft/Phi-3-mini-4k-instruct, google/gemma-7b and google/gemma-2-9b
PHI3_MINI = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072,
             "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32064, "hidden_act": "silu", "sliding_window": 2047,
             "tie_word_embeddings": False, "max_position_embeddings": 4096}
GEMMA_7B = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 3072,
            "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000, "hidden_act": "gelu",
            "max_position_embeddings": 8192}
GEMMA2_9B = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584,
             "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
             "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096, "max_position_embeddings": 8192}


@pytest.mark.parametrize("raw,norms,tied,published", [
    # Phi3Attention: one qkv_proj and o_proj, no biases; Phi3MLP: gate_up_proj (2I) and down_proj;
    # two RMSNorms; untied head (transformers models/phi3/modeling_phi3.py). HF: 3,821,079,552
    (PHI3_MINI, 2, False, 3_821_079_552),
    # Gemma: q/k/v/o of 16 heads x 256, GeGLU gate/up/down, two RMSNorms, embeddings tied by default
    # (GemmaConfig tie_word_embeddings=True; the file omits it). HF: 8,537,680,896 ("8.54B")
    (GEMMA_7B, 2, True, 8_537_680_896),
    # Gemma 2: four RMSNorms a layer (input, post_attention, pre_feedforward, post_feedforward;
    # transformers Gemma2DecoderLayer), head_dim 256 x 16 heads = 4096 != H, tied. HF: 9,241,705,984
    (GEMMA2_9B, 4, True, 9_241_705_984),
])
def test_phi3_gemma_and_gemma2_exact(raw, norms, tied, published):
    cfg = load(raw)
    H, I, V, L, h, g = (raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"], raw["num_hidden_layers"],
                        raw["num_attention_heads"], raw["num_key_value_heads"])
    d = raw.get("head_dim", H // h)
    assert (cfg.norms_per_layer, cfg.tie_word_embeddings, cfg.head_dim) == (norms, tied, d)
    layer = gqa_layer(H, h, g, d) + 3 * H * I + norms * H
    assert count_parameters(cfg).main_total == L * layer + (1 if tied else 2) * V * H + H == published
    assert cfg.activation == raw.get("hidden_activation", raw.get("hidden_act"))


# config.json field values of Qwen/Qwen1.5-MoE-A2.7B
QWEN15_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048,
              "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 16, "vocab_size": 151936, "decoder_sparse_step": 1, "tie_word_embeddings": False}


def test_qwen2_moe_shared_expert_and_its_gate():
    """Qwen2MoeSparseMoeBlock (transformers models/qwen2_moe): router E x H, 60 experts 3 x H x 1408, one
    shared expert 3 x H x 5632 and its gate H -> 1; q/k/v biases (qkv_bias, default true). Qwen's
    model card: 14.3B parameters, 2.7B activated (with the input embedding: isplan's ``active``
    leaves it out, as for GLM-4.5-Air above)."""
    cfg = load(QWEN15_MOE)
    H, L, V = 2048, 24, 151936
    assert (cfg.n_shared_experts, cfg.shared_expert_gate, cfg.qkv_bias, cfg.o_bias) == (4, True, True, False)
    attn = gqa_layer(H, 16, 16, 128, qkv_bias=True)
    expert, shared, router = 3 * H * 1408, 3 * H * 5632, 60 * H + H
    r = count_parameters(cfg)
    assert r.main_total == L * (attn + 60 * expert + shared + router + 2 * H) + 2 * V * H + H == 14_315_784_192
    active = L * (attn + 4 * expert + shared + router + 2 * H) + V * H + H
    assert r.active == active and round((active + V * H) / 1e9, 1) == 2.7
    # Qwen/Qwen2-57B-A14B: 64 experts of 2560, a shared expert of 20480 = 8 x 2560; "57.4B"
    big = load({**QWEN15_MOE, "hidden_size": 3584, "intermediate_size": 18944, "moe_intermediate_size": 2560,
                "shared_expert_intermediate_size": 20480, "num_experts": 64, "num_experts_per_tok": 8,
                "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4})
    assert big.n_shared_experts == 8 and round(count_parameters(big).main_total / 1e9, 1) == 57.4
    with pytest.raises(ConfigError) as err:  # a shared width that is not whole experts: not timed as one
        load({**QWEN15_MOE, "shared_expert_intermediate_size": 5000})
    assert err.value.field == "shared_expert_intermediate_size"


# config.json field values of deepseek-ai/DeepSeek-V2-Lite
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
                    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "vocab_size": 102400, "topk_method": "greedy", "tie_word_embeddings": False}


def test_deepseek_v2_routes_without_a_correction_bias():
    """DeepSeek-V2's greedy routing has no ``e_score_correction_bias`` (that is V3's ``noaux_tc``):
    its checkpoint is the main model (model card: 15.7B); with ``noaux_tc`` the 26 MoE layers would
    each add 64."""
    cfg = load(DEEPSEEK_V2_LITE)
    r = count_parameters(cfg)
    assert not cfg.moe_router_bias and r.checkpoint_total == r.main_total and round(r.main_total / 1e9, 1) == 15.7
    noaux = count_parameters(load({**DEEPSEEK_V2_LITE, "topk_method": "noaux_tc"}))
    assert noaux.checkpoint_total == noaux.main_total + 26 * 64


# config.json field values of zai-org/GLM-4.7-Flash (slime's scripts/models/glm4.7-30B-A3B.sh @ 624b824a
# builds the same: 1 dense + 46 MoE layers, MLA q 768 / kv 512, heads of 192 + 64 / 256, 64 experts top-4)
GLM47_FLASH = {"model_type": "glm4_moe_lite", "architectures": ["Glm4MoeLiteForCausalLM"], "hidden_size": 2048,
               "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
               "num_attention_heads": 20, "num_key_value_heads": 20, "q_lora_rank": 768, "kv_lora_rank": 512,
               "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 64,
               "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 1, "n_group": 1,
               "topk_group": 1, "num_nextn_predict_layers": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": True,
               "topk_method": "noaux_tc", "vocab_size": 154880, "tie_word_embeddings": False}


def test_glm_4_7_flash_is_read_as_mla_moe():
    """GLM-4.7-Flash (``glm4_moe_lite``: DeepSeek-V3's attention, GLM-4.5's MoE), by hand: attention
    a layer q_a 2048·768 + 768 + q_b 768·20·256 + kv_a 2048·576 + 512 + kv_b 512·20·448 + o 20·256·2048
    = 21,759,232 (x 47); two norms 4,096 a layer; the dense layer 3·2048·10,240 = 62,914,560; an MoE
    layer 64 experts x 3·2048·1536 + the shared one + the router 64·2048 = 613,548,032 (x 46);
    embedding and head 2 x 154,880·2048; the final norm 2,048: 29,943,390,976. The checkpoint adds
    46 router biases of 64 and the MTP layer."""
    cfg = load(GLM47_FLASH)
    assert cfg.attention == "mla" and cfg.moe_router_bias and not cfg.has_indexer
    r = count_parameters(cfg)
    attention, moe_layer = 21_759_232, 64 * 3 * 2048 * 1536 + 3 * 2048 * 1536 + 64 * 2048
    assert r.main_total == (47 * attention + 47 * 4096 + 3 * 2048 * 10240 + 46 * moe_layer
                            + 2 * 154880 * 2048 + 2048) == 29_943_390_976
    assert r.checkpoint_total - r.main_total - 46 * 64 == r.breakdown["mtp"] > 0


@pytest.mark.parametrize("field", ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                                   "first_k_dense_replace"])
def test_an_mla_moe_config_missing_part_of_its_moe_shape_is_refused_naming_it(field):
    """transformers fills an omitted field from the config class (Glm4MoeLiteConfig: 64 experts, the
    first layer dense; DeepseekV3Config: 256 and 3), so GLM-4.7-Flash without ``n_routed_experts`` is
    still a 29.9B MoE to every engine; read as 0 it was a dense 4.6B model. Refused, naming the field;
    ``mlp_layer_types`` states the dense layers as well as ``first_k_dense_replace`` does."""
    raw = {k: v for k, v in GLM47_FLASH.items() if k != field}
    with pytest.raises(ConfigError) as err:
        load(raw)
    assert err.value.field == field
    if field == "first_k_dense_replace":
        typed = load({**raw, "mlp_layer_types": ["dense"] + ["sparse"] * 46})
        assert count_parameters(typed).main_total == 29_943_390_976


def test_a_glm_4_5_config_missing_its_experts_is_refused():
    """GLM-4.5 (``glm4_moe``) reads DeepSeek's MoE names too; ``Glm4MoeConfig`` fills an omitted
    ``n_routed_experts`` with 128, so GLM-4.5-Air without it is still a ~107B MoE to the engines (read
    as 0 it was a dense 12.4B model): refused, naming the field."""
    air = {"model_type": "glm4_moe", "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
           "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": 151552, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1}
    with pytest.raises(ConfigError) as err:
        load(air)
    assert err.value.field == "n_routed_experts"
    assert count_parameters(load({**air, "n_routed_experts": 128})).main_total > 100e9  # stated, it is the MoE


def test_an_mla_config_of_another_type_without_experts_is_dense():
    """A type isplan reads through its MLA fields alone (not a DeepSeek / GLM / Kimi class, whose
    classes default to experts) that states no MoE field is a dense MLA model, as before."""
    raw = {k: v for k, v in GLM47_FLASH.items() if k not in (
        "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace")}
    cfg = load({**raw, "model_type": "minicpm3", "architectures": ["MiniCPM3ForCausalLM"]})
    assert cfg.n_routed_experts == 0 and cfg.attention == "mla"
    with pytest.raises(ConfigError) as err:  # the same file as a DeepSeek-V3 class defaults to 256 experts
        load({**raw, "model_type": "deepseek_v3"})
    assert err.value.field == "n_routed_experts"


# config.json field values of openai/gpt-oss-20b (layer_types: sliding and full alternate, sliding first)
GPT_OSS_20B = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
               "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4, "num_hidden_layers": 24,
               "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
               "attention_bias": True, "sliding_window": 128, "tie_word_embeddings": False,
               "layer_types": ["sliding_attention", "full_attention"] * 12}


@pytest.mark.parametrize("layers,experts,published_total,published_active", [
    (24, 32, 20_914_757_184, 3_608_307_264),   # gpt-oss-20b: OpenAI's model card, 20.91B / 3.61B active
    (36, 128, 116_829_156_672, 5_132_849_472),  # gpt-oss-120b: 116.83B / 5.13B active
])
def test_gpt_oss_exact(layers, experts, published_total, published_active):
    """GptOssAttention: q/k/v/o with biases and a sink logit per head; GptOssExperts: gate_up (2i) and
    down with their biases; GptOssTopKRouter: E x H and a trained bias E (transformers
    models/gpt_oss/modeling_gpt_oss.py). ``active`` as isplan counts it: no input embedding."""
    cfg = load({**GPT_OSS_20B, "num_hidden_layers": layers, "num_local_experts": experts,
                "layer_types": ["sliding_attention", "full_attention"] * (layers // 2)})
    H, h, g, d, i, V = 2880, 64, 8, 64, 2880, 201088
    attn = gqa_layer(H, h, g, d, qkv_bias=True, o_bias=True) + h
    expert = 3 * H * i + 2 * i + H
    router = experts * H + experts
    r = count_parameters(cfg)
    assert r.main_total == layers * (attn + experts * expert + router + 2 * H) + 2 * V * H + H == published_total
    assert r.active == layers * (attn + 4 * expert + router + 2 * H) + V * H + H == published_active
    assert r.checkpoint_total == r.main_total  # its router bias is a trained weight, counted above
    assert cfg.layer_windows == (128, 0) * (layers // 2)


# Nemotron-4 (arXiv 2402.16819 / 2406.11704): nvidia/Nemotron-4-340B-Base's architecture as NemotronConfig
# fields (96 layers, hidden 18432, 96 heads, 8 KV heads, FFN 73728, vocabulary 256000, squared ReLU)
NEMOTRON4_340B = {"model_type": "nemotron", "architectures": ["NemotronForCausalLM"], "hidden_size": 18432,
                  "intermediate_size": 73728, "num_hidden_layers": 96, "num_attention_heads": 96,
                  "num_key_value_heads": 8, "vocab_size": 256000, "max_position_embeddings": 4096}
NEMOTRON4_15B = {**NEMOTRON4_340B, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 32,
                 "num_attention_heads": 48}


@pytest.mark.parametrize("raw,non_embedding,embedding", [
    (NEMOTRON4_340B, 331.6e9, 9.4e9),  # Nemotron-4 340B report, Table 1: 9.4B embedding, 331.6B non-embedding
    (NEMOTRON4_15B, 12.5e9, 3.2e9),   # Nemotron-4 15B report, Table 1: 3.2B embedding, 12.5B non-embedding
])
def test_nemotron4_exact(raw, non_embedding, embedding):
    """NemotronAttention q/k/v/o without biases; NemotronMLP up (H -> I) and down (I -> H), squared ReLU,
    no gate; two LayerNorm1P (weight and bias) a layer and a final one; untied head (transformers
    models/nemotron). The file omits hidden_act: NemotronConfig's default is relu2."""
    cfg = load(raw)
    H, I, V, L, h, g = (raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"], raw["num_hidden_layers"],
                        raw["num_attention_heads"], raw["num_key_value_heads"])
    assert (cfg.gated_mlp, cfg.norm_bias, cfg.tie_word_embeddings, cfg.activation) == (False, True, False, "relu2")
    body = L * (gqa_layer(H, h, g, H // h) + 2 * H * I + 4 * H) + 2 * H
    assert count_parameters(cfg).main_total == body + 2 * V * H
    embedding_rows = 2 * V * H
    assert body == pytest.approx(non_embedding, rel=0.002) and embedding_rows == pytest.approx(embedding, rel=0.02)


def test_an_ungated_mlp_keeps_one_fc1_output():
    """A 2-matrix MLP (GELU, squared ReLU) keeps its fc1 output of I and its activation output of I,
    2 bytes each per token (Korthikanti et al. 2022: 8sbh + 8sbh at I = 4h); a gated one keeps gate
    and up (2I). Megatron's theoretical memory counts ``2 H I`` weights without SwiGLU
    (``gated_linear_multiplier``, theoretical_memory_usage.py)."""
    from app.core.model.memory import layer_activation_terms, megatron_layer_params

    relu2 = load(NEMOTRON4_15B)
    swiglu = load({**NEMOTRON4_15B, "model_type": "llama"})
    par = ParallelConfig(tp=4, pp=1, gpus=4, sp=True, seq_length=4096)
    I = NEMOTRON4_15B["intermediate_size"]
    t2 = layer_activation_terms(relu2, par, ffn="dense", indexer=False)
    t3 = layer_activation_terms(swiglu, par, ffn="dense", indexer=False)
    assert (t2["dense_fc1"], t2["dense_act"]) == (2 * I / 4, 2 * I / 4)
    assert (t3["dense_fc1"], t3["dense_act"]) == (4 * I / 4, 2 * I / 4)
    assert megatron_layer_params(relu2)["dense_mlp"] == 2 * 6144 * I
    assert megatron_layer_params(swiglu)["dense_mlp"] == 3 * 6144 * I


def test_sliding_windows_by_family():
    """Which layers slide: ``layer_types`` when given; else Gemma 2 and GPT-OSS alternate (sliding on
    the first, ``(i + 1) % 2``), Mistral and Phi-3 slide on every layer, Qwen2 only with
    ``use_sliding_window`` from ``max_window_layers`` on; no ``sliding_window``, no window."""
    assert load(GEMMA2_9B).layer_windows == (4096, 0) * 21
    assert load({**GPT_OSS_20B, "layer_types": None}).layer_windows == (128, 0) * 12
    assert load({**MISTRAL_7B, "sliding_window": 4096}).layer_windows == (4096,) * 32
    assert load(PHI3_MINI).layer_windows == (2047,) * 32
    assert load(QWEN2_7B).layer_windows is None  # sliding_window 131072 but use_sliding_window false
    assert load({**QWEN2_7B, "sliding_window": 4096, "use_sliding_window": True,
                 "max_window_layers": 20}).layer_windows == (0,) * 20 + (4096,) * 8
    assert load({**MISTRAL_7B, "sliding_window": None}).layer_windows is None
    with pytest.raises(ConfigError) as err:
        load({**GPT_OSS_20B, "layer_types": ["sliding_attention"] * 23})
    assert err.value.field == "layer_types"


def test_a_sliding_layer_attends_its_window():
    """Attention on a sliding layer of window W: a query at position t sees min(t, W) keys, so a
    sequence of S has sum(min(t, W)) pairs (brute force here), a token at context L sees min(L, W);
    each pair costs 2 h (d + d) FLOPs forward (GQA, 64 heads of 64). The full layers see them all.
    The step time follows: the same model without windows spends more time in attention."""
    from app.core.model.flops import layer_flops, sequence_layer_flops, window_pairs

    for s_len, w in ((1, 128), (127, 128), (128, 128), (129, 128), (4096, 128), (5000, 4096)):
        assert window_pairs(s_len, w) == sum(min(t, w) for t in range(1, s_len + 1))
    cfg = load(GPT_OSS_20B)
    roles = derive_roles(cfg)
    sliding, full = roles.role(1), roles.role(2)
    assert (sliding.window, full.window) == (128, 0) and sliding.kind != full.kind
    assert roles.notes[1] == ("layers 1, 3, 5, 7, 9, 11, 13, 15, ... (12 layers) attend a sliding window of 128 "
                              "tokens (the others every earlier token)")
    assert sliding.to_dict()["attention_window"] == 128
    per_pair = 2 * 64 * (64 + 64)
    assert sequence_layer_flops(cfg, sliding, seq_length=4096)["sparse_attention"] == per_pair * (
        sum(min(t, 128) for t in range(1, 4097)))
    assert sequence_layer_flops(cfg, full, seq_length=4096)["sparse_attention"] == per_pair * 4096 * 4097 // 2
    assert layer_flops(cfg, roles, 1, 8192)["sparse_attention"] == per_pair * 128
    assert layer_flops(cfg, roles, 2, 8192)["sparse_attention"] == per_pair * 8192

    from app.core.model.hardware import get_hardware
    from app.core.time.model import step_time
    from app.core.time.settings import TimeSettings

    def stage(c):
        plan = materialise(PipelineSpec(pp=1), 24)
        s = TimeSettings(tp=1, pp=1, dp=8, ep=8, mbs=1, global_batch=64, seq_length=4096)
        return step_time(c, derive_roles(c), plan, s, get_hardware("h100-80gb"), record=False).per_stage[0]

    windowed, unwindowed = stage(cfg), stage(load({**GPT_OSS_20B, "sliding_window": None}))
    # the 12 sliding layers' attention, and only it, is what the window saves
    saved = 12 * per_pair * (4096 * 4097 // 2 - window_pairs(4096, 128))
    assert unwindowed["forward_flops"] - windowed["forward_flops"] == saved
    assert windowed["compute_seconds"] < unwindowed["compute_seconds"]


#: a small Llama 4 of the same shape rules (chunked layers, interleaved MoE with a shared expert)
LLAMA4_SMALL = {"model_type": "llama4", "text_config": {
    "hidden_size": 1024, "intermediate_size": 1024, "intermediate_size_mlp": 2048, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "num_local_experts": 8,
    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 32000, "attention_chunk_size": 2048}}


@pytest.mark.parametrize("raw", [PHI3_MINI, GEMMA_7B, GEMMA2_9B, QWEN15_MOE, DEEPSEEK_V2_LITE, GPT_OSS_20B,
                                 NEMOTRON4_15B, LLAMA4_SMALL, GLM47_FLASH],
                         ids=lambda r: r["model_type"])
def test_every_new_family_is_judged_and_timed(raw):
    """A Megatron plan of each family added in this round gets a verdict with memory, parallel
    constraints and a step time (no field problem, nothing unavailable)."""
    from app.core.evaluate import evaluate
    from app.core.plan import plan_from_query

    cfg = load(raw)
    experts = cfg.n_routed_experts
    # Megatron splits the layers evenly (DeepSeek-V2-Lite: 27; GLM-4.7-Flash: 47, one stage)
    pp = next(p for p in (2, 3, 1) if cfg.num_hidden_layers % p == 0)
    query = {"model": cfg.id, "engine": "megatron", "pp": str(pp), "tp": "1", "dp": "4", "mbs": "1",
             "global_batch": "64", "seq_length": "4096", "gpu": "b200-180gb",
             **({"ep": "4"} if experts else {})}
    plan, problems = plan_from_query(query)
    assert problems == []
    ev = evaluate(plan, cfg)
    assert ev.problems == [] and ev.memory and ev.time and "unavailable" not in ev.time, ev.time
    assert ev.time["tokens_per_second_per_gpu"] > 0 and ev.verdict.go
    # the one family known to miss published runs says so with its time (docs/MODELS.md)
    assert any("read it as optimistic" in n for n in ev.time["notes"]) == (raw["model_type"] == "gpt_oss")


# the text model of google/gemma-3-27b (its config.json's text_config, model_type gemma3_text)
GEMMA3_27B = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 5376,
              "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
              "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024,
              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "vocab_size": 262208}


def test_gemma3_text_parameters_and_windows():
    """Gemma 3 (transformers ``Gemma3DecoderLayer``): Gemma 2's four RMSNorms and tied embeddings,
    plus an RMSNorm of ``head_dim`` on q and on k, and one full-attention layer every
    ``sliding_window_pattern`` (default 6) layers, the others sliding (``is_sliding = bool((i + 1) %
    6)``): 10 of the 62 layers are full. Gemma 3 technical report (arXiv 2503.19786), Table 1: the
    27B model has 25,600M non-embedding parameters; by hand per layer q/k/v/o + 3 H I + 4 H + 2 d."""
    cfg = load(GEMMA3_27B)
    H, I, V, L, h, g, d = 5376, 21504, 262208, 62, 32, 16, 128
    assert (cfg.norms_per_layer, cfg.qk_norm, cfg.tie_word_embeddings, cfg.head_dim) == (4, True, True, d)
    layer = gqa_layer(H, h, g, d, qk_norm=True) + 3 * H * I + 4 * H
    non_embedding = count_parameters(cfg).main_total - V * H
    assert non_embedding == L * layer + H
    assert non_embedding == pytest.approx(25_600e6, rel=5e-4)
    assert cfg.layer_windows == ((1024,) * 5 + (0,)) * 10 + (1024,) * 2
    assert load({**GEMMA3_27B, "sliding_window_pattern": 2}).layer_windows == (1024, 0) * 31
    # an explicit null is what the file says (transformers keeps it: no window), not the class default 4096
    assert load({**GEMMA3_27B, "sliding_window": None}).layer_windows is None


def test_a_gemma3_multimodal_file_is_read_through_its_text_config():
    """google/gemma-3-27b's config.json is a ``gemma3`` wrapper whose ``text_config`` omits what
    equals ``Gemma3TextConfig``'s defaults (no ``vocab_size``: 262,208): read through it, the
    language model is the same as the text config's (the vision tower is not counted)."""
    text = {k: v for k, v in GEMMA3_27B.items() if k not in ("vocab_size", "architectures")}
    wrapper = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
               "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    cfg, ref = load(wrapper), load(GEMMA3_27B)
    assert (cfg.model_type, cfg.vocab_size, cfg.multimodal, ref.multimodal) == ("gemma3_text", 262208, "gemma3", None)
    assert count_parameters(cfg).main_total == count_parameters(ref).main_total
    assert cfg.layer_windows == ref.layer_windows
    with pytest.raises(ConfigError) as err:
        load({"model_type": "gemma3", "vision_config": {}})
    assert err.value.field == "text_config"


# config.json field values of allenai/OLMo-2-1124-7B
OLMO2_7B = {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 100352, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False}


def test_olmo2_norms_its_whole_q_and_k_projections():
    """OLMo 2 (transformers ``Olmo2Attention``): ``q_norm`` is an RMSNorm over the whole q projection
    (h d weights) and ``k_norm`` over the whole k projection (g d), not one of ``head_dim``; two norms a
    layer (after attention and after the MLP); untied. By hand: 7,298,617,344 (the model card's 7.3B)."""
    cfg = load(OLMO2_7B)
    H, I, V, L, h, g, d = 4096, 11008, 100352, 32, 32, 32, 128
    assert (cfg.qk_norm_full, cfg.qk_norm, cfg.norms_per_layer, cfg.tie_word_embeddings) == (True, False, 2, False)
    layer = gqa_layer(H, h, g, d) + (h + g) * d + 3 * H * I + 2 * H
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 7_298_617_344


def test_olmo3_slides_three_layers_of_four():
    """OLMo 3 is OLMo 2's layer with sliding windows: ``Olmo3Config`` defaults ``layer_types`` to
    sliding unless ``(i + 1) % 4 == 0`` and ``sliding_window`` to 4096; a window the file gives wins,
    null meaning none. The parameters are OLMo 2's."""
    o3 = {**OLMO2_7B, "model_type": "olmo3"}
    assert load(o3).layer_windows == (4096, 4096, 4096, 0) * 8
    assert load({**o3, "sliding_window": 512}).layer_windows == (512, 512, 512, 0) * 8
    assert load({**o3, "sliding_window": None}).layer_windows is None
    assert count_parameters(load(o3)).main_total == count_parameters(load(OLMO2_7B)).main_total


# config.json field values of allenai/OLMoE-1B-7B-0924
OLMOE_1B_7B = {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048,
               "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
               "num_experts": 64, "num_experts_per_tok": 8, "vocab_size": 50304, "hidden_act": "silu",
               "attention_bias": False, "clip_qkv": None, "norm_topk_prob": False, "tie_word_embeddings": False}


def test_olmoe_is_olmos_whole_q_k_norm_on_a_mixtral_like_moe():
    """OLMoE (transformers ``modular_olmoe.py``): Llama's attention with ``q_norm`` over H and
    ``k_norm`` over ``H / h * g``, two pre-norms, every layer an MoE of 64 gated experts of
    ``intermediate_size`` (1024) with a bias-free router, untied. By hand: a layer 4 H^2 + 2 H (q/k
    norms) + 2 H (norms) + 64 H + 64 * 3 H I = 419,569,664; 16 of them, two 50,304 x 2,048 tables and
    the final norm: 6,919,161,856 (the model card's "6.9B total"); 1.18B active a token (8 of 64
    experts, and the output layer; with the input embedding, the card's "1.3B active")."""
    cfg = load(OLMOE_1B_7B)
    H, I, V, L, E = 2048, 1024, 50304, 16, 64
    assert (cfg.qk_norm_full, cfg.qk_norm, cfg.n_routed_experts, cfg.num_experts_per_tok,
            cfg.moe_intermediate_size, cfg.n_shared_experts, cfg.moe_router_bias) == (True, False, 64, 8, 1024, 0, False)
    layer = 4 * H * H + 2 * H + 2 * H + E * H + E * 3 * H * I
    assert layer == 419_569_664
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 6_919_161_856
    # active per token: 8 of the 64 experts, the output layer and the final norm (the input embedding is a lookup)
    assert count_parameters(cfg).active == L * (layer - (E - 8) * 3 * H * I) + V * H + H == 1_178_994_688
    # OlmoeConfig.attribute_map: num_local_experts is num_experts; the class defaults where omitted
    alias = {k: v for k, v in OLMOE_1B_7B.items() if k != "num_experts"} | {"num_local_experts": 64}
    assert count_parameters(load(alias)).main_total == 6_919_161_856
    bare = load({k: v for k, v in OLMOE_1B_7B.items()
                 if k not in ("num_experts", "num_experts_per_tok", "intermediate_size")})
    assert (bare.n_routed_experts, bare.num_experts_per_tok, bare.moe_intermediate_size) == (64, 8, 2048)


# config.json field values of MiniMaxAI/MiniMax-M2 (its MTP fields included: nothing builds them)
MINIMAX_M2 = {"model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"], "hidden_size": 3072,
              "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
              "head_dim": 128, "num_local_experts": 256, "num_experts_per_tok": 8, "vocab_size": 200064,
              "hidden_act": "silu", "rotary_dim": 64, "scoring_func": "sigmoid", "use_routing_bias": True,
              "use_qk_norm": True, "qk_norm_type": "per_layer", "shared_intermediate_size": 0, "use_mtp": True,
              "num_mtp_modules": 3, "mtp_transformer_layers": 1, "tie_word_embeddings": False}


def test_minimax_m2_is_olmo2_attention_on_a_256_expert_moe_with_a_router_bias():
    """MiniMax-M2 (transformers ``modular_minimax_m2.py``): OLMo 2's attention (``q_norm`` over h d = 6,144,
    ``k_norm`` over g d = 1,024) with bias-free projections, Mixtral's pre-norm layer and experts (256 of
    width 1,536, top-8), a sigmoid router with an ``e_score_correction_bias`` of 256 a layer; untied. By hand:
    a layer 2 H h d + 2 H g d + (h + g) d + 2 H + 256 H + 256 x 3 H I = 3,668,718,592; 62 of them, two
    200,064 x 3,072 tables and the final norm: 228,689,748,992 (the card's "230B total"); active
    10,415,940,608 ("10B active"); the checkpoint adds the router biases, 62 x 256. The MTP modules the file
    names are built by neither transformers nor Megatron-Bridge's bridge ("MTP modules are not mapped")."""
    cfg = load(MINIMAX_M2)
    H, I, V, L, E, h, g, d = 3072, 1536, 200064, 62, 256, 48, 8, 128
    assert (cfg.qk_norm_full, cfg.qkv_bias, cfg.o_bias, cfg.moe_router_bias, cfg.n_routed_experts, cfg.num_experts_per_tok,
            cfg.moe_intermediate_size, cfg.n_shared_experts, cfg.num_nextn_predict_layers
            ) == (True, False, False, True, 256, 8, 1536, 0, 0)
    layer = gqa_layer(H, h, g, d) + (h + g) * d + 2 * H + E * H + E * 3 * H * I
    assert layer == 3_668_718_592
    counts = count_parameters(cfg)
    assert counts.main_total == L * layer + 2 * V * H + H == 228_689_748_992
    assert counts.active == L * (layer - (E - 8) * 3 * H * I) + V * H + H == 10_415_940_608
    assert counts.checkpoint_total - counts.main_total == L * E
    # "attention_bias" is not read (MiniMaxM2Attention builds its projections without one); the class defaults
    assert count_parameters(load({**MINIMAX_M2, "attention_bias": True})).main_total == counts.main_total
    bare = load({k: v for k, v in MINIMAX_M2.items() if k not in ("num_local_experts", "num_key_value_heads", "head_dim")})
    assert (bare.n_routed_experts, bare.num_key_value_heads, bare.head_dim) == (256, 8, 128)
    alias = {k: v for k, v in MINIMAX_M2.items() if k != "num_local_experts"} | {"num_experts": 128}
    assert load(alias).n_routed_experts == 128


# config.json field values of baidu/ERNIE-4.5-21B-A3B-PT (with the MTP layer count it states: nothing builds it)
ERNIE45_21B = {"model_type": "ernie4_5_moe", "architectures": ["Ernie4_5_MoeForCausalLM"], "hidden_size": 2560,
               "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
               "head_dim": 128, "vocab_size": 103424, "hidden_act": "silu", "use_bias": False, "moe_num_experts": 64,
               "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_interval": 1,
               "moe_intermediate_size": 1536, "moe_k": 6, "moe_use_aux_free": True, "num_nextn_predict_layers": 1,
               "tie_word_embeddings": True}


def test_ernie45_moe_layers_experts_and_shared_expert():
    """ERNIE 4.5 (transformers ``modular_ernie4_5_moe.py``): layer i is an MoE iff (i + 1) % interval == 0
    and start <= i <= end (-1: the last), else a dense MLP of ``intermediate_size``; the MoE is 64 experts of
    1,536 (top-6), a shared expert of 2 x 1,536 and a router with a correction bias; tied. By hand: layer 0
    (dense) is q, k, v, o (15,728,640) + 2 H + 3 H I = 110,105,600; an MoE layer 15,728,640 + 2 H + 64 H +
    66 x 3 H i = 794,465,280; with 27 of those, one 103,424 x 2,560 table and the final norm:
    21,825,436,160 (the card's "21B total"); active 3,352,148,480 ("3B active")."""
    cfg = load(ERNIE45_21B)
    H, I, i, V, h, g, d, E = 2560, 12288, 1536, 103424, 20, 4, 128, 64
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.n_shared_experts,
            cfg.intermediate_size, cfg.moe_router_bias, cfg.qkv_bias, cfg.num_nextn_predict_layers,
            cfg.tie_word_embeddings) == (64, 6, 1536, 2, 12288, True, False, 0, True)
    assert cfg.mlp_layer_types == ("dense",) + ("sparse",) * 27
    attn = gqa_layer(H, h, g, d) + 2 * H
    dense, moe = attn + 3 * H * I, attn + E * H + (E + 2) * 3 * H * i
    assert (dense, moe) == (110_105_600, 794_465_280)
    counts = count_parameters(cfg)
    assert counts.main_total == dense + 27 * moe + V * H + H == 21_825_436_160
    assert counts.active == dense + 27 * (moe - (E - 6) * 3 * H * i) + V * H + H == 3_352_148_480
    assert counts.checkpoint_total - counts.main_total == 27 * E
    # the layer rule: every second layer from 3 to 20; the end index -1 is the last layer
    spaced = load({**ERNIE45_21B, "moe_layer_start_index": 3, "moe_layer_end_index": 20, "moe_layer_interval": 2})
    assert [n for n, t in enumerate(spaced.mlp_layer_types) if t == "sparse"] == [3, 5, 7, 9, 11, 13, 15, 17, 19]
    every = load({**ERNIE45_21B, "moe_layer_start_index": 0, "moe_layer_end_index": -1})
    assert every.mlp_layer_types is None
    # the config's aliases, its class defaults (tied unless said), and use_bias refused by name
    alias = {k: v for k, v in ERNIE45_21B.items() if k not in ("moe_num_experts", "moe_k", "tie_word_embeddings")}
    cfg2 = load({**alias, "num_experts": 32, "num_experts_per_tok": 4})
    assert (cfg2.n_routed_experts, cfg2.num_experts_per_tok, cfg2.tie_word_embeddings) == (32, 4, True)
    with pytest.raises(ConfigError) as err:
        load({**ERNIE45_21B, "use_bias": True})
    assert err.value.field == "use_bias"
    with pytest.raises(ConfigError) as err:
        load({**ERNIE45_21B, "moe_layer_interval": 0})
    assert err.value.field == "moe_layer_interval"


# config.json field values of inclusionAI/Ling-mini-2.0 (Ling 2.0, BailingMoeV2ForCausalLM)
LING_MINI_2 = {"model_type": "bailing_moe_v2", "architectures": ["BailingMoeV2ForCausalLM"], "hidden_size": 2048,
               "intermediate_size": 5120, "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4,
               "head_dim": 128, "vocab_size": 157184, "num_experts": 256, "num_shared_experts": 1,
               "num_experts_per_tok": 8, "moe_intermediate_size": 512, "first_k_dense_replace": 1, "use_qk_norm": True,
               "use_qkv_bias": False, "use_bias": False, "tie_word_embeddings": False, "n_group": 8, "topk_group": 4,
               "partial_rotary_factor": 0.5, "score_function": "sigmoid", "moe_router_enable_expert_bias": True}


def test_ling_2_is_a_dense_first_moe_with_a_shared_expert_qk_norm_and_router_bias():
    """Ling 2.0 (``modeling_bailing_moe_v2.py`` as Megatron-Bridge bundles it): a fused qkv, a per-head
    QK-norm, one dense layer of 5,120 then 256 experts of 512 (top-8) with one shared expert and a router
    ``expert_bias``; untied. By hand: attention 10,485,760 + 2 d + 2 H = 10,490,112; the dense layer adds
    3 H I = 31,457,280; an MoE layer 256 H + 257 x 3 H i = 808,976,384; with 19 MoE layers, two tables
    and the final norm: 16,255,638,528 (the card's "16B total"); active without the tables 789,140,480 -
    the card's "789M non-embedding active" to the parameter. An MTP layer is DeepSeek's block (not in the
    main count); ``use_qkv_bias`` / ``use_bias`` put biases on qkv / the output projection."""
    cfg = load(LING_MINI_2)
    H, I, i, V, h, g, d, E = 2048, 5120, 512, 157184, 16, 4, 128, 256
    assert (cfg.qk_norm, cfg.qkv_bias, cfg.o_bias, cfg.moe_router_bias, cfg.n_routed_experts, cfg.n_shared_experts,
            cfg.first_k_dense_replace, cfg.tie_word_embeddings) == (True, False, False, True, 256, 1, 1, False)
    attn = gqa_layer(H, h, g, d, qk_norm=True) + 2 * H
    dense, moe = attn + 3 * H * I, attn + E * H + (E + 1) * 3 * H * i
    assert (attn, dense, moe) == (10_490_112, 41_947_392, 819_466_496)
    counts = count_parameters(cfg)
    assert counts.main_total == dense + 19 * moe + 2 * V * H + H == 16_255_638_528
    assert counts.active - V * H - H == dense + 19 * (moe - (E - 8) * 3 * H * i) == 789_140_480
    assert counts.checkpoint_total - counts.main_total == 19 * E
    mtp = load({**LING_MINI_2, "num_nextn_predict_layers": 1})
    assert mtp.num_nextn_predict_layers == 1 and count_parameters(mtp).main_total == counts.main_total
    # BailingMoeV2MTPLayer: eh_proj 2H x H, enorm / hnorm / final_layernorm, a decoder layer with the MoE block
    assert count_parameters(mtp).checkpoint_total - counts.main_total == 2 * H * H + 3 * H + moe + 20 * E
    biased = count_parameters(load({**LING_MINI_2, "use_qkv_bias": True, "use_bias": True})).main_total
    assert biased - counts.main_total == 20 * ((h + 2 * g) * d + H)
    dense_only = load({**LING_MINI_2, "num_experts": None})
    assert (dense_only.n_routed_experts, count_parameters(dense_only).main_total) == (0, 20 * dense + 2 * V * H + H)


# config.json field values of LGAI-EXAONE/EXAONE-4.0-32B
EXAONE4_32B = {"model_type": "exaone4", "architectures": ["Exaone4ForCausalLM"], "hidden_size": 5120,
               "intermediate_size": 27392, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
               "head_dim": 128, "vocab_size": 102400, "hidden_act": "silu", "sliding_window": 4096,
               "sliding_window_pattern": "LLLG", "tie_word_embeddings": False}


def test_exaone4_is_olmo2s_layer_with_a_per_head_qk_norm_and_local_global_windows():
    """EXAONE 4.0 (transformers ``modular_exaone4.py``): OLMo 2's decoder layer and MLP (two post-norms),
    bias-free projections, an RMSNorm of ``head_dim`` on q and k; ``sliding_window_pattern`` "LLLG" (L local,
    G global, from layer 0; the last layer global) or an integer p (every p-th layer global, the config
    class's default 4). By hand: a layer q/k/v/o 62,914,560 + 2 d + 2 H + 3 H I = 483,666,176; 64 of them,
    two tables and the final norm: 32,003,216,384 (the card's 32.0B)."""
    cfg = load(EXAONE4_32B)
    H, I, V, L, h, g, d = 5120, 27392, 102400, 64, 40, 8, 128
    layer = gqa_layer(H, h, g, d, qk_norm=True) + 2 * H + 3 * H * I
    assert layer == 483_666_176
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 32_003_216_384
    assert (cfg.qk_norm, cfg.qk_norm_full, cfg.qkv_bias, cfg.o_bias) == (True, False, False, False)
    assert cfg.layer_windows == (4096, 4096, 4096, 0) * 16
    assert load({**EXAONE4_32B, "sliding_window_pattern": "LLG"}).layer_windows == (4096, 4096, 0) * 21 + (0,)
    assert load({**EXAONE4_32B, "sliding_window_pattern": 2}).layer_windows == (4096, 0) * 32
    assert load({k: v for k, v in EXAONE4_32B.items() if k != "sliding_window_pattern"}).layer_windows == cfg.layer_windows
    assert load({**EXAONE4_32B, "sliding_window": None}).layer_windows is None
    given = ["full_attention"] * 63 + ["sliding_attention"]
    assert load({**EXAONE4_32B, "layer_types": given}).layer_windows == (0,) * 63 + (4096,)
    with pytest.raises(ConfigError) as err:
        load({**EXAONE4_32B, "sliding_window_pattern": "LLXG"})
    assert err.value.field == "sliding_window_pattern"


# config.json field values of HuggingFaceTB/SmolLM3-3B
SMOLLM3_3B = {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "hidden_size": 2048,
              "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
              "vocab_size": 128256, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
              "no_rope_layers": [1, 1, 1, 0] * 9, "use_sliding_window": False, "sliding_window": None,
              "tie_word_embeddings": True}


def test_smollm3_is_llamas_shapes_tied_with_windows_only_on_its_nope_layers():
    """SmolLM3 (transformers ``modular_smollm3.py``): Llama's attention and MLP (``attention_bias``,
    ``mlp_bias``), tied unless said (``SmolLM3Config``), 4 KV heads by default. By hand: a layer
    10,485,760 + 3 H I + 2 H = 78,123,008; 36 of them, one 128,256 x 2,048 table and the final norm:
    3,075,098,624 (the card's 3B). A window applies only with ``use_sliding_window``, by default on the NoPE
    layers (``no_rope_layers`` 0, else every ``no_rope_layer_interval``-th layer)."""
    cfg = load(SMOLLM3_3B)
    H, I, V, L, h, g, d = 2048, 11008, 128256, 36, 16, 4, 128
    layer = gqa_layer(H, h, g, d) + 3 * H * I + 2 * H
    assert layer == 78_123_008
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 3_075_098_624
    untied = {k: v for k, v in SMOLLM3_3B.items() if k not in ("tie_word_embeddings", "num_key_value_heads")}
    assert (load(untied).tie_word_embeddings, load(untied).num_key_value_heads) == (True, 4)
    assert cfg.layer_windows is None
    assert load({**SMOLLM3_3B, "sliding_window": 4096}).layer_windows is None  # use_sliding_window is off
    on = {**SMOLLM3_3B, "sliding_window": 4096, "use_sliding_window": True}
    assert load(on).layer_windows == (0, 0, 0, 4096) * 9
    assert load({k: v for k, v in on.items() if k != "no_rope_layers"} | {"no_rope_layer_interval": 3}
                ).layer_windows == (0, 0, 4096) * 12
    assert load({**on, "layer_types": ["sliding_attention"] * 36}).layer_windows == (4096,) * 36
    biased = load({**SMOLLM3_3B, "attention_bias": True, "mlp_bias": True})
    assert count_parameters(biased).main_total - count_parameters(cfg).main_total == L * ((h + 2 * g) * d + H + 2 * I + H)
    for bad in ({"no_rope_layers": [1, 2] * 18}, {"no_rope_layers": [1] * 35}):
        with pytest.raises(ConfigError) as err:
            load({**on, **bad})
        assert err.value.field == "no_rope_layers"


# config.json field values of a Granite 3.x 8B (GraniteForCausalLM, model_type granite)
GRANITE3_8B = {"model_type": "granite", "architectures": ["GraniteForCausalLM"], "hidden_size": 4096,
               "intermediate_size": 12800, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 49159, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
               "tie_word_embeddings": True, "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0,
               "logits_scaling": 16.0, "residual_multiplier": 0.22}


def test_granite_is_llamas_shapes_and_mlp_biases_count_for_a_gated_mlp():
    """Granite (transformers ``GraniteAttention`` / ``GraniteMLP``) has Llama's modules; its four
    multipliers scale activations and carry no weights. By hand, tied: 8,170,864,640. ``mlp_bias``
    (``LlamaMLP`` / ``GraniteMLP``: gate, up and down with ``bias=config.mlp_bias``) adds 2 I + H a layer."""
    cfg = load(GRANITE3_8B)
    H, I, V, L, h, g, d = 4096, 12800, 49159, 40, 32, 8, 128
    layer = gqa_layer(H, h, g, d) + 3 * H * I + 2 * H
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 8_170_864_640
    for model_type in ("granite", "llama"):
        biased = load({**GRANITE3_8B, "model_type": model_type, "mlp_bias": True})
        assert count_parameters(biased).main_total - count_parameters(load({**GRANITE3_8B, "model_type": model_type})
                                                                        ).main_total == L * (2 * I + H)


# config.json field values of mistralai/Mistral-Small-3.1-24B (a mistral3 file, its Pixtral tower left out)
MISTRAL_SMALL_31 = {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"],
                    "text_config": {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 32768,
                                    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                                    "head_dim": 128, "vocab_size": 131072, "sliding_window": None,
                                    "hidden_act": "silu"},
                    "vision_config": {"model_type": "pixtral", "hidden_size": 1024}}


def test_a_mistral3_file_is_read_through_its_mistral_text_config():
    """Mistral Small 3.x ships a ``mistral3`` file: its language model is the ``mistral`` text_config
    (untied, no window), by hand 23,572,403,200 parameters (with the ~0.4B vision tower, not counted,
    the card's 24B). A text model of a type isplan does not read is refused naming text_config."""
    cfg = load(MISTRAL_SMALL_31)
    H, I, V, L, h, g, d = 5120, 32768, 131072, 40, 32, 8, 128
    assert (cfg.model_type, cfg.tie_word_embeddings, cfg.layer_windows, cfg.multimodal) == ("mistral", False, None,
                                                                                            "mistral3")
    layer = gqa_layer(H, h, g, d) + 3 * H * I + 2 * H
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 23_572_403_200
    with pytest.raises(ConfigError) as err:
        load({**MISTRAL_SMALL_31, "text_config": {**MISTRAL_SMALL_31["text_config"], "model_type": "mistral4"}})
    assert err.value.field == "text_config" and "mistral4" in str(err.value)


# the text_config of mistralai/Ministral-3-8B-Base-2512's mistral3 file (its Pixtral tower left out)
MINISTRAL3_8B_TEXT = {"model_type": "ministral3", "hidden_size": 4096, "intermediate_size": 14336,
                      "num_hidden_layers": 34, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "vocab_size": 131072, "hidden_act": "silu", "sliding_window": None}


def test_a_ministral3_text_config_is_mistrals_decoder():
    """Ministral 3 (transformers ``modular_ministral3.py``): ``MistralAttention`` (bias-free) and
    ``MistralDecoderLayer``; its attention scaling by position carries no weights. Read through its
    ``mistral3`` file or alone; ``Ministral3Config`` defaults (``head_dim`` 128, 8 KV heads, untied); a window
    applies to every layer, as Mistral's. By hand: a layer 41,943,040 + 3 H I + 2 H = 218,112,000; 34 of them,
    two 131,072 x 4,096 tables and the final norm: 8,489,553,920."""
    wrapped = load({**MISTRAL_SMALL_31, "text_config": MINISTRAL3_8B_TEXT, "tie_word_embeddings": False})
    H, I, V, L, h, g, d = 4096, 14336, 131072, 34, 32, 8, 128
    layer = gqa_layer(H, h, g, d) + 3 * H * I + 2 * H
    assert layer == 218_112_000
    assert (wrapped.model_type, wrapped.tie_word_embeddings) == ("ministral3", False)
    assert count_parameters(wrapped).main_total == L * layer + 2 * V * H + H == 8_489_553_920
    bare = load({k: v for k, v in MINISTRAL3_8B_TEXT.items() if k not in ("head_dim", "num_key_value_heads")})
    assert (bare.head_dim, bare.num_key_value_heads, count_parameters(bare).main_total) == (128, 8, 8_489_553_920)
    assert load({**MINISTRAL3_8B_TEXT, "sliding_window": 4096}).layer_windows == (4096,) * 34
    assert count_parameters(load({**MINISTRAL3_8B_TEXT, "attention_bias": True})).main_total == 8_489_553_920


# config.json field values of THUDM/GLM-4-9B-0414 (model_type glm4)
GLM4_9B = {"model_type": "glm4", "architectures": ["Glm4ForCausalLM"], "hidden_size": 4096, "intermediate_size": 13696,
           "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "vocab_size": 151552, "attention_bias": True, "partial_rotary_factor": 0.5, "tie_word_embeddings": False}


def test_glm4_dense_four_norms_and_qkv_biases():
    """GLM-4 dense (transformers ``Glm4DecoderLayer``): four RMSNorms a layer (input, post-self-attention,
    post-attention, post-MLP), ``GlmAttention``'s q/k/v with ``attention_bias`` (``Glm4Config``
    default true) and no o bias, Phi-3's fused gate/up MLP; untied. By hand 9,400,279,040 (the card's 9.4B);
    ``attention_bias`` defaults to true when the file omits it."""
    cfg = load(GLM4_9B)
    H, I, V, L, h, g, d = 4096, 13696, 151552, 40, 32, 2, 128
    assert (cfg.norms_per_layer, cfg.qkv_bias, cfg.o_bias) == (4, True, False)
    layer = gqa_layer(H, h, g, d, qkv_bias=True) + 3 * H * I + 4 * H
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 9_400_279_040
    omitted = {k: v for k, v in GLM4_9B.items() if k != "attention_bias"}
    assert count_parameters(load(omitted)).main_total == 9_400_279_040


def test_gemma2_post_norms_keep_their_inputs():
    """Gemma 2's post-attention and post-feedforward RMSNorms keep their inputs for backward
    (``2H`` bytes each per token, SP-sharded like the other norms): a layer stores 4H / s_div bytes
    more than the same layer with two norms."""
    from app.core.model.memory import layer_activation_terms

    two = load({**GEMMA2_9B, "model_type": "gemma"})  # the same shapes with Gemma's two norms
    four = load(GEMMA2_9B)
    par = ParallelConfig(tp=2, pp=1, gpus=2, sp=True, seq_length=4096)
    t2 = layer_activation_terms(two, par, ffn="dense", indexer=False)
    t4 = layer_activation_terms(four, par, ffn="dense", indexer=False)
    assert sum(t4.values()) - sum(t2.values()) == 4 * 3584 / 2


def test_a_serving_overflow_names_what_a_gqa_model_holds():
    """A model without an indexer holds no indexer cache and no top-k buffer: the refusal says
    weights and KV cache, and calls its largest term the KV cache (not an MLA latent)."""
    from app.core.evaluate import evaluate
    from app.core.plan import plan_from_query

    cfg = load(PHI3_MINI)
    plan, _ = plan_from_query({"model": cfg.id, "engine": "vllm", "pp": "2", "tp": "1", "context": "1048576"})
    reason = next(r for r in evaluate(plan, cfg).verdict.blocking if r.kind == "memory")
    assert "for weights and KV cache (pp rank" in reason.message and ": KV cache " in reason.message
    assert "top-k" not in reason.message and "latent" not in reason.message


def test_qwen3_dense_qk_norm():
    # published: 8.2B total, 6.95B non-embedding (Qwen/Qwen3-8B model card)
    cfg = load(QWEN3_8B)
    assert cfg.qk_norm and cfg.head_dim == 128
    layer = gqa_layer(4096, 32, 8, 128, qk_norm=True) + 3 * 4096 * 12288 + 2 * 4096
    r = count_parameters(cfg)
    assert r.main_total == 36 * layer + 2 * 151936 * 4096 + 4096
    assert round(r.main_total / 1e9, 1) == 8.2 and round((36 * layer + 4096) / 1e9, 2) == 6.95


def test_glm45_air_biases_dense_first_shared_expert_and_mtp():
    # published: 106B total, 12B active (zai-org/GLM-4.5-Air model card)
    cfg = load(GLM45_AIR)
    assert cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm and cfg.moe_router_bias
    assert ffn_kinds(cfg)[:2] == ("dense", "moe")
    H = 4096
    attn = gqa_layer(H, 96, 8, 128, qkv_bias=True)
    moe = 129 * 3 * H * 1408 + 128 * H
    r = count_parameters(cfg)
    assert r.main_total == 46 * (attn + 2 * H) + 3 * H * 10944 + 45 * moe + 2 * 151552 * H + H
    # the model card truncates: 106.85B total, 12.80B active (no input embedding) -> "106B", "12B"
    assert r.main_total // 10**9 == 106 and r.active // 10**9 == 12
    # one MTP layer (GLM: no own embedding / head) and 45 + 1 router score-correction biases
    mtp = attn + 2 * H + moe + 128 + 2 * H + 2 * H * H + H
    assert r.checkpoint_total == r.main_total + 45 * 128 + mtp


def test_qwen3_moe_sparse_step_and_mlp_only_layers():
    raw = {**QWEN3_8B, "model_type": "qwen3_moe", "num_hidden_layers": 6, "num_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    # layer i (0-based) is sparse iff i not in mlp_only_layers and (i + 1) % 2 == 0: 1 and 5
    assert ffn_kinds(load(raw)) == ("dense", "moe", "dense", "dense", "dense", "moe")
    with pytest.raises(ConfigError) as err:
        load({**raw, "mlp_only_layers": [9]})
    assert err.value.field == "mlp_only_layers"


def test_gqa_config_errors_name_the_field():
    with pytest.raises(ConfigError) as err:
        load({**MISTRAL_7B, "num_key_value_heads": 5})
    assert err.value.field == "num_key_value_heads"
    with pytest.raises(ConfigError) as err:
        load({**MISTRAL_7B, "hidden_size": 4100})
    assert err.value.field == "head_dim"
    with pytest.raises(ConfigError) as err:
        load({**MISTRAL_7B, "attention_bias": "yes"})
    assert err.value.field == "attention_bias"


# --------------------------------------------------------------------------- roles, memory, FLOPs, search


def test_no_indexer_means_no_boundary_constraint():
    cfg = load_model("llama-3.1-70b")
    roles = derive_roles(cfg)
    assert roles.rule == "no_indexer" and len(roles.full_layers) == 80
    assert "no DSA indexer" in roles_report(cfg, derive_roles(cfg), role_rules())["notes"][0]
    plan = materialise(PipelineSpec(split=(7, 13, 11, 9, 10, 10, 10, 10)), 80)
    assert not plan.errors and validate_boundaries(plan, roles).violations == ()


def test_llama_training_memory_by_hand():
    cfg = load_model("llama-3.1-70b")
    plan = materialise(PipelineSpec(pp=4, mtp_layers=0), 80)
    par = ParallelConfig(tp=8, pp=4, gpus=64, sp=True, seq_length=8192, mbs=1, recompute="full",
                         num_microbatches=16)
    r = training_memory(cfg, plan, par)
    H, V = 8192, 128256
    per_layer = (gqa_layer(H, 64, 8, 128) + 3 * H * 28672) // 8 + 2 * H  # TP-sharded + replicated norms
    r0 = r["stages"][0]
    assert r0["params_per_gpu"]["dense"] == 20 * per_layer + V * H // 8 and r0["params_per_gpu"]["expert"] == 0
    b = r0["breakdown_detail"]
    assert b["topk_indices"] == 0 and b["indexer_logits"] == 0  # no indexer
    # one layer's activations per token (TP8, SP): norms 4 x 2H/8, q 2*64*128/8, k and v 2*8*128/8,
    # lse 4*64/8, o input 2*64*128/8, dense fc1 4*28672/8 and act 2*28672/8
    layer = 4 * 2 * H // 8 + 2 * 8192 // 8 + 2 * (2 * 1024 // 8) + 4 * 64 // 8 + 2 * 8192 // 8 + 6 * 28672 // 8
    assert b["recompute_working_set"] == layer * 8192
    assert b["activations"] == 4 * 20 * (2 * H // 8) * 8192  # 4 in flight x 20 group inputs
    # DP = 64 / (8*4) = 2: optimizer state 12 B / 2
    assert b["optimizer_dense"] == 12 * -(-r0["params_per_gpu"]["dense"] // 2)


def test_gqa_kv_cache_shards_kv_heads_over_tp():
    cfg = load_model("llama-3.1-70b")
    # 80 layers x (K + V) x 8 heads x 128 x 2 B = 327,680 B per token on one GPU
    assert inference_memory(cfg, tp=1, context=1024)["kv"]["bytes_per_token"] == 80 * 2 * 8 * 128 * 2 == 327_680
    assert inference_memory(cfg, tp=8, context=1024)["kv"]["bytes_per_token"] == 80 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token_layer(cfg, "fp8", tp=2) == 2 * 4 * 128
    qwen = load_model("qwen3-235b-a22b")  # 4 KV heads: TP8 keeps one (replicated) per GPU
    assert kv_bytes_per_token_layer(qwen, "bf16", tp=8) == 2 * 1 * 128 * 2


def test_gqa_and_dense_mla_attention_flops():
    cfg = load_model("llama-3.1-70b")
    L = 4096
    t = token_flops(cfg, derive_roles(cfg), L)
    assert t["sparse_attention"] == 80 * 2 * 64 * L * (128 + 128)  # QK and PV over head_dim, dense
    assert t["linear"] == 2 * count_parameters(cfg).active
    assert t["indexer_scoring"] == t["indexer_projections"] == 0
    ds = load_model("deepseek-v3")
    d = token_flops(ds, derive_roles(ds), L)
    assert d["sparse_attention"] == 61 * 2 * 128 * L * (192 + 128)  # non-absorbed, Megatron's path
    dsa = load_model("deepseek-v3.2")
    s = token_flops(dsa, derive_roles(dsa), L)
    assert s["sparse_attention"] == 61 * 2 * 128 * 2048 * (576 + 512)  # absorbed, top-k 2048


def test_search_works_for_gqa_and_moe_without_shared_experts():
    qwen = load_model("qwen3-235b-a22b")
    body = search(qwen, 64, seq_length=4096, top=5,
                  space=SearchSpace(pp=(2,), cp=(1,), vpp=(1,), recompute=("full",), offload=(True,)))
    assert body["results"]
    for r in body["results"]:
        plan = materialise(PipelineSpec(split=tuple(r["split"])), 94)
        par = ParallelConfig(tp=r["tp"], cp=r["cp"], pp=r["pp"], gpus=64, ep=r["ep"], etp=r["etp"],
                             sp=r["tp"] > 1, seq_length=4096, recompute="full", optimizer_cpu_offload=True,
                             use_precision_aware_optimizer=True)
        mem = training_memory(qwen, plan, par)
        assert max(s["total_bytes"] for s in mem["stages"]) == r["max_rank_bytes"]
    # TP must divide the heads and be a multiple or divisor of the KV heads (Megatron
    # transformer_config.py): 24 heads, 3 KV heads -> TP in {1, 3, 6}, never 2, 4 or 8
    small = load({**MISTRAL_7B, "hidden_size": 768, "num_attention_heads": 24, "num_key_value_heads": 3,
                  "intermediate_size": 1536, "num_hidden_layers": 4, "vocab_size": 1200})
    tps = {r["tp"] for r in search(small, 24, seq_length=1024, top=10_000,
                                   space=SearchSpace(cp=(1,), vpp=(1,)))["results"]}
    assert tps and tps <= {1, 3, 6}
    llama = search(load_model("llama-3.1-70b"), 32, seq_length=4096, top=3,
                   space=SearchSpace(cp=(1,), vpp=(1,), recompute=("full",)))
    assert llama["results"] and all(r["ep"] == 1 for r in llama["results"])


def test_kv_heads_tp_check():
    small = load({**MISTRAL_7B, "num_attention_heads": 24, "num_key_value_heads": 3, "hidden_size": 768})
    bad = kv_heads_tp_check(small, ParallelConfig(tp=4, seq_length=8))
    assert bad is not None and not bad.ok and "TP=3 or 6" in bad.message
    good = kv_heads_tp_check(small, ParallelConfig(tp=6, seq_length=8))
    assert good is not None and good.ok and "replicated over 2" in good.message
    assert kv_heads_tp_check(load_model("glm-5.2"), ParallelConfig(tp=4, seq_length=8)) is None


def test_tp_above_kv_heads_keeps_one_whole_query_group_per_gpu():
    qwen = load_model("qwen3-235b-a22b")  # 4 KV heads; TP 8 is accepted by Megatron (8 % 4 == 0)
    roles = derive_roles(qwen)
    plan = materialise(PipelineSpec(pp=1, mtp_layers=0), 94)
    H, d = 4096, 128
    q_o = 2 * H * 64 * d  # q and o projections, split 8 ways
    kv_group = 2 * H * d  # k and v of one query group, whole on every GPU
    per_layer_gpu = q_o // 8 + kv_group + 2 * d + 2 * H + 128 * H  # + QK-norm, norms, router
    sp = stage_params(qwen, roles, list(plan.stages), tp=8, ep=8, etp=1)
    assert sp.dense_per_gpu == 94 * per_layer_gpu + -(-2 * 151936 * H // 8) + H
    assert sp.dense_total == count_parameters(qwen).main_total - 94 * 128 * 3 * H * 1536  # totals unchanged
    par = ParallelConfig(tp=8, pp=1, gpus=8, ep=8, etp=1, sp=True, seq_length=1024)
    from app.core.model.memory import layer_activation_terms
    terms = layer_activation_terms(qwen, par, ffn="moe", indexer=False)
    assert terms["k_heads"] == terms["v_heads"] == 2 * 1 * d  # one whole KV head per GPU


def test_mixtral_memory_has_no_shared_expert_terms():
    cfg = load(MIXTRAL_8X7B)
    plan = materialise(PipelineSpec(pp=2, mtp_layers=0), 32)
    par = ParallelConfig(tp=2, pp=2, ep=4, etp=1, gpus=16, sp=True, seq_length=4096, recompute="none",
                         num_microbatches=4)
    r = training_memory(cfg, plan, par)
    H = 4096
    dense = 16 * (gqa_layer(H, 32, 8, 128) // 2 + 8 * H + 2 * H) + 32000 * H // 2
    assert r["stages"][0]["params_per_gpu"] == {"dense": dense, "expert": 16 * 2 * 3 * H * 14336,
                                                "total": dense + 16 * 2 * 3 * H * 14336}


# Llama 4 (transformers models/llama4, Llama4TextConfig) as meta-llama/Llama-4-Scout-17B-16E ships its
# text_config; Maverick: 128 experts on every other layer, no q/k norm
LLAMA4_SCOUT_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                     "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                     "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1,
                     "interleave_moe_layer_step": 1, "vocab_size": 202048, "attention_chunk_size": 8192,
                     "use_qk_norm": True, "tie_word_embeddings": False}
LLAMA4_SCOUT = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                "text_config": LLAMA4_SCOUT_TEXT, "vision_config": {"hidden_size": 1408}}
LLAMA4_MAVERICK = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT_TEXT, "num_local_experts": 128,
                                                   "interleave_moe_layer_step": 2, "use_qk_norm": False}}


@pytest.mark.parametrize("raw,experts,moe_layers,published_total", [
    (LLAMA4_SCOUT, 16, 48, None),        # 109B with the vision encoder; the text model by hand below
    (LLAMA4_MAVERICK, 128, 24, 400e9),   # "17B active, 400B total" (Meta's model card)
])
def test_llama4_text_model_exact(raw, experts, moe_layers, published_total):
    """Llama4TextAttention q/k/v/o without biases (the q / k L2 norm has no weights); MoE layers of E
    experts (gate + up fused, down) of 8192, one shared expert of 8192 and a router E x H without a
    bias; the other layers a SwiGLU MLP of 16384; two RMSNorms a layer; untied embeddings of 202,048.
    17B active with the input embedding, as published for both."""
    cfg = load(raw)
    H, V = 5120, 202048
    attn = gqa_layer(H, 40, 8, 128)
    moe = experts * 3 * H * 8192 + 3 * H * 8192 + experts * H
    dense = 3 * H * 16384
    r = count_parameters(cfg)
    total = 48 * (attn + 2 * H) + moe_layers * moe + (48 - moe_layers) * dense + H + 2 * V * H
    assert r.main_total == total
    if published_total:
        assert r.main_total == pytest.approx(published_total, rel=0.005)
    active = 48 * (attn + 2 * H) + moe_layers * (2 * 3 * H * 8192 + experts * H) + (48 - moe_layers) * dense + H + V * H
    assert r.active == active and r.active + V * H == pytest.approx(17e9, rel=0.02)
    assert (cfg.model_type, cfg.qk_norm, cfg.moe_router_bias, cfg.multimodal) == ("llama4", False, False, "llama4")
    assert load(raw["text_config"]).multimodal is None  # the llama4_text file alone is the language model


def test_llama4_chunked_attention_layers():
    """Every layer but each fourth (NoPE, global attention) attends within chunks of 8192 tokens
    (``layer_types`` "chunked_attention"): at 8192 tokens or fewer that is plain causal attention; at
    20,000 tokens two whole chunks and a chunk of 3,616."""
    from app.core.model.flops import chunk_pairs, layer_flops, sequence_layer_flops

    cfg = load(LLAMA4_SCOUT)
    roles = derive_roles(cfg)
    assert [r.chunk for r in roles.layers[:8]] == [8192, 8192, 8192, 0] * 2
    assert chunk_pairs(8192, 8192) == 8192 * 8193 // 2
    assert chunk_pairs(20000, 8192) == 2 * (8192 * 8193 // 2) + 3616 * 3617 // 2
    per_pair = 2 * 40 * 2 * 128
    chunked, glob = roles.role(1), roles.role(4)
    assert sequence_layer_flops(cfg, chunked, seq_length=20000)["sparse_attention"] == per_pair * chunk_pairs(20000, 8192)
    assert sequence_layer_flops(cfg, glob, seq_length=20000)["sparse_attention"] == per_pair * 20000 * 20001 // 2
    assert layer_flops(cfg, roles, 1, 8192 + 100)["sparse_attention"] == per_pair * 100  # 100th token of chunk 2
    assert roles.layers[0].to_dict()["attention_chunk"] == 8192
    assert any("within chunks of 8192 tokens" in n for n in roles.notes)
    explicit = load({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT_TEXT, "layer_types": ["full_attention"] * 48}})
    assert all(r.chunk == 0 for r in derive_roles(explicit).layers)
    with pytest.raises(ConfigError) as exc:
        load({"model_type": "llama4", "vision_config": {}})
    assert exc.value.field == "text_config"


@pytest.mark.parametrize("change,field", [
    ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
    ({"no_rope_layers": [2] * 48}, "no_rope_layers"),
    ({"moe_layers": [48]}, "moe_layers"),
    ({"layer_types": ["sliding_attention"] * 48}, "layer_types"),
])
def test_a_llama4_layer_list_isplan_cannot_read_is_refused_naming_it(change, field):
    with pytest.raises(ConfigError) as exc:
        load({**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT_TEXT, **change}})
    assert exc.value.field == field


QWEN3_30B_A3B_TEXT = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                      "moe_intermediate_size": 768, "decoder_sparse_step": 1, "vocab_size": 151936}


def test_qwen_vl_files_are_read_through_their_language_model():
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3-VL-MoE files (transformers ``models/qwen*_vl*``): the language
    model is the Qwen2 / Qwen3 / Qwen3-MoE decoder of the same sizes - the same count as the text-only file
    (Qwen2.5-VL-7B's is Qwen2-7B's shape, 7,615,616,512 as ``test_dense_gqa_exact`` counts it), read from
    ``text_config`` or, in an early Qwen2(.5)-VL file, from the top level; Qwen3-VL never slides a window;
    the vision tower is not counted (``multimodal`` says whose language model it is)."""
    flat = {**QWEN2_7B, "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "vision_config": {"depth": 32, "hidden_size": 1280}, "use_sliding_window": False, "sliding_window": 32768}
    nested = {"model_type": "qwen2_5_vl", "tie_word_embeddings": False, "vision_config": {"depth": 32},
              "text_config": {k: v for k, v in QWEN2_7B.items() if k != "architectures"} | {"model_type": "qwen2_5_vl_text"}}
    for raw in (flat, nested, {**flat, "model_type": "qwen2_vl"}):
        cfg = load(raw)
        assert (cfg.model_type, cfg.multimodal, cfg.qkv_bias, cfg.layer_windows) == ("qwen2", raw["model_type"], True, None)
        assert count_parameters(cfg).main_total == 7_615_616_512
    qwen3_vl = {"model_type": "qwen3_vl", "tie_word_embeddings": False, "vision_config": {"depth": 27},
                "text_config": {k: v for k, v in QWEN3_8B.items() if k != "architectures"}
                | {"model_type": "qwen3_vl_text", "use_sliding_window": True, "sliding_window": 4096}}
    cfg = load(qwen3_vl)
    assert (cfg.model_type, cfg.qk_norm, cfg.layer_windows, cfg.multimodal) == ("qwen3", True, None, "qwen3_vl")
    assert count_parameters(cfg).main_total == count_parameters(load(QWEN3_8B)).main_total
    moe = {"model_type": "qwen3_vl_moe", "tie_word_embeddings": False, "vision_config": {"depth": 27},
           "text_config": {**QWEN3_30B_A3B_TEXT, "model_type": "qwen3_vl_moe_text"}}
    text_only = load({**QWEN3_30B_A3B_TEXT, "model_type": "qwen3_moe", "tie_word_embeddings": False})
    assert count_parameters(load(moe)).main_total == count_parameters(text_only).main_total
    # Qwen3VLMoeTextConfig's defaults, not Qwen3MoeConfig's, fill what a file omits
    bare = load({**moe, "text_config": {k: v for k, v in moe["text_config"].items()
                                        if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}})
    assert (bare.n_routed_experts, bare.num_experts_per_tok, bare.moe_intermediate_size) == (60, 4, 1408)
    for bad in ({"model_type": "qwen3_vl", "vision_config": {}},  # no language model
                {**moe, "text_config": {**moe["text_config"], "model_type": ["qwen3_vl_moe_text"]}},  # found by fuzzing
                {**moe, "text_config": {**moe["text_config"], "model_type": {"a": 1}}}):
        with pytest.raises(ConfigError) as err:
            load(bad)
        assert err.value.field == "text_config"


def test_glm_v_files_are_read_through_their_language_model():
    """GLM-4.1V (``glm4v``) and GLM-4.5V (``glm4v_moe``) files: the language model is GLM-4's decoder
    (``Glm4vTextDecoderLayer``: four norms, q/k/v biases always, ``head_dim`` H / h whatever the file
    says) and GLM-4.5's MoE with ``Glm4Attention`` (no QK-norm) and no MTP layer built - the counts of
    the text-only files of the same sizes (GLM-4-9B-0414's 9,400,279,040; GLM-4.5-Air's main count)."""
    text = {k: v for k, v in GLM4_9B.items() if k != "architectures"}
    glm41v = load({"model_type": "glm4v", "vision_config": {"depth": 24},
                   "text_config": {**text, "model_type": "glm4v_text", "attention_bias": False, "head_dim": 256}})
    assert (glm41v.model_type, glm41v.multimodal, glm41v.head_dim, glm41v.qkv_bias) == ("glm4", "glm4v", 128, True)
    assert count_parameters(glm41v).main_total == 9_400_279_040
    air = {k: v for k, v in GLM45_AIR.items() if k != "architectures"}
    glm45v = load({"model_type": "glm4v_moe", "vision_config": {"depth": 24},
                   "text_config": {**air, "model_type": "glm4v_moe_text", "use_qk_norm": True}})
    reference = count_parameters(load(GLM45_AIR))
    assert (glm45v.model_type, glm45v.qk_norm, glm45v.num_nextn_predict_layers) == ("glm4_moe", False, 0)
    assert count_parameters(glm45v).main_total == reference.main_total
    assert count_parameters(glm45v).checkpoint_total < reference.checkpoint_total  # no MTP layer
    bare = load({"model_type": "glm4v_moe", "text_config": {k: v for k, v in air.items() if k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")}})
    assert (bare.vocab_size, bare.n_routed_experts, bare.moe_intermediate_size, bare.qkv_bias) == (151424, 128, 1408, True)


def test_a_config_with_more_mtp_layers_than_a_plan_may_build_is_refused():
    """A plan builds the config's MTP layers unless told otherwise, and a plan's MTP count is bounded
    (``MAX_MTP_LAYERS``, 16): a config with more is refused when it is read, naming the field, rather
    than failing every check later under a flag the user never typed."""
    from app.core.plan.bounds import MAX_MTP_LAYERS

    assert load({**GLM45_AIR, "num_nextn_predict_layers": MAX_MTP_LAYERS}).num_nextn_predict_layers == MAX_MTP_LAYERS
    with pytest.raises(ConfigError) as err:
        load({**GLM45_AIR, "num_nextn_predict_layers": MAX_MTP_LAYERS + 1})
    assert err.value.field == "num_nextn_predict_layers"


# config.json field values of baidu/ERNIE-4.5-0.3B-PT (ernie4_5, dense)
ERNIE45_03B = {"model_type": "ernie4_5", "architectures": ["Ernie4_5ForCausalLM"], "hidden_size": 1024,
               "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
               "head_dim": 128, "vocab_size": 103424, "hidden_act": "silu", "use_bias": False, "tie_word_embeddings": True}


def test_ernie45_dense_is_llamas_shapes_with_use_bias_everywhere():
    """ERNIE 4.5 dense (transformers ``modular_ernie4_5.py``): Llama's attention and MLP with
    ``bias=config.use_bias`` on q, k, v, o, gate, up and down (the output layer has none), tied unless
    said, ``Ernie4_5Config`` defaults ``head_dim`` 128 and 2 KV heads. h d = 2,048 differs from H = 1,024.
    By hand: a layer 4,718,592 + 3 H I + 2 H = 14,157,824; 18 of them, one 103,424 x 1,024 table and the
    final norm: 360,748,032 (the card's 0.36B)."""
    cfg = load(ERNIE45_03B)
    H, I, V, L, h, g, d = 1024, 3072, 103424, 18, 16, 2, 128
    layer = gqa_layer(H, h, g, d) + 3 * H * I + 2 * H
    assert layer == 14_157_824
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 360_748_032
    biased = load({**ERNIE45_03B, "use_bias": True, "attention_bias": False})
    assert (biased.qkv_bias, biased.o_bias, biased.mlp_bias) == (True, True, True)
    assert count_parameters(biased).main_total - 360_748_032 == L * ((h + 2 * g) * d + H + 2 * I + H)
    bare = load({k: v for k, v in ERNIE45_03B.items() if k not in ("head_dim", "num_key_value_heads", "tie_word_embeddings")})
    assert (bare.head_dim, bare.num_key_value_heads, bare.tie_word_embeddings) == (128, 2, True)


# config.json field values of ByteDance-Seed/Seed-OSS-36B-Base
SEED_OSS_36B = {"model_type": "seed_oss", "architectures": ["SeedOssForCausalLM"], "hidden_size": 5120,
                "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8,
                "head_dim": 128, "vocab_size": 155136, "attention_bias": True, "attention_out_bias": False,
                "mlp_bias": False, "tie_word_embeddings": False}


def test_seed_oss_biases_qkv_and_output_by_their_own_flags():
    """Seed-OSS (transformers ``models/seed_oss``): Llama's decoder, q/k/v biases by ``attention_bias``
    (default true), the output projection's by ``attention_out_bias`` (default false), the MLP's by
    ``mlp_bias``. By hand: a layer q/k/v/o 115,343,360 + the q/k/v biases 12,288 + 3 H I (424,673,280) +
    2 H = 540,039,168; 64 of them, two 155,136 x 5,120 tables and the final norm: 36,151,104,512 (36B)."""
    cfg = load(SEED_OSS_36B)
    H, I, V, L, h, g, d = 5120, 27648, 155136, 64, 80, 8, 128
    layer = gqa_layer(H, h, g, d, qkv_bias=True) + 3 * H * I + 2 * H
    assert layer == 540_039_168
    assert count_parameters(cfg).main_total == L * layer + 2 * V * H + H == 36_151_104_512
    out_biased = load({**SEED_OSS_36B, "attention_out_bias": True})
    assert (out_biased.qkv_bias, out_biased.o_bias) == (True, True)
    assert count_parameters(out_biased).main_total - count_parameters(cfg).main_total == L * H
    bare = load({k: v for k, v in SEED_OSS_36B.items() if k not in ("attention_bias", "head_dim", "num_key_value_heads")})
    assert (bare.qkv_bias, bare.head_dim, bare.num_key_value_heads) == (True, 128, 8)


# config.json field values of bigcode/starcoder2-3b
STARCODER2_3B = {"model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "hidden_size": 3072,
                 "intermediate_size": 12288, "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
                 "vocab_size": 49152, "hidden_act": "gelu_pytorch_tanh", "sliding_window": 4096, "use_bias": True,
                 "norm_epsilon": 1e-05, "tie_word_embeddings": True}


def test_starcoder2_is_mistrals_attention_with_biases_and_a_gelu_mlp():
    """StarCoder2 (transformers ``modular_starcoder2.py``): q/k/v/o with ``use_bias``, a 2-matrix GELU MLP
    (``c_fc`` / ``c_proj``, biased), two LayerNorms with biases a layer and a final one, a window on every
    layer (Mistral's attention), tied. By hand: attention 20,447,232 + biases 6,656; MLP 2 H I + I + H =
    75,512,832; norms 4 H: a layer 95,979,008; 30 of them, one 49,152 x 3,072 table and the final norm
    (2 H): 3,030,371,328 (the card's 3B)."""
    cfg = load(STARCODER2_3B)
    H, I, V, L, h, g, d = 3072, 12288, 49152, 30, 24, 2, 128
    layer = gqa_layer(H, h, g, d, qkv_bias=True, o_bias=True) + 2 * H * I + I + H + 4 * H
    assert layer == 95_979_008
    assert count_parameters(cfg).main_total == L * layer + V * H + 2 * H == 3_030_371_328
    assert (cfg.gated_mlp, cfg.norm_bias, cfg.layer_windows) == (False, True, (4096,) * 30)
    unbiased = load({**STARCODER2_3B, "use_bias": False})
    assert count_parameters(cfg).main_total - count_parameters(unbiased).main_total == L * ((h + 2 * g) * d + H + I + H)


# config.json field values of CohereLabs/c4ai-command-a-03-2025 (cohere2)
COMMAND_A = {"model_type": "cohere2", "architectures": ["Cohere2ForCausalLM"], "hidden_size": 12288,
             "intermediate_size": 36864, "num_hidden_layers": 64, "num_attention_heads": 96, "num_key_value_heads": 8,
             "vocab_size": 256000, "hidden_act": "silu", "sliding_window": 4096, "sliding_window_pattern": 4,
             "attention_bias": False, "logit_scale": 0.25, "tie_word_embeddings": True}


def test_cohere2_has_one_norm_a_layer_head_dim_h_over_heads_and_tied_embeddings():
    """Cohere2 (transformers ``modular_cohere2.py``): one weight-only LayerNorm a layer before attention and
    the MLP (run in parallel), ``head_dim`` H / h whatever the file says, q/k/v/o biases by
    ``attention_bias``, tied; windows on the layers ``layer_types`` marks, by default 3 of 4
    (``sliding_window_pattern``). By hand: a layer q/k/v/o 327,155,712 + 3 H I + H = 1,686,122,496; 64 of them,
    one 256,000 x 12,288 table and the final norm: 111,057,580,032 (Command A's 111B)."""
    cfg = load(COMMAND_A)
    H, I, V, L, h, g, d = 12288, 36864, 256000, 64, 96, 8, 128
    layer = gqa_layer(H, h, g, d) + 3 * H * I + H
    assert layer == 1_686_122_496
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 111_057_580_032
    assert (cfg.norms_per_layer, cfg.head_dim, cfg.tie_word_embeddings) == (1, 128, True)
    assert cfg.layer_windows == (4096, 4096, 4096, 0) * 16
    assert load({**COMMAND_A, "head_dim": 256}).head_dim == 128
    assert load({**COMMAND_A, "hidden_size": 12288.0}).head_dim == 128 and isinstance(
        load({**COMMAND_A, "hidden_size": 12288.0}).head_dim, int)  # a whole float is read as the integer
    assert load({**COMMAND_A, "layer_types": ["full_attention"] * 64}).layer_windows is None


# config.json field values of CohereLabs/c4ai-command-r-plus (cohere)
COMMAND_R_PLUS = {"model_type": "cohere", "architectures": ["CohereForCausalLM"], "hidden_size": 12288,
                  "intermediate_size": 33792, "num_hidden_layers": 64, "num_attention_heads": 96, "num_key_value_heads": 8,
                  "vocab_size": 256000, "hidden_act": "silu", "use_qk_norm": True, "attention_bias": False,
                  "logit_scale": 0.8333333333333334, "tie_word_embeddings": True}


def test_cohere_command_r_plus_counts_its_per_head_qk_layernorms():
    """Cohere (transformers ``models/cohere``): Llama's attention, with ``use_qk_norm`` a weight-only LayerNorm
    over (heads, head_dim) on q and (KV heads, head_dim) on k, one input LayerNorm a layer (attention and MLP
    in parallel), tied, no window. By hand: a layer 327,155,712 + (96 + 8) 128 + 3 H I + H = 1,572,889,600;
    64 of them, one 256,000 x 12,288 table and the final norm: 103,810,674,688 (Command R+'s 104B)."""
    cfg = load(COMMAND_R_PLUS)
    H, I, V, L, h, g, d = 12288, 33792, 256000, 64, 96, 8, 128
    layer = gqa_layer(H, h, g, d) + (h + g) * d + 3 * H * I + H
    assert layer == 1_572_889_600
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 103_810_674_688
    assert (cfg.norms_per_layer, cfg.qk_norm_full, cfg.layer_windows) == (1, True, None)
    assert count_parameters(load({**COMMAND_R_PLUS, "use_qk_norm": False})).main_total == 103_810_674_688 - L * (h + g) * d


# config.json field values of ibm-granite/granite-3.0-3b-a800m-base (granitemoe)
GRANITE3_MOE_3B = {"model_type": "granitemoe", "architectures": ["GraniteMoeForCausalLM"], "hidden_size": 1536,
                   "intermediate_size": 512, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
                   "num_local_experts": 40, "num_experts_per_tok": 8, "vocab_size": 49155, "attention_bias": False,
                   "attention_multiplier": 0.015625, "embedding_multiplier": 12.0, "logits_scaling": 6.0,
                   "residual_multiplier": 0.22, "tie_word_embeddings": True}


def test_granite_moe_is_mixtral_experts_on_granites_attention():
    """Granite 3 MoE (transformers ``modular_granitemoe.py``): Llama's attention, every layer 40 gated
    experts of ``intermediate_size`` 512 (``input_linear`` E x 2I x H, ``output_linear`` E x H x I) with a
    bias-free router, top-8; tied. By hand: a layer 6,291,456 + 40 x 3 H I + 40 H + 2 H = 100,727,808; 32
    of them, one 49,155 x 1,536 table and the final norm: 3,298,793,472 (the 3B-A800M's 3.3B).
    ``granitemoeshared`` adds a shared MLP of ``shared_intermediate_size`` (here 1024: two expert widths)."""
    cfg = load(GRANITE3_MOE_3B)
    H, I, V, L, h, g, d, E = 1536, 512, 49155, 32, 24, 8, 64, 40
    layer = gqa_layer(H, h, g, d) + E * 3 * H * I + E * H + 2 * H
    assert layer == 100_727_808
    assert count_parameters(cfg).main_total == L * layer + V * H + H == 3_298_793_472
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts, cfg.moe_router_bias) == (40, 8, 0, False)
    shared = load({**GRANITE3_MOE_3B, "model_type": "granitemoeshared", "shared_intermediate_size": 1024})
    assert shared.n_shared_experts == 2
    assert count_parameters(shared).main_total - count_parameters(cfg).main_total == L * 3 * H * 1024
    with pytest.raises(ConfigError) as err:
        load({**GRANITE3_MOE_3B, "model_type": "granitemoeshared", "shared_intermediate_size": 700})
    assert err.value.field == "shared_intermediate_size"


def test_mimo_is_qwen2_with_mtp_layers():
    """Xiaomi MiMo-7B (slime ``scripts/models/mimo-7B-rl.sh`` @ 624b824a: 36 layers of 4096, 32 heads in 8
    groups, 11008, vocabulary 151,680, q/k/v biases, untied, one MTP layer). By hand: a layer is q 4096^2 +
    4096, k and v 4096 x 1024 + 1024 each, o 4096^2, gate / up / down 3 x 4096 x 11008 and two norms; the MTP
    layer one more such layer plus its two input norms, ``eh_proj`` 2 x 4096^2 and its final norm."""
    H = 4096
    raw = {"model_type": "mimo", "architectures": ["MiMoForCausalLM"], "hidden_size": H, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 11008, "vocab_size": 151680,
           "tie_word_embeddings": False, "num_nextn_predict_layers": 1, "max_position_embeddings": 32768}
    cfg = load_config_bytes(json.dumps(raw).encode())
    layer = H * H + H + 2 * (H * 1024 + 1024) + H * H + 3 * H * 11008 + 2 * H
    r = count_parameters(cfg)
    assert r.main_total == 36 * layer + 2 * 151680 * H + H == 7_622_619_136
    assert r.checkpoint_total - r.main_total == layer + 2 * H + 2 * H * H + H
    assert cfg.qkv_bias and not cfg.o_bias and cfg.num_nextn_predict_layers == 1


@pytest.mark.parametrize("text_type", ["kimi_k2", "deepseek_v3"])
def test_kimi_k2_5_is_read_through_its_text_config(text_type):
    """Kimi K2.5 / K2.6 files wrap Kimi K2's language model (``KimiK25ForConditionalGeneration``,
    ``text_config`` of type ``kimi_k2`` or ``deepseek_v3``): the same parameters as the Kimi-K2 preset,
    the vision tower not counted and said so."""
    raw = json.loads((REPO / "app/core/presets/kimi-k2.json").read_text())
    wrapped = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
               "tie_word_embeddings": False, "vision_config": {"hidden_size": 1152},
               "text_config": {**raw, "model_type": text_type}}
    cfg = load_config_bytes(json.dumps(wrapped).encode())
    assert cfg.multimodal == "kimi_k25" and cfg.attention == "mla"
    assert count_parameters(cfg).main_total == count_parameters(load_model("kimi-k2")).main_total
