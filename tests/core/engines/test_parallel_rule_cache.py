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
