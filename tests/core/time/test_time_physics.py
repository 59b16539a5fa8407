"""The step-time physics added for issue 18's accuracy bar, each against a value derived here by
hand: the share of steps the EP overlap pairs (Megatron's warm-up counts), the time of a paired
step with the dispatch kernels' SMs taken, FP8 attention at FlashAttention-3's published rates, the
MXFP8 output layer, a full-iteration CUDA graph, what the host re-issues for a selective recompute,
and gradients reduced in BF16 by default."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.engines import role_rule
from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from app.core.model.hardware import get_hardware
from app.core.model.parameters import shapes
from app.core.model.roles import derive_roles
from app.core.time import TimeInputError, TimeSettings, comm, step_time
from app.core.time.efficiency import CONSTANTS
from app.core.time.model import EP_COMM_SMS, _exposed, _recompute_seconds, ep_overlap_share
from app.core.time.ops import LayerCost, OpContext, head_cost, layer_cost
from app.core.time.precision import get_precision

CONFIGS = Path(__file__).resolve().parents[3] / "bench" / "steptime_configs"


def _ctx(cfg, s: TimeSettings, gpu: str) -> OpContext:
    hw = get_hardware(gpu)
    gr = comm.groups(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, etp=s.etp_, domain=hw.nvlink_domain)
    return OpContext(cfg, shapes(cfg), s, hw, CONSTANTS[hw.generation], get_precision(s.precision), gr)


# --------------------------------------------------------------------------- EP overlap


def test_without_pipelining_every_micro_batch_but_one_pairs() -> None:
    s = TimeSettings(ep=8, dp=8, mbs=1, global_batch=64, ep_comm_overlap=True)  # 8 micro-batches
    assert ep_overlap_share(s) == pytest.approx(7 / 8)
    assert ep_overlap_share(replace(s, ep_comm_overlap=False)) == 0.0


def test_interleaved_pairs_all_but_each_ranks_warm_up() -> None:
    """PP 4, VPP 4, 64 micro-batches, G = PP = 4: rank r warms up (4 - r - 1) * 2 + 3 * 4 virtual
    micro-batches = 18, 16, 14, 12 of 64 * 4 = 256; the mean unpaired share is 15 / 256."""
    s = TimeSettings(pp=4, vpp=4, ep=8, dp=16, mbs=1, global_batch=64 * 16, ep_comm_overlap=True)
    assert s.num_microbatches == 64
    assert ep_overlap_share(s) == pytest.approx(1 - (18 + 16 + 14 + 12) / 4 / 256)


def test_megatron_refuses_the_overlap_with_plain_pp() -> None:
    s = TimeSettings(pp=4, ep=8, dp=16, mbs=1, global_batch=64 * 16, ep_comm_overlap=True)
    assert ep_overlap_share(s) == 0.0


def test_a_paired_step_pays_the_sms_the_dispatch_holds() -> None:
    """A forward all-to-all of 2 s beside 5 s of backward compute on a quarter of the SMs: the pair
    takes 5 + max(2 - 5, 2 * 0.25) = 5.5 s, i.e. 0.5 s exposed; with 75 % of the steps paired the
    layer's exposed forward EP is 0.25 * 2 + 0.75 * 0.5. A 6 s all-to-all beside 5 s of compute: the
    compute runs at 75 % while the all-to-all lasts, needs 5 - 6 * 0.75 = 0.5 s more after it,
    ends at 6.5 s: 1.5 s exposed (= 6 * 0.25; not the 1 s a free overlap would leave)."""
    lc = LayerCost(ep_fwd=2.0, ep_bwd=6.0)
    lc.fwd.gemm, lc.bwd.gemm = 5.0, 5.0
    s = TimeSettings(ep_comm_overlap=True)
    exp = _exposed(lc, s, ep_share=0.75, ep_sm=0.25)
    assert exp["ep_f"] == pytest.approx(0.25 * 2 + 0.75 * 0.5)
    assert exp["ep_b"] == pytest.approx(0.25 * 6 + 0.75 * 1.5)
    assert _exposed(lc, s)["ep_f"] == 2.0  # no share: nothing hidden


def test_the_overlap_share_and_sms_reach_the_step() -> None:
    """Qwen3-30B-A3B on 8 GB300: with the overlap the step is shorter, by no more than the EP time
    and no less than the all-to-all less its SM share of the paired steps."""
    cfg = load_model(str(CONFIGS / "Qwen3-30B-A3B.json"))
    roles = derive_roles(cfg, role_rule("megatron"))
    plan = materialise(PipelineSpec(pp=1), cfg.num_hidden_layers)
    hw = get_hardware("gb300-288gb")
    s = TimeSettings(ep=8, etp=1, dp=8, mbs=8, global_batch=512, seq_length=4096, precision="mxfp8")
    off = step_time(cfg, roles, plan, s, hw)
    on = step_time(cfg, roles, plan, replace(s, ep_comm_overlap=True), hw)
    ep = off.breakdown["ep"]["exposed"]
    assert 0 < off.step_seconds - on.step_seconds <= ep
    assert on.breakdown["ep"]["exposed"] >= ep * (7 / 8) * EP_COMM_SMS / hw.sms


# --------------------------------------------------------------------------- FP8 attention, FP8 output layer


def test_fp8_attention_runs_at_flashattention3s_fp8_share_of_the_fp8_peak() -> None:
    """FA3 on H100: BF16 740 of 989 TFLOP/s, FP8 about 1,200 of 1,979 (Shah et al. 2024): the
    attention core's time scales by (989 * 0.740/0.989) / (1979 * 1.2/1.979) = 740 / 1200."""
    cfg = load_model("llama-3.1-70b")
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    s = TimeSettings(tp=8, dp=1, seq_length=8192, precision="fp8")
    bf16 = layer_cost(_ctx(cfg, s, "h100-80gb"), role)
    fp8 = layer_cost(_ctx(cfg, replace(s, fp8_attention=True), "h100-80gb"), role)
    ratio = (989e12 * 0.740 / 0.989) / (1979e12 * 1.2 / 1.979)
    assert fp8.attn_fwd == pytest.approx(bf16.attn_fwd * ratio, rel=1e-9)
    assert fp8.attn_bwd == pytest.approx(bf16.attn_bwd * ratio, rel=1e-9)
    assert fp8.fwd.gemm == pytest.approx(bf16.fwd.gemm)


