"""Hybrid Mamba-Transformer models (HF ``nemotron_h``: Nemotron-H, Nemotron 3): the config reader,
roles, parameters, FLOPs, memory, Megatron's placement and parallel rules, and the step time. Every
expected number is worked out here from the module shapes (transformers ``modeling_nemotron_h.py``,
Megatron's ``mamba_mixer.py`` / ``hybrid_layer_allocation.py``) or from a published figure."""

from __future__ import annotations

import json

import pytest

from app.core.engines import role_rule
from app.core.engines.megatron.check import run_check
from app.core.engines.megatron.parallel import check_parallel
from app.core.layout.stages import PipelineSpec
from app.core.model.config import ConfigError, load_config_bytes
from app.core.model.flops import causal_pairs, sequence_layer_flops, token_flops
from app.core.model.memory import layer_activation_terms, serving_kv
from app.core.model.parallelism import ParallelConfig
from app.core.model.parameters import count_parameters
from app.core.model.roles import derive_roles

PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
#: NVIDIA-Nemotron-3-Nano-30B-A3B as NemotronHConfig fields: Megatron-Bridge's recipe
#: (src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py @ 067f987d: hidden 2688, 52 layers,
#: 32 heads, 2 query groups of 128, Mamba 64 heads x 64, state 128, 8 groups, 128 experts top-6 of
#: 1856, shared expert 3712, squared ReLU), vocabulary 131,072
NANO = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 2688,
        "hybrid_override_pattern": PATTERN, "num_hidden_layers": 52, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 128, "mamba_num_heads": 64, "mamba_head_dim": 64,
        "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "n_routed_experts": 128,
        "num_experts_per_tok": 6, "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712,
        "mlp_hidden_act": "relu2", "vocab_size": 131072, "tie_word_embeddings": False, "intermediate_size": 1856}
H, V = 2688, 131072
#: one Mamba mixer: in_proj H x (2*4096 + 2*8*128 + 64), conv1d 6144 x 4 + bias 6144, dt_bias / A_log /
#: D 64 each, gated norm 4096, out_proj 4096 x H
MAMBA = H * 10304 + 6144 * 4 + 6144 + 3 * 64 + 4096 + 4096 * H
ATTENTION = H * 4096 + 2 * H * 256 + 4096 * H  # q, k, v (2 groups x 128), o; no biases
EXPERT = 2 * H * 1856  # up and down, no gate
MOE = 128 * EXPERT + 2 * H * 3712 + 128 * H  # routed, shared (up + down), router


def load(raw: dict):
    return load_config_bytes(json.dumps(raw).encode())


def test_nano_counts_by_hand_and_as_published():
    """23 Mamba, 6 attention and 23 MoE layers, one RMSNorm each, a final norm, untied embeddings.
    NVIDIA's model card: 31.6B total, 3.2B active (3.6B with the embeddings)."""
    cfg = load(NANO)
    assert (PATTERN.count("M"), PATTERN.count("*"), PATTERN.count("E")) == (23, 6, 23)
    total = 23 * (MAMBA + H) + 6 * (ATTENTION + H) + 23 * (MOE + H) + H + 2 * V * H
    r = count_parameters(cfg)
    assert r.main_total == total
    assert r.main_total == pytest.approx(31.6e9, rel=0.002)
    active = 23 * (MAMBA + H) + 6 * (ATTENTION + H) + 23 * (6 * EXPERT + 2 * H * 3712 + 128 * H + H) + H + V * H
    assert r.active == active  # no input embedding, as isplan counts active
    assert r.active == pytest.approx(3.2e9, rel=0.02) and r.active + V * H == pytest.approx(3.6e9, rel=0.01)
    assert r.checkpoint_total - r.main_total == 23 * 128  # the routers' score-correction biases
    assert r.breakdown["mamba"] == 23 * MAMBA and r.breakdown["attention"] == 6 * ATTENTION


