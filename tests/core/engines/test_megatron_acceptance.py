"""Megatron's acceptance rules that round 2 of issue 10 corrected, each with the expected values
worked out by hand from the rule's source (NVIDIA/Megatron-LM d98e8a64, cited per test)."""

from __future__ import annotations

import pytest

from app.core.engines import role_rule
from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.layout.stages import PipelineSpec
from app.core.model.roles import derive_roles
from tests.conftest import make_config, tiny_config
from tests.core.layout.test_stages import spec_from_launcher


def codes(plan):
    return [e.code for e in plan.errors]


def sizes(plan):
    return [s.num_layers for s in plan.stages]


def test_pp2_with_vpp_is_accepted_by_default_and_no_message_names_a_nonexistent_flag():
    # arguments.py: --no-overlap-p2p-communication (store_false, dest overlap_p2p_comm) -> default on;
    # validate_args then only needs PP > 1 for an interleaved schedule
    plan = materialise(PipelineSpec(pp=2, vpp=2), 16)
    assert not plan.errors and sizes(plan) == [4, 4, 4, 4]
    off = materialise(PipelineSpec(pp=2, vpp=2, overlap_p2p=False), 16)
    assert codes(off) == ["interleave_needs_pp"]
    assert "--no-overlap-p2p-communication" in off.errors[0].message
    assert "--overlap-p2p-communication" not in off.errors[0].message.replace("--no-overlap", "")
    assert spec_from_launcher(["--pipeline-model-parallel-size", "2"], 16).overlap_p2p is True
    assert spec_from_launcher(["--no-overlap-p2p-communication"], 16).overlap_p2p is False


def test_layers_per_vstage_counts_the_embedding_and_loss_slots():
    # validate_args: VPP = ((78 + 2) / 4) / 5 = 20 / 5 = 4; 16 virtual stages of 5 slots, the first
    # giving one slot to the embedding and the last one to the loss: 4, 5 x 14, 4 = 78 layers
    plan = materialise(PipelineSpec(pp=4, layers_per_vstage=5, account_for_embedding=True,
                                    account_for_loss=True), 78)
    assert not plan.errors and plan.vpp == 4
    assert sizes(plan) == [4] + [5] * 14 + [4]
    # one slot: (78 + 1) / 4 is not whole -> the error names the user's K (5), not a derived VPP
    bad = materialise(PipelineSpec(pp=4, layers_per_vstage=5, account_for_embedding=True), 78)
    assert codes(bad) == ["layers_per_rank"]
    assert "--num-layers-per-virtual-pipeline-stage 5" in bad.errors[0].message and "79" in bad.errors[0].message
    # (78 + 2) / 4 = 20 per rank; 20 % 3 != 0
    bad = materialise(PipelineSpec(pp=4, layers_per_vstage=3, account_for_embedding=True,
                                   account_for_loss=True), 78)
    assert codes(bad) == ["layers_per_vstage"]
    assert "--num-layers-per-virtual-pipeline-stage 3" in bad.errors[0].message


def test_layers_per_vstage_on_pp2_reports_the_users_value():
    # 16 / 2 = 8 per rank, / K=2 -> VPP 4; with overlap off PP 2 is not enough
    plan = materialise(PipelineSpec(pp=2, layers_per_vstage=2, overlap_p2p=False), 16)
    assert codes(plan) == ["interleave_needs_pp"]
    assert "--num-layers-per-virtual-pipeline-stage 2 (VPP 4)" in plan.errors[0].message


@pytest.mark.parametrize("extra", [
    {"vpp": 1}, {"vpp": 2}, {"layers_per_vstage": 4}, {"first": 4}, {"last": 4},
    {"account_for_embedding": True}, {"account_for_loss": True},
])
def test_a_layout_with_any_other_pipeline_shape_flag_is_refused(extra):
    # validate_args: at most one of LPVS / VPP / layout (so even VPP 1);
    # TransformerConfig.__post_init__: the layout excludes first/last/account_for_*
    plan = materialise(PipelineSpec(pp=4, layout="Et*4|t*4|t*4|t*4L", **extra), 16)
    assert "layout_conflict" in codes(plan)


def test_pp2_vpp_with_first_and_last_is_the_offset_division_by_zero():
    # get_transformer_layer_offset: middle_pipeline_stages = 2 - 2 = 0, and rank 1 divides by it
    plan = materialise(PipelineSpec(pp=2, vpp=2, first=4, last=12), 16)
    assert codes(plan) == ["vpp_edges_no_middle"]
    assert "ZeroDivisionError" in plan.errors[0].message
    # one of them is fine: rank 1 gets 16 - 4 = 12 layers, 6 per virtual stage
    ok = materialise(PipelineSpec(pp=2, vpp=2, first=4), 16)
    assert not ok.errors and sizes(ok) == [2, 6, 2, 6]
    # without VPP there is no division
    assert not materialise(PipelineSpec(pp=2, first=4, last=12), 16).errors


def test_export_never_emits_first_and_last_for_pp2_with_vpp():
    plan = materialise(PipelineSpec(split=(2, 6, 2, 6), vpp=2), 16)
    assert not plan.errors
    args, _ = megatron_flags(plan)
    assert "--decoder-last-pipeline-num-layers" not in args
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "4"
    again = materialise(spec_from_launcher(args, 16), 16)
    assert not again.errors and sizes(again) == [2, 6, 2, 6]


def test_pp1_first_alone_is_megatrons_single_stage_and_both_only_when_last_is_every_layer():
    # TransformerConfig: first = N leaves 0 middle layers and 0 middle ranks -> accepted
    assert sizes(materialise(PipelineSpec(pp=1, first=16), 16)) == [16]
    assert codes(materialise(PipelineSpec(pp=1, first=4), 16)) == ["middle_mismatch"]
    assert codes(materialise(PipelineSpec(pp=1, first=4, last=12), 16)) == ["uneven_needs_pp"]
    # both with PP 1: TransformerConfig sees -1 middle ranks (no error since 16 - 4 - 16 != 0) and
    # get_num_layers_to_build gives rank 0 the last count, 16 = every layer -> a whole model
    assert sizes(materialise(PipelineSpec(pp=1, first=4, last=16), 16)) == [16]


def test_mtp_depths_follow_megatrons_numbering():
    # MultiTokenPredictionLayer: depth k has layer_number k; dsa.is_dsa_skip_topk_layer with
    # freq 4, offset 3: skip iff max(k - 3, 0) % 4 != 0 -> depths 1, 2, 3 compute, depth 4 skips
    cfg = make_config(tiny_config(8, index_topk_freq=4, index_skip_topk_offset=3, num_nextn_predict_layers=4))
    built = derive_roles(cfg, role_rule("megatron"), engine_built=True)
    assert [r.role for r in built.mtp] == ["full", "full", "full", "shared"]
    assert built.mtp[3].source == 8 + 3 and not built.mtp[3].has_indexer
    # fewer MTP layers when the plan builds fewer
    assert derive_roles(cfg, role_rule("megatron"), engine_built=True, mtp_layers=0).mtp == ()
    # the HF checkpoint keeps an indexer on every MTP layer
    assert all(r.has_indexer for r in derive_roles(cfg, role_rule("hf")).mtp)
