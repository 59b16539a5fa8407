"""Megatron parallelism constraints as named checks; expectations are derived by hand."""

from __future__ import annotations

import pytest

from app.core.engines.megatron.parallel import check_parallel
from app.core.engines.megatron.placement import materialise
from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.core.evaluate import evaluate
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from app.core.model.parallelism import GPU_PRESETS, ParallelConfig, resolve_gpu
from tests.conftest import make_config, slime_par, tiny_config


@pytest.fixture(scope="module")
def glm52():
    return load_model("glm-5.2")


def by_name(checks):
    out = {}
    for c in checks:
        out.setdefault(c.name, c)
    return out




def slime_plan(cfg):
    return materialise(PipelineSpec(pp=8, first=14, last=16), cfg.num_hidden_layers,
                       default_mtp=cfg.num_nextn_predict_layers)


def test_slime_profile_is_256_gpus_edp_1_and_passes_every_check(glm52):
    par = slime_par()
    # 4*8*8*DP = 256 -> DP 1; expert grid 1*32*8 = 256 -> EDP 1
    assert par.data_parallel == 1
    assert par.world == 256
    assert par.edp == 1
    assert par.expert_grid == {"etp": 1, "ep": 32, "pp": 8, "edp": 1}
    checks = check_parallel(glm52, par, slime_plan(glm52))
    failing = [c.message for c in checks if not c.ok]
    assert failing == []
    names = {c.name for c in checks}
    for required in ("world_size", "heads_tp", "experts_ep", "expert_grid", "expert_data_parallel",
                     "cp_seq", "mtp_cp", "pipeline_plan"):
        assert required in names
    # MTP with CP is accepted (Megatron's validate_args no longer refuses it): an info line, no warning
    mtp = by_name(checks)["mtp_cp"]
    assert mtp.level == "info" and not mtp.warning and mtp.ok
    assert "accepted" in mtp.message and "anyway" not in mtp.message
    # the same without a stage plan (what the parallel checks alone say)
    assert par.world == 256 and par.expert_grid["edp"] == 1 and all(c.ok for c in check_parallel(glm52, par))


def test_slime_preset_matches_the_hand_built_profile(glm52):
    """The pinned profile the page and the presets open (slime's GLM-5.2 launcher), as the one
    evaluation reads it, is the launch FACTS.md section 1 quotes (the profile states DP 1 where the
    hand-built one states 256 GPUs: the same world)."""
    ev = evaluate(SLIME_GLM52_PROFILE, glm52)
    assert ev.par == slime_par(gpus=None, dp=1) and ev.par.world == slime_par().world == 256
    spec = ev.stage_plan.spec
    assert (spec.pp, spec.first, spec.last) == (8, 14, 16)


def test_ep_48_suggests_32_and_64(glm52):
    par = slime_par(ep=48, gpus=None, dp=None)
    c = by_name(check_parallel(glm52, par))["experts_ep"]
    assert not c.ok
    assert "48" in c.message and "256" in c.message
    assert "32" in c.message and "64" in c.message


def test_tp5_with_64_heads_fails_and_suggests_4_and_8(glm52):
    par = ParallelConfig(tp=5, seq_length=4096)
    c = by_name(check_parallel(glm52, par))["heads_tp"]
    assert not c.ok
    assert "64" in c.message and "4" in c.message and "8" in c.message


@pytest.mark.parametrize("seq", [4097, 4098])
def test_cp_needs_sequence_divisible_by_2cp(glm52, seq):
    # CP=2 -> 2*CP = 4; 4097 is odd, 4098 = 4*1024 + 2
    c = by_name(check_parallel(glm52, ParallelConfig(tp=4, cp=2, sp=True, seq_length=seq)))["cp_seq"]
    assert not c.ok
    assert "4" in c.message and "4100" in c.message


def test_cp_with_divisible_sequence_passes(glm52):
    c = by_name(check_parallel(glm52, ParallelConfig(tp=4, cp=2, sp=True, seq_length=4096)))["cp_seq"]
    assert c.ok


def test_world_size_and_dp_from_gpus(glm52):
    par = ParallelConfig(tp=2, cp=2, pp=2, gpus=64, seq_length=4096)
    assert par.data_parallel == 8  # 64 / (2*2*2)
    assert par.world == 64
    bad = ParallelConfig(tp=2, cp=2, pp=2, gpus=60, seq_length=4096)
    c = by_name(check_parallel(glm52, bad))["world_size"]
    assert not c.ok
    assert "56" in c.message and "64" in c.message  # nearest multiples of 8


def test_expert_grid_must_divide_world(glm52):
    # world 4*1*2*1 = 8; ETP4 * EP4 * PP2 = 32 does not divide 8
    par = ParallelConfig(tp=4, pp=2, dp=1, ep=4, sp=True, seq_length=4096)
    c = by_name(check_parallel(glm52, par))["expert_grid"]
    assert not c.ok and "32" in c.message


