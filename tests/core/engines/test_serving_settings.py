"""What a serving plan's memory settings mean where the engine runs: the model's maximum context as
each serving engine derives it (and what a longer stated one does), the weights as the checkpoint
stores them, and the share of each GPU the server takes.

Expected values are worked out by hand from each engine's code as read (vLLM
``vllm/config/model.py:_get_and_verify_max_len`` @ 0052a5b8; SGLang
``hf_transformers_utils.get_context_length`` @ 002fc100 and ``ModelConfig._derive_context_length``
@ 001adf56), on the pinned presets and on configs edited to tell the two rules apart.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.core.engines import ENGINES
from app.core.evaluate import evaluate
from app.core.launcher import import_launcher, parse_serve_launcher
from app.core.model.config import load_config_bytes, load_preset
from app.core.plan import Plan
from app.core.reports import flops_command_report

QWEN3 = load_preset("qwen3-30b-a3b")


def _edited(preset: str, **changes: object) -> object:
    """``preset``'s config.json with keys set (``None``: removed), loaded as an upload."""
    raw = dict(load_preset(preset).raw)
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return load_config_bytes(json.dumps(raw).encode())


@pytest.mark.parametrize("preset,vllm,sglang", [
    ("glm-5.2", 1_048_576, 1_048_576),          # max_position_embeddings, no rope scaling
    ("qwen3-30b-a3b", 40_960, 40_960),          # rope_scaling null
    ("llama-3.1-70b", 131_072, 131_072),        # llama3 rope: no factor applied by either
    ("deepseek-v3", 4_096 * 40, 163_840),       # yarn: vLLM scales the original 4,096; SGLang keeps 163,840
    ("kimi-k2", 4_096 * 32, 131_072),
])
def test_presets_maximum_context(preset, vllm, sglang):
    cfg = load_preset(preset)
    assert ENGINES["vllm"].max_context(cfg).tokens == vllm
    assert ENGINES["sglang"].max_context(cfg).tokens == sglang


