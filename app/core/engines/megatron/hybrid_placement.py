"""Megatron's stage placement for a hybrid model, whose layers ``--hybrid-layer-pattern`` names.

A hybrid model (:mod:`app.core.model.hybrid`) is pipelined by its pattern, not by the GPT flags
(NVIDIA/Megatron-LM @ d98e8a64ddf34856e74b24714e3bedb2f5a39553):

* ``megatron/training/arguments.py:787-862`` (``validate_args``): the pattern gives ``num_layers``;
  ``|`` in it cuts pipeline segments, and then ``--decoder-first/last-pipeline-num-layers`` must not
  be given; ``--num-layers-per-virtual-pipeline-stage``, ``--num-virtual-stages-per-pipeline-rank``,
  ``--pipeline-model-parallel-layout`` and ``--account-for-embedding/loss-in-pipeline-split`` are
  refused outright; the segments must divide by PP and VPP is segments / PP (the interleaved
  schedule's PP rule then applies as for any model);
* ``megatron/core/models/hybrid/hybrid_layer_allocation.py`` ``select_pipeline_segment``: without
  ``|`` and PP > 1 the layers are cut evenly (``num_layers % PP == 0``) or, with first / last, the
  middle ranks share the rest evenly (deprecated: "Please add '|' separators"); with ``|`` segment
  ``vp * PP + rank`` goes to that rank and virtual stage, i.e. isplan's vp-major stage sizes.

isplan's stage sizes (``--split``) are the segments; the flags it writes always use ``|`` when PP > 1
(the form Megatron asks for) and the plain pattern at PP 1. MTP layers are written after ``/`` in
the pattern, one ``*E`` part per depth (``parse_hybrid_pattern``: "Each repeated pattern after the
main decoder represents one MTP prediction depth"), and sit on the last stage, as Megatron builds
the MTP block on the stage that computes the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from app.core.engines.megatron.placement import (
    EMB_FLAG,
    FIRST_FLAG,
    LAST_FLAG,
    LOSS_FLAG,
    LPVS_FLAG,
    PP_FLAG,
    VPP_FLAG,
    _assemble,
    _from_split,
    _refuse_out_of_range,
    _uneven_sizes,
)
from app.core.layout.pipeline_layout import FLAG as LAYOUT_FLAG
from app.core.layout.stages import PipelineSpec, PlanError, StagePlan
from app.core.model.config import HYBRID_MTP_BLOCKS

PATTERN_FLAG = "--hybrid-layer-pattern"
#: the older spelling ``validate_args`` copies into ``--hybrid-layer-pattern`` (arguments.py:744-755)
OLD_PATTERN_FLAG = "--hybrid-override-pattern"
PIPE = "|"

#: Flags ``validate_args`` refuses beside ``--hybrid-layer-pattern`` (arguments.py:813-837), with its words
_REFUSED = (
    (LPVS_FLAG, "--num-layers-per-virtual-pipeline-stage should not be used with --hybrid-layer-pattern. To specify "
                "virtual pipelining, describe a number of pipeline segments in --hybrid-layer-pattern that is a "
                "multiple of --pipeline-model-parallel-size greater than 1"),
    (VPP_FLAG, "--num-virtual-stages-per-pipeline-rank should not be used with --hybrid-layer-pattern. Virtual "
               "pipeline stages are derived from the number of | segments in the pattern"),
    (LAYOUT_FLAG, "--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern. Pipeline stage "
                  "layout is defined by | separators in the pattern"),
    (EMB_FLAG, "--account-for-embedding-in-pipeline-split should not be used with --hybrid-layer-pattern. Pipeline "
               "stage layout is defined by | separators in the pattern"),
    (LOSS_FLAG, "--account-for-loss-in-pipeline-split should not be used with --hybrid-layer-pattern. Pipeline "
                "stage layout is defined by | separators in the pattern"),
)


def _refusals(spec: PipelineSpec) -> list[PlanError]:
    """The GPT pipeline flags a hybrid launch may not carry (module docstring); isplan's own
    ``--vpp`` with stage sizes is the segments' count, not Megatron's VPP flag."""
    given = {LPVS_FLAG: spec.layers_per_vstage is not None, VPP_FLAG: spec.vpp is not None and spec.split is None,
             LAYOUT_FLAG: spec.layout is not None, EMB_FLAG: spec.account_for_embedding,
             LOSS_FLAG: spec.account_for_loss}
    return [PlanError("hybrid_pipeline_flag", f"{words}; give stage sizes instead (isplan writes them as | "
                                              f"segments of {PATTERN_FLAG})", flag)
            for flag, words in _REFUSED if given[flag]]


def materialise_hybrid(spec: PipelineSpec, pattern: str) -> StagePlan:
    """The stages Megatron builds for a hybrid model of ``pattern`` (one symbol per layer):
    explicit sizes as ``|`` segments, else an even or first / last split of the plain pattern
    (module docstring), the MTP layers on the last stage. Rule violations are returned as
    ``errors``; raises :class:`LayoutInputError` for input that is no pipeline at all."""
    n_mtp = spec.mtp_layers or 0
    _refuse_out_of_range(spec, n_mtp)
    n = len(pattern)
    errors = _refusals(spec)
    if spec.split is not None:
        pp, vpp, stages = _from_split(spec, n, n_mtp, errors)
        return StagePlan(pp, vpp, n, n_mtp, stages, tuple(errors), spec)
    pp = spec.pp or 1
    if errors:
        return StagePlan(pp, 1, n, n_mtp, (), tuple(errors), spec)
    if spec.first is not None or spec.last is not None:
        sizes = _uneven_sizes(replace(spec, vpp=None), n, pp, 1, VPP_FLAG, errors)
    elif n % pp:
        errors.append(PlanError("even_divisibility", f"Number of layers ({n}) must be evenly divisible by "
                                f"pipeline-model-parallel-size ({pp}) when no pipe separators are specified in the "
                                f"pattern; give stage sizes (| segments) or {FIRST_FLAG} / {LAST_FLAG}", PP_FLAG))
        sizes = None
    else:
        sizes = [n // pp] * pp
    stages = () if sizes is None else _assemble(pp, 1, sizes, n_mtp)
    return StagePlan(pp, 1, n, n_mtp, stages, tuple(errors), spec)


def segmented(pattern: str, sizes: list[int]) -> str:
    """``pattern`` cut into ``|`` segments of ``sizes`` layers (vp-major: segment ``vp * PP + rank``)."""
    out, at = [], 0
    for size in sizes:
        out.append(pattern[at:at + size])
        at += size
    return PIPE.join(out)


def hybrid_flags(plan: StagePlan, pattern: str) -> tuple[list[str], str]:
    """The Megatron arguments for ``plan`` and its pattern as written: ``|`` segments when PP > 1
    or VPP > 1 (Megatron deprecates the plain pattern with PP > 1), else the plain pattern; one
    ``/*E`` per MTP layer."""
    written = segmented(pattern, list(plan.sizes)) if len(plan.stages) > 1 else pattern
    written += f"/{HYBRID_MTP_BLOCKS}" * plan.mtp_layers
    return [PP_FLAG, str(plan.pp), PATTERN_FLAG, written], written


def read_pattern_flag(values: Mapping[str, str], at: Callable[[str], str], pp: int, has_first_last: bool,
                      cfg_pattern: str | None) -> tuple[dict[str, Any], list[PlanError]]:
    """A launch script's ``--hybrid-layer-pattern`` (or ``--hybrid-override-pattern``): the plan
    fields it sets - stage sizes and their VPP from ``|`` segments, MTP layers from ``/`` parts
    - and its refusals: a pattern other than the model's or MTP parts other than ``*E`` (``model``
    errors), segments that do not divide by PP (arguments.py:848-853) and
    first / last flags beside segments (arguments.py:803-812). ``{}`` without the flag."""
    flag = next((f for f in (PATTERN_FLAG, OLD_PATTERN_FLAG) if f in values), None)
    if flag is None:
        return {}, []
    main, *mtp = values[flag].split("/")
    symbols, where = main.replace(PIPE, ""), at(flag)
    errors: list[PlanError] = []
    if cfg_pattern is None:
        errors.append(PlanError("launcher_model_mismatch", f"{where}: {flag} in the script builds a hybrid model, but "
                                "the model's config is not one (no Mamba / single-module layers)", flag, kind="model"))
    elif symbols != cfg_pattern:
        first = next((i for i, (a, b) in enumerate(zip(symbols, cfg_pattern)) if a != b), min(len(symbols),
                                                                                               len(cfg_pattern)))
        errors.append(PlanError("launcher_model_mismatch", f"{where}: {flag} in the script ({len(symbols)} layers) "
                                f"differs from the model's pattern ({len(cfg_pattern)} layers) from layer {first + 1} "
                                "on", flag, kind="model"))
    if any(part != HYBRID_MTP_BLOCKS for part in mtp):
        errors.append(PlanError("launcher_model_mismatch", f"{where}: {flag}'s MTP parts {'/'.join(mtp)!r} are not "
                                f"the MTP layer isplan models ({HYBRID_MTP_BLOCKS!r}: an attention and an MoE block "
                                "per depth)", flag, kind="model"))
    fields: dict[str, Any] = {"mtp_layers": len(mtp)} if mtp else {}
    if PIPE not in main:
        return fields, errors
    sizes = tuple(len(seg) for seg in main.split(PIPE))
    if len(sizes) % pp:
        errors.append(PlanError("hybrid_segments", f"{where}: The number of hybrid pipeline segments described by "
                                f"--hybrid-layer-pattern must be evenly divisible by --pipeline-model-parallel-size. "
                                f"Got {len(sizes)} segments and {pp} pipeline parallel size.", PP_FLAG))
        return fields, errors
    if has_first_last:
        errors.append(PlanError("hybrid_pipeline_flag", f"{where}: If --hybrid-layer-pattern contains pipe separators, "
                                f"{FIRST_FLAG} / {LAST_FLAG} should not be specified as the pipeline layout is "
                                "explicitly defined", FIRST_FLAG))
    vpp = len(sizes) // pp
    return {**fields, "mode": "split", "split": sizes, "vpp": vpp if vpp > 1 else None}, errors
