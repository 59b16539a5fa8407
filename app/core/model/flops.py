"""Forward FLOPs per token and per pipeline stage, IndexShare versus an indexer on every layer.

Conventions (FACTS.md section 6; every count is an exact integer):

* **2 FLOPs per multiply-add**; forward pass only unless a function says otherwise.
* **Context L**: the number of key positions one query token sees (itself and the L - 1 before
  it). Per-token figures (:func:`token_flops`, :func:`flops_report`, :func:`flops_vs_context`)
  are the cost of *one token at context L* (the last token of an L-long prefix), as FACTS uses;
  they are not averaged over a sequence. Sequence figures (:func:`forward_flops`,
  :func:`stage_flops`) sum the exact causal cost: token t (1-based) of a sequence of S tokens
  sees t positions, so the context-linear terms cost ``S(S+1)/2`` query-key pairs, i.e. an
  average context of ``(S+1)/2``, and sparse attention costs ``sum_t min(k, t)`` pairs.
* Main model only for per-token figures: the decoder layers, the final norm and the lm_head; no
  MTP layer (like the activated-parameter count of :mod:`app.core.model.parameters`). The input
  embedding is a table look-up and costs nothing. Stage and training figures add the MTP layers.

Terms, with H hidden, h heads, rq / rkv the q / kv LoRA ranks, dn / dr / dv the nope / rope /
value head dims, Hi / di the indexer heads / head dim, k = ``index_topk``, V the vocabulary:

``linear``
    2 x the activated weights of the decoder layers **except the indexer**, plus the final norm
    and the lm_head (``2*(H + V*H)``, reported inside ``linear`` and also alone as
    ``linear_lm_head``). Per layer: MLA projections (q_a, q_b, kv_a, kv_b, o_proj; with the
    absorbed attention below kv_b's two halves are the absorption matmuls, same count), the
    layer norms' gains (elementwise, 2 FLOPs per weight, negligible, kept so the identity below
    is exact), the dense FFN or the top-k routed + shared experts and the router (``E*H``).
    Identity: ``linear + indexer_projections == 2 * count_parameters(cfg).active``.
``indexer_projections``
    Only on layers that own an indexer: 2 x (wq_b ``rq*Hi*di`` + wk ``H*di`` + weights_proj
    ``H*Hi`` + k_norm ``2*di``), i.e. 2 x the indexer's parameters. Not in ``linear``.
``indexer_scoring``
    Only on layers that own an indexer: ``2*L*Hi*di`` (one di-long dot product per indexer head
    and key position; 8192*L for GLM-5.2). This is the term FACTS counts.
``indexer_weighting``
    Only on layers that own an indexer: ``2*L*Hi`` (ReLU'd scores times the per-head weights,
    summed over heads). Kept apart so ``indexer_scoring`` stays exactly FACTS's term. The ReLU,
    the key-cache quantisation and the top-k selection (comparisons) are not counted.
``sparse_attention``
    Every layer's attention core (the name is kept for the DSA path; a model without an indexer
    attends densely over n = L). The convention follows the path the engine runs:

    * DSA sparse path (a model with an indexer): absorbed MLA over ``n = min(k, L)`` selected
      positions, ``2*h*n*(rkv + dr)`` for QK (latent + rope dims) plus ``2*h*n*rkv`` for PV:
      ``2*h*n*(576 + 512)`` = 285,212,672 per layer at n = 2048 for GLM-5.2 (the sparse MLA
      kernels attend over the shared latent; FACTS.md section 6). A shared layer attends over its
      source's top-k.
    * dense MLA (no indexer: DeepSeek-V3, Kimi-K2): Megatron trains MLA non-absorbed, per head
      and key position QK over ``dn + dr`` (192) and PV over ``dv`` (128):
      ``2*h*n*(dn + dr + dv)`` with n = L (FACTS.md section 7, "Megatron trains non-DSA MLA
      non-absorbed"; NVIDIA/Megatron-LM ``megatron/core/transformer/multi_latent_attention.py``
      up-projects k and v per head before core attention).
    * GQA / MHA: ``2*h*n*(2*head_dim)`` (every query head reads a key and value of head_dim).

    Softmax and scaling are not counted. A hybrid model's Mamba, MoE and MLP blocks have none.
``ssm_scan``
    A hybrid model's Mamba-2 layers only: the SSD chunked scan, ``MambaDims.scan_flops_per_token``
    per token (:mod:`app.core.model.hybrid`); its projections, depthwise conv and gains are in
    ``linear`` (2 x their weights, so the identity below holds). A gated DeltaNet layer
    (Qwen3-Next, Qwen3.5): the chunked delta rule, ``GdnDims.rule_flops_per_token`` = ``8 Hv dk dv``
    (:mod:`app.core.model.gated_delta_net`), its projections, conv and gains in ``linear``; it has no
    ``sparse_attention``.

Variants: ``indexshare`` (the roles as derived: indexers only on full layers) and
``every_layer`` (the same model with an indexer on every decoder layer, pattern ``F``).

Ratios (``every_layer / indexshare``) under named conventions, :data:`CONVENTIONS`:

* ``linear(no head)+indexer_scoring``: 2 x activated params without lm_head (indexer
  projections included, as in FACTS's "2 x active") + indexer scoring. GLM-5.2 at 1M: 2.894;
  this is what the published "2.9x fewer per-token FLOPs at 1M" corresponds to.
* ``+sparse_attention``: the above + sparse attention. GLM-5.2 at 1M: 2.744; at 32K: 1.154
  (FACTS's "only about 1.15x at 32K" matches this convention; the first gives 1.194 at 32K).
* ``full`` (the default ``ratio``, ``indexshare_flops`` and ``every_layer_flops``): every term
  above, lm_head and indexer weighting included.

Pipeline figures: :func:`stage_flops` charges each stage its decoder layers, the loss stage the
final norm + lm_head, the MTP stage its MTP layers (a full MoE/dense layer with its own indexer
+ eh_proj ``2*H*2H`` + enorm/hnorm/shared-head norm gains), and the **loss stage** the MTP
logits (``2*V*H`` per MTP layer and token): Megatron runs ``self.mtp`` on the stage with
``mtp_process`` but computes the MTP logits in ``process_mtp_loss`` inside ``_postprocess``,
only on the ``post_process`` stage (NVIDIA/Megatron-LM ``megatron/core/models/gpt/gpt_model.py``).
Training (:func:`training_flops`): forward + backward = 3 x forward (backward = 2 x forward);
full activation recompute adds one more forward of the recomputed decoder layers (default: all
of them, as ``--recompute-granularity full --recompute-method uniform``; the lm_head, the loss
and the MTP layers are not recomputed). Pipeline bubble: ``(PP-1)/(VPP*m + PP - 1)`` of wall time
(FACTS.md section 7).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from app.core.content_cache import remember, scope
from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parameters import Shapes, shapes
from app.core.model.roles import LayerKind, LayerRole, RoleMap, derive_roles

#: Additive terms of every breakdown (their sum is ``total``).
TERMS = ("linear", "indexer_projections", "indexer_scoring", "indexer_weighting", "sparse_attention", "ssm_scan")

#: Named conventions: which terms count, and whether the lm_head (with the final norm) is kept.
CONVENTIONS: dict[str, dict[str, Any]] = {
    "linear(no head)+indexer_scoring": {
        "terms": ("linear", "indexer_projections", "indexer_scoring"),
        "lm_head": False,
        "description": "2 x activated parameters without the lm_head and final norm (indexer "
                       "projections included, no input embedding) + indexer scoring 2*L*Hi*di "
                       "on layers that own an indexer; the convention of the published "
                       "'2.9x fewer per-token FLOPs at 1M'",
    },
    "+sparse_attention": {
        "terms": ("linear", "indexer_projections", "indexer_scoring", "sparse_attention", "ssm_scan"),
        "lm_head": False,
        "description": "the above + the attention core on every layer: absorbed sparse MLA over "
                       "min(index_topk, L) positions, 2*h*n*((kv_lora_rank + qk_rope_head_dim) + kv_lora_rank), "
                       "with an indexer; non-absorbed 2*h*L*(qk_nope + qk_rope + v_head_dim) for dense MLA; "
                       "2*h*L*2*head_dim for GQA; and a hybrid model's Mamba SSD scan or a gated DeltaNet's delta rule",
    },
    "full": {
        "terms": TERMS,
        "lm_head": True,
        "description": "every term: 2 x activated parameters including the final norm and lm_head "
                       "(no input embedding), indexer projections, indexer scoring 2*L*Hi*di, "
                       "indexer head weighting 2*L*Hi, absorbed sparse MLA attention, a hybrid model's SSD scan or a gated DeltaNet's "
                       "delta rule",
    },
}
PUBLISHED_CONVENTION = "linear(no head)+indexer_scoring"
#: The top-level ``indexshare_flops`` / ``every_layer_flops`` / ``ratio`` use the convention of the
#: published "2.9x fewer per-token FLOPs at 1M", so the headline number is comparable with it;
#: ``ratios`` gives every convention and ``breakdown`` every term.
DEFAULT_CONVENTION = PUBLISHED_CONVENTION

RECOMPUTE_MODES = ("none", "full")


# --------------------------------------------------------------------------- helpers


def _check_int(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _zero() -> dict[str, int]:
    return {t: 0 for t in TERMS}


def _add(acc: dict[str, int], terms: dict[str, int]) -> dict[str, int]:
    for t in TERMS:
        acc[t] += terms[t]
    return acc


def _with_total(terms: dict[str, int], lm_head: int) -> dict[str, int]:
    out = {t: terms[t] for t in TERMS}
    out["total"] = sum(out[t] for t in TERMS)
    out["linear_lm_head"] = lm_head
    return out


def topk_positions(cfg: ModelConfig, context: int) -> int:
    """Key positions sparse attention reads for one query at ``context``: ``min(index_topk, L)``
    with an indexer, ``L`` (dense attention) without one."""
    if cfg.has_indexer and cfg.index_topk > 0:
        return min(cfg.index_topk, context)
    return context


def causal_pairs(seq_length: int) -> int:
    """Query-key pairs of one causal sequence: ``S(S+1)/2`` (average context ``(S+1)/2``)."""
    return seq_length * (seq_length + 1) // 2


def window_pairs(seq_length: int, window: int) -> int:
    """Query-key pairs of one causal sequence under a sliding window of ``window`` keys (the query's
    own position and the ``window - 1`` before it, transformers' ``sliding_window``; 0: no window):
    ``sum over t = 1..S of min(t, W)``."""
    if not window or seq_length <= window:
        return causal_pairs(seq_length)
    return window * (window + 1) // 2 + (seq_length - window) * window


def chunk_pairs(seq_length: int, chunk: int) -> int:
    """Query-key pairs of one causal sequence under chunked attention (transformers Llama 4's
    ``chunked_attention``: a query sees the earlier keys of its own block of ``chunk`` tokens):
    ``S // C`` whole chunks of ``C(C+1)/2`` and the remainder's ``r(r+1)/2``."""
    if not chunk or seq_length <= chunk:
        return causal_pairs(seq_length)
    whole, rest = divmod(seq_length, chunk)
    return whole * causal_pairs(chunk) + causal_pairs(rest)


def _sequence_pairs(cfg: ModelConfig, role: LayerRole, seq_length: int) -> tuple[int, int]:
    """(query-key pairs, (query, attended key) pairs) of one causal sequence at ``role``: the
    indexer's selection on a DSA model, the sliding window on a windowed layer, the chunks on a
    chunked one."""
    if role.window or role.chunk:
        pairs = window_pairs(seq_length, role.window) if role.window else chunk_pairs(seq_length, role.chunk)
        return pairs, pairs
    return causal_pairs(seq_length), causal_selected_pairs(cfg, seq_length)


def _token_positions(cfg: ModelConfig, role: LayerRole, context: int) -> tuple[int, int]:
    """(key positions, attended key positions) of one query at ``context`` at ``role`` (the last
    token of a ``context``-long prefix: on a chunked layer, its place in its chunk)."""
    if role.window or role.chunk:
        seen = min(context, role.window) if role.window else (context - 1) % role.chunk + 1
        return seen, seen
    return context, topk_positions(cfg, context)


def causal_selected_pairs(cfg: ModelConfig, seq_length: int) -> int:
    """``sum over t = 1..S of min(k, t)``: the (query, selected key) pairs of one sequence - the
    pairs of a sliding window of ``k`` (:func:`window_pairs`), all of them without an indexer."""
    return window_pairs(seq_length, cfg.index_topk if cfg.has_indexer else 0)


def _attention_dims(cfg: ModelConfig) -> tuple[int, int]:
    """(QK, PV) dims per query head and key position of the attention as the engine computes it:
    absorbed MLA on the DSA sparse path, non-absorbed MLA for dense MLA training, head_dim for
    GQA / MHA (module docstring)."""
    if cfg.attention == "gqa":
        return cfg.head_dim, cfg.head_dim
    if cfg.has_indexer and cfg.kv_lora_rank:
        return cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.kv_lora_rank
    return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim


def sparse_attention_per_position(cfg: ModelConfig) -> int:
    """FLOPs per query and attended key position: ``2*h*(QK + PV)`` with the dims of
    :func:`_attention_dims` (``2*h*(576 + 512)`` absorbed for GLM-5.2)."""
    qk, pv = _attention_dims(cfg)
    return 2 * cfg.num_attention_heads * (qk + pv)


def _layer_role(roles: RoleMap, layer: int) -> LayerRole:
    n = len(roles.layers)
    if 1 <= layer <= n:
        return roles.role(layer)
    if n < layer <= n + len(roles.mtp):
        return roles.mtp[layer - n - 1]
    raise ValueError(
        f"layer {layer} is out of range: the model has {n} decoder layers"
        + (f" and {len(roles.mtp)} MTP layer(s) numbered {n + 1}..{n + len(roles.mtp)}" if roles.mtp else "")
    )


def _layer_terms(cfg: ModelConfig, sh: Shapes, role: LayerRole, *, tokens: int, pairs: int,
                 selected: int) -> dict[str, int]:
    """Terms of one layer for ``tokens`` queries that see ``pairs`` query-key pairs in all and
    ``selected`` (query, selected key) pairs. MTP layers add eh_proj and their norms."""
    linear_params = sh.mixer(role.mixer) + sh.norms + sh.ffn_active(cfg, role.ffn)
    if role.mtp:
        linear_params += sh.mtp_extra
    own = role.has_indexer
    mamba = cfg.mamba if role.mixer == "mamba" else None
    return {
        "linear": 2 * linear_params * tokens,
        "indexer_projections": 2 * sh.indexer * tokens if own else 0,
        "indexer_scoring": 2 * cfg.index_n_heads * cfg.index_head_dim * pairs if own else 0,
        "indexer_weighting": 2 * cfg.index_n_heads * pairs if own else 0,
        "sparse_attention": sparse_attention_per_position(cfg) * selected if role.mixer == "attention" else 0,
        "ssm_scan": (mamba.scan_flops_per_token() * tokens if mamba else
                     cfg.gdn.rule_flops_per_token() * tokens if cfg.gdn and role.mixer == "gdn" else 0),
    }


def head_flops_per_token(cfg: ModelConfig, sh: Shapes | None = None) -> int:
    """Final norm gains + lm_head (``V*H``; the embedding's when tied): ``2*(H + V*H)``."""
    sh = sh or shapes(cfg)
    return 2 * (sh.final_norm + (sh.lm_head or sh.embedding))


def every_layer_roles(cfg: ModelConfig, roles: RoleMap | None = None) -> RoleMap:
    """The same model with an indexer on every decoder layer (pattern ``F``)."""
    if not cfg.has_indexer:
        return roles or derive_roles(cfg)
    return derive_roles(cfg, pattern="F")   # an override: every engine's rule gives the same roles


# --------------------------------------------------------------------------- per token


def layer_flops(cfg: ModelConfig, roles: RoleMap, layer: int, context: int) -> dict[str, int]:
    """Per-token forward FLOPs of decoder layer ``layer`` (1-based; MTP layers are numbered after
    the decoder) at ``context``, by term, with ``total``. No lm_head."""
    _check_int("context", context)
    role = _layer_role(roles, layer)
    pairs, selected = _token_positions(cfg, role, context)
    terms = _layer_terms(cfg, shapes(cfg), role, tokens=1, pairs=pairs, selected=selected)
    return _with_total(terms, 0)


def per_layer_forward_flops(cfg: ModelConfig, roles: RoleMap, layer: int, context: int) -> int:
    """Per-token forward FLOPs of one layer at ``context`` (all terms; the layer's cost for an
    optimiser balancing stages)."""
    return layer_flops(cfg, roles, layer, context)["total"]


def mtp_layer_forward_flops(cfg: ModelConfig, roles: RoleMap, k: int, context: int) -> int:
    """Per-token forward FLOPs of the ``k``-th MTP layer (1-based) at ``context``, all terms."""
    _check_int("context", context)
    _check_int("k", k)
    role = _mtp_role(cfg, roles, k)
    pairs, selected = _token_positions(cfg, role, context)
    return sum(_layer_terms(cfg, shapes(cfg), role, tokens=1, pairs=pairs, selected=selected).values())


def token_flops(cfg: ModelConfig, roles: RoleMap, context: int) -> dict[str, int]:
    """Per-token forward FLOPs of the main model (decoder layers + final norm + lm_head, no MTP,
    no input embedding) at ``context``, by term, with ``total`` and ``linear_lm_head``."""
    _check_int("context", context)
    sh = shapes(cfg)
    acc = _zero()
    for role in roles.layers:
        pairs, selected = _token_positions(cfg, role, context)
        _add(acc, _layer_terms(cfg, sh, role, tokens=1, pairs=pairs, selected=selected))
    head = head_flops_per_token(cfg, sh)
    acc["linear"] += head
    return _with_total(acc, head)


def convention_total(breakdown: dict[str, int], convention: str) -> int:
    """The FLOPs a named convention counts out of a :func:`token_flops` breakdown."""
    try:
        conv = CONVENTIONS[convention]
    except KeyError:
        raise ValueError(f"unknown convention {convention!r}; use one of {list(CONVENTIONS)}") from None
    total = sum(breakdown[t] for t in conv["terms"])
    if not conv["lm_head"]:
        total -= breakdown["linear_lm_head"]
    return total


def _convention_sentence(name: str) -> str:
    return f"{name}: {CONVENTIONS[name]['description']}"


def flops_report(cfg: ModelConfig, context: int, roles: RoleMap | None = None,
                 pattern: str | None = None) -> dict[str, Any]:
    """Per-token forward FLOPs at ``context``, IndexShare (the roles as derived, or ``pattern``)
    versus an indexer on every layer; JSON-ready."""
    _check_int("context", context)
    roles = roles or derive_roles(cfg, pattern=pattern)
    every = every_layer_roles(cfg, roles)
    a = token_flops(cfg, roles, context)
    b = token_flops(cfg, every, context)
    ratios = {name: convention_total(b, name) / convention_total(a, name) for name in CONVENTIONS}
    notes = []
    if cfg.max_position_embeddings is not None and context > cfg.max_position_embeddings:
        notes.append(f"context {context:,} exceeds max_position_embeddings {cfg.max_position_embeddings:,}")
    if not cfg.has_indexer:
        notes.append("the model has no DSA indexer: attention is dense over L and both variants are equal")
    if roles.errors:
        notes.append("the roles have errors (a shared layer without a source); FLOPs counted as if it ran")
    return {
        "model": cfg.id,
        "context": context,
        "indexshare_flops": convention_total(a, DEFAULT_CONVENTION),
        "every_layer_flops": convention_total(b, DEFAULT_CONVENTION),
        "ratio": ratios[DEFAULT_CONVENTION],
        "ratios": ratios,
        "default_convention": DEFAULT_CONVENTION,
        "published_convention": PUBLISHED_CONVENTION,
        "convention": (
            "Forward FLOPs of one token at context L (it sees L positions), 2 FLOPs per multiply-add, "
            "main model without MTP. indexshare_flops, every_layer_flops and ratio count the convention "
            f"of the published '2.9x at 1M' ({PUBLISHED_CONVENTION}): 2 x activated parameters without "
            "the lm_head and final norm (indexer projections included, no input embedding) + indexer "
            "scoring 2*L*Hi*di on layers that own an indexer. ratios gives the other conventions; "
            "breakdown lists every term: linear (2 x activated decoder weights without the indexer, + "
            "final norm + lm_head), indexer_projections (wq_b, wk, weights_proj, k_norm), "
            "indexer_scoring (2*L*Hi*di), indexer_weighting (2*L*Hi), sparse_attention (the attention "
            "core on every layer: absorbed MLA over min(index_topk, L) positions on the DSA path, non-absorbed "
            "MLA or GQA over all L positions without an indexer). Not counted anywhere: softmax, ReLU, "
            "top-k selection, RoPE, residual adds. "
            + " | ".join(_convention_sentence(n) for n in CONVENTIONS)
        ),
        "breakdown": {"indexshare": a, "every_layer": b},
        "indexer_layers": {"indexshare": sum(r.has_indexer for r in roles.layers),
                           "every_layer": sum(r.has_indexer for r in every.layers)},
        "notes": notes,
    }


def flops_vs_context(cfg: ModelConfig, contexts: Iterable[int], roles: RoleMap | None = None,
                     pattern: str | None = None) -> dict[str, Any]:
    """Per-token FLOPs of both variants and their ratios at each context, as lists for a plot."""
    ctx = [_check_int("context", c) for c in contexts]
    roles = roles or derive_roles(cfg, pattern=pattern)
    every = every_layer_roles(cfg, roles)
    out: dict[str, Any] = {
        "contexts": ctx,
        "indexshare_flops": [],
        "every_layer_flops": [],
        "ratio": [],
        "ratios": {name: [] for name in CONVENTIONS},
        "default_convention": DEFAULT_CONVENTION,
    }
    for c in ctx:
        a, b = token_flops(cfg, roles, c), token_flops(cfg, every, c)
        out["indexshare_flops"].append(convention_total(a, DEFAULT_CONVENTION))
        out["every_layer_flops"].append(convention_total(b, DEFAULT_CONVENTION))
        for name in CONVENTIONS:
            out["ratios"][name].append(convention_total(b, name) / convention_total(a, name))
        out["ratio"].append(out["ratios"][DEFAULT_CONVENTION][-1])
    return out


# --------------------------------------------------------------------------- per micro-batch / stage


def _sequence_layer_terms(cfg: ModelConfig, sh: Shapes, role: LayerRole, seq_length: int, mbs: int) -> dict[str, int]:
    pairs, selected = _sequence_pairs(cfg, role, seq_length)
    terms = _layer_terms(cfg, sh, role, tokens=seq_length, pairs=pairs, selected=selected)
    return {t: v * mbs for t, v in terms.items()}


def sequence_layer_flops(cfg: ModelConfig, role: LayerRole, *, seq_length: int, mbs: int = 1) -> dict[str, int]:
    """Forward FLOPs of one layer (``role``: a decoder or MTP layer) on ``mbs`` causal sequences of
    ``seq_length`` tokens, by term (the per-layer terms the step-time model times)."""
    _check_int("seq_length", seq_length)
    _check_int("mbs", mbs)
    return _sequence_layer_terms(cfg, shapes(cfg), role, seq_length, mbs)


def mtp_role(cfg: ModelConfig, roles: RoleMap, k: int) -> LayerRole:
    """The role of the ``k``-th MTP layer (1-based), built like Megatron's when ``roles`` has fewer."""
    return _mtp_role(cfg, roles, k)


def _mtp_role(cfg: ModelConfig, roles: RoleMap, k: int) -> LayerRole:
    """The k-th MTP layer (1-based); built like Megatron's when the RoleMap has fewer."""
    if k <= len(roles.mtp):
        return roles.mtp[k - 1]
    n = cfg.num_hidden_layers + k
    return LayerRole(n, "full", n, "moe" if cfg.n_routed_experts else "dense", cfg.has_indexer, mtp=True)


def _stage_terms(cfg: ModelConfig, sh: Shapes, roles: RoleMap, stage: Stage, *, seq_length: int,
                 mbs: int, mtp_before: int, mtp_total: int,
                 per_kind: dict[LayerKind, dict[str, int]] | None = None) -> tuple[dict[str, int], int]:
    """A stage's terms: its decoder and MTP layers (:func:`_sequence_layer_terms`, derived once per
    layer kind and kept in ``per_kind``, which the stages of one plan may share) and the loss head."""
    per_kind = {} if per_kind is None else per_kind
    held = Counter(roles.kinds_of(stage.layers))
    acc = _zero()
    for kind, n in held.items():
        if kind not in per_kind:
            per_kind[kind] = _sequence_layer_terms(cfg, sh, LayerRole.of_kind(kind), seq_length, mbs)
        _add(acc, {t: v * n for t, v in per_kind[kind].items()})
    for k in range(mtp_before + 1, mtp_before + stage.mtp_layers + 1):
        _add(acc, _sequence_layer_terms(cfg, sh, _mtp_role(cfg, roles, k), seq_length, mbs))
    head = 0
    if stage.loss:
        tokens = seq_length * mbs
        head = head_flops_per_token(cfg, sh) * tokens
        # MTP logits through the shared output layer, computed on the post_process stage
        head += 2 * (sh.lm_head or sh.embedding) * tokens * mtp_total
        acc["linear"] += head
    return acc, head


def forward_flops(cfg: ModelConfig, roles: RoleMap, *, seq_length: int, mbs: int = 1,
                  mtp_layers: int | None = None) -> dict[str, int]:
    """Forward FLOPs of the whole model on ``mbs`` causal sequences of ``seq_length`` tokens:
    decoder layers, ``mtp_layers`` MTP layers (the launch's ``--mtp-num-layers``; ``None`` = 0, as
    slime and Megatron build none without the flag) with their logits, final norm and lm_head.
    By term, with ``total`` and ``linear_lm_head`` (all logits)."""
    _check_int("seq_length", seq_length)
    _check_int("mbs", mbs)
    n_mtp = 0 if mtp_layers is None else _check_int("mtp_layers", mtp_layers, 0)
    whole = Stage(0, 0, 0, 1 if roles.layers else None, len(roles.layers) if roles.layers else None,
                  len(roles.layers), embedding=True, loss=True, mtp_layers=n_mtp)
    terms, head = _stage_terms(cfg, shapes(cfg), roles, whole, seq_length=seq_length, mbs=mbs,
                               mtp_before=0, mtp_total=n_mtp)
    return _with_total(terms, head)


#: Each layer kind's terms by (model, sequence, micro-batch): the plans of a live page or a search
#: share them (bounded: cleared when it holds this many shapes).
_KIND_TERMS: dict[tuple[ModelConfig, int, int], dict[LayerKind, dict[str, int]]] = {}
KIND_TERMS_SIZE = 256


def _kind_terms(cfg: ModelConfig, seq_length: int, mbs: int) -> dict[LayerKind, dict[str, int]]:
    """The shared ``per_kind`` of :func:`_stage_terms` for one model and micro-batch shape."""
    return scope(_KIND_TERMS, (cfg, seq_length, mbs), KIND_TERMS_SIZE)


#: A stage's terms with their total (:func:`_with_total` of :func:`_stage_terms`) by
#: :func:`_stage_key`, within the scope of one model and micro-batch shape: a drag changes two
#: stages, and the others are served from here (whole numbers, so the same sums). Bounded.
_STAGE_TERMS: dict[tuple[ModelConfig, int, int], dict[tuple[Any, ...], dict[str, int]]] = {}
STAGE_TERMS_SIZE = 64
STAGE_KEYS_SIZE = 4096


def _stage_key(cfg: ModelConfig, roles: RoleMap, stage: Stage, mtp_before: int, mtp_total: int) -> tuple[Any, ...]:
    """Everything :func:`_stage_terms` reads of a stage: its layers' kinds, its MTP layers' kinds
    and, on the loss stage, the MTP layer count (the MTP logits)."""
    return (roles.kinds_of(stage.layers),
            tuple(_mtp_role(cfg, roles, k).kind for k in range(mtp_before + 1, mtp_before + stage.mtp_layers + 1)),
            stage.loss, mtp_total if stage.loss else 0)


def stage_flops(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, *, seq_length: int,
                mbs: int = 1) -> dict[str, Any]:
    """Forward FLOPs per stage and per pipeline rank for one micro-batch of ``mbs`` causal
    sequences of ``seq_length`` tokens (exact causal sums: average context ``(S+1)/2`` for the
    indexer, ``sum min(k, t)`` for sparse attention). A rank's FLOPs are the sum of its virtual
    stages. ``imbalance`` = busiest rank / mean rank (1.0 is a perfectly balanced layout)."""
    _check_int("seq_length", seq_length)
    _check_int("mbs", mbs)
    sh = shapes(cfg)
    stages_out = []
    mtp_seen = 0
    rank_totals = [0] * plan.pp
    per_kind = _kind_terms(cfg, seq_length, mbs)
    per_stage = scope(_STAGE_TERMS, (cfg, seq_length, mbs), STAGE_TERMS_SIZE)
    for s in plan.stages:
        key = _stage_key(cfg, roles, s, mtp_seen, plan.mtp_layers)
        found = per_stage.get(key)
        if found is None:
            terms, head = _stage_terms(cfg, sh, roles, s, seq_length=seq_length, mbs=mbs,
                                       mtp_before=mtp_seen, mtp_total=plan.mtp_layers, per_kind=per_kind)
            found = remember(per_stage, key, _with_total(terms, head), STAGE_KEYS_SIZE)
        mtp_seen += s.mtp_layers
        b = dict(found)
        rank_totals[s.pp_rank] += b["total"]
        stages_out.append({
            "index": s.index,
            "pp_rank": s.pp_rank,
            "vp_stage": s.vp_stage,
            "first_layer": s.first_layer,
            "last_layer": s.last_layer,
            "num_layers": s.num_layers,
            "embedding": s.embedding,
            "loss": s.loss,
            "mtp_layers": s.mtp_layers,
            "flops": b["total"],
            "breakdown": b,
        })
    total = sum(rank_totals)
    mean = total / plan.pp if plan.pp else 0.0
    busiest = max(rank_totals) if rank_totals else 0
    return {
        "seq_length": seq_length,
        "mbs": mbs,
        "tokens": seq_length * mbs,
        "pp": plan.pp,
        "vpp": plan.vpp,
        "stages": stages_out,
        "ranks": [{"pp_rank": r, "flops": f, "share": (f / total if total else 0.0)}
                  for r, f in enumerate(rank_totals)],
        "total": total,
        "max_rank_flops": busiest,
        "imbalance": (busiest / mean) if mean else 0.0,
        "convention": (
            "forward FLOPs of one micro-batch (mbs x seq_length tokens), 2 per multiply-add, all terms "
            "of the 'full' convention; causal attention summed exactly (indexer over S(S+1)/2 query-key "
            "pairs per sequence = average context (S+1)/2; sparse attention over sum_t min(index_topk, t)); "
            "final norm + lm_head and the MTP logits on the loss stage; MTP layers (with their own "
            "indexer and eh_proj) on their stage; no FLOPs for the input embedding"
        ),
    }


# --------------------------------------------------------------------------- training


def training_flops(cfg: ModelConfig, roles: RoleMap, *, seq_length: int, global_batch_size: int,
                   recompute: str = "none", recompute_layers: Iterable[int] | None = None,
                   mtp_layers: int | None = None) -> dict[str, Any]:
    """FLOPs of one training step over ``global_batch_size`` sequences of ``seq_length``:
    forward + backward, plus, with ``recompute="full"``, one more forward of the recomputed decoder
    layers (``recompute_layers``, 1-based; default all of them, as ``--recompute-method uniform``).
    The lm_head, the loss and the MTP layers are not recomputed.

    Backward is 2 x forward for every term except the indexer's scoring and head weighting: the
    engine's indexer backward runs only over the selected top-k pairs (THUDM/slime
    ``slime_plugins/models/glm5/ops/indexer.py`` @ 624b824, ``IndexerFunction.backward`` calls
    ``indexer_bwd_interface(..., topk_indices, grad_scores)``), so their backward is 2 x their
    forward rate times ``sum_t min(k, t)`` pairs instead of ``S(S+1)/2``. The dense scoring
    backward, which the engine does not run, is not counted."""
    _check_int("global_batch_size", global_batch_size)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {list(RECOMPUTE_MODES)}, got {recompute!r}")
    fwd = forward_flops(cfg, roles, seq_length=seq_length, mbs=global_batch_size, mtp_layers=mtp_layers)
    recompute_flops = 0
    recomputed: list[int] = []
    if recompute == "full":
        n = len(roles.layers)
        recomputed = sorted(set(range(1, n + 1) if recompute_layers is None else recompute_layers))
        bad = [x for x in recomputed if not 1 <= x <= n]
        if bad:
            raise ValueError(f"recompute_layers must be decoder layers 1..{n}; got {bad[:5]}")
        sh = shapes(cfg)
        for x in recomputed:
            recompute_flops += sum(_sequence_layer_terms(cfg, sh, roles.role(x), seq_length, global_batch_size).values())
    forward = fwd["total"]
    pairs, selected = causal_pairs(seq_length), causal_selected_pairs(cfg, seq_length)
    dense_indexer = fwd["indexer_scoring"] + fwd["indexer_weighting"]
    sparse_indexer = dense_indexer // pairs * selected  # the same rate over the selected pairs
    backward = 2 * (forward - dense_indexer) + 2 * sparse_indexer
    return {
        "seq_length": seq_length,
        "global_batch_size": global_batch_size,
        "tokens": seq_length * global_batch_size,
        "forward": forward,
        "backward": backward,
        "indexer_backward": 2 * sparse_indexer,
        "recompute": recompute_flops,
        "recompute_mode": recompute,
        "recomputed_layers": len(recomputed),
        "total": forward + backward + recompute_flops,
        "forward_breakdown": fwd,
        "convention": (
            "forward + backward of the global batch, backward = 2 x forward except the indexer scoring and "
            "weighting, whose backward runs over the selected top-k pairs only (slime IndexerFunction.backward); "
            "'full' convention with exact causal sums; full recompute adds one forward of each recomputed decoder layer (not the lm_head, "
            "loss or MTP layers)"
        ),
    }


__all__ = [
    "CONVENTIONS", "DEFAULT_CONVENTION", "PUBLISHED_CONVENTION", "TERMS",
    "causal_pairs", "causal_selected_pairs", "convention_total", "every_layer_roles",
    "flops_report", "flops_vs_context", "forward_flops", "head_flops_per_token", "layer_flops",
    "mtp_layer_forward_flops", "mtp_role", "per_layer_forward_flops", "sequence_layer_flops",
    "sparse_attention_per_position", "stage_flops", "token_flops",
    "topk_positions", "training_flops", "window_pairs",
]
