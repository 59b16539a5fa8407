"""Training and inference memory against hand arithmetic, the slime GLM-5.2 profile and FACTS."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from app.core.model.memory import (
    in_flight_microbatches,
    inference_memory,
    kv_bytes_per_token_layer,
    megatron_theoretical,
    training_memory,
)
from app.core.model.parallelism import ParallelConfig
from tests.conftest import make_config, slime_par, tiny_config

GB = 10**9


@pytest.fixture(scope="module")
def glm52():
    return load_model("glm-5.2")


# --------------------------------------------------------------------------- tiny config by hand
#
# H=64 h=4 rq=32 rkv=16 dn=8 dr=4 dv=8 Hi=2 di=8 topk=16 I=128 i=32 E=8 S=1 k=2 V=1000,
# 8 layers, layer 1 dense, full layers 1 and 5. TP2 PP2 DP2 EP2 ETP1 SP, 16 tokens, 4 micro-batches.
# world 2*1*2*2 = 8, EDP = 8 / (1*2*2) = 2, dense optimizer shards DP*CP = 2.

TYPES = ["full", "shared", "shared", "shared", "full", "shared", "shared", "shared"]


def tiny(mtp: int = 0):
    return make_config(tiny_config(8, indexer_types=TYPES, num_nextn_predict_layers=mtp))


def tiny_par(**over) -> ParallelConfig:
    fields = {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "etp": 1, "sp": True, "mbs": 1, "seq_length": 16, "num_microbatches": 4,
                  "gpu": "custom", "gpu_capacity_bytes": 2_000_000}
    fields.update(over)
    return ParallelConfig(**fields)


def tiny_plan(mtp: int = 0):
    return materialise(PipelineSpec(pp=2), 8, default_mtp=mtp)


# per-GPU parameters, by hand
ATTN_SHARDED = 32 * 4 * 12 + 16 * 4 * 16 + 4 * 8 * 64  # q_b + kv_b + o_proj = 4608
ATTN_REPL = 64 * 32 + 32 + 64 * 20 + 16  # q_a + q norm + kv_a + kv norm = 3376
NORMS = 2 * 64
INDEXER = 32 * 2 * 8 + 64 * 8 + 64 * 2 + 2 * 8  # 1168
DENSE_FFN = 3 * 64 * 128
EXPERT = 3 * 64 * 32
ROUTER = 8 * 64
EMB = 1000 * 64
R0_DENSE = (4 * ATTN_SHARDED + DENSE_FFN + 3 * EXPERT + EMB) // 2 + 4 * (ATTN_REPL + NORMS) + INDEXER + 3 * ROUTER
R0_EXPERT = 3 * 4 * EXPERT  # 3 MoE layers x 4 local experts, ETP 1
R1_DENSE = (4 * ATTN_SHARDED + 4 * EXPERT + EMB) // 2 + 4 * (ATTN_REPL + NORMS) + INDEXER + 4 * ROUTER + 64
R1_EXPERT = 4 * 4 * EXPERT

# activations per token of the 16-token micro-batch (bytes)
COMMON = (4 * 2 * 64 // 2  # attn/mlp norm inputs and outputs under SP
          + 2 * 32 + 2 * 32 + 2 * 20 + 2 * 16  # q latent, q latent norm, kv latent, kv latent norm
          + 2 * 4 * 12 // 2 * 2 + 2 * 4 * 8 // 2 + 4 * 4 // 2 + 2 * 4 * 8 // 2)  # q, k, v, lse, o
IDX = 2 * 2 * 8 + 4 * 8 + 2 * 2 + 4 * 16
DENSE_ACT = 4 * 128 // 2 + 2 * 128 // 2
MOE_ACT = ((4 * 8 + 8 * 2) // 2  # router
           + 2 * 64 + 4 * 32 + 2 * 32 + 2 * 64  # k*ETP/TP = 1 routed row per token
           + 4 * 32 // 2 + 2 * 32 // 2)  # shared expert
TOK = 16


def test_hand_constants_are_what_we_think():
    assert (R0_DENSE, R0_EXPERT, R1_DENSE, R1_EXPERT) == (79440, 73728, 70800, 98304)
    assert (COMMON, IDX, DENSE_ACT, MOE_ACT) == (624, 132, 384, 568)


def test_tiny_every_term_by_hand():
    r = training_memory(tiny(), tiny_plan(), tiny_par())
    assert r["gpus"] == 8
    s0, s1 = r["stages"]
    assert s0["params_per_gpu"] == {"dense": R0_DENSE, "expert": R0_EXPERT, "total": R0_DENSE + R0_EXPERT}
    assert s1["params_per_gpu"] == {"dense": R1_DENSE, "expert": R1_EXPERT, "total": R1_DENSE + R1_EXPERT}

    b0 = s0["breakdown"]
    assert b0["weights"] == 2 * (R0_DENSE + R0_EXPERT)
    assert b0["gradients"] == 4 * (R0_DENSE + R0_EXPERT)
    assert b0["optimizer_states"] == 12 * R0_DENSE // 2 + 12 * R0_EXPERT // 2  # d = DP*CP = 2, EDP = 2
    # rank 0 holds min(PP - 0, m) = 2 micro-batches; layer 1 dense+indexer, layers 2-4 MoE shared
    assert s0["in_flight_microbatches"] == [2]
    assert b0["activations"] == 2 * TOK * ((COMMON + IDX + DENSE_ACT) + 3 * (COMMON + MOE_ACT))
    assert b0["topk_indices"] == 2 * 1 * TOK * 16 * 4  # one full layer, int32 x topk 16
    assert b0["logits"] == 0 and b0["recompute_working_set"] == 0

    b1 = s1["breakdown"]
    assert b1["weights"] == 2 * (R1_DENSE + R1_EXPERT)
    assert b1["gradients"] == 4 * (R1_DENSE + R1_EXPERT)
    assert b1["optimizer_states"] == 6 * R1_DENSE + 6 * R1_EXPERT
    assert s1["in_flight_microbatches"] == [1]
    assert b1["activations"] == TOK * ((COMMON + MOE_ACT + IDX) + 3 * (COMMON + MOE_ACT))
    assert b1["topk_indices"] == TOK * 16 * 4
    assert b1["logits"] == TOK * 500 * 4  # t x V/TP x 4 B
    # both ranks hold a full layer: one FP32 [t, t*CP] indexer logits buffer, 16 x 16 x 4 B
    assert b0["indexer_logits"] == b1["indexer_logits"] == TOK * TOK * 1 * 4 == 1024

    t0 = 306336 + 612672 + 919008 + 150912 + 2048 + 1024
    t1 = 338208 + 676416 + 1014624 + 78400 + 1024 + 32000 + 1024
    assert (s0["total_bytes"], s1["total_bytes"]) == (t0, t1)
    assert s0["fits"] and s0["headroom_bytes"] == 2_000_000 - t0
    assert not s1["fits"] and s1["headroom_bytes"] == 2_000_000 - t1
    json.dumps(r)  # JSON-ready


def test_tiny_offload_moves_optimizer_to_host():
    r = training_memory(tiny(), tiny_plan(), tiny_par(optimizer_cpu_offload=True, use_precision_aware_optimizer=True))
    s0 = r["stages"][0]
    assert s0["breakdown"]["optimizer_states"] == 0
    # host: FP32 master + m + v + pinned FP32 grad copy = 16 B per param, sharded over 2
    assert s0["host_bytes"] == 8 * R0_DENSE + 8 * R0_EXPERT
    assert s0["breakdown"]["weights"] == 2 * (R0_DENSE + R0_EXPERT)


def test_precision_aware_stores_master_remainders_lowered_dtypes_change_more():
    base = training_memory(tiny(), tiny_plan(), tiny_par())["stages"][0]["breakdown"]
    aware = training_memory(tiny(), tiny_plan(), tiny_par(use_precision_aware_optimizer=True))["stages"][0]["breakdown"]
    # 16-bit master remainder 2 + m 4 + v 4 = 10 B/param before sharding by 2 (12 without the flag)
    assert base["optimizer_states"] == 6 * R0_DENSE + 6 * R0_EXPERT
    assert aware["optimizer_states"] == 5 * R0_DENSE + 5 * R0_EXPERT
    assert {k: v for k, v in aware.items() if k != "optimizer_states"} == \
        {k: v for k, v in base.items() if k != "optimizer_states"}
    old_te = training_memory(tiny(), tiny_plan(), tiny_par(use_precision_aware_optimizer=True,
                                                           store_param_remainders=False))
    assert old_te["stages"][0]["breakdown"] == base  # Transformer Engine < 2.1 keeps the FP32 master
    low = training_memory(tiny(), tiny_plan(), tiny_par(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                                                        exp_avg_sq_dtype="bf16"))
    # master remainder 2 + bf16 m 2 + bf16 v 2 = 6 B/param before sharding by 2
    assert low["stages"][0]["breakdown"]["optimizer_states"] == 3 * R0_DENSE + 3 * R0_EXPERT


def test_without_distributed_optimizer_18_bytes_per_param():
    b = training_memory(tiny(), tiny_plan(), tiny_par(distributed_optimizer=False))["stages"][0]["breakdown"]
    assert b["weights"] + b["gradients"] + b["optimizer_states"] == 18 * (R0_DENSE + R0_EXPERT)


FULL_R0 = (COMMON + IDX + DENSE_ACT) + 3 * (COMMON + MOE_ACT)  # rank 0: dense layer 1 + MoE layers 2-4


def selective(modules=None):
    return training_memory(tiny(), tiny_plan(), tiny_par(recompute="selective", recompute_modules=modules)
                           )["stages"][0]["breakdown"]["activations"]


def test_selective_default_core_attn_drops_only_the_softmax_lse():
    # Megatron's default --recompute-modules is ["core_attn"] (transformer_config.py:1940-1941); the
    # checkpointed core attention (attention.py:1555) keeps its inputs q, k, v and recomputes what the
    # kernel saves for backward: the FP32 log-sum-exp, 4 B x 4 heads / TP 2 = 8 B per token per layer
    assert selective() == 2 * TOK * (FULL_R0 - 4 * 8)


def test_selective_core_attn_and_mla_up_proj_drop_qkv_heads_and_lse():
    # mla_up_proj discards the up-projected q, k, v heads (multi_latent_attention.py:455-458)
    dropped = 2 * 4 * 12 // 2 * 2 + 2 * 4 * 8 // 2 + 4 * 4 // 2  # q, k, v heads + lse = 136 per token
    assert selective(("core_attn", "mla_up_proj")) == 2 * TOK * (FULL_R0 - 4 * dropped)


def test_each_recompute_module_drops_what_megatron_recomputes():
    norm = 2 * 64 // 2   # one norm output under SP: 2H / TP
    dense_mlp = norm + 4 * 128 // 2 + 2 * 128 // 2   # fused pre-MLP norm + fc1 + SwiGLU output of the dense layer
    # layernorm (transformer_layer.py:475-527): MLA's input norm on all 4 layers, the pre-MLP norm of
    # the 3 MoE layers (the dense layer's is fused into linear_fc1)
    assert selective(("layernorm",)) == 2 * TOK * (FULL_R0 - 4 * norm - 3 * norm)
    # mlp (transformer_layer.py:537-539): dense layers only
    assert selective(("mlp",)) == 2 * TOK * (FULL_R0 - dense_mlp)
    # moe (moe_layer.py:247-251): every MoE-side term of the 3 MoE layers
    assert selective(("moe",)) == 2 * TOK * (FULL_R0 - 3 * MOE_ACT)
    # moe_act (experts.py:269-272): the experts' activation output, 2 B x i/ETP 32 x 1 routed row
    assert selective(("moe_act",)) == 2 * TOK * (FULL_R0 - 3 * 2 * 32)
    # shared_experts (shared_experts.py:157-158): shared fc1 4 x 32 / 2 + act 2 x 32 / 2
    assert selective(("shared_experts",)) == 2 * TOK * (FULL_R0 - 3 * (64 + 32))
    # modules of model families isplan does not load drop nothing
    assert selective(("gdp_qkv",)) == 2 * TOK * FULL_R0


def test_distribute_saved_activations_splits_the_checkpoints_over_tp():
    # tensor_parallel/random.py:619-621 keeps 1/TP of each checkpoint's input; SP must be off
    b = training_memory(tiny(), tiny_plan(), tiny_par(sp=False, recompute="full", recompute_method="uniform",
                                                      recompute_num_layers=1, distribute_saved_activations=True))
    assert b["stages"][0]["breakdown"]["activations"] == 2 * 4 * (2 * 64 // 2) * TOK


def test_full_uniform_recompute_keeps_group_inputs_plus_working_set():
    b = training_memory(tiny(), tiny_plan(), tiny_par(recompute="full", recompute_num_layers=2))["stages"][0]["breakdown"]
    # 4 layers / N=2 -> 2 group inputs of 2H/TP = 64 B per token, 2 micro-batches in flight
    assert b["activations"] == 2 * 2 * 64 * TOK
    # working set: the 2 largest layers of the rank, fully materialised (MoE layers, 1192 B/token)
    assert b["recompute_working_set"] == 2 * (COMMON + MOE_ACT) * TOK
    assert b["topk_indices"] == 2 * TOK * 16 * 4  # kept whatever the recompute mode
    b1 = training_memory(tiny(), tiny_plan(), tiny_par(recompute="full", recompute_num_layers=1))["stages"][0]["breakdown"]
    assert b1["activations"] == 2 * 4 * 64 * TOK
    assert b1["recompute_working_set"] == (COMMON + MOE_ACT) * TOK


def test_full_block_recompute():
    b = training_memory(tiny(), tiny_plan(), tiny_par(recompute="full", recompute_method="block",
                                                      recompute_num_layers=1))["stages"][0]["breakdown"]
    # layer 1 keeps its input only, layers 2-4 keep everything
    assert b["activations"] == 2 * TOK * (64 + 3 * (COMMON + MOE_ACT))


def test_mtp_layer_on_the_last_stage():
    r = training_memory(tiny(1), tiny_plan(1), tiny_par(gpu_capacity_bytes=10**8))
    s1 = r["stages"][1]
    mtp_act = COMMON + MOE_ACT + IDX + 8 * 64 // 2  # MoE layer with its own indexer + enorm/hnorm/eh_proj inputs
    assert s1["breakdown"]["activations"] == TOK * ((COMMON + MOE_ACT + IDX) + 3 * (COMMON + MOE_ACT) + mtp_act)
    assert s1["breakdown"]["topk_indices"] == 2 * TOK * 16 * 4  # layer 5 and the MTP layer
    assert s1["breakdown"]["logits"] == 2 * TOK * 500 * 4  # main head and MTP head


def test_in_flight_microbatches_1f1b_and_interleaved():
    assert in_flight_microbatches(8, 1, None, 0) == [8]
    assert in_flight_microbatches(8, 1, None, 3) == [5]
    assert in_flight_microbatches(8, 1, 2, 0) == [2]
    # PP4 VPP2 rank 0: warm-up 2*(4-0-1) + (2-1)*4 = 10, peak 11 forwards: j mod 8 -> chunk 0 for
    # j = 0..3, 8, 9, 10 and chunk 1 for j = 4..7
    assert in_flight_microbatches(4, 2, None, 0) == [7, 4]
    # FACTS section 7: rank 0 holds PP*(1 + (PP-1)/(PP*VPP)) = 4 * 11/8 = 5.5 rank-sized micro-batches
    assert sum(in_flight_microbatches(4, 2, None, 0)) / 2 == 4 * (1 + 3 / 8)
    # rank 3: warm-up 0 + 4 = 4, peak 5: four on chunk 0, one on chunk 1
    assert in_flight_microbatches(4, 2, None, 3) == [4, 1]
    # m == PP: Megatron runs every forward first
    assert in_flight_microbatches(4, 2, 4, 0) == [4, 4]


def test_invalid_plan_is_refused(glm52):
    bad = materialise(PipelineSpec(split=(10, 10, 10, 10, 10, 10, 9, 8)), 78)
    with pytest.raises(ValueError):
        training_memory(glm52, bad, ParallelConfig(pp=8, tp=4, sp=True, seq_length=4096))


# --------------------------------------------------------------------------- slime GLM-5.2 profile
#
# As launched (THUDM/slime scripts/run-glm5.2-744B-A40B.sh, FACTS.md section 1): TP4 CP8 PP8 EP32
# ETP1 SP, first 14 last 16, full recompute uniform 1, 8192 tokens/GPU, and no --mtp-num-layers,
# so no MTP layer (slime/utils/arguments.py: default None). Every figure below is re-derived here
# from the GLM-5.2 shapes (FACTS.md section 1) by hand.

H, h, RQ, RKV, DN, DR, DV = 6144, 64, 2048, 512, 192, 64, 256
HI, DI, TOPK, V, I_DENSE, I_EXP = 32, 128, 2048, 154880, 12288, 2048
T, CP, TP = 8192, 8, 4
MLA_SHARDED = RQ * h * (DN + DR) + RKV * h * (DN + DV) + h * DV * H
MLA_REPL = H * RQ + RQ + H * (RKV + DR) + RKV
INDEXER_P = RQ * HI * DI + H * DI + H * HI + 2 * DI
EXPERT_P = 3 * H * I_EXP
LAYER_DENSE_PER_GPU = MLA_SHARDED // TP + MLA_REPL + 2 * H  # attention + norms of any layer
MOE_DENSE_PER_GPU = EXPERT_P // TP + 256 * H  # shared expert (TP-sharded) + router
# rank 7: layers 63-78, all MoE, full layers 63, 67, 71, 75; lm_head + final norm
D7 = 16 * (LAYER_DENSE_PER_GPU + MOE_DENSE_PER_GPU) + 4 * INDEXER_P + V * H // TP + H
X7 = 16 * 8 * EXPERT_P  # 256 experts / EP32 = 8 local experts, ETP 1
# rank 0: layers 1-14, dense 1-3, MoE 4-14, full layers 1, 2, 3, 7, 11; embedding
D0 = (14 * LAYER_DENSE_PER_GPU + 3 * 3 * H * I_DENSE // TP + 11 * MOE_DENSE_PER_GPU + 5 * INDEXER_P
      + V * H // TP)
X0 = 11 * 8 * EXPERT_P
# per-token bytes of a MoE layer that owns an indexer, nothing recomputed (module docstring table):
# norms under SP, q/kv latents, q/k/v heads, lse, o input, indexer q/k/weights/scores,
# router, routed rows k*ETP/TP = 2 per token (input, fc1, act, output), shared expert
MOE_FULL_LAYER = (4 * 2 * H // TP + 2 * RQ * 2 + 2 * (RKV + DR) + 2 * RKV
                  + 3 * 2 * h * 256 // TP + 4 * h // TP + 2 * h * DV // TP
                  + 2 * HI * DI + 4 * DI + 2 * HI + 4 * TOPK
                  + (4 * 256 + 8 * 8) // TP + 2 * (2 * H * 2) + 4 * I_EXP * 2 + 2 * I_EXP * 2
                  + 4 * I_EXP // TP + 2 * I_EXP // TP)
INDEXER_LOGITS = T * (T * CP) * 4  # FP32 [8192, 65536]
TOPK_PER_LAYER = T * TOPK * 4  # int32 indices of one full layer, one micro-batch


def rank7_state(opt_bytes_per_param: int) -> int:
    """Weights 2 B + gradients 4 B on every param; optimizer state over DP*CP = 8 (dense) and
    EDP = 1 (experts)."""
    return 6 * (D7 + X7) + opt_bytes_per_param * (-(-D7 // 8) + X7)


RANK7_ACTS = (16 * 2 * H // TP * T  # one in-flight micro-batch, 16 group inputs (uniform, 1 layer)
              + MOE_FULL_LAYER * T  # recompute working set: one layer
              + 4 * TOPK_PER_LAYER  # top-k of the four full layers
              + INDEXER_LOGITS
              + T * (V // TP) * 4)  # FP32 logits of the loss head


@pytest.fixture(scope="module")
def slime_plan():
    plan = materialise(PipelineSpec(pp=8, first=14, last=16, mtp_layers=0), 78)
    assert plan.mtp_layers == 0
    return plan


@pytest.fixture(scope="module")
def slime(glm52, slime_plan):
    with_off = training_memory(glm52, slime_plan, slime_par())
    without = training_memory(glm52, slime_plan, slime_par(optimizer_cpu_offload=False))
    return with_off, without


def test_slime_rank7_by_hand_with_offload(slime):
    r7 = slime[0]["stages"][7]
    assert (r7["num_layers"], r7["mtp_layers"]) == (16, 0)
    assert r7["params_per_gpu"] == {"dense": D7, "expert": X7, "total": D7 + X7}
    d = r7["breakdown_detail"]
    assert d["indexer_logits"] == INDEXER_LOGITS == 2_147_483_648
    assert d["topk_indices"] == 4 * TOPK_PER_LAYER
    assert d["recompute_working_set"] == MOE_FULL_LAYER * T
    assert r7["total_bytes"] == rank7_state(0) + RANK7_ACTS
    # The 39.99 GB is item 1 alone (no MTP layer); item 4 then adds the indexer's
    # 2.15 GB logits transient on this rank (it holds full layers 63, 67, 71, 75): 42.14 GB.
    assert round((r7["total_bytes"] - INDEXER_LOGITS) / GB, 2) == 39.99
    assert round(r7["total_bytes"] / GB, 2) == 42.14
    # host: 16 B per sharded parameter (FP32 master, m, v, pinned FP32 grad copy)
    assert r7["host_bytes"] == 16 * (-(-D7 // 8) + X7)
    assert round(r7["host_bytes"] / GB, 1) == 79.9  # the figure per GPU


def test_slime_host_memory_per_node(slime):
    host = slime[0]["host_memory"]
    # TP*CP*DP = 32 GPUs per pipeline rank: each 8-GPU node holds one pipeline rank, 4 nodes per rank
    assert host["nodes"] == 32 and host["gpus_per_node"] == 8
    r7 = slime[0]["stages"][7]["host_bytes"]
    assert host["per_node"][28:] == [8 * r7] * 4
    assert host["max_node_bytes"] == 8 * r7 and round(8 * r7 / GB) == 639  # "about 640 GB per node"
    assert host["capacity_bytes_per_node"] == 2048 * GB and host["fits"]
    small = training_memory(load_model("glm-5.2"), materialise(PipelineSpec(pp=8, first=14, last=16), 78),
                            slime_par(host_memory_gb=512))["host_memory"]
    assert not small["fits"]


def test_host_memory_per_node_when_a_node_spans_pipeline_ranks():
    # TP2 PP2 DP2 (tiny_par) = 8 GPUs: world / PP = 4 GPUs per pipeline rank; global ranks in
    # tp-cp-ep-dp-pp order put ranks 0-3 on pipeline rank 0 and 4-7 on pipeline rank 1. With 2 GPUs
    # per node, nodes 0-1 hold pipeline rank 0 and nodes 2-3 pipeline rank 1; with 8 one node holds both.
    r = training_memory(tiny(), tiny_plan(), tiny_par(optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                                                      gpus_per_node=2, host_memory_gb=1e-3))
    h0 = 8 * (R0_DENSE + R0_EXPERT)  # 16 B per param sharded over 2
    h1 = 8 * (R1_DENSE + R1_EXPERT)
    assert r["host_memory"]["per_gpu_by_rank"] == [h0, h1]
    assert r["host_memory"]["per_node"] == [2 * h0, 2 * h0, 2 * h1, 2 * h1]
    assert r["host_memory"]["fits"] is (2 * h1 <= 1e6)
    one = training_memory(tiny(), tiny_plan(), tiny_par(optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                                                        gpus_per_node=8))["host_memory"]
    assert one["per_node"] == [4 * h0 + 4 * h1] and one["nodes"] == 1


def test_slime_without_offload(glm52, slime, slime_plan):
    _, without = slime  # as launched minus offload: --use-precision-aware-optimizer still on
    r7 = without["stages"][7]
    assert not without["fits"] and [s["pp_rank"] for s in without["stages"] if not s["fits"]] == [7]
    assert r7["dominant_term"] == "optimizer_expert"
    assert r7["breakdown_detail"]["optimizer_expert"] == 10 * X7  # remainder 2 + m 4 + v 4, EDP 1
    assert r7["total_bytes"] == rank7_state(10) + RANK7_ACTS
    fp32 = training_memory(glm52, slime_plan, slime_par(optimizer_cpu_offload=False,
                                                        use_precision_aware_optimizer=False))
    f7, f0 = fp32["stages"][7], fp32["stages"][0]
    assert f7["total_bytes"] == rank7_state(12) + RANK7_ACTS
    # The 99.93 GB is item 1 alone with 12 B/param; the indexer logits add 2.15 GB
    assert round((f7["total_bytes"] - INDEXER_LOGITS) / GB, 2) == 99.93
    # rank 0 with 12 B/param: margin 1.4 GB once the indexer logits are in the peak (issue item 4)
    r0_total = (6 * (D0 + X0) + 12 * (-(-D0 // 8) + X0)
                + 8 * 14 * 2 * H // TP * T  # 8 in-flight micro-batches x 14 group inputs
                + MOE_FULL_LAYER * T + 8 * 5 * TOPK_PER_LAYER + INDEXER_LOGITS)
    assert f0["total_bytes"] == r0_total
    assert round(f0["headroom_bytes"] / GB, 1) == 1.4
    assert "expert optimizer state" in without["explanation"] and "rank 7" in without["explanation"]


def test_slime_fits_every_rank_with_offload(slime):
    with_off, _ = slime
    assert with_off["fits"]
    for s in with_off["stages"]:
        assert s["fits"] and s["total_bytes"] < 80e9
        assert s["breakdown"]["optimizer_states"] == 0 and s["host_bytes"] > 0
    text = with_off["explanation"]
    assert "rank 7" in text and "expert optimizer state" in text and "= 1" in text
    assert "--optimizer-cpu-offload" in text


def test_every_layer_topk_model_keeps_no_topk_under_full_recompute():
    glm51 = load_model("glm-5.1")  # every layer computes its own top-k
    plan = materialise(PipelineSpec(pp=8, first=14, last=16, mtp_layers=0), 78)
    full = training_memory(glm51, plan, slime_par())
    assert all(s["breakdown"]["topk_indices"] == 0 for s in full["stages"])
    sel = training_memory(glm51, plan, slime_par(recompute="selective"))
    assert sel["stages"][0]["breakdown"]["topk_indices"] == 8 * 14 * TOPK_PER_LAYER  # all 14 own one


def test_megatron_theoretical_for_the_slime_profile(glm52):
    mt = megatron_theoretical(glm52, slime_par(), mtp_layers=1)
    # the issue: most loaded shard ~3.95B params and ~66 GiB of weights and optimizer state (with MTP)
    assert mt["params_most_loaded_shard"] == pytest.approx(3.95e9, rel=0.02)
    assert mt["weight_and_optimizer_gib"] == pytest.approx(66, rel=0.03)
    assert mt["bytes_per_param_expert"] == 18  # 6 + 12/EDP with EDP 1
    # --make-vocab-size-divisible-by 128 x TP 4: 154880 -> ceil(154880 / 512) * 512 = 155136
    assert mt["padded_vocab_size"] == 303 * 512 == 155136
    assert megatron_theoretical(glm52, slime_par(make_vocab_size_divisible_by=1))["padded_vocab_size"] == 154880
    assert megatron_theoretical(glm52, slime_par(), make_vocab_size_divisible_by=64)["padded_vocab_size"] == 154880


def test_megatron_theoretical_under_reports_the_real_plan(slime):
    mt = slime[0]["megatron_theoretical"]
    assert mt["vs_model"]["model_max_params_per_gpu"] > mt["params_most_loaded_shard"]
    assert mt["vs_model"]["under_report_fraction"] > 0.2


# --------------------------------------------------------------------------- inference


def test_glm52_kv_per_token_bf16_and_a_1m_sequence(glm52):
    r = inference_memory(glm52, tp=8, ep=8, kv_dtype="bf16", context=1_048_576, batch=1)
    assert r["kv"]["bytes_per_token"] == 78 * (512 + 64) * 2 + 21 * (128 + 4) == 92_628
    assert r["kv"]["mtp_included"] is False
    assert r["kv_bytes_per_sequence"] == 92_628 * 1_048_576
    assert round(r["kv_bytes_per_sequence"] / GB) == 97  # FACTS 5: "about 97 GB"


def test_glm52_kv_fp8_by_hand(glm52):
    # fp8_ds_mla: 512 fp8 + 4 fp32 scales (16 B) + 64 bf16 rope (128 B) = 656 per layer
    assert kv_bytes_per_token_layer(glm52, "fp8") == 512 + 16 + 128 == 656
    assert kv_bytes_per_token_layer(glm52, "bf16") == 1152
    r = inference_memory(glm52, tp=8, ep=8, kv_dtype="fp8", context=1024)
    assert r["kv"]["bytes_per_token"] == 78 * 656 + 21 * 132 == 53_940


def test_mtp_adds_one_latent_and_one_indexer_layer(glm52):
    r = inference_memory(glm52, tp=8, ep=8, context=1024, include_mtp=True)
    assert r["kv"]["bytes_per_token"] == 79 * 1152 + 22 * 132


def test_tp_does_not_shard_kv_but_dp_attention_splits_sequences(glm52):
    a = inference_memory(glm52, tp=8, ep=8, context=4096, batch=16)
    b = inference_memory(glm52, tp=8, ep=8, context=4096, batch=16, dp_attention=True)
    assert a["kv_bytes_per_gpu"] == 16 * 4096 * 92_628
    assert b["kv_bytes_per_gpu"] == 2 * 4096 * 92_628  # 16 sequences over 8 attention-DP ranks
    assert b["weights_bytes_per_gpu"] > a["weights_bytes_per_gpu"]  # attention replicated


def test_largest_context_is_the_boundary(glm52):
    r = inference_memory(glm52, tp=8, ep=8, weight_dtype="fp8", gpu="h200-141gb", context=1024, batch=1)
    avail = 141 * 10**9 - r["weights_bytes_per_gpu"]
    n = r["max_context_tokens"]
    assert n > 0
    assert n * 92_628 <= avail < (n + 1) * 92_628


def test_tiny_inference_weights_by_hand():
    cfg = make_config(tiny_config(8, indexer_types=TYPES, num_nextn_predict_layers=0))
    r = inference_memory(cfg, tp=2, ep=2, context=10, gpu="custom", gpu_capacity_bytes=10**9)
    sharded = 8 * ATTN_SHARDED + DENSE_FFN + 7 * EXPERT + 2 * EMB  # + embedding and lm_head
    repl = 8 * (ATTN_REPL + NORMS) + 2 * INDEXER + 7 * ROUTER + 64
    assert r["params_per_gpu"]["dense"] == sharded // 2 + repl
    assert r["params_per_gpu"]["expert"] == 7 * 4 * EXPERT
    assert r["weights_bytes_per_gpu"] == 2 * (sharded // 2 + repl + 7 * 4 * EXPERT)
    # KV: 8 layers x (16 + 4) x 2 B + 2 indexer layers x (8 + 4) B
    assert r["kv"]["bytes_per_token"] == 8 * 40 + 2 * 12


# --------------------------------------------------------------------------- monotonicity


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       st.sampled_from([1, 2, 4, 8, 16, 32]), st.booleans(), st.sampled_from(["bf16", "fp8"]))
def test_more_tp_never_raises_inference_weights(tp_a, tp_b, ep, dp_attn, wdt):
    cfg = load_model("glm-5.2")
    lo, hi = sorted((tp_a, tp_b))
    a = inference_memory(cfg, tp=lo, ep=ep, dp_attention=dp_attn, weight_dtype=wdt, context=1)
    b = inference_memory(cfg, tp=hi, ep=ep, dp_attention=dp_attn, weight_dtype=wdt, context=1)
    assert b["weights_bytes_per_gpu"] <= a["weights_bytes_per_gpu"]


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))
def test_more_tp_never_raises_training_weights(tp_a, tp_b):
    cfg = tiny()
    lo, hi = sorted((tp_a, tp_b))
    plan = tiny_plan()
    a = training_memory(cfg, plan, tiny_par(tp=lo, etp=None, sp=lo > 1))
    b = training_memory(cfg, plan, tiny_par(tp=hi, etp=None, sp=hi > 1))
    for sa, sb in zip(a["stages"], b["stages"]):
        assert sb["breakdown"]["weights"] <= sa["breakdown"]["weights"]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2_000_000), st.integers(1, 2_000_000), st.sampled_from(["bf16", "fp8"]),
       st.integers(1, 8))
def test_more_context_never_lowers_kv(c1, c2, kv, batch):
    cfg = load_model("glm-5.2")
    lo, hi = sorted((c1, c2))
    a = inference_memory(cfg, tp=8, ep=8, kv_dtype=kv, context=lo, batch=batch)
    b = inference_memory(cfg, tp=8, ep=8, kv_dtype=kv, context=hi, batch=batch)
    assert b["kv_bytes_per_gpu"] >= a["kv_bytes_per_gpu"]
    assert b["kv_bytes_per_sequence"] >= a["kv_bytes_per_sequence"]


def test_replace_keeps_config_frozen():
    p = tiny_par()
    assert replace(p, tp=4).tp == 4 and p.tp == 2


def test_rank_totals_fast_path_equals_the_full_report():
    from app.core.engines.megatron import pipeline_spec
    from app.core.engines.megatron.placement import materialise
    from app.core.engines.slime import SLIME_GLM52_PROFILE
    from app.core.evaluate import evaluate
    from app.core.model.config import load_model
    from app.core.model.memory import rank_totals, training_memory
    from app.core.model.roles import derive_roles

    cfg = load_model("glm-5.2")
    par = evaluate(SLIME_GLM52_PROFILE, cfg).par   # the pinned slime profile the presets open
    # with an MTP layer: the MTP path of the fast path too
    plan = materialise(replace(pipeline_spec(SLIME_GLM52_PROFILE), mtp_layers=1), 78)
    roles = derive_roles(cfg)
    full = training_memory(cfg, plan, par, roles)
    assert rank_totals(cfg, roles, plan, par) == [s["total_bytes"] for s in full["stages"]]


# --------------------------------------------------------------------------- Megatron's estimate, generated


def _megatron_matrices(raw: dict, bias: bool) -> dict[str, int]:
    """The weight matrices of one layer part of a tiny MLA config, listed one by one as Megatron-Core
    builds them (linear_q_down_proj, q_layernorm, linear_q_up_proj, linear_kv_down_proj,
    kv_layernorm, linear_kv_up_proj, linear_proj; SwiGLU fc1 = gate + up, fc2), the way
    report_theoretical_memory counts them (no DSA indexer, RMSNorm = one weight vector)."""
    H, h, rq, rkv = raw["hidden_size"], raw["num_attention_heads"], raw["q_lora_rank"], raw["kv_lora_rank"]
    dn, dr, dv = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"], raw["v_head_dim"]
    E, i, S = raw["n_routed_experts"], raw["moe_intermediate_size"], raw["n_shared_experts"]
    attn = (H * rq + rq + rq * h * (dn + dr)          # q down, q norm, q up
            + H * rkv + H * dr + rkv + rkv * h * (dn + dv)   # kv down (latent + rope key), kv norm, kv up
            + h * dv * H)                              # output projection
    swiglu = lambda width: 2 * H * width + width * H  # noqa: E731 - fc1 (gate + up) and fc2
    return {"attn": attn, "dense": swiglu(raw["intermediate_size"]), "shared": S * swiglu(i),
            "routed": E * swiglu(i), "norms": 2 * H, "router": H * E + (E if bias else 0)}


@settings(max_examples=60, deadline=None)
@given(layers=st.sampled_from([4, 8, 12, 16]), dense_first=st.integers(0, 3), mtp=st.integers(0, 1),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       ep=st.sampled_from([1, 2, 4]), etp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4]),
       dist=st.booleans(), bias=st.booleans(), tied=st.booleans())
def test_megatron_theoretical_weights_and_optimizer_on_generated_configs(layers, dense_first, mtp, tp, pp, cp,
                                                                        ep, etp, dp, dist, bias, tied):
    raw = tiny_config(layers, first_k_dense_replace=dense_first, num_nextn_predict_layers=mtp,
                      tie_word_embeddings=tied)
    cfg = make_config(raw)
    par = ParallelConfig(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp=dp, seq_length=64, distributed_optimizer=dist)
    m = _megatron_matrices(raw, bias)
    H = raw["hidden_size"]
    n_moe = layers - dense_first
    mtp_moe = mtp if n_moe else 0            # an MTP layer copies the last decoder layer's FFN kind
    unit = 128 * tp
    emb = H * (-(-raw["vocab_size"] // unit) * unit)
    tp_sh = ((m["attn"] + m["dense"]) * dense_first + (m["attn"] + m["shared"]) * n_moe) / pp
    tp_sh += (m["attn"] + m["dense"]) * (mtp - mtp_moe) + (m["attn"] + m["shared"]) * mtp_moe + emb
    tp_sh = (tp_sh + (emb if pp == 1 and not tied else 0)) / tp
    repl = (m["norms"] * layers + m["router"] * n_moe + H) / pp + m["norms"] * mtp + m["router"] * mtp_moe
    exp = (m["routed"] * n_moe / pp + m["routed"] * mtp_moe) / (etp * ep)
    world = tp * pp * cp * dp
    d_dense, d_exp = max(1, world // (tp * pp * cp)), max(1, world // (etp * ep * pp))
    bpp = (lambda d: 6 + 12 / d) if dist else (lambda d: 18.0)
    mt = megatron_theoretical(cfg, par, add_bias_linear=bias)
    assert mt["params_most_loaded_shard"] == round(tp_sh + repl + exp)
    assert mt["params_most_loaded_shard_split"] == {"tp_sharded": round(tp_sh), "replicated": round(repl),
                                                    "routed_experts": round(exp)}
    assert mt["weight_and_optimizer_bytes"] == pytest.approx((tp_sh + repl) * bpp(d_dense) + exp * bpp(d_exp),
                                                             abs=1)
    assert (mt["data_parallel_size"], mt["expert_data_parallel_size"]) == (d_dense, d_exp)


@settings(max_examples=60, deadline=None)
@given(layers=st.sampled_from([4, 8]), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       vpp=st.sampled_from([None, 2]), m=st.sampled_from([None, 1, 2, 8]), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective"]), mbs=st.sampled_from([1, 2]), seq=st.sampled_from([32, 64]))
def test_megatron_theoretical_activations_on_generated_configs(layers, tp, pp, vpp, m, sp, recompute, mbs, seq):
    """Korthikanti et al.'s per-layer formulas as Megatron's compute_activation_memory(_without_sp)
    apply them, written out per branch."""
    raw = tiny_config(layers)
    cfg = make_config(raw)
    vpp = vpp if pp > 1 else None
    par = ParallelConfig(tp=tp, pp=pp, vpp=vpp, sp=sp and tp > 1, recompute=recompute, mbs=mbs, seq_length=seq,
                         num_microbatches=m)
    H, I = raw["hidden_size"], raw["intermediate_size"]
    V = -(-raw["vocab_size"] // (128 * tp)) * (128 * tp)
    sbh = seq * mbs * H
    scale = (1 + (pp - 1) / (pp * vpp)) if vpp else (min(1, m / pp) if pp > 1 and m is not None else 1)
    if par.sp and recompute == "selective":
        want = (sbh * (18 + 4 * I / H) * layers + 8 * seq * mbs * pp + sbh * pp) * scale
        want = (want + (sbh * 4 * (1 + V / H) if pp == 1 else 0)) / tp
    else:
        want = (sbh * (10 + 24 / tp) * layers + 8 * seq * mbs * pp + sbh * pp) * scale
        want = (want + ((seq * mbs * V / tp + sbh) * 2 if pp == 1 else 0)) * 1.05
    mt = megatron_theoretical(cfg, par)
    assert mt["activation_bytes"] == pytest.approx(want, rel=1e-12, abs=1)
    assert mt["activation_seq_length"] == seq


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), ep=st.sampled_from([1, 2, 8]), dp_attn=st.booleans(),
       kv=st.sampled_from(["bf16", "fp8"]), wdt=st.sampled_from(["bf16", "fp8"]), mtp=st.booleans(),
       context=st.integers(1, 300_000), batch=st.integers(1, 40))
def test_inference_budget_is_the_boundary_on_generated_settings(tp, ep, dp_attn, kv, wdt, mtp, context, batch):
    """max_context_tokens and max_batch are the largest values that still fit (one more does not),
    each re-checked through the estimate itself at that setting; the KV total is bytes per token x
    context x sequences per GPU."""
    cfg = load_model("glm-5.2")
    kw = dict(tp=tp, ep=ep, dp_attention=dp_attn, kv_dtype=kv, weight_dtype=wdt, include_mtp=mtp,
              gpu="h200-141gb")
    r = inference_memory(cfg, context=context, batch=batch, **kw)
    seqs = -(-batch // tp) if dp_attn else batch
    assert r["sequences_per_gpu"] == seqs
    assert r["kv_bytes_per_gpu"] == r["kv"]["bytes_per_token"] * context * seqs
    assert r["fits"] == (r["weights_bytes_per_gpu"] + r["kv_bytes_per_gpu"] <= r["capacity_bytes"])
    if r["max_context_tokens"] >= 1:
        assert inference_memory(cfg, context=r["max_context_tokens"], batch=batch, **kw)["fits"]
    assert not inference_memory(cfg, context=r["max_context_tokens"] + 1, batch=batch, **kw)["fits"]
    step = tp if dp_attn else 1   # with DP attention the batch grows in whole sequences per GPU
    if r["max_batch"] >= 1:
        assert inference_memory(cfg, context=context, batch=r["max_batch"], **kw)["fits"]
    assert not inference_memory(cfg, context=context, batch=r["max_batch"] + step, **kw)["fits"]


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(1, 8), per_pp=st.integers(1, 40), per_node=st.integers(1, 16), data=st.data())
def test_host_bytes_per_node_sums_every_gpu_of_the_node(pp, per_pp, per_node, data):
    """Host bytes per node = the sum over the node's GPUs of their pipeline rank's bytes, global
    rank g on pipeline rank g // (world / PP) (Megatron's tp-cp-ep-dp-pp order), brute force."""
    from types import SimpleNamespace

    from app.core.model.memory import host_bytes_per_node

    per_rank = data.draw(st.lists(st.integers(0, 10**12), min_size=pp, max_size=pp))
    world = pp * per_pp
    par = SimpleNamespace(world=world, gpus_per_pp_rank=per_pp, gpus_per_node=per_node)
    gpu_bytes = [per_rank[g // per_pp] for g in range(world)]
    expected = [sum(gpu_bytes[n:n + per_node]) for n in range(0, world, per_node)]
    assert host_bytes_per_node(par, per_rank) == expected  # type: ignore[arg-type]
