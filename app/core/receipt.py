"""Receipts: a verifiable JSON record of a release-gate check, and its verifier.

A receipt follows seed 000's release-gate table - model source (repository + immutable revision),
config integrity (SHA-256, one ``indexer_types`` entry per layer), engine source (commit), the exact
per-stage layer arrays, the boundary result for every stage, and the hardware canary (which this
tool cannot run and says so). It records the tool version, the model id, both config digests, the
provenance, the role semantics, the inputs of every named layout (e.g. ``conversion`` and
``training``, each validated on its own), every stage record (start, role, source), the checks and
their results, a UTC timestamp, and ``body_sha256``: the SHA-256 of the canonical JSON
(``sort_keys``, minified, UTF-8) of every other field.

A model revision or engine commit counts as pinned only when it is a full 40-hex git commit; a
branch or tag can move. Without both, the receipt is marked ``unpinned`` with a warning.

:func:`verify_receipt` recomputes everything from the recorded inputs and the config, and names
every difference: an edited stage, a changed or different config, a wrong digest. Every recorded
verdict is recomputed (issue 20, findings 9-11): the plan's (its recorded URL query through the one
plan parser; whether parallelism is judged follows from that query, as it does when the receipt is
written) and the top-level one (the plan's plus every extra named layout's), and a verdict without
the plan it belongs to is a difference. The plan's own layouts must be the ones its query gives.
Recorded and recomputed values are compared as canonical JSON, so ``1`` is not ``true`` and
``78.0`` is not ``78``; a receipt that repeats a key is refused, as a config that does is
(:func:`app.core.model.config.parse_json_bytes`). The config is identified by its digests
(SHA-256 of the bytes and of the canonical JSON), never by a description: the model source
check's repository name is the receipt's own record.

What the digests prove. ``body_sha256`` is an *unkeyed* hash: it proves content integrity (the
receipt was not damaged or edited by someone who did not recompute it), never authorship - anyone
can edit a field and recompute it. Every recorded result is recomputed on verification, so an
edited stage, check or verdict is still caught; what an unkeyed hash cannot protect are free-text
fields (label, upstream repo, warnings, timestamp). When the operator configures a secret
(``ISPLAN_RECEIPT_KEY``), receipts also carry ``body_hmac_sha256`` = HMAC-SHA-256 of the same
canonical body under that key; a verifier holding the key then checks it (a missing or wrong HMAC
is a difference), which proves the receipt came from a holder of the key and was not edited.

What verification may read. A receipt never names a file on the verifying machine: the config
is a shipped preset, a content-addressed upload (``sha256:<hex>``, looked up by the caller and
passed in as ``config``) or a config the CLI user passes explicitly (``--config PATH``, the
operator's own argument). A receipt whose model source is ``path`` is refused with a message
unless the caller passes the config. Every count in it is checked against
:mod:`app.core.plan.bounds` before any layout is materialised, so verification work is bounded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from app import __version__
from app import settings as app_settings
from app.core.engines.megatron.check import run_check
from app.core.layout.stages import LayoutInputError, PipelineSpec
from app.core.model.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ModelConfig,
    load_config_bytes,
    load_preset,
    preset_ids,
)
from app.core.model.roles import PatternError
from app.core.plan import ENGINES, bounds
from app.core.plan.bounds import BoundError, check_count
from app.core.verdict import Reason, Verdict, verdict_of

RECEIPT_VERSION = 1
#: Differences listed in one report (the count in the summary is always the full one).
MAX_DIFFERENCES = 200
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SPEC_FIELDS = set(PipelineSpec.__dataclass_fields__)


class ReceiptError(ValueError):
    """A receipt that cannot be verified at all (wrong shape, missing config): exit code 2."""


def is_immutable(rev: str | None) -> bool:
    return bool(rev) and bool(_COMMIT.match(rev.lower()))  # type: ignore[union-attr]


DIGEST_FIELDS = ("body_sha256", "body_hmac_sha256")
KEY_ENV = "ISPLAN_RECEIPT_KEY"


def _canonical_body(receipt: dict[str, Any]) -> bytes:
    """Canonical JSON (``sort_keys``, minified, UTF-8) of every field except the digests."""
    body = {k: v for k, v in receipt.items() if k not in DIGEST_FIELDS}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a hostile receipt may carry lone surrogates; it must still hash (and differ)
    return text.encode("utf-8", "surrogatepass")


def canonical_body_digest(receipt: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical_body(receipt)).hexdigest()


def body_hmac(receipt: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA-256 of the canonical body under ``key`` (RFC 2104, :mod:`hmac`)."""
    return hmac.new(key, _canonical_body(receipt), hashlib.sha256).hexdigest()


