"""Serving plans for vLLM and SGLang: default and explicit layer partitions, checked like training.

A serving engine splits the ``L`` decoder layers over ``P`` pipeline ranks (one stage per rank,
no virtual stages): by its own default rule, or by the comma list in its environment variable
(``VLLM_PP_LAYER_PARTITION`` / ``SGLANG_PP_LAYER_PARTITION``). The rules and the behaviour at a
rank that starts on a shared layer are in :mod:`app.core.engines.vllm` and
:mod:`app.core.engines.sglang`, with their sources.

:func:`serving_plan` materialises the partition as an :class:`app.core.layout.stages.StagePlan` (stage
``k`` = pipeline rank ``k``, ``vp_stage`` 0; embedding on rank 0; lm_head, final norm and the MTP
draft on the last rank, where both engines build them), so
:func:`app.core.layout.boundary.validate_boundaries` finds the shared starts exactly as for training.
:func:`serving_check` adds the roles the engine itself derives, the partition checks the engine
raises at start-up, and whether this engine build blocks on a shared start (vLLM: silently wrong
attention; SGLang before its fix: crash; SGLang after it: top-k handoff, allowed).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from functools import lru_cache
from typing import Any, ClassVar

from app.core.engines.base import Engine, Judgement, LayoutCheck, MaxContext, with_caller_parts
from app.core.engines.rules import (
    EngineInputError,
    ShareBehaviour,
    parse_build_date,
    rule_in_force,
)
from app.core.layout.boundary import BoundaryReport, validate_boundaries
from app.core.layout.stages import PipelineSpec, PlanError, Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import TRANSFORMERS_RULE, RoleMap, derive_roles
from app.core.model.serving_memory import (
    ServingMemoryError,
    ServingMemorySettings,
    served_weight_dtype,
    serving_layer_costs,
    serving_memory,
)
from app.core.plan import FieldProblem, Plan
from app.core.plan.bounds import MAX_PP, MAX_TP
from app.core.verdict import Reason, ranges

OBJECTIVES = ("memory", "layers")
_ENTRY = re.compile(r"\s*[+-]?[0-9]+\s*")  # what Python's int() accepts, ASCII digits only


def engine_module(engine: str | ServingEngine) -> ServingEngine:
    """A serving engine by name (from the registry); :class:`EngineInputError` naming the choices otherwise."""
    if isinstance(engine, ServingEngine):
        return engine
    from app.core.engines import ENGINES

    found = ENGINES.get(str(engine).strip().lower())
    if not isinstance(found, ServingEngine):
        names = [n for n, e in ENGINES.items() if isinstance(e, ServingEngine)]
        raise EngineInputError(f"--engine {engine!r} is not a serving engine; use one of {', '.join(names)}")
    return found


def _check_size(value: object, flag: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineInputError(f"{flag} must be a whole number, got {value!r}")
    if value < 1 or value > limit:
        raise EngineInputError(f"{flag} must be between 1 and {limit}, got {value}")
    return value


def default_partition(engine: str, num_layers: int, pp: int, version: str | date | None = None) -> list[int]:
    """Layers per pipeline rank the engine uses when its partition variable is unset."""
    mod = engine_module(engine)
    pp = _check_size(pp, "--pp", MAX_PP)
    if num_layers < 1:
        raise EngineInputError(f"the model has {num_layers} decoder layers; it needs at least one")
    sizes: list[int] = mod.default_partition(num_layers, pp, parse_build_date(version))
    return sizes


def read_partition(text: str, env_var: str) -> list[int]:
    """The comma list as the engine reads it (``int()`` of each entry; whitespace around it is
    allowed, an empty entry is not). Negative counts are refused here although the engine's
    ``int()`` accepts them: they cannot describe a placement (fail closed)."""
    if text is None or not str(text).strip():
        raise EngineInputError(f"{env_var} is empty; give one layer count per pipeline rank, e.g. 18,20,20,20")
    parts = str(text).split(",")
    if len(parts) > MAX_PP:
        raise EngineInputError(f"{env_var} has {len(parts):,} entries; the limit is {MAX_PP}")
    out: list[int] = []
    for k, part in enumerate(parts, start=1):
        if not _ENTRY.fullmatch(part) or len(part.strip()) > 9:
            raise EngineInputError(
                f"{env_var} entry {k} is {part!r}, not a whole number (the engine stops with "
                f"'Invalid partition string: {text}')"
            )
        value = int(part)
        if value < 0:
            raise EngineInputError(f"{env_var} entry {k} is {value}; a layer count cannot be negative")
        out.append(value)
    return out


def partition_errors(sizes: Sequence[int], num_layers: int, pp: int, env_var: str) -> list[PlanError]:
    """The two checks ``get_pp_indices`` makes on an explicit partition, in the engine's words."""
    errors = []
    if len(sizes) != pp:
        errors.append(PlanError(
            "partition_length",
            f"{env_var} has {len(sizes)} entries but the pipeline has {pp} ranks; give one layer count "
            f"per rank (the engine raises: len(partitions)={len(sizes)} does not match pp_size={pp}.)",
            env_var))
    total = sum(sizes)
    if total != num_layers:
        errors.append(PlanError(
            "partition_sum",
            f"{env_var} entries sum to {total} but the model has {num_layers} decoder layers "
            f"(num_hidden_layers); every layer must be placed once (the engine raises: "
            f"sum(partitions)={total} does not match num_hidden_layers={num_layers}.)",
            env_var))
    return errors