def test_tp_comm_overlap_runs_the_ring_exchanged_gemms_in_tp_chunks() -> None:
    """Userbuffers' ring exchange (Transformer Engine ``initialize_ub``; Megatron-Bridge's FP8 configs)
    runs each overlapped GEMM as TP GEMMs of M / TP rows: FLOPs and the M-sized operands are
    unchanged, the (K, N) weight is read TP times and each chunk is a kernel. So the forward of
    qkv, proj, fc1, fc2 and the backward data gradient of proj, fc2 each cost
    (TP - 1) * (K * N * bytes / (HBM * m) + kernel) more than unsplit; the rest is unchanged."""
    cfg = load_model("llama-3.1-70b")
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    s = TimeSettings(tp=8, dp=1, seq_length=8192, sp=True, precision="fp8")
    plain = layer_cost(_ctx(cfg, s, "h100-80gb"), role)
    ub = layer_cost(_ctx(cfg, replace(s, tp_comm_overlap=True), "h100-80gb"), role)
    hw, eff, tp = get_hardware("h100-80gb"), CONSTANTS["hopper"], 8
    H, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qkv_n = (cfg.num_attention_heads / tp + 2 * cfg.num_key_value_heads / tp) * d
    kn = {"qkv": H * qkv_n, "proj": cfg.num_attention_heads * d / tp * H, "fc1": H * 2 * i / tp,
          "fc2": i / tp * H}
    extra = {k: (tp - 1) * (v * get_precision("fp8").gemm_bytes / (hw.hbm_bw * eff.mem) + eff.kernel)
             for k, v in kn.items()}
    assert ub.fwd.gemm - plain.fwd.gemm == pytest.approx(sum(extra.values()), rel=1e-9)
    assert ub.bwd.gemm - plain.bwd.gemm == pytest.approx(extra["proj"] + extra["fc2"], rel=1e-9)
    assert ub.flops_fwd == pytest.approx(plain.flops_fwd)


def test_the_mxfp8_output_layer_runs_its_gemms_at_the_fp8_rate() -> None:
    """DeepSeek-V3's logits (4096 tokens x 129,280 x 7,168) on GB200: the forward GEMM's tensor
    time halves with the FP8 peak twice the BF16 one (operand traffic aside)."""
    cfg = load_model("deepseek-v3")
    s = TimeSettings(ep=8, dp=8, seq_length=4096, precision="mxfp8")
    hw = get_hardware("gb200-186gb")
    eff = CONSTANTS[hw.generation]
    flops = 2 * 4096 * 129280 * 7168
    bf16 = head_cost(_ctx(cfg, s, "gb200-186gb"), 0)
    fp8 = head_cost(_ctx(cfg, replace(s, fp8_output_proj=True), "gb200-186gb"), 0)
    tensor_saving = flops / (hw.bf16_flops * eff.gemm["bf16"]) - flops / (hw.fp8_flops * eff.gemm["fp8"])
    bytes_bf16 = (4096 * 7168 + 7168 * 129280) * 2 + 4096 * 129280 * 2
    bytes_fp8 = (4096 * 7168 + 7168 * 129280) * get_precision("mxfp8").gemm_bytes + 4096 * 129280 * 2
    saving = tensor_saving + (bytes_bf16 - bytes_fp8) / (hw.hbm_bw * eff.mem)
    assert bf16.fwd.gemm - fp8.fwd.gemm == pytest.approx(saving, rel=1e-9)