def configured_key() -> bytes | None:
    """The signing key from ``ISPLAN_RECEIPT_KEY`` (UTF-8), or None when unset or empty."""
    value = app_settings.Settings.from_env(only=("receipt_key",)).receipt_key
    return value.encode("utf-8", "surrogateescape") if value else None


LayoutInput = tuple[str, PipelineSpec, "int | None", "int | None", "tuple[str, ...]"]


def _layout_entry(cfg: ModelConfig, name: str, spec: PipelineSpec, freq: int | None, offset: int | None,
                  warnings: Iterable[str], engine: str, pattern: str | None) -> dict[str, Any]:
    result = run_check(cfg, spec, engine, pattern=pattern, freq=freq, offset=offset,
                       extra_warnings=tuple(warnings))
    body = result.to_json()
    return {
        "name": name,
        "inputs": spec.to_dict(),
        "dsa_indexer_topk_freq": freq,
        "dsa_indexer_skip_topk_offset": offset,
        "valid": body["valid"],
        "pp": body["pp"],
        "vpp": body["vpp"],
        "stage_sizes": [s["num_layers"] for s in body["stages"]],
        "stages": body["stages"],
        "violations": body["violations"],
        "errors": body["errors"],
        "warnings": body["warnings"],
        "megatron_flags": body["megatron_flags"],
        "layout_string": body["layout_string"],
    }


def _checks(cfg: ModelConfig, model_revision: str | None, engine_commit: str | None,
            layouts: list[dict[str, Any]], upstream_repo: str | None = None) -> list[dict[str, Any]]:
    """The release-gate checks; ``upstream_repo`` (default the config's) only names the model's
    repository in the model source check's text."""
    checks: list[dict[str, Any]] = []
    repo = (upstream_repo if upstream_repo is not None else cfg.upstream_repo) or "(user-supplied file)"
    checks.append({
        "name": "model_source",
        "result": "pass" if is_immutable(model_revision) else "warn",
        "detail": (f"{repo} at revision {model_revision}" if is_immutable(model_revision)
                   else f"{repo}: no immutable revision (40-hex commit) recorded"
                   + (f"; {model_revision!r} can move" if model_revision else "")),
    })
    if cfg.indexer_types is not None:
        ok = len(cfg.indexer_types) == cfg.num_hidden_layers
        integrity = {"result": "pass" if ok else "fail",
                     "detail": f"sha256 {cfg.sha256}; indexer_types has {len(cfg.indexer_types)} entries "
                               f"for {cfg.num_hidden_layers} layers"}
    else:
        integrity = {"result": "pass",
                     "detail": f"sha256 {cfg.sha256}; no indexer_types array, roles follow the freq/offset rule"}
    checks.append({"name": "config_integrity", **integrity})
    checks.append({
        "name": "engine_source",
        "result": "pass" if is_immutable(engine_commit) else "warn",
        "detail": (f"engine commit {engine_commit}" if is_immutable(engine_commit)
                   else "no immutable engine commit (40-hex) recorded"
                   + (f"; {engine_commit!r} can move" if engine_commit else "")),
    })
    for lay in layouts:
        total = sum(lay["stage_sizes"])
        checks.append({
            "name": f"pipeline_layout:{lay['name']}",
            "result": "pass" if total == cfg.num_hidden_layers and not lay["errors"] and lay["stages"] else "fail",
            "detail": f"stage sizes {lay['stage_sizes']} total {total} of {cfg.num_hidden_layers}"
                      + (f"; {len(lay['errors'])} acceptance error(s)" if lay["errors"] else ""),
        })
        checks.append({
            "name": f"boundary:{lay['name']}",
            "result": "pass" if not lay["violations"] and lay["stages"] else "fail",
            "detail": (f"every one of {len(lay['stages'])} stages starts on a full layer" if not lay["violations"]
                       else "; ".join(v["short"] for v in lay["violations"])),
        })
    checks.append({"name": "hardware_canary", "result": "not_checked",
                   "detail": "run the smallest representative launch; this tool does not run GPUs"})
    return checks