def test_the_block_list_and_the_legacy_pattern_read_the_same():
    blocks = {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}
    listed = {k: v for k, v in NANO.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    a = load(NANO)
    b = load({**listed, "layers_block_type": [blocks[c] for c in PATTERN]})
    c = load({**listed, "layers_block_type": [{"M": "mamba", "*": "attention"}.get(s, blocks[s]) for s in PATTERN]})
    assert a.hybrid_pattern == b.hybrid_pattern == c.hybrid_pattern == PATTERN
    assert count_parameters(a).main_total == count_parameters(b).main_total == count_parameters(c).main_total
    assert b.num_hidden_layers == 52 and a.layer_mixers[:3] == ("mamba", "none", "mamba")
    dense = load({**listed, "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp"]})
    assert (dense.hybrid_pattern, dense.n_routed_experts, dense.moe_router_bias) == ("M-*-", 0, False)


@pytest.mark.parametrize("change,field", [
    ({"num_hidden_layers": 50}, "num_hidden_layers"),
    ({"hybrid_override_pattern": "MEX"}, "hybrid_override_pattern"),
    ({"hybrid_override_pattern": None}, "layers_block_type"),
    ({"layers_block_type": ["mamba", "rnn"]}, "layers_block_type"),
    ({"num_nextn_predict_layers": 1, "mtp_layers_block_type": ["linear_attention", "moe"]}, "mtp_layers_block_type"),
    ({"num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "*-"}, "mtp_hybrid_override_pattern"),
    ({"n_groups": 0}, "n_groups"),
    ({"n_groups": 5}, "mamba_num_heads"),
    ({"moe_shared_expert_intermediate_size": 1000}, "moe_shared_expert_intermediate_size"),
])
def test_a_hybrid_config_isplan_cannot_read_completely_is_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError) as exc:
        load({**NANO, **change})
    assert exc.value.field == field


def test_roles_carry_each_layers_module_and_name_the_mix():
    roles = derive_roles(load(NANO))
    assert "".join({"mamba": "M", "attention": "*"}.get(r.mixer, "E" if r.ffn == "moe" else "-")
                   for r in roles.layers) == PATTERN
    assert all((r.ffn == "none") == (r.mixer != "none") for r in roles.layers)
    assert any("23 Mamba, 6 attention, 23 MoE" in n and PATTERN in n for n in roles.notes)
    assert roles.layers[0].to_dict()["mixer"] == "mamba"


def test_flops_follow_each_layers_module():
    """``linear`` is twice the active weights (the identity every family keeps); the SSD scan only
    on Mamba layers, ``2 (G Q N + heads (Q P + 2 N P))`` per token; attention only on the six
    attention layers, ``2 h (2 d)`` per query-key pair."""
    cfg = load(NANO)
    roles = derive_roles(cfg)
    t = token_flops(cfg, roles, 4096)
    assert t["linear"] == 2 * count_parameters(cfg, roles).active
    scan = 2 * (8 * 128 * 128 + 64 * (128 * 64 + 2 * 128 * 64))
    assert t["ssm_scan"] == 23 * scan
    assert t["sparse_attention"] == 6 * 2 * 32 * 2 * 128 * 4096
    mamba, moe, attn = roles.role(1), roles.role(2), roles.role(6)
    seq = sequence_layer_flops(cfg, mamba, seq_length=8192, mbs=2)
    assert (seq["ssm_scan"], seq["sparse_attention"]) == (2 * 8192 * scan, 0)
    assert sequence_layer_flops(cfg, moe, seq_length=8192)["ssm_scan"] == 0
    assert sequence_layer_flops(cfg, attn, seq_length=8192)["sparse_attention"] == 2 * 32 * 256 * causal_pairs(8192)


def test_activation_memory_of_each_block():
    """Per token at TP 2 with SP: a Mamba layer keeps its norm's input and output (2H / 2 each), the
    in_proj output (2 x 10304 / 2), the scan output and the out_proj input (2 x 4096 / 2 each) and the
    norm's FP32 rstd (4 x 8 / 2); an MoE block keeps no attention rows, an attention block no FFN rows;
    the experts' fc1 is one width (no gate)."""
    cfg = load(NANO)
    par = ParallelConfig(tp=2, pp=1, gpus=2, sp=True, seq_length=8192)
    m = layer_activation_terms(cfg, par, ffn="none", indexer=False, mixer="mamba")
    assert m == {"attn_norm_input": H, "attn_norm_output": H, "mamba_in_proj_output": 10304,
                 "mamba_scan_output": 4096, "mamba_norm_rstd": 16, "mamba_out_proj_input": 4096}
    e = layer_activation_terms(cfg, par, ffn="moe", indexer=False, mixer="none")
    assert "q_heads" not in e and "attn_norm_input" not in e and e["mlp_norm_input"] == H
    assert e["expert_fc1"] == 2 * 1856 * 6 / 2 and e["shared_fc1"] == 2 * 2 * 1856 / 2
    a = layer_activation_terms(cfg, par, ffn="none", indexer=False, mixer="attention")
    assert "mlp_norm_input" not in a and a["q_heads"] == 2 * 32 * 128 / 2


def test_serving_keeps_kv_on_attention_layers_and_a_state_per_sequence():
    """KV on the 6 attention layers (2 groups x 128 x K and V x 2 B), and on each of the 23 Mamba
    layers one state per sequence: the conv window 6144 x 3 in BF16 and the SSM state 64 x 64 x 128
    in FP32."""
    cfg = load(NANO)
    kv = serving_kv(cfg, derive_roles(cfg), kv_dtype="bf16", tp=1, n_mtp=0)
    assert (kv["layers"], kv["bytes_per_token"]) == (6, 6 * 2 * 2 * 128 * 2)
    assert kv["mamba_bytes_per_sequence"] == 23 * (2 * 6144 * 3 + 4 * 64 * 64 * 128)


def _check(cfg, **spec):
    return run_check(cfg, PipelineSpec(**spec), role_rule("megatron"))


def _segments_as_megatron_reads_them(written: str, pp: int) -> list[tuple[int, int, str]]:
    """select_pipeline_segment: segment ``vp * PP + rank`` of the ``|``-cut pattern (re-implemented)."""
    segs = written.split("|")
    return [(i % pp, i // pp, s) for i, s in enumerate(segs)]


@pytest.mark.parametrize("sizes,vpp", [([14, 13, 13, 12], 1), ([8, 5, 5, 8, 8, 5, 5, 8], 2), ([52], 1)])
def test_stage_sizes_are_written_as_pipe_segments_megatron_places_back(sizes, vpp):
    cfg = load(NANO)
    res = _check(cfg, split=tuple(sizes), vpp=vpp)
    assert res.valid and not res.plan.errors
    flags = list(res.megatron_flags)
    written = flags[flags.index("--hybrid-layer-pattern") + 1]
    assert written.replace("|", "") == PATTERN
    pp = len(sizes) // vpp
    for rank, vp, seg in _segments_as_megatron_reads_them(written, pp):
        st = res.plan.stages[vp * pp + rank]
        assert (st.pp_rank, st.vp_stage, len(seg)) == (rank, vp, st.num_layers)
        assert seg == PATTERN[st.first_layer - 1:st.last_layer]
    assert ("|" in written) == (len(sizes) > 1)


def test_megatrons_hybrid_pipeline_rules():
    cfg = load(NANO)
    assert [s.num_layers for s in _check(cfg, pp=4).plan.stages] == [13] * 4
    odd = _check(cfg, pp=3).plan
    assert not odd.stages and odd.errors[0].message.startswith(
        "Number of layers (52) must be evenly divisible by pipeline-model-parallel-size (3) when no pipe separators")
    assert [s.num_layers for s in _check(cfg, pp=3, first=18).plan.stages] == [18, 17, 17]
    for spec, flag in (({"pp": 2, "vpp": 2}, "--num-virtual-stages-per-pipeline-rank"),
                       ({"pp": 2, "layers_per_vstage": 13}, "--num-layers-per-virtual-pipeline-stage"),
                       ({"pp": 2, "layout": "Et*26|t*26L"}, "--pipeline-model-parallel-layout"),
                       ({"pp": 2, "account_for_loss": True}, "--account-for-loss-in-pipeline-split")):
        errors = _check(cfg, **spec).plan.errors
        assert errors and errors[0].flag == flag and "should not be used with --hybrid-layer-pattern" in errors[0].message
    assert "interleave" in _check(cfg, split=(26, 26), vpp=2).plan.errors[0].code  # VPP 2 needs PP > 1
    mtp = _check(cfg, pp=2, mtp_layers=2)
    assert mtp.valid and [s.mtp_layers for s in mtp.plan.stages] == [0, 2]  # the loss stage builds the MTP block
    flags = list(mtp.megatron_flags)
    written = flags[flags.index("--hybrid-layer-pattern") + 1]
    main, *depths = written.split("/")  # parse_hybrid_pattern: one part per MTP depth after the main decoder
    assert main.replace("|", "") == PATTERN and depths == ["*E", "*E"]


@pytest.mark.parametrize("tp,cp,failing", [
    (1, 1, set()), (8, 1, set()), (3, 1, {"mamba_heads_tp", "mamba_groups_tp"}), (16, 1, {"mamba_groups_tp"}),
    (2, 4, set()),              # 64/2 = 32 heads over CP 4; 8/2 = 4 groups over CP 4
    (2, 8, set()),              # groups 4 < CP 8 and 8 % 4 == 0: each group's state repeated
    (2, 3, {"mamba_heads_cp", "mamba_groups_cp"}),
    (8, 64, {"mamba_heads_cp"}),   # 8 heads per TP rank over CP 64
])
def test_mamba_heads_and_groups_split_over_tp_and_cp(tp, cp, failing):
    cfg = load(NANO)
    par = ParallelConfig(tp=tp, pp=1, cp=cp, gpus=tp * cp, sp=tp > 1, seq_length=8192)
    bad = {c.name for c in check_parallel(cfg, par) if c.name.startswith("mamba") and not c.ok}
    assert bad == failing


def test_model_flops_follow_megatron_bridges_hybrid_count():
    """``flop_utils.hybrid_flops`` (Megatron-Bridge @ 067f987d) per token at seq 8192, by hand:
    attention ``4 * 4096 * (2688 + 2688 * 2 / 32) + 2 * 4096 * 8192`` = 113,901,568; Mamba with its
    ``d_in = 2H`` = 5376, ``2 * 2688 * (2 * 5376 + 2 * 8 * 128 + 64) + 7 * 5376 * 128 + 2 * 5376 * 2688``
    = 102,875,136; MoE ``4 * 2688 * (1856 * 6 + 3712)`` = 159,645,696; logits ``2 * 2688 * 131072``; three
    times forward. The tables' own Model TFLOP/s over tokens/s/GPU (26.04.01 GB300: 845e12 / 37,888;
    26.08 GB300: 901e12 / 39,936) agree within 1.3 %."""
    from app.core.time.model_flops import model_flops_per_token

    cfg = load(NANO)
    by_hand = 3 * (6 * 113_901_568 + 23 * 102_875_136 + 23 * 159_645_696 + 2 * 2688 * 131072)
    assert model_flops_per_token(cfg, seq_length=8192) == by_hand == 22_278_094_848
    for tflops, tokens in ((845e12, 37888), (901e12, 39936)):
        assert by_hand == pytest.approx(tflops / tokens, rel=0.013)


def test_a_hybrid_plan_is_judged_placed_and_timed():
    """A Megatron plan of Nemotron 3 Nano gets a verdict, memory (Megatron's own estimate declines
    hybrid models, as Megatron does) and a step time whose Mamba layers pay their scan; the flags
    carry the pattern."""
    from app.core.evaluate import evaluate
    from app.core.plan import plan_from_query

    cfg = load(NANO)
    plan, problems = plan_from_query({"model": cfg.id, "engine": "megatron", "split": "14,13,13,12", "tp": "1",
                                      "ep": "8", "dp": "8", "mbs": "1", "global_batch": "64",
                                      "seq_length": "8192", "gpu": "gb200-186gb", "precision": "mxfp8"})
    assert problems == []
    ev = evaluate(plan, cfg)
    assert ev.problems == [] and ev.verdict.go, ev.verdict
    assert "unsupported" in ev.memory["megatron_theoretical"]
    assert ev.time["tokens_per_second_per_gpu"] > 0 and "unavailable" not in ev.time
    assert "--hybrid-layer-pattern 'MEMEM*EMEMEM*E|MEMEM*EMEMEM*|EMEMEM*EMEMEM|EM*EMEMEMEME'" in ev.exports()["megatron"]
    assert ev.time["model_flops_per_token"] == pytest.approx(3 * (6 * 113_901_568 + 23 * 102_875_136
                                                                  + 23 * 159_645_696 + 2 * 2688 * 131072))


def _imported(pattern_flag: str, cfg_raw: dict = NANO, extra: str = ""):
    from app.core.evaluate import evaluate
    from app.core.launcher.importer import import_launcher
    from app.core.plan import Plan

    cfg = load(cfg_raw)
    script = ("torchrun pretrain_mamba.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 "
              f"{pattern_flag} {extra}--micro-batch-size 1 --global-batch-size 64 --seq-length 8192\n")
    imp = import_launcher(script, cfg, Plan(model=cfg.id))
    return imp, evaluate(imp.plan, cfg, extra_errors=imp.errors)


def test_a_launchers_pattern_segments_are_its_stages():
    """``--hybrid-layer-pattern`` with ``|`` cuts the stages where the script cuts them (27 | 25),
    and the exported flags give back the same segments; the older ``--hybrid-override-pattern``
    reads the same."""
    for flag in ("--hybrid-layer-pattern", "--hybrid-override-pattern"):
        written = PATTERN[:27] + "|" + PATTERN[27:]
        imp, ev = _imported(f"{flag} '{written}'")
        assert imp.errors == () and [s.num_layers for s in ev.check.plan.stages] == [27, 25]
        assert f"--hybrid-layer-pattern '{written}'" in ev.exports()["megatron"]


@pytest.mark.parametrize("written,code", [
    (PATTERN[:26] + "|" + PATTERN[26:39] + "|" + PATTERN[39:], "hybrid_segments"),  # 3 segments, PP 2
    (PATTERN.replace("M", "E", 1), "launcher_model_mismatch"),                      # another model's layers
])
def test_a_launchers_pattern_megatron_would_refuse_blocks(written, code):
    imp, ev = _imported(f"--hybrid-layer-pattern '{written}'")
    assert code in {e.code for e in imp.errors} and not ev.verdict.go


def test_pattern_segments_beside_first_last_or_on_a_gpt_model_are_refused():
    imp, _ = _imported(f"--hybrid-layer-pattern '{PATTERN[:26]}|{PATTERN[26:]}'",
                       extra="--decoder-first-pipeline-num-layers 26 ")
    assert "hybrid_pipeline_flag" in {e.code for e in imp.errors}
    llama = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 52,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    imp, ev = _imported(f"--hybrid-layer-pattern '{PATTERN}'", cfg_raw=llama)
    assert [e.kind for e in imp.errors] == ["model"] and not ev.verdict.go


#: A LatentMoE hybrid with one MTP layer (Nemotron 3 Super's shape on Nano's sizes): the routed experts
#: work in L = 1024 between ``fc1_latent_proj`` / ``fc2_latent_proj`` (transformers ``NemotronHMoE``;
#: Megatron ``moe_layer.py`` @ d98e8a64 builds both ``parallel_mode="duplicated"``), the shared expert in H
L = 1024
LATENT = {**NANO, "moe_latent_size": L, "num_nextn_predict_layers": 1,
          "mtp_layers_block_type": ["attention", "moe"]}
MOE_L = 128 * 2 * L * 1856 + 2 * H * 3712 + 128 * H + 2 * H * L  # routed on L, shared on H, router, latent


def test_latent_moe_and_the_hybrid_mtp_layer_count_by_hand():
    """The MTP layer (Megatron ``MultiTokenPredictionLayer`` over a ``*E`` stack): enorm and hnorm,
    eh_proj 2H x H, an attention block and an MoE block with a norm each, the shared head's norm."""
    cfg = load(LATENT)
    mtp = 2 * H + 2 * H * H + (ATTENTION + H) + (MOE_L + H) + H
    r = count_parameters(cfg)
    assert r.main_total == 23 * (MAMBA + H) + 6 * (ATTENTION + H) + 23 * (MOE_L + H) + H + 2 * V * H
    assert r.breakdown["mtp"] == mtp + 128  # with its router's score-correction bias, as the checkpoint has it
    assert r.breakdown["latent_proj"] == 23 * 2 * H * L
    active = 23 * (6 * 2 * L * 1856 + 2 * H * 3712 + 128 * H + 2 * H * L + H)
    assert r.active == 23 * (MAMBA + H) + 6 * (ATTENTION + H) + active + H + V * H


def test_latent_moe_model_flops_follow_megatron_bridges_count():
    """``moe_layer_flops`` with ``moe_latent_size`` (Megatron-Bridge ``flop_utils.py`` @ 067f987d):
    routed ``4 L i k``, projections ``4 H L``, shared ``4 H i_shared``; ``get_hybrid_layer_counts``
    counts the MTP depth's ``*E`` as layers and the logits run once more per depth."""
    from app.core.time.model_flops import model_flops_per_token

    cfg = load(LATENT)
    moe = 4 * L * 1856 * 6 + 4 * H * L + 4 * H * 3712
    by_hand = 3 * (7 * 113_901_568 + 23 * 102_875_136 + 24 * moe + 2 * 2 * H * V)
    assert model_flops_per_token(cfg, seq_length=8192, mtp_layers=1) == by_hand


def test_latent_moe_shapes_the_expert_gemms_dispatch_and_activations():
    """The grouped GEMMs take K = L (fc1) and N = L (fc2), the projections are (t, L, H) and (t, H, L)
    and their FLOPs are the flops model's linear term (less the norm's gain); the permuted tokens are
    L wide and fc2_latent_proj keeps its L-wide input; a Megatron plan puts the MTP layer on the last
    stage, writes it as ``/*E`` and is timed."""
    from app.core.evaluate import evaluate
    from app.core.model.hardware import get_hardware
    from app.core.model.parameters import shapes
    from app.core.plan import plan_from_query
    from app.core.time import TimeSettings, comm
    from app.core.time.efficiency import CONSTANTS
    from app.core.time.ops import OpContext, layer_gemms
    from app.core.time.precision import get_precision

    cfg = load(LATENT)
    par = ParallelConfig(tp=2, pp=1, gpus=2, sp=True, seq_length=8192)
    e = layer_activation_terms(cfg, par, ffn="moe", indexer=False, mixer="none")
    # ETP defaults to TP: 6 routed rows per token on a GPU, each L wide; fc2_latent_proj's input over SP
    assert e["expert_input"] == e["expert_output"] == 2 * L * 6 and e["latent_proj"] == 2 * L / 2
    s = TimeSettings(tp=1, ep=8, etp=1, dp=8, seq_length=8192, mbs=1)
    hw = get_hardware("h100-80gb")
    gr = comm.groups(tp=1, cp=1, dp=8, pp=1, ep=8, etp=1, domain=hw.nvlink_domain)
    ctx = OpContext(cfg, shapes(cfg), s, hw, CONSTANTS[hw.generation], get_precision(s.precision), gr)
    role = derive_roles(cfg, role_rule("megatron")).role(PATTERN.index("E") + 1)
    g = {x.name: x for x in layer_gemms(ctx, role)}
    assert (g["latent_fc1"].n, g["latent_fc1"].k) == (L, H) and (g["latent_fc2"].n, g["latent_fc2"].k) == (H, L)
    assert g["experts_fc1"].k == L and g["experts_fc2"].n == L
    linear = sequence_layer_flops(cfg, role, seq_length=8192)["linear"]
    assert sum(x.flops for x in g.values()) == pytest.approx(linear - 2 * H * 8192, rel=1e-12)
    plan, problems = plan_from_query({"model": cfg.id, "engine": "megatron", "pp": "2", "tp": "1", "ep": "8",
                                      "dp": "8", "mbs": "1", "global_batch": "64", "seq_length": "8192",
                                      "gpu": "gb200-186gb", "precision": "mxfp8", "mtp_layers": "1"})
    assert problems == []
    ev = evaluate(plan, cfg)
    assert ev.verdict.go, ev.verdict
    assert [st.mtp_layers for st in ev.check.plan.stages] == [0, 1]
    assert "/*E'" in ev.exports()["megatron"] and ev.time["tokens_per_second_per_gpu"] > 0


def test_a_launchers_mtp_pattern_parts_are_its_mtp_layers():
    """``parse_hybrid_pattern``: each ``/`` part after the main decoder is one MTP depth. ``/*E/*E``
    is two MTP layers on the last stage (and is written back the same); another block list is not
    the MTP layer isplan models and blocks the verdict naming the flag."""
    written = PATTERN[:26] + "|" + PATTERN[26:]
    imp, ev = _imported(f"--hybrid-layer-pattern '{written}/*E/*E'", cfg_raw=LATENT)
    assert imp.errors == () and imp.plan.mtp_layers == 2
    assert [s.mtp_layers for s in ev.check.plan.stages] == [0, 2]
    assert f"--hybrid-layer-pattern '{written}/*E/*E'" in ev.exports()["megatron"]
    imp, ev = _imported(f"--hybrid-layer-pattern '{written}/M*'", cfg_raw=LATENT)
    bad = [e for e in imp.errors if e.code == "launcher_model_mismatch"]
    assert bad and "'M*'" in bad[0].message and not ev.verdict.go


def test_nemotron_3_super_counts_and_flops_as_published():
    """Nemotron 3 Super (bench/steptime_configs/Nemotron-3-Super-120B-A12B.json: LatentMoE with 512
    experts top-22 of 2688 in L = 1024, 40 Mamba / 40 MoE / 8 attention layers, one MTP block run twice):
    the published 120B total and 12B active, and Megatron-Bridge's model FLOPs with its recipe's two
    MTP depths equal to the 26.08 tables' Model TFLOP/s over tokens/s/GPU (GB300 MXFP8 831e12 / 9,856;
    GB200 MXFP8 600e12 / 7,040; GB300 NVFP4 864e12 / 10,240) within 1 %. By hand: a Mamba layer
    ``4096 x (2*8192 + 2*8*128 + 128) + conv 10240 x 4 + 10240 + 3 x 128 + 8192 + 8192 x 4096``."""
    from pathlib import Path

    from app.core.time.model_flops import model_flops_per_token

    raw = json.loads((Path(__file__).parents[3] / "bench/steptime_configs/Nemotron-3-Super-120B-A12B.json").read_text())
    cfg = load(raw)
    h = 4096
    mamba = h * (2 * 8192 + 2 * 8 * 128 + 128) + 10240 * 4 + 10240 + 3 * 128 + 8192 + 8192 * h
    attention = h * 4096 + 2 * h * 256 + 4096 * h
    moe = 512 * 2 * 1024 * 2688 + 2 * h * 5376 + 512 * h + 2 * h * 1024
    total = 40 * (mamba + h) + 8 * (attention + h) + 40 * (moe + h) + h + 2 * V * h
    r = count_parameters(cfg)
    assert r.main_total == total and r.main_total == pytest.approx(120e9, rel=0.01)
    assert r.active == pytest.approx(12e9, rel=0.025)
    per_token = model_flops_per_token(cfg, seq_length=8192, mtp_layers=2)
    for tflops, tokens in ((831e12, 9856), (600e12, 7040), (864e12, 10240)):
        assert per_token == pytest.approx(tflops / tokens, rel=0.01)
