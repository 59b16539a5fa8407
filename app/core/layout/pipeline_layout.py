"""The ``--pipeline-model-parallel-layout`` string: grammar, placement rules and the reverse encoder.

Grammar (NVIDIA/Megatron-LM ``megatron/core/transformer/pipeline_parallel_layer_layout.py``,
``PipelineParallelLayerLayout.parse_str_to_list``):

* tokens ``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss; ``|`` ends a stage;
* commas are cosmetic and removed first;
* ``(...)*n`` repeats a group (applied first, no nesting), then ``x*n`` repeats one character.

Stage ``i`` of the list belongs to pipeline rank ``i % PP`` and virtual stage ``i // PP``; the
number of stages must divide by PP. Placement rules (``validate_layer_layout`` and
``TransformerConfig.__post_init__``): exactly one ``E``, first; exactly one ``L``, last; as many
``t`` as decoder layers; as many ``m`` as MTP layers, after every ``t``, all in one virtual stage
that is the last virtual stage of its rank; a VPP given beside the layout must equal the one the
layout implies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.plan.bounds import MAX_PIPELINE_STAGES

FLAG = "--pipeline-model-parallel-layout"
MAX_EXPANDED = 1_000_000
_SINGLE = re.compile(r"(.)\*([0-9]+)")
_CHARS = {"E", "L", "t", "m"}


class LayoutSyntaxError(ValueError):
    """A layout string that cannot be parsed at all (bad characters, nesting, absurd size)."""


@dataclass(frozen=True)
class LayoutIssue:
    code: str
    message: str
    flag: str = FLAG


def _expand_groups(text: str, budget: int) -> str:
    """Unroll ``(...)*n`` in one left-to-right pass (linear time on any input).

    Same result as Megatron's ``re.sub(r'\\(([^)]+)\\)\\*(\\d+)', ...)`` for every layout it
    accepts; groups cannot nest, and a ``(`` without its ``)*n`` is an error here rather than a
    stray character later.
    """
    out: list[str] = []
    size = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "(":
            out.append(ch)
            size += 1
            i += 1
            continue
        close = text.find(")", i + 1)
        if close == -1:
            raise LayoutSyntaxError(f"{FLAG}: '(' at position {i + 1} has no ')'")
        inner = text[i + 1:close]
        if "(" in inner:
            raise LayoutSyntaxError(f"{FLAG}: groups cannot nest ('(' inside the group at position {i + 1})")
        if not inner:
            raise LayoutSyntaxError(f"{FLAG}: empty group '()' at position {i + 1}")
        j = close + 1
        if j >= len(text) or text[j] != "*":
            raise LayoutSyntaxError(f"{FLAG}: the group at position {i + 1} needs a repeat count, e.g. (tt|)*29")
        k = j + 1
        while k < len(text) and text[k].isascii() and text[k].isdigit():
            k += 1
        if k == j + 1:
            raise LayoutSyntaxError(f"{FLAG}: the group at position {i + 1} needs a repeat count after '*'")
        digits = text[j + 1:k]
        count = int(digits) if len(digits) < 12 else budget + 1
        size += len(inner) * count
        if size > budget:
            raise LayoutSyntaxError(f"{FLAG} expands to more than {budget:,} tokens; check the repeat counts")
        out.append(inner * count)
        i = k
    if size > budget:  # plain tokens after the last group count too
        raise LayoutSyntaxError(f"{FLAG} expands to more than {budget:,} tokens; check the repeat counts")
    return "".join(out)


def _expand_singles(text: str, budget: int) -> str:
    """Unroll ``x*n`` (one character repeated), as Megatron's ``(.)\\*(\\d+)`` does."""
    total = len(text)
    for m in _SINGLE.finditer(text):
        count = int(m.group(2)) if len(m.group(2)) < 12 else budget + 1
        total += count - len(m.group(0))
        if total > budget:
            raise LayoutSyntaxError(f"{FLAG} expands to more than {budget:,} tokens; check the repeat counts")
    return _SINGLE.sub(lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout(layout: str) -> list[list[str]]:
    """Split a layout string into stages of tokens, exactly as Megatron unrolls it."""
    if not isinstance(layout, str) or not layout.strip():
        raise LayoutSyntaxError(f"{FLAG} is empty; write stages such as 'Et*3|(tt|)*29,m|L'")
    if len(layout) > 100_000:
        raise LayoutSyntaxError(f"{FLAG} is {len(layout):,} characters long; the limit is 100,000")
    text = layout.replace(",", "")
    text = _expand_groups(text, MAX_EXPANDED)
    text = _expand_singles(text, MAX_EXPANDED)
    if text.count("|") >= MAX_PIPELINE_STAGES:
        raise LayoutSyntaxError(f"{FLAG} has {text.count('|') + 1:,} stages; the limit is {MAX_PIPELINE_STAGES:,}")
    stages: list[list[str]] = []
    for stage in text.split("|"):
        tokens = list(stage)
        for ch in tokens:
            if ch not in _CHARS:
                if ch in "()":
                    hint = " (groups cannot nest, and each '(...)' needs a '*n' after it)"
                elif ch == "*":
                    hint = " ('*' must follow a token or a group and precede a count)"
                else:
                    hint = ""
                raise LayoutSyntaxError(
                    f"{FLAG}: invalid character {ch!r}{hint}; known tokens are E (embedding), "
                    "t (decoder layer), m (MTP layer), L (loss), | (stage end)"
                )
        stages.append(tokens)
    return stages


def check_layout(
    stages: list[list[str]], pp: int, num_layers: int, mtp_layers: int, vpp: int | None
) -> tuple[int | None, list[LayoutIssue]]:
    """Megatron's acceptance rules for a parsed layout; returns (detected VPP, issues).

    The stage count first (nothing else is judged when it does not divide by PP), then the
    embedding / loss / decoder tokens and the MTP tokens, each rule in its own function."""
    if len(stages) % pp != 0:
        return None, [LayoutIssue("layout_stage_count", f"{FLAG} has {len(stages)} stages, which does not divide by "
                                  f"--pipeline-model-parallel-size {pp}; give PP x VPP stages")]
    detected = len(stages) // pp
    issues: list[LayoutIssue] = []
    if vpp is not None and vpp != detected:
        issues.append(LayoutIssue("layout_vpp_conflict",
                                  f"--num-virtual-stages-per-pipeline-rank {vpp} conflicts with {FLAG}, "
                                  f"which has {len(stages)} stages = PP {pp} x VPP {detected}",
                                  "--num-virtual-stages-per-pipeline-rank"))
    flat = [tok for stage in stages for tok in stage]
    issues += _edge_token_issues(flat)
    n_t = flat.count("t")
    if n_t != num_layers:
        issues.append(LayoutIssue("layout_decoder_count", f"{FLAG} has {n_t} decoder layers (t) but the model has "
                                  f"{num_layers} (num_hidden_layers)"))
    issues += _mtp_issues(stages, flat, pp, detected, mtp_layers)
    return detected, issues


def _edge_token_issues(flat: list[str]) -> list[LayoutIssue]:
    """``validate_layer_layout``: exactly one ``E``, the first token; exactly one ``L``, the last."""
    issues = []
    if not flat or flat[0] != "E":
        issues.append(LayoutIssue("layout_embedding_first",
                                  f"{FLAG}: the first token must be E (embedding), got {flat[0] if flat else 'nothing'!r}"))
    if not flat or flat[-1] != "L":
        issues.append(LayoutIssue("layout_loss_last",
                                  f"{FLAG}: the last token must be L (loss), got {flat[-1] if flat else 'nothing'!r}"))
    if flat.count("E") != 1:
        issues.append(LayoutIssue("layout_embedding_count",
                                  f"{FLAG}: E (embedding) must appear exactly once, found {flat.count('E')}"))
    if flat.count("L") != 1:
        issues.append(LayoutIssue("layout_loss_count",
                                  f"{FLAG}: L (loss) must appear exactly once, found {flat.count('L')}"))
    return issues


def _mtp_issues(stages: list[list[str]], flat: list[str], pp: int, vpp: int, mtp_layers: int) -> list[LayoutIssue]:
    """``validate_layer_layout`` and ``TransformerConfig.__post_init__`` on ``m``: as many as
    ``--mtp-num-layers``, after every ``t``, all in one virtual stage that is the last virtual stage
    of its rank."""
    issues = []
    n_m = flat.count("m")
    if n_m != mtp_layers:
        issues.append(LayoutIssue(
            "layout_mtp_count",
            f"{FLAG} has {n_m} MTP layers (m) but --mtp-num-layers is {mtp_layers}; "
            + ("add 'm' to the last virtual stage of a rank" if n_m < mtp_layers else "remove the extra 'm'")
            + " or set --mtp-num-layers to match",
            "--mtp-num-layers",
        ))
    if not n_m:
        return issues
    if "t" in flat[flat.index("m"):]:
        issues.append(LayoutIssue("layout_mtp_after_decoders", f"{FLAG}: decoder layers (t) must all come before MTP layers (m)"))
    holders = [i for i, st in enumerate(stages) if "m" in st]
    issues += [LayoutIssue("layout_mtp_not_last_vp", f"{FLAG}: MTP must sit in the last virtual stage of its rank; "
                           f"stage {i + 1} (pp rank {i % pp}, vp stage {i // pp}) holds 'm'")
               for i in holders if i // pp != vpp - 1]
    if len(holders) > 1:
        issues.append(LayoutIssue("layout_mtp_split", f"{FLAG}: all MTP layers must be in one virtual stage; found "
                                  "them in stages " + ", ".join(str(i + 1) for i in holders)))
    return issues


def _stage_text(tokens: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        run = j - i
        out.append(tokens[i] if run == 1 else f"{tokens[i]}*{run}" if run > 2 else tokens[i] * 2)
        i = j
    return "".join(out)


def encode_layout(stages: list[list[str]]) -> str:
    """A compact layout string for ``stages`` (vp-major token lists) that parses back to them.

    Runs of identical consecutive stages become ``(s|)*k``; the final stage is never inside a
    group, so no trailing ``|`` (which would add an empty stage) is produced.
    """
    texts = [_stage_text(s) for s in stages]
    parts: list[tuple[str, bool]] = []  # (text, is_group)
    i = 0
    last = len(texts) - 1
    while i <= last:
        j = i
        while j + 1 <= last and texts[j + 1] == texts[i]:
            j += 1
        run = j - i + 1
        repeat = run - 1 if j == last else run  # the final stage stays outside any group
        if repeat >= 2:
            parts.append((f"({texts[i]}|)*{repeat}", True))
        else:
            parts.extend((f"{texts[i]}|", False) for _ in range(repeat))
        if j == last:
            parts.append((texts[i], False))
        i = j + 1
    # a comma (ignored by the parser) after each group keeps the string readable
    return "".join(text + ("," if group and k < len(parts) - 1 else "") for k, (text, group) in enumerate(parts))