def serving_stages(sizes: Sequence[int], mtp_layers: int) -> tuple[Stage, ...]:
    """One stage per rank from layer 1 on; embedding on rank 0, lm_head + MTP on the last rank."""
    stages = []
    nxt = 1
    last = len(sizes) - 1
    for rank, size in enumerate(sizes):
        stages.append(Stage(rank, rank, 0, nxt if size else None, nxt + size - 1 if size else None, size,
                            embedding=rank == 0, loss=rank == last, mtp_layers=mtp_layers if rank == last else 0))
        nxt += size
    return tuple(stages)


def _sizes_for(cfg: ModelConfig, engine: str, pp: int, partition: str | Sequence[int] | None,
               build: date | None) -> tuple[list[int], str]:
    mod = engine_module(engine)
    if partition is None:
        return mod.default_partition(cfg.num_hidden_layers, pp, build), "default"
    if isinstance(partition, str):
        return read_partition(partition, mod.env_var), "explicit"
    sizes = [int(x) for x in partition]
    if any(x < 0 for x in sizes):
        raise EngineInputError(f"{mod.env_var} cannot contain negative layer counts: {sizes}")
    return sizes, "explicit"


def serving_plan(cfg: ModelConfig, engine: str, pp: int, partition: str | Sequence[int] | None = None, *,
                 mtp: bool = True, version: str | date | None = None) -> StagePlan:
    """The stages ``engine`` builds for ``cfg`` on ``pp`` ranks (its default, or ``partition``).

    ``mtp``: whether the MTP draft (``num_nextn_predict_layers``) is served; it sits on the last
    rank. Length / sum mismatches are returned as ``errors`` (the engine refuses to start) and
    such a partition has no stages: ``get_pp_indices`` raises before a layer is placed, and
    stages past the model's last layer name layers it does not have (42,36 on DeepSeek-V3's 61
    layers was an IndexError, an HTTP 500 - issue 16); unreadable input raises
    :class:`EngineInputError`.
    """
    mod = engine_module(engine)
    pp = _check_size(pp, "--pp", MAX_PP)
    sizes, _ = _sizes_for(cfg, engine, pp, partition, parse_build_date(version))
    errors = partition_errors(sizes, cfg.num_hidden_layers, pp, mod.env_var)
    n_mtp = cfg.num_nextn_predict_layers if mtp else 0
    stages = serving_stages(sizes, n_mtp) if not errors else ()
    return StagePlan(pp, 1, cfg.num_hidden_layers, n_mtp, stages, tuple(errors),
                     PipelineSpec(pp=pp, split=tuple(sizes), mtp_layers=n_mtp))


def engine_roles(cfg: ModelConfig, engine: str) -> tuple[RoleMap, list[int]]:
    """The roles ``engine`` derives for ``cfg``, and the layers where they differ from the
    checkpoint's declared ``indexer_types`` (vLLM does not read that array).

    The freq/offset rule is transformers' (``models/glm_moe_dsa/configuration_glm_moe_dsa.py`` @
    008e574391258935f3ecc3035c882e73bbcac419: ``indexer_types`` wins, then ``index_topk_pattern``,
    then full iff ``max(i - offset + 1, 0) % freq == 0``, defaults freq 1, offset 2), which vLLM's
    ``deepseek_v2.py`` repeats without the first step."""
    mod = engine_module(engine)
    if mod.reads_indexer_types or cfg.indexer_types is None:
        return derive_roles(cfg, TRANSFORMERS_RULE), []
    own = derive_roles(replace(cfg, indexer_types=None), TRANSFORMERS_RULE)
    declared = [t == "full" for t in cfg.indexer_types]
    diffs = [n for n in range(1, cfg.num_hidden_layers + 1) if (own.role(n).role == "full") != declared[n - 1]]
    return own, diffs