def receipt_verdict(plan_verdict: Verdict, extra_layouts: list[dict[str, Any]]) -> Verdict:
    """A receipt's whole go / no-go: the plan's verdict, and every extra named layout's boundary
    violations and acceptance errors (a named layout blocks the launch like the plan's own). One
    rule for writing (:func:`build_receipt`) and verifying (:func:`verify_receipt`)."""
    blocking = list(plan_verdict.blocking)
    for lay in extra_layouts:
        name = lay["name"]
        blocking += [Reason("boundary", "shared_start", f"{name} layout: {v['message']}", None)
                     for v in lay["violations"]]
        # a layout error is Megatron's refusal (receipts record Megatron-family layouts) or the model's
        blocking += [Reason("model" if e["kind"] == "model" else "megatron", e["code"], f"{name} layout: {e['message']}",
                            None) for e in lay["errors"]]
    return verdict_of(blocking, plan_verdict.warnings, judged=plan_verdict.judged)


def verdict_from_dict(d: dict[str, Any]) -> Verdict:
    """The :class:`Verdict` of :meth:`Verdict.to_dict` (for a verdict isplan computed itself)."""
    return Verdict(tuple(Reason(**r) for r in d["blocking"]), tuple(Reason(**r) for r in d["warnings"]),
                   tuple(d.get("judged", ("layout",))))


def _model_record(cfg: ModelConfig, model_revision: str | None) -> dict[str, Any]:
    """The model as a receipt records it: its id and description, both digests, provenance,
    layer count and revision (pinned when a full 40-hex commit)."""
    return {
        "id": cfg.id,
        "label": cfg.label,
        "source": cfg.source,
        "sha256": cfg.sha256,
        "canonical_sha256": cfg.canonical_sha256,
        "provenance": cfg.provenance,
        "upstream_repo": cfg.upstream_repo,
        "num_layers": cfg.num_hidden_layers,
        "revision": model_revision,
        "revision_pinned": is_immutable(model_revision),
    }


def _unpinned_warnings(model_revision: str | None, engine_commit: str | None) -> list[str]:
    """The warning of a receipt without an immutable model revision or engine commit, naming which."""
    missing = [w for w, ok in (("model revision", is_immutable(model_revision)),
                               ("engine commit", is_immutable(engine_commit))) if not ok]
    if not missing:
        return []
    return [f"unpinned: no immutable {' or '.join(missing)}; pass --model-revision / "
            "--engine-commit with full 40-hex commits"]


def build_receipt(
    cfg: ModelConfig,
    layouts: list[LayoutInput],
    *,
    engine: str = "megatron",
    pattern: str | None = None,
    model_revision: str | None = None,
    engine_commit: str | None = None,
    created_utc: str | None = None,
    key: bytes | None = None,
    plan: dict[str, Any] | None = None,
    plan_layouts: int = 1,
) -> dict[str, Any]:
    """The receipt of ``layouts`` over ``cfg``; signed with ``key`` (default: ``ISPLAN_RECEIPT_KEY``)
    when one is configured. ``plan`` (``{"query", "parallel", "verdict"}``: the plan's canonical
    URL query and its verdict) is recorded with the top-level ``verdict``
    (:func:`receipt_verdict`: the plan's and the named layouts' after the first ``plan_layouts``,
    which are the plan's own); :func:`verify_receipt` recomputes both."""
    entries = [_layout_entry(cfg, name, spec, freq, offset, warns, engine, pattern)
               for name, spec, freq, offset, warns in layouts]
    checks = _checks(cfg, model_revision, engine_commit, entries)
    pinned = is_immutable(model_revision) and is_immutable(engine_commit)
    receipt: dict[str, Any] = {
        "receipt_version": RECEIPT_VERSION,
        "tool": {"name": "isplan", "version": __version__},
        "created_utc": created_utc or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": _model_record(cfg, model_revision),
        "engine": {"semantics": engine, "commit": engine_commit, "commit_pinned": is_immutable(engine_commit)},
        "pattern": pattern,
        "layouts": entries,
        "checks": checks,
        "valid": all(e["valid"] for e in entries) and not any(c["result"] == "fail" for c in checks),
        "unpinned": not pinned,
        "warnings": _unpinned_warnings(model_revision, engine_commit),
    }
    if plan is not None:
        receipt["plan"] = plan
        receipt["verdict"] = receipt_verdict(verdict_from_dict(plan["verdict"]), entries[plan_layouts:]).to_dict()
    receipt["body_sha256"] = canonical_body_digest(receipt)
    key = key if key is not None else configured_key()
    if key:
        receipt["body_hmac_sha256"] = body_hmac(receipt, key)
    return receipt


# --------------------------------------------------------------------------- verification


