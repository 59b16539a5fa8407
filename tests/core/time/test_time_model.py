"""The step-time model: communication volumes and placement, op shapes against the FLOPs model,
the model-FLOPs convention against measured runs, monotonicity, refusals, and the calibration."""

from __future__ import annotations

import math
from dataclasses import replace
from math import comb
from pathlib import Path

import pytest

from app.core.engines import role_rule
from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec
from app.core.model import parameters
from app.core.model.config import load_model
from app.core.model.flops import sequence_layer_flops
from app.core.model.hardware import get_hardware, with_overrides
from app.core.model.parameters import shapes
from app.core.model.roles import derive_roles
from app.core.time import TimeInputError, TimeSettings, comm, step_time
from app.core.time.efficiency import CONSTANTS, Efficiency
from app.core.time.model_flops import model_flops_per_token, padded_vocab
from app.core.time.ops import OpContext, layer_gemms
from app.core.time.precision import PRECISIONS, get_precision, megatron_flags

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "bench" / "steptime_configs"
EFF = Efficiency("test", gemm={"bf16": 0.5, "fp8": 0.5}, nvlink=0.8, net=0.9, lat_nvlink=1e-5, lat_net=2e-5,
                 a2a_nvlink=0.8, a2a_net=0.85)


# --------------------------------------------------------------------------- communication


def test_ring_volumes_inside_one_domain() -> None:
    hw = get_hardware("h100-80gb")
    g = comm.Group("tp", 8, 1, 8)
    x = 1e9
    assert g.link == "nvlink"
    rs = comm.reduce_scatter(g, x, hw, EFF)
    assert rs == pytest.approx(7 / 8 * x / (450e9 * 0.8) + 1e-5)
    # ring all-reduce moves 2 (n - 1) / n of the buffer
    assert comm.all_reduce(g, x, hw, EFF) == pytest.approx(2 * (7 / 8) * x / (450e9 * 0.8) + 2e-5)


def test_a_group_across_domains_is_network_bound() -> None:
    hw = get_hardware("h100-80gb")
    dp = comm.Group("dp", 16, 8, 8)  # TP 8 inside each node: DP peers are one per node
    assert dp.per_domain == 1 and dp.domains == 16 and dp.link == "network"
    x = 4e9
    assert comm.reduce_scatter(dp, x, hw, EFF) == pytest.approx(15 / 16 * x / (50e9 * 0.9) + 2e-5)
    mixed = comm.Group("ep", 16, 1, 8)  # 8 per node, 2 nodes: NVLink phase then the NIC on x / 8
    assert mixed.link == "mixed"
    assert comm.reduce_scatter(mixed, x, hw, EFF) == pytest.approx(
        7 / 8 * x / (450e9 * 0.8) + 1e-5 + 1 / 2 * x / 8 / (50e9 * 0.9) + 2e-5)


def test_nvl72_keeps_a_64_way_group_on_nvlink() -> None:
    g = comm.groups(tp=1, cp=1, dp=64, pp=4, ep=64, etp=1, domain=72)
    assert g["ep"].link == "nvlink"
    assert g["pp"].link == "network"  # PP stride 64: stages sit in different racks
    h = comm.groups(tp=1, cp=1, dp=64, pp=4, ep=64, etp=1, domain=8)
    assert h["ep"].link == "mixed" and h["ep"].domains == 8


def test_megatron_rank_order_strides() -> None:
    g = comm.groups(tp=4, cp=2, dp=8, pp=4, ep=8, etp=1, domain=8)
    assert (g["tp"].stride, g["cp"].stride, g["dp"].stride, g["pp"].stride) == (1, 4, 4, 64)
    # world 4 x 2 x 8 x 4 = 256; EDP = 256 / (ETP 1 x EP 8 x PP 4) = 8
    assert (g["ep"].stride, g["edp"].stride, g["edp"].size) == (1, 8, 8)
    assert g["tp"].link == "nvlink" and g["cp"].link == "nvlink"  # 4 x 2 = 8 fits a node
    assert g["dp"].size == 16 and g["dp"].link == "mixed"


