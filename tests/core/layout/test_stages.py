"""Stage materialisation: Megatron's placement, its acceptance rules, the layout grammar and the
flags round trip. Expected layer ranges are worked out by hand in each test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.export import shell_join
from app.core.engines.megatron.placement import materialise, megatron_flags
from app.core.launcher import launcher_request, parse_launcher
from app.core.layout.pipeline_layout import LayoutSyntaxError, parse_layout
from app.core.layout.stages import LayoutInputError, PipelineSpec
from app.core.plan import parse_sizes
from tests.conftest import make_config, tiny_config


def ranges(plan):
    return [(s.first_layer, s.last_layer) if s.num_layers else None for s in plan.stages]


def codes(plan):
    return [e.code for e in plan.errors]


def spec_from_launcher(args: list[str], n: int, mtp: int = 0) -> PipelineSpec:
    """Megatron arguments read back the way the app reads them: a trainer line through the launcher
    reader (``parse_launcher``, ``launcher_request``) for an ``n``-layer model with ``mtp`` MTP layers."""
    cfg = make_config(tiny_config(n, num_nextn_predict_layers=mtp))
    req = launcher_request(parse_launcher(shell_join(["python3", "pretrain_gpt.py", *args]) + "\n", strict=True), cfg)
    assert not req.errors and not req.unresolved, (args, req.errors, req.unresolved)
    return req.spec


def test_facts_worked_example_16_layers_pp4_vpp2_first2_last2():
    plan = materialise(PipelineSpec(pp=4, vpp=2, first=2, last=2), 16)
    assert not plan.errors
    # vp0 [1] [2-4] [5-7] [8], vp1 [9] [10-12] [13-15] [16]
    assert ranges(plan) == [(1, 1), (2, 4), (5, 7), (8, 8), (9, 9), (10, 12), (13, 15), (16, 16)]
    assert [(s.pp_rank, s.vp_stage) for s in plan.stages] == [(r, v) for v in range(2) for r in range(4)]
    assert plan.stages[0].embedding and plan.stages[-1].loss


def test_glm52_slime_training_profile_pp8_first14_last16():
    plan = materialise(PipelineSpec(pp=8, first=14, last=16), 78, default_mtp=1)
    # middle = (78 - 14 - 16) / 6 = 8
    assert plan.sizes == [14, 8, 8, 8, 8, 8, 8, 16]
    assert [s.first_layer for s in plan.stages] == [1, 15, 23, 31, 39, 47, 55, 63]
    assert plan.stages[-1].mtp_layers == 1 and plan.stages[-1].loss


def test_conversion_layout_pp2_last40():
    # only --decoder-last given: rank 0 is a "middle" rank and takes 78 - 40 = 38 layers
    plan = materialise(PipelineSpec(pp=2, last=40), 78)
    assert ranges(plan) == [(1, 38), (39, 78)]


def test_only_first_given_makes_the_last_rank_a_middle_rank():
    plan = materialise(PipelineSpec(pp=4, first=6), 18)
    assert plan.sizes == [6, 4, 4, 4]


def test_even_split_and_vpp():
    assert materialise(PipelineSpec(pp=4), 16).sizes == [4, 4, 4, 4]
    plan = materialise(PipelineSpec(pp=4, vpp=2), 16)
    assert ranges(plan) == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16)]
    # --num-layers-per-virtual-pipeline-stage 1 over 16 layers, PP 4: VPP = (16/4)/1 = 4
    plan = materialise(PipelineSpec(pp=4, layers_per_vstage=1), 16)
    assert plan.vpp == 4 and plan.sizes == [1] * 16


def test_account_for_embedding_and_loss():
    # 14 layers + embedding slot + loss slot = 16 slots over PP 4: [3, 4, 4, 3]
    plan = materialise(PipelineSpec(pp=4, account_for_embedding=True, account_for_loss=True), 14)
    assert ranges(plan) == [(1, 3), (4, 7), (8, 11), (12, 14)]
    # with VPP 2 each (rank, chunk) holds 2 slots; the first and last chunks give one up
    plan = materialise(PipelineSpec(pp=4, vpp=2, account_for_embedding=True, account_for_loss=True), 14)
    assert plan.sizes == [1, 2, 2, 2, 2, 2, 2, 1]
    assert ranges(plan)[4] == (8, 9)  # Megatron offset for (pp 0, vp 1): 1*8 + 0*2 - 1 = 7 -> layer 8


@pytest.mark.parametrize(
    "spec, n, code, flag, words",
    [
        (PipelineSpec(pp=8), 78, "even_divisibility", "--pipeline-model-parallel-size", "78 must be divisible"),
        (PipelineSpec(pp=8, first=14, last=15), 78, "middle_divisibility", "--decoder-last-pipeline-num-layers",
         "middle layers (49)"),
        (PipelineSpec(pp=8, first=0, last=16), 78, "flag_range", "--decoder-first-pipeline-num-layers", "at least 1"),
        (PipelineSpec(pp=2, first=40, last=40), 78, "edges_exceed_layers", "--decoder-first-pipeline-num-layers",
         "exceeds"),
        (PipelineSpec(pp=2, first=30, last=40), 78, "middle_mismatch", "--pipeline-model-parallel-size",
         "8 middle layers remaining but 0 middle PP stages"),
        (PipelineSpec(pp=4, first=8, last=8), 16, "middle_mismatch", "--pipeline-model-parallel-size",
         "0 middle layers remaining but 2"),
        (PipelineSpec(pp=8, first=14, last=16, account_for_loss=True), 78, "uneven_with_account",
         "--decoder-first-pipeline-num-layers", "cannot be set together"),
        (PipelineSpec(pp=8, first=15, last=15, vpp=2), 78, "edge_vpp_divisibility",
         "--decoder-first-pipeline-num-layers", "divisible by --num-virtual-stages-per-pipeline-rank 2"),
        (PipelineSpec(pp=4, first=2, last=2, vpp=2), 14, "middle_vpp_divisibility",
         "--num-virtual-stages-per-pipeline-rank", "(5)"),
        (PipelineSpec(pp=2, vpp=2, overlap_p2p=False), 16, "interleave_needs_pp",
         "--num-virtual-stages-per-pipeline-rank", "with --no-overlap-p2p-communication it needs"),
        (PipelineSpec(pp=4, first=2, layers_per_vstage=1), 16, "vpp_with_uneven",
         "--num-layers-per-virtual-pipeline-stage", "cannot be used with"),
        (PipelineSpec(pp=4, vpp=2, layers_per_vstage=1), 16, "vpp_conflict",
         "--num-layers-per-virtual-pipeline-stage", "cannot be set together"),
        (PipelineSpec(pp=4, vpp=3), 16, "vpp_divisibility", "--num-virtual-stages-per-pipeline-rank", "(4)"),
        (PipelineSpec(pp=4, account_for_embedding=True), 16, "account_divisibility",
         "--account-for-embedding-in-pipeline-split", "17"),
        (PipelineSpec(pp=1, first=4, last=12), 16, "uneven_needs_pp", "--pipeline-model-parallel-size", "raise PP"),
        (PipelineSpec(pp=1, last=4), 16, "middle_mismatch", "--pipeline-model-parallel-size",
         "12 middle layers remaining but 0 middle PP stages"),
        (PipelineSpec(pp=4, first=4, layout="Et*4|t*4|t*4|t*4L"), 16, "layout_conflict",
         "--pipeline-model-parallel-layout", "cannot be combined"),
    ],
)
def test_megatron_acceptance_rules_name_the_flag(spec, n, code, flag, words):
    plan = materialise(spec, n)
    hit = [e for e in plan.errors if e.code == code]
    assert hit, plan.errors
    assert hit[0].flag == flag
    assert words in hit[0].message


def test_interleaving_with_overlap_p2p_needs_only_pp_above_1():
    # overlap_p2p_comm is on by default in Megatron (the switch is --no-overlap-p2p-communication)
    assert not materialise(PipelineSpec(pp=2, vpp=2), 16).errors
    assert not materialise(PipelineSpec(pp=2, vpp=2, overlap_p2p=True), 16).errors
    assert "interleave_needs_pp" in codes(materialise(PipelineSpec(pp=1, vpp=2, overlap_p2p=True), 16))


def test_split_sum_and_shape():
    plan = materialise(PipelineSpec(split=parse_sizes("10,10,10,10,10,10,9,8")), 78)
    assert codes(plan) == ["layer_sum"] and "sum to 77" in plan.errors[0].message
    plan = materialise(PipelineSpec(split=(2, 2, 2, 2, 2, 2), vpp=2), 12)
    assert plan.pp == 3 and plan.vpp == 2 and [(s.pp_rank, s.vp_stage) for s in plan.stages][3] == (0, 1)
    with pytest.raises(LayoutInputError, match="does not divide by --vpp 4"):
        materialise(PipelineSpec(split=(2, 2, 2), vpp=4), 6)
    for bad in ("", "1,,2", "1,x", "-3,5", "1.5,2"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


# --------------------------------------------------------------------------- layout strings


def test_layout_grammar_deepseek_example():
    # 'Et*3|(tt|)*29,m|L': stage 0 = E + 3 layers, 29 stages of 2, then m, then L -> 32 stages
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32 and stages[0] == ["E", "t", "t", "t"] and stages[30] == ["m"] and stages[31] == ["L"]
    plan = materialise(PipelineSpec(pp=16, layout="Et*3|(tt|)*29,m|L"), 61, default_mtp=1)
    assert not plan.errors and plan.vpp == 2
    mtp = [s for s in plan.stages if s.mtp_layers]
    assert [(s.pp_rank, s.vp_stage) for s in mtp] == [(14, 1)]
    assert plan.stages[1].first_layer == 4 and plan.stages[29].last_layer == 61
    assert plan.stages[30].num_layers == 0 and plan.stages[30].first_layer is None


@pytest.mark.parametrize(
    "layout, pp, n, mtp, code",
    [
        ("Et*3|t*3|t*3", 2, 9, 0, "layout_stage_count"),
        ("t*4|Et*4L", 2, 8, 0, "layout_embedding_first"),
        ("Et*4|Lt*4", 2, 8, 0, "layout_loss_last"),
        ("Et*4|t*3L", 2, 8, 0, "layout_decoder_count"),
        ("Et*4|t*4L", 2, 8, 1, "layout_mtp_count"),
        ("Et*4|mt*4L", 2, 8, 1, "layout_mtp_after_decoders"),
        ("Et*2|t*2m|t*2|t*2L", 2, 8, 1, "layout_mtp_not_last_vp"),
        ("Et*4|EtttL", 2, 8, 0, "layout_embedding_count"),
    ],
)
def test_layout_placement_rules(layout, pp, n, mtp, code):
    plan = materialise(PipelineSpec(pp=pp, layout=layout), n, default_mtp=mtp)
    assert code in codes(plan), plan.errors


def test_layout_with_a_vpp_flag_is_refused_and_interleave_follows_overlap():
    # validate_args: at most one of LPVS / VPP / layout, whatever the VPP value
    plan = materialise(PipelineSpec(pp=2, vpp=3, layout="Et|t|t|tL"), 4)
    assert codes(plan) == ["layout_conflict"]
    plan = materialise(PipelineSpec(pp=2, layout="Et|t|t|tL", overlap_p2p=False), 4)
    assert codes(plan) == ["interleave_needs_pp"]


@pytest.mark.parametrize("bad", ["Et*3|((tt|)*2)*3|L", "Ex|L", "E t|L", "Et*99999999999|L", "", "(t|)*"])
def test_layout_syntax_errors(bad):
    with pytest.raises(LayoutSyntaxError):
        parse_layout(bad)


# --------------------------------------------------------------------------- reverse direction


def stage_tuple(plan):
    return [(s.pp_rank, s.vp_stage, s.first_layer, s.last_layer, s.num_layers, s.embedding, s.loss, s.mtp_layers)
            for s in plan.stages]


def test_emitted_flags_prefer_first_last():
    plan = materialise(PipelineSpec(split=(14, 8, 8, 8, 8, 8, 8, 16)), 78, default_mtp=1)
    args, layout = megatron_flags(plan)
    assert args == ["--pipeline-model-parallel-size", "8", "--mtp-num-layers", "1",
                    "--decoder-first-pipeline-num-layers", "14", "--decoder-last-pipeline-num-layers", "16"]
    assert layout == "Et*14|(t*8|)*6,t*16mL"
    plan = materialise(PipelineSpec(split=(10, 10, 10, 10, 10, 10, 9, 9)), 78)
    args, _ = megatron_flags(plan)
    assert "--pipeline-model-parallel-layout" in args and "--decoder-first-pipeline-num-layers" not in args


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 120), pp=st.integers(1, 10), vpp=st.sampled_from([None, 1, 2, 3, 4]),
    first=st.one_of(st.none(), st.integers(1, 40)), last=st.one_of(st.none(), st.integers(1, 40)),
    emb=st.booleans(), loss=st.booleans(), mtp=st.integers(0, 2),
)
def test_flags_to_stages_to_flags_round_trip(n, pp, vpp, first, last, emb, loss, mtp):
    if first is not None or last is not None:
        emb = loss = False
    spec = PipelineSpec(pp=pp, vpp=vpp, first=first, last=last, account_for_embedding=emb,
                        account_for_loss=loss, mtp_layers=mtp)
    plan = materialise(spec, n)
    if plan.errors:
        return
    assert sum(plan.sizes) == n
    args, _ = megatron_flags(plan)
    again = materialise(spec_from_launcher(args, n, mtp), n)
    assert not again.errors
    assert stage_tuple(again) == stage_tuple(plan)
    assert megatron_flags(again)[0] == args


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=16), vpp=st.sampled_from([1, 2, 4]),
       mtp=st.integers(0, 2))
def test_any_split_round_trips_through_emitted_flags(sizes, vpp, mtp):
    sizes = sizes[: len(sizes) - len(sizes) % vpp] or sizes[:1] * vpp
    n = sum(sizes)
    if n == 0:
        return
    plan = materialise(PipelineSpec(split=tuple(sizes), vpp=vpp, mtp_layers=mtp, overlap_p2p=True), n)
    if plan.errors:
        return
    args, _ = megatron_flags(plan)
    again = materialise(spec_from_launcher(args, n, mtp), n)
    assert not again.errors, (sizes, args, again.errors)
    assert stage_tuple(again) == stage_tuple(plan)


def test_an_mtp_count_over_the_bound_is_refused_before_any_work():
    """``--mtp-num-layers`` over isplan's bound (16, :data:`app.core.plan.bounds.MAX_MTP_LAYERS`) is
    input error, like a PP or VPP over theirs: a launcher's ``--mtp-num-layers 1000000000`` reached the
    placement unbounded and the role derivation then walked a billion MTP depths (found by
    tests/cli/test_fuzz.py). 16 itself is placed."""
    from app.core.engines.megatron.check import run_check
    from app.core.model.config import load_preset
    from app.core.plan.bounds import MAX_MTP_LAYERS

    assert not materialise(PipelineSpec(pp=2, mtp_layers=MAX_MTP_LAYERS), 78).errors
    with pytest.raises(LayoutInputError, match="--mtp-num-layers 17 is over the limit of 16"):
        materialise(PipelineSpec(pp=2, mtp_layers=MAX_MTP_LAYERS + 1), 78)
    req = launcher_request(parse_launcher("python train.py --pipeline-model-parallel-size 2 "
                                          "--mtp-num-layers 1000000000\n"), load_preset("glm-5.2"))
    with pytest.raises(LayoutInputError, match="over the limit"):
        run_check(load_preset("glm-5.2"), req.spec, "megatron", freq=req.freq, offset=req.offset)
