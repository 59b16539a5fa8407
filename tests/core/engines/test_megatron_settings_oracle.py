"""Generated Megatron launchers over issue 19's training settings (recompute, optimizer, sequence
length, context-parallel communication, GQA / MLA, MTP) and the speed switches (TP / gradient /
parameter overlap, the MoE all-to-all overlap and the token dispatcher) against an oracle written here from
NVIDIA/Megatron-LM's source at d98e8a64ddf34856e74b24714e3bedb2f5a39553, independently of app/core.

The oracle follows Megatron's startup path in its own order, with its own state changes on the way:
``--recompute-activations`` turns the granularity to selective (``arguments.py:607-609``) before
anything is checked; TP = 1 switches sequence parallelism off (``arguments.py:1433-1439``) before
``TransformerConfig`` sees it; ``--num-query-groups`` is read only with ``--group-query-attention``
(``argument_utils.py:330-333``) and the MLA flags only with ``--multi-latent-attention`` (313-314);
a one-entry ``--cp-comm-type`` list becomes a string (343-344). Each refusal is named by the source
lines it comes from; isplan must name the same set (its reason codes map onto those lines below),
and say "model" exactly when the job would build attention the checkpoint does not have. Every GO
plan's export is then parsed by Megatron's parser rebuilt from ``app/core/data/megatron_arguments.txt``
and judged by the oracle again: it must be accepted unchanged.

Models: GLM-5.2 (MLA, DSA, MoE, one MTP layer) and two dense GQA models (Llama-3.1-70B: 64 heads,
8 key-value heads; Qwen2-7B's published shape: 28 heads, 4 key-value heads). Memory is not what is
tested here: the GPU is given 10 TB and host memory is not compared.
"""

from __future__ import annotations

import argparse
from math import prod

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.evaluate import evaluate
from app.core.launcher import import_launcher
from app.core.model.config import load_model
from app.core.plan import Plan
from tests.conftest import make_config
from tests.core.engines.test_export import SHAPES, megatron_parser
from tests.core.model.test_model_families import QWEN2_7B

GLM = load_model("glm-5.2")
LLAMA = load_model("llama-3.1-70b")
QWEN2 = make_config({**QWEN2_7B, "max_position_embeddings": 32768}, id="qwen2-7b")
MODELS = {"glm-5.2": GLM, "llama-3.1-70b": LLAMA, "qwen2-7b": QWEN2}
# a valid layout for each: PP 2; GLM-5.2's second stage starts on full layer 39 (3 + 4 * 9)
FIRST = {"glm-5.2": 38, "llama-3.1-70b": 40, "qwen2-7b": 14}
MODULES = ("core_attn", "mla_up_proj", "moe_act", "layernorm", "mlp", "moe", "shared_experts")

# isplan's reason codes -> the Megatron source lines the oracle names
LINES = {
    "heads_tp": "transformer_config.py:1446-1450", "kv_heads_tp": "transformer_config.py:1458-1467",
    "sp_moe_tp": "moe_layer.py:636-640", "dsa_cp": "transformer_config.py:3162-3177",
    "hierarchical_cp": "arguments.py:580-582", "a2a_p2p_hierarchical": "arguments.py:583-585",
    "seq_max_positions": "arguments.py:1353-1356", "selective_method": "arguments.py:1425-1428",
    "full_method": "transformer_config.py:1913-1917", "full_num_layers": "transformer_config.py:1919-1925",
    "selective_num_layers": "transformer_config.py:1926-1932",
    "distribute_saved_activations": "arguments.py:1410-1419",
    "distribute_saved_activations_sp": "transformer_config.py:1934-1938",
    "recompute_moe_act": "transformer_config.py:1964-1967", "recompute_mla_up_proj": "transformer_config.py:1969-1973",
    "mtp_recompute_layers": "multi_token_prediction.py:1621-1627", "cpu_offload_flags": "arguments.py:1884-1888",
    "precision_aware_distributed": "optimizer/__init__.py:1057-1060", "gqa_with_mla": "arguments.py:1973-1974",
    "te_cp_comm_type": "te:context_parallel.py:5096-5139", "per_layer_cp_comm_type": "transformer_layer.py:378-385",
    "param_gather_optimizer": "arguments.py:1024-1027", "param_gather_grad_reduce": "arguments.py:1028-1029",
    "tp_comm_overlap_sp": "arguments.py:1441-1442", "ep_overlap_vpp": "transformer_config.py:3007-3011",
    "ep_overlap_ep": "transformer_config.py:3013-3015", "ep_overlap_dispatcher": "transformer_config.py:3016-3019",
    "ep_overlap_recompute": "transformer_config.py:3021-3023",
    "ep_overlap_recompute_method": "transformer_config.py:3024-3026",
    "ep_overlap_recompute_num_layers": "transformer_config.py:3027-3029",
    "ep_overlap_recompute_moe": "transformer_config.py:3030-3032", "ep_overlap_mtp": "transformer_config.py:3042-3046",
}
MODEL_CODES = {"attention_mismatch", "num_query_groups_mismatch"}