@dataclass(frozen=True)
class ServingCheck(LayoutCheck):
    """The verdict for one serving partition; :meth:`to_json` has the shape of ``isplan check``."""

    model: ModelConfig
    engine: str
    build: date | None
    tp: int
    sizes: tuple[int, ...]
    partition_source: str
    roles: RoleMap
    plan: StagePlan
    boundary: BoundaryReport
    behaviour: ShareBehaviour
    errors: tuple[PlanError, ...]
    warnings: tuple[str, ...]
    role_differences: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())
    #: what the caller adds to the JSON (a launcher import's report, ``launcher``)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def unit(self) -> str:
        return "rank"

    @property
    def layout_text(self) -> str:
        return f"{self.env_var}={','.join(map(str, self.sizes))}" if self.sizes else ""

    @property
    def share(self) -> ShareBehaviour:
        return self.behaviour

    @property
    def blocking(self) -> bool:
        return bool(self.blocking_violations)

    @property
    def env_var(self) -> str:
        return str(engine_module(self.engine).env_var)

    def text_lines(self) -> list[str]:
        """``isplan check``'s text style: one ``stage k: a-b (role)`` line per rank, then a verdict."""
        head = (f"model {self.model.id} ({self.model.num_hidden_layers} layers), engine {self.engine} "
                f"({self.build.isoformat() if self.build else 'latest'}), PP {self.plan.pp}, "
                f"{self.env_var}={','.join(map(str, self.sizes))} ({self.partition_source})")
        lines = [head]
        lines += [f"warning: {w}" for w in self.warnings]
        for r in self.boundary.records:
            st = r.stage
            extras = ", ".join(x for x in ("embedding" if st.embedding else "", "lm_head" if st.loss else "",
                                            f"MTP x{st.mtp_layers}" if st.mtp_layers else "") if x)
            span = f"{st.first_layer}-{st.last_layer} ({r.start_role})" if st.num_layers else "no decoder layers"
            lines.append(f"stage {st.index + 1}: {span}" + (f" [{extras}]" if extras else ""))
        lines += [f"INVALID: {e.message}" for e in self.errors]
        for v in self.boundary.violations:
            lines.append(("INVALID: " if self.behaviour.blocking else "handoff: ") + v.short)
        if self.blocking:
            lines.append(f"INVALID: {self.behaviour.message}")
        if self.valid:
            lines.append("VALID: " + (self.boundary_holds() if not self.boundary.violations
                                      else f"{self.engine} hands top-k over at a shared start"))
        return lines

    def to_json(self) -> dict[str, Any]:
        mod = engine_module(self.engine)
        violations = []
        for v in self.boundary.violations:
            d = v.to_dict()
            d["engine_behaviour"] = self.behaviour.code
            d["blocking"] = self.behaviour.blocking
            violations.append(d)
        return {
            "valid": self.valid,
            "engine": self.engine,
            "engine_version": self.build.isoformat() if self.build else "latest",
            "model": self.model.summary(),
            "pp": self.plan.pp,
            "vpp": 1,
            "tp": self.tp,
            "partition": list(self.sizes),
            "partition_source": self.partition_source,
            "partition_rule": rule_in_force(mod.partition_rules, self.build).to_dict(),
            "env": {self.env_var: ",".join(str(s) for s in self.sizes)},
            "roles_rule": self.roles.rule,
            "roles_source": mod.role_source,
            "role_differences": list(self.role_differences),
            "stages": [r.to_dict() for r in self.boundary.records],
            "violations": violations,
            "shared_start_behaviour": self.behaviour.to_dict(),
            "blocking_reason": self.behaviour.message if self.blocking else None,
            "errors": [e.to_dict() for e in self.errors],
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            **self.extra,
        }


def serving_check(cfg: ModelConfig, engine: str, pp: int, partition: str | Sequence[int] | None = None, *,
                  tp: int = 1, mtp: bool = True, version: str | date | None = None) -> ServingCheck:
    """Check a serving partition (the engine default when ``partition`` is None) for ``engine``.

    Fails closed: role errors and the engine's partition errors are ``errors``; every rank start
    on a shared layer is a violation, blocking unless this engine build hands the top-k over.
    """
    mod = engine_module(engine)
    engine = mod.name
    tp = _check_size(tp, "--tp", MAX_TP)
    build = parse_build_date(version)
    plan = serving_plan(cfg, engine, pp, partition, mtp=mtp, version=build)
    roles, diffs = engine_roles(cfg, engine)
    boundary = validate_boundaries(plan, roles)
    errors = [PlanError(e.code, e.message, None) for e in roles.errors] + list(plan.errors)
    if not plan.stages and not errors:
        errors.append(PlanError("no_stages", "the partition produced no stages"))
    behaviour: ShareBehaviour = mod.share_behaviour(build)
    warnings = _warnings(cfg, mod, plan, diffs, behaviour, bool(boundary.violations), build)
    return ServingCheck(cfg, engine, build, tp, tuple(plan.spec.split or ()),
                        "default" if partition is None else "explicit", roles, plan, boundary, behaviour,
                        tuple(errors), tuple(warnings), tuple(diffs),
                        (rule_in_force(mod.partition_rules, build).summary,))


def _warnings(cfg: ModelConfig, mod: ServingEngine, plan: StagePlan, diffs: list[int], behaviour: ShareBehaviour,
              shared_start: bool, build: date | None) -> list[str]:
    out = []
    if diffs:
        out.append(
            f"{mod.role_source}: its roles differ from the checkpoint's indexer_types on {len(diffs)} layer(s) "
            f"({', '.join(map(str, diffs[:12]))}{', ...' if len(diffs) > 12 else ''}); the engine would build "
            "indexers where the checkpoint has none, or the reverse")
    empty = [s.pp_rank for s in plan.stages if s.num_layers == 0]
    if empty:
        out.append(f"pipeline rank(s) {', '.join(map(str, empty))} hold no decoder layer; the engine accepts this "
                   "but the rank only relays activations")
    if shared_start and not behaviour.blocking:
        out.append(behaviour.message)
    if plan.mtp_layers and plan.pp > 1:
        out.append(mod.mtp_with_pp(build))
    return out


