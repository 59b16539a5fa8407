"""Random flag sets and layout strings (accepted and rejected) against an oracle that re-implements
Megatron-LM's own rules, written here from the source (NVIDIA/Megatron-LM commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553), independently of app/core:

* ``megatron/training/arguments.py: validate_args`` (lines 928-1012): at most one of LPVS / VPP /
  layout; VPP from LPVS = ((N + slots) / PP) / K (not with first/last); VPP 1 -> None; the even
  split's divisibility; interleaving needs PP > 1 with overlap_p2p_comm (default on), else PP > 2;
* ``megatron/core/transformer/transformer_config.py: __post_init__`` (lines 2229-2415): first/last
  vs account_for_*, layout vs first/last/account_for_*, first/last > 0 and divisible by VPP, the
  "middle layers remaining" mismatch, middle divisibility, account_for_* divisibility;
* ``pipeline_parallel_layer_layout.py``: ``parse_str_to_list`` and ``validate_layer_layout``;
* ``transformer_block.py: get_num_layers_to_build`` and ``transformer_layer.py:
  get_transformer_layer_offset``: what each (rank, virtual stage) builds and where it starts
  (a division by zero there, or layers that do not cover 1..N exactly once, is a failure);
* ``models/gpt/experimental_attention_variant_module_specs.py:
  _validate_dsa_index_share_pipeline_split`` with ``dsa.py: is_dsa_skip_topk_layer`` /
  ``source_dsa_compute_layer``: the DSA verdict.

isplan must agree on accept/reject, on the stages and on the DSA verdict for every generated case.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.check import run_check
from app.core.engines.megatron.export import shell_join
from app.core.launcher import launcher_request, parse_launcher
from app.core.layout.stages import PipelineSpec
from tests.conftest import make_config, tiny_config


class Reject(Exception):
    pass


def need(cond: bool, why: str) -> None:
    if not cond:
        raise Reject(why)


# --------------------------------------------------------------------------- the oracle


def parse_layout_like_megatron(text: str) -> list[list[str]]:
    text = text.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return [list(stage) for stage in text.split("|")]


def oracle_layout(stages: list[list[str]], pp: int, n: int, mtp: int) -> list[tuple]:
    need(len(stages) % pp == 0, "stage count")
    v = len(stages) // pp
    grid = [[stages[vp * pp + r] for vp in range(v)] for r in range(pp)]
    flat = [tok for vp in range(v) for r in range(pp) for tok in grid[r][vp]]
    need(bool(flat) and flat[0] == "E" and flat[-1] == "L", "E first, L last")
    need(flat.count("E") == 1 and flat.count("L") == 1, "one E, one L")
    need(flat.count("t") == n, "decoder count")
    need(flat.count("m") == mtp, "mtp count")
    if "m" in flat:
        need("t" not in flat[flat.index("m"):], "decoders before mtp")
    for r in range(pp):
        for vp in range(v - 1):
            need("m" not in grid[r][vp], "mtp in the last vp stage")
        if "m" in grid[r][-1]:
            need(grid[r][-1].count("m") == mtp, "mtp together")
    out, nxt = [], 1
    for i, st_ in enumerate(stages):
        count = st_.count("t")
        out.append((i % pp, i // pp, nxt if count else None, count, st_.count("m")))
        nxt += count
    return out


def oracle(n, mtp, pp, vpp, lpvs, first, last, emb, loss, layout, overlap):
    """The stages Megatron builds, as (pp_rank, vp_stage, first_layer, count, mtp), or Reject."""
    # validate_args
    need(sum(x is not None for x in (lpvs, vpp, layout)) <= 1, "one of LPVS / VPP / layout")
    stages = None
    if layout is not None:
        stages = parse_layout_like_megatron(layout)
        need(len(stages) % pp == 0, "layout stages divide by PP")
        vp = len(stages) // pp
    elif lpvs is not None or vpp is not None:
        if vpp is None:
            need(first is None and last is None, "LPVS with first/last")
            total = n + emb + loss
            need(total % pp == 0, "LPVS: layers divide by PP")
            need((total // pp) % lpvs == 0, "LPVS divides layers per rank")
            vp = (total // pp) // lpvs
        else:
            vp = vpp
    else:
        vp = 1
        if first is None and last is None:
            need((n + emb + loss) % pp == 0, "even split")
    vsize = None if vp == 1 else vp
    if vsize is not None:
        need(pp > 1 if overlap else pp > 2, "interleaving")
    # TransformerConfig.__post_init__
    uneven = first is not None or last is not None
    need(not (uneven and (emb or loss)), "first/last with account_for")
    if stages is not None:
        need(not (uneven or emb or loss), "layout with first/last/account_for")
        return oracle_layout(stages, pp, n, mtp)
    if uneven:
        rest, mids = n, pp
        for value in (first, last):
            if value is not None:
                need(value > 0, "first/last > 0")
                need(vsize is None or value % vsize == 0, "first/last divide by VPP")
                rest, mids = rest - value, mids - 1
        need(bool(rest) == bool(mids), "middle mismatch")
        need(not mids or rest % mids == 0, "middle divisibility")
        need(not mids or vsize is None or (rest // mids) % vsize == 0, "middle per rank divides by VPP")
    elif emb or loss:
        total = n + emb + loss
        need(total % pp == 0, "account divisibility")
        need(vsize is None or (total // pp) % vsize == 0, "account per rank divides by VPP")
    built = []
    for v in range(vp):
        for r in range(pp):
            count = layers_to_build(n, pp, vsize, first, last, emb, loss, r, v)
            offset = layer_offset(n, pp, vsize, first, last, emb, loss, r, v)
            last_stage = r == pp - 1 and v == vp - 1
            built.append((r, v, offset + 1 if count else None, count, mtp if last_stage else 0, offset))
    covered = [layer for *_, count, _, offset in built for layer in range(offset + 1, offset + count + 1)]
    need(covered == list(range(1, n + 1)), "layers 1..N built exactly once, in order")
    return [b[:5] for b in built]


def layers_to_build(n, pp, vsize, first, last, emb, loss, r, v):
    """get_num_layers_to_build."""
    if first is not None or last is not None:
        rest, left = n, pp
        for value in (first, last):
            if value is not None:
                rest, left = rest - value, left - 1
        per = rest // left if left > 0 else 0
        if r == 0 and first is not None:
            per = first
        if r == pp - 1 and last is not None:
            per = last
    else:
        total = n + emb + loss
        need(total % pp == 0, "build: divisibility")
        per = total // pp
    if vsize is not None and pp > 1:
        need(per % vsize == 0, "build: per rank divides by VPP")
        per //= vsize
    if emb and v == 0 and r == 0:
        per -= 1
        need(per >= 0, "not enough layers for the embedding slot")
    if loss and v == (vsize or 1) - 1 and r == pp - 1:
        per -= 1
        need(per >= 0, "not enough layers for the loss slot")
    return per


def layer_offset(n, pp, vsize, first, last, emb, loss, r, v):
    """get_transformer_layer_offset."""
    if pp == 1:
        return 0
    if first is not None or last is not None:
        mids = pp - (first is not None) - (last is not None)
        f, lst = first or 0, last or 0
        middle = n - f - lst
        mid_rank = r if first is None else r - 1
        if vsize is not None:
            fchunk, lchunk, mchunk = f // vsize, lst // vsize, middle // vsize
            total = fchunk + mchunk + lchunk
            if r == 0:
                return v * total
            need(mids != 0, "ZeroDivisionError: no middle pipeline stages")
            return v * total + fchunk + mid_rank * (mchunk // mids)
        per = middle // mids if mids > 0 else 0
        return 0 if r == 0 else mid_rank * per + f
    total = n + emb + loss
    per = total // pp
    if vsize is not None:
        offset = v * (total // vsize) + r * (per // vsize)
        return offset - 1 if emb and not (v == 0 and r == 0) else offset
    return r * per - (1 if emb and r != 0 else 0)


def oracle_dsa_ok(stages, freq: int, offset: int) -> bool:
    """_validate_dsa_index_share_pipeline_split over each stage's decoder layers."""
    if freq <= 1:
        return True
    clamp = max(offset, 1)
    for _, _, start, count, _ in stages:
        local = range(start, start + count) if count else range(0)
        for layer in local:
            if max(layer - clamp, 0) % freq == 0:
                continue
            source = layer if layer <= clamp else layer - ((layer - clamp) % freq)
            if source not in local or source > layer:
                return False
    return True


