"""Gated DeltaNet models (HF ``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text`` and the ``qwen3_5`` /
``qwen3_5_moe`` wrappers: Qwen3-Next, Qwen3.5 / 3.6): the config reader, roles, parameters, FLOPs,
Megatron-Bridge's model FLOPs, memory, Megatron's parallel rule and the step time. Every expected
number is worked out here from the module shapes (transformers ``modeling_qwen3_next.py``; Megatron
``megatron/core/ssm/gated_delta_net``) or from Megatron-Bridge's formula re-implemented below."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.core.engines.megatron.parallel import gdn_rule
from app.core.model.config import ConfigError, load_config_bytes
from app.core.model.flops import causal_pairs, layer_flops, sequence_layer_flops, token_flops
from app.core.model.memory import layer_activation_terms, serving_kv
from app.core.model.parallelism import ParallelConfig
from app.core.model.parameters import count_parameters, stage_params
from app.core.model.roles import derive_roles

#: Qwen3-Next-80B-A3B: ``Qwen3NextConfig``'s defaults are its sizes (the class docstring: "defaults will
#: yield a similar configuration to that of Qwen3-Next-80B-A3B-Instruct"); stated here as its file does
NEXT = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "intermediate_size": 5120, "vocab_size": 151936, "num_experts": 512, "num_experts_per_tok": 10,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "decoder_sparse_step": 1,
        "tie_word_embeddings": False}
#: Qwen3.5-35B-A3B as its file nests it (``Qwen3_5MoeConfig`` -> ``text_config``), 40 layers, 256 experts
QWEN35 = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
          "tie_word_embeddings": False, "vision_config": {"depth": 27},
          "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
                          "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                          "vocab_size": 248320, "num_experts": 256, "num_experts_per_tok": 8,
                          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                          "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                          "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                          "mtp_num_hidden_layers": 1}}
H = 2048
#: gated attention: q_proj makes 16 x 256 queries and as many gates, k / v 2 x 256 each, o_proj, q / k norms
ATTENTION = H * 2 * 4096 + 2 * H * 512 + 4096 * H + 2 * 256
#: gated DeltaNet: in_proj_qkvz H x (2 x 2048 + 2 x 4096), in_proj_ba H x 64, depthwise conv (2 x 2048 + 4096)
#: x 4 without bias, dt_bias and A_log 32 each, the gated norm's 128 gains, out_proj 4096 x H
GDN = H * 12288 + H * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * H


def _moe(experts: int) -> int:
    """Routed experts (gate, up, down of 512), one shared expert of 512, the router, the shared gate."""
    return experts * 3 * H * 512 + 3 * H * 512 + experts * H + H


def load(raw: dict):
    return load_config_bytes(json.dumps(raw).encode())


def test_qwen3_next_counts_by_hand_and_as_published():
    """12 gated-attention and 36 gated-DeltaNet layers (every fourth full), each with an MoE block and two
    RMSNorms, a final norm, untied embeddings: 79.67B, the card's "80B total, 3B activated"."""
    cfg = load(NEXT)
    r = count_parameters(cfg)
    total = 12 * ATTENTION + 36 * GDN + 48 * (_moe(512) + 2 * H) + H + 2 * 151936 * H
    assert r.main_total == total == 79_674_391_296
    active = 12 * ATTENTION + 36 * GDN + 48 * (10 * 3 * H * 512 + 3 * H * 512 + 512 * H + H + 2 * H) + H + 151936 * H
    assert r.active == active and 3.0e9 < active - 151936 * H < 3.4e9   # "3B activated" without the head
    assert r.breakdown["gdn"] == 36 * GDN and r.breakdown["attention"] == 12 * ATTENTION
    assert r.checkpoint_total == r.main_total   # Qwen's router has no score-correction bias
    roles = derive_roles(cfg)
    assert [r.mixer for r in roles.layers[:8]] == ["gdn", "gdn", "gdn", "attention"] * 2
    assert any(n.startswith("36 gated DeltaNet (linear attention) and 12 gated softmax attention layers; "
                            "attention on layers 4, 8, 12,") for n in roles.notes)


def test_the_config_classes_defaults_are_qwen3_next_80b():
    """A file that states only the required sizes reads the rest at ``Qwen3NextConfig``'s defaults."""
    bare = {k: NEXT[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "vocab_size")}
    assert count_parameters(load(bare)).main_total == 79_674_391_296