# --------------------------------------------------------------------------- export


def export_partition(cfg: ModelConfig, engine: str, pp: int, sizes: Sequence[int], *, tp: int = 1,
                     model: str | None = None, context: int | None = None,
                     kv_dtype: str | None = None, allow_long_context: bool = False,
                     weight_dtype: str | None = None, memory_fraction: float | None = None,
                     ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> dict[str, str]:
    """The environment line and serve command for ``sizes``, every value ``shlex.quote``-d.

    ``model`` defaults to the config's upstream repository (else its id). ``context`` (stated by
    the plan; none: the engine's own maximum) and ``kv_dtype`` become the engine's own flags (its
    ``serve_args``), so the command runs what the memory verdict judged; ``allow_long_context``
    sets the engine's override variable (:attr:`ServingEngine.long_context_env`) on the env line;
    a stated ``weight_dtype`` of ``fp8`` for a BF16 checkpoint is ``--quantization fp8`` (an FP8
    checkpoint is loaded as FP8 without it); a stated ``memory_fraction`` is the engine's share flag
    and ``ep`` > 1 its expert parallelism, ``dp`` > 1 its data-parallel ranks (where it has them,
    with ``dp_attention`` SGLang's data-parallel attention, the plan's ``enable_dp_attention``), and
    ``mtp`` the speculative decoding that drafts with the checkpoint's MTP layers.
    """
    mod = engine_module(engine)
    _check_size(pp, "--pp", MAX_PP)
    _check_size(tp, "--tp", MAX_TP)
    name = model or cfg.upstream_repo or cfg.id
    value = ",".join(str(int(s)) for s in sizes)
    env_line = f"{mod.env_var}={shlex.quote(value)}"
    if allow_long_context:
        env_line += f" {mod.long_context_env}=1"
    quantization = "fp8" if weight_dtype == "fp8" and cfg.checkpoint_weight_dtype == "bf16" else None
    command = " ".join(shlex.quote(a) for a in mod.serve_args(name, tp, pp, context=context, kv_dtype=kv_dtype,
                                                                indexer=cfg.has_indexer, quantization=quantization,
                                                                memory_fraction=memory_fraction, ep=ep, dp=dp,
                                                                dp_attention=dp_attention, mtp=mtp))
    return {
        "env_var": mod.env_var,
        "env_value": value,
        "env_line": env_line,
        "command": command,
        "script": f"export {env_line}\n{command}\n",
    }


# --------------------------------------------------------------------------- best partition


@dataclass(frozen=True)
class ServingCandidate:
    """One partition found by :func:`best_serving_partition`, with its verdict and export."""

    sizes: tuple[int, ...]
    objective: str
    rank_costs: tuple[float, ...]
    max_rank_cost: float
    check: ServingCheck
    export: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": list(self.sizes),
            "objective": self.objective,
            "unit": "bytes per GPU" if self.objective == "memory" else "decoder layers",
            "rank_costs": [int(b) for b in self.rank_costs],
            "max_rank_cost": int(self.max_rank_cost),
            "valid": self.check.valid,
            "export": self.export,
        }


def best_serving_partition(cfg: ModelConfig, engine: str, pp: int, *, k: int = 1, mtp: bool = True,
                           version: str | date | None = None, memory: ServingMemorySettings | None = None,
                           model: str | None = None, allow_shared_starts: bool = False,
                           objective: str = "memory", context: int | None = None) -> list[ServingCandidate]:
    """The ``k`` best partitions of ``cfg`` over ``pp`` ranks for ``engine``, best first.

    ``objective="memory"``: cost of a rank = bytes per GPU of its layers' weights (TP/EP sharded)
    + their KV and indexer caches for ``context x concurrency`` tokens
    (:func:`app.core.model.serving_memory.serving_layer_costs`), plus the embedding on rank 0 and lm_head,
    final norm and the MTP draft on the last rank. ``objective="layers"``: one per decoder layer
    (the most even layer counts, what an even default split aims at). The order is :func:`app.core.optimise.optimiser.k_best_layouts`' (least largest rank, then the most even,
    then the smallest split). Every rank starts on a full layer, also for engines that hand top-k
    over, unless ``allow_shared_starts`` and this engine build does not block on a shared start.
    Empty when no valid partition exists (more ranks than full layers, or a shared layer 1).
    ``context``: the one the plan states, which each candidate's serve command names.
    """
    mod = engine_module(engine)
    pp = _check_size(pp, "--pp", MAX_PP)
    settings = (memory or ServingMemorySettings()).validate()
    roles, _ = engine_roles(cfg, mod.name)
    build = parse_build_date(version)
    n_mtp = cfg.num_nextn_predict_layers if mtp else 0
    if objective not in OBJECTIVES:
        raise EngineInputError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "memory":
        costs, first, last = serving_layer_costs(cfg, roles, settings, mtp_layers=n_mtp)
    else:
        costs, first, last = [1.0] * cfg.num_hidden_layers, 0.0, 0.0
    handoff = not mod.share_behaviour(build).blocking
    full = [True] * cfg.num_hidden_layers if allow_shared_starts and handoff else [
        r.role == "full" for r in roles.layers]
    out = []
    from app.core.optimise.optimiser import k_best_layouts

    for layout in k_best_layouts(costs, full, pp, 1, k, first, last, unit="rank"):
        sizes = tuple(layout.split)
        check = serving_check(cfg, mod.name, pp, sizes, tp=settings.tp, mtp=mtp, version=build)
        out.append(ServingCandidate(sizes, objective, tuple(layout.rank_costs), layout.max_cost, check,
                                    export_partition(cfg, mod.name, pp, sizes, tp=settings.tp, model=model,
                                                     context=context, kv_dtype=settings.kv_dtype)))
    return out