def test_fp8_settings_need_their_precision() -> None:
    with pytest.raises(TimeInputError) as exc:
        TimeSettings(precision="fp8", fp8_output_proj=True).validate()
    assert exc.value.field == "precision"
    with pytest.raises(TimeInputError) as exc:
        TimeSettings(precision="bf16", fp8_attention=True).validate()
    assert exc.value.field == "precision"
    with pytest.raises(TimeInputError) as exc:
        TimeSettings(cuda_graph="partial").validate()
    assert exc.value.field == "cuda_graph"


# --------------------------------------------------------------------------- host, gradients


def test_a_full_iteration_graph_issues_nothing_from_the_host() -> None:
    cfg = load_model(str(CONFIGS / "Qwen3-30B-A3B.json"))
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    s = TimeSettings(ep=8, dp=8, seq_length=4096, precision="mxfp8")
    eager = layer_cost(_ctx(cfg, s, "b200-180gb"), role)
    graph = layer_cost(_ctx(cfg, replace(s, cuda_graph="full_iteration"), "b200-180gb"), role)
    assert eager.host_fwd > 0 and eager.host_bwd > 0
    assert graph.host_fwd == graph.host_bwd == 0.0
    assert graph.fwd.total == pytest.approx(eager.fwd.total)


def test_selective_recompute_reissues_only_its_modules_kernels() -> None:
    """``--recompute-modules layernorm moe_act`` re-runs the layer's two norms and the one fused MoE
    activation before the backward: the host issues those 3 kernels again, 3 * host_op, not the
    whole forward's ~64 operations (router, permutation, two grouped GEMMs of 16 local experts, ...),
    which full recompute re-issues. Qwen3-30B-A3B at micro-batch 1 x 1,024 tokens on B200 is
    host-bound in every layer, so each of its 48 layers' backward grows by exactly that."""
    cfg = load_model(str(CONFIGS / "Qwen3-30B-A3B.json"))
    roles = derive_roles(cfg, role_rule("megatron"))
    s = TimeSettings(ep=8, dp=8, mbs=1, global_batch=8, seq_length=1024, precision="mxfp8",
                     recompute="selective", recompute_modules=("layernorm", "moe_act"))
    lc = layer_cost(_ctx(cfg, s, "b200-180gb"), roles.role(1))
    exp = _exposed(lc, s)
    host_op = CONSTANTS["blackwell"].host_op
    gpu, host = _recompute_seconds(lc, exp, s, full=False)
    assert cfg.norms_per_layer == 2 and host == pytest.approx(3 * host_op, rel=1e-12)
    assert gpu == pytest.approx(lc.modules["layernorm"] + lc.modules["moe_act"], rel=1e-12)
    assert _recompute_seconds(lc, exp, s, full=True)[1] == lc.host_fwd > 60 * host_op
    assert lc.host_bwd > lc.bwd.total + exp["ep_b"] + gpu  # host-bound with the recompute too
    plan = materialise(PipelineSpec(pp=1), cfg.num_hidden_layers)
    hw = get_hardware("b200-180gb")
    none = step_time(cfg, roles, plan, replace(s, recompute="none", recompute_modules=None), hw).per_stage[0]
    sel = step_time(cfg, roles, plan, s, hw).per_stage[0]
    assert cfg.num_hidden_layers == 48  # every one an MoE layer like layer 1
    assert sel["backward_seconds"] - none["backward_seconds"] == pytest.approx(48 * 3 * host_op, rel=1e-9)


def test_gradients_are_reduced_in_bf16_unless_asked() -> None:
    """Megatron-LM's default (and today's recipes'): BF16 gradients. On one stage with BF16
    parameters the reduce-scatter and the parameter all-gather move the same bytes (``a`` seconds
    each, one network latency ``l`` in each): BF16 totals ``2 a``; FP32 gradients double the
    reduce-scatter's bytes, ``a + 2 (a - l) + l`` = 1.5 x the BF16 total - ``l``."""
    cfg = load_model("llama-3.1-70b")
    roles = derive_roles(cfg, role_rule("megatron"))
    plan = materialise(PipelineSpec(pp=1), cfg.num_hidden_layers)
    hw = get_hardware("h100-80gb")
    s = TimeSettings(tp=8, dp=16, mbs=1, global_batch=16, seq_length=4096, sp=True)
    assert s.grad_reduce_in_fp32 is False
    bf16 = step_time(cfg, roles, plan, s, hw).breakdown["dp"]["total"]
    fp32 = step_time(cfg, roles, plan, replace(s, grad_reduce_in_fp32=True), hw).breakdown["dp"]["total"]
    lat = CONSTANTS["hopper"].lat_net  # the DP group (stride TP = 8) has one member per node: network only
    assert fp32 == pytest.approx(1.5 * bf16 - lat, rel=1e-9)