def _require(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
        raise ReceiptError(f"receipt field {where}{key} is missing or not a {kind.__name__}")
    return obj[key]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (the last of two equal keys would win silently,
    so an edit could hide behind an honest value that a reader sees first)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ReceiptError(f"the receipt repeats the key {_short(key, 60)} in one object; isplan never writes "
                               "such a receipt")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ReceiptError(f"the receipt contains {name}, which is not valid JSON")


def load_receipt_bytes(data: bytes | str) -> Any:
    """Parse a receipt's JSON text, bounded: at most :data:`bounds.MAX_RECEIPT_BYTES` and
    :data:`bounds.MAX_RECEIPT_DEPTH` levels of nesting, no repeated key in an object, no
    ``NaN``/``Infinity``. Raises :class:`ReceiptError` (one line)."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > bounds.MAX_RECEIPT_BYTES:
        raise ReceiptError(f"the receipt is {size:,} bytes; the limit is {bounds.MAX_RECEIPT_BYTES:,} bytes")
    try:
        value = json.loads(data, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except ReceiptError:
        raise
    except RecursionError:
        raise ReceiptError(f"the receipt nests deeper than {bounds.MAX_RECEIPT_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ReceiptError(f"the receipt is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # UnicodeDecodeError, an integer over Python's digit limit
        raise ReceiptError(f"the receipt cannot be read as JSON: {str(exc)[:160]}") from None
    stack = [(value, 1)]
    while stack:  # iterative: no recursion on hostile input
        node, depth = stack.pop()
        if depth > bounds.MAX_RECEIPT_DEPTH:
            raise ReceiptError(f"the receipt nests deeper than {bounds.MAX_RECEIPT_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children)
    return value


def _load_for_verify(model: dict[str, Any], config_path: str | None) -> ModelConfig:
    """The config named by the receipt: a shipped preset only. A path is never opened and an
    upload is the caller's lookup (``config=``); ``config_path`` is the CLI user's own
    ``--config`` argument, never a value from the receipt."""
    if config_path is not None:
        from app.core.inputs import InputError, read_bounded

        try:
            data = read_bounded(config_path, limit=MAX_CONFIG_BYTES, what="--config")
        except InputError as exc:
            raise ReceiptError(str(exc)) from None
        recorded = model.get("source")
        kind = recorded if isinstance(recorded, str) and recorded in ("preset", "path", "upload") else "path"
        return load_config_bytes(data, id=model.get("id") or config_path, source=kind)
    source, mid = model.get("source"), model.get("id")
    if source == "preset":
        if mid not in preset_ids():
            raise ReceiptError(f"the receipt names preset {_short(mid, 80)}, which this isplan does not ship; "
                               "pass the config explicitly (CLI: --config PATH)")
        return load_preset(mid)
    if source == "path":
        raise ReceiptError(f"the receipt's model source is a file path ({_short(mid, 80)}); a receipt never "
                           "makes isplan open a path: pass the config explicitly (CLI: --config PATH) or "
                           "upload it and verify a receipt written for its sha256: id")
    if isinstance(mid, str) and mid.startswith("sha256:"):
        raise ReceiptError(f"the uploaded config {_short(mid, 80)} is not stored here; upload that config.json "
                           "first (or pass --config PATH to the CLI)")
    raise ReceiptError(f"the receipt's model source {_short(source, 40)} is not a preset or an upload; "
                       "pass the config explicitly (CLI: --config PATH)")


_INT_INPUTS = {"pp": bounds.MAX_PP, "vpp": bounds.MAX_VPP, "layers_per_vstage": bounds.MAX_STAGE_LAYERS,
               "first": bounds.MAX_STAGE_LAYERS, "last": bounds.MAX_STAGE_LAYERS,
               "mtp_layers": bounds.MAX_MTP_LAYERS}
_BOOL_INPUTS = ("account_for_embedding", "account_for_loss", "overlap_p2p")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bounded_int(value: Any, field: str, bound: int, where: str) -> int:
    if not _is_int(value):
        raise ReceiptError(f"{where}{field} must be a whole number or null, got {_short(value, 40)}")
    try:
        return check_count(field, value, bound, where=where)
    except BoundError as exc:
        raise ReceiptError(f"{exc}; isplan never writes such a receipt") from None


def _spec_from(inputs: dict[str, Any], where: str) -> PipelineSpec:
    """The recorded inputs as a :class:`PipelineSpec`, each field type-checked and bounded
    (:mod:`app.core.plan.bounds`) before anything is materialised."""
    kwargs = {k: v for k, v in inputs.items() if k in _SPEC_FIELDS}
    for k, bound in _INT_INPUTS.items():
        if kwargs.get(k) is not None:
            _bounded_int(kwargs[k], k, bound, f"{where}.inputs.")
    for k in _BOOL_INPUTS:
        if k in kwargs and not isinstance(kwargs[k], bool):
            raise ReceiptError(f"{where}.inputs.{k} must be true or false")
    layout = kwargs.get("layout")
    if layout is not None and (not isinstance(layout, str) or len(layout) > bounds.MAX_LAYOUT_CHARS):
        raise ReceiptError(f"{where}.inputs.layout must be a string of at most {bounds.MAX_LAYOUT_CHARS:,} "
                           "characters, or null")
    split = kwargs.get("split")
    if split is not None:
        if not isinstance(split, list) or len(split) > bounds.MAX_STAGES:
            raise ReceiptError(f"{where}.inputs.split must be a list of at most {bounds.MAX_STAGES:,} "
                               "whole numbers, or null")
        for i, size in enumerate(split):
            _bounded_int(size, f"split[{i}]", bounds.MAX_STAGE_LAYERS, f"{where}.inputs.")
        kwargs["split"] = tuple(split)
    return PipelineSpec(**kwargs)


LayoutRequest = tuple[str, PipelineSpec, "int | None", "int | None"]


def _layout_requests(layouts: list[Any]) -> list[LayoutRequest]:
    """Every recorded layout's name and inputs, checked and bounded before any work."""
    if len(layouts) > bounds.MAX_RECEIPT_LAYOUTS:
        raise ReceiptError(f"the receipt has {len(layouts):,} layouts; the limit is {bounds.MAX_RECEIPT_LAYOUTS}")
    out: list[LayoutRequest] = []
    for k, lay in enumerate(layouts):
        if not isinstance(lay, dict) or not isinstance(lay.get("inputs"), dict):
            raise ReceiptError(f"layouts[{k}] has no inputs object")
        name = lay.get("name", f"#{k}")
        if not isinstance(name, str) or len(name) > 200:
            raise ReceiptError(f"layouts[{k}].name must be a string of at most 200 characters")
        spec = _spec_from(lay["inputs"], f"layouts[{k}]")
        freq_offset = []
        for key in ("dsa_indexer_topk_freq", "dsa_indexer_skip_topk_offset"):
            value = lay.get(key)
            freq_offset.append(None if value is None else
                               _bounded_int(value, key, bounds.MAX_LAYERS, f"layouts[{k}]."))
        stages = lay.get("stages")
        if isinstance(stages, list) and len(stages) > bounds.MAX_STAGES:
            raise ReceiptError(f"layouts[{k}].stages has {len(stages):,} records; the limit is {bounds.MAX_STAGES:,}")
        out.append((name, spec, freq_offset[0], freq_offset[1]))
    return out


def _signature_findings(receipt: dict[str, Any], key: bytes | None) -> tuple[list[str], list[str]]:
    """(differences, notes) about ``body_sha256`` and, with a key, ``body_hmac_sha256``."""
    differences: list[str] = []
    notes: list[str] = []
    recorded_body = receipt.get("body_sha256")
    actual_body = canonical_body_digest(receipt)
    if recorded_body != actual_body:
        differences.append(f"body_sha256 is {_short(recorded_body, 80)} but the body hashes to {actual_body}: "
                           "the receipt was edited after it was written")
    recorded_mac = receipt.get("body_hmac_sha256")
    if key:
        if recorded_mac is None:
            differences.append(f"body_hmac_sha256 is missing: this server signs receipts ({KEY_ENV} is set) "
                               "and this one is unsigned, so its author is unknown")
        elif not isinstance(recorded_mac, str) or not hmac.compare_digest(recorded_mac, body_hmac(receipt, key)):
            differences.append("body_hmac_sha256 does not match: the receipt was edited or signed with another key")
    elif recorded_mac is not None:
        notes.append(f"the receipt is signed (body_hmac_sha256) but no {KEY_ENV} is configured here: "
                     "its author was not checked")
    return differences, notes


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _same(recorded: Any, fresh: Any) -> bool:
    """Equal as JSON values of the same types (canonical JSON): ``1`` is not ``true``, ``78.0``
    is not ``78``, ``"8"`` is not ``8`` - Python's ``==`` says all three are equal."""
    return _canon(recorded) == _canon(fresh)


def _plan_record(receipt: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """(differences, the plan record) - a top-level verdict without the plan it belongs to is a
    difference; so is a plan record of the wrong shape."""
    record = receipt.get("plan")
    if record is None:
        if "verdict" in receipt:
            return ["verdict: the receipt records a verdict but not the plan it belongs to (no 'plan' record), so "
                    "the verdict cannot be recomputed"], None
        return [], None
    if not isinstance(record, dict) or not isinstance(record.get("query"), str) or len(record["query"]) > 100_000:
        return ["plan: the receipt's plan record is not {query: str, parallel: bool, verdict: {...}}"], None
    return [], record


def _plan_differences(record: dict[str, Any], receipt: dict[str, Any], cfg: ModelConfig, engine: str,
                      pattern: str | None, fresh_layouts: list[dict[str, Any]] | None) -> tuple[list[str], Any]:
    """Re-evaluate the recorded plan (its URL query, through the one plan parser) and compare every
    verdict the receipt records; ``fresh_layouts`` are the recomputed layouts (None when some did
    not materialise). Returns the differences and the recomputed top-level verdict (or None)."""
    from urllib.parse import parse_qsl

    from app.core.engines.megatron import conversion_spec, pipeline_spec
    from app.core.evaluate import evaluate
    from app.core.plan import PlanError, strict_plan

    params = dict(parse_qsl(record["query"], keep_blank_values=True))
    # a receipt made by the CLI names its config by path, of any length (``isplan receipt PATH``);
    # the query parser bounds a URL's model (a preset id or sha256:...), so the model is set aside,
    # the rest parsed, and the model compared with the receipt's model.id below
    model = params.pop("model", None)
    try:
        plan = strict_plan(params)
    except PlanError as exc:
        return [f"plan: the recorded query no longer parses: {exc}"], None
    if model is not None:
        plan = replace(plan, model=model)
    out = [f"plan query {name}: {_short(got, 80)} but the receipt's {where} is {_short(want, 80)}"
           for name, got, want, where in (("model", plan.model, (receipt.get("model") or {}).get("id"), "model.id"),
                                          ("engine", plan.engine, engine, "engine.semantics"),
                                          ("pattern", plan.pattern, pattern, "pattern")) if not _same(got, want)]
    ev = evaluate(plan, cfg)
    parallel = ev.judged  # the one rule of what is judged (app.core.evaluate)
    if not _same(record.get("parallel"), parallel):
        out.append(f"plan parallel: receipt has {_short(record.get('parallel'), 40)}, but its query "
                   f"{'states' if parallel else 'does not state'} parallelism ({parallel})")
    if ev.problems:
        return out + ["plan: the recorded query cannot be evaluated: " + "; ".join(p.message for p in ev.problems)], None
    fresh = ev.verdict.to_dict()
    if not _same(record.get("verdict"), fresh):
        out.append(f"plan verdict: receipt has {_short(record.get('verdict'))}, recomputed {_short(fresh)}")
    own = [pipeline_spec(plan)] + [spec for spec in (conversion_spec(plan),) if spec is not None]
    layouts = receipt["layouts"]
    for k, spec in enumerate(own):
        lay = layouts[k] if k < len(layouts) and isinstance(layouts[k], dict) else {}
        want = {"inputs": spec.to_dict(), "dsa_indexer_topk_freq": plan.dsa_topk_freq,
                "dsa_indexer_skip_topk_offset": plan.dsa_skip_topk_offset}
        if not _same({f: lay.get(f) for f in want}, want):
            out.append(f"layouts[{k}] is not the {'conversion layout' if k else 'layout'} of the recorded plan query "
                       f"(inputs {_short(lay.get('inputs'), 120)}, the query gives {_short(spec.to_dict(), 120)})")
    if fresh_layouts is None:
        return out, None
    top = receipt_verdict(ev.verdict, fresh_layouts[len(own):]).to_dict()
    if not _same(receipt.get("verdict"), top):
        out.append(f"verdict: receipt has {_short(receipt.get('verdict'))}, recomputed {_short(top)} (the plan's and "
                   "every named layout's)")
    return out, top


def _check_shape(receipt: Any) -> tuple[dict[str, Any], list[Any], str, str | None]:
    """(model, layouts, engine, pattern) once every field verification reads has its type and bound."""
    if not isinstance(receipt, dict):
        raise ReceiptError("a receipt is a JSON object")
    model = _require(receipt, "model", dict, "")
    layouts = _require(receipt, "layouts", list, "")
    eng = receipt.get("engine")
    engine = eng.get("semantics") if isinstance(eng, dict) else None
    if engine not in ENGINES:
        raise ReceiptError(f"receipt field engine.semantics must be one of {list(ENGINES)}, got {_short(engine, 40)}")
    pattern = receipt.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or len(pattern) > bounds.MAX_PATTERN_CHARS):
        raise ReceiptError(f"receipt field pattern must be a string of at most {bounds.MAX_PATTERN_CHARS:,} "
                           "characters, or null")
    assert isinstance(eng, dict)
    for name, value in (("model.revision", model.get("revision")), ("engine.commit", eng.get("commit")),
                        ("model.id", model.get("id")), ("model.upstream_repo", model.get("upstream_repo"))):
        if value is not None and (not isinstance(value, str) or len(value) > 1000):
            raise ReceiptError(f"receipt field {name} must be a string of at most 1,000 characters, or null")
    checks = receipt.get("checks", [])
    if not isinstance(checks, list) or len(checks) > 8 + 2 * bounds.MAX_RECEIPT_LAYOUTS:
        raise ReceiptError("receipt field checks must be a list of at most "
                           f"{8 + 2 * bounds.MAX_RECEIPT_LAYOUTS} records")
    return model, layouts, engine, pattern


def _layout_differences(lay: dict[str, Any], fresh: dict[str, Any], name: str) -> list[str]:
    out = [f"layout {name!r} {field}: receipt has {_short(lay.get(field))}, recomputed {_short(fresh[field])}"
           for field in ("valid", "pp", "vpp", "stage_sizes", "errors", "violations", "megatron_flags",
                         "layout_string") if not _same(lay.get(field), fresh[field])]
    got, want = lay.get("stages"), fresh["stages"]
    if not isinstance(got, list) or len(got) != len(want):
        return out + [f"layout {name!r} has {len(got) if isinstance(got, list) else 'no'} stage records; "
                      f"recomputed {len(want)}"]
    for i, (g, w) in enumerate(zip(got, want), start=1):
        if _same(g, w):
            continue
        fields = sorted(f for f in set(g) | set(w) if not _same(g.get(f), w.get(f))) if isinstance(g, dict) else ["record"]
        out.append(f"layout {name!r} stage {i}: " + ", ".join(
            f"{f} receipt {_short(g.get(f) if isinstance(g, dict) else g)} vs recomputed {_short(w.get(f))}"
            for f in fields))
    return out


def _config_differences(model: dict[str, Any], cfg: ModelConfig) -> list[str]:
    """The config is identified by its digests (bytes and canonical JSON) and its layer count,
    never by a description."""
    return [f"model.{field}: receipt has {_short(model.get(field), 80)}, the config gives {actual!r}"
            for field, actual in (("sha256", cfg.sha256), ("canonical_sha256", cfg.canonical_sha256),
                                  ("num_layers", cfg.num_hidden_layers)) if not _same(model.get(field), actual)]


def _rebuild_layouts(cfg: ModelConfig, layouts: list[Any], requests: list[LayoutRequest], engine: str,
                     pattern: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every recorded layout materialised again from its recorded inputs, and how each differs
    (a layout whose inputs no longer materialise is a difference and is left out). The warnings
    recorded at creation may include launcher notes, so they are taken as recorded."""
    rebuilt, differences = [], []
    for lay, (name, spec, freq, offset) in zip(layouts, requests):
        try:
            fresh = _layout_entry(cfg, name, spec, freq, offset, (), engine, pattern)
        except (LayoutInputError, PatternError, ValueError) as exc:
            differences.append(f"layout {_short(name)}: its inputs no longer materialise: {exc}")
            continue
        fresh["warnings"] = lay.get("warnings", [])
        rebuilt.append(fresh)
        differences += _layout_differences(lay, fresh, name)
    return rebuilt, differences


def _checks_differences(receipt: dict[str, Any], model: dict[str, Any], cfg: ModelConfig,
                        rebuilt: list[dict[str, Any]], complete: bool) -> tuple[list[str], bool]:
    """The release-gate checks and ``valid`` recomputed from the rebuilt layouts (compared only
    when every layout rebuilt); returns the differences and the recomputed ``valid``."""
    eng = receipt["engine"]
    repo = model.get("upstream_repo") or "(user-supplied file)"
    fresh_checks = _checks(cfg, model.get("revision"), eng.get("commit"), rebuilt, upstream_repo=repo)
    out = []
    if not _same(receipt.get("checks"), fresh_checks) and complete:
        recorded = {c["name"]: c for c in receipt.get("checks", [])
                    if isinstance(c, dict) and isinstance(c.get("name"), str)}
        out += [f"check {c['name']}: receipt has {_short(recorded.get(c['name']))}, recomputed {_short(c)}"
                for c in fresh_checks if not _same(recorded.get(c["name"]), c)]
    fresh_valid = all(e["valid"] for e in rebuilt) and not any(c["result"] == "fail" for c in fresh_checks)
    if not _same(receipt.get("valid"), fresh_valid) and complete:
        out.append(f"valid: receipt says {_short(receipt.get('valid'), 40)}, recomputed {fresh_valid}")
    return out, fresh_valid


def _pinning_findings(receipt: dict[str, Any], model: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``unpinned`` recomputed (pinned = an immutable model revision and engine commit), and notes
    on the writing tool's version and on an unpinned receipt."""
    eng = receipt["engine"]
    pinned = is_immutable(model.get("revision")) and is_immutable(eng.get("commit"))
    differences, notes = [], []
    if not _same(receipt.get("unpinned"), not pinned):
        differences.append(f"unpinned: receipt says {_short(receipt.get('unpinned'), 40)}, recomputed {not pinned}")
    tool = receipt.get("tool", {})
    if isinstance(tool, dict) and tool.get("version") != __version__:
        notes.append(f"written by isplan {_short(tool.get('version'), 40)}, verified with {__version__}")
    if not pinned:
        notes.append("the receipt is unpinned (no immutable model revision and engine commit)")
    return differences, notes


def verify_receipt(receipt: Any, *, config_path: str | None = None,
                   config: ModelConfig | None = None, key: bytes | None = None) -> dict[str, Any]:
    """Recompute ``receipt`` and list every difference (empty list = verified).

    The config is ``config`` when given (the web app passes an uploaded one looked up by its
    ``sha256:`` id; the CLI passes ``--config``), else read from ``config_path`` (the CLI user's
    own argument), else the receipt's preset. A receipt never makes this open a path. Every count
    is bounded (:mod:`app.core.plan.bounds`) before any work; ``key`` (default ``ISPLAN_RECEIPT_KEY``)
    makes ``body_hmac_sha256`` required and checked. Differences come in this order: signature,
    plan record, config digests, layouts, plan verdicts, checks and ``valid``, ``unpinned``."""
    model, layouts, engine, pattern = _check_shape(receipt)
    requests = _layout_requests(layouts)   # every count bounded before any config is read
    differences, notes = _signature_findings(receipt, key if key is not None else configured_key())
    plan_problems, record = _plan_record(receipt)
    differences += plan_problems
    try:
        cfg = config if config is not None else _load_for_verify(model, config_path)
    except ConfigError as exc:
        raise ReceiptError(f"the config cannot be loaded: {exc}") from None
    differences += _config_differences(model, cfg)
    rebuilt, layout_diffs = _rebuild_layouts(cfg, layouts, requests, engine, pattern)
    differences += layout_diffs
    complete = len(rebuilt) == len(layouts)
    top_verdict = None
    if record is not None:
        plan_diffs, top_verdict = _plan_differences(record, receipt, cfg, engine, pattern, rebuilt if complete else None)
        differences += plan_diffs
    elif "verdict" not in receipt:
        notes.append("the receipt records no plan: its layouts were verified, it makes no go / no-go claim")
    check_diffs, fresh_valid = _checks_differences(receipt, model, cfg, rebuilt, complete)
    pin_diffs, pin_notes = _pinning_findings(receipt, model)
    differences += check_diffs + pin_diffs
    return _verification_report(model, cfg, layouts, differences, notes + pin_notes,
                                fresh_valid if complete else False, top_verdict)


def _verification_report(model: dict[str, Any], cfg: ModelConfig, layouts: list[Any], differences: list[str],
                         notes: list[str], valid: bool, verdict: Any) -> dict[str, Any]:
    """What ``isplan verify`` answers: ok when nothing differs, the first :data:`MAX_DIFFERENCES`
    differences (and how many more), the notes, the config it used and the recomputed verdicts."""
    ok = not differences
    return {
        "ok": ok,
        "summary": (f"{len(layouts)} layout(s) of {_short(model.get('id'), 80)} recomputed; "
                    + ("everything matches" if ok else f"{len(differences)} difference(s)")),
        "differences": differences[:MAX_DIFFERENCES] + (
            [f"... and {len(differences) - MAX_DIFFERENCES:,} more"] if len(differences) > MAX_DIFFERENCES else []),
        "notes": notes,
        "model": {"id": cfg.id, "sha256": cfg.sha256},
        "valid": valid,
        "verdict": verdict,
    }


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
