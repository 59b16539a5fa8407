"""Megatron's stage placement: exactly the (pp_rank, vp_stage) -> decoder-layer blocks Megatron builds.

Inputs are one of: explicit stage sizes (vp-major), Megatron pipeline flags, or a
``--pipeline-model-parallel-layout`` string. Output is a :class:`StagePlan`: the stages in
vp-major order (stage ``i`` is pipeline rank ``i % PP``, virtual stage ``i // PP``), where the
embedding, the loss / lm_head and the MTP layers sit, and every acceptance error Megatron would
raise, each naming the flag to change.

Sources (NVIDIA/Megatron-LM):

* ``megatron/core/transformer/transformer_layer.py: get_transformer_layer_offset`` and
  ``megatron/core/transformer/transformer_block.py: get_num_layers_to_build`` - the placement:
  virtual chunk ``v`` is one block of consecutive layers in which rank 0 holds ``F/VPP``, each
  middle rank ``(N-F-L)/(M*VPP)`` and the last rank ``L/VPP``; ``account_for_*`` add one slot each
  to ``N`` and take it from the first / last virtual stage;
* ``megatron/core/transformer/transformer_config.py: __post_init__`` - first/last > 0, divisible by
  VPP, "middle layers remaining but no middle stages" mismatch, middle divisibility, first/last
  cannot combine with ``account_for_*``, layout cannot combine with any of them;
* ``megatron/training/arguments.py: validate_args`` - at most one of
  ``--num-layers-per-virtual-pipeline-stage`` / ``--num-virtual-stages-per-pipeline-rank`` /
  ``--pipeline-model-parallel-layout`` (so a layout with a VPP flag is an error even for VPP 1);
  VPP from ``--num-layers-per-virtual-pipeline-stage K`` is ``((N + slots) / PP) / K`` where each
  ``--account-for-*`` flag adds one slot (not with first/last); VPP 1 becomes ``None``; an
  interleaved schedule needs PP > 1 with ``overlap_p2p_comm``, which is **on by default** (the
  flag is ``--no-overlap-p2p-communication``), PP > 2 with it off;
* ``transformer_layer.py: get_transformer_layer_offset`` divides by the number of middle ranks
  under VPP, so PP 2 + VPP with both first and last given crashes (ZeroDivisionError): isplan
  refuses that form and never emits it;
* MTP layers are not counted in ``num_layers``; without a layout they sit on the last rank's last
  virtual stage.

Read at NVIDIA/Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22).

The reverse direction, :func:`megatron_flags`, expresses any plan as first/last (+VPP) flags when
they can, otherwise as a layout string; reading the emitted flags back (a launcher line through
:func:`app.core.launcher.parse_launcher` and ``launcher_request``) gives the same stages.
"""


from __future__ import annotations

from typing import Any

from app.core.layout.pipeline_layout import FLAG as LAYOUT_FLAG
from app.core.layout.pipeline_layout import (
    LayoutSyntaxError,
    check_layout,
    encode_layout,
    parse_layout,
)
from app.core.layout.stages import LayoutInputError, PipelineSpec, PlanError, Stage, StagePlan
from app.core.plan.bounds import MAX_MTP_LAYERS, MAX_PP, MAX_VPP

PP_FLAG = "--pipeline-model-parallel-size"
FIRST_FLAG = "--decoder-first-pipeline-num-layers"
LAST_FLAG = "--decoder-last-pipeline-num-layers"
VPP_FLAG = "--num-virtual-stages-per-pipeline-rank"
LPVS_FLAG = "--num-layers-per-virtual-pipeline-stage"
EMB_FLAG = "--account-for-embedding-in-pipeline-split"
LOSS_FLAG = "--account-for-loss-in-pipeline-split"
NO_OVERLAP_FLAG = "--no-overlap-p2p-communication"
MTP_FLAG = "--mtp-num-layers"