def test_ep_with_tp_requires_sp_and_sp_without_tp_warns(glm52):
    c = by_name(check_parallel(glm52, ParallelConfig(tp=2, dp=4, ep=8, etp=1, seq_length=4096)))["sp_moe_tp"]
    assert not c.ok and "--sequence-parallel" in c.message
    # MoELayer.forward raises for any EP when TP > 1 and SP is off (moe_layer.py)
    c = by_name(check_parallel(glm52, ParallelConfig(tp=2, seq_length=4096)))["sp_moe_tp"]
    assert not c.ok and "MoELayer.forward" in c.message and "ModelParallelConfig" in c.message
    c = by_name(check_parallel(glm52, ParallelConfig(tp=1, sp=True, seq_length=4096)))["sp_tp"]
    assert c.ok and c.warning and "TP > 1" in c.message


def test_interleaving_needs_pp_above_1_with_default_overlap(glm52):
    # validate_args: overlap_p2p_comm defaults on, so PP 2 + VPP is accepted; PP 1 + VPP is not
    c = by_name(check_parallel(glm52, ParallelConfig(pp=2, vpp=2, seq_length=4096)))["interleave_pp"]
    assert c.ok
    c = by_name(check_parallel(glm52, ParallelConfig(pp=1, vpp=2, seq_length=4096)))["interleave_pp"]
    assert not c.ok and "--pipeline-model-parallel-size > 1" in c.message and "--overlap-p2p" not in c.message


def test_vpp_must_divide_layers_per_rank():
    cfg = make_config(tiny_config(8, num_nextn_predict_layers=0))
    # 8 layers / PP 4 = 2 per rank; VPP 4 does not divide 2
    c = by_name(check_parallel(cfg, ParallelConfig(pp=4, vpp=4, seq_length=64)))["vpp_divides"]
    assert not c.ok
    c = by_name(check_parallel(cfg, ParallelConfig(pp=4, vpp=2, seq_length=64)))["vpp_divides"]
    assert c.ok


def test_global_batch_divisible_by_mbs_times_dp(glm52):
    par = ParallelConfig(tp=4, sp=True, dp=4, mbs=2, global_batch=100, seq_length=4096)
    c = by_name(check_parallel(glm52, par))["global_batch"]
    assert not c.ok and "96" in c.message and "104" in c.message  # multiples of 2*4 = 8
    ok = ParallelConfig(tp=4, sp=True, dp=4, mbs=2, global_batch=96, seq_length=4096)
    assert ok.microbatches == 12  # 96 / (2*4)
    assert by_name(check_parallel(glm52, ok))["global_batch"].ok


def test_offload_needs_precision_aware_optimizer(glm52):
    par = slime_par(use_precision_aware_optimizer=False)
    c = by_name(check_parallel(glm52, par))["cpu_offload_flags"]
    assert not c.ok and "--use-precision-aware-optimizer" in c.message


def test_plan_and_config_pp_must_agree(glm52):
    plan = materialise(PipelineSpec(pp=4), glm52.num_hidden_layers - 2, default_mtp=0)
    c = by_name(check_parallel(glm52, slime_par(), plan))["pipeline_plan"]
    assert not c.ok


def test_tokens_per_microbatch():
    assert ParallelConfig(cp=4, mbs=2, seq_length=4096).tokens_per_microbatch == 2048  # 2*4096/4
    p = ParallelConfig(cp=8, tokens_per_gpu=8192)
    assert p.tokens_per_microbatch == 8192
    assert p.sample_length == 65536  # 8192 * 8


def test_gpu_presets_use_decimal_gigabytes():
    assert GPU_PRESETS["h100-80gb"].capacity_bytes == 80 * 10**9
    assert GPU_PRESETS["h200-141gb"].capacity_bytes == 141 * 10**9
    assert GPU_PRESETS["b200-180gb"].capacity_bytes == 180 * 10**9
    assert GPU_PRESETS["mi300x-192gb"].capacity_bytes == 192 * 10**9
    assert resolve_gpu("custom", 123).capacity_bytes == 123
    with pytest.raises(ValueError):
        resolve_gpu("custom")
    with pytest.raises(ValueError):
        resolve_gpu("a100-40gb")


@pytest.mark.parametrize("bad", [
    dict(tp=0, seq_length=8), dict(recompute="some", seq_length=8), dict(),
    dict(seq_length=8, exp_avg_dtype="int4"), dict(seq_length=8, gpu="custom"),
])
def test_parallel_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        ParallelConfig(**bad)


def test_to_dict_holds_every_field_as_asdict_gives_it():
    """to_dict copies the fields without asdict's recursion: on settings with the two tuple fields
    set, the fields it returns are exactly dataclasses.asdict's."""
    from dataclasses import asdict

    par = ParallelConfig(tp=2, cp=4, pp=2, gpus=64, recompute="selective", recompute_modules=("core_attn", "mlp"),
                         hierarchical_context_parallel_sizes=(2, 2), seq_length=4096)
    out = par.to_dict()
    derived = {"etp", "dp", "gpus", "edp", "expert_grid", "microbatches", "tokens_per_microbatch", "sample_length"}
    assert {k: v for k, v in out.items() if k not in derived} == {k: v for k, v in asdict(par).items() if k not in derived}
    assert out["gpus"] == 64 and out["dp"] == 64 // (2 * 4 * 2) and out["etp"] == 2  # ETP defaults to TP
