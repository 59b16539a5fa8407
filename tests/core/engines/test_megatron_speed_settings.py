"""The speed settings a Megatron plan carries (``--overlap-moe-expert-parallel-comm``,
``--moe-token-dispatcher-type``, ``--cuda-graph-impl``, ``--fp8-dot-product-attention``,
``--fp8-output-proj``): Megatron's refusals of them, the step time they change, and the export a
launcher reads back as the same plan. The refusals of the overlap switches and the dispatcher are
also checked against generated launchers in test_megatron_settings_oracle.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.parallel import check_parallel
from app.core.evaluate import evaluate
from app.core.launcher import import_launcher
from app.core.model.config import load_model
from app.core.model.parallelism import ParallelConfig
from app.core.plan import Plan, plan_from_query

QWEN = load_model("qwen3-30b-a3b")
#: Qwen3-30B-A3B on one GB200 NVL72 tray group: EP 8, PP 1 (the EP overlap needs no VPP there)
BASE = {"model": QWEN.id, "engine": "megatron", "pp": "1", "tp": "1", "ep": "8", "dp": "8", "mbs": "2",
        "global_batch": "512", "seq_length": "4096", "gpu": "gb200-186gb", "precision": "mxfp8",
        "moe_token_dispatcher_type": "flex"}


def _evaluated(**changes: str):
    plan, problems = plan_from_query({**BASE, **changes})
    assert problems == []
    return evaluate(plan, QWEN)


@pytest.mark.parametrize("precision,message", [
    ("bf16", "fp8_output_proj must be used together with fp8 mode."),
    ("nvfp4", "fp8_output_proj must be used together with fp8 mode."),
    ("fp8", "fp8_output_proj requires fp8_recipe='mxfp8', got 'tensorwise'."),
    ("mxfp8", None),
])
def test_fp8_output_proj_needs_the_mxfp8_recipe(precision, message):
    """``TransformerConfig.__post_init__`` (Megatron-LM transformer_config.py @ d98e8a64): FP8 mode,
    then the MXFP8 recipe; isplan's fp8 is Megatron's tensorwise (current-scaling) recipe and NVFP4
    runs without ``--fp8-format``."""
    par = ParallelConfig(tp=1, pp=1, gpus=8, ep=8, seq_length=4096, fp8_output_proj=True, precision=precision)
    bad = [c for c in check_parallel(QWEN, par) if c.name == "fp8_output_proj"]
    if message is None:
        assert bad == []
    else:
        assert len(bad) == 1 and not bad[0].ok and bad[0].message.startswith(message)


def test_full_iteration_graphs_take_the_host_off_the_step():
    """Eager, the host issues every kernel and a small-expert model at MBS 2 waits on it; one graph
    replaying the step has no issue cost: the host share of the breakdown is zero and the step is
    shorter by at least what the host exposed. A partial graph is timed as eager and says so."""
    eager, graph = _evaluated(), _evaluated(cuda_graph_impl="full_iteration")
    assert eager.verdict.go and graph.verdict.go
    host = eager.time["breakdown"]["host"]["exposed"]
    assert host > 0 and graph.time["breakdown"]["host"]["exposed"] == 0
    assert graph.time["step_seconds"] <= eager.time["step_seconds"] - host + 1e-9
    partial = _evaluated(cuda_graph_impl="transformer_engine")
    assert partial.time["step_seconds"] == eager.time["step_seconds"]
    assert any("timed as eager" in n for n in partial.time["assumed"])


def test_the_ep_overlap_hides_all_to_all_and_its_refusals_block_the_verdict():
    """With ``--overlap-moe-expert-parallel-comm`` the all-to-all's total is unchanged and less of it
    is exposed; without a dispatcher Megatron's default allgather refuses the overlap, and PP > 1
    without VPP is refused (transformer_config.py @ d98e8a64)."""
    plain, overlap = _evaluated(), _evaluated(overlap_moe_expert_parallel_comm="1")
    assert overlap.verdict.go
    ep, ep_o = plain.time["breakdown"]["ep"], overlap.time["breakdown"]["ep"]
    assert ep_o["total"] == pytest.approx(ep["total"]) and ep_o["exposed"] < ep["exposed"]
    refused = _evaluated(overlap_moe_expert_parallel_comm="1", moe_token_dispatcher_type="", pp="2", dp="4")
    codes = {r.code for r in refused.verdict.blocking}
    assert {"ep_overlap_dispatcher", "ep_overlap_vpp"} <= codes and not refused.verdict.go


def test_alltoall_sends_every_expert_copy_flex_one_per_domain():
    """At EP 32 on H100 (four 8-GPU domains) NCCL's alltoall moves each of a token's top-8 copies,
    DeepEP / HybridEP (flex) one per remote domain: the all-to-all takes longer with alltoall."""
    q = {**BASE, "gpu": "h100-80gb", "precision": "fp8", "ep": "32", "dp": "32", "global_batch": "1024", "mbs": "1"}
    times = {}
    for dispatcher in ("flex", "alltoall"):
        plan, _ = plan_from_query({**q, "moe_token_dispatcher_type": dispatcher})
        times[dispatcher] = evaluate(plan, QWEN).time["breakdown"]["ep"]["total"]
    assert times["alltoall"] > times["flex"] > 0


@settings(max_examples=40, deadline=None)
@given(ep_overlap=st.booleans(), dispatcher=st.sampled_from([None, "alltoall", "flex", "allgather"]),
       graphs=st.sampled_from(["none", "local", "transformer_engine", "full_iteration"]),
       fp8_output=st.booleans(), tp_overlap=st.booleans())
def test_the_export_reads_back_as_the_same_speed_settings(ep_overlap, dispatcher, graphs, fp8_output, tp_overlap):
    """Differential: a plan's Megatron export, read back as a launcher, is the same plan in every
    speed setting Megatron-LM has a flag for (FP8 attention has none: Megatron-LM keeps
    ``fp8_dot_product_attention`` out of its arguments, so it is neither written nor read)."""
    plan = Plan(model=QWEN.id, engine="megatron", pp=1, tp=2, sp=True, ep=8, gpus=16, mbs=1, global_batch=64,
                seq_length=4096, gpu="gb200-186gb", precision="mxfp8", overlap_moe_expert_parallel_comm=ep_overlap,
                moe_token_dispatcher_type=dispatcher, cuda_graph_impl=graphs, fp8_output_proj=fp8_output,
                tp_comm_overlap=tp_overlap, overlap_grad_reduce=True, overlap_param_gather=True)
    export = evaluate(plan, QWEN).exports()["megatron"]
    assert ("--no-check-for-nan-in-loss-and-grad" in export) == (graphs == "full_iteration")
    back = import_launcher("torchrun pretrain_gpt.py " + export.replace("\\\n", " ") + "\n", QWEN,
                           Plan(model=QWEN.id)).plan
    for name in ("overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type", "cuda_graph_impl",
                 "fp8_output_proj", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather"):
        assert getattr(back, name) == getattr(plan, name), name


def test_fp8_attention_counts_under_fp8_only():
    """``--fp8-dot-product-attention`` runs the attention core in FP8 under an FP8 recipe (a faster
    step once the host no longer bounds it: full-iteration graphs); under BF16 Transformer Engine
    never reads it (it lives in the FP8 autocast): the same step, with a note saying so."""
    plain = _evaluated(cuda_graph_impl="full_iteration")
    fp8 = _evaluated(cuda_graph_impl="full_iteration", fp8_dot_product_attention="1")
    assert fp8.time["step_seconds"] < plain.time["step_seconds"]
    bf16, bf16_fp8 = _evaluated(precision="bf16"), _evaluated(precision="bf16", fp8_dot_product_attention="1")
    assert bf16_fp8.time["step_seconds"] == bf16.time["step_seconds"]
    assert any("no effect" in n for n in bf16_fp8.time["assumed"])