# --------------------------------------------------------------------------- the oracle
def oracle(c: dict) -> tuple[set[str], bool]:
    """(the source lines whose checks refuse the launch, whether the job builds attention the
    checkpoint does not have), read from Megatron's code at d98e8a64."""
    cfg, out = MODELS[c["model"]], set()
    tp, cp = c["tp"], c["cp"]
    granularity = c["granularity"]
    if c["recompute_activations"]:          # arguments.py:607-609
        granularity = "selective"
    comm = c["cp_comm_type"] or ["p2p"]     # arguments.py:3221: default ["p2p"]
    hier = c["hier"]
    if hier and prod(hier) != cp:           # arguments.py:580-582
        out.add("arguments.py:580-582")
    if "a2a+p2p" in comm and hier is None:  # arguments.py:583-585
        out.add("arguments.py:583-585")
    if c["max_pos"] < c["seq"]:             # arguments.py:1353-1356
        out.add("arguments.py:1353-1356")
    if c["distribute"] and (tp == 1 or granularity != "full" or c["method"] is None):   # arguments.py:1410-1419
        out.add("arguments.py:1410-1419")
    if granularity == "selective" and c["method"] is not None:                          # arguments.py:1425-1428
        out.add("arguments.py:1425-1428")
    sp = c["sp"] and tp > 1                                                              # arguments.py:1433-1439
    if c["opg"] and not c["dist_opt"]:                                                   # arguments.py:1024-1027
        out.add("arguments.py:1024-1027")
    if c["opg"] and not c["ogr"]:                                                        # arguments.py:1028-1029
        out.add("arguments.py:1028-1029")
    if c["tpo"] and not sp:                                                              # arguments.py:1441-1442
        out.add("arguments.py:1441-1442")
    if c["offload"] and not c["pao"]:                                                    # arguments.py:1884-1888
        out.add("arguments.py:1884-1888")
    mla = c["mla_flag"]
    if mla and c["gqa_flag"]:                                                            # arguments.py:1973-1974
        out.add("arguments.py:1973-1974")
    # TransformerConfig.__post_init__ (argument_utils.py:330-333: groups only with --group-query-attention)
    heads = cfg.num_attention_heads
    groups = c["groups"] if c["gqa_flag"] and c["groups"] else heads
    if heads % tp:
        out.add("transformer_config.py:1446-1450")
    if groups % tp and tp % groups:
        out.add("transformer_config.py:1458-1467")
    if granularity is not None:
        if c["method"] is None and granularity != "selective":
            out.add("transformer_config.py:1913-1917")
        if granularity != "selective" and c["layers"] is None:
            out.add("transformer_config.py:1919-1925")
        elif granularity == "selective" and c["layers"] is not None:
            out.add("transformer_config.py:1926-1932")
        if c["distribute"] and sp:
            out.add("transformer_config.py:1934-1938")
    modules = c["modules"] if c["modules"] is not None else ["core_attn"]   # transformer_config.py:1940-1941
    if granularity == "selective":
        if "moe_act" in modules and not c["grouped_gemm"]:
            out.add("transformer_config.py:1964-1967")
        if "mla_up_proj" in modules and not mla:
            out.add("transformer_config.py:1969-1973")
    # transformer_layer.py:378-385: a list is indexed by the global layer number when CP > 1
    if cp > 1 and len(comm) > 1 and len(comm) < cfg.num_hidden_layers:
        out.add("transformer_layer.py:378-385")
    dsa = cfg.has_indexer
    if dsa and cp > 1 and not all(t.replace("_", "").lower() == "allgather" for t in comm):
        out.add("transformer_config.py:3162-3177")
    # attention other than DSA: Transformer Engine's CP dispatcher (NVIDIA/TransformerEngine
    # attention/dot_product_attention/context_parallel.py:5096-5139 @ d0067d0d) at the first forward
    if not dsa and cp > 1 and any(t not in ("p2p", "a2a+p2p", "all_gather", "a2a") for t in comm):
        out.add("te:context_parallel.py:5096-5139")
    # the optimizer's guard (megatron/core/optimizer/__init__.py:1057-1060)
    if c["pao"] and not c["dist_opt"]:
        out.add("optimizer/__init__.py:1057-1060")
    # the MoE layer's training forward (moe/moe_layer.py:636-640); the MTP layer's (multi_token_prediction.py)
    if cfg.n_routed_experts and tp > 1 and not sp:
        out.add("moe_layer.py:636-640")
    if c["mtp"] and granularity == "full" and c["method"] == "uniform" and c["layers"] != 1:
        out.add("multi_token_prediction.py:1621-1627")
    if c["ep_overlap"]:   # transformer_config.py:3002-3046 (PP 2 without VPP, EP 1 in these launches)
        out.add("transformer_config.py:3007-3011")
        out.add("transformer_config.py:3013-3015")
        if c["dispatcher"] in (None, "allgather"):   # the default is allgather (transformer_config.py:891)
            out.add("transformer_config.py:3016-3019")
        if granularity == "full":
            out.add("transformer_config.py:3021-3023")
        if c["method"] is not None:
            out.add("transformer_config.py:3024-3026")
        if c["layers"] is not None:
            out.add("transformer_config.py:3027-3029")
        if "moe" in modules:
            out.add("transformer_config.py:3030-3032")
        if c["mtp"] > 1:
            out.add("transformer_config.py:3042-3046")
    # the checkpoint: MLA with --multi-latent-attention only; a GQA model's groups as built
    mismatch = (cfg.attention == "mla") != bool(mla) or (cfg.attention == "gqa" and not mla
                                                         and groups != cfg.num_key_value_heads)
    return out, mismatch


