"""Issue 19's training settings, one by one: each rule as Megatron-LM's source states it (commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553; the line is quoted beside each expectation), the settings
as plan fields in every vocabulary (URL key, CLI flag, Megatron flag, launcher import, export), and
what the recommended plans do with them. The generated cases are in test_megatron_settings_oracle.py."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.parse import parse_qsl

import pytest

from app.core.engines.megatron.parallel import check_parallel
from app.core.engines.megatron.placement import materialise
from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.core.evaluate import evaluate
from app.core.launcher import LauncherImportError, import_launcher
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from app.core.model.parallelism import ParallelConfig
from app.core.plan import Plan, plan_from_query
from tests.verdict.test_twins import run_cli

GLM = load_model("glm-5.2")
LLAMA = load_model("llama-3.1-70b")
#: the GLM-5.2 slime profile's stages (first 14, last 16) and a Megatron launch of it
STAGES = materialise(PipelineSpec(pp=8, first=14, last=16), 78)
PROFILE = Plan(model="glm-5.2", engine="megatron", pp=8, first=14, last=16, tp=4, cp=8, ep=32, etp=1, dp=1, sp=True,
               tokens_per_gpu=8192, recompute="full", recompute_method="uniform", recompute_num_layers=1,
               cp_comm_type="allgather", optimizer_cpu_offload=True, use_precision_aware_optimizer=True)


def blocking(plan: Plan, cfg=GLM) -> dict[str, str | None]:
    ev = evaluate(plan, cfg)
    assert not ev.problems, ev.problems
    return {r.code: r.field for r in ev.verdict.blocking}


def failing(par: ParallelConfig, cfg=GLM, stages=STAGES) -> set[str]:
    return {c.name for c in check_parallel(cfg, par, stages) if not c.ok}


def par(**over) -> ParallelConfig:
    base = dict(tp=4, cp=8, pp=8, gpus=256, ep=32, etp=1, sp=True, tokens_per_gpu=8192, cp_comm_type="allgather")
    return ParallelConfig(**{**base, **over})


def test_the_profile_as_a_megatron_launch_is_go():
    assert blocking(PROFILE) == {}


# --------------------------------------------------------------------------- recompute
def test_full_recompute_needs_a_method_and_a_layer_count():
    # transformer_config.py:1913-1917: 'Using recompute_granularity: full so recompute_method must be "block"
    # or "uniform"'; 1919-1925: "... recompute_num_layers must be between 1 and num_layers_per_pipeline_rank"
    assert blocking(replace(PROFILE, recompute_method=None)) == {"full_method": "recompute_method"}
    assert blocking(replace(PROFILE, recompute_num_layers=None)) == {"full_num_layers": "recompute_num_layers"}


def test_selective_refuses_a_method_and_a_layer_count():
    # arguments.py:1425-1428: "recompute method is not yet supported for selective recomputing granularity";
    # transformer_config.py:1926-1932: "... recompute_num_layers must be None"
    sel = replace(PROFILE, recompute="selective", recompute_method=None, recompute_num_layers=None,
                  gpu="custom", gpu_memory_gb=10_000)
    assert blocking(sel) == {}
    assert blocking(replace(sel, recompute_method="uniform")) == {"selective_method": "recompute_method"}
    assert blocking(replace(sel, recompute_num_layers=1)) == {"selective_num_layers": "recompute_num_layers"}


def test_block_recompute_with_more_layers_than_a_stage_is_accepted():
    # Megatron only checks that --recompute-num-layers is set (transformer_config.py:1919-1925); the block
    # loop (megatron/core/recompute.py:174-181) checkpoints layer_idx < recompute_num_layers: all 16 layers
    assert failing(par(recompute="full", recompute_method="block", recompute_num_layers=50)) == set()
    assert failing(par(recompute="full", recompute_method="uniform", recompute_num_layers=50)) == set()


def test_distribute_saved_activations_rules():
    full = dict(recompute="full", recompute_method="uniform", recompute_num_layers=1, distribute_saved_activations=True)
    # arguments.py:1410-1419: TP > 1, full granularity, a method; transformer_config.py:1934-1938: no SP
    assert failing(par(**full, sp=False)) == {"sp_moe_tp"}   # GLM-5.2 is MoE: TP > 1 needs SP anyway
    assert failing(par(**full, sp=True)) == {"distribute_saved_activations_sp"}
    assert failing(par(**{**full, "recompute_method": None}, sp=False)) >= {"distribute_saved_activations", "full_method"}
    assert "distribute_saved_activations" in failing(par(**{**full, "recompute": "selective", "recompute_method": None,
                                                              "recompute_num_layers": None}, sp=False))
    assert "distribute_saved_activations" in failing(par(**full, tp=1, ep=8, sp=False, gpus=None), stages=STAGES)


@pytest.mark.parametrize("modules, extra, refused", [
    (("core_attn",), {}, set()),
    # transformer_config.py:1964-1967: "moe_act in recompute_modules is only supported with moe_grouped_gemm"
    (("moe_act",), {}, {"recompute_moe_act"}),
    (("moe_act",), {"moe_grouped_gemm": True}, set()),
    # 1969-1973: "mla_up_proj in recompute_modules is only supported with multi_latent_attention"
    (("mla_up_proj",), {}, set()),                                     # GLM-5.2 is MLA
    (("mla_up_proj",), {"multi_latent_attention": False}, {"recompute_mla_up_proj"}),   # the job builds no MLA
    (("gdn_norm_out",), {}, {"recompute_gdn_norm_out"}),              # 1975-1981: GatedDeltaNet only
    (("mhc",), {}, {"recompute_mhc"}),                                # 2028-2030: needs enable_mhc_connections
])
def test_recompute_modules_rules(modules, extra, refused):
    p = par(recompute="selective", recompute_modules=modules, **extra)
    assert failing(p) == refused
    # the modules are read only under selective recompute (transformer_config.py:1943)
    assert failing(replace(p, recompute="full", recompute_method="uniform", recompute_num_layers=1)) == set()


def test_mtp_with_full_uniform_recompute_needs_one_layer_per_unit():
    # multi_token_prediction.py:1621-1627: 'assert self.config.recompute_num_layers == 1, "recompute_num_layers
    # must be 1 for MTP recompute"'; block only warns and skips the MTP layer's recompute (1630-1634)
    mtp = materialise(PipelineSpec(pp=8, first=14, last=16, mtp_layers=1), 78)
    assert failing(par(recompute="full", recompute_method="uniform", recompute_num_layers=2), stages=mtp) == \
        {"mtp_recompute_layers"}
    assert failing(par(recompute="full", recompute_method="uniform", recompute_num_layers=2)) == set()   # no MTP
    checks = {c.name: c for c in check_parallel(GLM, par(recompute="full", recompute_method="block",
                                                         recompute_num_layers=2), mtp)}
    assert checks["mtp_block_recompute"].ok and checks["mtp_block_recompute"].warning


# --------------------------------------------------------------------------- optimizer, sequence, CP
def test_precision_aware_optimizer_needs_the_distributed_one_with_or_without_offload():
    # megatron/core/optimizer/__init__.py:1057-1060: "--use-precision-aware-optimizer only supported with
    # distributed optimizer"; arguments.py:1884-1888: offload needs the precision-aware optimizer
    full = dict(recompute="full", recompute_method="uniform", recompute_num_layers=1)
    assert failing(par(**full, use_precision_aware_optimizer=True, distributed_optimizer=False)) == \
        {"precision_aware_distributed"}
    assert failing(par(**full, optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                       distributed_optimizer=False)) == {"precision_aware_distributed"}
    assert failing(par(**full, optimizer_cpu_offload=True, distributed_optimizer=False)) == {"cpu_offload_flags"}
    assert blocking(replace(PROFILE, no_distributed_optimizer=True)) == \
        {"precision_aware_distributed": "no_distributed_optimizer"}


def test_seq_length_above_max_position_embeddings():
    # arguments.py:1353-1356: "max_position_embeddings (P) must be greater than or equal to seq_length (S)"
    p = replace(PROFILE, tokens_per_gpu=None, seq_length=8192, gpu="custom", gpu_memory_gb=10_000)
    assert blocking(replace(p, max_position_embeddings=8192)) == {}
    assert blocking(replace(p, max_position_embeddings=8191)) == {"seq_max_positions": "max_position_embeddings"}
    # without a stated sequence length there is nothing to compare (not the 4096 assumed for time)
    assert blocking(replace(PROFILE, max_position_embeddings=2048)) == {}


def test_dsa_with_cp_needs_allgather():
    # transformer_config.py:3162-3177: "DSAttention context parallelism currently supports cp_comm_type=allgather
    # only."; Megatron's DSA attention normalises the spelling (cp_comm_type.replace("_", "").lower())
    assert blocking(replace(PROFILE, cp_comm_type="p2p")) == {"dsa_cp": "cp_comm_type"}
    assert blocking(replace(PROFILE, cp_comm_type="a2a")) == {"dsa_cp": "cp_comm_type"}
    assert blocking(replace(PROFILE, cp_comm_type="all_gather")) == {}
    ev = evaluate(replace(PROFILE, cp_comm_type="p2p"), GLM)
    assert "--cp-comm-type allgather" in ev.verdict.blocking[0].message
    # CP 1: the type does not matter
    assert failing(par(cp=1, cp_comm_type="p2p")) == set()


def test_transformer_engine_spells_the_all_gather_type_with_an_underscore():
    # NVIDIA/TransformerEngine context_parallel.py:5096-5139 @ d0067d0d: p2p / a2a+p2p, "all_gather", "a2a",
    # else "Unsupported communication type"; Llama's attention is Transformer Engine's
    llama = Plan(model="llama-3.1-70b", pp=2, tp=8, cp=2, seq_length=8192, gpu="custom", gpu_memory_gb=10_000)
    assert blocking(replace(llama, cp_comm_type="allgather"), LLAMA) == {"te_cp_comm_type": "cp_comm_type"}
    assert blocking(replace(llama, cp_comm_type="all_gather"), LLAMA) == {}


def test_hierarchical_context_parallel_sizes():
    # arguments.py:580-582: prod(sizes) == CP; 583-585: "--hierarchical-context-parallel-sizes must be set when
    # a2a+p2p is used in cp comm"
    llama = Plan(model="llama-3.1-70b", pp=2, tp=8, cp=8, seq_length=8192, gpu="custom", gpu_memory_gb=10_000)
    assert blocking(replace(llama, cp_comm_type="a2a+p2p"), LLAMA) == \
        {"a2a_p2p_hierarchical": "hierarchical_context_parallel_sizes"}
    assert blocking(replace(llama, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(2, 4)), LLAMA) == {}
    assert blocking(replace(llama, hierarchical_context_parallel_sizes=(2, 2)), LLAMA) == \
        {"hierarchical_cp": "hierarchical_context_parallel_sizes"}


# --------------------------------------------------------------------------- attention flags
def test_query_groups_are_read_only_with_group_query_attention():
    # argument_utils.py:330-333: num_query_groups = args.num_query_groups if args.group_query_attention else
    # None, and None is one group per head (transformer_config.py:1458-1459)
    base = Plan(model="llama-3.1-70b", pp=2, tp=8, seq_length=8192, gpu="custom", gpu_memory_gb=10_000)
    assert blocking(replace(base, group_query_attention=True, num_query_groups=8), LLAMA) == {}
    assert blocking(replace(base, num_query_groups=8), LLAMA) == {"num_query_groups_mismatch": "group_query_attention"}
    assert blocking(replace(base, group_query_attention=True, num_query_groups=4), LLAMA) == \
        {"num_query_groups_mismatch": "num_query_groups"}
    # the TP rule reads the groups the job builds: 3 groups with TP 8 (transformer_config.py:1458-1467)
    assert "kv_heads_tp" in blocking(replace(base, group_query_attention=True, num_query_groups=3), LLAMA)


def test_mla_flags_are_checked_against_the_config():
    mla = dict(multi_latent_attention=True, q_lora_rank=2048, kv_lora_rank=512, qk_head_dim=192,
               qk_pos_emb_head_dim=64, v_head_dim=256)
    assert blocking(replace(PROFILE, **mla)) == {}
    assert blocking(replace(PROFILE, **{**mla, "kv_lora_rank": 32})) == {"kv_lora_rank_mismatch": "kv_lora_rank"}
    # the MLA flags are read only with --multi-latent-attention (argument_utils.py:313-314)
    assert blocking(replace(PROFILE, **{**mla, "multi_latent_attention": False})) == \
        {"attention_mismatch": "multi_latent_attention"}
    # arguments.py:1973-1974: "Group query attention is mutually exclusive with multi latent attention."
    assert "gqa_with_mla" in blocking(replace(PROFILE, **mla, group_query_attention=True))
    # a GQA model launched as MLA
    llama = Plan(model="llama-3.1-70b", pp=2, tp=8, seq_length=8192, gpu="custom", gpu_memory_gb=10_000)
    assert blocking(replace(llama, multi_latent_attention=True), LLAMA) == {"attention_mismatch": "multi_latent_attention"}


# --------------------------------------------------------------------------- vocabularies
LAUNCH = """\
torchrun --nnodes 32 --nproc-per-node 8 pretrain_gpt.py \\
    --num-layers 78 --pipeline-model-parallel-size 8 \\
    --decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 16 \\
    --tensor-model-parallel-size 4 --context-parallel-size 8 --expert-model-parallel-size 32 \\
    --expert-tensor-parallel-size 1 --sequence-parallel {extra}