# --------------------------------------------------------------------------- the engine


#: the plan fields a serving engine reads: its partition, TP/EP, the MTP draft and serving memory
SERVING_FIELDS = frozenset({"model", "engine", "engine_version", "mode", "split", "pp", "tp", "ep", "mtp_layers",
                            "gpu", "gpu_memory_gb", "context", "allow_long_context", "concurrency", "kv_dtype",
                            "weight_dtype", "gpu_memory_utilization"})
#: the share of each GPU a server takes when the plan states none: vLLM's ``gpu_memory_utilization``
#: default (``vllm/config/cache.py`` @ c1d86421: 0.9; later builds 0.92, @ 002f10e0), taken for SGLang's
#: ``--mem-fraction-static`` too (SGLang derives its default from the GPU's memory: not modelled)
DEFAULT_MEMORY_FRACTION = 0.9
#: what the largest term of an overflowing rank asks the user to change
_FIX_OF_TERM = {"weights_bytes": ("tp", "raise tp or pp (weights are split over TP and PP), or serve FP8 weights"),
                "kv_latent_bytes": ("context", "lower context or concurrency, serve the KV cache in fp8, or raise pp"),
                "indexer_cache_bytes": ("context", "lower context or concurrency, or raise pp"),
                "topk_buffer_bytes": ("tp", "raise tp")}
#: What each serving-memory term is called in a message (``kv_latent_bytes`` holds an MLA model's
#: latent cache and a GQA model's keys and values alike: its KV cache)
_TERM_LABELS = {"weights_bytes": "weights", "kv_latent_bytes": "KV cache", "indexer_cache_bytes": "indexer key cache",
                "topk_buffer_bytes": "top-k buffer"}

#: the keys of a per-layer-type ``rope_parameters`` (transformers ``configuration_utils.ALLOWED_LAYER_TYPES``,
#: the version vLLM @ 0052a5b8 compares with): ``{"full_attention": {...}, "sliding_attention": {...}}``
ROPE_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention"})


def rope_entries(text: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """A config's rope scaling: its parameter dicts and whether they are per layer type.
    ``rope_parameters`` (transformers v5) or ``rope_scaling`` (v4; transformers reads it as the
    former) is one dict, or one per layer type; ``([], False)`` without one. ``type`` is read as
    ``rope_type`` (transformers' own patch). Raises ``ValueError`` naming the key when it is not such
    a dict."""
    key = "rope_parameters" if text.get("rope_parameters") is not None else "rope_scaling"
    rope = text.get(key)
    if rope is None:
        return [], False
    nested = bool(isinstance(rope, dict) and rope and set(rope) <= ROPE_LAYER_TYPES)
    entries = list(rope.values()) if nested else [rope]
    if not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"config.json's {key} must be an object (or one per layer type), got "
                         f"{str(rope)[:60]!r}: the serving engine reads the maximum context from it")
    return [{**e, "rope_type": e.get("rope_type", e.get("type", "default"))} for e in entries], nested


def stated_flags(context: tuple[str, int | None], quantization: tuple[str, str | None],
                 memory_fraction: tuple[str, float | None]) -> list[str]:
    """The serve command's words for the settings both engines spell as ``FLAG VALUE`` and name only
    when the plan states them: the context, ``--quantization`` and the GPU share (each ``(the
    engine's flag, the value or None)``)."""
    out: list[str] = []
    for flag, value in (context, quantization, memory_fraction):
        if value is not None:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


#: values a serve config file may hold, counted with every alias expanded (a few lines of YAML
#: aliases can stand for billions of values, which turning them into options would write out)
MAX_CONFIG_VALUES = 10_000


def _count(value: Any, budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"it holds more than {MAX_CONFIG_VALUES:,} values (aliases expanded)")
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        _count(item, budget)