def test_moe_all_to_all_sends_a_token_once_per_remote_domain() -> None:
    # 2 domains, 4 experts (2 per domain), top-2: P(no chosen expert in the remote domain) = C(2,2)/C(4,2)
    g = comm.Group("ep", 4, 1, 2)
    assert comm.remote_domains_per_token(g, 2, 4) == pytest.approx(1 - comb(2, 2) / comb(4, 2))
    # DeepSeek-V3 on 4 nodes: 256 experts, top-8
    g4 = comm.Group("ep", 32, 1, 8)
    expected = 3 * (1 - comb(192, 8) / comb(256, 8))
    assert comm.remote_domains_per_token(g4, 8, 256) == pytest.approx(expected)
    assert comm.remote_domains_per_token(comm.Group("ep", 8, 1, 8), 8, 256) == 0.0
    hw = get_hardware("b200-180gb")
    x = 1e9  # bytes one GPU sends in all (its 8 copies)
    t = comm.all_to_all(g4, x, hw, EFF, topk=8, experts=256)
    assert t == pytest.approx(max(x * 31 / 32 / (900e9 * 0.8) + 1e-5, x / 8 * expected / (50e9 * 0.85) + 2e-5))


def test_pp_boundary_inside_or_across_a_domain() -> None:
    hw = get_hardware("gb200-186gb")
    pp = comm.Group("pp", 4, 36, 72)  # two stages per rack
    assert comm.same_domain(pp, 0, 1) and not comm.same_domain(pp, 1, 2)
    x = 1e8
    assert comm.p2p_between(pp, 0, 1, x, hw, EFF) == pytest.approx(x / (900e9 * 0.8) + 1e-5)
    assert comm.p2p_between(pp, 1, 2, x, hw, EFF) == pytest.approx(x / (50e9 * 0.9) + 2e-5)


# --------------------------------------------------------------------------- ops vs FLOPs


def _ctx(cfg, s: TimeSettings, gpu: str = "h100-80gb") -> OpContext:
    hw = get_hardware(gpu)
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    return OpContext(cfg, shapes(cfg), s, hw, CONSTANTS[hw.generation], get_precision(s.precision), gr)


@pytest.mark.parametrize("model", ["llama-3.1-70b", "deepseek-v3", "glm-5.2", "qwen3-235b-a22b",
                                   str(CONFIGS / "gpt3-175b.gpt2.json")])
def test_gemm_flops_times_tp_equal_the_flops_model(model: str) -> None:
    """The per-GPU GEMMs of a layer, summed over the TP (x EP) group, are flops.py's ``linear`` term
    less the elementwise norm gains and biases (2 FLOPs per such weight)."""
    cfg = load_model(model)
    roles = derive_roles(cfg, role_rule("megatron"))
    tp, ep = 4, (8 if cfg.n_routed_experts else 1)
    s = TimeSettings(tp=tp, ep=ep, etp=1, dp=8, sp=True, seq_length=4096, mbs=1)
    ctx = _ctx(cfg, s)
    sh = shapes(cfg)
    for layer in {1, cfg.num_hidden_layers}:
        role = roles.role(layer)
        terms = sequence_layer_flops(cfg, role, seq_length=4096)
        gemms = layer_gemms(ctx, role)
        # the DSA indexer is duplicated over TP (every TP rank computes all of it): count it once
        gemm = sum(g.flops for g in gemms if g.module != "indexer")
        once = sum(g.flops for g in gemms if g.module == "indexer")
        if cfg.attention == "gqa":  # o bias and QK-norm (replicated), q/k/v biases
            elementwise = sh.norms + sh.attn_replicated + sh.attn_sharded - _gqa_weights(cfg)
        else:  # the MLA down projections are GEMMs; their latent layernorms are not
            elementwise = sh.norms + _mla_norms(cfg)
        if role.ffn == "dense" and cfg.mlp_bias:
            elementwise += cfg.intermediate_size + cfg.hidden_size
        if role.has_indexer:
            elementwise += 2 * cfg.index_head_dim  # the indexer's k_norm
        expected = terms["linear"] + terms["indexer_projections"] - 2 * elementwise * 4096
        assert gemm * tp + once == pytest.approx(expected, rel=1e-9)


def _gqa_weights(cfg) -> int:
    H, h, d, g = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
    return H * h * d + 2 * H * g * d + h * d * H


