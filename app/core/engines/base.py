"""The Engine protocol: what every engine module tells the planner, in one shape.

An engine (``megatron``, ``slime``, ``hf``, ``vllm``, ``sglang``, ``maxtext``) owns, in its own
module, everything that differs between engines: how it derives full/shared roles
(:class:`~app.core.model.roles.RoleRule`), how it places decoder layers on pipeline stages and
what it refuses (its :class:`LayoutCheck`, with the engine's own messages and the source each
rule was read from), what a stage starting on a shared layer does there
(:class:`~app.core.engines.rules.ShareBehaviour`), its parallel constraints and memory
conventions (:meth:`Engine.judge`: training memory per pipeline rank, or serving memory), its
flag vocabulary (import and export), the plan fields its form shows, and its recommended starting
plan. Nothing outside ``app/core/engines/`` branches on an engine's name: it asks the engine
(:func:`app.core.engines.engine_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from app.core.engines.rules import ShareBehaviour
from app.core.layout.boundary import BoundaryReport, Violation
from app.core.layout.stages import PlanError, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import RoleMap, RoleRule
from app.core.plan import NEUTRAL_VALUES, TABLE, FieldProblem, Plan
from app.core.verdict import Reason

if TYPE_CHECKING:
    from app.core.model.parallelism import Check, ParallelConfig


@cache
def engine_options(file: str) -> frozenset[str]:
    """The option strings listed in ``app/core/data/<file>`` (:attr:`LaunchSyntax.options_file`)."""
    text = (files("app.core.data") / file).read_text()
    return frozenset(line.split("\t", 1)[0] for line in text.splitlines() if line and not line.startswith("#"))


@dataclass(frozen=True)
class MaxContext:
    """The longest context an engine serves a model with when no context is given (and the limit
    above which it refuses a stated one): ``tokens``, and how it was derived from config.json
    (``how``: "max_position_embeddings 40,960", "original_max_position_embeddings 4,096 × yarn
    factor 40")."""

    tokens: int
    how: str
    #: the context served when none is given, where it is not ``tokens`` (vLLM's LongRoPE models
    #: default to their ``original_max_position_embeddings``)
    default: int | None = None


@dataclass(frozen=True)
class LaunchSyntax:
    """How a launch of this engine looks in a shell script (the launcher reader asks the registry):
    serve programs (``vllm serve``), ``python -m`` modules, training entry points, the flags only
    this engine has, the flags naming the model (and whether it may follow the program
    positionally), and the environment variable of its layer partition."""

    programs: tuple[tuple[str, str], ...] = ()   # (program, subcommand)
    modules: tuple[str, ...] = ()
    #: entry scripts run as ``python PATH``, matched by the end of the path (``MaxText/train.py``)
    scripts: tuple[str, ...] = ()
    #: the prefix of environment variables that override a config key (MaxText ``M_<KEY>``)
    env_prefix: str | None = None
    entry_points: tuple[str, ...] = ()   # glob-style names, e.g. pretrain_*.py
    entry_needs_array: str | None = None   # an array the script must define beside the entry point
    only_flags: tuple[str, ...] = ()
    model_flags: tuple[str, ...] = ()
    positional_model: bool = False
    partition_env: str | None = None
    #: container images whose entrypoint is the engine's serve program: ``docker run ... IMAGE MODEL
    #: --flags`` passes everything after the image to it (matched without registry, tag or digest)
    images: tuple[str, ...] = ()
    #: the serve command line is parsed as vLLM's ``FlexibleArgumentParser`` parses it: ``_`` in an
    #: option's name reads as ``-``, and ``--json-arg.key value`` builds that JSON option
    flexible_args: bool = False
    #: an option naming a YAML file of further options (``--config``)
    config_flag: str | None = None
    #: the engine's reading of that file - ``(text, path) -> the options it adds`` (raises
    #: ``ValueError`` naming what the engine refuses); ``None``: not read here, so refused
    config_reader: Callable[[str, str], list[str]] | None = None
    #: the engine's flags that change how fast a step runs but that no plan field carries:
    #: ``(flag, takes a value, what the step time assumes instead)``. A launcher that sets one is
    #: imported with a warning naming it, so the time's answer never silently disagrees with the script.
    untimed_flags: tuple[tuple[str, bool, str], ...] = ()
    #: options with which the engine takes its arguments from somewhere the launcher does not show:
    #: ``(flag, the flags it needs beside it, why)``; a launch that sets one (with those) is refused
    replacing_flags: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    #: the engine's flags that change what its ranks hold in memory but that no plan field carries:
    #: ``(flag, takes a value, what the memory verdict assumes instead)``; a launcher that sets one
    #: is imported with a warning naming it
    unread_flags: tuple[tuple[str, bool, str], ...] = ()
    #: a file in ``app.core.data`` listing every option the entry point's parser accepts (one per
    #: line, first column; ``#`` comments): a trainer flag not in it is a warning (the parser stops
    #: on an unknown option). ``None``: the list is not known (slime adds its own arguments)
    options_file: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Words that mark a command as this engine's launch (programs and module roots)."""
        return tuple(dict.fromkeys([p for p, _ in self.programs] + [m.split(".")[0] for m in self.modules]
                                   + [s.split("/")[0] for s in self.scripts]))


C = TypeVar("C", bound="LayoutCheck")


def with_caller_parts(check: C, extra_errors: tuple[PlanError, ...], extra_warnings: tuple[str, ...],
                      extra: dict[str, Any] | None) -> C:
    """A check (a frozen dataclass with ``errors``, ``warnings`` and ``extra``) with what the caller
    adds (:meth:`Engine.check`): its errors and warnings first (a launcher's refusals and notes), its
    ``extra`` in the JSON (the launcher import's report)."""
    done: Any = check
    if extra_errors or extra_warnings:
        done = replace(done, errors=tuple(extra_errors) + done.errors, warnings=tuple(extra_warnings) + done.warnings)
    return replace(done, extra=extra) if extra else done


class LayoutCheck:
    """What an engine builds for one layout and whether it accepts it (one per engine kind:
    Megatron's :class:`~app.core.engines.megatron.check.CheckResult`, the serving engines'
    :class:`~app.core.engines.serving.ServingCheck`, MaxText's
    :class:`~app.core.engines.maxtext.MaxTextCheck`). Every consumer reads these members only."""

    model: ModelConfig
    roles: RoleMap
    plan: StagePlan
    boundary: BoundaryReport
    errors: tuple[PlanError, ...]
    warnings: tuple[str, ...]

    @property
    def share(self) -> ShareBehaviour:
        """What a stage starting on a shared layer does in this engine (build)."""
        raise NotImplementedError

    @property
    def blocking_violations(self) -> tuple[Violation, ...]:
        """The shared starts that block: all of them unless this engine hands the top-k over."""
        return tuple(self.boundary.violations) if self.share.blocking else ()

    @property
    def valid(self) -> bool:
        """Boundary + acceptance (``isplan check``'s ``valid``, as seed 000's checker)."""
        return not self.errors and bool(self.plan.stages) and not self.blocking_violations

    @property
    def unit(self) -> str:
        """What this engine's layout is cut into, in its words: pipeline stages (physical and virtual
        ones with VPP > 1); a serving engine's ranks, MaxText's stages of every repeat."""
        return "physical and virtual stage" if self.plan.vpp > 1 else "stage"

    @property
    def layout_text(self) -> str:
        """The layout in the engine's own spelling, one line (Megatron's layout string, a serving
        engine's partition variable, MaxText's pipeline keys); ``""`` when it has none."""
        return ""

    def boundary_holds(self, unit: str | None = None) -> str:
        """What a layout without a shared start holds of each ``unit`` (default :attr:`unit`):
        every one starts on a full indexer layer. A model without a DSA indexer has no such rule -
        no layer reuses another's top-k, every layer counts as full (:func:`app.core.model.roles.derive_roles`,
        rule ``no_indexer``), whatever its mixer (attention, Mamba, an FFN-only block) - and says that
        instead of naming indexer layers it does not have. The CLI's ``VALID`` line, the page's
        boundary line and its checks list all read this sentence."""
        unit = unit or self.unit
        if not self.model.has_indexer:
            return f"no layer reuses another's top-k (no DSA indexer), so a {unit} may start on any layer"
        return f"every {unit} starts on a full indexer layer"

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def text_lines(self) -> list[str]:
        raise NotImplementedError


@dataclass
class Judgement:
    """What an engine judges beyond the layout when the plan states its parallelism: the parallel
    configuration and its constraints, memory per pipeline rank (training or serving), stage FLOPs,
    and the blocking reasons they give (each naming the field that fixes it)."""

    parallel: ParallelConfig | None = None
    checks: list[Check] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    serving_memory: dict[str, Any] | None = None
    stage_flops: dict[str, Any] | None = None
    #: how fast the plan trains (issue 18's ``time``: step_seconds, tokens/s/GPU, MFU, breakdown,
    #: per_stage), or ``{"unavailable": reason}``; None where the engine has no time model
    time: dict[str, Any] | None = None
    blocking: list[Reason] = field(default_factory=list)
    warnings: list[Reason] = field(default_factory=list)
    problems: list[FieldProblem] = field(default_factory=list)


class Engine:
    """One engine's vocabulary and rules. Subclasses set the class attributes and override the
    methods that differ; shared behaviour lives in the base (training engines share Megatron's)."""

    name: ClassVar[str]
    label: ClassVar[str]
    #: ``training`` or ``serving``: the workflow the page and the exports offer
    workflow: ClassVar[str] = "training"
    #: the verdict kind of this engine's own refusals (``megatron`` for the Megatron family)
    acceptance_kind: ClassVar[str]
    #: how it derives full/shared roles (``None``: from its own pattern key, MaxText)
    role_rule: ClassVar[RoleRule | None] = None
    #: the plan fields this engine reads (its form on the page); the rest do not apply to it
    fields: ClassVar[frozenset[str]]
    #: the engine's own flag (or config key / env var) -> plan field: launcher import, the CLI's
    #: aliases and the names its messages use
    flags: ClassVar[Mapping[str, str]] = {}
    #: the engine's switches that set a field to one value (``--recompute-activations`` -> recompute
    #: ``selective``): launcher import and the CLI's aliases
    flag_settings: ClassVar[Mapping[str, tuple[str, Any]]] = {}
    #: field -> the value an engine command line means when it gives none of the field's flags, where
    #: the engine's default differs from the plan's neutral value (launcher import)
    absent_defaults: ClassVar[Mapping[str, Any]] = {}
    #: how a launch of this engine looks in a script (launcher import: the engine a script is written for)
    launch: ClassVar[LaunchSyntax] = LaunchSyntax()
    source: ClassVar[str] = ""
    #: whether the GPU-budget search (:mod:`app.core.optimise.search`, Megatron's constraints and
    #: memory) plans jobs of this engine
    budget_search: ClassVar[bool] = False
    #: whether the engine has parallel constraints and a memory model to judge at all (MaxText: not here)
    judges_parallelism: ClassVar[bool] = True
    #: whether memory is judged for every plan of this engine (serving: a partition is offered as GO
    #: only when it fits), beside :attr:`Plan.given_parallelism`
    judges_memory_always: ClassVar[bool] = False

    # -------------------------------------------------------------------- vocabulary
    def launch_pipeline(self, values: Mapping[str, str], at: Any, plan: Plan, cfg: ModelConfig
                        ) -> tuple[Plan, list[PlanError]]:
        """A launch script's pipeline flags that no single plan field carries (``values``: flag ->
        value as the script gives it; ``at(flag)``: its file:line), applied to the ``plan`` read
        from its other flags, with the refusals they carry. None by default."""
        return plan, []

    def launch_precision(self, values: Mapping[str, str]) -> tuple[str | None, str | None]:
        """The plan's precision from a trainer line's flags (``values``: flag -> value, every flag of
        the line), or ``(None, why not)`` for a precision the planner does not model; ``(None, None)``
        when the line states none or the engine has no precision setting."""
        return None, None

    def ignored(self, plan: Plan) -> list[str]:
        """Fields the plan sets (to a non-neutral value) that this engine does not read."""
        return [n for n in TABLE if n not in self.fields and getattr(plan, n) != NEUTRAL_VALUES[n]
                and n not in ("parallel", "mode", "conv")]

    def field_of_flag(self, flag: str | None) -> str | None:
        """The plan field an engine flag (as an error names it) stands for."""
        if not flag:
            return None
        if flag in self.flags:
            return self.flags[flag]
        if flag in self.flag_settings:
            return self.flag_settings[flag][0]
        return next((n for n, s in TABLE.items() if s.cli == flag), None)

    def max_context(self, cfg: ModelConfig) -> MaxContext | None:
        """The model's maximum context as this engine derives it from config.json; ``None`` when
        the file states none. Training engines take ``max_position_embeddings`` (the default of
        ``context``, which only the per-token FLOPs read there); the serving engines derive it by
        their own rule (rope scaling included) and refuse a longer stated context. Raises
        ``ValueError`` naming a key it cannot read."""
        n = cfg.max_position_embeddings
        return MaxContext(n, f"max_position_embeddings {n:,}") if n else None

    def context(self, cfg: ModelConfig, plan: Plan) -> int:
        """The plan's context: the one it states, else the model's maximum (:meth:`max_context`).
        Raises ``ValueError`` (a message for the ``context`` field) when neither is known."""
        if plan.context is not None:
            return plan.context
        limit = self.max_context(cfg)
        if limit is None:
            raise ValueError(f"{cfg.id}'s config.json states no maximum context (max_position_embeddings or a like "
                             "key), and isplan does not know its config class's default: give the context")
        return limit.tokens if limit.default is None else limit.default

    def layout_field(self, plan: Plan) -> str:
        """The field that describes the layout (where a shared start is fixed)."""
        return {"split": "split", "layout": "layout"}.get(plan.mode, "pp")

    # -------------------------------------------------------------------- rules
    def roles(self, cfg: ModelConfig, plan: Plan) -> tuple[RoleMap, list[int]]:
        """The roles this engine runs for ``plan``, and the layers where they differ from the
        checkpoint's (``PatternError`` / ``EngineInputError`` for unusable settings)."""
        raise NotImplementedError

    def check(self, cfg: ModelConfig, plan: Plan, *, extra_errors: tuple[PlanError, ...] = (),
              extra_warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> LayoutCheck:
        """Stage placement, the engine's acceptance rules and the boundary rule for ``plan``
        (``LayoutInputError`` / ``EngineInputError`` / ``PatternError`` for unusable input)."""
        raise NotImplementedError

    def check_roles(self, cfg: ModelConfig, plan: Plan) -> RoleMap:
        """The roles the boundary rule is judged with (what the engine builds and runs)."""
        return self.roles(cfg, plan)[0]

    def conversion(self, cfg: ModelConfig, plan: Plan) -> LayoutCheck | None:
        """The plan's second layout slot (checkpoint conversion), where the engine has one."""
        return None

    def model_reasons(self, cfg: ModelConfig, plan: Plan) -> list[Reason]:
        """Where the model the plan's engine flags build differs from the config (beyond the shape
        fields every engine compares, ``app.core.evaluate.SHAPE_FIELDS``): the engine's own reading
        of its model flags."""
        return []

    def judge(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck) -> Judgement:
        """Parallel constraints and memory of a plan whose layout was built (``check``)."""
        return Judgement()

    def gpu_line(self, plan: Plan, check: LayoutCheck | None) -> str | None:
        """The GPUs a job of this plan occupies, in words, for an engine that does not count them
        through training's parallel settings (``TP x CP x PP x DP``,
        :func:`app.core.reports.gpu_equation`): a server's GPUs, or why the count is not judged.
        ``None``: nothing beyond that equation."""
        return None

    def exports(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement,
                conversion: LayoutCheck | None = None) -> dict[str, str]:
        """Launch text for an accepted plan, by name (every value shell-quoted); ``{}`` otherwise."""
        return {}

    def timeline(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement) -> dict[str, Any]:
        """The simulated pipeline schedule of a judged plan: columns rank, chunk, microbatch, kind
        (F/B), start, end - every micro-batch's forward and backward on every (pp_rank, vp_stage), for
        the schedule figure; ``{}`` without a time model."""
        return {}

    def full_time(self, cfg: ModelConfig, plan: Plan, check: LayoutCheck, judgement: Judgement) -> dict[str, Any] | None:
        """The step time when asked for it (``isplan time``): it may simulate more than the time
        computed with every verdict."""
        return judgement.time

    # -------------------------------------------------------------------- plans
    def profile(self, cfg: ModelConfig, plan: Plan) -> Plan:
        """The recommended starting plan for ``cfg`` on this engine (``plan`` carries the model id,
        the GPU and anything else the caller wants kept); found by the planner unless the engine
        pins one (slime's GLM-5.2 launcher)."""
        raise NotImplementedError

    def best_layouts(self, cfg: ModelConfig, plan: Plan, *, objective: str, top: int) -> list[Plan]:
        """The best valid layouts for the plan's pipeline size, best first, as plans."""
        raise NotImplementedError

    def layout_report(self, cfg: ModelConfig, plan: Plan, *, objective: str, top: int) -> tuple[dict[str, Any], list[Plan]]:
        """``isplan plan``'s engine-specific body (the search's costs and counts; ``best`` and
        ``alternatives`` entries) and the plans those entries stand for, in the same order."""
        plans = self.best_layouts(cfg, plan, objective=objective, top=top)
        entries = [{"split": list(p.split or ())} for p in plans]
        return {"best": entries[0] if entries else None, "alternatives": entries[1:]}, plans

    def nearest(self, cfg: ModelConfig, plan: Plan) -> Plan | None:
        """The valid layout that moves the fewest layers from the plan's stages, as a plan."""
        return None