def test_a_schedule_megatron_refuses_is_a_named_refusal_not_a_crash() -> None:
    """PP 1 with VPP 2 (found by tests/cli/test_fuzz.py): the evaluation answers that it has no step
    time, naming vpp, instead of raising."""
    from app.core.evaluate import evaluate
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    plan = Plan(model="glm-5.2", mode="flags", pp=1, vpp=2, parallel=True, tp=1, cp=1, ep=1, mbs=1, gpu="h100-80gb")
    t = evaluate(plan, load_preset("glm-5.2")).time
    assert t is not None and "PP > 1" in t["unavailable"] and t["field"] == "vpp"


# --------------------------------------------------------------------------- unfused attention (A100)


def test_a100_attention_is_megatrons_unfused_core_attention() -> None:
    """Narayanan et al.'s 1.7B GPT (24 heads of 96, seq 2048) at micro-batch 16 on one A100 (TP 1):
    the score matrix has 16 * 24 * 2048^2 = 1.6106e9 elements; forward 13 B of traffic per element
    (baddbmm write, softmax read + write, dropout read + write + mask, bmm read) and backward 19 B,
    at 0.75 of 2.039 TB/s: 13.69 ms and 20.01 ms. The two batched GEMMs run over the whole square,
    4 * 2048^2 * 96 * 24 * 16 = 6.1847e11 FLOPs forward, twice that backward, at 312 TFLOP/s x the
    Ampere GEMM ceiling. Flash attention (Hopper's rule) would only count the causal half."""
    cfg = load_model(str(CONFIGS / "narayanan-1.7B.gpt2.json"))
    role = derive_roles(cfg, role_rule("megatron")).role(1)
    s = TimeSettings(tp=1, dp=1, mbs=16, global_batch=16, seq_length=2048, precision="bf16")
    ctx = _ctx(cfg, s, "a100-80gb")
    assert ctx.eff.attn_unfused
    lc = layer_cost(ctx, role)
    elems = 16 * 24 * 2048**2
    rate = 312e12 * CONSTANTS["ampere"].gemm["bf16"]
    square = 4 * 2048**2 * 96 * 24 * 16
    hbm = 2.039e12 * 0.75
    k = CONSTANTS["ampere"].kernel
    assert elems * 13 / hbm == pytest.approx(13.69e-3, rel=1e-3)
    assert lc.attn_fwd == pytest.approx(square / rate + elems * 13 / hbm + 4 * k, rel=1e-9)
    assert lc.attn_bwd == pytest.approx(2 * square / rate + elems * 19 / hbm + 8 * k, rel=1e-9)
    # the same layer with flash attention: the causal FLOPs at the attention fractions, far less time
    flash = layer_cost(replace(ctx, eff=replace(ctx.eff, attn_unfused=False)), role)
    causal = square / 2 * 2049 / 2048
    assert flash.attn_fwd == pytest.approx(causal / (312e12 * 0.55), rel=1e-9)
    assert flash.attn_fwd < lc.attn_fwd / 5
    assert not CONSTANTS["hopper"].attn_unfused and not CONSTANTS["blackwell"].attn_unfused


# --------------------------------------------------------------------------- flash attention's blocks and heads