def test_qwen3_5_moe_is_read_through_its_text_config_with_its_mtp_layer():
    """The wrapper's language model: 10 attention + 30 DeltaNet layers over 256 experts (34.66B without
    the vision tower, the card's 35B with it); ``mtp_num_hidden_layers`` is Megatron-Bridge's MTP count."""
    cfg = load(QWEN35)
    assert cfg.multimodal == "qwen3_5_moe" and cfg.num_nextn_predict_layers == 1
    total = 10 * ATTENTION + 30 * GDN + 40 * (_moe(256) + 2 * H) + H + 2 * 248320 * H
    assert count_parameters(cfg).main_total == total == 34_660_610_688


def test_qwen3_next_dense_layers_and_a_qwen3_5_dense_model():
    """``mlp_only_layers`` turn MoE blocks into an MLP of ``intermediate_size`` (Qwen3-MoE's rule);
    Qwen3.5's dense model has one on every layer and must state its width."""
    cfg = load({**NEXT, "mlp_only_layers": [0, 5]})
    roles = derive_roles(cfg)
    assert [r.ffn for r in roles.layers[:6]] == ["dense", "moe", "moe", "moe", "moe", "dense"]
    diff = count_parameters(load(NEXT)).main_total - count_parameters(cfg).main_total
    assert diff == 2 * (_moe(512) - 3 * H * 5120)
    text = {"model_type": "qwen3_5_text", "hidden_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 16,
            "vocab_size": 1000}
    with pytest.raises(ConfigError) as err:
        load({"model_type": "qwen3_5", "text_config": text})
    assert err.value.field == "intermediate_size"
    dense = load({"model_type": "qwen3_5", "text_config": {**text, "intermediate_size": 12288}})
    assert {r.ffn for r in derive_roles(dense).layers} == {"dense"}


@pytest.mark.parametrize("change,field", [
    ({"linear_num_value_heads": 24}, "linear_num_value_heads"),   # not a multiple of the 16 key heads
    ({"linear_key_head_dim": 0}, "linear_key_head_dim"),
    ({"layer_types": ["linear_attention"] * 47}, "layer_types"),
    ({"layer_types": ["mamba"] * 48}, "layer_types"),
    ({"full_attention_interval": 0}, "full_attention_interval"),
    ({"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": True}, "mtp_use_dedicated_embeddings"),
])
def test_a_gdn_config_isplan_cannot_read_is_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        load({**NEXT, **change})
    assert err.value.field == field


def test_layer_types_override_the_interval():
    cfg = load({**NEXT, "layer_types": ["full_attention"] * 2 + ["linear_attention"] * 46})
    assert cfg.layer_attention[:3] == ("attention", "attention", "gdn")
    assert count_parameters(cfg).breakdown["gdn"] == 46 * GDN


def test_flops_follow_each_layers_mixer():
    """``linear`` stays twice the active weights; the delta rule ``8 Hv dk dv`` a token on DeltaNet
    layers only, attention ``2 h (2 d)`` a query-key pair on the full layers only."""
    cfg = load(NEXT)
    roles = derive_roles(cfg)
    t = token_flops(cfg, roles, 4096)
    assert t["linear"] == 2 * count_parameters(cfg, roles).active
    assert t["ssm_scan"] == 36 * 8 * 32 * 128 * 128
    assert t["sparse_attention"] == 12 * 2 * 16 * 2 * 256 * 4096
    assert layer_flops(cfg, roles, 1, 4096)["sparse_attention"] == 0
    seq = sequence_layer_flops(cfg, roles.role(4), seq_length=8192)
    assert (seq["ssm_scan"], seq["sparse_attention"]) == (0, 2 * 16 * 512 * causal_pairs(8192))


def _bridge_model_flops(s: int) -> int:
    """Megatron-Bridge ``flop_utils.py`` (@ 067f987d) per token for Qwen3-Next, re-implemented: MLP
    ``6 H (i topk 3 + i_shared 3)`` on 48 MoE layers; standard attention per layer ``6 (H (q + k + v + gate)
    + q H + q s)`` (q = 4096, k = v = 512, the gate q), replaced on the 36 DeltaNet layers by
    ``6 (H (2 qk + 2 v + 2 Hv) + C (2 qk + v) + 4 Hv dv^2 + H v)``; logits ``6 H V`` (151,936 is a
    multiple of 128)."""
    mlp = 6 * H * (512 * 10 * 3 + 512 * 3) * 48
    std = 6 * (H * (4096 + 512 + 512 + 4096) + 4096 * H + 4096 * s)
    gdn = 6 * (H * (2 * 2048 + 2 * 4096 + 2 * 32) + 4 * (2 * 2048 + 4096) + 4 * 32 * 128 ** 2 + H * 4096)
    return mlp + 12 * std + 36 * gdn + 6 * H * 151936


