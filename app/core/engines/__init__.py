"""Every engine isplan models, one module each, behind one protocol (:mod:`.base`).

* training: :mod:`.megatron` (Megatron-Core), :mod:`.slime` (Megatron + slime's flags and role rule),
  :mod:`.hf` (Megatron's placement with the checkpoint's own transformers roles), :mod:`.maxtext`;
* serving: :mod:`.vllm`, :mod:`.sglang` (what they share: :mod:`.serving`).

:data:`ENGINES` is the registry; :func:`engine_for` is how everything outside this package reaches an
engine's rules (nothing outside it branches on an engine's name).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.core.engines import hf, maxtext, megatron, sglang, slime, vllm
from app.core.engines.base import Engine, Judgement, LayoutCheck
from app.core.engines.rules import EngineInputError
from app.core.model.roles import RoleRule
from app.core.plan import ENGINES as ENGINE_NAMES
from app.core.plan import TABLE, Plan

ENGINES: dict[str, Engine] = {e.name: e for e in (megatron.ENGINE, slime.ENGINE, hf.ENGINE, vllm.ENGINE_OBJECT,
                                                  sglang.ENGINE_OBJECT, maxtext.ENGINE_OBJECT)}
assert tuple(ENGINES) == ENGINE_NAMES, "the plan table's engine choices and the registry must agree"


#: the plan of an empty page query: slime's pinned GLM-5.2 launcher (the project's reference job)
DEFAULT_PLAN: Plan = slime.SLIME_GLM52_PROFILE


def engine_for(name: str | Plan) -> Engine:
    """The engine of ``name`` (or of a plan); :class:`EngineInputError` naming the choices."""
    key = name.engine if isinstance(name, Plan) else str(name).strip().lower()
    found = ENGINES.get(key)
    if found is None:
        raise EngineInputError(f"--engine {str(key)[:40]!r} is not an engine isplan knows; use one of "
                               f"{', '.join(ENGINES)}")
    return found


def role_rules() -> tuple[RoleRule, ...]:
    """Each distinct freq/offset reading (one per engine that has its own)."""
    out: list[RoleRule] = []
    for e in ENGINES.values():
        if e.role_rule is not None and e.role_rule not in out:
            out.append(e.role_rule)
    return tuple(out)


def role_rule(name: str) -> RoleRule:
    rule = engine_for(name).role_rule
    if rule is None:
        raise EngineInputError(f"engine {name} derives roles from its own pattern, not a freq/offset rule")
    return rule


def ignored_fields(plan: Plan) -> list[str]:
    """The fields ``plan`` sets that its engine does not read (``[]`` for an unknown engine)."""
    engine = ENGINES.get(plan.engine)
    return engine.ignored(plan) if engine is not None else []


def cli_aliases() -> dict[str, list[str]]:
    """field -> every engine's own ``--flag`` for it, as launchers spell them (the CLI accepts them)."""
    out: dict[str, list[str]] = {}
    own = {s.cli for s in TABLE.values() if s.cli}
    for e in ENGINES.values():
        for flag, name in e.flags.items():
            if flag.startswith("--") and flag not in own and flag not in out.setdefault(name, []):
                out[name].append(flag)
    return out


def cli_settings() -> dict[str, list[tuple[str, Any]]]:
    """field -> every engine's switch that sets it to a value (``--recompute-activations`` ->
    recompute selective), as the CLI accepts them."""
    out: dict[str, list[tuple[str, Any]]] = {}
    own = {s.cli for s in TABLE.values() if s.cli}
    for e in ENGINES.values():
        for flag, (name, value) in e.flag_settings.items():
            if flag not in own and all(f != flag for f, _ in out.get(name, [])):
                out.setdefault(name, []).append((flag, value))
    return out


def flag_settings(names: Iterable[str] | None = None) -> dict[str, tuple[str, Any]]:
    """Engine switch -> (plan field, value), over the named engines (default: the training engines)."""
    chosen = [ENGINES[n] for n in names] if names is not None else [
        e for e in ENGINES.values() if e.workflow == "training"]
    out: dict[str, tuple[str, Any]] = {}
    for e in chosen:
        for flag, setting in e.flag_settings.items():
            out.setdefault(flag, setting)
    return out


def flag_vocabulary(names: Iterable[str] | None = None) -> dict[str, str]:
    """Engine flag -> plan field, over the named engines (default: the training engines), for
    reading a launcher's command line."""
    chosen = [ENGINES[n] for n in names] if names is not None else [
        e for e in ENGINES.values() if e.workflow == "training"]
    out: dict[str, str] = {}
    for e in chosen:
        for flag, name in e.flags.items():
            if flag.startswith("--"):
                out.setdefault(flag, name)
    return out


__all__ = ["DEFAULT_PLAN", "ENGINES", "Engine", "EngineInputError", "Judgement", "LayoutCheck", "cli_aliases",
           "cli_settings", "engine_for", "flag_settings", "flag_vocabulary", "ignored_fields", "role_rule", "role_rules"]
