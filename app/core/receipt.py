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
every difference: an edited stage, a changed or different config, a wrong digest.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from app import __version__
from app.core.layer_roles import ENGINES, PatternError
from app.core.layout_check import run_check
from app.core.model_config import ConfigError, ModelConfig, load_config_bytes, load_preset, preset_ids
from app.core.stages import LayoutInputError, PipelineSpec

RECEIPT_VERSION = 1
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SPEC_FIELDS = set(PipelineSpec.__dataclass_fields__)


class ReceiptError(ValueError):
    """A receipt that cannot be verified at all (wrong shape, missing config): exit code 2."""


def is_immutable(rev: str | None) -> bool:
    return bool(rev) and bool(_COMMIT.match(rev.lower()))  # type: ignore[union-attr]


def canonical_body_digest(receipt: dict[str, Any]) -> str:
    body = {k: v for k, v in receipt.items() if k != "body_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a hostile receipt may carry lone surrogates; it must still hash (and differ)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


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
            layouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    repo = cfg.upstream_repo or "(user-supplied file)"
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


def build_receipt(
    cfg: ModelConfig,
    layouts: list[LayoutInput],
    *,
    engine: str = "megatron",
    pattern: str | None = None,
    model_revision: str | None = None,
    engine_commit: str | None = None,
    created_utc: str | None = None,
) -> dict[str, Any]:
    entries = [_layout_entry(cfg, name, spec, freq, offset, warns, engine, pattern)
               for name, spec, freq, offset, warns in layouts]
    checks = _checks(cfg, model_revision, engine_commit, entries)
    pinned = is_immutable(model_revision) and is_immutable(engine_commit)
    warnings = []
    if not pinned:
        missing = [w for w, ok in (("model revision", is_immutable(model_revision)),
                                   ("engine commit", is_immutable(engine_commit))) if not ok]
        warnings.append(f"unpinned: no immutable {' or '.join(missing)}; pass --model-revision / "
                        "--engine-commit with full 40-hex commits")
    receipt: dict[str, Any] = {
        "receipt_version": RECEIPT_VERSION,
        "tool": {"name": "isplan", "version": __version__},
        "created_utc": created_utc or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": {
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
        },
        "engine": {"semantics": engine, "commit": engine_commit, "commit_pinned": is_immutable(engine_commit)},
        "pattern": pattern,
        "layouts": entries,
        "checks": checks,
        "valid": all(e["valid"] for e in entries) and not any(c["result"] == "fail" for c in checks),
        "unpinned": not pinned,
        "warnings": warnings,
    }
    receipt["body_sha256"] = canonical_body_digest(receipt)
    return receipt


# --------------------------------------------------------------------------- verification