def _blocks_by_enumeration(seq: int, window: int, tile: int = 128) -> int:
    """Blocks of ``tile x tile`` (query block, key block) of the score matrix holding at least one
    pair a query may attend (key <= query, and query - key < window when windowed): a block does
    when its first key is at most its last query and its last key lies within the window of its
    first query."""
    n = -(-seq // tile)
    count = 0
    for qb in range(n):
        q_first, q_last = qb * tile, min(seq, (qb + 1) * tile) - 1
        for kb in range(n):
            k_first, k_last = kb * tile, min(seq, (kb + 1) * tile) - 1
            if k_first <= q_last and (not window or k_last > q_first - window):
                count += 1
    return count


@pytest.mark.parametrize(("seq", "window"), [(4096, 128), (4096, 1024), (8192, 200), (32768, 1024), (1000, 64),
                                             (4096, 4096), (4096, 0)])
def test_a_windowed_kernel_computes_whole_blocks(seq: int, window: int) -> None:
    """The window's block count, by testing every block of the score matrix against the mask, over
    its useful pairs (sum of min(t, W)), relative to the same ratio for full causal attention."""
    from app.core.time.ops import window_tile_factor

    pairs = sum(min(t, window) if window else t for t in range(1, seq + 1))
    causal = seq * (seq + 1) // 2
    expected = (_blocks_by_enumeration(seq, window) / pairs) / (_blocks_by_enumeration(seq, 0) / causal)
    assert window_tile_factor(seq, window) == pytest.approx(expected, rel=1e-12)


def test_heads_below_128_keep_the_stated_share_of_the_attention_rate() -> None:
    """cuDNN's GB200 benchmark: 64-wide heads at 0.41 / 0.50 of the 128-wide rate (forward /
    backward), linear up to 128, none on Hopper (no measurement stated)."""
    from app.core.time.ops import head_dim_factor

    bw, hopper = CONSTANTS["blackwell"], CONSTANTS["hopper"]
    assert head_dim_factor(bw, 64) == (0.41, 0.50)
    assert head_dim_factor(bw, 32) == (0.41, 0.50)
    assert head_dim_factor(bw, 96) == pytest.approx((0.705, 0.75))
    assert head_dim_factor(bw, 128) == head_dim_factor(bw, 0) == (1.0, 1.0)  # 0: MLA, no single head dim
    assert head_dim_factor(hopper, 64) == (1.0, 1.0)
    assert CONSTANTS["blackwell_ultra"].attn_head64 == bw.attn_head64


def test_gpt_oss_attention_on_b200_by_hand() -> None:
    """GPT-OSS-120B (64 heads of 64, sliding layers of 128 keys) at s = 4096, micro-batch 1, TP 1 on
    B200 (BF16 peak 2.25 PFLOP/s, flash attention at 0.60 / 0.45): a full layer's core is
    4 * 64 * 64 * 4096 * 4097 / 2 FLOPs forward at 0.60 * 0.41 of the peak, backward 2.5 x at
    0.45 * 0.50; a sliding layer's 4 * 64 * 64 * (128 * 129 / 2 + 3968 * 128) FLOPs, each block of
    128 x 128 computed: 32 query blocks touch 1 + 31 * 2 = 63 key blocks against causal's 528."""
    cfg = load_model(str(CONFIGS / "GPT-OSS-120B.json"))
    roles = derive_roles(cfg, role_rule("megatron"))
    sliding, full = roles.role(1), roles.role(2)
    assert (sliding.window, full.window, cfg.head_dim) == (128, 0, 64)
    s = TimeSettings(tp=1, ep=1, dp=1, mbs=1, global_batch=1, seq_length=4096, precision="bf16")
    ctx = _ctx(cfg, s, "b200-180gb")
    peak = 2.25e15
    assert get_hardware("b200-180gb").peak_flops("bf16") == peak
    f_full = 4 * 64 * 64 * 4096 * 4097 / 2
    lc = layer_cost(ctx, full)
    assert lc.attn_fwd == pytest.approx(f_full / (peak * 0.60 * 0.41), rel=1e-9)
    assert lc.attn_bwd == pytest.approx(2.5 * f_full / (peak * 0.45 * 0.50), rel=1e-9)
    pairs = 128 * 129 / 2 + (4096 - 128) * 128
    blocks = (63 / pairs) / (528 / (4096 * 4097 / 2))
    lw = layer_cost(ctx, sliding)
    assert lw.attn_fwd == pytest.approx(blocks * 4 * 64 * 64 * pairs / (peak * 0.60 * 0.41), rel=1e-9)
    assert blocks == pytest.approx(1.94, abs=0.01)


# --------------------------------------------------------------------------- eager ops Megatron leaves unfused


def _traffic(ops: list[tuple[list[int], int]]) -> int:
    """Bytes per element of a sequence of eager ops, each (bytes per element it reads, written)."""
    return sum(sum(reads) + written for reads, written in ops)


#: Megatron's eager code, op by op, as (bytes read per element, bytes written): the clamped GEGLU's
#: input (``fused_bias_geglu.weighted_bias_quick_geglu_impl``), per element of the fc1 output, the two
#: clamps touching half the elements each; the FC2 bias (``TEGroupedMLP._apply_bias``: BF16 output,
#: FP32 ``bias * prob``), per output element; the unfused RoPE (``_apply_rotary_pos_emb_bshd``), per
#: rotated element (the negation touches half).
CLAMP_FWD = [([1], 1), ([1], 1), ([2], 2)]  # clamp gate half, clamp linear half, cat
CLAMP_BWD = [([1, 1], 1), ([1, 1], 1), ([2], 2)]  # each clamp's grad (grad + input read), cat of the halves
BIAS_FWD = [([], 4), ([2, 4], 4), ([4], 4), ([4], 2)]  # bias * prob, t + that, cat, .to(bf16)
BIAS_BWD = [([2], 4), ([4], 2), ([4], 4), ([4], 0), ([4], 4), ([4], 0)]  # cast, input grad, bias grad, prob grad
ROPE_FWD = [([2], 2), ([1], 1), ([2], 2), ([2], 2), ([2, 2], 2), ([2], 2)]  # *cos, -x2, cat, *sin, +, cat
ROPE_BWD = [([2], 2), ([2], 2), ([1], 1), ([2], 2), ([2, 2], 2)]  # two products' grads, neg, cat, their sum


def _gpt_oss_layer(eager: bool, gpu: str = "gb200-186gb", **kw):
    cfg = load_model(CONFIGS / "GPT-OSS-120B.json")
    if not eager:
        cfg = replace(cfg, activation_clamp=0.0, expert_bias=False, rope_attention_factor=1.0)
    s = TimeSettings(ep=64, dp=64, mbs=4, global_batch=1280, **kw)
    ctx = _ctx(cfg, s, gpu)
    role = next(r for r in derive_roles(cfg, role_rule("megatron")).layers if r.window == 0)
    return cfg, ctx, layer_cost(ctx, role)


def test_gpt_oss_eager_ops_move_the_bytes_megatrons_code_does() -> None:
    """GPT-OSS on GB200 at micro-batch 4, EP 64: 16,384 tokens a micro-batch, 65,536 routed rows; the
    clamp over the fc1 output (2 x 2,880 wide), the FC2 bias over the output (2,880), the unfused RoPE
    over q and k (64 + 8 heads of 64) in place of the fused one's read and write (4 B forward, 8
    backward). The layer's memory time grows by exactly those bytes over HBM x the memory share."""
    cfg, ctx, eager = _gpt_oss_layer(True)
    _, _, fused = _gpt_oss_layer(False)
    tokens, rows = 4 * 4096, 4 * 4096 * 4
    fc1, out, rotated = rows * 2 * 2880, rows * 2880, tokens * (64 + 8) * 64
    fwd = fc1 * _traffic(CLAMP_FWD) + out * _traffic(BIAS_FWD) + rotated * (_traffic(ROPE_FWD) - 4)
    bwd = fc1 * _traffic(CLAMP_BWD) + out * _traffic(BIAS_BWD) + rotated * (_traffic(ROPE_BWD) - 8)
    rate = ctx.hw.hbm_bw * ctx.eff.mem
    assert eager.fwd.memory - fused.fwd.memory == pytest.approx(fwd / rate)
    assert eager.bwd.memory - fused.bwd.memory == pytest.approx(bwd / rate)
    assert cfg.rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1)  # YaRN, factor 32


