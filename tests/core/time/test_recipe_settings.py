"""bench/recipe_settings.py's reading of a workload config (the JSON it wrote is checked in
test_time_bench.py): which settings a config launches, which dispatcher, which rows it matches,
and how a row takes them (bench.steptime.with_recipe). The configs here are stand-ins with the
fields of Megatron-Bridge's ``WorkloadBaseConfig`` (scripts/performance/utils/utils.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.recipe_settings import _matches, dispatcher_of, settings_of
from bench.steptime import with_recipe


def _config(**kw):
    base = dict(num_gpus=64, global_batch_size=512, micro_batch_size=1, tensor_model_parallel_size=1,
                pipeline_model_parallel_size=1, context_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                expert_model_parallel_size=64, cuda_graph_impl=None, cuda_graph_scope=None, moe_a2a_overlap=False,
                fp8_dot_product_attention=None, recompute_modules=None, moe_flex_dispatcher_backend=None)
    return SimpleNamespace(**{**base, **kw})


def test_full_iteration_graphs_are_the_impl_or_the_scope():
    """``cuda_graph_impl="full_iteration"``, or a scope naming ``full_iteration`` (Megatron promotes
    it, perf_recipes/_common.py) unless the impl is "none" (the Megatron-Core those configs ran on,
    before its CUDA-graph refactor, captured nothing then); partial graphs (``transformer_engine``
    with scopes) are eager here."""
    assert settings_of(_config(cuda_graph_impl="full_iteration"))["cuda_graph"] == "full_iteration"
    assert settings_of(_config(cuda_graph_scope=["full_iteration"]))["cuda_graph"] == "full_iteration"
    assert settings_of(_config(cuda_graph_scope="full_iteration"))["cuda_graph"] == "full_iteration"
    # impl "none" captures nothing whatever the scope (Llama 3 / 3.1 NVFP4 configs of v0.3.0-v0.4.2)
    assert settings_of(_config(cuda_graph_impl="none", cuda_graph_scope="full_iteration"))["cuda_graph"] == "none"
    assert settings_of(_config(cuda_graph_impl="local", cuda_graph_scope="full_iteration"))["cuda_graph"] == (
        "full_iteration")
    partial = settings_of(_config(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "moe_router"]))
    assert partial["cuda_graph"] == "none"
    s = settings_of(_config(moe_a2a_overlap=True, fp8_dot_product_attention=True, recompute_modules=["moe_act"]))
    assert (s["ep_comm_overlap"], s["fp8_attention"], s["recompute_modules"]) == (True, True, ["moe_act"])
    older = SimpleNamespace(cuda_graph_impl=None)   # a release whose config has fewer fields: their defaults
    assert settings_of(older) == {"cuda_graph": "none", "ep_comm_overlap": False, "fp8_attention": False,
                                  "recompute_modules": None}


@pytest.mark.parametrize("backend,system,dispatcher", [
    ("hybridep", "GB200", "flex"), ("hybridep", "H100", "flex"),
    ("deepep", "B200", "flex"), ("deepep", "H100", "flex"),
    ("deepep", "GB200", "alltoall"),   # apply_flex_dispatcher_backend: DeepEP skipped on GB200 / GB300
    (None, "B300", "alltoall"),        # no flex backend: alltoall
])
def test_the_dispatcher_follows_the_flex_backend(backend, system, dispatcher):
    assert dispatcher_of(_config(moe_flex_dispatcher_backend=backend), system) == dispatcher


def test_a_row_matches_its_config_by_every_size_and_vp_one_is_none():
    row = {"gpus": 64, "gbs": 512, "mbs": 1, "tp": 1, "pp": 1, "cp": 1, "vp": None, "ep": 64}
    assert _matches(row, _config())
    assert _matches({**row, "vp": 1}, _config(virtual_pipeline_model_parallel_size=1))
    assert not _matches({**row, "mbs": 2}, _config())
    assert not _matches(row, _config(expert_model_parallel_size=8))


def test_a_row_takes_its_recipes_settings():
    """EP overlap, graphs and FP8 attention (never under BF16), the dispatcher where named, and the
    recomputed modules: a list is selective recompute of them, ``[]`` no recompute, ``None`` the
    row's own."""
    row = {"precision": "mxfp8", "overlaps": {"overlap_grad_reduce": True},
           "recompute": {"granularity": "selective", "method": None, "num_layers": None, "modules": ["mla_up_proj"]}}
    rec = {"cuda_graph": "full_iteration", "ep_comm_overlap": True, "fp8_attention": True, "recompute_modules": [],
           "dispatcher": "alltoall"}
    out = with_recipe({**row, "recipe": rec})
    assert out["overlaps"] == {"overlap_grad_reduce": True, "ep_comm_overlap": True}
    assert (out["cuda_graph"], out["fp8_attention"], out["moe_dispatcher"]) == ("full_iteration", True, "alltoall")
    assert out["recompute"]["granularity"] is None
    kept = with_recipe({**row, "recipe": {**rec, "recompute_modules": None, "dispatcher": None}})
    assert kept["recompute"] == row["recompute"] and "moe_dispatcher" not in kept
    listed = with_recipe({**row, "recipe": {**rec, "recompute_modules": ["moe_act"]}})
    assert listed["recompute"]["modules"] == ["moe_act"]
    assert with_recipe({**row, "precision": "bf16", "recipe": rec})["fp8_attention"] is False
    assert with_recipe(row) is row


def test_each_release_is_read_under_its_own_file_and_config_names(monkeypatch):
    """v0.2.0 (25.11) named its configs ``<MODEL>_<SYSTEM>_<PRECISION>_BASE_CONFIG`` in one file per
    family (``qwen3/workload_base_configs.py``); later releases ``<MODEL>_PRETRAIN_CONFIG_<SYSTEM>_
    <PRECISION>_<VARIANT>`` (``qwen/qwen3_workload_base_configs.py``). A 25.11 row is read there, with the
    EP overlap and, no flex backend named, the ``alltoall`` dispatcher."""
    from bench import recipe_settings

    asked: list[tuple[str, str]] = []
    h100 = _config(num_gpus=256, global_batch_size=2048, tensor_model_parallel_size=2, pipeline_model_parallel_size=8,
                   virtual_pipeline_model_parallel_size=4, expert_model_parallel_size=32, moe_a2a_overlap=True)

    def configs(repo, tag, path):
        asked.append((tag, path))
        if tag == "v0.2.0":
            return {"QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG": h100,
                    "QWEN3_235B_A22B_H100_BF16_BASE_CONFIG": _config()}
        return {"QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1": h100}

    monkeypatch.setattr(recipe_settings, "workload_configs", configs)
    row = {"id": "mb-25.11-Qwen3_235B_a22B-DGX-H100-FP8-CS-256g-gbs2048-mbs1-tp2pp8cp1vp4ep32", "gpus": 256,
           "gbs": 2048, "mbs": 1, "tp": 2, "pp": 8, "cp": 1, "vp": 4, "ep": 32}
    rec = recipe_settings.recipe_for("repo", row)
    assert asked == [("v0.2.0", "qwen3/workload_base_configs.py")]
    assert rec is not None and rec["config"].endswith("qwen3/workload_base_configs.py:QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG")
    assert (rec["ep_comm_overlap"], rec["dispatcher"]) == (True, "alltoall")
    later = recipe_settings.recipe_for("repo", {**row, "id": row["id"].replace("mb-25.11-", "mb-26.04-")})
    assert asked[-1] == ("v0.4.0", "qwen/qwen3_workload_base_configs.py")
    assert later is not None and later["config"].endswith(":QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1")