def _require(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
        raise ReceiptError(f"receipt field {where}{key} is missing or not a {kind.__name__}")
    return obj[key]


def _load_for_verify(model: dict[str, Any], config_path: str | None) -> ModelConfig:
    if config_path is not None:
        path = Path(config_path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ReceiptError(f"cannot read --config {config_path}: {exc.strerror}") from None
        return load_config_bytes(data, id=model.get("id") or str(path), source=model.get("source", "path"))
    source, mid = model.get("source"), model.get("id")
    if source == "preset":
        if mid not in preset_ids():
            raise ReceiptError(f"the receipt names preset {mid!r}, which this isplan does not ship; pass --config PATH")
        return load_preset(mid)
    if source == "path" and isinstance(mid, str) and Path(mid).is_file():
        return load_config_bytes(Path(mid).read_bytes(), id=mid, source="path")
    raise ReceiptError(
        f"the receipt's config ({source} {mid!r}) is not available here; pass --config PATH to the config.json"
    )


_INT_INPUTS = ("pp", "vpp", "layers_per_vstage", "first", "last", "mtp_layers")
_BOOL_INPUTS = ("account_for_embedding", "account_for_loss", "overlap_p2p")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _spec_from(inputs: dict[str, Any], where: str) -> PipelineSpec:
    """The recorded inputs as a :class:`PipelineSpec`, each field type-checked."""
    kwargs = {k: v for k, v in inputs.items() if k in _SPEC_FIELDS}
    for k in _INT_INPUTS:
        if kwargs.get(k) is not None and not _is_int(kwargs[k]):
            raise ReceiptError(f"{where}.inputs.{k} must be a whole number or null, got {json.dumps(kwargs[k])[:40]}")
    for k in _BOOL_INPUTS:
        if k in kwargs and not isinstance(kwargs[k], bool):
            raise ReceiptError(f"{where}.inputs.{k} must be true or false")
    if kwargs.get("layout") is not None and not isinstance(kwargs["layout"], str):
        raise ReceiptError(f"{where}.inputs.layout must be a string or null")
    split = kwargs.get("split")
    if split is not None:
        if not isinstance(split, list) or not all(_is_int(x) for x in split):
            raise ReceiptError(f"{where}.inputs.split must be a list of whole numbers or null")
        kwargs["split"] = tuple(split)
    return PipelineSpec(**kwargs)


def verify_receipt(receipt: Any, *, config_path: str | None = None,
                   config: ModelConfig | None = None) -> dict[str, Any]:
    """Recompute ``receipt`` and list every difference (empty list = verified). The config is
    ``config`` when given (the web app passes an uploaded one), else read from ``config_path``,
    else the receipt's preset or path."""
    if not isinstance(receipt, dict):
        raise ReceiptError("a receipt is a JSON object")
    model = _require(receipt, "model", dict, "")
    layouts = _require(receipt, "layouts", list, "")
    engine = receipt.get("engine", {}).get("semantics") if isinstance(receipt.get("engine"), dict) else None
    if engine not in ENGINES:
        raise ReceiptError(f"receipt field engine.semantics must be one of {list(ENGINES)}, got {engine!r}")
    pattern = receipt.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise ReceiptError("receipt field pattern must be a string or null")
    eng = receipt.get("engine", {})
    for key, value in (("model.revision", model.get("revision")), ("engine.commit", eng.get("commit")),
                       ("model.id", model.get("id"))):
        if value is not None and not isinstance(value, str):
            raise ReceiptError(f"receipt field {key} must be a string or null")
    if not isinstance(receipt.get("checks", []), list):
        raise ReceiptError("receipt field checks must be a list")
    differences: list[str] = []
    notes: list[str] = []

    recorded_body = receipt.get("body_sha256")
    actual_body = canonical_body_digest(receipt)
    if recorded_body != actual_body:
        differences.append(f"body_sha256 is {recorded_body!r} but the body hashes to {actual_body}: "
                           "the receipt was edited after it was written")

    try:
        cfg = config if config is not None else _load_for_verify(model, config_path)
    except ConfigError as exc:
        raise ReceiptError(f"the config cannot be loaded: {exc}") from None
    for key, actual in (("sha256", cfg.sha256), ("canonical_sha256", cfg.canonical_sha256),
                        ("num_layers", cfg.num_hidden_layers)):
        if model.get(key) != actual:
            differences.append(f"model.{key}: receipt has {model.get(key)!r}, the config gives {actual!r}")

    rebuilt_layouts = []
    for k, lay in enumerate(layouts):
        if not isinstance(lay, dict) or not isinstance(lay.get("inputs"), dict):
            raise ReceiptError(f"layouts[{k}] has no inputs object")
        name = lay.get("name", f"#{k}")
        spec = _spec_from(lay["inputs"], f"layouts[{k}]")
        for key in ("dsa_indexer_topk_freq", "dsa_indexer_skip_topk_offset"):
            if lay.get(key) is not None and not _is_int(lay[key]):
                raise ReceiptError(f"layouts[{k}].{key} must be a whole number or null")
        try:
            fresh = _layout_entry(cfg, name, spec, lay.get("dsa_indexer_topk_freq"),
                                  lay.get("dsa_indexer_skip_topk_offset"), (), engine, pattern)
        except (LayoutInputError, PatternError, ValueError) as exc:
            differences.append(f"layout {_short(name)}: its inputs no longer materialise: {exc}")
            continue
        # warnings recorded at creation may include launcher notes; compare the rest
        fresh["warnings"] = lay.get("warnings", [])
        rebuilt_layouts.append(fresh)
        for field in ("valid", "pp", "vpp", "stage_sizes", "errors", "violations", "megatron_flags", "layout_string"):
            if lay.get(field) != fresh[field]:
                differences.append(f"layout {name!r} {field}: receipt has {_short(lay.get(field))}, "
                                   f"recomputed {_short(fresh[field])}")
        got, want = lay.get("stages"), fresh["stages"]
        if not isinstance(got, list) or len(got) != len(want):
            differences.append(f"layout {name!r} has {len(got) if isinstance(got, list) else 'no'} stage records; "
                               f"recomputed {len(want)}")
        else:
            for i, (g, w) in enumerate(zip(got, want), start=1):
                if g != w:
                    fields = sorted(f for f in set(g) | set(w) if (g or {}).get(f) != w.get(f)) if isinstance(g, dict) else ["record"]
                    differences.append(
                        f"layout {name!r} stage {i}: " + ", ".join(
                            f"{f} receipt {_short(g.get(f) if isinstance(g, dict) else g)} vs recomputed {_short(w.get(f))}"
                            for f in fields))

    fresh_checks = _checks(cfg, model.get("revision"), eng.get("commit"), rebuilt_layouts)
    if receipt.get("checks") != fresh_checks and len(rebuilt_layouts) == len(layouts):
        recorded = {c["name"]: c for c in receipt.get("checks", [])
                    if isinstance(c, dict) and isinstance(c.get("name"), str)}
        for c in fresh_checks:
            r = recorded.get(c["name"])
            if r != c:
                differences.append(f"check {c['name']}: receipt has {_short(r)}, recomputed {_short(c)}")
    fresh_valid = all(e["valid"] for e in rebuilt_layouts) and not any(c["result"] == "fail" for c in fresh_checks)
    if receipt.get("valid") != fresh_valid and len(rebuilt_layouts) == len(layouts):
        differences.append(f"valid: receipt says {receipt.get('valid')!r}, recomputed {fresh_valid}")
    pinned = is_immutable(model.get("revision")) and is_immutable(eng.get("commit"))
    if receipt.get("unpinned") != (not pinned):
        differences.append(f"unpinned: receipt says {receipt.get('unpinned')!r}, recomputed {not pinned}")
    tool = receipt.get("tool", {})
    if isinstance(tool, dict) and tool.get("version") != __version__:
        notes.append(f"written by isplan {tool.get('version')}, verified with {__version__}")
    if not pinned:
        notes.append("the receipt is unpinned (no immutable model revision and engine commit)")
    ok = not differences
    return {
        "ok": ok,
        "summary": (f"{len(layouts)} layout(s) of {model.get('id')} recomputed; "
                    + ("everything matches" if ok else f"{len(differences)} difference(s)")),
        "differences": differences,
        "notes": notes,
        "model": {"id": cfg.id, "sha256": cfg.sha256},
        "valid": fresh_valid if len(rebuilt_layouts) == len(layouts) else False,
    }


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