# --------------------------------------------------------------------------- the generator


@st.composite
def layouts(draw, n: int, mtp: int, pp: int):
    """A layout string: usually Megatron-shaped (E first, L last, all t, m in a last vp stage),
    sometimes broken on purpose; written plainly or with x*k / (...)*k repeats."""
    count = pp * draw(st.sampled_from([1, 1, 2, 3])) + draw(st.sampled_from([0, 0, 0, 0, 1]))
    stages: list[list[str]] = [[] for _ in range(count)]
    for _ in range(n):
        stages[draw(st.integers(0, count - 1))].append("t")
    # keep the decoder layers in order: stage i's layers come before stage i+1's (t are identical)
    stages[0].insert(0, "E")
    holder = draw(st.sampled_from([count - 1, count - 1, count - 1 - pp if count > pp else 0, 0]))
    stages[holder].extend(["m"] * mtp)
    stages[-1].append("L")
    breaks = draw(st.sampled_from(["none"] * 6 + ["extra_e", "no_l", "drop_t", "m_first", "extra_m"]))
    if breaks == "extra_e":
        stages[-1].insert(0, "E")
    elif breaks == "no_l":
        stages[-1].remove("L")
    elif breaks == "drop_t" and n:
        for s in stages:
            if "t" in s:
                s.remove("t")
                break
    elif breaks == "m_first":
        stages[0].insert(1, "m")
    elif breaks == "extra_m":
        stages[-1].insert(0, "m")
    texts = []
    for s in stages:
        t = "".join(s)
        if draw(st.booleans()):
            t = re.sub(r"t{3,}", lambda m: f"t*{len(m.group())}", t)
        texts.append(t)
    if len(texts) > 2 and draw(st.booleans()) and texts[1] == texts[2]:
        texts[1:3] = [f"({texts[1]}|)*2,"]
        return "|".join(texts[:1]) + "|" + "".join(texts[1:2]) + "|".join(texts[2:])
    return "|".join(texts)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 24))
    mtp = draw(st.sampled_from([0, 0, 1, 2]))
    pp = draw(st.sampled_from([1, 2, 2, 3, 4, 4, 6, 8]))
    small = st.one_of(st.none(), st.integers(0, n))
    kind = draw(st.sampled_from(["flags", "flags", "flags", "layout"]))
    case = {
        "n": n, "mtp": mtp, "pp": pp,
        "vpp": draw(st.one_of(st.none(), st.none(), st.integers(1, 4))),
        "lpvs": draw(st.one_of(st.none(), st.none(), st.none(), st.integers(1, 6))),
        "first": draw(small) if draw(st.booleans()) else None,
        "last": draw(small) if draw(st.booleans()) else None,
        "emb": draw(st.booleans()) and draw(st.booleans()),
        "loss": draw(st.booleans()) and draw(st.booleans()),
        "layout": draw(layouts(n, mtp, pp)) if kind == "layout" else None,
        "overlap": draw(st.sampled_from([True, True, True, False])),
    }
    if kind == "layout" and draw(st.integers(0, 3)):   # mostly a layout alone
        case.update(vpp=None, lpvs=None, first=None, last=None, emb=False, loss=False)
    return case, draw(st.integers(1, 4)), draw(st.integers(0, 4))