# --------------------------------------------------------------------------- the generator
@st.composite
def flag_sets(draw) -> dict:
    model = draw(st.sampled_from(sorted(MODELS)))
    cfg = MODELS[model]
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    c = {
        "model": model, "tp": draw(st.sampled_from([1, 2, 4, 8])), "cp": cp, "sp": draw(st.booleans()),
        "seq": draw(st.sampled_from([4096, 8192])), "max_pos": draw(st.sampled_from([2048, 4096, 8192, 131072])),
        "granularity": draw(st.sampled_from([None, None, "full", "full", "selective"])),
        "recompute_activations": draw(st.sampled_from([False, False, False, True])),
        "method": draw(st.sampled_from([None, "uniform", "uniform", "block"])),
        "layers": draw(st.sampled_from([None, 1, 1, 2, 50])),
        "modules": draw(st.one_of(st.none(), st.lists(st.sampled_from(MODULES), min_size=1, max_size=3, unique=True))),
        "grouped_gemm": draw(st.booleans()), "distribute": draw(st.sampled_from([False, False, True])),
        "cp_comm_type": draw(st.one_of(
            st.sampled_from([None, None, ["p2p"], ["a2a"], ["allgather"], ["all_gather"], ["a2a+p2p"],
                             ["allgather"] * cfg.num_hidden_layers]),
            # one type per layer (Megatron keeps a list of more than one, argument_utils.py:343-344), or too few
            st.lists(st.sampled_from(["p2p", "a2a", "allgather", "all_gather", "a2a+p2p"]),
                     min_size=cfg.num_hidden_layers, max_size=cfg.num_hidden_layers),
            st.lists(st.sampled_from(["allgather", "all_gather", "p2p"]), min_size=2, max_size=4))),
        "hier": draw(st.sampled_from([None, None, [cp], [2, max(1, cp // 2)], [3]])),
        "dist_opt": draw(st.booleans()), "pao": draw(st.booleans()), "offload": draw(st.booleans()),
        "mtp": draw(st.sampled_from([0, 1])) if cfg.num_nextn_predict_layers else 0,
        "tpo": draw(st.booleans()), "ogr": draw(st.booleans()), "opg": draw(st.booleans()),
        "ep_overlap": draw(st.sampled_from([False] * 5 + [True])),
        "dispatcher": draw(st.sampled_from([None, None, "allgather", "alltoall", "flex"])),
    }
    if draw(st.booleans()):   # half the sets are coherent launches, so GO plans (and their exports) are common
        full = c["granularity"] == "full" and not c["recompute_activations"]
        c.update(tp=draw(st.sampled_from([2, 4])), sp=True, max_pos=131072, distribute=False, dist_opt=True,
                 method=draw(st.sampled_from(["uniform", "block"])) if full else None, layers=1 if full else None,
                 hier=[cp] if c["cp_comm_type"] == ["a2a+p2p"] else None,
                 cp_comm_type=(["allgather"] if cfg.has_indexer else draw(st.sampled_from([None, ["p2p"], ["all_gather"],
                                                                                          ["a2a"]]))) if cp > 1 else
                 c["cp_comm_type"], pao=c["pao"] or c["offload"], ogr=c["ogr"] or c["opg"], ep_overlap=False)
    if cfg.attention == "mla":
        c.update(mla_flag=draw(st.sampled_from([True] * 8 + [False])), gqa_flag=draw(st.sampled_from([False] * 8 + [True])),
                 groups=None)
    else:
        c.update(mla_flag=draw(st.sampled_from([False] * 12 + [True])), gqa_flag=draw(st.sampled_from([True] * 5 + [False])),
                 groups=draw(st.sampled_from([cfg.num_key_value_heads] * 6 + [cfg.num_attention_heads, 3])))
    return c


def model_argv(c: dict) -> list[str]:
    """The model's own arguments (what its model script passes), matching the config."""
    cfg = MODELS[c["model"]]
    argv = ["--num-layers", str(cfg.num_hidden_layers), "--hidden-size", str(cfg.hidden_size),
            "--num-attention-heads", str(cfg.num_attention_heads)]
    if cfg.n_routed_experts:
        argv += ["--num-experts", str(cfg.n_routed_experts), "--moe-ffn-hidden-size", str(cfg.moe_intermediate_size)]
    if c["mla_flag"]:
        argv.append("--multi-latent-attention")
        if cfg.attention == "mla":
            argv += ["--q-lora-rank", str(cfg.q_lora_rank), "--kv-lora-rank", str(cfg.kv_lora_rank),
                     "--qk-head-dim", str(cfg.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(cfg.qk_rope_head_dim),
                     "--v-head-dim", str(cfg.v_head_dim)]
    if c["gqa_flag"]:
        argv.append("--group-query-attention")
    if c["groups"] is not None:
        argv += ["--num-query-groups", str(c["groups"])]
    return argv


def launcher_argv(c: dict) -> list[str]:
    """The flag set as Megatron's ``pretrain_gpt.py`` arguments."""
    argv = [*model_argv(c), "--pipeline-model-parallel-size", "2",
            "--decoder-first-pipeline-num-layers", str(FIRST[c["model"]]),
            "--tensor-model-parallel-size", str(c["tp"]), "--context-parallel-size", str(c["cp"]),
            "--seq-length", str(c["seq"]), "--max-position-embeddings", str(c["max_pos"]),
            "--micro-batch-size", "1", "--global-batch-size", "8"]
    if MODELS[c["model"]].n_routed_experts:
        argv += ["--expert-tensor-parallel-size", "1"]
    switches = {"--sequence-parallel": c["sp"], "--recompute-activations": c["recompute_activations"],
                "--moe-grouped-gemm": c["grouped_gemm"], "--distribute-saved-activations": c["distribute"],
                "--use-distributed-optimizer": c["dist_opt"], "--use-precision-aware-optimizer": c["pao"],
                "--optimizer-cpu-offload": c["offload"], "--tp-comm-overlap": c["tpo"],
                "--overlap-grad-reduce": c["ogr"], "--overlap-param-gather": c["opg"],
                "--overlap-moe-expert-parallel-comm": c["ep_overlap"]}
    argv += [flag for flag, on in switches.items() if on]
    for flag, value in (("--recompute-granularity", c["granularity"]), ("--recompute-method", c["method"]),
                        ("--recompute-num-layers", c["layers"]), ("--moe-token-dispatcher-type", c["dispatcher"])):
        if value is not None:
            argv += [flag, str(value)]
    for flag, values in (("--recompute-modules", c["modules"]), ("--cp-comm-type", c["cp_comm_type"]),
                         ("--hierarchical-context-parallel-sizes", c["hier"])):
        if values is not None:
            argv += [flag, *map(str, values)]
    if c["mtp"]:
        argv += ["--mtp-num-layers", str(c["mtp"])]
    return argv


def judged(argv: list[str], model: str):
    """isplan's evaluation of a ``pretrain_gpt.py`` launch with these arguments."""
    script = "torchrun pretrain_gpt.py \\\n    " + " \\\n    ".join(argv) + "\n"
    base = Plan(model=model, gpu="custom", gpu_memory_gb=10_000, host_memory_gb=1 << 20)
    imported = import_launcher(script, MODELS[model], base)
    return evaluate(imported.plan, MODELS[model], extra_errors=imported.errors)


def refusals(ev) -> tuple[set[str], bool]:
    blocking = [r for r in ev.verdict.blocking if r.kind != "memory"]
    unknown = [r for r in blocking if r.code not in LINES and r.code not in MODEL_CODES]
    assert not unknown, [(r.code, r.message) for r in unknown]
    return {LINES[r.code] for r in blocking if r.code in LINES}, any(r.code in MODEL_CODES for r in blocking)


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=flag_sets())
def test_isplan_names_the_refusals_megatron_makes(c):
    expected, mismatch = oracle(c)
    ev = judged(launcher_argv(c), c["model"])
    assert not ev.problems, ev.problems
    got, got_mismatch = refusals(ev)
    event("accepted" if not expected else f"refused by {len(expected)} rule(s)")
    assert got == expected, (c, [r.message for r in ev.verdict.blocking])
    assert got_mismatch == mismatch, (c, [r.message for r in ev.verdict.blocking])
    if not ev.verdict.go:
        return
    event("GO: export parsed and judged again")
    # a GO plan's export: Megatron's parser reads it, every option as its parser defines it, and the
    # same launch (the model's own arguments + the export) is accepted by the oracle unchanged
    export = ev.exports()["megatron"].replace("\\\n", " ").split()
    argv = [*model_argv(c), *export, "--micro-batch-size", "1", "--global-batch-size", "8"]
    ns = megatron_parser().parse_args(argv)
    again = exported_case(ns, c)
    assert oracle(again) == (set(), False), (export, again)


def exported_case(ns: argparse.Namespace, c: dict) -> dict:
    """The flag-set dictionary the parsed export stands for (as the oracle reads a launch)."""
    get = vars(ns).get
    return {
        "model": c["model"], "tp": get("tensor_model_parallel_size"), "cp": get("context_parallel_size"),
        "sp": bool(get("sequence_parallel")), "seq": get("seq_length") or c["seq"],
        "max_pos": get("max_position_embeddings") or c["max_pos"], "granularity": get("recompute_granularity"),
        "recompute_activations": bool(get("recompute_activations")), "method": get("recompute_method"),
        "layers": get("recompute_num_layers"), "modules": get("recompute_modules"),
        "grouped_gemm": bool(get("moe_grouped_gemm")), "distribute": bool(get("distribute_saved_activations")),
        "cp_comm_type": get("cp_comm_type"), "hier": get("hierarchical_context_parallel_sizes"),
        "dist_opt": bool(get("use_distributed_optimizer")), "pao": bool(get("use_precision_aware_optimizer")),
        "offload": bool(get("optimizer_cpu_offload")), "mtp": get("mtp_num_layers") or 0,
        "mla_flag": bool(get("multi_latent_attention")), "gqa_flag": bool(get("group_query_attention")),
        "groups": get("num_query_groups"), "tpo": bool(get("tp_comm_overlap")),
        "ogr": bool(get("overlap_grad_reduce")), "opg": bool(get("overlap_param_gather")),
        "ep_overlap": bool(get("overlap_moe_expert_parallel_comm")),
        "dispatcher": get("moe_token_dispatcher_type"),
    }


def test_the_option_list_knows_every_flag_the_generator_writes():
    c = {"model": "glm-5.2", "tp": 4, "cp": 2, "sp": True, "seq": 4096, "max_pos": 4096, "granularity": "full",
         "recompute_activations": True, "method": "uniform", "layers": 1, "modules": ["core_attn"],
         "grouped_gemm": True, "distribute": True, "cp_comm_type": ["allgather"], "hier": [2], "dist_opt": True,
         "pao": True, "offload": True, "mtp": 1, "mla_flag": True, "gqa_flag": True, "groups": 8, "tpo": True,
         "ogr": True, "opg": True, "ep_overlap": True, "dispatcher": "alltoall"}
    argv = launcher_argv(c)
    assert {a for a in argv if a.startswith("--")} <= set(SHAPES)
    ns = megatron_parser().parse_args(argv)
    assert exported_case(ns, c) == c