def config_options(text: str, path: str, label: str, nested: Any, *, empty_ok: bool,
                   check_key: Any = None) -> list[str]:
    """The options a serve engine's ``--config FILE`` adds, by the rule both engines share: a
    ``.yaml`` / ``.yml`` file holding one mapping; ``key: true`` is ``--key``, ``false`` nothing, a
    list ``--key item ...``, another value ``--key value``. ``nested(key, mapping)`` gives a mapping
    value's options (or raises); ``check_key(key)`` may refuse a key (raises); ``empty_ok``: an empty
    file adds nothing (else it is refused). Raises ``ValueError`` naming what the engine would refuse
    or what is not read here."""
    import yaml

    if path.rsplit(".", 1)[-1].lower() not in ("yaml", "yml"):
        raise ValueError(f"{label} reads a config file only as YAML (.yaml / .yml), not {path}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML {label} can read ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    data = {} if data is None and empty_ok else data
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not one mapping of options")
    try:
        _count(data, [MAX_CONFIG_VALUES])
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    out: list[str] = []
    for key, value in data.items():
        if check_key is not None:
            check_key(key)
        if isinstance(value, dict):
            out += nested(key, value)
        elif isinstance(value, bool):
            out += [f"--{key}"] if value else []
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)] if value else []
        else:
            out += [f"--{key}", str(value)]
    return out


def config_number(text: dict[str, Any], key: str, where: str = "config.json") -> float | None:
    """``text[key]`` as a positive number (``None`` when absent); ``ValueError`` naming the key otherwise."""
    value = text.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"{where}'s {key} must be a positive number, got {str(value)[:40]!r}: the serving "
                         "engine derives the maximum context from it")
    return value