def _mla_norms(cfg) -> int:
    return (cfg.q_lora_rank or 0) + cfg.kv_lora_rank  # q_a / kv_a layernorm gains


def test_experts_get_the_tokens_routed_to_them() -> None:
    """Qwen3-30B-A3B, 4096 tokens per GPU, EP 8, top-8 of 128 experts: each of the 16 local
    experts gets 4096 * 8 * 8 / 128 = 2048 tokens (force-balanced routing)."""
    cfg = load_model(str(CONFIGS / "Qwen3-30B-A3B.json"))
    s = TimeSettings(ep=8, dp=8, seq_length=4096)
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    fc1 = next(g for g in layer_gemms(_ctx(cfg, s), role) if g.name == "experts_fc1")
    assert (fc1.m, fc1.count, fc1.n, fc1.k) == (2048, 16, 2 * 768, 2048)


def test_routed_experts_run_at_the_grouped_ceiling_dense_gemms_at_the_dense_one() -> None:
    """B200 MXFP8, Qwen3-30B-A3B at EP 8 (16 local experts of 2048 tokens each): the grouped
    expert GEMM ``fc1`` takes ``2 M N K x 16 / (4.5 PFLOPS x g_grouped)`` plus its operand traffic
    (FP8 inputs of 1 B, BF16 output) over ``HBM x m`` plus one kernel gap; the attention's ``qkv``
    projection the same at the dense ceiling ``g`` - each by hand from the catalogue's figures."""
    from app.core.time.ops import gemm_seconds

    cfg = load_model(str(CONFIGS / "Qwen3-30B-A3B.json"))
    s = TimeSettings(ep=8, dp=8, seq_length=4096, precision="mxfp8")
    ctx = _ctx(cfg, s, "b200-180gb")
    eff, prec = CONSTANTS["blackwell"], get_precision("mxfp8")
    assert eff.gemm_grouped["fp8"] < eff.gemm["fp8"]
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    by_name = {g.name: g for g in layer_gemms(ctx, role)}
    for name, ceiling in (("experts_fc1", eff.gemm_grouped["fp8"]), ("qkv", eff.gemm["fp8"])):
        g = by_name[name]
        want = (2 * g.m * g.n * g.k * g.count / (4.5e15 * ceiling)
                + ((g.m * g.k + g.k * g.n) * prec.gemm_bytes + g.m * g.n * 2) * g.count / (7.7e12 * eff.mem)
                + eff.kernel)
        got = gemm_seconds(ctx, g.m, g.n, g.k, low=True, count=g.count, grouped=g.grouped)
        assert got == pytest.approx(want, rel=1e-9), name


# --------------------------------------------------------------------------- model FLOPs


#: Measured (tokens/s/GPU, model TFLOP/s/GPU) from calibration.json and Megatron-Bridge's tables at
#: 067f987d; their ratio is the FLOPs per token the tables counted.
MEASURED = [
    ("llama-3.1-70b", 8192, 2, 0, 4864, 2202),  # GB200 NVFP4, 26.04.01
    ("llama-3.1-70b", 8192, 4, 0, 1664, 731),  # H100 FP8 (tokens/s rounded in the table)
    ("qwen3-235b-a22b", 4096, 1, 0, 3776, 560),
    ("deepseek-v3", 4096, 1, 1, 4912, 1276),
    ("Qwen3-30B-A3B.json", 4096, 1, 0, 44544, 1029),
    ("deepseek-v3", 4096, 1, 0, 3848, 961),  # 25.11 "w/o MTP"
    ("Llama-3.1-405B.json", 8192, 4, 0, 1024, 2617),
    ("Llama-3.1-8B.json", 8192, 1, 0, 37556, 1933),
    ("kimi-k2", 4096, 1, 0, 5328, 1088),
]


@pytest.mark.parametrize("model,seq,tp,mtp,tokens,tflops", MEASURED)
def test_model_flops_reproduce_the_tables(model: str, seq: int, tp: int, mtp: int, tokens: float,
                                          tflops: float) -> None:
    path = CONFIGS / model
    cfg = load_model(str(path) if path.exists() else model)
    per_token = model_flops_per_token(cfg, derive_roles(cfg, role_rule("megatron")), seq_length=seq, tp=tp, mtp_layers=mtp)
    assert tokens * per_token / 1e12 == pytest.approx(tflops, rel=0.025)