@pytest.mark.parametrize("changes,vllm,sglang", [
    # Qwen2.5-style YaRN: vLLM 32,768 x 4; SGLang sees original_max_position_embeddings and keeps 32,768
    ({"max_position_embeddings": 32768,
      "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131_072, 32_768),
    # linear scaling without an original length: both multiply
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, 8192, 8192),
    # the same as transformers v5 writes it
    ({"max_position_embeddings": 4096, "rope_scaling": None,
      "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}, 8192, 8192),
    # llama3 rope: neither scales
    ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                          "original_max_position_embeddings": 8192}}, 8192, 8192),
    # vLLM takes the smallest key present; SGLang the first in its own order (max_sequence_length first)
    ({"max_position_embeddings": 8192, "max_seq_len": 2048, "max_sequence_length": 16384}, 2048, 16384),
    # a per-layer-type rope: vLLM multiplies by the factor; SGLang's .get("factor") on the outer dict finds none
    ({"max_position_embeddings": 4096, "rope_scaling": None,
      "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                          "sliding_attention": {"rope_type": "default"}}}, 8192, 4096),
])
def test_engine_rules_differ_where_their_code_does(changes, vllm, sglang):
    cfg = _edited("qwen3-30b-a3b", **changes)
    assert ENGINES["vllm"].max_context(cfg).tokens == vllm
    assert ENGINES["sglang"].max_context(cfg).tokens == sglang


def test_longrope_default_is_the_original_length_but_the_limit_is_not():
    """vLLM: a LongRoPE model (no factor applied) defaults to its ``original_max_position_embeddings``
    and still takes a stated context up to ``max_position_embeddings``."""
    cfg = _edited("qwen3-30b-a3b", max_position_embeddings=131072, original_max_position_embeddings=4096,
                  rope_scaling={"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]})
    limit = ENGINES["vllm"].max_context(cfg)
    assert (limit.tokens, limit.default) == (131_072, 4096)
    ev = evaluate(Plan(model=cfg.id, engine="vllm", tp=4), cfg)
    assert ev.serving_memory["settings"]["context"] == 4096
    assert ENGINES["sglang"].max_context(cfg).tokens == 131_072


def test_default_context_is_the_models_maximum_and_memory_is_judged_there():
    ev = evaluate(Plan(model="qwen3-30b-a3b", engine="vllm", tp=2), QWEN3)
    assert ev.serving_memory["settings"]["context"] == 40_960
    assert not [r for r in ev.verdict.blocking if r.code == "context_above_model_maximum"]
    assert "--max-model-len" not in ev.engine.exports(QWEN3, ev.plan, ev.check, ev.judgement)["serve"]


@pytest.mark.parametrize("engine,env", [("vllm", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
                                        ("sglang", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")])
def test_a_context_above_the_maximum_is_refused_unless_overridden(engine, env):
    plan = Plan(model="qwen3-30b-a3b", engine=engine, tp=2, context=65_536)
    ev = evaluate(plan, QWEN3)
    refused = [r for r in ev.verdict.blocking if r.code == "context_above_model_maximum"]
    assert len(refused) == 1 and refused[0].field == "context" and refused[0].kind == engine
    assert "65,536" in refused[0].message and "40,960" in refused[0].message and env in refused[0].message
    assert not ev.verdict.go
    allowed = evaluate(replace(plan, allow_long_context=True), QWEN3)
    assert not [r for r in allowed.verdict.blocking if r.code == "context_above_model_maximum"]
    assert [r.code for r in allowed.verdict.notes] == ["context_above_model_maximum"]   # printed by the CLI and page
    assert allowed.serving_memory["settings"]["context"] == 65_536
    exported = allowed.engine.exports(QWEN3, allowed.plan, allowed.check, allowed.judgement)
    assert f"{env}=1" in exported["serve_env"]
    back = import_launcher(exported["serve"], QWEN3, Plan(model="qwen3-30b-a3b"))
    assert (back.plan.context, back.plan.allow_long_context) == (65_536, True)
    at_max = evaluate(replace(plan, context=40_960), QWEN3)
    assert not [r for r in at_max.verdict.blocking if r.code == "context_above_model_maximum"]


@pytest.mark.parametrize("engine,value,on", [
    ("vllm", "1", True), ("vllm", " TRUE ", True), ("vllm", "yes", False), ("vllm", "0", False),
    ("sglang", "yes", True), ("sglang", "Y", True), ("sglang", "true", True), ("sglang", "no", False),
])
def test_the_override_variable_is_read_as_each_engine_reads_it(engine, value, on):
    env = ENGINES[engine].long_context_env
    command = ("vllm serve m --max-model-len 65536" if engine == "vllm"
               else "python -m sglang.launch_server --model-path m --context-length 65536")
    launch = parse_serve_launcher(f"export {env}='{value}'\n{command}\n")
    assert launch.allow_long_context is on


def test_an_override_the_engine_does_not_see_is_said():
    """Assigned but not exported: the server does not see it. A value SGLang reads as neither on
    nor off: it keeps its default (off) and the import says so."""
    hidden = parse_serve_launcher("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1\nvllm serve m\n")
    assert not hidden.allow_long_context
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN is assigned" in w and "never exported" in w for w in hidden.warnings)
    odd = parse_serve_launcher("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=maybe python -m sglang.launch_server "
                               "--model-path m\n")
    assert not odd.allow_long_context
    assert any("neither on nor off" in w for w in odd.warnings)


def test_a_config_without_a_maximum_or_with_an_unreadable_rope_is_a_context_problem():
    none = _edited("qwen3-30b-a3b", max_position_embeddings=None)
    ev = evaluate(Plan(model=none.id, engine="sglang", tp=2), none)
    assert [p.field for p in ev.problems] == ["context"] and "no maximum context" in ev.problems[0].message
    stated = evaluate(Plan(model=none.id, engine="sglang", tp=2, context=8192), none)
    assert not stated.problems and stated.serving_memory["settings"]["context"] == 8192
    bad = _edited("qwen3-30b-a3b", rope_scaling="yarn")
    ev = evaluate(Plan(model=bad.id, engine="vllm", tp=2), bad)
    assert [p.field for p in ev.problems] == ["context"] and "rope_scaling" in ev.problems[0].message


def test_training_engines_default_to_max_position_embeddings_for_flops():
    body = flops_command_report(Plan(model="qwen3-30b-a3b"), QWEN3).body
    assert body["context"] == 40_960


def test_the_cli_says_the_refusal_and_the_overridden_warning():
    from app.core.reports import check_report

    plan = Plan(model="qwen3-30b-a3b", engine="sglang", tp=2, pp=1, context=65_536)
    refused = "\n".join(check_report(plan, QWEN3).lines)
    assert "blocking (sglang, field context): --context-length 65,536 is above" in refused
    allowed = "\n".join(check_report(replace(plan, allow_long_context=True), QWEN3).lines)
    assert "verdict: GO" in allowed
    assert "warning (sglang): --context-length 65,536 is above qwen3-30b-a3b's maximum context 40,960" in allowed


# --------------------------------------------------------------------------- the checkpoint's weight format

#: DeepSeek-V3's published quantization_config (block FP8), as in its config.json
DEEPSEEK_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


@pytest.mark.parametrize("quantization,format", [
    (None, None),
    (DEEPSEEK_FP8, "fp8"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}}, "fp8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}}},
     "compressed-tensors"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, "modelopt"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "awq", "bits": 4}, "awq"),
])
def test_the_checkpoints_weight_format(quantization, format):
    cfg = _edited("deepseek-v3", quantization_config=quantization)
    assert cfg.weight_format == format
    assert cfg.checkpoint_weight_dtype == {None: "bf16", "fp8": "fp8"}.get(format)


def test_an_unreadable_quantization_config_is_refused_naming_it():
    from app.core.model.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        _edited("deepseek-v3", quantization_config="fp8")
    assert exc.value.field == "quantization_config"


def test_an_fp8_checkpoint_is_served_in_fp8_unless_stated():
    """The published DeepSeek-V3 config (FP8 weights) on 8 GPUs: the engines load one byte per weight,
    so every rank's weights are half the same model's in BF16 (the preset omits quantization_config)."""
    fp8, bf16 = _edited("deepseek-v3", quantization_config=DEEPSEEK_FP8), load_preset("deepseek-v3")
    plan = Plan(model="x", engine="vllm", tp=8, pp=2)

    def weights(cfg, **kw):
        ev = evaluate(replace(plan, model=cfg.id, **kw), cfg)
        assert not ev.problems, ev.problems
        return [r["weights_bytes"] for r in ev.serving_memory["ranks"]]

    assert [2 * w for w in weights(fp8)] == weights(bf16)
    assert weights(fp8, weight_dtype="bf16") == weights(bf16)
    assert weights(bf16, weight_dtype="fp8") == weights(fp8)


def test_fp8_weights_of_a_bf16_checkpoint_are_the_engines_online_quantization():
    bf16, fp8 = load_preset("deepseek-v3"), _edited("deepseek-v3", quantization_config=DEEPSEEK_FP8)
    for engine in ("vllm", "sglang"):
        plan = Plan(model="deepseek-v3", engine=engine, tp=8, pp=2, weight_dtype="fp8")
        ev = evaluate(plan, bf16)
        serve = ev.engine.exports(bf16, plan, ev.check, ev.judgement)["serve_command"]
        assert serve.endswith("--quantization fp8") or " --quantization fp8 " in serve
        back = import_launcher(serve, bf16, Plan(model="deepseek-v3"))
        assert back.plan.weight_dtype == "fp8" and not back.warnings
        ev = evaluate(replace(plan, model=fp8.id), fp8)
        assert "--quantization" not in ev.engine.exports(fp8, ev.plan, ev.check, ev.judgement)["serve_command"]
    other = import_launcher("vllm serve m --quantization awq\n", bf16, Plan(model="deepseek-v3"))
    assert other.plan.weight_dtype is None
    assert [w.split(" (")[0] for w in other.warnings] == ["--quantization awq"]


def test_a_weight_format_the_memory_does_not_cover_is_a_weight_dtype_problem():
    awq = _edited("qwen3-30b-a3b", quantization_config={"quant_method": "awq", "bits": 4})
    ev = evaluate(Plan(model=awq.id, engine="sglang", tp=2), awq)
    assert [p.field for p in ev.problems] == ["weight_dtype"] and "'awq'" in ev.problems[0].message
    stated = evaluate(Plan(model=awq.id, engine="sglang", tp=2, weight_dtype="bf16"), awq)
    assert not stated.problems


def test_the_gpu_share_is_the_usable_capacity_and_the_engines_flag():
    """An H100 80 GB (80e9 bytes) at the default 0.9 and a stated 0.95: usable = capacity x share; the
    share is the engine's own flag in the serve command."""
    for engine, flag in (("vllm", "--gpu-memory-utilization"), ("sglang", "--mem-fraction-static")):
        plan = Plan(model="qwen3-30b-a3b", engine=engine, tp=2, gpu="h100-80gb")
        default = evaluate(plan, QWEN3)
        assert abs(default.serving_memory["ranks"][0]["usable_bytes"] - 80e9 * 0.9) < 2
        stated = evaluate(replace(plan, gpu_memory_utilization=0.95), QWEN3)
        assert abs(stated.serving_memory["ranks"][0]["usable_bytes"] - 80e9 * 0.95) < 2
        serve = stated.engine.exports(QWEN3, stated.plan, stated.check, stated.judgement)["serve_command"]
        assert f" {flag} 0.95" in serve
        assert flag not in default.engine.exports(QWEN3, plan, default.check, default.judgement)["serve_command"]


def test_expert_parallelism_keeps_each_gpus_expert_bytes_and_is_each_engines_own():
    """GLM-5.2's 256 routed experts over TP 8: without EP each GPU holds 1/8 of every expert; SGLang's
    --ep-size E gives each GPU 256/E experts split 8/E ways (moe_tp_size = tp // ep) - the same bytes
    for every E dividing 8. vLLM has only --enable-expert-parallel (EP = TP): another ep is refused."""
    glm = load_preset("glm-5.2")

    def weights(engine, ep):   # PP 4 (SGLang's default split starts every rank on a full layer), vLLM PP 1
        ev = evaluate(Plan(model="glm-5.2", engine=engine, tp=8, pp=4 if engine == "sglang" else 1, ep=ep), glm)
        return ev, [r["weights_bytes"] for r in ev.serving_memory["ranks"]]

    base = weights("sglang", 1)[1]
    for ep in (2, 4, 8):
        ev, got = weights("sglang", ep)
        assert got == base, ep
        assert f"--ep-size {ep}" in ev.engine.exports(glm, ev.plan, ev.check, ev.judgement)["serve_command"]
    ok, got = weights("vllm", 8)
    assert got == weights("vllm", 1)[1] and not [r for r in ok.verdict.blocking if r.code == "ep_not_tp"]
    assert " --enable-expert-parallel" in ok.engine.exports(glm, ok.plan, ok.check, ok.judgement)["serve_command"]
    refused, _ = weights("vllm", 4)
    assert [(r.kind, r.field) for r in refused.verdict.blocking if r.code == "ep_not_tp"] == [("vllm", "ep")]
    back = import_launcher("vllm serve m -tp 8 --enable-expert-parallel\n", glm, Plan(model="glm-5.2"))
    assert back.plan.ep == 8 and not back.warnings
    back = import_launcher("python -m sglang.launch_server --model-path m --tp 8 --expert-parallel-size 4\n", glm,
                           Plan(model="glm-5.2"))
    assert back.plan.ep == 4 and not back.warnings


def test_vllms_data_parallel_ranks_spread_the_experts_and_count_the_gpus():
    """vLLM's DeepSeek recipe, ``--data-parallel-size 8 --enable-expert-parallel`` at TP 1: 8 GPUs,
    EP = TP x DP = 8. Only the routed experts (X bytes) depend on EP, so per GPU
    (ep1 - ep8) / (ep1 - ep2) = (7X/8) / (X/2) = 7/4, whatever else a GPU holds."""
    ds = load_preset("deepseek-v3")

    def rank0(dp, ep):
        ev = evaluate(Plan(model="deepseek-v3", engine="vllm", tp=1, dp=dp, ep=ep, weight_dtype="fp8"), ds)
        assert not ev.problems and not [r for r in ev.verdict.blocking if r.code == "ep_not_tp"], (dp, ep)
        return ev, ev.serving_memory["ranks"][0]["weights_bytes"]

    _, full = rank0(None, 1)
    _, two = rank0(2, 2)
    ev, eight = rank0(8, 8)
    assert abs((full - eight) / (full - two) - 7 / 4) < 1e-6
    assert ev.engine.gpu_line(ev.plan, ev.check) == "TP 1 × PP 1 × DP 8 = 8 GPUs (one vLLM server)"
    back = import_launcher("vllm serve deepseek-ai/DeepSeek-V3 --data-parallel-size 8 --enable-expert-parallel\n", ds,
                           Plan(model="deepseek-v3"))
    assert (back.plan.tp, back.plan.dp, back.plan.ep) == (1, 8, 8) and not back.warnings
    wrong = evaluate(Plan(model="deepseek-v3", engine="vllm", tp=2, dp=4, ep=2), ds)
    assert [r.message for r in wrong.verdict.blocking if r.code == "ep_not_tp"] == [
        "vLLM has no expert-parallel size: --enable-expert-parallel makes it TP x DP = 2 x 4 = 8, so ep=2 cannot "
        "be served; set ep to 1 or 8"]


def test_sglangs_data_parallel_attention_splits_the_attention_inside_the_tp_ranks():
    """``--tp 8 --dp 8 --enable-dp-attention`` on GLM-5.2: 8 GPUs; each holds the attention
    projections whole (attention TP = 8 / 8 = 1) and the embedding whole, the rest as at TP 8. The
    attention part is checked against the whole-model serving weights of ``isplan memory
    --inference --dp-attention`` (memory.serving_weights, another implementation), the embedding
    part by hand (vocab x hidden x 7/8 of BF16 bytes); MLA's latent KV cache is not split by TP
    either way."""
    from app.core.model.memory import serving_weights

    glm = load_preset("glm-5.2")
    got = import_launcher("python3 -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention\n",
                          glm, Plan(model="glm-5.2"))
    assert (got.plan.tp, got.plan.dp, got.plan.enable_dp_attention) == (8, 8, True) and not got.warnings
    on = evaluate(got.plan, glm)
    off = evaluate(replace(got.plan, enable_dp_attention=False, dp=None), glm)
    assert on.engine.gpu_line(on.plan, on.check) == "TP 8 × PP 1 = 8 GPUs (one SGLang server)"
    assert "--dp-size 8 --enable-dp-attention" in on.engine.exports(glm, on.plan, on.check, on.judgement)["serve_command"]
    r_on, r_off = on.serving_memory["ranks"][0], off.serving_memory["ranks"][0]
    assert not on.plan.mtp_layers   # no MTP draft served: the 78 decoder layers' attention
    attention = (serving_weights(glm, on.check.roles, tp=8, ep=1, dp_attention=True, weight_dtype="bf16", n_mtp=0)[2]
                 - serving_weights(glm, on.check.roles, tp=8, ep=1, dp_attention=False, weight_dtype="bf16", n_mtp=0)[2])
    embedding = 2 * (glm.vocab_size * glm.hidden_size - glm.vocab_size * glm.hidden_size // 8)
    assert r_on["weights_bytes"] - r_off["weights_bytes"] == attention + embedding
    assert r_on["kv_latent_bytes"] == r_off["kv_latent_bytes"]
    replicas = evaluate(replace(got.plan, enable_dp_attention=False), glm)   # --dp-size alone: 8 replicas of TP 8
    assert replicas.engine.gpu_line(replicas.plan, replicas.check) == "TP 8 × PP 1 × DP 8 = 64 GPUs (one SGLang server)"
    assert replicas.serving_memory["ranks"][0]["weights_bytes"] == r_off["weights_bytes"]
    odd = evaluate(replace(got.plan, dp=3), glm)
    assert [p.field for p in odd.problems] == ["dp"]


@pytest.mark.parametrize(("preset", "tp", "refused"), [
    ("glm-5.2", 3, True), ("glm-5.2", 8, False), ("qwen3-30b-a3b", 16, False), ("qwen3-30b-a3b", 6, True),
    ("llama-3.1-8b", 32, False), ("llama-3.1-8b", 12, True),
])
def test_a_tp_that_does_not_divide_the_attention_heads_is_refused(preset, tp, refused):
    """vLLM's verify_with_parallel_config: num_attention_heads % tensor_parallel_size must be 0 (GLM-5.2
    64 heads, Qwen3-30B-A3B 32, Llama 3.1 8B 32); its KV heads may be fewer than TP (replicated).
    SGLang's attention asserts the same while the model loads."""
    cfg = load_preset(preset)
    for engine in ("vllm", "sglang"):
        ev = evaluate(Plan(model=preset, engine=engine, tp=tp, pp=1), cfg)
        got = [r for r in ev.verdict.blocking if r.code == "heads_tp"]
        assert bool(got) is refused, engine
        if refused:
            assert (got[0].kind, got[0].field) == (engine, "tp")
            assert f"({cfg.num_attention_heads})" in got[0].message or f"{cfg.num_attention_heads} heads" in \
                got[0].message
    if refused:
        vllm = evaluate(Plan(model=preset, engine="vllm", tp=tp, pp=1), cfg).verdict.blocking
        assert any(r.message.startswith(f"Total number of attention heads ({cfg.num_attention_heads}) must be "
                                        f"divisible by tensor parallel size ({tp}).") for r in vllm)


def test_vllm_refuses_expert_parallelism_of_a_dense_model():
    cfg = load_preset("llama-3.1-8b")
    ev = evaluate(Plan(model="llama-3.1-8b", engine="vllm", tp=2, pp=1, ep=2), cfg)
    assert [(r.code, r.field) for r in ev.verdict.blocking if r.kind == "vllm"] == [("ep_without_experts", "ep")]


@pytest.mark.parametrize(("command", "mtp", "warned"), [
    ("vllm serve m -tp 8 --speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'", True, False),
    ("vllm serve m -tp 8 --speculative-config '{\"method\": \"deepseek_mtp\"}'", True, False),
    ("vllm serve m -tp 8 --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'", False, True),
    ("vllm serve m -tp 8 --speculative-config '{\"method\": \"eagle\", \"model\": \"x/eagle\"}'", False, True),
    ("vllm serve m -tp 8", False, False),
    ("python3 -m sglang.launch_server --model-path m --tp 8 --speculative-algorithm EAGLE "
     "--speculative-num-steps 3", True, False),
    ("python3 -m sglang.launch_server --model-path m --tp 8 --speculative-algorithm NEXTN", True, False),
    ("python3 -m sglang.launch_server --model-path m --tp 8 --speculative-algorithm EAGLE3 "
     "--speculative-draft-model-path x/eagle3", False, True),
    ("python3 -m sglang.launch_server --model-path m --tp 8 --speculative-algorithm NGRAM", False, True),
])
def test_speculative_decoding_with_the_mtp_layers_serves_the_mtp_draft(command, mtp, warned):
    """A serve command whose speculative decoding drafts with the checkpoint's own MTP layers holds the
    MTP draft (the plan's mtp_layers: weights and KV on the last rank); another draft is named."""
    glm = load_preset("glm-5.2")
    got = import_launcher(command + "\n", glm, Plan(model="glm-5.2"))
    assert got.plan.mtp_layers == (1 if mtp else None)
    assert any("speculative" in w for w in got.warnings) is warned
    if mtp:
        with_draft = evaluate(replace(got.plan, pp=1), glm).serving_memory["ranks"][0]
        without = evaluate(replace(got.plan, pp=1, mtp_layers=None), glm).serving_memory["ranks"][0]
        assert with_draft["weights_bytes"] > without["weights_bytes"]
        assert with_draft["kv_latent_bytes"] > without["kv_latent_bytes"]


def test_the_inference_command_splits_experts_as_the_serving_verdict_does():
    """``isplan memory --inference`` and the per-rank serving memory share one rule for the experts
    (parameters.serving_expert_tp): GLM-5.2 at TP 8 holds the same weights per GPU for EP 1, 2, 4, 8."""
    from app.core.model.memory import inference_memory

    glm = load_preset("glm-5.2")
    got = {ep: inference_memory(glm, tp=8, ep=ep, context=4096)["weights_bytes_per_gpu"] for ep in (1, 2, 4, 8)}
    assert len(set(got.values())) == 1, got