def interleave_error(pp: int, vpp: int, overlap_p2p: bool, flag: str, shown: int | None = None) -> PlanError | None:
    """validate_args: an interleaved schedule (VPP > 1) needs PP > 1, or PP > 2 when p2p overlap is
    off. ``shown`` is the user's value of ``flag`` when it is not the VPP itself."""
    need = 1 if overlap_p2p else 2
    if vpp > 1 and pp <= need:
        if flag == LAYOUT_FLAG:
            given = f"{flag} (VPP {vpp})"
        else:
            given = f"{flag} {shown if shown is not None else vpp}" + (f" (VPP {vpp})" if shown is not None else "")
        why = (f"with {NO_OVERLAP_FLAG} it needs {PP_FLAG} > 2; drop {NO_OVERLAP_FLAG} or raise PP"
               if not overlap_p2p else f"it needs {PP_FLAG} > 1")
        return PlanError("interleave_needs_pp", f"{given} interleaves stages; {why}; PP is {pp}", flag)
    return None


def _assemble(pp: int, vpp: int, sizes: list[int], n_mtp: int, mtp_stage: int | None = None,
              emb_stage: int = 0, loss_stage: int | None = None) -> tuple[Stage, ...]:
    """Stages from vp-major sizes, laying decoder layers out consecutively from layer 1."""
    stages = []
    nxt = 1
    total = len(sizes)
    mtp_at = total - 1 if mtp_stage is None else mtp_stage
    loss_at = total - 1 if loss_stage is None else loss_stage
    for i, size in enumerate(sizes):
        first = nxt if size > 0 else None
        last = nxt + size - 1 if size > 0 else None
        stages.append(
            Stage(i, i % pp, i // pp, first, last, size, embedding=(i == emb_stage),
                  loss=(i == loss_at), mtp_layers=(n_mtp if i == mtp_at else 0))
        )
        nxt += size
    return tuple(stages)


def _positive(value: int | None, flag: str, errors: list[PlanError], minimum: int = 1) -> bool:
    if value is None:
        return True
    if value < minimum:
        errors.append(PlanError("flag_range", f"{flag} must be at least {minimum}, got {value}", flag))
        return False
    return True


def _refuse_out_of_range(spec: PipelineSpec, n_mtp: int) -> None:
    """Input that is no pipeline at all (raises :class:`LayoutInputError`, exit code 2): a negative
    MTP count, a PP / VPP / layers-per-virtual-stage below 1, a PP, VPP or MTP count over isplan's bounds
    (a launcher's ``--mtp-num-layers 1000000000`` reached here unbounded and hung the role derivation)."""
    if n_mtp < 0:
        raise LayoutInputError(f"{MTP_FLAG} cannot be negative, got {n_mtp}")
    if n_mtp > MAX_MTP_LAYERS:
        raise LayoutInputError(f"{MTP_FLAG} {n_mtp} is over the limit of {MAX_MTP_LAYERS}")
    for value, flag in ((spec.pp, PP_FLAG), (spec.vpp, VPP_FLAG), (spec.layers_per_vstage, LPVS_FLAG)):
        if value is not None and value < 1:
            raise LayoutInputError(f"{flag} must be at least 1, got {value}")
    if spec.pp is not None and spec.pp > MAX_PP:
        raise LayoutInputError(f"{PP_FLAG} {spec.pp} is over the limit of {MAX_PP}")
    if spec.vpp is not None and spec.vpp > MAX_VPP:
        raise LayoutInputError(f"{VPP_FLAG} {spec.vpp} is over the limit of {MAX_VPP}")


