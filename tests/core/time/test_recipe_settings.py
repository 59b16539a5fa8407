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
    it, perf_recipes/_common.py); partial graphs (``transformer_engine`` with scopes) are eager here."""
    assert settings_of(_config(cuda_graph_impl="full_iteration"))["cuda_graph"] == "full_iteration"
    assert settings_of(_config(cuda_graph_scope=["full_iteration"]))["cuda_graph"] == "full_iteration"
    assert settings_of(_config(cuda_graph_scope="full_iteration"))["cuda_graph"] == "full_iteration"
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