@pytest.mark.parametrize("s", [4096, 32768])
def test_model_flops_follow_megatron_bridges_gdn_count(s):
    from app.core.time.model_flops import model_flops_per_token

    assert model_flops_per_token(load(NEXT), seq_length=s) == _bridge_model_flops(s)


def test_activation_memory_and_serving_state_of_a_deltanet_layer():
    """Per token at TP 2 (SP): the norms' inputs and outputs, the in_proj output (2 x 12352 / 2), the
    rule's q and k on 32 heads and v (2 x (2 x 4096 + 4096) / 2), the FP32 gates and rstd (10 x 32 / 2),
    the FP32 chunk matrix (4 x 32 x 64 / 2), the rule's output and the out_proj input (2 x 4096 / 2 each);
    gated attention keeps its gate's input too. Serving keeps KV on the 12 attention layers only and a
    state per sequence on the 36 others: conv window 8192 x 3 and state 32 x 128 x 128 in the model's BF16
    (in FP32 when the file's ``mamba_ssm_dtype`` says so, as Qwen3.5's do)."""
    cfg = load(NEXT)
    par = ParallelConfig(tp=2, pp=1, gpus=2, sp=True, seq_length=4096)
    g = layer_activation_terms(cfg, par, ffn="moe", indexer=False, mixer="gdn")
    assert {k: v for k, v in g.items() if k.startswith("gdn_")} == {
        "gdn_in_proj_output": 12352, "gdn_rule_inputs": 12288, "gdn_gates": 160, "gdn_chunk_matrix": 4096,
        "gdn_rule_output": 4096, "gdn_out_proj_input": 4096}
    assert "q_heads" not in g and g["attn_norm_input"] == H
    a = layer_activation_terms(cfg, par, ffn="moe", indexer=False, mixer="attention")
    assert a["attn_gate"] == a["attn_output"] == 2 * 4096 / 2
    kv = serving_kv(cfg, derive_roles(cfg), kv_dtype="bf16", tp=1, n_mtp=0)
    assert (kv["layers"], kv["bytes_per_token"]) == (12, 12 * 2 * 2 * 256 * 2)
    assert kv["mamba_bytes_per_sequence"] == 36 * (2 * 8192 * 3 + 2 * 32 * 128 * 128)
    fp32 = load({**NEXT, "mamba_ssm_dtype": "float32"})
    kv32 = serving_kv(fp32, derive_roles(fp32), kv_dtype="bf16", tp=1, n_mtp=0)
    assert kv32["mamba_bytes_per_sequence"] == 36 * (2 * 8192 * 3 + 4 * 32 * 128 * 128)
    with pytest.raises(ConfigError) as err:
        load({**NEXT, "mamba_ssm_dtype": "fp8"})
    assert err.value.field == "mamba_ssm_dtype"