class ServingEngine(Engine):
    """What vLLM and SGLang share: one stage per pipeline rank from the engine's partition, the
    roles the engine derives itself, serving memory (weights + KV + indexer cache + top-k buffer).
    Each engine's module (:mod:`.vllm`, :mod:`.sglang`) sets the rules that differ."""

    workflow = "serving"
    fields = SERVING_FIELDS
    judges_memory_always = True
    env_var: ClassVar[str]
    tp_flag: ClassVar[str]
    pp_flag: ClassVar[str]
    partition_rules: ClassVar[tuple[Any, ...]]
    role_source: ClassVar[str]
    reads_indexer_types: ClassVar[bool]
    #: the engine's ``--kv-cache-dtype`` values -> the plan's ``kv_dtype`` (launcher import)
    kv_cache_dtypes: ClassVar[dict[str, str]]
    #: what ``--kv-cache-dtype auto`` means in this engine (the launcher import's warning says it)
    kv_auto: ClassVar[str]
    #: the flag of the longest sequence a server takes (the plan's ``context``)
    context_flag: ClassVar[str]
    #: the variable that lets a stated context exceed the model's maximum (the plan's ``allow_long_context``)
    long_context_env: ClassVar[str]
    #: suffixes the context flag's value may carry, with their multiplier, where every build of the
    #: engine reads them alike (vLLM ``128k``); another suffix is refused (launcher import)
    context_suffixes: ClassVar[dict[str, int]] = {}
    #: a switch that turns expert parallelism on at ``ep = tp x dp`` (vLLM ``--enable-expert-parallel``),
    #: where the engine has no expert-parallel size of its own (the plan's ``ep``)
    ep_switch: ClassVar[str | None] = None
    #: what makes the expert-parallel size the TP size whatever the size flag says: switches, and a flag
    #: with the values that do (SGLang's deprecated ``--enable-ep-moe`` and an all-to-all MoE backend)
    ep_tp_switches: ClassVar[tuple[str, ...]] = ()
    ep_tp_flag: ClassVar[tuple[str, frozenset[str]] | None] = None
    #: the engine's switches that set a boolean plan field (SGLang ``--enable-dp-attention``)
    switches: ClassVar[dict[str, str]] = {}
    #: the flags of the engine's speculative decoding (read by :meth:`launch_mtp`)
    speculative_flags: ClassVar[tuple[str, ...]] = ()

    # the engine's own rules (its module's functions)
    def default_partition(self, num_layers: int, pp: int, build: date | None = None) -> list[int]:
        raise NotImplementedError

    def share_behaviour(self, build: date | None = None) -> ShareBehaviour:
        raise NotImplementedError

    def serve_args(self, model: str, tp: int, pp: int, *, context: int | None = None, kv_dtype: str | None = None,
                   indexer: bool = False, quantization: str | None = None, memory_fraction: float | None = None,
                   ep: int = 1, dp: int = 1, dp_attention: bool = False, mtp: bool = False) -> list[str]:
        raise NotImplementedError

    def launch_mtp(self, values: dict[str, str]) -> tuple[bool, str | None]:
        """Whether a serve command's speculative-decoding flags (``values``: flag -> value) run the
        checkpoint's own MTP layers as the draft, and a note when they run something the memory
        model does not hold (another draft model, n-gram)."""
        return False, None

    def replicas(self, plan: Plan) -> int:
        """Data-parallel ranks that each take TP x PP GPUs of their own (the engine's ``dp``, where
        its fields have one)."""
        return (plan.dp or 1) if "dp" in self.fields else 1

    def attention_dp(self, plan: Plan) -> int:
        """Data-parallel attention ranks inside the TP ranks (1: none)."""
        return 1

    def parallel_reasons(self, cfg: ModelConfig, plan: Plan) -> list[Reason]:
        """The engine's start-up refusals of the plan's parallel sizes (none by default)."""
        return []

    def mtp_with_pp(self, build: date | None) -> str:
        """What the engine says about serving the MTP draft with PP > 1."""
        raise NotImplementedError

    def long_context_set(self, value: str) -> bool | None:
        """Whether a value of :attr:`long_context_env` switches the override on (``None``: a value
        the engine does not read as either, so it keeps its default, off)."""
        raise NotImplementedError

    def context_reason(self, plan: Plan, limit: MaxContext | None) -> Reason | None:
        """The engine's start-up check of a stated context against the model's maximum: above it,
        a refusal, or with :attr:`long_context_env` set, the warning the engine logs (positions
        past the maximum the model was trained for give wrong output)."""
        if plan.context is None or limit is None or plan.context <= limit.tokens:
            return None
        said = (f"{self.context_flag} {plan.context:,} is above {plan.model}'s maximum context {limit.tokens:,} "
                f"({limit.how}, as {self.label} derives it)")
        if plan.allow_long_context:
            return Reason(self.acceptance_kind, "context_above_model_maximum",
                          f"{said}; {self.long_context_env}=1 lets {self.label} start, but positions past the "
                          "maximum may give wrong output or CUDA errors (the engine's own warning)", "context")
        return Reason(self.acceptance_kind, "context_above_model_maximum",
                      f"{said}: {self.label} refuses to start. Lower context to at most {limit.tokens:,}, or set "
                      f"{self.long_context_env}=1 (allow_long_context) if the model was extended past it", "context")

    # the protocol
    def layout_field(self, plan: Plan) -> str:
        return "split" if plan.mode == "split" else "pp"

    def roles(self, cfg: ModelConfig, plan: Plan) -> tuple[RoleMap, list[int]]:
        return engine_roles(cfg, self.name)

    def _partition(self, plan: Plan) -> tuple[int, tuple[int, ...] | None]:
        partition = plan.split if plan.mode == "split" else None
        return (plan.pp if partition is None else len(partition)), partition

    def check(self, cfg: ModelConfig, plan: Plan, *, extra_errors: tuple[PlanError, ...] = (),
              extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> ServingCheck:
        pp, partition = self._partition(plan)
        check = serving_check(cfg, self.name, pp, partition, tp=plan.tp, mtp=bool(plan.mtp_layers),
                              version=plan.engine_version)
        return with_caller_parts(check, extra_errors, extra_warnings, extra)

    def gpu_line(self, plan: Plan, check: LayoutCheck | None) -> str | None:
        """One server: ``--tensor-parallel-size`` x the pipeline ranks of its partition (x its
        data-parallel ranks, where the engine has them: vLLM ``--data-parallel-size``)."""
        if check is None or not check.plan.stages:
            return None
        pp, dp = check.plan.pp, self.replicas(plan)
        n = plan.tp * pp * dp
        ranks = f" × DP {dp}" if dp > 1 else ""
        return f"TP {plan.tp} × PP {pp}{ranks} = {n} GPU{'' if n == 1 else 's'} (one {self.label} server)"

    def memory_settings(self, cfg: ModelConfig, plan: Plan) -> ServingMemorySettings:
        """Serving memory's settings of ``plan``: its context (:meth:`context`: the model's maximum
        unless stated), TP / EP, dtypes (the weights': the checkpoint's unless stated) and the GPU's
        capacity. ``ValueError`` (:class:`ServingMemoryError`, its ``field``) for an unknown one."""
        from app.core.model.parallelism import resolve_gpu

        gpu = resolve_gpu(plan.gpu, int(plan.gpu_memory_gb * 1e9) if plan.gpu_memory_gb else None)
        return ServingMemorySettings(tp=plan.tp, ep=plan.ep, weight_dtype=served_weight_dtype(cfg, plan.weight_dtype),
                                     kv_dtype=plan.kv_dtype, attn_dp=self.attention_dp(plan), gpu_memory_utilization=(
                                         DEFAULT_MEMORY_FRACTION if plan.gpu_memory_utilization is None
                                         else plan.gpu_memory_utilization),
                                     context=self.context(cfg, plan), concurrency=plan.concurrency,
                                     capacity_gib=gpu.capacity_bytes / 2**30).validate()

    def judge(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck) -> Judgement:
        out = Judgement()
        if not check.plan.stages:   # the partition is refused: nothing to place in memory
            return out
        try:
            settings = self.memory_settings(cfg, plan)
            reason = self.context_reason(plan, self.max_context(cfg))
        except (ServingMemoryError, ValueError) as exc:
            out.problems.append(FieldProblem(getattr(exc, "field", "context"), str(exc)))
            return out
        if reason is not None:
            (out.warnings if plan.allow_long_context else out.blocking).append(reason)
        out.blocking += self.parallel_reasons(cfg, plan)
        out.serving_memory = serving_memory(cfg, check.plan, check.roles, settings).to_json()
        out.blocking += serving_memory_reasons(out.serving_memory)
        return out

    def exports(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement,
                conversion: LayoutCheck | None = None) -> dict[str, str]:
        if not check.valid:
            return {}
        out = export_partition(cfg, self.name, check.plan.pp, check.plan.sizes, tp=plan.tp, context=plan.context,
                               kv_dtype=plan.kv_dtype, allow_long_context=plan.allow_long_context,
                               weight_dtype=plan.weight_dtype, memory_fraction=plan.gpu_memory_utilization,
                               ep=plan.ep, dp=plan.dp or 1, dp_attention=plan.enable_dp_attention,
                               mtp=bool(plan.mtp_layers) and cfg.num_nextn_predict_layers > 0)
        return {"serve": out["script"].rstrip(), "serve_env": out["env_line"], "serve_command": out["command"]}

    def best_layouts(self, cfg: ModelConfig, plan: Plan, *, objective: str = "memory", top: int = 1) -> list[Plan]:
        """The best valid partitions for ``plan.pp`` ranks (weights + KV per rank, every rank on a
        full layer), as split plans."""
        try:
            settings = self.memory_settings(cfg, plan)
        except (ServingMemoryError, ValueError):
            settings = ServingMemorySettings(tp=plan.tp, ep=plan.ep)
        found = best_serving_partition(cfg, self.name, plan.pp, k=top, mtp=bool(plan.mtp_layers),
                                       version=plan.engine_version, memory=settings, context=plan.context,
                                       objective=objective if objective in OBJECTIVES else "memory")
        return [replace(plan, mode="split", split=c.sizes, pp=len(c.sizes)) for c in found]

    def nearest(self, cfg: ModelConfig, plan: Plan) -> Plan | None:
        from app.core.optimise.optimiser import nearest_valid

        pp, sizes = self._partition(plan)
        if sizes is None:
            sizes = tuple(default_partition(self.name, cfg.num_hidden_layers, pp, plan.engine_version))
        if sum(sizes) != cfg.num_hidden_layers or not sizes:
            return None
        roles, _ = self.roles(cfg, plan)
        nv = nearest_valid(list(sizes), [r.role == "full" for r in roles.layers], 1)
        return None if nv is None else replace(plan, mode="split", split=tuple(nv.split), pp=len(nv.split))

    def profile(self, cfg: ModelConfig, plan: Plan) -> Plan:
        """The fewest GPUs TP x PP (TP 1-8, PP 1-16) whose best valid partition fits the GPU at the
        plan's context and concurrency, judged by :func:`app.core.evaluate.evaluate` (the best
        partition found anyway when none fits)."""
        return _serving_profile(self.name, cfg, replace(plan, engine=self.name, mode="flags", split=None,
                                                        parallel=True))


@lru_cache(maxsize=64)
def _serving_profile(engine: str, cfg: ModelConfig, base: Plan) -> Plan:
    from app.core.engines import engine_for
    from app.core.evaluate import evaluate

    e = engine_for(engine)
    shapes = sorted(((tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8, 16)), key=lambda s: (s[0] * s[1], s[1]))
    fallback: Plan | None = None
    for tp, pp in shapes:
        if pp > cfg.num_hidden_layers:
            continue
        for candidate in e.best_layouts(cfg, replace(base, tp=tp, pp=pp), objective="memory", top=1):
            ev = evaluate(candidate, cfg)
            if not ev.problems and ev.verdict.go:
                return candidate
            fallback = fallback or candidate
    return fallback or base


def serving_memory_reasons(memory: dict[str, Any]) -> list[Reason]:
    """One reason for every rank over the usable capacity, naming the ranks, the worst one and the
    setting that fixes its largest term."""
    over = [r for r in memory.get("ranks", []) if r.get("fits") is False]
    if not over:
        return []
    worst = max(over, key=lambda r: r["total_bytes"])
    term = max(_FIX_OF_TERM, key=lambda k: worst.get(k, 0))
    fld, fix = _FIX_OF_TERM[term]
    if fld == "context" and memory["settings"]["concurrency"] > 1:
        fld = "concurrency"
    ranks = ranges([r["pp_rank"] for r in over])
    return [Reason("memory", "rank_over_capacity",
                   f"pp rank{'s' * (len(over) > 1)} {ranks} need{'s' * (len(over) == 1)} up to "
                   f"{worst['total_bytes'] / 2**30:.1f} GiB per GPU for {serving_terms_held(over)} "
                   f"(pp rank {worst['pp_rank']}: {_TERM_LABELS[term]} "
                   f"{worst[term] / 2**30:.1f} GiB); the usable capacity is {worst['usable_bytes'] / 2**30:.1f} GiB: "
                   f"{fix}", fld)]


def serving_terms_held(ranks: list[dict[str, Any]]) -> str:
    """What these serving-memory ranks hold, in words: ``weights and KV cache`` (a model without an
    indexer has no indexer cache and no top-k buffer), ``weights, KV cache, indexer key cache and
    top-k buffer``."""
    held = [label for k, label in _TERM_LABELS.items() if any(r.get(k) for r in ranks)] or ["weights"]
    return held[0] if len(held) == 1 else ", ".join(held[:-1]) + " and " + held[-1]
