"""Training precision: which tensor rate the GEMMs run at and the Megatron flags that say so.

``bf16``, ``fp8``, ``mxfp8``, ``nvfp4``: the linear layers (GEMMs, forward, dgrad and wgrad) run
in that precision through Transformer Engine; attention (the flash-attention core), norms,
activations, softmax, the router and the optimizer stay in BF16 / FP32 (isplan does not model
``--fp8-dot-product-attention``). Parameters are BF16 with FP32 master weights in every case.

Flag names and choices are NVIDIA/Megatron-LM's at commit d98e8a64ddf3
(``megatron/core/transformer/transformer_config.py``: ``fp8`` is exported as ``--fp8-format``
with choices ``e4m3`` / ``hybrid``, ``fp8_recipe`` ``tensorwise | delayed | mxfp8 | blockwise |
custom`` (default ``delayed``), ``fp4`` as ``--fp4-format`` ``e2m1``, ``fp4_recipe`` ``nvfp4``;
``megatron/training/arguments.py``: ``--bf16``, ``--fp8-param-gather``, ``--fp4-param-gather``
must come with ``--fp4-format``). The pairing of recipe and format follows Megatron-Bridge's
mixed-precision presets (NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/training/mixed_precision.py``
@ 067f987d): ``fp8`` = ``bf16_with_fp8_current_scaling_mixed`` (``hybrid`` + ``tensorwise`` with ``fp8_param_gather``, the
tables' "FP8" / "FP8-CS"), ``mxfp8`` = ``bf16_with_mxfp8_mixed`` (``e4m3`` + ``mxfp8`` with
``fp8_param_gather``), ``nvfp4`` = ``bf16_with_nvfp4_mixed`` (``e2m1`` + ``nvfp4`` with
``fp4_param_gather``); all three keep ``grad_reduce_in_fp32`` from ``bf16_mixed``.

``quant_bytes`` is the extra HBM traffic of casting one BF16 activation element into the GEMM
format (read 2 B, write the low-precision copy and, for the backward pass, a transposed copy; block
scales for MXFP8 / NVFP4): the quantisation kernels the time model charges as memory-bound work
(:mod:`app.core.time.ops`). ``param_gather_bytes`` is what one parameter costs in the distributed
optimizer's all-gather.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Precision:
    name: str
    gemm_dtype: str  # the tensor rate the GEMMs run at: bf16 | fp8 | fp4 (Hardware.peak_flops)
    gemm_bytes: float  # bytes per GEMM input element (with block scales)
    quant_bytes: float  # HBM bytes per activation element to quantise it for a GEMM (0 for BF16)
    param_gather_bytes: float  # bytes per parameter in the distributed optimizer's all-gather
    megatron_flags: tuple[str, ...]
    megatron_bridge_preset: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "gemm_dtype": self.gemm_dtype, "megatron_flags": list(self.megatron_flags),
                "megatron_bridge_preset": self.megatron_bridge_preset}


#: MXFP8: one E8M0 scale per 32 elements (1/32 B each), row- and column-wise copies; NVFP4: 4-bit
#: values with one FP8 scale per 16 (0.5 + 1/16 B), row- and column-wise copies
#: (Transformer Engine's MXFP8BlockScaling / NVFP4BlockScaling recipes).
_PRECISIONS: dict[str, Precision] = {
    "bf16": Precision("bf16", "bf16", 2.0, 0.0, 2.0, ("--bf16",), "bf16_mixed"),
    "fp8": Precision("fp8", "fp8", 1.0, 2.0 + 1.0 + 1.0, 1.0,
                     ("--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"),
                     "bf16_with_fp8_current_scaling_mixed"),
    "mxfp8": Precision("mxfp8", "fp8", 1.0 + 1 / 32, 2.0 + 2 * (1.0 + 1 / 32), 1.0 + 1 / 32,
                       ("--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--fp8-param-gather"),
                       "bf16_with_mxfp8_mixed"),
    "nvfp4": Precision("nvfp4", "fp4", 0.5 + 1 / 16, 2.0 + 2 * (0.5 + 1 / 16), 0.5 + 1 / 16,
                       ("--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--fp4-param-gather"),
                       "bf16_with_nvfp4_mixed"),
}


def get_precision(name: str) -> Precision:
    key = (name or "").strip().lower()
    if key not in _PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; use one of {', '.join(PRECISIONS)}")
    return _PRECISIONS[key]


#: the recipe Megatron uses when a launch names a format without one
#: (``megatron/core/transformer/transformer_config.py`` @ d98e8a64: ``fp8_recipe`` "delayed" line 594,
#: ``fp4_recipe`` "nvfp4" line 679)
RECIPE_DEFAULTS = {"--fp8-recipe": "delayed", "--fp4-recipe": "nvfp4"}
#: every flag a precision preset is written with (the launcher import reads them as one setting)
PRECISION_FLAGS = frozenset({"--bf16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--fp4-format",
                             "--fp4-recipe", "--fp4-param-gather"})


def precision_of_flags(values: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The precision whose Megatron flags a launch gives (``values``: flag -> value, the last of
    each), the inverse of :func:`megatron_flags`: ``--fp8-format hybrid --fp8-recipe tensorwise`` is
    ``fp8``, ``e4m3`` / ``mxfp8`` is ``mxfp8``, ``--fp4-format e2m1`` (recipe nvfp4) is ``nvfp4``; no
    format flag is ``(None, None)`` (BF16, or whatever the plan says). A format / recipe pair isplan
    has no time model for (``delayed``, ``blockwise`` ...) is ``(None, why)``."""
    for fmt, recipe in (("--fp4-format", "--fp4-recipe"), ("--fp8-format", "--fp8-recipe")):
        if fmt not in values:
            continue
        pair = (values[fmt], values.get(recipe, RECIPE_DEFAULTS[recipe]))
        for p in _PRECISIONS.values():
            flags = p.megatron_flags
            if fmt in flags and (flags[flags.index(fmt) + 1], flags[flags.index(recipe) + 1]) == pair:
                return p.name, None
        given = f"{fmt} {pair[0]} with {recipe} {pair[1]}" + ("" if recipe in values else " (Megatron's default)")
        return None, (f"{given} is not one of isplan's precisions (fp8 = hybrid / tensorwise, mxfp8 = e4m3 / mxfp8, "
                      "nvfp4 = e2m1 / nvfp4): the plan keeps its precision")
    return None, None


def megatron_flags(name: str, *, distributed_optimizer: bool = True) -> list[str]:
    """The Megatron-LM arguments that select precision ``name`` (for the launcher export). The
    ``--fp8-param-gather`` / ``--fp4-param-gather`` flags are left out without the distributed
    optimizer (``validate_args``: "--fp8-param-gather only supported with distributed optimizer");
    the time model then gathers nothing (no distributed optimizer, no parameter all-gather)."""
    flags = list(get_precision(name).megatron_flags)
    if not distributed_optimizer:
        flags = [f for f in flags if not f.endswith("-param-gather")]
    return flags
