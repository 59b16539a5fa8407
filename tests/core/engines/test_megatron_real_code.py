"""isplan's Megatron stages and DSA verdict against Megatron-LM's own functions, run here.

``test_megatron_oracle.py`` checks isplan against rules re-written from Megatron's source. This
module runs the source itself: the functions that decide what each (pipeline rank, virtual stage)
builds and whether its DSA top-k sharing holds, read from a local snapshot of NVIDIA/Megatron-LM
at the commit the rules cite (``ISPLAN_MEGATRON_REPO``, a bare git directory; default the search
tool's mirror) and executed with stand-ins for what they import (``torch`` is not needed by them;
``parallel_state`` answers the rank being built). Their text is not copied into this repository;
without the snapshot the module is skipped.

At d98e8a64ddf34856e74b24714e3bedb2f5a39553:

* ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: ``PipelineParallelLayerLayout``
  (the layout string's parse, ``validate_layer_layout``, ``get_layer_id_list``);
* ``megatron/core/transformer/transformer_layer.py``: ``get_transformer_layer_offset``;
* ``megatron/core/transformer/transformer_block.py``: ``get_num_layers_to_build``;
* ``megatron/core/pipeline_parallel/utils.py``: ``is_vp_first_stage`` / ``is_vp_last_stage``;
* ``megatron/core/transformer/experimental_attention_variant/dsa.py``: ``is_dsa_skip_topk_layer``,
  ``source_dsa_compute_layer``;
* ``megatron/core/models/gpt/experimental_attention_variant_module_specs.py``:
  ``_validate_dsa_index_share_pipeline_split``, called on each stage's local layer ids as
  ``get_transformer_block_with_experimental_attention_variant_spec`` calls it.

For every generated case isplan accepts (the flags and layout strings of the oracle test's
generator), Megatron's functions must build the same decoder layers on every (rank, virtual
stage), cover 1..N once, and raise the DSA error exactly when isplan reports a shared start. A
case isplan refuses must be refused by these functions or by one of ``validate_args`` /
``TransformerConfig.__post_init__``'s rules, which they do not run (the oracle test holds those).
"""

from __future__ import annotations

import ast
import enum
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from app.core.engines.megatron.check import run_check
from tests.core.engines.test_megatron_oracle import case_input, cases

