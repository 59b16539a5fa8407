"""The settings each Megatron-Bridge table row ran with, read from the recipes of its container's release.

The performance tables state the parallel sizes; the rest (CUDA graphs, the MoE all-to-all overlap,
FP8 attention, selective recompute) is in the performance recipes of the Megatron-Bridge release
shipped in that container. This reads them once, offline, from a Megatron-Bridge git directory
(``fetch`` gives one) and writes them into ``bench/steptime_holdout.json`` as each row's
``recipe`` (with the tag and the config it matched), which :func:`bench.steptime.with_recipe` lays
over the row. Nothing here runs in CI (the repository is not there);
the JSON is the record.

Container -> release: the tag released with the container's performance summary
(:data:`RELEASES`; each tag's date is within two days of the summary commit that added that
container's tables). A row matches the workload config of its model, system and precision whose
GPUs, GBS, MBS, TP, PP, CP, VP and EP are the row's (``scripts/performance/configs/*/
*_workload_base_configs.py``, ``WorkloadBaseConfig``); ``set_workload_base_configs``
(``scripts/performance/utils/overrides.py``) applies ``cuda_graph_impl`` / ``cuda_graph_scope``,
``moe_a2a_overlap`` (-> ``overlap_moe_expert_parallel_comm``), ``fp8_dot_product_attention`` and
``recompute_modules``; a MoE model's dispatcher is ``flex`` when the config names a flex backend,
else ``alltoall`` (:func:`dispatcher_of`). Release v0.6.0 (26.08) has no workload configs (flat
``perf_recipes``); its rows are read from the recipe functions by :data:`FLAT_26_08`.

Usage: ``python -m bench.recipe_settings /work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo``
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bench.steptime import HOLDOUT

#: NeMo container -> the Megatron-Bridge release tag shipped with it (tag date / summary commit date)
RELEASES = {
    "25.11": "v0.2.0",     # 2025-11-26 / 97ad8cc6f 2025-12-04
    "26.02": "v0.3.0",     # 2026-02-26 / c0b9a0003 2026-02-26
    "26.02.01": "v0.3.1",  # 2026-03-20 / cfeddcd94 2026-03-21
    "26.04": "v0.4.0",     # 2026-04-16 / 74695a06d 2026-04-17
    "26.04.01": "v0.4.2",  # 2026-05-28 / 21d102f5e 2026-05-27
    "26.06": "v0.5.0",     # 2026-06-16 / 63b08b397 2026-06-16
    "26.06.01": "v0.5.1",  # 2026-07-20 / 381d0b825 2026-07-22
}

#: the tables' model names -> the workload configs' prefix and file
MODELS = {
    "DeepSeekV3": ("DEEPSEEK_V3", "deepseek/deepseek_workload_base_configs.py"),
    "Qwen3_30B_a3B": ("QWEN3_30B_A3B", "qwen/qwen3_workload_base_configs.py"),
    "Qwen3_235B_a22B": ("QWEN3_235B_A22B", "qwen/qwen3_workload_base_configs.py"),
    "LLAMA3_70B": ("LLAMA3_70B", "llama/llama3_workload_base_configs.py"),
    "LLAMA3_8B": ("LLAMA3_8B", "llama/llama3_workload_base_configs.py"),
    "LLAMA3.1_405B": ("LLAMA31_405B", "llama/llama31_workload_base_configs.py"),
    "Kimi_K2": ("KIMI_K2", "kimi/kimi_workload_base_configs.py"),
    "Nemotron_3_Super": ("NEMOTRON_3_SUPER", "nemotronh/nemotron_3_workload_base_configs.py"),
    "Nemotron_3_Nano": ("NEMOTRON_3_NANO", "nemotronh/nemotron_3_workload_base_configs.py"),
    "GPT OSS 120B": ("GPT_OSS_120B", "gpt_oss/gpt_oss_workload_base_configs.py"),
}
#: v0.2.0 (25.11) kept one workload file per model family and named its configs
#: ``<MODEL>_<SYSTEM>_<PRECISION>_BASE_CONFIG`` (no task, no variant): its files by the tables' names
V0_2_PATHS = {
    "DeepSeekV3": "deepseek/workload_base_configs.py",
    "Qwen3_30B_a3B": "qwen3/workload_base_configs.py",
    "Qwen3_235B_a22B": "qwen3/workload_base_configs.py",
    "LLAMA3_70B": "llama3/workload_base_configs.py",
    "LLAMA3_8B": "llama3/workload_base_configs.py",
    "LLAMA3.1_405B": "llama31/workload_base_configs.py",
    "GPT OSS 120B": "gpt_oss/workload_base_configs.py",
}
#: the tables' MoE models (the dispatcher matters for them only)
MOE_MODELS = ("DeepSeekV3", "Qwen3_30B_a3B", "Qwen3_235B_a22B", "Kimi_K2", "Nemotron_3_Super", "Nemotron_3_Nano",
              "GPT OSS 120B")
#: the tables' precision names -> the configs' (H100 "FP8" is current scaling)
PRECISIONS = {"BF16": "BF16", "FP8-CS": "FP8_CS", "FP8": "FP8_CS", "FP8-MX": "FP8_MX", "MXFP8": "FP8_MX",
              "NVFP4": "NVFP4"}

#: 26.08 (v0.6.0, ``src/megatron/bridge/perf_recipes``): the rows' recipe functions, read by hand.
#: ``_enable_hybridep_full_iteration_mxfp8`` (qwen/common.py) and ``_enable_deepseek_full_iteration_mxfp8``
#: (deepseek/common.py) set ``cuda_graph_impl = "full_iteration"``, ``overlap_moe_expert_parallel_comm``
#: and (Qwen; DeepSeek-V3 when asked) ``fp8_dot_product_attention``; Nemotron 3 Super's
#: (nemotronh/<system>/nemotronh.py, ``_apply_nemotron_3_super_perf_defaults``) keep partial graphs.
_SUPER_26_08 = {"cuda_graph": "none", "ep_comm_overlap": False, "fp8_attention": False, "recompute_modules": None,
                "dispatcher": "flex"}
#: GPT-OSS 120B's MXFP8 recipes (gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs: full-iteration
#: graph, EP overlap, FP8 attention, HybridEP; GB200's then sets recompute_modules = [])
_QWEN_26_08 = {"cuda_graph": "full_iteration", "ep_comm_overlap": True, "fp8_attention": True, "recompute_modules": None,
               "dispatcher": "flex"}   # qwen/<system>/qwen3_moe.py: _enable_hybridep_full_iteration_mxfp8
_GPT_OSS_26_08 = {"cuda_graph": "full_iteration", "ep_comm_overlap": True, "fp8_attention": True,
                  "recompute_modules": [], "dispatcher": "flex"}
FLAT_26_08 = {
    ("GPT OSS 120B", "GB300", "MXFP8"): ("gpt_oss/gb300/gpt_oss.py", _GPT_OSS_26_08),
    ("GPT OSS 120B", "GB200", "MXFP8"): ("gpt_oss/gb200/gpt_oss.py", _GPT_OSS_26_08),
    # Nemotron 3 Nano (nemotronh/gb300/nemotronh.py: _apply_nemotron_3_nano_perf_defaults, no recompute,
    # HybridEP, partial transformer_engine graphs)
    ("Nemotron_3_Nano", "GB300", "MXFP8"): ("nemotronh/gb300/nemotronh.py", {
        "cuda_graph": "none", "ep_comm_overlap": False, "fp8_attention": False, "recompute_modules": [],
        "dispatcher": "flex"}),
    **{("Nemotron_3_Super", system, precision): (f"nemotronh/{system.lower()}/nemotronh.py", _SUPER_26_08)
       for system in ("GB200", "GB300") for precision in ("MXFP8", "NVFP4")},
    ("DeepSeekV3", "GB300", "MXFP8"): ("deepseek/gb300/deepseek_v3.py", {
        "cuda_graph": "full_iteration", "ep_comm_overlap": True, "fp8_attention": True, "recompute_modules": [],
        "dispatcher": "flex"}),
    ("DeepSeekV3", "GB200", "MXFP8"): ("deepseek/gb200/deepseek_v3.py", {
        "cuda_graph": "full_iteration", "ep_comm_overlap": True, "fp8_attention": False,
        "recompute_modules": ["mla_up_proj"], "dispatcher": "flex"}),
    ("Qwen3_30B_a3B", "GB200", "MXFP8"): ("qwen/gb200/qwen3_moe.py", _QWEN_26_08),
    ("Qwen3_30B_a3B", "GB300", "MXFP8"): ("qwen/gb300/qwen3_moe.py", _QWEN_26_08),
    ("Qwen3_235B_a22B", "GB200", "MXFP8"): ("qwen/gb200/qwen3_moe.py", _QWEN_26_08),
    ("Qwen3_235B_a22B", "GB300", "MXFP8"): ("qwen/gb300/qwen3_moe.py", _QWEN_26_08),
}

ROW_ID = re.compile(r"mb-(?P<c>[\d.]+)-(?P<model>.+?)-DGX-(?P<sys>[A-Z0-9]+)-(?P<prec>.+?)-(?P<gpus>\d+)g-")


def _show(repo: Path, tag: str, path: str) -> str | None:
    out = subprocess.run(["git", "--git-dir", str(repo), "show", f"{tag}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def _workload_class(repo: Path, tag: str) -> type:
    """``WorkloadBaseConfig`` of ``tag`` (a plain dataclass; exec'd from its source, not imported)."""
    src = _show(repo, tag, "scripts/performance/utils/utils.py") or ""
    m = re.search(r"@dataclass[^\n]*\nclass WorkloadBaseConfig.*?(?=\n(?:@|def |class )\S)", src, re.S)
    if not m:
        raise SystemExit(f"{tag}: no WorkloadBaseConfig in scripts/performance/utils/utils.py")
    ns: dict[str, Any] = {"dataclass": dataclass, "Optional": Optional, "List": list}
    exec(m.group(0), ns)
    return ns["WorkloadBaseConfig"]


def workload_configs(repo: Path, tag: str, path: str) -> dict[str, Any]:
    """Every ``WorkloadBaseConfig`` a workload file of ``tag`` defines, by name."""
    src = _show(repo, tag, f"scripts/performance/configs/{path}")
    if src is None:
        return {}
    cls = _workload_class(repo, tag)
    utils = types.ModuleType("utils.utils")
    utils.WorkloadBaseConfig = cls  # type: ignore[attr-defined]
    sys.modules["utils"] = types.ModuleType("utils")
    sys.modules["utils.utils"] = utils
    ns: dict[str, Any] = {"__name__": "workload"}
    exec(compile(src, path, "exec"), ns)
    return {k: v for k, v in ns.items() if isinstance(v, cls)}


def dispatcher_of(c: Any, system: str) -> str:
    """The MoE dispatcher a workload config launches: ``flex`` when it names a flex backend the GPU
    runs (``apply_flex_dispatcher_backend``, ``src/megatron/bridge/training/flex_dispatcher_backend.py``:
    DeepEP on Hopper, B200 and B300 only, HybridEP on all of them), else ``alltoall`` - from v0.4.0
    ``set_workload_base_configs`` sets it so after the recipe function, before it the model
    providers' default was ``alltoall``."""
    backend = getattr(c, "moe_flex_dispatcher_backend", None)
    runs = backend == "hybridep" or (backend == "deepep" and system not in ("GB200", "GB300"))
    return "flex" if runs else "alltoall"


def _matches(row: dict[str, Any], c: Any) -> bool:
    vp = c.virtual_pipeline_model_parallel_size
    return (c.num_gpus, c.global_batch_size, c.micro_batch_size, c.tensor_model_parallel_size,
            c.pipeline_model_parallel_size, c.context_parallel_size, vp if vp and vp > 1 else None,
            c.expert_model_parallel_size) == (row["gpus"], row["gbs"], row["mbs"], row["tp"], row["pp"], row["cp"],
                                              row["vp"] if (row["vp"] or 1) > 1 else None, row["ep"] or 1)


def settings_of(c: Any) -> dict[str, Any]:
    """The settings of one workload config the time model reads (module docstring)."""
    scope = getattr(c, "cuda_graph_scope", None) or []   # older releases lack some fields: their defaults
    scope = [scope] if isinstance(scope, str) else scope
    # A "full_iteration" scope is a full-iteration graph, unless the config says impl "none": the
    # only configs that name the scope with impl "none" (Llama 3 / 3.1 NVFP4, v0.3.0-v0.4.2) ran on a
    # Megatron-Core from before its CUDA-graph refactor (NVIDIA/Megatron-LM e41b37002c, 2026-05-18),
    # which captures nothing under impl "none"; the refactor migrates the scope to the full-iteration
    # impl, and v0.6.0's ``_benchmark_common`` clears the scope when impl is "none" (perf_recipes/_common.py)
    impl = getattr(c, "cuda_graph_impl", None)
    full = impl == "full_iteration" or (impl != "none" and "full_iteration" in scope)
    modules = getattr(c, "recompute_modules", None)
    return {"cuda_graph": "full_iteration" if full else "none",
            "ep_comm_overlap": bool(getattr(c, "moe_a2a_overlap", False)),
            "fp8_attention": bool(getattr(c, "fp8_dot_product_attention", False)),
            "recompute_modules": list(modules) if modules is not None else None}


def recipe_for(repo: Path, row: dict[str, Any]) -> dict[str, Any] | None:
    m = ROW_ID.match(row["id"])
    if not m or (m["model"] not in MODELS and (m["model"], m["sys"], m["prec"]) not in FLAT_26_08):
        return None
    if m["c"] == "26.08":
        hit = FLAT_26_08.get((m["model"], m["sys"], m["prec"]))
        return {"release": "v0.6.0", "config": f"src/megatron/bridge/perf_recipes/{hit[0]}", **hit[1]} if hit else None
    tag = RELEASES.get(m["c"])
    if tag is None or m["model"] not in MODELS:
        return None
    prefix, path = MODELS[m["model"]]
    if tag == "v0.2.0":
        if m["model"] not in V0_2_PATHS:
            return None
        path = V0_2_PATHS[m["model"]]
        name = f"{prefix}_{m['sys']}_{PRECISIONS[m['prec']]}_BASE_CONFIG"
        found = {k: v for k, v in workload_configs(repo, tag, path).items() if k == name}
    else:
        name = f"{prefix}_PRETRAIN_CONFIG_{m['sys']}_{PRECISIONS[m['prec']]}"
        found = {k: v for k, v in workload_configs(repo, tag, path).items() if k.startswith(name + "_")}
    hits = {k: v for k, v in found.items() if _matches(row, v)}
    if not hits:
        return None
    settings = {k: settings_of(v) for k, v in hits.items()}
    first = sorted(settings)[0]
    if any(s != settings[first] for s in settings.values()):
        raise SystemExit(f"{row['id']}: configs {sorted(settings)} of {tag} differ in the settings")
    dispatcher = dispatcher_of(hits[first], m["sys"]) if m["model"] in MOE_MODELS else None
    return {"release": tag, "config": f"scripts/performance/configs/{path}:{first}", **settings[first],
            "dispatcher": dispatcher}


def main(argv: list[str] | None = None) -> None:
    repo = Path((argv or sys.argv[1:])[0])
    data = json.loads(HOLDOUT.read_text("utf-8"))
    found = missing = 0
    for key in ("rows", "added_development"):
        for row in data[key]:
            if row.get("source") != "megatron-bridge":
                continue
            rec = recipe_for(repo, row)
            if rec is None:
                missing += 1
                row.pop("recipe", None)
                continue
            found += 1
            row["recipe"] = rec
    HOLDOUT.write_text(json.dumps(data, indent=1) + "\n", "utf-8")
    print(f"recipe settings for {found} rows; {missing} rows matched no workload config (kept as they were)")


if __name__ == "__main__":
    main()