def test_the_clamp_is_recomputed_with_moe_act_and_the_bias_with_moe() -> None:
    """Selective recompute of ``moe_act`` re-runs the clamp (it is inside ``bias_act_func``, which the
    checkpoint wraps); the bias is added after FC2, so only recomputing the whole ``moe`` re-runs it."""
    _, ctx, eager = _gpt_oss_layer(True)
    rate = ctx.hw.hbm_bw * ctx.eff.mem
    fc1, out = 4 * 4096 * 4 * 2 * 2880, 4 * 4096 * 4 * 2880
    _, _, fused = _gpt_oss_layer(False)
    exp = {"tp_f": 0.0, "ep_f": 0.0, "cp_f": 0.0}
    act = TimeSettings(ep=64, dp=64, mbs=4, global_batch=1280, recompute="selective", recompute_modules=("moe_act",))
    moe = replace(act, recompute_modules=("moe",))
    assert (_recompute_seconds(eager, exp, act, False)[0] - _recompute_seconds(fused, exp, act, False)[0]
            == pytest.approx(fc1 * _traffic(CLAMP_FWD) / rate))
    assert (_recompute_seconds(eager, exp, moe, False)[0] - _recompute_seconds(fused, exp, moe, False)[0]
            == pytest.approx((fc1 * _traffic(CLAMP_FWD) + out * _traffic(BIAS_FWD)) / rate))


def test_the_eager_ops_are_issued_by_the_host_one_raw_op_each() -> None:
    """Host: the bias's product and sum per local expert (EP 8: 16 of them) plus two splits, the cat
    and the cast forward, 4 a local expert plus 2 backward; the clamp's 5 / 3; RoPE's 12 / 5 for each
    of q and k - each a raw op, HOST_EXPERT_LAUNCH of a host op."""
    from app.core.time.ops import HOST_EXPERT_LAUNCH

    def layer(eager: bool):
        cfg = load_model(CONFIGS / "GPT-OSS-120B.json")
        if not eager:
            cfg = replace(cfg, activation_clamp=0.0, expert_bias=False, rope_attention_factor=1.0)
        ctx = _ctx(cfg, TimeSettings(pp=4, ep=8, dp=16, mbs=1, global_batch=1280), "h100-80gb")
        return layer_cost(ctx, derive_roles(cfg, role_rule("megatron")).layers[1]), ctx

    (eager, ctx), (fused, _) = layer(True), layer(False)
    op = ctx.eff.host_op * HOST_EXPERT_LAUNCH
    assert eager.host_fwd - fused.host_fwd == pytest.approx((2 * 16 + 4 + 5 + 2 * 12) * op)
    assert eager.host_bwd - fused.host_bwd == pytest.approx((4 * 16 + 2 + 3 + 2 * 5) * op)