def materialise(spec: PipelineSpec, num_layers: int, default_mtp: int = 0) -> StagePlan:
    """Build the stages Megatron would build for ``spec`` over ``num_layers`` decoder layers.

    One placement rule per way of describing the pipeline: explicit sizes (:func:`_from_split`),
    a layout string (:func:`_from_layout`) or Megatron's flags (:func:`_from_flags`). Never raises
    for rule violations: they are returned as ``errors`` (and ``stages`` is empty when no placement
    exists). Raises :class:`LayoutInputError` only for unparsable input.
    """
    n_mtp = spec.mtp_layers if spec.mtp_layers is not None else default_mtp
    _refuse_out_of_range(spec, n_mtp)
    errors: list[PlanError] = []
    if spec.split is not None:
        pp, vpp, stages = _from_split(spec, num_layers, n_mtp, errors)
    elif spec.layout is not None:
        pp, vpp, stages = _from_layout(spec, num_layers, n_mtp, errors)
    else:
        pp, vpp, stages = _from_flags(spec, num_layers, n_mtp, errors)
    return StagePlan(pp, vpp, num_layers, n_mtp, stages, tuple(errors), spec)


_Placed = tuple[int, int, tuple[Stage, ...]]  # (PP, VPP, stages; empty when no placement exists)


def _from_split(spec: PipelineSpec, n: int, n_mtp: int, errors: list[PlanError]) -> _Placed:
    """Explicit vp-major stage sizes (isplan's own form, emitted as a layout string): PP x VPP
    entries that place every decoder layer once; interleaving follows ``validate_args``
    (``megatron/training/arguments.py``)."""
    sizes = list(spec.split or ())
    split_vpp = spec.vpp or 1
    if len(sizes) % split_vpp != 0:
        raise LayoutInputError(
            f"--split has {len(sizes)} entries, which does not divide by --vpp {split_vpp}; "
            "give PP x VPP sizes in vp-major order"
        )
    pp = len(sizes) // split_vpp
    if spec.pp is not None and spec.pp != pp:
        raise LayoutInputError(f"--split has {len(sizes)} entries = PP {pp} x VPP {split_vpp}, but --pp is {spec.pp}")
    if (e := interleave_error(pp, split_vpp, spec.overlap_p2p, "--vpp")) is not None:
        errors.append(e)
    total = sum(sizes)
    if total != n:
        errors.append(PlanError("layer_sum", f"stage sizes sum to {total}, but the model has {n} decoder layers "
                                "(num_hidden_layers); every layer must be placed exactly once", "--split"))
    return pp, split_vpp, _assemble(pp, split_vpp, sizes, n_mtp)


def _layout_conflict(spec: PipelineSpec) -> PlanError | None:
    """A layout beside any other shaping flag: ``validate_args`` allows at most one of LPVS / VPP /
    layout (even VPP 1), and ``TransformerConfig.__post_init__``
    (``megatron/core/transformer/transformer_config.py``) refuses first/last and account_for_* with it."""
    conflicts = [
        f for f, on in ((VPP_FLAG, spec.vpp is not None), (LPVS_FLAG, spec.layers_per_vstage is not None),
                        (FIRST_FLAG, spec.first is not None), (LAST_FLAG, spec.last is not None),
                        (EMB_FLAG, spec.account_for_embedding), (LOSS_FLAG, spec.account_for_loss)) if on
    ]
    if not conflicts:
        return None
    return PlanError("layout_conflict",
                     f"{LAYOUT_FLAG} cannot be combined with {', '.join(conflicts)}; drop them "
                     "(the layout already says where every layer goes and how many virtual stages "
                     "there are)", LAYOUT_FLAG)


def _from_layout(spec: PipelineSpec, n: int, n_mtp: int, errors: list[PlanError]) -> _Placed:
    """A ``--pipeline-model-parallel-layout`` string: parsed and checked by
    ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (:mod:`app.core.layout.pipeline_layout`);
    each stage holds exactly its tokens (E, t, m, L), so the embedding, loss and MTP sit where written."""
    pp = spec.pp or 1
    if (conflict := _layout_conflict(spec)) is not None:
        errors.append(conflict)
    try:
        token_stages = parse_layout(spec.layout or "")
    except LayoutSyntaxError as exc:
        raise LayoutInputError(str(exc)) from None
    detected, issues = check_layout(token_stages, pp, n, n_mtp, None)
    errors.extend(PlanError(i.code, i.message, i.flag) for i in issues)
    if detected is None:
        return pp, 1, ()
    if (e := interleave_error(pp, detected, spec.overlap_p2p, LAYOUT_FLAG)) is not None:
        errors.append(e)
    stages = []
    nxt = 1
    for i, toks in enumerate(token_stages):
        size = toks.count("t")
        stages.append(Stage(i, i % pp, i // pp, nxt if size else None, nxt + size - 1 if size else None,
                            size, embedding="E" in toks, loss="L" in toks, mtp_layers=toks.count("m")))
        nxt += size
    return pp, detected, tuple(stages)


