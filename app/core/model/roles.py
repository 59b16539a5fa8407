"""Layer roles: which decoder layers run the DSA indexer (*full*) and which reuse top-k (*shared*).

Every user-facing layer number is 1-based. A shared layer reuses the top-k of its *source*: the
nearest preceding full layer. A shared layer with no full layer before it is an error in the
config (no engine can run it).

Where the roles come from, in order of precedence:

1. a what-if pattern override (``--pattern``): ``FSSS`` repeated from layer 1, or one F/S per layer;
2. the config's ``indexer_types`` array (``"full"`` / ``"shared"``);
3. the config's ``index_topk_pattern`` string (``F`` / ``S``);
4. the ``index_topk_freq`` / ``index_skip_topk_offset`` rule of the chosen engine.

The three engines read the freq/offset rule differently (FACTS.md section 1):

* ``hf`` - transformers / vLLM / SGLang, 0-based layer ``i``: full iff
  ``max(i - offset + 1, 0) % freq == 0``; defaults freq 1, offset 2
  (huggingface/transformers ``models/glm_moe_dsa/configuration_glm_moe_dsa.py``,
  vllm ``model_executor/models/deepseek_v2.py``).
* ``megatron`` - Megatron-Core, 1-based ``n``: shared iff ``max(n - max(offset, 1), 0) % freq != 0``
  (NVIDIA/Megatron-LM ``megatron/core/transformer/experimental_attention_variant/dsa.py``:
  ``is_dsa_skip_topk_layer``; flags ``--dsa-indexer-topk-freq`` default 1,
  ``--dsa-indexer-skip-topk-offset`` default 0).
* ``slime`` - like Megatron but without clamping the offset to 1, so offset 0 makes layer 1 a
  shared layer with no source (THUDM/slime ``slime_plugins/models/glm5/glm5.py``).

For each engine the source of a shared layer, ``n - ((n - offset) % freq)``, is exactly the
nearest preceding full layer, so one definition of *source* serves all of them.

An explicit array wins for the *checkpoint's* roles (:func:`derive_roles`). Megatron and slime
never read it: they build indexers from freq/offset alone (Megatron from ``--dsa-indexer-topk-freq``
/ ``--dsa-indexer-skip-topk-offset``, slime from the HF config's ``index_topk_freq`` /
``index_skip_topk_offset``). :func:`derive_roles` with ``engine_built=True`` gives the roles the
engine builds, and :func:`checkpoint_disagreements` lists where they differ from the checkpoint
(the engine would build indexers where the checkpoint has none, or the reverse).

MTP layers: Megatron's ``MultiTokenPredictionLayer`` numbers depth ``k`` (1-based) as
``layer_number = k + get_mtp_layer_offset(...)`` (the offset is 0 unless a layout places ``m``
tokens in earlier stages, which Megatron does not allow), and its attention applies the same
skip rule to that number (``megatron/core/transformer/multi_token_prediction.py``,
``MultiTokenPredictionLayer.__init__`` and ``_build_layers``; ``dsa.py: DSAttention.__init__``).
So with freq 4 / offset 3 MTP depths 1-3 compute and depth 4 is a shared layer. Read at
NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 and THUDM/slime
624b824a898ab0ec1fcb4d373004c7f3852bf515 (``slime_plugins/models/glm5/glm5.py: is_skip_topk_layer``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

from app.core.content_cache import hash_once, state_without_hash
from app.core.model.config import ModelConfig


@dataclass(frozen=True)
class RoleRule:
    """One engine's reading of a config's IndexShare settings (each engine module defines its own).

    ``full(n, freq, offset)``: whether 1-based decoder layer ``n`` computes its own top-k.
    ``reads_declared``: the engine reads an explicit ``indexer_types`` / ``index_topk_pattern``
    (transformers and its readers); otherwise it builds indexers from freq/offset alone (Megatron,
    slime), so a declared array that disagrees is a checkpoint mismatch. ``mtp_follows_rule``: MTP
    depth ``k`` applies the same rule to its own number ``k`` (Megatron, slime); otherwise every MTP
    layer owns an indexer (HF-style checkpoints).
    """

    engine: str
    defaults: tuple[int, int]  # (freq, offset) when neither the config nor a flag sets them
    full: Callable[[int, int, int], bool]
    reads_declared: bool
    mtp_follows_rule: bool
    source: str = ""
    #: where the engine takes freq/offset from (its messages say so), and the flag that sets them
    set_by: str = "the config's index_topk_freq / index_skip_topk_offset"
    flag: str | None = None

    def is_full(self, n: int, freq: int, offset: int) -> bool:
        if freq < 1:
            raise ValueError(f"index_topk_freq must be at least 1, got {freq}")
        if offset < 0:
            raise ValueError(f"index_skip_topk_offset must not be negative, got {offset}")
        return self.full(n, freq, offset)

    def layers(self, num_layers: int, freq: int, offset: int) -> tuple[bool, ...]:
        return tuple(self.is_full(n, freq, offset) for n in range(1, num_layers + 1))


def _transformers_full(n: int, freq: int, offset: int) -> bool:
    return max((n - 1) - offset + 1, 0) % freq == 0


#: The config's own definition (huggingface/transformers ``models/glm_moe_dsa/configuration_glm_moe_dsa.py``
#: @ 008e574391258935f3ecc3035c882e73bbcac419): ``indexer_types`` wins, then ``index_topk_pattern``, then
#: 0-based layer ``i`` is full iff ``max(i - offset + 1, 0) % freq == 0``, defaults freq 1 / offset 2. The
#: checkpoint's roles are read with it; the hf, vLLM and SGLang engines run it.
TRANSFORMERS_RULE = RoleRule("hf", (1, 2), _transformers_full, reads_declared=True, mtp_follows_rule=False,
                             source="huggingface/transformers models/glm_moe_dsa/configuration_glm_moe_dsa.py")


class PatternError(ValueError):
    """A role override that cannot be used: a ``--pattern`` that is not F/S letters of a usable
    length, or a freq / offset override out of range."""


def parse_pattern(pattern: str, num_layers: int) -> tuple[bool, ...]:
    """``--pattern``: a string of F/S, periodic from layer 1 if shorter than the model."""
    p = pattern.strip().upper()
    if not p:
        raise PatternError("--pattern is empty; give F/S letters such as FSSS")
    bad = sorted(set(p) - {"F", "S"})
    if bad:
        raise PatternError(f"--pattern may only contain F and S; found {''.join(bad)!r}")
    if len(p) > num_layers:
        raise PatternError(
            f"--pattern has {len(p)} letters but the model has {num_layers} decoder layers; "
            f"give at most {num_layers} (a shorter pattern repeats from layer 1)"
        )
    return tuple(p[(n - 1) % len(p)] == "F" for n in range(1, num_layers + 1))


#: What a layer's FLOPs and time depend on besides the settings (:attr:`LayerRole.kind`): FFN kind,
#: owns an indexer, is MTP, attention window (0: full causal), mixer, attention chunk (0: none)
LayerKind = tuple[str, bool, bool, int, str, int]


@dataclass(frozen=True)
class LayerRole:
    layer: int  # 1-based
    role: str  # "full" | "shared"
    source: int | None  # the full layer whose top-k it uses (itself when full); None = no source
    ffn: str  # "dense" | "moe" | "none" (a hybrid model's Mamba or attention block)
    has_indexer: bool  # owns indexer weights
    mtp: bool = False
    window: int = 0  # sliding-window attention: keys a query sees at most (0: full causal attention)
    #: "attention" | "mamba" | "none" (a hybrid model's MoE or MLP block) | "gdn" (a gated DeltaNet, with its FFN)
    mixer: str = "attention"
    chunk: int = 0  # chunked attention: a query sees the earlier keys of its own chunk of this many (0: none)

    @property
    def kind(self) -> LayerKind:
        """(FFN kind, owns an indexer, is MTP, attention window, mixer, attention chunk): what the
        layer's FLOPs and time depend on besides the settings (layers of one kind cost the same)."""
        return (self.ffn, self.has_indexer, self.mtp, self.window, self.mixer, self.chunk)

    @classmethod
    def of_kind(cls, kind: LayerKind) -> LayerRole:
        """A layer of ``kind`` (its costs are its kind's; number and source unset)."""
        return cls(0, "full", None, kind[0], kind[1], kind[2], kind[3], kind[4], kind[5])

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "role": self.role,
            "source_layer": self.source,
            "ffn": self.ffn,
            "has_indexer": self.has_indexer,
            "mtp": self.mtp,
            "attention_window": self.window,
            "attention_chunk": self.chunk,
            "mixer": self.mixer,
        }


