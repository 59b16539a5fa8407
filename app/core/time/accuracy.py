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


@lru_cache(maxsize=1)
def accuracy_table() -> dict[str, Any]:
    """The shipped validation (``app/core/data/steptime_accuracy.json``)."""
    table: dict[str, Any] = json.loads((files("app.core.data") / "steptime_accuracy.json").read_text())
    return table


def accuracy_for(generation: str, precision: str, model: str | None = None,
                 config_sha256: str | None = None) -> dict[str, Any] | None:
    """:func:`_accuracy_for` (kept: every evaluation asks), as a fresh dict."""
    found = _accuracy_for(generation, precision, validated_name(model, config_sha256))
    return None if found is None else dict(found)


def validated_name(model: str | None, config_sha256: str | None = None) -> str | None:
    """The name the shipped table gives the plan's model: the validated config with the same content
    (``config_sha256``, the canonical SHA-256 of its JSON: a preset or an uploaded / local copy under
    any name), else ``model`` as given (a preset id or a config path: its file name without ``.json``
    / ``.gpt2.json``)."""
    named = {sha: name for name, sha in accuracy_table().get("configs", {}).items()}
    if config_sha256 in named:
        return named[config_sha256]
    if model is None:
        return None
    return model.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".json").removesuffix(".gpt2")


@lru_cache(maxsize=256)
def _accuracy_for(generation: str, precision: str, model: str | None) -> dict[str, Any] | None:
    """The held-out error that applies to a plan of ``model`` (a name of :func:`validated_name`) on a
    GPU of ``generation`` in ``precision``: ``{runs, mean_abs_error, p90_abs_error, mean_error, scope,
    validated_here, this_model, text, short, source}`` of the narrowest group with :data:`MIN_RUNS`
    runs (module docstring; its models are named in ``text``, their errors are in the shipped table);
    None without any. ``validated_here``: whether any run was on the plan's generation;
    ``this_model``: the error of the group's runs of ``model`` (its name compared without case), if any."""
    table = accuracy_table()
    gen, prec = GENERATION_LABELS.get(generation, generation), precision.upper()   # bf16 -> BF16, mxfp8 -> MXFP8
    for key, scope in ((f"{generation}/{precision}", f"{gen} GPUs in {prec}"), (generation, f"{gen} GPUs"),
                       ("all", "every GPU and precision checked")):
        group = table["groups"].get(key)
        if group and group["runs"] >= MIN_RUNS:
            mine = next((stats for name, stats in group["models"].items()
                         if model is not None and name.casefold() == model.casefold()), None)
            text = " ".join(part for part in (_sentence(group, scope), _model_clause(mine, model)) if part)
            if key == "all" and generation not in table["groups"]:
                text = (f"No published run on {gen} GPUs checks the time model (its constants there are stated, "
                        f"not measured). {text}")
            stats = {k: v for k, v in group.items() if k != "models"}   # the text names them: every answer carries it
            return {**stats, "scope": scope, "validated_here": key != "all" or generation in table["groups"],
                    "this_model": mine, "text": text, "short": f"typically off by {group['mean_abs_error']:.0%}",
                    "source": table["source"]}
    return None


def _lean(bias: float) -> str:
    return f"on average {abs(bias):.0%} {'fast' if bias > 0 else 'slow'}" if abs(bias) >= 0.005 else "no lean"


def _sentence(group: dict[str, Any], scope: str) -> str:
    """How many runs, of which models (the most runs first), their mean and 90th-percentile error
    and the mean lean."""
    models = sorted(group["models"].items(), key=lambda kv: (-kv[1]["runs"], kv[0]))
    named = ", ".join(f"{name} ×{stats['runs']}" for name, stats in models[:6])
    if len(models) > 6:
        named += f" and {len(models) - 6} more"
    return (f"Against {group['runs']} published runs on {scope} ({named}), through the same flags, the time model's "
            f"tokens/s/GPU is off by {group['mean_abs_error']:.0%} on average and by at most "
            f"{group['p90_abs_error']:.0%} for 9 runs in 10, {_lean(group['mean_error'])}.")


def _model_clause(mine: dict[str, Any] | None, model: str | None) -> str:
    """What the runs say of the plan's own model: its runs' error, or that none is of it."""
    if mine is None:
        return "None of them is this model." if model is not None else ""
    return (f"This model's {mine['runs']} run{'s' if mine['runs'] > 1 else ''} there: off by "
            f"{mine['mean_abs_error']:.0%} on average, {_lean(mine['mean_error'])}.")