def _from_flags(spec: PipelineSpec, n: int, n_mtp: int, errors: list[PlanError]) -> _Placed:
    """Megatron's pipeline flags: the VPP (given, or derived from ``--num-layers-per-virtual-pipeline-stage``
    by ``validate_args``), then one of three splits - uneven first/last (:func:`_uneven_sizes`),
    account_for_* (:func:`_account_sizes`) or even (:func:`_even_sizes`) - as
    ``transformer_block.py: get_num_layers_to_build`` builds them."""
    pp = spec.pp or 1
    vpp = spec.vpp
    if spec.layers_per_vstage is not None:
        derived = _vpp_from_layers_per_vstage(spec, n, pp, errors)
        if derived is None:
            return pp, 1, ()
        vpp = derived
    v = vpp or 1
    vflag = LPVS_FLAG if spec.layers_per_vstage is not None else VPP_FLAG
    if (e := interleave_error(pp, v, spec.overlap_p2p, vflag, spec.layers_per_vstage)) is not None:
        errors.append(e)
    if spec.first is not None or spec.last is not None:
        sizes = _uneven_sizes(spec, n, pp, v, vflag, errors)
    elif spec.account_for_embedding or spec.account_for_loss:
        sizes = _account_sizes(spec, n, pp, v, vflag, errors)
    else:
        sizes = _even_sizes(n, pp, v, vflag, errors)
    return pp, v, (() if sizes is None else _assemble(pp, v, sizes, n_mtp))