def test_yarn_attention_factor_as_megatron_computes_it() -> None:
    """Megatron's concentration factor: ``0.1 ln s + 1`` for factor ``s``; with mscale and mscale_all_dim
    their ratio (equal ones: 1, TE's fused RoPE); 1 for Llama 3's own scaling, a factor of 1, or none."""
    from app.core.model.config import yarn_attention_factor

    assert yarn_attention_factor({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}) == pytest.approx(
        0.1 * math.log(4) + 1)
    assert yarn_attention_factor({"rope_parameters": {"type": "yarn", "factor": 40, "mscale": 1.0,
                                                      "mscale_all_dim": 1.0}}) == 1.0
    assert yarn_attention_factor({"rope_scaling": {"rope_type": "yarn", "factor": 40, "mscale": 1.0,
                                                   "mscale_all_dim": 0.0}}) == pytest.approx(0.1 * math.log(40) + 1)
    assert yarn_attention_factor({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == 1.0
    assert yarn_attention_factor({"rope_scaling": {"rope_type": "yarn", "factor": 1.0}}) == 1.0
    assert yarn_attention_factor({}) == 1.0


def test_gpt_oss_swiglu_limit_is_read_and_checked() -> None:
    import json

    from app.core.model.config import ConfigError, config_from_dict

    def parse_config(raw: dict) -> object:
        return config_from_dict(raw, data=json.dumps(raw).encode(), id="t", source="t", provenance="t")

    raw = json.loads((CONFIGS / "GPT-OSS-120B.json").read_text())
    assert parse_config({**raw, "swiglu_limit": 10}).activation_clamp == 10.0
    assert parse_config({k: v for k, v in raw.items() if k != "swiglu_limit"}).activation_clamp == 7.0
    with pytest.raises(ConfigError, match="swiglu_limit"):
        parse_config({**raw, "swiglu_limit": -1})
    assert load_model(CONFIGS / "Llama-3.1-8B.json").activation_clamp == 0.0


def test_a_mamba_layer_copies_its_layout_only_for_several_sequences() -> None:
    """Nemotron 3 Nano's Mamba mixer (64 heads of 64, 8 groups of state 128: ``in_proj`` writes
    2 x 4,096 + 2 x 1,024 + 64 = 10,304 columns, the scan 4,096): at micro-batch 2 Megatron copies
    both to batch-first and back, 2 B read and 2 written an element, the gradients again backward; at
    micro-batch 1 the permuted tensor is already contiguous and nothing is copied."""
    cfg = load_model(CONFIGS / "Nemotron-3-Nano-30B-A3B.json")
    role = next(r for r in derive_roles(cfg, role_rule("megatron")).layers if r.mixer == "mamba")
    assert cfg.mamba is not None and (cfg.mamba.heads, cfg.mamba.head_dim, cfg.mamba.groups, cfg.mamba.state) == (
        64, 64, 8, 128)
    tokens = 2 * 8192
    copied = (10_304 + 4_096) * tokens * 4 / (get_hardware("gb200-186gb").hbm_bw * CONSTANTS["blackwell"].mem)
    one = layer_cost(_ctx(cfg, TimeSettings(ep=8, dp=8, mbs=1, global_batch=512, seq_length=8192), "gb200-186gb"), role)
    two = layer_cost(_ctx(cfg, TimeSettings(ep=8, dp=8, mbs=2, global_batch=512, seq_length=8192), "gb200-186gb"), role)
    assert two.fwd.memory - 2 * one.fwd.memory == pytest.approx(copied)
    assert two.bwd.memory - 2 * one.bwd.memory == pytest.approx(copied)


def test_the_mamba_kernels_move_their_bytes_at_the_ssd_bandwidth() -> None:
    """Nemotron 3 Nano's Mamba mixer at micro-batch 1 and 8,192 tokens on GB200: its kernels move,
    by the kernel list of ``hybrid.py`` (d = 4,096, G N = 1,024, 64 heads, conv_dim 6,144, FP32 chunk
    states 64 x 64 x 128 x 4 / 128 = 16,384 B and C B^T 8 x 128 x 4 = 4,096 B a token): the conv
    4 x 6,144, sixteen d-wide BF16 passes (65,536), eight of G N (8,192), 26 B a head (1,664), the
    states four times (65,536) and C B^T twice (8,192) = 173,696 B a token forward, three times that
    backward; at 0.45 of a streaming kernel's bandwidth they take 1 / 0.45 of the time they would."""
    from app.core.time.efficiency import SSD_BANDWIDTH

    cfg = load_model(CONFIGS / "Nemotron-3-Nano-30B-A3B.json")
    role = next(r for r in derive_roles(cfg, role_rule("megatron")).layers if r.mixer == "mamba")
    s = TimeSettings(ep=8, dp=8, mbs=1, global_batch=512, seq_length=8192)
    ctx = _ctx(cfg, s, "gb200-186gb")
    streaming = replace(ctx, eff=replace(ctx.eff, ssd_bw=1.0))
    hw, eff = get_hardware("gb200-186gb"), CONSTANTS["blackwell"]
    scan = 173_696 * 8192 / (hw.hbm_bw * eff.mem)
    assert SSD_BANDWIDTH == eff.ssd_bw == 0.45
    fast, slow = layer_cost(streaming, role), layer_cost(ctx, role)
    assert slow.fwd.memory - fast.fwd.memory == pytest.approx(scan * (1 / 0.45 - 1))
    assert slow.bwd.memory - fast.bwd.memory == pytest.approx(3 * scan * (1 / 0.45 - 1))
    assert slow.fwd.gemm == fast.fwd.gemm and slow.fwd.attention == fast.fwd.attention  # only the bytes slow down


def test_a_gemm_pays_for_the_whole_tiles_of_its_output() -> None:
    """GPT-OSS's attention output projection on B200 (16,384 tokens, 4,096 -> 2,880 features): the
    Blackwell kernel's 256 x 128 output tiles (256 on the weight side, cuBLAS's M as Transformer
    Engine calls it) cover 2,880 features with 12 tiles = 3,072 columns, so its tensor time is 3,072 /
    2,880 of the useful FLOPs'; the data gradient (2,880 -> 4,096 features: 16 whole tiles) pays
    nothing; the weight gradient (4,096 x 2,880) pays on the 128-wide side only where it does not
    divide (2,880 = 22.5 x 128: 23 x 128 / 2,880). On H100 (128 x 128 tiles) the forward pays 23 x 128
    / 2,880."""
    from app.core.time.ops import Gemm, _gemm_times, tile_factor

    cfg = load_model(CONFIGS / "GPT-OSS-120B.json")
    s = TimeSettings(ep=64, dp=64, mbs=4, global_batch=1280, precision="bf16")
    proj = Gemm("proj", 16384.0, 2880.0, 4096.0)

    def tensor_seconds(gpu: str, m: float, n: float, k: float, factor: float) -> float:
        hw = get_hardware(gpu)
        eff = CONSTANTS[hw.generation]
        flops = 2 * m * n * k * factor / (hw.peak_flops("bf16") * eff.gemm["bf16"])
        return flops + ((m * k + k * n) * 2 + m * n * 2) / (hw.hbm_bw * eff.mem) + eff.kernel

    ctx = _ctx(cfg, s, "b200-180gb")
    f, _, dgrad = _gemm_times(ctx, proj)
    assert f == pytest.approx(tensor_seconds("b200-180gb", 16384, 2880, 4096, 3072 / 2880))
    assert dgrad == pytest.approx(tensor_seconds("b200-180gb", 16384, 4096, 2880, 1.0))
    assert tile_factor(CONSTANTS["blackwell"], 4096, 2880) == pytest.approx(23 * 128 / 2880)
    assert tile_factor(CONSTANTS["blackwell"], 4096, 4096) == 1.0
    f_h100, _, _ = _gemm_times(_ctx(cfg, s, "h100-80gb"), proj)
    assert f_h100 == pytest.approx(tensor_seconds("h100-80gb", 16384, 2880, 4096, 23 * 128 / 2880))


def test_sequence_parallel_gathers_move_the_quantized_gemm_input() -> None:
    """Llama 3.1 70B at TP 4 with SP on GB200, 8,192 tokens: a layer's TP traffic forward is two
    reduce-scatters of the BF16 activation (8,192 x 8,192 x 2 B) and two all-gathers of the GEMM
    input, which Transformer Engine quantizes before gathering - 1 + 1/32 B an element in MXFP8, 0.5 +
    1/16 in NVFP4, 2 in BF16 - each timed by the collective's own rule."""
    cfg = load_model("llama-3.1-70b")
    role = derive_roles(cfg, role_rule("megatron")).layers[0]
    for precision, element in (("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16), ("bf16", 2.0)):
        s = TimeSettings(tp=4, pp=1, dp=1, mbs=1, global_batch=1, seq_length=8192, sp=True, precision=precision)
        ctx = _ctx(cfg, s, "gb200-186gb")
        act = 8192 * 8192
        rs = comm.reduce_scatter(ctx.groups["tp"], act * 2, ctx.hw, ctx.eff)
        ag = comm.all_gather(ctx.groups["tp"], act * element, ctx.hw, ctx.eff)
        assert layer_cost(ctx, role).tp_fwd == pytest.approx(2 * rs + 2 * ag), precision