def test_a_deltanets_weights_split_over_tp_but_its_norm():
    """Per GPU at TP 2, turning one attention layer into a DeltaNet layer changes the weights by the
    DeltaNet's share, ``(GDN - 128) / 2 + 128`` (its norm's gains whole), less the attention's,
    ``(ATTENTION - 512) / 2 + 512`` (the q / k norms whole)."""
    from app.core.engines.megatron.placement import materialise
    from app.core.layout.stages import PipelineSpec

    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12
    base, flipped = load({**NEXT, "layer_types": types}), load({**NEXT, "layer_types": ["linear_attention"] + types[1:3]
                                                                 + ["linear_attention"] + types[4:]})
    stages = list(materialise(PipelineSpec(split=(48,)), 48).stages)
    per_gpu = [stage_params(c, derive_roles(c), stages, tp=2).dense_per_gpu for c in (base, flipped)]
    assert per_gpu[1] - per_gpu[0] == ((GDN - 128) // 2 + 128) - ((ATTENTION - 512) // 2 + 512)


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_megatrons_gdn_heads_rule_against_its_assert(tp, cp):
    """``TransformerConfig.__post_init__``: both head counts a multiple of TP x CP, re-implemented."""
    cfg = load({**NEXT, "linear_num_key_heads": 8, "linear_num_value_heads": 32})
    checks = gdn_rule(cfg, ParallelConfig(tp=tp, pp=1, cp=cp, gpus=tp * cp, seq_length=4096), None)
    expected = [kind for kind, heads in (("key", 8), ("value", 32)) if heads % (tp * cp)]
    assert [c.name.split("_")[1] for c in checks] == expected
    for c in checks:
        heads = 8 if "key" in c.name else 32
        assert c.name.endswith("_tp" if heads % tp else "_cp") and not c.ok
        assert f"must be a multiple of (self.tensor_model_parallel_size={tp} * self.context_parallel_size={cp})" \
            in c.message


def test_a_qwen3_next_plan_is_judged_and_timed_through_the_cli(tmp_path):
    """``isplan time`` on an uploaded-style file: a verdict, a step time whose DeltaNet layers pay their
    rule, a CP all-to-all, and the note that no measured run backs it."""
    path = tmp_path / "qwen3-next.json"
    path.write_text(json.dumps(NEXT))
    out = subprocess.run([sys.executable, "-m", "app", "time", str(path), "--pp", "4", "--tp", "2", "--sp",
                          "--cp", "2", "--ep", "8", "--dp", "8", "--mbs", "1", "--global-batch", "256",
                          "--seq-length", "8192", "--gpu", "h100-80gb", "--precision", "bf16", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    body = json.loads(out.stdout)
    t = body["time"]
    assert t["tokens_per_second_per_gpu"] > 0 and t["breakdown"]["cp"]["total"] > 0
    assert any("unvalidated" in n for n in t["notes"])
    assert "linear_num" not in json.dumps(body["verdict"])   # 16 and 32 heads split over TP 2 x CP 2


def test_a_serving_rank_holds_kv_on_its_attention_layers_and_a_state_per_sequence():
    """vLLM at TP 4, two ranks of 24 layers (6 attention, 18 DeltaNet each), 32k context, 8 sequences:
    KV of the 6 attention layers (2 KV heads of 256, K and V, BF16; TP 4 above the 2 heads keeps one
    whole head a GPU) for every token, plus each DeltaNet layer's conv window and BF16 state over TP."""
    from app.core.engines.serving import engine_roles, serving_plan
    from app.core.model.serving_memory import ServingMemorySettings, serving_memory

    cfg = load(NEXT)
    roles, _ = engine_roles(cfg, "vllm")
    plan = serving_plan(cfg, "vllm", 2, "24,24")
    report = serving_memory(cfg, plan, roles, ServingMemorySettings(tp=4, context=32768, concurrency=8))
    kv = 6 * 2 * 1 * 256 * 2 * 32768 * 8
    state = 18 * (2 * 8192 * 3 + 2 * 32 * 128 * 128) / 4 * 8
    assert [r.kv_latent for r in report.ranks] == [kv + round(state)] * 2


def test_gdn_norm_out_recompute_is_accepted_on_a_deltanet_model_and_drops_the_out_proj_input(tmp_path):
    """Megatron refuses ``gdn_norm_out`` without a GatedDeltaNet variant (``transformer_config.py``) and,
    with one, discards the norm's output - out_proj's input - to rebuild it before the backward: the
    memory drops that term, the time model re-runs the norm (its 6 V bytes a token) and nothing else."""
    from app.core.engines.megatron.parallel import recompute_modules_rule
    from app.core.model.gated_delta_net import GdnDims
    from app.core.model.memory import selective_dropped

    par = ParallelConfig(tp=1, pp=1, gpus=1, seq_length=4096, recompute="selective",
                         recompute_modules=("gdn_norm_out",))
    assert recompute_modules_rule(load(NEXT), par, None) == []
    dense = load_config_bytes(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                          "num_attention_heads": 4, "vocab_size": 100,
                                          "intermediate_size": 128}).encode())
    assert [c.name for c in recompute_modules_rule(dense, par, None)] == ["recompute_gdn_norm_out"]
    assert selective_dropped(load(NEXT), ("gdn_norm_out",), "moe") == {"gdn_out_proj_input"}
    assert GdnDims(16, 32, 128, 128, 4).norm_bytes_per_token() == 6 * 4096
    path = tmp_path / "next.json"
    path.write_text(json.dumps({**NEXT, "max_position_embeddings": 4096}))

    def timed(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "app", "time", str(path), "--pp", "4", "--ep", "8", "--dp", "8",
                              "--mbs", "1", "--global-batch", "64", "--seq-length", "4096", "--gpu", "h100-80gb",
                              "--precision", "bf16", "--format", "json", *extra], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode in (0, 1), out.stderr
        return json.loads(out.stdout)["time"]["breakdown"]["recompute"]

    assert timed()["total"] == 0 < timed("--recompute", "selective", "--recompute-modules", "gdn_norm_out")["total"]


def test_an_ungated_attention_file_counts_no_gate():
    """``attn_output_gate: false`` (vLLM reads it, default true): q_proj makes the queries alone, so each of
    the 12 attention layers holds H x 16 x 256 fewer weights."""
    gated, plain = load(NEXT), load({**NEXT, "attn_output_gate": False})
    assert gated.attention_output_gate and not plain.attention_output_gate
    assert count_parameters(gated).main_total - count_parameters(plain).main_total == 12 * H * 4096


CLIENT_OPTIONS = dict(follow_redirects=False)


def test_an_uploaded_qwen3_5_is_timed_alike_by_the_api_and_the_cli(client, tmp_path):
    """One evaluation: the same Qwen3.5 file uploaded to the page and given to ``isplan time`` gets the same
    step time (every term) and the same verdict reasons."""
    from urllib.parse import parse_qsl

    data = json.dumps({**QWEN35, "text_config": {**QWEN35["text_config"], "max_position_embeddings": 32768}})
    path = tmp_path / "qwen3.5.json"
    path.write_text(data)
    r = client.post("/upload", files={"file": ("q.json", data.encode(), "application/json")}, data={"query": ""})
    assert r.status_code == 303, r.text[:300]
    model = dict(parse_qsl(r.headers["location"].split("?", 1)[1]))["model"]
    query = {"model": model, "engine": "megatron", "split": "10,10,10,10", "tp": "2", "sp": "1", "ep": "8", "etp": "1",
             "dp": "4", "mbs": "1", "global_batch": "128", "seq_length": "4096", "gpu": "h100-80gb", "precision": "fp8"}
    api = client.get("/api/v1/time", params=query)
    assert api.status_code == 200, api.text[:300]
    cli = subprocess.run([sys.executable, "-m", "app", "time", str(path), "--engine", "megatron", "--split",
                          "10,10,10,10", "--tp", "2", "--sp", "--ep", "8", "--etp", "1", "--dp", "4", "--mbs", "1", "--global-batch",
                          "128", "--seq-length", "4096", "--gpu", "h100-80gb", "--precision", "fp8", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    body = json.loads(cli.stdout)
    assert api.json()["time"]["step_seconds"] > 0
    assert api.json()["time"] == body["time"]
    reasons = [(x["code"], x["message"]) for x in api.json()["verdict"]["blocking"]]
    assert reasons == [(x["code"], x["message"]) for x in body["verdict"]["blocking"]]


def test_the_layer_map_marks_the_deltanet_layers(client):
    """On the page, the 36 DeltaNet layers' cells carry ``linear`` (their number underlined) and the map's
    hint says what that means; the 12 attention layers' cells do not."""
    import re
    from html import unescape
    from urllib.parse import parse_qsl

    data = json.dumps({**NEXT, "max_position_embeddings": 32768}).encode()
    r = client.post("/upload", files={"file": ("next.json", data, "application/json")}, data={"query": ""})
    model = dict(parse_qsl(r.headers["location"].split("?", 1)[1]))["model"]
    page = client.get("/", params={"model": model, "engine": "megatron", "split": "12,12,12,12"}).text
    cells = re.findall(r'<div id="L(\d+)" class="([^"]*)"', page)
    linear = {int(n) for n, cls in cells if "linear" in cls.split()}
    assert linear == {n for n in range(1, 49) if n % 4}
    assert "an underlined number is a gated DeltaNet (linear attention) layer" in unescape(page)


def test_the_deltanet_kernels_bytes_by_hand():
    """Qwen3-Next's DeltaNet (32 value heads of 128, q / k on 16 heads of 128, conv over 8,192 channels),
    per token forward, kernel by kernel as the module docstring lists them (BF16 2 B, FP32 4 B, chunk 64):
    conv reads and writes 8,192 (32,768); q and k repeated to 32 heads written (16,384); the gate cumsum
    reads and writes 32 FP32 (256); kkt reads k 8,192, beta 64, g 128 and writes A 32 x 64 FP32 8,192
    (16,576); solve_tril reads and writes A (16,384); w / u read A, k, v, beta and write w, u (41,024);
    fwd_h reads k, w, u, g and writes a 32 x 128 x 128 FP32 state every 64 tokens (32,768 a token) and
    v_new (65,664); fwd_o reads q, k, v_new, the states and g and writes o (65,664). The gated norm apart:
    it reads o and z and writes 4,096 BF16 (24,576)."""
    from app.core.model.gated_delta_net import GdnDims

    g = GdnDims(16, 32, 128, 128, 4)
    assert g.scan_bytes_per_token() == 32768 + 16384 + 256 + 16576 + 16384 + 41024 + 65664 + 65664 == 254720
    assert g.norm_bytes_per_token() == 24576