MEGATRON_REPO = Path(os.environ.get("ISPLAN_MEGATRON_REPO", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
SOURCES = {
    "megatron/core/transformer/enums.py": ["LayerType"],
    "megatron/core/pipeline_parallel/utils.py": ["is_vp_first_stage", "is_vp_last_stage"],
    "megatron/core/transformer/pipeline_parallel_layer_layout.py": ["PipelineParallelLayerLayout"],
    "megatron/core/transformer/transformer_layer.py": ["get_transformer_layer_offset"],
    "megatron/core/transformer/transformer_block.py": ["get_num_layers_to_build"],
    "megatron/core/transformer/experimental_attention_variant/dsa.py": ["is_dsa_skip_topk_layer",
                                                                         "source_dsa_compute_layer"],
    "megatron/core/models/gpt/experimental_attention_variant_module_specs.py": [
        "_validate_dsa_index_share_pipeline_split"],
}


class ParallelState:
    """``megatron.core.parallel_state`` as the functions read it: the rank being built, the VPP size."""

    rank = 0
    vpp: int | None = None

    @classmethod
    def get_pipeline_model_parallel_rank(cls) -> int:
        return cls.rank

    @classmethod
    def get_virtual_pipeline_model_parallel_world_size(cls) -> int | None:
        return cls.vpp


def _definitions(path: str, names: list[str]) -> str:
    """The source text of ``names`` (top-level functions and classes) in ``path`` at :data:`COMMIT`."""
    out = subprocess.run(["git", "--git-dir", str(MEGATRON_REPO), "show", f"{COMMIT}:{path}"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"{path} at {COMMIT[:8]} is not in the snapshot at {MEGATRON_REPO}")
    tree = ast.parse(out.stdout)
    found = {node.name: ast.get_source_segment(out.stdout, node) for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names}
    assert set(found) == set(names), f"{path}: {set(names) - set(found)} not found"
    return "\n\n".join(str(found[n]) for n in names)


@pytest.fixture(scope="module")
def megatron(monkeypatch_module: pytest.MonkeyPatch) -> dict[str, Any]:
    """Megatron's functions, executed in one namespace with what they import."""
    if not MEGATRON_REPO.exists():
        pytest.skip(f"no NVIDIA/Megatron-LM snapshot at {MEGATRON_REPO}")
    import copy
    import logging
    import re
    import typing
    from functools import lru_cache

    ns: dict[str, Any] = {"enum": enum, "re": re, "copy": copy, "logging": logging, "lru_cache": lru_cache,
                          **{name: getattr(typing, name) for name in ("Optional", "List", "Union")},
                          "logger": logging.getLogger(__name__),
                          "safe_get_rank": lambda: 0, "parallel_state": ParallelState, "TransformerConfig": object,
                          "__name__": "megatron_functions"}
    utils = types.ModuleType("megatron.core.pipeline_parallel.utils")  # get_transformer_layer_offset imports it
    for name in ("megatron", "megatron.core", "megatron.core.pipeline_parallel"):
        if name not in sys.modules:
            monkeypatch_module.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch_module.setitem(sys.modules, "megatron.core.pipeline_parallel.utils", utils)
    for path, names in SOURCES.items():
        exec(_definitions(path, names), ns)  # Megatron's own code: the point of this test
        if path.endswith("pipeline_parallel/utils.py"):
            utils.is_vp_first_stage, utils.is_vp_last_stage = ns["is_vp_first_stage"], ns["is_vp_last_stage"]
    return ns


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def megatron_stages(ns: dict[str, Any], c: dict[str, Any], freq: int, offset: int) -> tuple[list, bool]:
    """What Megatron builds for case ``c``: ``[(pp_rank, vp_stage, [layer numbers])]`` in vp-major
    order, and whether every stage's DSA split check passes. Raises what Megatron raises."""
    pp, n = c["pp"], c["n"]
    layout = None
    if c["layout"] is not None:
        layout = ns["PipelineParallelLayerLayout"](c["layout"], pp)
        layout.validate_layer_layout(n, c["mtp"])
        vp = layout.virtual_pipeline_model_parallel_size
    elif c["vpp"] is None and c["lpvs"] is not None:   # validate_args' VPP from LPVS
        vp = ((n + c["emb"] + c["loss"]) // pp) // c["lpvs"]
    else:
        vp = c["vpp"] or 1
    vsize = None if vp == 1 else vp
    config = types.SimpleNamespace(
        num_layers=n, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vsize,
        num_layers_in_first_pipeline_stage=c["first"], num_layers_in_last_pipeline_stage=c["last"],
        account_for_embedding_in_pipeline_split=c["emb"], account_for_loss_in_pipeline_split=c["loss"],
        pipeline_model_parallel_layout=layout, mtp_num_layers=c["mtp"], experimental_attention_variant="dsa",
        dsa_indexer_topk_freq=freq, dsa_indexer_skip_topk_offset=offset)
    ParallelState.vpp = vsize
    built, dsa_ok = [], True
    for v in range(vp):
        for r in range(pp):
            ParallelState.rank = r
            vp_stage = v if vsize is not None else None
            if layout is not None:
                ids = layout.get_layer_id_list(layer_type=ns["LayerType"].decoder, vp_stage=vp_stage, pp_rank=r)
            else:
                first_id = ns["get_transformer_layer_offset"](config, vp_stage=vp_stage, pp_rank=r)
                ids = range(first_id, first_id + ns["get_num_layers_to_build"](config, vp_stage=vp_stage, pp_rank=r))
            try:
                ns["_validate_dsa_index_share_pipeline_split"](config, ids)
            except RuntimeError as exc:
                assert "DSA index-share pipeline split is invalid" in str(exc)
                dsa_ok = False
            built.append((r, v, [i + 1 for i in ids]))
    return built, dsa_ok


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=cases())
def test_isplan_builds_what_megatrons_own_functions_build(megatron, data):
    c, freq, offset = data
    result = run_check(*case_input(c, freq, offset), "megatron")
    if result.plan.errors or not result.plan.stages:
        return   # refused: by these functions or by validate_args / TransformerConfig (the oracle test)
    built, dsa_ok = megatron_stages(megatron, c, freq, offset)
    assert [(s.pp_rank, s.vp_stage, list(s.layers)) for s in result.plan.stages] == built, c
    assert [layer for *_, layers in built for layer in layers] == list(range(1, c["n"] + 1)), c
    assert (not result.boundary.violations) == dsa_ok, (c, freq, offset)


def test_glm52_slime_profile_and_a_shared_start(megatron):
    """By hand: GLM-5.2's 78 layers with its indexer every 4th layer from 3 (freq 4, offset 3: layers
    1, 2, 3, 7, 11, ... compute), first 14 / last 16 over PP 8 start 1, 15, 23, ..., 63 - all computing
    layers. Over PP 2 with first 6 the second stage starts at 7 (computing); with first 13 at 14, which
    reuses layer 11's top-k from the other stage: Megatron raises."""
    base = {"n": 78, "mtp": 0, "pp": 8, "vpp": None, "lpvs": None, "last": 16, "emb": False, "loss": False,
            "layout": None, "overlap": True}
    built, ok = megatron_stages(megatron, {**base, "first": 14}, 4, 3)
    assert [layers[0] for *_, layers in built] == [1, 15, 23, 31, 39, 47, 55, 63] and ok
    built, ok = megatron_stages(megatron, {**base, "first": 6, "last": None, "pp": 2}, 4, 3)
    assert [(layers[0], layers[-1]) for *_, layers in built] == [(1, 6), (7, 78)] and ok
    built, ok = megatron_stages(megatron, {**base, "first": 13, "last": None, "pp": 2}, 4, 3)
    assert [layers[0] for *_, layers in built] == [1, 14] and not ok