def case_input(c, freq: int, offset: int):
    """A generated case as isplan's input: a tiny DSA config with the case's layers, indexer
    frequency / offset and MTP depth, and the pipeline spec of its flags or layout."""
    cfg = make_config(tiny_config(c["n"], index_topk_freq=freq, index_skip_topk_offset=offset,
                                  num_nextn_predict_layers=c["mtp"]))
    spec = PipelineSpec(pp=c["pp"], vpp=c["vpp"], layers_per_vstage=c["lpvs"], first=c["first"], last=c["last"],
                        account_for_embedding=c["emb"], account_for_loss=c["loss"], layout=c["layout"],
                        mtp_layers=c["mtp"], overlap_p2p=c["overlap"])
    return cfg, spec


def launcher_line(c) -> str:
    """The case as a trainer command line, in Megatron's flag spellings."""
    argv = ["python3", "pretrain_gpt.py", "--pipeline-model-parallel-size", str(c["pp"]),
            "--mtp-num-layers", str(c["mtp"])]
    for key, flag in (("vpp", "--num-virtual-stages-per-pipeline-rank"),
                      ("lpvs", "--num-layers-per-virtual-pipeline-stage"),
                      ("first", "--decoder-first-pipeline-num-layers"), ("last", "--decoder-last-pipeline-num-layers"),
                      ("layout", "--pipeline-model-parallel-layout")):
        if c[key] is not None:
            argv += [flag, str(c[key])]
    argv += ["--account-for-embedding-in-pipeline-split"] * c["emb"] + ["--account-for-loss-in-pipeline-split"] * c["loss"]
    argv += [] if c["overlap"] else ["--no-overlap-p2p-communication"]
    return shell_join(argv) + "\n"


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=cases())
def test_isplan_equals_the_megatron_oracle(data):
    c, freq, offset = data
    try:
        expected = oracle(c["n"], c["mtp"], c["pp"], c["vpp"], c["lpvs"], c["first"], c["last"],
                          int(c["emb"]), int(c["loss"]), c["layout"], c["overlap"])
    except Reject as why:
        expected, reason = None, str(why)
    cfg, spec = case_input(c, freq, offset)
    result = run_check(cfg, spec, "megatron")
    plan = result.plan
    # the same flags read from a launcher give the same spec
    req = launcher_request(parse_launcher(launcher_line(c), strict=True), cfg)
    assert req.spec == spec and not req.errors and not req.unresolved
    accepted = not plan.errors and bool(plan.stages)
    event("accepted" if expected is not None else f"rejected: {reason}")
    assert accepted == (expected is not None), (c, plan.errors, None if expected is None else expected)
    if expected is None:
        return
    got = [(s.pp_rank, s.vp_stage, s.first_layer, s.num_layers, s.mtp_layers) for s in plan.stages]
    assert got == expected, c
    assert (not result.boundary.violations) == oracle_dsa_ok(expected, freq, offset), (c, freq, offset)
    assert result.valid == oracle_dsa_ok(expected, freq, offset)