def test_model_flops_by_hand_for_gpt3() -> None:
    """GPT-3 175B (2-matrix MLP: f = 2), s = 2048: 6 (2 H 4H f/2 ... ) written out."""
    cfg = load_model(str(CONFIGS / "gpt3-175b.gpt2.json"))
    H, L, s, V = 12288, 96, 2048, 51200
    mlp = 6 * H * (4 * H * 2) * L
    attn = 6 * L * (H * 3 * H + H * H + H * s)
    logits = 6 * H * V
    assert model_flops_per_token(cfg, seq_length=s, tp=8) == mlp + attn + logits
    assert padded_vocab(51200, 8) == 51200 and padded_vocab(151936, 4) == 152064


# --------------------------------------------------------------------------- end to end


def _llama_plan(pp: int = 4, vpp: int = 1):
    cfg = load_model("llama-3.1-70b")
    plan = materialise(PipelineSpec(pp=pp, vpp=vpp if vpp > 1 else None), cfg.num_hidden_layers)
    return cfg, derive_roles(cfg, role_rule("megatron")), plan


def test_json_shape_and_exposed_items_add_up() -> None:
    cfg, roles, plan = _llama_plan(4, 5)
    s = TimeSettings(tp=4, pp=4, vpp=5, dp=2, mbs=1, global_batch=64, seq_length=8192, sp=True, precision="fp8",
                     tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True)
    r = step_time(cfg, roles, plan, s, get_hardware("h100-80gb"))
    j = r.to_json()
    for key in ("step_seconds", "tokens_per_second_per_gpu", "model_tflops_per_gpu", "mfu", "bubble_fraction",
                "breakdown", "per_stage", "timeline", "terms"):
        assert key in j
    for item in ("compute", "recompute", "tp", "cp", "ep", "pp", "dp", "optimizer"):
        assert set(j["breakdown"][item]) == {"exposed", "total"}
    assert sum(v["exposed"] for v in j["breakdown"].values()) == pytest.approx(r.step_seconds, rel=1e-9)
    assert len(j["per_stage"]) == 20
    assert j["tokens_per_second_per_gpu"] == pytest.approx(64 * 8192 / (r.step_seconds * 32))  # 4 x 4 x 2 GPUs
    assert len(j["timeline"]["rank"]) == 2 * 32 * 20
    # 64 / DP 2 = 32 micro-batches; fill and drain of PP 4 x VPP 5: 3 / (5 x 32 + 3)
    assert j["num_microbatches"] == 32 and j["bubble_fill_drain"] == pytest.approx(3 / 163)
    assert j["bubble_fraction"] >= j["bubble_fill_drain"] - 1e-12


def test_shared_layer_costs_do_not_leak_between_settings() -> None:
    """Layer costs are cached across calls by model, layer kind and per-layer settings: a plan timed
    after another with other settings (TP, precision, recompute, constants) gets the step time it
    gets when timed first, with the cache emptied."""
    from app.core.time import model as time_model

    cfg, roles, plan = _llama_plan(4, 1)
    hw = get_hardware("h100-80gb")
    a = TimeSettings(tp=4, pp=4, dp=2, mbs=1, global_batch=64, seq_length=8192, sp=True, precision="fp8")
    others = [replace(a, tp=8, dp=1), replace(a, precision="bf16"), replace(a, recompute="full",
              recompute_method="uniform", recompute_num_layers=1)]
    time_model._LAYER_CACHE.clear()
    parameters._STAGE_PARAMS.clear()
    first = step_time(cfg, roles, plan, a, hw).to_json(timeline=False)
    for other in others:
        step_time(cfg, roles, plan, other, hw)
    slow = replace(CONSTANTS["hopper"], gemm={"bf16": 0.3, "fp8": 0.3})
    assert step_time(cfg, roles, plan, a, hw, efficiency=slow).step_seconds > first["step_seconds"] * 1.5
    assert step_time(cfg, roles, plan, a, hw).to_json(timeline=False) == first


