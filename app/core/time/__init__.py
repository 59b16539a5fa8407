"""The step-time model (issue 18): per-layer op costs, communication per parallel dimension, the
pipeline-schedule simulator, and one entry point, :func:`step_time`.

No web imports and no pydantic here. The names below are imported on first use, so that importing
one submodule (the precision table, which the plan's engines read) does not load the whole model:
``isplan check`` runs in launch scripts and must start fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {"StepTime": "app.core.time.model", "step_time": "app.core.time.model",
         "TimeInputError": "app.core.time.settings", "TimeSettings": "app.core.time.settings"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["StepTime", "TimeInputError", "TimeSettings", "step_time"]
