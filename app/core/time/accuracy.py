"""How far to trust a step time: the time model's error against published measured runs.

``python -m bench steptime`` predicts every held-out published run (Megatron-Bridge's performance
tables, Megatron-Core's and NeMo's, the papers of ``docs/MODELS.md``) through exactly the flags
issue 18 judges and writes the error of tokens/s/GPU by GPU generation and precision to
``app/core/data/steptime_accuracy.json`` (``bench.steptime.accuracy_table``; a test holds the file to
what the model predicts now). :func:`accuracy_for` picks the narrowest group with at least
:data:`MIN_RUNS` runs - the plan's generation and precision, else its generation, else every run -
and says it in one sentence, which ``isplan time`` and the page show beside the step time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.resources import files
from typing import Any

#: Fewer runs than this say little about a group: the next wider group is quoted instead.
MIN_RUNS = 5

GENERATION_LABELS = {"ampere": "Ampere", "hopper": "Hopper", "blackwell": "Blackwell",
                     "blackwell_ultra": "Blackwell Ultra", "cdna3": "CDNA 3"}
PRECISION_LABELS = {"bf16": "BF16", "fp8": "FP8", "mxfp8": "MXFP8", "nvfp4": "NVFP4"}


@lru_cache(maxsize=1)
def accuracy_table() -> dict[str, Any]:
    """The shipped validation (``app/core/data/steptime_accuracy.json``)."""
    table: dict[str, Any] = json.loads((files("app.core.data") / "steptime_accuracy.json").read_text())
    return table


def accuracy_for(generation: str, precision: str) -> dict[str, Any] | None:
    """The held-out error that applies to a plan on a GPU of ``generation`` in ``precision``:
    ``{runs, mean_abs_error, p90_abs_error, mean_error, models, scope, validated_here, text, short,
    source}`` of the narrowest group with :data:`MIN_RUNS` runs (module docstring); None without any.
    ``validated_here``: whether any run was on the plan's generation."""
    table = accuracy_table()
    gen, prec = GENERATION_LABELS.get(generation, generation), PRECISION_LABELS.get(precision, precision)
    for key, scope in ((f"{generation}/{precision}", f"{gen} GPUs in {prec}"), (generation, f"{gen} GPUs"),
                       ("all", "every GPU and precision checked")):
        group = table["groups"].get(key)
        if group and group["runs"] >= MIN_RUNS:
            text = _sentence(group, scope)
            if key == "all" and generation not in table["groups"]:
                text = (f"No published run on {gen} GPUs checks this model (its constants there are stated, not "
                        f"measured). {text}")
            return {**group, "scope": scope, "validated_here": key != "all" or generation in table["groups"],
                    "text": text, "short": f"typically off by {group['mean_abs_error']:.0%}", "source": table["source"]}
    return None


def _sentence(group: dict[str, Any], scope: str) -> str:
    """One sentence: how many runs, their mean and 90th-percentile error, the mean bias, the models."""
    bias = group["mean_error"]
    lean = (f"on average {abs(bias):.0%} {'fast' if bias > 0 else 'slow'}" if abs(bias) >= 0.005
            else "with no lean either way")
    models = group["models"]
    named = ", ".join(models[:6]) + (f" and {len(models) - 6} more" if len(models) > 6 else "")
    return (f"Against {group['runs']} published runs on {scope} ({named}), through the same flags, this model's "
            f"tokens/s/GPU is off by {group['mean_abs_error']:.0%} on average and by at most "
            f"{group['p90_abs_error']:.0%} for 9 runs in 10, {lean}.")
