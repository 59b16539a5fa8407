"""The caches behind one evaluation (a pipeline rank's memory by its contents, a layer kind's FLOPs
by the micro-batch shape, the time model's layer costs, stage layer sums, parameters and DP terms, a
layout check by its inputs) never change an answer: every plan of a generated drag session
evaluates to exactly what it evaluates to with every cache emptied first (differential: warm
against cold, the whole page JSON)."""

from __future__ import annotations

import json
from itertools import accumulate, pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import QueryParams

from app.core.engines import ignored_fields
from app.core.engines.megatron import check as megatron_check
from app.core.engines.megatron import parallel as megatron_parallel
from app.core.model import flops, memory, parameters
from app.core.model.config import load_preset
from app.core.plan import strict_plan
from app.core.time import model as time_model
from app.web.view import page_data

BASE = "model=glm-5.2&mode=split&tp=4&cp=8&ep=32&etp=1&sp=1&tpg=8192"


def _empty_caches() -> None:
    for cache in (memory._RANK_CACHE, flops._KIND_TERMS, time_model._LAYER_CACHE,
                  time_model._DP_CACHE, memory._MEGATRON_CACHE, megatron_parallel._RULE_CACHE, flops._STAGE_TERMS,
                  parameters._STAGE_PARAMS):
        cache.clear()
    megatron_check._plain_check.cache_clear()


@st.composite
def _sizes(draw: st.DrawFn) -> str:
    """Stage sizes of 2-8 stages over GLM-5.2's 78 layers."""
    n = draw(st.sampled_from([2, 4, 6, 8]))
    cuts = sorted(draw(st.sets(st.integers(1, 77), min_size=n - 1, max_size=n - 1)))
    bounds = [0, *cuts, 78]
    return ",".join(str(b - a) for a, b in pairwise(bounds))


_queries = st.builds(
    lambda split, recompute, offload, mbs, mtp: (f"{BASE}&split={split}&recompute={recompute}&offload={offload}&mbs={mbs}"
                                                 f"&mtp_layers={mtp}"),
    _sizes(), st.sampled_from(["full", "selective", "none", "full&recompute_method=block&recompute_num_layers=2"]),
    st.sampled_from(["0", "1"]), st.sampled_from(["1", "2"]), st.sampled_from(["0", "1"]))


def _answer(query: str) -> str:
    plan = strict_plan(QueryParams(query), ignored=ignored_fields)
    return json.dumps(page_data(plan, load_preset(plan.model)), sort_keys=True, default=str)


def _warm_equals_cold(session: list[str]) -> None:
    _empty_caches()
    warm = [_answer(q) for q in session + session]  # the second pass is served from the caches
    for i, q in enumerate(session + session):
        _empty_caches()
        assert _answer(q) == warm[i], q


@settings(max_examples=25, deadline=None)
@given(st.lists(_queries, min_size=2, max_size=6))
def test_a_warm_evaluation_is_the_cold_one(session):
    _warm_equals_cold(session)


@settings(max_examples=15, deadline=None)
@given(_sizes(), st.lists(st.tuples(st.integers(0, 6), st.sampled_from([-1, 1])), min_size=1, max_size=8))
def test_a_drag_session_warm_is_cold(start, moves):
    """One boundary moved by one layer at a time, as the page's drag does (most ranks unchanged)."""
    sizes, session = [int(x) for x in start.split(",")], []
    for k, step in moves:
        k %= len(sizes) - 1
        if sizes[k] + step >= 1 and sizes[k + 1] - step >= 1:
            sizes[k], sizes[k + 1] = sizes[k] + step, sizes[k + 1] - step
        session.append(f"{BASE}&split={','.join(map(str, sizes))}&recompute=full&offload=1")
    _warm_equals_cold(session)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["glm-5.2", "deepseek-v3.2", "qwen3-235b-a22b"]), _sizes(),
                          st.integers(0, 2), st.sampled_from([(1, 1, None), (4, 8, 1), (2, 32, None), (8, 16, 2)])),
                min_size=4, max_size=12))
def test_a_stages_parameters_from_the_cache_are_its_own(plans):
    """``stage_params`` is kept by the config, TP / EP / ETP, each stage's ends and MTP layers and
    its layers' kinds: every stage of a session of plans (other models, sizes, MTP layers, shardings;
    the page's stage table asks one stage at a time, memory a rank's stages together) gets what an
    uncached count of the same stages gives."""
    from app.core.engines.megatron.placement import materialise
    from app.core.layout.stages import PipelineSpec
    from app.core.model.roles import derive_roles

    parameters._STAGE_PARAMS.clear()
    for model, split, mtp, (tp, ep, etp) in plans:
        cfg = load_preset(model)
        cuts = [0, *accumulate(int(x) for x in split.split(","))]   # the same cuts, scaled to this model
        bounds = sorted({round(c * cfg.num_hidden_layers / 78) for c in cuts})
        sizes = [b - a for a, b in pairwise(bounds)]
        roles, plan = derive_roles(cfg), materialise(PipelineSpec(split=sizes), cfg.num_hidden_layers, default_mtp=mtp)
        for group in [[s] for s in plan.stages] + [plan.rank_stages(r) for r in range(plan.pp)]:
            got = parameters.stage_params(cfg, roles, group, tp=tp, ep=ep, etp=etp)
            assert got == parameters._stage_params(cfg, roles, group, tp, ep, etp), (model, split, mtp, tp, ep, etp)


