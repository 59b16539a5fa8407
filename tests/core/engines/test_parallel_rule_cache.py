"""The parallel checks kept by the model and the launch (``parallel.LAUNCH_RULES``) read nothing
else: no launch rule's source names the stage plan, and checking a launch against two different
stage plans, cold and warm, gives the same checks."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from app.core.engines.megatron import parallel
from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_preset
from app.core.model.parallelism import ParallelConfig


def _names(fn: object) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    return {n.id for stmt in body.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def test_a_launch_rule_never_reads_the_stage_plan():
    assert set(parallel.RULES) >= parallel.LAUNCH_RULES
    for rule in parallel.LAUNCH_RULES:
        assert "plan" not in _names(rule), rule.__name__
    # and the rules left out do read it (so the set is not missing a rule by accident)
    for rule in set(parallel.RULES) - parallel.LAUNCH_RULES:
        assert "plan" in _names(rule), rule.__name__


def test_warm_checks_are_the_cold_ones():
    cfg = load_preset("glm-5.2")
    par = ParallelConfig(tp=4, cp=8, pp=8, ep=32, etp=1, sp=True, tokens_per_gpu=8192, recompute="full")
    plans = [materialise(PipelineSpec(split=split), cfg.num_hidden_layers)
             for split in ((14, 8, 8, 8, 8, 8, 8, 16), (14, 9, 7, 8, 8, 8, 8, 16))]
    cold = []
    for plan in plans:
        parallel._RULE_CACHE.clear()
        cold.append(parallel.check_parallel(cfg, par, plan))
    warm = [parallel.check_parallel(cfg, par, plan) for plan in plans + plans]
    assert warm == cold + cold


def test_placing_a_check_keeps_every_field_but_the_two_it_sets():
    """``_placed`` builds each check anew (not ``dataclasses.replace``): a field added to ``Check``
    later must be carried over too, so every field but ``field`` and ``kind`` keeps its value."""
    from dataclasses import fields

    from app.core.model.parallelism import Check

    given: dict[str, Any] = {"name": "world_size", "ok": False, "message": "m", "level": "warning", "warning": True,
             "field": "somewhere", "kind": "other"}
    assert {f.name for f in fields(Check)} == set(given)  # a new field: add a non-default value above
    for name, field, kind in (("world_size", "gpus", "gpus"), ("heads_tp", "tp", "parallel")):
        (placed,) = parallel._placed([Check(**{**given, "name": name})])
        assert {f.name: getattr(placed, f.name) for f in fields(Check)} == {
            **given, "name": name, "field": parallel.CHECK_FIELD.get(name), "kind": kind}
        assert parallel.CHECK_FIELD.get(name) == field


def _reads(fn: object, seen: set[str] | None = None) -> set[str]:
    """What ``fn`` reads of its launch ``par``: every ``par.<name>``, the launch fields named by a
    string in a function that hands ``par`` to ``getattr``, and (recursively) what a function of
    the rule's module that it hands ``par`` to reads."""
    from dataclasses import fields

    seen = set() if seen is None else seen
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names = {f.name for f in fields(ParallelConfig)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "par"):
            continue
        up = parents[node]
        if isinstance(up, ast.Attribute) and up.value is node:
            out.add(up.attr)
            continue
        assert isinstance(up, ast.Call) and isinstance(up.func, ast.Name), ast.dump(up)
        if up.func.id == "getattr":
            out |= {c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and c.value in names}
        elif up.func.id not in seen:
            seen.add(up.func.id)
            out |= _reads(getattr(parallel, up.func.id), seen)
    return out


def test_a_launch_rule_is_kept_by_everything_it_reads_of_the_launch():
    """Each launch rule's listed reads (``LAUNCH_READS``, the key of its kept checks) cover every
    ``par.<name>`` in its source and in the helpers it hands the launch to."""
    plan_rules = {parallel.pipeline_rule, parallel.mtp_cp_rule, parallel.mtp_recompute_rule, parallel.ep_overlap_rule}
    assert frozenset(parallel.RULES) - plan_rules == parallel.LAUNCH_RULES
    for rule, listed in parallel.LAUNCH_READS.items():
        found = _reads(rule)
        assert found, rule.__name__
        assert found <= set(listed), (rule.__name__, sorted(found - set(listed)))
        assert len(set(listed)) == len(listed), rule.__name__


def test_launches_that_agree_on_a_rules_reads_get_the_same_checks():
    """The cache key is enough: over generated launches (every size, recompute, CP, optimizer and
    micro-batch setting varied), two launches that agree on a rule's reads get equal checks from
    the rule itself (uncached) - so a kept answer is never another launch's."""
    import random

    rng = random.Random(20261204)
    cfgs = [load_preset(m) for m in ("glm-5.2", "deepseek-v3", "llama-3.1-70b", "qwen3-235b-a22b")]
    launches = []
    for _ in range(600):
        tp, cp, pp = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4)), rng.choice((1, 2, 4, 8))
        dp = rng.choice((1, 2, 4, 8))
        rc = rng.choice(("none", "selective", "full"))
        off = rng.random() < 0.5
        kw: dict[str, Any] = dict(
            tp=tp, cp=cp, pp=pp, gpus=tp * cp * pp * dp * rng.choice((1, 1, 1, 3)) // rng.choice((1, 1, 2)) or 1,
            dp=rng.choice((None, None, dp)), ep=rng.choice((1, 2, 8, 32, 3)), etp=rng.choice((None, 1, tp)),
            vpp=rng.choice((None, 2, 3)), sp=rng.random() < 0.6, mbs=rng.choice((1, 2)),
            global_batch=rng.choice((None, 64, 96, 1024)), num_microbatches=rng.choice((None, 4, 16)),
            seq_length=rng.choice((None, 4096, 8191, 131072)), tokens_per_gpu=rng.choice((None, 8192)) or 4096,
            recompute=rc, recompute_method=rng.choice((None, "uniform", "block")),
            recompute_num_layers=rng.choice((None, 1, 2)),
            recompute_modules=rng.choice((None, ("core_attn",), ("moe_act", "mla_up_proj"))) if rc == "selective" else None,
            moe_grouped_gemm=rng.random() < 0.5, distribute_saved_activations=rng.random() < 0.3,
            optimizer_cpu_offload=off, use_precision_aware_optimizer=rng.random() < (0.8 if off else 0.3),
            distributed_optimizer=rng.random() < 0.8, exp_avg_dtype=rng.choice(("fp32", "bf16")),
            cp_comm_type=rng.choice(("p2p", "allgather", "a2a", "allgather," * 3 + "p2p")),
            hierarchical_context_parallel_sizes=rng.choice((None, (cp,), (2, 2))),
            max_position_embeddings=rng.choice((None, 4096, 163840)),
            multi_latent_attention=rng.choice((None, True, False)), query_groups=rng.choice((None, 8, 3)))
        launches.append(ParallelConfig(**kw))
    for rule, listed in parallel.LAUNCH_READS.items():
        for cfg in cfgs:
            by_key: dict[object, list] = {}
            for par in launches:
                by_key.setdefault(tuple(getattr(par, n) for n in listed), []).append(rule(cfg, par, None))
            shared = [answers for answers in by_key.values() if len(answers) > 1]
            assert shared, (rule.__name__, "no two launches share a key: the test proves nothing")
            for answers in shared:
                assert all(a == answers[0] for a in answers), (rule.__name__, cfg.id)