def test_more_dp_never_beats_the_communication_free_rate() -> None:
    """The same per-GPU work (micro-batches per DP rank fixed) on more DP ranks adds gradient
    traffic: tokens/s/GPU never rises, and stays at most the DP-1 value."""
    cfg, roles, plan = _llama_plan(4)
    hw = get_hardware("h100-80gb")
    base = None
    for dp in (1, 2, 8, 32):
        s = TimeSettings(tp=8, pp=4, dp=dp, mbs=1, global_batch=16 * dp, seq_length=4096, sp=True,
                         overlap_grad_reduce=True, overlap_param_gather=True)
        rate = step_time(cfg, roles, plan, s, hw).tokens_per_second_per_gpu
        if base is not None:
            assert rate <= base * (1 + 1e-12)
        base = rate


@pytest.mark.parametrize("gpu", ["h100-80gb", "gb200-186gb"])
def test_a_faster_network_never_slows_a_plan(gpu: str) -> None:
    cfg = load_model("deepseek-v3")
    roles = derive_roles(cfg, role_rule("megatron"))
    plan = materialise(PipelineSpec(pp=4, layout="Et*16|t*16|t*16|t*13L"), 61)
    s = TimeSettings(pp=4, ep=16, etp=1, dp=16, mbs=1, global_batch=256, seq_length=4096, precision="fp8",
                     overlap_grad_reduce=True, overlap_param_gather=True)
    hw = get_hardware(gpu)
    last = math.inf
    for gbps in (100, 200, 400, 800, 1600):
        step = step_time(cfg, roles, plan, s, with_overrides(hw, network_gbps=gbps)).step_seconds
        assert step <= last * (1 + 1e-12)
        last = step


def test_overlap_and_recompute_move_time_the_right_way() -> None:
    cfg, roles, plan = _llama_plan(4)
    hw = get_hardware("h100-80gb")
    s = TimeSettings(tp=8, pp=4, dp=4, mbs=1, global_batch=64, seq_length=8192, sp=True)
    plain = step_time(cfg, roles, plan, s, hw)
    overlapped = step_time(cfg, roles, plan, replace(s, tp_comm_overlap=True, overlap_grad_reduce=True,
                                                     overlap_param_gather=True), hw)
    assert overlapped.step_seconds < plain.step_seconds
    assert overlapped.breakdown["tp"]["exposed"] < plain.breakdown["tp"]["exposed"]
    assert overlapped.breakdown["tp"]["total"] == pytest.approx(plain.breakdown["tp"]["total"])
    full = step_time(cfg, roles, plan, replace(s, recompute="full", recompute_method="uniform",
                                               recompute_num_layers=1), hw)
    sel = step_time(cfg, roles, plan, replace(s, recompute="selective"), hw)
    assert plain.step_seconds < sel.step_seconds < full.step_seconds
    assert full.breakdown["recompute"]["total"] > sel.breakdown["recompute"]["total"] > 0
    block = step_time(cfg, roles, plan, replace(s, recompute="full", recompute_method="block",
                                                recompute_num_layers=5), hw)
    # block recomputes 5 of each stage's 20 layers
    assert block.breakdown["recompute"]["total"] == pytest.approx(full.breakdown["recompute"]["total"] / 4, rel=0.02)


def test_refusals_name_the_setting() -> None:
    cfg, roles, plan = _llama_plan(4)
    hw = get_hardware("h100-80gb")
    ok = TimeSettings(tp=8, pp=4, dp=2, mbs=1, global_batch=16, seq_length=4096)
    cases = [
        (replace(ok, global_batch=15), "global_batch"),
        (replace(ok, tp=3), "tp"),
        (replace(ok, precision="fp6"), "precision"),
        (replace(ok, ep=2), "ep"),
        (replace(ok, pp=2), "pp"),
        (replace(ok, recompute="selective", recompute_modules=("everything",)), "recompute_modules"),
        (replace(ok, mtp_layers=1), "mtp_layers"),
    ]
    for s, name in cases:
        with pytest.raises(TimeInputError) as exc:
            step_time(cfg, roles, plan, s, hw)
        assert exc.value.field == name
    with pytest.raises(TimeInputError) as exc:
        step_time(cfg, roles, plan, replace(ok, precision="nvfp4"), hw)  # H100 has no FP4 tensor path
    assert exc.value.field == "precision"