def test_equal_layer_kinds_at_another_place_cost_the_same():
    """A stage's layer sums are cached by its layers' kinds in order (the time model), so two
    stages of the same kinds at different places share an entry - and block recompute, which
    re-runs the first layers of each stage, still recomputes the right ones in each."""
    _warm_equals_cold([f"{BASE}&split=14,8,8,8,8,8,8,16&recompute=full&recompute_method=block&recompute_num_layers=3",
                       f"{BASE}&split=8,14,8,8,8,8,8,16&recompute=full&recompute_method=block&recompute_num_layers=3",
                       f"{BASE}&split=8,14,8,8,8,8,8,16&recompute=full&recompute_method=block&recompute_num_layers=5"])


def test_the_same_span_on_another_rank_is_another_entry():
    """Layers 15-22 are stage 2 (pp rank 1) of the first plan and stage 3 (pp rank 2) of the
    second: a rank keeps a different number of micro-batches in flight, so neither answer may be
    served from the other's entry."""
    _warm_equals_cold([f"{BASE}&split=14,8,8,8,8,8,8,16&recompute=full", f"{BASE}&split=7,7,8,8,8,8,8,24&recompute=full"])


def test_a_rank_is_served_from_the_cache_when_a_move_leaves_it_alone():
    """Moving the boundary between stages 2 and 3 changes ranks 1 and 2 only: the other six
    ranks' entries come from the cache (and a repeat of the first plan adds nothing)."""
    _empty_caches()
    _answer(f"{BASE}&split=14,8,8,8,8,8,8,16&recompute=full&offload=1")
    assert len(memory._RANK_CACHE) == 8
    _answer(f"{BASE}&split=14,9,7,8,8,8,8,16&recompute=full&offload=1")
    assert len(memory._RANK_CACHE) == 10
    _answer(f"{BASE}&split=14,8,8,8,8,8,8,16&recompute=full&offload=1")
    assert len(memory._RANK_CACHE) == 10


def test_a_configs_hash_is_its_contents_in_every_process():
    """ModelConfig hashes once and keeps it (it is in most cache keys), but never ships the hash:
    in another process (a pool worker, other string hashes) an unpickled config hashes and compares
    like the same config loaded there, and a changed field changes the hash."""
    import dataclasses
    import pickle
    import subprocess
    import sys

    cfg = load_preset("glm-5.2")
    assert hash(cfg) == hash(dataclasses.replace(cfg)) and dataclasses.replace(cfg) == cfg
    assert hash(dataclasses.replace(cfg, index_topk=cfg.index_topk + 1)) != hash(cfg)
    code = ("import pickle, sys; from app.core.model.config import load_preset; c = pickle.loads(sys.stdin.buffer.read()); "
            "f = load_preset('glm-5.2'); print(c == f, hash(c) == hash(f), {f: 1}.get(c))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((hash(cfg), cfg)[1]), capture_output=True,
                         check=True, env={"PYTHONHASHSEED": "random", "PATH": ""}, cwd=str(Path(__file__).parents[3]))
    assert out.stdout.split() == [b"True", b"True", b"1"]


def test_a_launch_hashes_and_reads_as_its_fields():
    """ParallelConfig hashes once and builds its dict once: equal launches hash alike, a changed
    field changes both, and the dict a caller gets is its own (changing it changes no later one)."""
    import dataclasses

    from app.core.model.parallelism import ParallelConfig

    par = ParallelConfig(tp=4, pp=8, ep=8, dp=2, seq_length=4096, global_batch=64)
    assert hash(par) == hash(dataclasses.replace(par)) and hash(par) != hash(dataclasses.replace(par, ep=4))
    first = par.to_dict()
    first["tp"], first["expert_grid"]["ep"] = 99, 99
    again = par.to_dict()
    assert again["tp"] == 4 and again["expert_grid"]["ep"] == 8 and again["dp"] == 2 and again["gpus"] == 64
    assert dataclasses.replace(par, ep=4).to_dict()["expert_grid"]["ep"] == 4


def test_a_role_map_hashes_once_as_its_fields_do():
    """A role map keeps its hash (:func:`app.core.content_cache.hash_once`): the hash of its compared
    fields, as the dataclass's own would be; equal maps hash alike; a pickled copy (a worker's)
    hashes again rather than carrying the kept value across processes."""
    import pickle
    from dataclasses import fields, replace

    from app.core.engines import engine_for
    from app.core.model.roles import RoleMap, derive_roles

    roles = derive_roles(load_preset("glm-5.2"), engine_for("slime").role_rule)
    assert hash(roles) == hash(tuple(getattr(roles, f.name) for f in fields(RoleMap)))
    twin = replace(roles)
    assert twin is not roles and twin == roles and hash(twin) == hash(roles)
    other = replace(roles, notes=(*roles.notes, "another note"))
    assert other != roles and hash(other) == hash(tuple(getattr(other, f.name) for f in fields(RoleMap)))
    copy = pickle.loads(pickle.dumps(roles))
    assert "_hash" not in copy.__dict__ and copy == roles and hash(copy) == hash(roles)
