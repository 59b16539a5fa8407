"""The training consumer: a read launcher -> what it says about the pipeline and the model
(:func:`launcher_request`), the GPU count (:func:`launcher_gpus`), and every model flag that
disagrees with the config (:func:`model_disagreements`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.launcher.results import LauncherParse
from app.core.launcher.text import where
from app.core.layout.stages import PipelineSpec, PlanError

#: slime ``--actor-num-nodes`` x ``--actor-num-gpus-per-node`` (THUDM/slime ``slime/utils/arguments.py``
#: at 624b824a lines 39-41), torchrun ``--nnodes`` x ``--nproc-per-node``
_NODES = ("--actor-num-nodes", "--nnodes")
_PER_NODE = ("--actor-num-gpus-per-node", "--nproc-per-node", "--num-gpus-per-node")


def launcher_gpus(parsed: LauncherParse) -> int | None:
    """Nodes x GPUs per node, when both are given as integers."""
    def first(flags: tuple[str, ...]) -> int | None:
        for flag in flags:
            try:
                value = parsed.int_value(flag)
            except ValueError:
                return None
            if value is not None:
                return value
        return None

    nodes, per = first(_NODES), first(_PER_NODE)
    return nodes * per if nodes and per else None



#: Flags without which (or with an unresolved value of which) the stages cannot be materialised.
PIPELINE_FLAGS = (
    "--num-layers", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--pipeline-model-parallel-layout", "--mtp-num-layers", "--dsa-indexer-topk-freq",
    "--dsa-indexer-skip-topk-offset", "--hybrid-layer-pattern", "--hybrid-override-pattern",
)


#: Launcher flag -> the config field it must equal (Megatron's names for the HF config's fields).
MODEL_FLAGS = (
    ("--num-layers", "num_hidden_layers"), ("--hidden-size", "hidden_size"),
    ("--num-attention-heads", "num_attention_heads"), ("--num-experts", "n_routed_experts"),
    ("--moe-ffn-hidden-size", "moe_intermediate_size"), ("--dsa-indexer-topk-freq", "index_topk_freq"),
    ("--dsa-indexer-skip-topk-offset", "index_skip_topk_offset"),
)


def model_disagreements(parsed: LauncherParse, cfg: Any, num: Callable[[str], int | None]) -> list[PlanError]:
    """Every model flag of the launcher that differs from MODEL's config, as a ``model`` error naming
    file:line and both values. DSA freq/offset are compared only when the config states them;
    ``--mtp-num-layers`` may be lower than the config's MTP layers (a plan may train without MTP),
    not higher (the checkpoint has no weights for the extra ones)."""
    errors: list[PlanError] = []
    for flag, attr in MODEL_FLAGS:
        value, expected = num(flag), getattr(cfg, attr, None)
        if value is None or expected is None or value == expected:
            continue
        errors.append(PlanError("launcher_model_mismatch" if flag != "--num-layers" else "num_layers_mismatch",
                                f"{parsed.at(flag)}: {flag} {value} in the script does not match "
                                f"the model's {attr} {expected}", flag, kind="model"))
    mtp = num("--mtp-num-layers")
    if mtp is not None and mtp > cfg.num_nextn_predict_layers:
        errors.append(PlanError("launcher_model_mismatch",
                                f"{parsed.at('--mtp-num-layers')}: --mtp-num-layers {mtp} in the "
                                f"script exceeds the model's num_nextn_predict_layers "
                                f"{cfg.num_nextn_predict_layers} (no weights for the extra MTP layers)",
                                "--mtp-num-layers", kind="model"))
    return errors


@dataclass(frozen=True)
class LauncherRequest:
    """What a launcher script says about the pipeline, ready for :func:`app.core.engines.megatron.check.run_check`."""

    spec: PipelineSpec
    freq: int | None
    offset: int | None
    unresolved: tuple[str, ...]  # pipeline flags that could not be resolved: the check cannot run
    warnings: tuple[str, ...]
    errors: tuple[PlanError, ...]
    report: dict


class _FlagReader:
    """Integer flags of a parsed launcher; a value that is not an integer joins ``unresolved``
    (each read of it, in read order) and reads as absent."""

    def __init__(self, parsed: LauncherParse, unresolved: tuple[str, ...]):
        self.parsed = parsed
        self.unresolved = unresolved

    def num(self, flag: str) -> int | None:
        try:
            return self.parsed.int_value(flag)
        except ValueError as exc:
            self.unresolved = self.unresolved + (str(exc),)
            return None


def _unresolved_flags(parsed: LauncherParse) -> tuple[tuple[str, ...], list[str]]:
    """(pipeline flags whose value could not be resolved: the check cannot run; warnings for the
    other unresolved flags, after the reader's own), each naming its file:line."""
    unresolved = tuple(
        f"{u.flag} ({where(u.file, u.line)}): {u.reason}" for u in parsed.unresolved
        if u.flag in PIPELINE_FLAGS and u.flag not in parsed.values
    )
    warnings = list(parsed.warnings)
    warnings += [f"{u.flag} ({where(u.file, u.line)}) is unresolved: {u.reason}" for u in parsed.unresolved
                 if u.flag not in PIPELINE_FLAGS and u.flag not in parsed.values]
    return unresolved, warnings


def _spelling_warnings(parsed: LauncherParse) -> list[str]:
    """Flags Megatron's parser would stop on: ``--overlap-p2p-communication`` (overlap is on by
    default; the switch is ``--no-overlap-p2p-communication``, megatron/training/arguments.py) and
    the old ``--virtual-pipeline-model-parallel-size``."""
    out = []
    if "--overlap-p2p-communication" in parsed.switches:
        out.append("--overlap-p2p-communication is not a Megatron option (its parser would stop on it): p2p "
                   "overlap is on by default and the switch is --no-overlap-p2p-communication "
                   "(megatron/training/arguments.py); drop it")
    if "--virtual-pipeline-model-parallel-size" in parsed.values:
        out.append("--virtual-pipeline-model-parallel-size is not a Megatron option any more (its parser would "
                   "stop on it); it is read here as --num-virtual-stages-per-pipeline-rank, use that name")
    return out


def _launcher_record(parsed: LauncherParse) -> dict[str, Any]:
    """What was read, for the page and the CLI: every value with the file and line that set it,
    the files, the trainer's line, the switches, the unresolved flags and the reader's warnings."""
    return {
        "values": parsed.provenance(),  # {flag: {value, file, line}}: every value read, with where it was set
        "files": list(parsed.files),
        "trainer": {"file": parsed.trainer[0], "line": parsed.trainer[1]} if parsed.trainer else None,
        "switches": sorted(parsed.switches),
        "unresolved": [{"flag": u.flag, "file": u.file, "line": u.line, "raw": u.raw, "reason": u.reason} for u in parsed.unresolved],
        "warnings": list(parsed.warnings),
    }


def launcher_request(parsed: LauncherParse, cfg: Any) -> LauncherRequest:
    """Map the parsed flags onto a :class:`PipelineSpec` for ``cfg``.

    ``--virtual-pipeline-model-parallel-size`` (the older name) counts as
    ``--num-virtual-stages-per-pipeline-rank``. Without ``--mtp-num-layers`` the plan builds no
    MTP layer: Megatron's and slime's default is ``None`` (THUDM/slime ``slime/utils/arguments.py``
    at 624b824a898ab0ec1fcb4d373004c7f3852bf515 resets ``--mtp-num-layers`` to ``default=None``). p2p overlap is on unless the script passes
    ``--no-overlap-p2p-communication``. A ``--num-layers`` that differs from the config's
    ``num_hidden_layers`` is an error (:func:`model_disagreements`); without
    ``--pipeline-model-parallel-size`` PP is Megatron's default 1.
    """
    unresolved, warnings = _unresolved_flags(parsed)
    read = _FlagReader(parsed, unresolved)
    num = read.num
    vpp = num("--num-virtual-stages-per-pipeline-rank")
    legacy = num("--virtual-pipeline-model-parallel-size")
    vpp = legacy if vpp is None and legacy is not None else vpp
    mtp = num("--mtp-num-layers")
    if mtp is None and "--mtp-num-layers" not in parsed.values and cfg.num_nextn_predict_layers:
        warnings.append(f"--mtp-num-layers is not in the script, so the plan builds no MTP layer (Megatron's and "
                        f"slime's default is None) although the model has {cfg.num_nextn_predict_layers}")
    errors = model_disagreements(parsed, cfg, num)
    warnings += _spelling_warnings(parsed)
    pp = num("--pipeline-model-parallel-size")
    if pp is None and "--pipeline-model-parallel-size" not in parsed.values:
        warnings.append("--pipeline-model-parallel-size is not in the script; Megatron's default is 1")
    spec = PipelineSpec(
        pp=pp or 1,
        vpp=vpp,
        layers_per_vstage=num("--num-layers-per-virtual-pipeline-stage"),
        first=num("--decoder-first-pipeline-num-layers"),
        last=num("--decoder-last-pipeline-num-layers"),
        account_for_embedding="--account-for-embedding-in-pipeline-split" in parsed.switches,
        account_for_loss="--account-for-loss-in-pipeline-split" in parsed.switches,
        layout=parsed.values.get("--pipeline-model-parallel-layout"),
        mtp_layers=mtp if mtp is not None else 0,
        overlap_p2p="--no-overlap-p2p-communication" not in parsed.switches,
    )
    freq, offset = num("--dsa-indexer-topk-freq"), num("--dsa-indexer-skip-topk-offset")
    return LauncherRequest(spec, freq, offset, read.unresolved, tuple(warnings), tuple(errors),
                           _launcher_record(parsed))