def test_precision_flags_are_megatron_options() -> None:
    known = set((ROOT / "app" / "core" / "data" / "megatron_arguments.txt").read_text().split())
    for name in PRECISIONS:
        for flag in megatron_flags(name):
            if flag.startswith("--"):
                assert flag in known, flag
    assert "--fp8-param-gather" not in megatron_flags("mxfp8", distributed_optimizer=False)
    assert get_precision("nvfp4").gemm_dtype == "fp4" and get_precision("mxfp8").gemm_dtype == "fp8"


# --------------------------------------------------------------------------- calibration


def test_calibration_rows_within_their_stated_bound() -> None:
    """The six calibration rows (the constants are fitted on them and the development rows, each
    timed with every setting it states): within 3.5 % on both paths (measured: max 3.4 %; mean 1.3 %).
    ``isplan time``'s flags carry every setting the rows state, the two 26.08 rows' EP overlap, FP8
    attention / MXFP8 output layer and full-iteration CUDA graphs included."""
    from bench.steptime import CALIBRATION, evaluate, load_rows

    res = evaluate(load_rows(CALIBRATION), direct=True)
    assert len(res) == 6
    for r in res:
        assert abs(r["direct_err"]) <= 0.035 and abs(r["err"]) <= 0.035, r["id"]


def test_development_rows_stay_within_their_stated_bounds() -> None:
    """The 104 development rows of the held-out runs (guided the physics; the constants are fitted on
    them and the calibration rows), through ``isplan time``, at the figures docs/MODELS.md states:
    mean |error| <= 11 %, 88 % of runs within 25 %, the predicted order of two runs of one model
    right in >= 92 % of the pairs the inputs can order (measured: 10.3 %, 93 / 104, 629 / 676 =
    93.0 %; 79 more pairs are one launch measured in two containers, which no input orders)."""
    from bench.steptime import HOLDOUT, evaluate, load_rows, split_holdout, summary

    dev, _ = split_holdout(load_rows(HOLDOUT))
    s = summary(evaluate(dev))
    assert s["failed"] == 0 and s["predicted"] == 104
    assert s["mean_abs_err"] <= 0.11
    assert s["within_25pct"] >= 0.88 * s["predicted"]
    assert s["concordance"] >= 0.92


def test_locked_test_rows_stay_at_their_reported_figures() -> None:
    """The 56 locked test rows, evaluated once after the model was final (docs/MODELS.md,
    "Validation"): mean |error| 11.4 %, max 32.4 %, 52 / 56 within 25 %, order 230 / 236 = 97.5 %
    (the previous models: 11.5 %, 32.6 %, 52 / 56; 13.6 %, 33.8 %, 50 / 56; 97.5 % each). A regression guard at those figures, not
    a target the model was tuned to."""
    from bench.steptime import HOLDOUT, evaluate, load_rows, split_holdout, summary

    _, test = split_holdout(load_rows(HOLDOUT))
    s = summary(evaluate(test))
    assert s["failed"] == 0 and s["predicted"] == 56
    assert s["mean_abs_err"] <= 0.12
    assert s["max_abs_err"] <= 0.34
    assert s["within_25pct"] >= 52
    assert s["concordance"] >= 0.95


def test_the_time_line_names_the_bubbles_parts() -> None:
    """``isplan time``'s bubble words: the fill and drain and the rest when both exist, the waiting
    alone with one stage (no fill and drain), the count alone when nothing waits."""
    from app.core.reports import _bubble_parts

    t = {"num_microbatches": 64, "bubble_fill_drain": 7 / 71, "bubble_fraction": 0.444}
    assert _bubble_parts(t) == ("64 micro-batches: 9.9% fill and drain, the rest waiting on slower stages, "
                                "sends and parameter gathers")
    assert _bubble_parts({**t, "bubble_fill_drain": 0.0, "bubble_fraction": 0.06}) == (
        "64 micro-batches: waiting on slower stages, sends and parameter gathers")
    assert _bubble_parts({**t, "bubble_fill_drain": 0.0, "bubble_fraction": 0.0}) == "64 micro-batches"
    assert _bubble_parts({**t, "bubble_fraction": 7 / 71}) == "64 micro-batches: 9.9% fill and drain"