def _uneven_sizes(spec: PipelineSpec, n: int, pp: int, v: int, vflag: str, errors: list[PlanError]) -> list[int] | None:
    """``--decoder-first/last-pipeline-num-layers``: rank 0 holds ``first``, the last rank ``last``,
    each middle rank the rest shared evenly, every rank's count cut into ``v`` equal virtual
    chunks (``transformer_block.py: get_num_layers_to_build``; the rules of
    ``transformer_config.py: __post_init__``). ``None`` (errors appended) when Megatron refuses."""
    first, last = spec.first, spec.last
    if spec.account_for_embedding or spec.account_for_loss:
        errors.append(
            PlanError("uneven_with_account",
                      f"{FIRST_FLAG} / {LAST_FLAG} cannot be set together with {EMB_FLAG} / {LOSS_FLAG}; "
                      "keep one way of shaping the edge stages", FIRST_FLAG if first is not None else LAST_FLAG)
        )
        return None
    if not (_positive(first, FIRST_FLAG, errors) & _positive(last, LAST_FLAG, errors)):
        return None
    if pp == 1 and first is not None and last is not None:
        return _one_rank_with_edges(first, last, n, errors)
    for value, flag, where in ((first, FIRST_FLAG, "first"), (last, LAST_FLAG, "last")):
        if value is not None and value % v != 0:
            errors.append(PlanError("edge_vpp_divisibility", f"{flag} {value} (layers at the {where} stage) must "
                                    f"be divisible by {vflag} {v}", flag))
    mid = _middle_rank_layers(spec, n, pp, v, vflag, errors)
    if mid is None or any(e.code in ("edge_vpp_divisibility", "middle_vpp_divisibility") for e in errors):
        return None
    rank_layers = [mid] * pp
    if first is not None:
        rank_layers[0] = first
    if last is not None:
        rank_layers[-1] = last
    return [rank_layers[r] // v for _ in range(v) for r in range(pp)]


def _one_rank_with_edges(first: int, last: int, n: int, errors: list[PlanError]) -> list[int] | None:
    """PP 1 with both first and last: ``TransformerConfig`` counts -1 middle ranks (no error unless
    N - first - last is 0) and ``get_num_layers_to_build`` gives the only rank the last stage's
    count, so the model is whole only when that is every layer."""
    if last != n or first + last == n:
        errors.append(PlanError("uneven_needs_pp",
                                f"{FIRST_FLAG} {first} and {LAST_FLAG} {last} with {PP_FLAG} 1: Megatron "
                                f"builds {LAST_FLAG} layers on the only rank, not the model's {n}; "
                                f"drop {FIRST_FLAG} / {LAST_FLAG} or raise PP", PP_FLAG))
        return None
    return [n]


def _middle_refusal(spec: PipelineSpec, n: int, pp: int, v: int, vflag: str) -> PlanError | None:
    """What ``transformer_config.py: __post_init__`` and ``transformer_layer.py:
    get_transformer_layer_offset`` refuse about the middle ranks: edges over the model, "middle layers
    remaining but no middle stages" (or the reverse), and PP 2 + VPP with both edges (a
    ZeroDivisionError on rank 1: isplan refuses that form and never emits it)."""
    first, last = spec.first, spec.last
    middle_stages = pp - (first is not None) - (last is not None)
    remaining = n - (first or 0) - (last or 0)
    if remaining < 0:
        return PlanError("edges_exceed_layers",
                         f"{FIRST_FLAG} {first or 0} + {LAST_FLAG} {last or 0} = {(first or 0) + (last or 0)} "
                         f"exceeds the model's {n} decoder layers", FIRST_FLAG if first is not None else LAST_FLAG)
    if bool(remaining) != bool(middle_stages):
        return PlanError("middle_mismatch",
                         f"Mismatch: {remaining} middle layers remaining but {middle_stages} middle PP stages "
                         f"available; adjust {FIRST_FLAG} / {LAST_FLAG} or {PP_FLAG}", PP_FLAG)
    if pp == 2 and v > 1 and first is not None and last is not None:
        return PlanError("vpp_edges_no_middle",
                         f"{PP_FLAG} 2 with {vflag} {spec.layers_per_vstage or v} and both {FIRST_FLAG} and "
                         f"{LAST_FLAG} leaves no middle rank, and Megatron's get_transformer_layer_offset "
                         f"divides by the middle rank count (ZeroDivisionError on rank 1); give only one of "
                         f"{FIRST_FLAG} / {LAST_FLAG} (the other rank gets the rest) or a {LAYOUT_FLAG}", LAST_FLAG)
    return None


def _middle_rank_layers(spec: PipelineSpec, n: int, pp: int, v: int, vflag: str,
                        errors: list[PlanError]) -> int | None:
    """Layers on each middle rank with first/last given (0 when there is none): the rest divided
    by the middle ranks, which ``transformer_config.py: __post_init__`` requires to be whole and
    divisible by VPP; ``None`` when refused (the VPP divisibility error is appended but the count
    returned, so the caller sees every divisibility error at once)."""
    if (refusal := _middle_refusal(spec, n, pp, v, vflag)) is not None:
        errors.append(refusal)
        return None
    first, last = spec.first, spec.last
    middle_stages = pp - (first is not None) - (last is not None)
    if not middle_stages:
        return 0
    remaining = n - (first or 0) - (last or 0)
    if remaining % middle_stages != 0:
        near = _nearest_divisible_hint(n, pp, first, last)
        errors.append(PlanError("middle_divisibility", f"middle layers ({remaining}) must be divisible by the "
                                f"{middle_stages} middle pipeline stages{near}", LAST_FLAG if last is not None else FIRST_FLAG))
        return None
    mid = remaining // middle_stages
    if mid % v != 0:
        errors.append(PlanError("middle_vpp_divisibility",
                                f"layers on each middle pipeline rank ({mid}) must be divisible by {vflag} {v}", vflag))
    return mid


def _account_sizes(spec: PipelineSpec, n: int, pp: int, v: int, vflag: str, errors: list[PlanError]) -> list[int] | None:
    """``--account-for-embedding/loss-in-pipeline-split``: each adds one slot to N, the slots are
    split evenly over the PP x VPP chunks and the first / last virtual stage gives its slot up
    (``transformer_layer.py: get_transformer_layer_offset``, ``transformer_config.py: __post_init__``)."""
    slots = n + int(spec.account_for_embedding) + int(spec.account_for_loss)
    if slots % pp != 0:
        errors.append(PlanError("account_divisibility",
                                f"num_layers {n} plus the embedding/loss slots = {slots} must be divisible by {PP_FLAG} {pp}",
                                EMB_FLAG if spec.account_for_embedding else LOSS_FLAG))
        return None
    per_rank = slots // pp
    if per_rank % v != 0:
        errors.append(PlanError("account_vpp_divisibility",
                                f"layers per pipeline rank ({per_rank}, counting the embedding/loss slots) must be "
                                f"divisible by {vflag} {v}", vflag))
        return None
    sizes = [per_rank // v] * (pp * v)
    if spec.account_for_embedding:
        sizes[0] -= 1
    if spec.account_for_loss:
        sizes[-1] -= 1
    if sizes[0] < 0 or sizes[-1] < 0:
        errors.append(PlanError("account_empty_stage",
                                "Not enough layers in the first/last virtual pipeline stage for the embedding/loss slot",
                                EMB_FLAG if sizes[0] < 0 else LOSS_FLAG))
        return None
    return sizes


def _even_sizes(n: int, pp: int, v: int, vflag: str, errors: list[PlanError]) -> list[int] | None:
    """No shaping flag: N / PP layers per rank, cut into VPP equal chunks, both whole
    (``validate_args``, ``transformer_block.py: get_num_layers_to_build``)."""
    if n % pp != 0:
        errors.append(PlanError("even_divisibility",
                                f"num_layers {n} must be divisible by {PP_FLAG} {pp}; set {FIRST_FLAG} / {LAST_FLAG} "
                                f"or {LAYOUT_FLAG} for an uneven split", PP_FLAG))
        return None
    per_rank = n // pp
    if per_rank % v != 0:
        errors.append(PlanError("vpp_divisibility",
                                f"layers per pipeline rank ({per_rank}) must be divisible by {vflag} {v}", vflag))
        return None
    return [per_rank // v] * (pp * v)


def _vpp_from_layers_per_vstage(spec: PipelineSpec, n: int, pp: int, errors: list[PlanError]) -> int | None:
    """validate_args: VPP = ((N + slots) / PP) / K for ``--num-layers-per-virtual-pipeline-stage K``,
    one slot per ``--account-for-*`` flag; not with a VPP flag or first/last. Errors print the
    user's K, never the derived VPP."""
    k = spec.layers_per_vstage
    assert k is not None
    if spec.vpp is not None:
        errors.append(PlanError("vpp_conflict", f"{LPVS_FLAG} {k} and {VPP_FLAG} {spec.vpp} cannot be set "
                                "together (validate_args allows only one); keep one", LPVS_FLAG))
        return None
    if spec.first is not None or spec.last is not None:
        errors.append(PlanError("vpp_with_uneven",
                                f"{LPVS_FLAG} {k} cannot be used with {FIRST_FLAG} / {LAST_FLAG}; use "
                                f"{VPP_FLAG} instead", LPVS_FLAG))
        return None
    slots = int(spec.account_for_embedding) + int(spec.account_for_loss)
    total = n + slots
    counted = f"num_layers {n}" + (f" + {slots} embedding/loss slot(s) = {total}" if slots else "")
    if total % pp != 0:
        errors.append(PlanError("layers_per_rank", f"{counted} must be divisible by {PP_FLAG} {pp} to use "
                                f"{LPVS_FLAG} {k}", PP_FLAG))
        return None
    per_rank = total // pp
    if per_rank % k != 0:
        errors.append(PlanError("layers_per_vstage",
                                f"layers per pipeline rank ({counted} / PP {pp} = {per_rank}) must be divisible "
                                f"by {LPVS_FLAG} {k}", LPVS_FLAG))
        return None
    return per_rank // k


def _nearest_divisible_hint(n: int, pp: int, first: int | None, last: int | None) -> str:
    if first is None or last is None or pp < 3:
        return ""
    middle = pp - 2
    for delta in range(1, middle):
        if (n - first - (last + delta)) % middle == 0 and last + delta > 0:
            return f"; e.g. {LAST_FLAG} {last + delta}"
        if last - delta > 0 and (n - first - (last - delta)) % middle == 0:
            return f"; e.g. {LAST_FLAG} {last - delta}"
    return ""


# --------------------------------------------------------------------------- reverse direction


def _default_placement(plan: StagePlan) -> bool:
    """Embedding on stage 0, loss and every MTP layer on the final stage, as flags imply."""
    if not plan.stages:
        return False
    for s in plan.stages:
        is_first, is_last = s.index == 0, s.index == len(plan.stages) - 1
        if s.embedding != is_first or s.loss != is_last:
            return False
        if s.mtp_layers != (plan.mtp_layers if is_last else 0):
            return False
    return True


def flag_form(plan: StagePlan) -> dict[str, Any] | None:
    """First/last (+VPP) flags that reproduce ``plan``, or ``None`` when only a layout string can.

    Never both first and last with PP 2 and VPP > 1 (Megatron divides by zero middle ranks there)."""
    pp, v = plan.pp, plan.vpp
    if not _default_placement(plan) or sum(plan.sizes) != plan.num_layers:
        return None
    grid = [[plan.stages[vs * pp + r].num_layers for vs in range(v)] for r in range(pp)]
    if any(len(set(row)) != 1 for row in grid):
        return None
    per_chunk = [row[0] for row in grid]
    flags: dict[str, Any] = {"pp": pp, "vpp": v if v > 1 else None, "first": None, "last": None}
    if len(set(per_chunk)) == 1 and plan.num_layers % pp == 0:
        return flags if per_chunk[0] > 0 or plan.num_layers == 0 else None
    if pp < 2:
        return None
    a, c = per_chunk[0], per_chunk[-1]
    middles = per_chunk[1:-1]
    if middles and len(set(middles)) != 1:
        return None
    b = middles[0] if middles else None
    if a <= 0 or c <= 0 or (b is not None and b <= 0):
        return None
    if b is None or a != b:
        flags["first"] = a * v
    if b is None or c != b:
        flags["last"] = c * v
    if pp == 2 and v > 1 and flags["first"] is not None and flags["last"] is not None:
        # both would crash get_transformer_layer_offset (no middle rank); first alone gives rank 1
        # the remaining N - first layers, which is the same plan
        flags["last"] = None
    return flags


def megatron_flags(plan: StagePlan) -> tuple[list[str], str]:
    """The Megatron arguments for ``plan`` and its layout string (always given, for reference)."""
    layout = encode_layout([s.tokens() for s in plan.stages]) if plan.stages else ""
    form = flag_form(plan)
    args = [PP_FLAG, str(plan.pp)]
    if plan.mtp_layers:
        args += [MTP_FLAG, str(plan.mtp_layers)]
    if form is None:
        args += [LAYOUT_FLAG, layout]
        return args, layout
    if form["first"] is not None:
        args += [FIRST_FLAG, str(form["first"])]
    if form["last"] is not None:
        args += [LAST_FLAG, str(form["last"])]
    if form["vpp"] is not None:
        args += [VPP_FLAG, str(form["vpp"])]
    return args, layout