@dataclass(frozen=True)
class RoleError:
    code: str
    message: str
    layer: int | None = None


@dataclass(frozen=True)
class RoleMap:
    """Roles of every decoder layer (``layers``) and the MTP layers after them (``mtp``)."""

    engine: str
    rule: str  # pattern_override | indexer_types | index_topk_pattern | freq_offset | no_indexer
    freq: int | None
    offset: int | None
    layers: tuple[LayerRole, ...]
    mtp: tuple[LayerRole, ...]
    errors: tuple[RoleError, ...] = ()
    pattern_differences: tuple[int, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    __hash__ = hash_once  # hashed once: a role map keys the page's context curve and other caches
    __getstate__ = state_without_hash

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def role(self, layer: int) -> LayerRole:
        return self.layers[layer - 1]

    def of(self, layers: range) -> tuple[LayerRole, ...]:
        """The roles of the decoder layers ``layers`` (1-based, as a stage's ``layers``), in order."""
        return self.layers[layers.start - 1:layers.stop - 1]

    @cached_property
    def kinds(self) -> tuple[LayerKind, ...]:
        """Every decoder layer's :attr:`LayerRole.kind`, in order (made once per role map)."""
        return tuple(r.kind for r in self.layers)

    def kinds_of(self, layers: range) -> tuple[LayerKind, ...]:
        """The kinds (:attr:`kinds`) of the decoder layers ``layers``, as :meth:`of` their roles."""
        return self.kinds[layers.start - 1:layers.stop - 1]

    @cached_property
    def full_layers(self) -> tuple[int, ...]:
        """The full (index-computing) decoder layers, in order (made once per role map: the page
        reads them twice a render)."""
        return tuple(r.layer for r in self.layers if r.role == "full")

    def letters(self) -> str:
        return "".join("F" if r.role == "full" else "S" for r in self.layers)


def ffn_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    """Dense or MoE FFN per decoder layer (none on a hybrid model's Mamba and attention blocks):
    ``mlp_layer_types`` if present, else the DeepSeek-V3 rule (MoE iff experts exist,
    ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``)."""
    if cfg.mlp_layer_types is not None:
        return tuple({"sparse": "moe"}.get(t, t) for t in cfg.mlp_layer_types)
    out = []
    for i in range(cfg.num_hidden_layers):
        moe = cfg.n_routed_experts > 0 and i >= cfg.first_k_dense_replace and i % cfg.moe_layer_freq == 0
        out.append("moe" if moe else "dense")
    return tuple(out)


def _config_freq_offset(cfg: ModelConfig, rule: RoleRule, freq: int | None, offset: int | None) -> tuple[int, int]:
    d_freq, d_offset = rule.defaults
    f = freq if freq is not None else cfg.index_topk_freq if cfg.index_topk_freq is not None else d_freq
    o = offset if offset is not None else (
        cfg.index_skip_topk_offset if cfg.index_skip_topk_offset is not None else d_offset
    )
    return f, o


def config_declared_roles(cfg: ModelConfig) -> tuple[str, tuple[bool, ...]] | None:
    """The explicit per-layer roles the config declares, if any: (rule, is_full per layer)."""
    if cfg.indexer_types is not None:
        return "indexer_types", tuple(t == "full" for t in cfg.indexer_types)
    if cfg.index_topk_pattern is not None:
        return "index_topk_pattern", tuple(c == "F" for c in cfg.index_topk_pattern)
    return None


def mtp_is_full(depths: int, freq: int, offset: int, rule: RoleRule) -> tuple[bool, ...]:
    """Whether MTP depth ``k`` = 1..depths computes its own top-k: Megatron / slime apply the skip
    rule to the MTP layer's own number ``k``; HF-style checkpoints give every MTP layer an indexer."""
    if not rule.mtp_follows_rule:
        return (True,) * depths
    return tuple(rule.is_full(k, freq, offset) for k in range(1, depths + 1))


def _mtp_roles(cfg: ModelConfig, full: tuple[bool, ...], errors: list[RoleError]) -> tuple[LayerRole, ...]:
    n_layers = cfg.num_hidden_layers
    ffn = "moe" if cfg.n_routed_experts else "dense"
    out: list[LayerRole] = []
    last: int | None = None
    for k, is_full in enumerate(full, start=1):
        n = n_layers + k
        if is_full:
            last = n
            out.append(LayerRole(n, "full", n, ffn, cfg.has_indexer, mtp=True))
            continue
        out.append(LayerRole(n, "shared", last, ffn, False, mtp=True))
        if last is None:
            errors.append(RoleError("shared_without_source",
                                    f"MTP depth {k} (layer {n}) is shared but no MTP depth before it computes "
                                    "top-k, so it has nothing to reuse", n))
    return tuple(out)


def _window_notes(rm: RoleMap) -> tuple[str, ...]:
    """One line per attention window and per attention chunk the decoder layers use (FLOPs and
    time count them)."""
    out = []
    for attr, what in (("window", "a sliding window of"), ("chunk", "within chunks of")):
        for size in sorted({getattr(r, attr) for r in rm.layers} - {0}):
            held = [r.layer for r in rm.layers if getattr(r, attr) == size]
            shown = ", ".join(map(str, held[:8])) + (f", ... ({len(held)} layers)" if len(held) > 8 else "")
            out.append(f"layers {shown} attend {what} {size} tokens (the others every earlier token)")
    return tuple(out)


def _hybrid_notes(cfg: ModelConfig) -> tuple[str, ...]:
    """A hybrid model's layer mix, in Megatron's symbols (``--hybrid-layer-pattern``)."""
    pattern = cfg.hybrid_pattern
    if pattern is None:
        return ()
    count = {c: pattern.count(c) for c in "M*E-"}
    mix = ", ".join(f"{count[c]} {name}" for c, name in (("M", "Mamba"), ("*", "attention"), ("E", "MoE"),
                                                         ("-", "MLP")) if count[c])
    return (f"a hybrid model of one-module layers: {mix} (Megatron's --hybrid-layer-pattern {pattern})",)


def _gdn_notes(cfg: ModelConfig) -> tuple[str, ...]:
    """A gated DeltaNet model's token mixers (Qwen3-Next, Qwen3.5): which layers run softmax attention."""
    kinds = cfg.layer_attention
    if kinds is None:
        return ()
    full = [n for n, k in enumerate(kinds, start=1) if k == "attention"]
    shown = ", ".join(map(str, full[:8])) + (f", ... ({len(full)} layers)" if len(full) > 8 else "")
    gated = "gated " if cfg.attention_output_gate else ""
    return (f"{len(kinds) - len(full)} gated DeltaNet (linear attention) and {len(full)} {gated}softmax attention "
            f"layers; attention on layers {shown or 'none'}",)


def _build(
    cfg: ModelConfig, engine: str, rule: str, full: tuple[bool, ...], freq: int | None, offset: int | None,
    mtp_full: tuple[bool, ...] | None = None,
) -> RoleMap:
    ffn = ffn_kinds(cfg)
    windows = cfg.layer_windows or (0,) * cfg.num_hidden_layers
    mixers = cfg.layer_mixers or cfg.layer_attention or ("attention",) * cfg.num_hidden_layers
    chunks = cfg.layer_chunks or (0,) * cfg.num_hidden_layers
    layers: list[LayerRole] = []
    errors: list[RoleError] = []
    last_full: int | None = None
    for n, is_full in enumerate(full, start=1):
        if is_full:
            last_full = n
            layers.append(LayerRole(n, "full", n, ffn[n - 1], cfg.has_indexer, window=windows[n - 1],
                                    mixer=mixers[n - 1], chunk=chunks[n - 1]))
        else:
            layers.append(LayerRole(n, "shared", last_full, ffn[n - 1], False, window=windows[n - 1],
                                    mixer=mixers[n - 1], chunk=chunks[n - 1]))
            if last_full is None:
                errors.append(
                    RoleError(
                        "shared_without_source",
                        f"layer {n} is shared but no full layer precedes it, so it has no top-k "
                        f"to reuse ({rule}); this is an error in the config",
                        n,
                    )
                )
    if mtp_full is None:
        mtp_full = (True,) * cfg.num_nextn_predict_layers
    mtp = _mtp_roles(cfg, mtp_full, errors)
    return RoleMap(engine, rule, freq, offset, tuple(layers), mtp, tuple(errors))


@lru_cache(maxsize=256)
def derive_roles(
    cfg: ModelConfig,
    rule: RoleRule = TRANSFORMERS_RULE,
    *,
    pattern: str | None = None,
    freq: int | None = None,
    offset: int | None = None,
    mtp_layers: int | None = None,
    engine_built: bool = False,
) -> RoleMap:
    """Roles under an engine's ``rule``. ``freq``/``offset`` override the config's (launcher flags
    ``--dsa-indexer-topk-freq`` / ``--dsa-indexer-skip-topk-offset``); ``mtp_layers`` overrides
    ``num_nextn_predict_layers``.

    By default an explicit ``indexer_types`` / ``index_topk_pattern`` wins: those are the
    checkpoint's roles. With ``engine_built=True`` and a rule that does not read them (Megatron,
    slime) the result is what the engine builds from freq/offset alone; MTP depths then follow the
    engine's numbering (:func:`mtp_is_full`)."""
    engine = rule.engine
    n = cfg.num_hidden_layers
    depths = cfg.num_nextn_predict_layers if mtp_layers is None else mtp_layers
    if depths < 0:
        raise PatternError(f"--mtp-num-layers must not be negative, got {depths}")
    if freq is not None and freq < 1:
        raise PatternError(f"--dsa-indexer-topk-freq must be at least 1, got {freq}")
    if offset is not None and offset < 0:
        raise PatternError(f"--dsa-indexer-skip-topk-offset must not be negative, got {offset}")
    if pattern is not None and not isinstance(pattern, str):
        raise PatternError("--pattern must be a string of F and S")
    if not cfg.has_indexer:
        full = (True,) * n
        rm = _build(cfg, engine, "no_indexer", full, None, None, (True,) * depths)
        return replace(rm, notes=("the model has no DSA indexer; every stage start is allowed", *_window_notes(rm),
                                  *_hybrid_notes(cfg), *_gdn_notes(cfg)))
    f, o = _config_freq_offset(cfg, rule, freq, offset)
    declared = config_declared_roles(cfg)
    if pattern is not None:
        full = parse_pattern(pattern, n)
        base = declared[1] if declared else rule.layers(n, f, o)
        diffs = tuple(i + 1 for i in range(n) if full[i] != base[i])
        rm = _build(cfg, engine, "pattern_override", full, f, o, (True,) * depths)
        return replace(rm, pattern_differences=diffs)
    if declared is not None and not (engine_built and not rule.reads_declared):
        return _build(cfg, engine, declared[0], declared[1], f, o, (True,) * depths)
    return _build(cfg, engine, "freq_offset", rule.layers(n, f, o), f, o, mtp_is_full(depths, f, o, rule))


def checkpoint_disagreements(checkpoint: RoleMap, built: RoleMap) -> list[LayerRole]:
    """The layers (as the engine builds them) whose role differs from the checkpoint's, decoder
    layers first, then MTP layers.

    A layer the engine builds as full but the checkpoint stores as shared has no indexer weights to
    load; a layer the engine builds as shared while the checkpoint stores an indexer leaves those
    weights unused (strict loading fails).
    """
    return [b for ck, b in zip(checkpoint.layers + checkpoint.mtp, built.layers + built.mtp, strict=True)
            if ck.role != b.role or ck.has_indexer != b.has_indexer]


def describe_disagreements(layers: list[LayerRole], limit: int = 12) -> str:
    """``built full but shared in the checkpoint (...): layers 5, 9; built shared ...: layer 2``."""
    parts = []
    for role, other, why in (("full", "shared", "no indexer weights to load"),
                             ("shared", "full", "its indexer weights go unused")):
        dec = [str(r.layer) for r in layers if r.role == role and not r.mtp]
        items = [f"MTP layer {r.layer}" for r in layers if r.role == role and r.mtp]
        if dec:
            shown = ", ".join(dec[:limit]) + (f", ... ({len(dec)} in all)" if len(dec) > limit else "")
            items.insert(0, f"layer{'s' * (len(dec) > 1)} {shown}")
        if items:
            parts.append(f"built {role} but {other} in the checkpoint ({why}): {', '.join(items)}")
    return "; ".join(parts)


def _diff(a: tuple[bool, ...], b: tuple[bool, ...]) -> list[int]:
    return [i + 1 for i in range(len(a)) if a[i] != b[i]]


def role_disagreements(
    cfg: ModelConfig, rules: Iterable[RoleRule], *, freq: int | None = None, offset: int | None = None
) -> list[dict[str, Any]]:
    """Where the config's array and each engine's freq/offset rule disagree, and where two engines'
    rules disagree (``rules``: one per engine, e.g. :func:`app.core.engines.role_rules`)."""
    return [dict(d) for d in _role_disagreements(cfg, tuple(rules), freq, offset)]


@lru_cache(maxsize=256)
def _role_disagreements(cfg: ModelConfig, rules: tuple[RoleRule, ...], freq: int | None,
                        offset: int | None) -> tuple[dict[str, Any], ...]:
    """Each entry: ``kind`` (``array_vs_rule`` or ``engines``), the two sides, and ``layers`` (1-based)."""
    if not cfg.has_indexer:
        return ()
    n = cfg.num_hidden_layers
    out: list[dict[str, Any]] = []
    declared = config_declared_roles(cfg)
    derived = {}
    for r in rules:
        f, o = _config_freq_offset(cfg, r, freq, offset)
        derived[r.engine] = (f, o, r.layers(n, f, o))
    if declared is not None:
        for e, (f, o, roles) in derived.items():
            layers = _diff(declared[1], roles)
            if layers:
                out.append({
                    "kind": "array_vs_rule", "a": declared[0], "b": f"{e} rule (freq {f}, offset {o})",
                    "engine": e, "layers": layers,
                    "message": (f"{declared[0]} and the {e} freq/offset rule (freq {f}, offset {o}) "
                                f"disagree on {len(layers)} layer(s): {_fmt_layers(layers)}"),
                })
    names = list(derived)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (fa, oa, ra), (fb, ob, rb) = derived[a], derived[b]
            layers = _diff(ra, rb)
            if layers:
                out.append({
                    "kind": "engines", "a": a, "b": b, "layers": layers,
                    "message": (f"the {a} rule (freq {fa}, offset {oa}) and the {b} rule (freq {fb}, offset {ob}) "
                                f"disagree on layer(s) {_fmt_layers(layers)}"
                                + (" (the explicit array in the config takes precedence)" if declared else "")),
                })
    return tuple(out)


def _fmt_layers(layers: list[int], limit: int = 12) -> str:
    head = ", ".join(str(x) for x in layers[:limit])
    return head + (f", ... ({len(layers)} in all)" if len(layers) > limit else "")


def roles_report(cfg: ModelConfig, roles: RoleMap, rules: Iterable[RoleRule], *, pattern: str | None = None,
                 freq: int | None = None, offset: int | None = None) -> dict[str, Any]:
    """The JSON body of ``isplan roles``: ``roles`` (an engine's own, already derived) and the
    disagreements between the config and the engines' ``rules``."""
    rm = roles
    return {
        "model": cfg.summary(),
        "engine": rm.engine,
        "rule": rm.rule,
        "index_topk_freq": rm.freq,
        "index_skip_topk_offset": rm.offset,
        "num_layers": rm.num_layers,
        "full_layers": list(rm.full_layers),
        "num_full": len(rm.full_layers),
        "num_shared": rm.num_layers - len(rm.full_layers),
        "pattern": rm.letters(),
        "layers": [r.to_dict() for r in rm.layers],
        "mtp_layers": [r.to_dict() for r in rm.mtp],
        "pattern_override": pattern,
        "pattern_differences": list(rm.pattern_differences) if rm.pattern_differences is not None else None,
        "disagreements": role_disagreements(cfg, rules, freq=freq, offset=offset),
        "errors": [{"code": e.code, "message": e.message, "layer": e.layer} for e in rm.errors],
        "notes": list(rm.notes),
    }
