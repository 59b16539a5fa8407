"""Pipeline stages, engine-neutral: a :class:`StagePlan` is the (pp_rank, vp_stage) -> decoder-layer
blocks an engine builds, in vp-major order (stage ``i`` is pipeline rank ``i % PP``, virtual stage
``i // PP``), with where the embedding, the loss / lm_head and the MTP layers sit and every
acceptance error the engine would raise. Each engine fills one from its own rule (Megatron's
placement: :mod:`app.core.engines.megatron.placement`; vLLM / SGLang partitions:
:mod:`app.core.engines.serving`; MaxText stages and repeats: :mod:`app.core.engines.maxtext`), so
the boundary rule (:mod:`app.core.layout.boundary`) applies to all of them unchanged.

A :class:`PipelineSpec` is how a user describes a pipeline: stage sizes, Megatron's flags or a
``--pipeline-model-parallel-layout`` string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LayoutInputError(ValueError):
    """Input that is not a layout at all (unparsable numbers, bad characters): exit code 2."""


@dataclass(frozen=True)
class Stage:
    """One physical-or-virtual pipeline stage. Layers are 1-based and inclusive."""

    index: int  # position in vp-major order, 0-based
    pp_rank: int
    vp_stage: int
    first_layer: int | None
    last_layer: int | None
    num_layers: int
    embedding: bool = False
    loss: bool = False
    mtp_layers: int = 0

    @property
    def layers(self) -> range:
        if self.first_layer is None:
            return range(0)
        return range(self.first_layer, self.first_layer + self.num_layers)

    def tokens(self) -> list[str]:
        return (["E"] if self.embedding else []) + ["t"] * self.num_layers + ["m"] * self.mtp_layers + (
            ["L"] if self.loss else []
        )


@dataclass(frozen=True)
class PlanError:
    """A blocking finding. ``kind`` says whose rule it is: ``"engine"`` (the engine would refuse or
    crash on the plan; the verdict names the engine) or ``"model"`` (the plan, launcher or engine
    disagrees with the model's config / checkpoint)."""

    code: str
    message: str
    flag: str | None = None
    kind: str = "engine"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "flag": self.flag, "kind": self.kind}


@dataclass(frozen=True)
class PipelineSpec:
    """How the user described the pipeline; exactly one of split / layout / flags is used."""

    pp: int | None = None
    vpp: int | None = None
    layers_per_vstage: int | None = None
    first: int | None = None
    last: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    layout: str | None = None
    split: tuple[int, ...] | None = None
    mtp_layers: int | None = None
    overlap_p2p: bool = True   # Megatron's default; False = --no-overlap-p2p-communication

    @property
    def kind(self) -> str:
        if self.split is not None:
            return "split"
        if self.layout is not None:
            return "layout"
        return "flags"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pp": self.pp,
            "vpp": self.vpp,
            "layers_per_vstage": self.layers_per_vstage,
            "first": self.first,
            "last": self.last,
            "account_for_embedding": self.account_for_embedding,
            "account_for_loss": self.account_for_loss,
            "layout": self.layout,
            "split": list(self.split) if self.split is not None else None,
            "mtp_layers": self.mtp_layers,
            "overlap_p2p": self.overlap_p2p,
        }


@dataclass(frozen=True)
class StagePlan:
    pp: int
    vpp: int
    num_layers: int
    mtp_layers: int
    stages: tuple[Stage, ...]
    errors: tuple[PlanError, ...] = ()
    spec: PipelineSpec = field(default_factory=PipelineSpec)

    @property
    def sizes(self) -> list[int]:
        return [s.num_layers for s in self.stages]

    def stage_of_layer(self, layer: int) -> Stage | None:
        for s in self.stages:
            if s.first_layer is not None and s.first_layer <= layer <= s.last_layer:  # type: ignore[operator]
                return s
        return None

    def rank_stages(self, pp_rank: int) -> list[Stage]:
        return [s for s in self.stages if s.pp_rank == pp_rank]