"""


def imported(extra: str, base: Plan | None = None):
    return import_launcher(LAUNCH.format(extra=extra), GLM, base or Plan(model="glm-5.2"))


def test_a_megatron_launcher_without_use_distributed_optimizer_has_none():
    # arguments.py:3156 (store_true) and OptimizerConfig.use_distributed_optimizer = False (optimizer_config.py:324)
    assert imported("").plan.no_distributed_optimizer is True
    assert imported("--use-distributed-optimizer").plan.no_distributed_optimizer is False
    # the page's own setting does not survive a launcher that says otherwise
    assert imported("", Plan(model="glm-5.2", no_distributed_optimizer=False)).plan.no_distributed_optimizer is True
    # slime always builds it (slime/backends/megatron_utils/arguments.py:151-153)
    slime = "ray job submit -- python3 train.py --actor-num-nodes 32 --actor-num-gpus-per-node 8 " + \
        " ".join(LAUNCH.format(extra="").split("pretrain_gpt.py")[1].replace("\\\n", " ").split())
    got = import_launcher(slime, GLM, Plan(model="glm-5.2"))
    assert got.plan.engine == "slime" and got.plan.no_distributed_optimizer is False


def test_recompute_activations_is_selective_and_wins_over_a_granularity():
    # arguments.py:607-609: "if args.recompute_activations: args.recompute_granularity = 'selective'"
    assert imported("--recompute-activations").plan.recompute == "selective"
    assert imported("--recompute-granularity full --recompute-activations").plan.recompute == "selective"


def test_nargs_flags_are_read_whole():
    p = imported("--recompute-granularity selective --recompute-modules core_attn mla_up_proj moe_act "
                 "--hierarchical-context-parallel-sizes 2 4 --cp-comm-type allgather").plan
    assert p.recompute_modules == ("core_attn", "mla_up_proj", "moe_act")
    assert p.hierarchical_context_parallel_sizes == (2, 4)
    assert p.cp_comm_type == "allgather"
    # the words of an unquoted array splice are the flag's values too
    spliced = "MODS=(core_attn mlp)\n" + LAUNCH.format(extra="--recompute-granularity selective --recompute-modules "
                                                             "${MODS[@]}")
    assert import_launcher(spliced, GLM, Plan(model="glm-5.2")).plan.recompute_modules == ("core_attn", "mlp")
    # two entries stay a list of two (argument_utils.py:343-344), which 78 layers overrun
    p = imported("--cp-comm-type allgather allgather").plan
    assert p.cp_comm_type == "allgather,allgather"
    assert blocking(replace(p, gpu="custom", gpu_memory_gb=10_000)).keys() >= {"per_layer_cp_comm_type"}
    # a per-layer list (argument_utils.py:343-344 keeps a list of more than one) stays one, layer 1 first
    p = imported("--cp-comm-type " + " ".join(["allgather", "a2a"] * 39)).plan
    assert p.cp_comm_type == ",".join(["allgather", "a2a"] * 39)
    # a value that is no type at all fails closed, naming the flag
    with pytest.raises(LauncherImportError, match="--cp-comm-type"):
        imported("--cp-comm-type ring")


def test_per_layer_cp_comm_types():
    # transformer_layer.py:378-385 indexes the list by the global layer number: 78 entries for GLM-5.2
    every = ["allgather"] * 77 + ["all_gather"]
    assert blocking(replace(PROFILE, cp_comm_type=",".join(every))) == {}
    # DSA needs every layer's type to be allgather (transformer_config.py:3170-3173: all(...))
    assert blocking(replace(PROFILE, cp_comm_type=",".join(["allgather"] * 77 + ["p2p"]))) == {"dsa_cp": "cp_comm_type"}
    assert blocking(replace(PROFILE, cp_comm_type="allgather,all_gather")) == {"per_layer_cp_comm_type": "cp_comm_type"}
    # a2a+p2p anywhere needs the hierarchical sizes (arguments.py:583: '"a2a+p2p" in args.cp_comm_type')
    llama = Plan(model="llama-3.1-70b", pp=2, tp=8, cp=8, seq_length=8192, gpu="custom", gpu_memory_gb=10_000,
                 cp_comm_type=",".join(["p2p"] * 79 + ["a2a+p2p"]))
    assert blocking(llama, LLAMA) == {"a2a_p2p_hierarchical": "hierarchical_context_parallel_sizes"}
    ev = evaluate(replace(llama, hierarchical_context_parallel_sizes=(2, 4)), LLAMA)
    assert ev.verdict.go
    assert ev.exports()["megatron"].count("a2a+p2p") == 1   # the export keeps the list
    timed = evaluate(replace(llama, hierarchical_context_parallel_sizes=(2, 4), gpu="h100-80gb", gpu_memory_gb=None),
                     LLAMA).time
    assert any("per-layer --cp-comm-type timed as p2p, the type of 79 of 80 layers" in n for n in timed["assumed"])


def test_slime_allgather_cp_is_the_all_gather_layout():
    # slime/utils/arguments.py line 297; the pinned GLM-5.2 script passes it, so its profile stays GO
    assert SLIME_GLM52_PROFILE.cp_comm_type == "allgather"
    assert evaluate(SLIME_GLM52_PROFILE, GLM).verdict.go
    # slime refuses it for a non-DSA model with CP > 1 (slime/backends/megatron_utils/arguments.py:32-44)
    llama = Plan(model="llama-3.1-70b", engine="slime", pp=2, tp=8, cp=2, seq_length=8192, cp_comm_type="allgather",
                 gpu="custom", gpu_memory_gb=10_000)
    assert blocking(llama, LLAMA) == {"allgather_cp_non_dsa": "cp_comm_type"}
    # and for DSA with CP it needs --allgather-cp, not Megatron's spelling
    assert blocking(replace(SLIME_GLM52_PROFILE, cp_comm_type="all_gather")) == {"dsa_cp": "cp_comm_type"}


def test_cli_accepts_megatrons_switches_and_nargs():
    args = ["check", "glm-5.2", "--pp", "8", "--first", "14", "--last", "16", "--tp", "4", "--cp", "8", "--ep", "32",
            "--etp", "1", "--dp", "1", "--sp", "--tokens-per-gpu", "8192", "--recompute-activations",
            "--recompute-modules", "core_attn", "mla_up_proj", "--use-distributed-optimizer", "--cp-comm-type",
            "allgather", "--hierarchical-context-parallel-sizes", "2", "4", "--gpu-memory-gb", "10000", "--gpu", "custom",
            "--format", "json"]
    code, body = run_cli(args)
    assert code == 0, body["verdict"]
    # the export says what the aliases set: selective with both modules, the hierarchical sizes
    argv = body["exports"]["megatron"].replace("\\\n", " ").split()
    assert argv[argv.index("--recompute-granularity") + 1] == "selective"
    assert argv[argv.index("--recompute-modules") + 1:argv.index("--recompute-modules") + 3] == ["core_attn", "mla_up_proj"]
    assert argv[argv.index("--hierarchical-context-parallel-sizes") + 1:][:2] == ["2", "4"]
    assert "--recompute-activations" not in argv   # the export uses the current spelling
    # the old spelling of selective with a method is refused as Megatron refuses it (arguments.py:1425-1428)
    code, body = run_cli([*args, "--recompute-method", "uniform"])
    assert code == 1 and [r["code"] for r in body["verdict"]["blocking"]] == ["selective_method"]


def test_url_keys_round_trip_and_old_keys_keep_meaning():
    plan = replace(PROFILE, recompute="selective", recompute_method=None, recompute_num_layers=None,
                   recompute_modules=("core_attn", "moe_act"), moe_grouped_gemm=True,
                   hierarchical_context_parallel_sizes=(2, 4), max_position_embeddings=131072,
                   distribute_saved_activations=True, group_query_attention=True, num_query_groups=8)
    again, problems = plan_from_query(dict(parse_qsl(plan.query())))
    assert problems == [] and again == plan
    # the CLI line rebuilds it too, a per-layer list and the sizes as one word per value
    per_layer = replace(plan, cp_comm_type=",".join(["allgather"] * 78), recompute_modules=("core_attn",))
    args = per_layer.cli_args()
    assert args[args.index("--cp-comm-type") + 1:args.index("--cp-comm-type") + 79] == ["allgather"] * 78
    assert args[args.index("--hierarchical-context-parallel-sizes") + 1:][:2] == ["2", "4"]
    code, body = run_cli(["check", *args, "--format", "json"])
    assert code in (0, 1) and "problems" not in body
    # old keys: rmethod / rnl still name the method and layer count; no_distributed_optimizer still opts out
    old, _ = plan_from_query({"recompute": "full", "rmethod": "block", "rnl": "2", "no_dist_opt": "1"})
    assert (old.recompute_method, old.recompute_num_layers, old.no_distributed_optimizer) == ("block", 2, True)
    # a URL without the distributed-optimizer key keeps meaning "with it", as before
    assert plan_from_query({"tp": "4"})[0].no_distributed_optimizer is False


def test_export_carries_every_setting_the_plan_states():
    plan = replace(PROFILE, recompute="selective", recompute_method=None, recompute_num_layers=None,
                   recompute_modules=("core_attn", "mla_up_proj"), tokens_per_gpu=None, seq_length=8192,
                   max_position_embeddings=131072, multi_latent_attention=True, kv_lora_rank=512,
                   gpu="custom", gpu_memory_gb=10_000)
    ev = evaluate(plan, GLM)
    assert ev.verdict.go, ev.verdict.blocking
    argv = ev.exports()["megatron"].replace("\\\n", " ").split()
    at = {a: argv[i + 1] if i + 1 < len(argv) else None for i, a in enumerate(argv) if a.startswith("--")}
    assert at["--recompute-granularity"] == "selective" and "--recompute-method" not in at
    assert argv[argv.index("--recompute-modules") + 1:argv.index("--recompute-modules") + 3] == ["core_attn", "mla_up_proj"]
    assert at["--cp-comm-type"] == "allgather" and at["--seq-length"] == "8192"
    assert at["--max-position-embeddings"] == "131072" and at["--kv-lora-rank"] == "512"
    assert "--multi-latent-attention" in at and "--use-distributed-optimizer" in at
    # the same text read back as a launcher is the same plan's settings
    back = import_launcher("torchrun pretrain_gpt.py " + " ".join(argv) + "\n", GLM, Plan(model="glm-5.2"))
    assert back.plan.recompute_modules == ("core_attn", "mla_up_proj") and back.plan.cp_comm_type == "allgather"


def test_search_recommends_allgather_for_dsa_with_cp():
    from app.core.reports import search_report

    body = search_report(Plan(model="glm-5.2", tokens_per_gpu=8192, parallel=True), GLM, gpus=256, top=15).body
    assert body["counts"]["refused_by_verdict"] == 0
    with_cp = [r for r in body["results"] if r["cp"] > 1]
    assert with_cp and all(r["cp_comm_type"] == "allgather" and r["verdict"]["go"] for r in with_cp)
    assert all("--cp-comm-type allgather" in r["check_command"] for r in with_cp)
    assert all((r["recompute_method"], r["recompute_num_layers"]) == ("uniform", 1) for r in body["results"]
               if r["recompute"] == "full")
    assert json.dumps(body)   # JSON-ready
