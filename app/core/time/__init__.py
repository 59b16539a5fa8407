"""The step-time model (issue 18): per-layer op costs, communication per parallel dimension, the
pipeline-schedule simulator, and one entry point, :func:`step_time`.

No web imports and no pydantic here: the CLI gate imports this package.
"""

from app.core.time.model import StepTime, step_time
from app.core.time.settings import TimeInputError, TimeSettings

__all__ = ["StepTime", "TimeInputError", "TimeSettings", "step_time"]
