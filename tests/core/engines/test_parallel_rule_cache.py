"""The parallel checks kept by the model and the launch (``parallel.LAUNCH_RULES``) read nothing
else: no launch rule's source names the stage plan, and checking a launch against two different
stage plans, cold and warm, gives the same checks."""

from __future__ import annotations

import ast
import inspect
import textwrap

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

    given = {"name": "world_size", "ok": False, "message": "m", "level": "warning", "warning": True,
             "field": "somewhere", "kind": "other"}
    assert {f.name for f in fields(Check)} == set(given)  # a new field: add a non-default value above
    for name, field, kind in (("world_size", "gpus", "gpus"), ("heads_tp", "tp", "parallel")):
        (placed,) = parallel._placed([Check(**{**given, "name": name})])
        assert {f.name: getattr(placed, f.name) for f in fields(Check)} == {
            **given, "name": name, "field": parallel.CHECK_FIELD.get(name), "kind": kind}
        assert parallel.CHECK_FIELD.get(name) == field
