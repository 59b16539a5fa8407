"""Engines beside Megatron / slime / HF: vLLM and SGLang (serving) and MaxText (training).

Each engine's layer-placement rule, read from its own source, turned into the planner's
:class:`app.core.layout.stages.StagePlan` so :func:`app.core.layout.boundary.validate_boundaries` applies unchanged.
"""
