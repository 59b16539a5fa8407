"""Exact pipeline-layout optimiser: every optimum is checked against brute-force enumeration
written here (all cut sets), or against a hand derivation spelled out in the test."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import app.core.optimise.optimiser as opt
from app.core.optimise.optimiser import count_valid_layouts, k_best_layouts, nearest_valid, optimal_layout

# GLM-5.2: 78 decoder layers, full (indexer) layers 1, 2, 3 and then every 4th from 7 to 75.
GLM_N = 78
GLM_FULL_LAYERS = [1, 2, 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75]
GLM_MASK = [n in GLM_FULL_LAYERS for n in range(1, GLM_N + 1)]


# --------------------------------------------------------------------------- brute force


def all_cut_sets(full, num_stages):
    """Every valid layout as the tuple of 0-based stage starts (stage 0 starts at 0)."""
    if not full[0]:
        return
    candidates = [i for i in range(1, len(full)) if full[i]]
    for cuts in combinations(candidates, num_stages - 1):
        yield (0, *cuts)


def split_of(starts, n):
    return [b - a for a, b in zip(starts, [*starts[1:], n])]


def brute_keys(costs, full, pp, vpp, fe=0, le=0, unit="rank"):
    """All valid layouts with the documented key, best first, in exact arithmetic."""
    n = len(full)
    exact = all(isinstance(c, int) for c in (*costs, fe, le))
    num = (lambda c: c) if exact else Fraction  # ints stay ints (fast); floats become exact
    prefix = [num(0)]
    for c in costs:
        prefix.append(prefix[-1] + num(c))
    out = []
    for starts in all_cut_sets(full, pp * vpp):
        ends = [*starts[1:], n]
        stage = [prefix[b] - prefix[a] for a, b in zip(starts, ends)]
        stage[0] += num(fe)
        stage[-1] += num(le)
        rank = [sum(stage[v * pp + r] for v in range(vpp)) for r in range(pp)]
        units = rank if unit == "rank" else stage
        out.append((max(units), sum(u * u for u in units), sum(c * c for c in stage), split_of(starts, n)))
    out.sort()
    return out


def stage_index(split):
    """Stage index of every layer (0-based layers)."""
    return [j for j, size in enumerate(split) for _ in range(size)]


def layers_moved(old_split, new_split):
    """Layers whose stage index differs between the two splits (the definition, layer by layer)."""
    old = stage_index(old_split)
    moved, start = 0, 0
    for j, size in enumerate(new_split):
        moved += size - old[start : start + size].count(j)
        start += size
    return moved


def check_layout(layout, costs, full, pp, vpp, fe=0, le=0):
    """The reported numbers are consistent with the split (recomputed here)."""
    n = len(full)
    assert sum(layout.split) == n and all(size > 0 for size in layout.split)
    assert len(layout.split) == pp * vpp
    starts = [1]
    for size in layout.split[:-1]:
        starts.append(starts[-1] + size)
    assert layout.starts == starts
    assert all(full[s - 1] for s in starts)
    stage = []
    for s, size in zip(starts, layout.split):
        stage.append(sum((Fraction(c) for c in costs[s - 1 : s - 1 + size]), Fraction(0)))
    stage[0] += Fraction(fe)
    stage[-1] += Fraction(le)
    rank = [sum(stage[v * pp + r] for v in range(vpp)) for r in range(pp)]
    assert layout.stage_costs == [float(c) for c in stage]
    assert layout.rank_costs == [float(c) for c in rank]
    units = rank if layout.unit == "rank" else stage
    assert layout.unit_costs == [float(u) for u in units]
    assert layout.max_cost == float(max(units))


# --------------------------------------------------------------------------- strategies


@st.composite
def instances(draw, max_n=14, max_vpp=2, float_costs=False):
    n = draw(st.integers(1, max_n))
    full = [True, *draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))]
    if float_costs:
        cost = st.floats(0, 10, allow_nan=False, allow_infinity=False)
    else:
        cost = st.integers(0, 9)
    costs = draw(st.lists(cost, min_size=n, max_size=n))
    pp = draw(st.integers(1, 4))
    vpp = draw(st.integers(1, max_vpp))
    fe = draw(st.sampled_from([0, 0, 1, 3]))
    le = draw(st.sampled_from([0, 0, 2, 5]))
    unit = draw(st.sampled_from(["rank", "stage"]))
    return costs, full, pp, vpp, fe, le, unit


# --------------------------------------------------------------------------- optimality


@settings(max_examples=250, deadline=None)
@given(instances(), st.integers(1, 6))
def test_optimal_and_k_best_match_brute_force(inst, k):
    costs, full, pp, vpp, fe, le, unit = inst
    expected = brute_keys(costs, full, pp, vpp, fe, le, unit)
    best = optimal_layout(costs, full, pp, vpp, first_stage_extra=fe, last_stage_extra=le, unit=unit)
    top = k_best_layouts(costs, full, pp, vpp, k=k, first_stage_extra=fe, last_stage_extra=le, unit=unit)
    if not expected:
        assert best is None and top == []
        return
    assert best.max_cost == float(expected[0][0])
    assert best.exact and best.unit == unit
    check_layout(best, costs, full, pp, vpp, fe, le)
    # the k best max costs in order, and the documented tie-breaks pick the same layouts
    assert [lay.max_cost for lay in top] == [float(e[0]) for e in expected[:k]]
    assert [lay.split for lay in top] == [e[3] for e in expected[:k]]
    assert top[0] == best
    for lay in top:
        check_layout(lay, costs, full, pp, vpp, fe, le)


@settings(max_examples=60, deadline=None)
@given(instances(max_n=11, max_vpp=3), st.integers(1, 4))
def test_three_virtual_stages_match_brute_force(inst, k):
    """VPP = 3 exercises rank states of three cuts and two round boundaries."""
    costs, full, pp, vpp, fe, le, unit = inst
    expected = brute_keys(costs, full, pp, vpp, fe, le, unit)
    top = k_best_layouts(costs, full, pp, vpp, k=k, first_stage_extra=fe, last_stage_extra=le, unit=unit)
    assert [lay.split for lay in top] == [e[3] for e in expected[:k]]


@settings(max_examples=80, deadline=None)
@given(instances(max_n=12, float_costs=True))
def test_float_costs_are_optimised_exactly(inst):
    """Float costs are compared exactly (no rounding ties): the optimum is the exact minimum."""
    costs, full, pp, vpp, fe, le, unit = inst
    expected = brute_keys(costs, full, pp, vpp, fe, le, unit)
    best = optimal_layout(costs, full, pp, vpp, first_stage_extra=fe, last_stage_extra=le, unit=unit)
    if not expected:
        assert best is None
        return
    assert best.split == expected[0][3]
    assert best.max_cost == float(expected[0][0])


def test_equal_float_costs_tie_exactly():
    # 0.1 is not exact in binary, but ten equal costs are still ten equal costs: 5 + 5 wins.
    best = optimal_layout([0.1] * 10, [True] * 10, pp=2)
    assert best.split == [5, 5]
    assert best.max_cost == float(5 * Fraction(0.1))


def test_extras_by_hand():
    full = [True] * 4
    costs = [1, 1, 1, 1]
    # first extra 2: splits 1+3 -> (3, 3), 2+2 -> (4, 2), 3+1 -> (5, 1): best 1+3, max 3
    best = optimal_layout(costs, full, pp=2, first_stage_extra=2)
    assert best.split == [1, 3] and best.stage_costs == [3.0, 3.0] and best.max_cost == 3.0
    # first 2 and last 2: (3, 5), (4, 4), (5, 3): best 2+2, max 4
    best = optimal_layout(costs, full, pp=2, first_stage_extra=2, last_stage_extra=2)
    assert best.split == [2, 2] and best.max_cost == 4.0
    # a single stage carries both extras
    one = optimal_layout(costs, full, pp=1, first_stage_extra=2, last_stage_extra=3)
    assert one.split == [4] and one.max_cost == 9.0


def test_rank_units_sum_the_virtual_stages():
    best = optimal_layout([1.0] * 8, [True] * 8, pp=2, vpp=2, unit="rank")
    assert best.unit == "rank" and len(best.unit_costs) == 2
    assert best.unit_costs == [best.stage_costs[0] + best.stage_costs[2], best.stage_costs[1] + best.stage_costs[3]]
    stage = optimal_layout([1.0] * 8, [True] * 8, pp=2, vpp=2, unit="stage")
    assert stage.unit == "stage" and stage.unit_costs == stage.stage_costs


# --------------------------------------------------------------------------- counting


@settings(max_examples=150, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=13), st.integers(1, 7))
def test_count_matches_brute_force(full, num_stages):
    assert count_valid_layouts(full, num_stages) == sum(1 for _ in all_cut_sets(full, num_stages))


def test_count_glm52_eight_stages():
    # F = 21 full layers; stage 0 starts on layer 1, the other 7 starts are chosen among the
    # 20 full layers after it: C(20, 7) = 20*19*18*17*16*15*14 / 5040 = 390700800 / 5040 = 77520.
    assert count_valid_layouts(GLM_MASK, 8) == 77520
    assert count_valid_layouts(GLM_MASK, 21) == 1
    assert count_valid_layouts(GLM_MASK, 22) == 0
    assert count_valid_layouts([False, True, True], 1) == 0
    with pytest.raises(ValueError, match="num_stages"):
        count_valid_layouts(GLM_MASK, 0)


# --------------------------------------------------------------------------- GLM-5.2


def glm_pp8_vpp1_brute():
    """(max stage size, sum of squares, split) over all 77520 PP8 layouts, uniform costs."""
    best = None
    for starts in all_cut_sets(GLM_MASK, 8):
        split = split_of(starts, GLM_N)
        key = (max(split), sum(x * x for x in split), split)
        if best is None or key < best:
            best = key
    return best


def test_glm52_uniform_pp8_vpp1_max_stage_is_12():
    # Hand derivation. Every stage starts on a full layer. From layer 7 on the full layers are
    # 4 apart and 79 - 75 = 4, so every stage that starts at layer >= 7 has a multiple of 4 layers.
    # Suppose the max stage were <= 11: those stages have <= 8 layers. The stages starting at
    # layers 1..3 end right before the first start s >= 7 with s - 3 <= 11 at best, so s is 7 or
    # 11 and layers 11..78 (68 layers) need at least ceil(68 / 8) = 9 stages of <= 8, plus at
    # least one before: 10 > 8 stages. Hence max >= 12, and 10,8,8,8,8,12,12,12 (starts 1, 11,
    # 19, 27, 35, 43, 55, 67, all full) reaches it. Confirmed by brute force over all 77520.
    brute = glm_pp8_vpp1_brute()
    assert brute[0] == 12
    best = optimal_layout([1.0] * GLM_N, GLM_MASK, pp=8, vpp=1)
    assert best.max_cost == 12.0
    assert best.split == [10, 8, 8, 8, 8, 12, 12, 12] == brute[2]
    assert best.starts == [1, 11, 19, 27, 35, 43, 55, 67]


def test_glm52_uniform_pp8_vpp2_rank_matches_brute_force():
    # 16 stages, C(20, 15) = 15504 layouts: enumerate them all under the rank objective.
    expected = brute_keys([1] * GLM_N, GLM_MASK, 8, 2, unit="rank")
    assert len(expected) == 15504
    best = optimal_layout([1.0] * GLM_N, GLM_MASK, pp=8, vpp=2)
    assert best.exact and best.unit == "rank"
    assert best.max_cost == float(expected[0][0]) == 12.0
    assert best.split == expected[0][3] == [1, 5, 4, 4, 4, 4, 4, 4, 8, 4, 4, 4, 4, 8, 8, 8]
    assert best.rank_costs == [9.0, 9.0, 8.0, 8.0, 8.0, 12.0, 12.0, 12.0]
    top = k_best_layouts([1.0] * GLM_N, GLM_MASK, pp=8, vpp=2, k=5)
    assert [lay.split for lay in top] == [e[3] for e in expected[:5]]


def test_glm52_random_costs_pp8_vpp2_both_units():
    # non-integer costs k / 1024 (exact in binary), so the brute force can run on the ints k
    rng = random.Random(52)
    ticks = [rng.randint(512, 2048) for _ in range(GLM_N)]
    costs = [t / 1024 for t in ticks]
    for unit in ("rank", "stage"):
        expected = brute_keys(ticks, GLM_MASK, 8, 2, fe=1536, le=4096, unit=unit)
        top = k_best_layouts(costs, GLM_MASK, 8, 2, k=3, first_stage_extra=1.5, last_stage_extra=4.0, unit=unit)
        assert [lay.split for lay in top] == [e[3] for e in expected[:3]]
        assert [lay.max_cost for lay in top] == [e[0] / 1024 for e in expected[:3]]
        check_layout(top[0], costs, GLM_MASK, 8, 2, 1.5, 4.0)


# --------------------------------------------------------------------------- nearest valid


def brute_nearest(split, full):
    """Least moved layers, then least cut shift, then smallest split, over all valid layouts."""
    n = len(full)
    old_cuts = [sum(split[:j]) for j in range(1, len(split))]
    best = None
    for starts in all_cut_sets(full, len(split)):
        new = split_of(starts, n)
        shift = sum(abs(a - b) for a, b in zip(starts[1:], old_cuts))
        key = (layers_moved(split, new), shift, new)
        if best is None or key < best:
            best = key
    return best


def test_nearest_valid_glm52_from_even_split():
    split = [10, 10, 10, 10, 10, 10, 9, 9]
    # Starts 21, 41, 61 are shared layers (nearest full: 19|23, 39|43, 59|63, two layers away)
    # and 70 is shared (71 is one away): 2 + 2 + 2 + 1 = 7 layers move; ties take the smaller.
    res = nearest_valid(split, GLM_MASK)
    brute = brute_nearest(split, GLM_MASK)
    assert res.moved == brute[0] == 7
    assert res.split == brute[2] == [10, 8, 12, 8, 12, 8, 12, 8]
    assert sum(res.split) == GLM_N and all(GLM_MASK[s - 1] for s in res.starts)
    assert res.moved == layers_moved(split, res.split)
    assert res.cut_shift == 7
    changes = [(c.stage, c.old_start, c.new_start) for c in res.changed]
    assert changes == [(2, 21, 19), (4, 41, 39), (6, 61, 59), (7, 70, 71)]


def test_nearest_valid_of_a_valid_split_is_itself():
    split = [10, 8, 8, 8, 8, 12, 12, 12]
    res = nearest_valid(split, GLM_MASK)
    assert res.split == split and res.moved == 0 and res.cut_shift == 0 and res.changed == ()


def test_nearest_valid_reports_vp_stage_and_rank():
    res = nearest_valid([10, 10, 10, 10, 10, 10, 9, 9], GLM_MASK, vpp=2)  # PP = 4
    assert [(c.stage, c.pp_rank, c.vp_stage) for c in res.changed] == [(2, 2, 0), (4, 0, 1), (6, 2, 1), (7, 3, 1)]


def test_nearest_valid_wrong_sum_raises():
    with pytest.raises(ValueError, match=r"sums to 77 .* N = 78"):
        nearest_valid([10, 10, 10, 10, 10, 10, 9, 8], GLM_MASK)
    with pytest.raises(ValueError, match="multiple of vpp"):
        nearest_valid([39, 39, 0], GLM_MASK, vpp=2)
    with pytest.raises(ValueError, match="non-negative"):
        nearest_valid([80, -2], GLM_MASK)


def test_nearest_valid_counts_layers_not_cut_shift():
    # full layers 1, 4, 5 of 6: the cuts must be at layers 4 and 5. Layers 2, 3, 4 change stage
    # (3 moved) although the cuts move by 2 + 2 = 4.
    res = nearest_valid([1, 1, 4], [True, False, False, True, True, False])
    assert res.split == [3, 1, 2] and res.moved == 3 and res.cut_shift == 4


def test_nearest_valid_without_any_valid_layout():
    assert nearest_valid([2, 2], [False, True, True, True]) is None  # layer 1 shared
    assert nearest_valid([1, 1, 2], [True, False, True, False]) is None  # 3 stages, 2 full layers


@st.composite
def splits_and_masks(draw):
    n = draw(st.integers(1, 13))
    full = [True, *draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))]
    s = draw(st.integers(1, 6))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=s - 1, max_size=s - 1)))
    split = [b - a for a, b in zip([0, *cuts], [*cuts, n])]  # may contain empty stages
    return split, full


@settings(max_examples=200, deadline=None)
@given(splits_and_masks())
def test_nearest_valid_matches_brute_force(case):
    split, full = case
    res = nearest_valid(split, full)
    brute = brute_nearest(split, full)
    if brute is None:
        assert res is None
        return
    assert (res.moved, res.cut_shift, res.split) == brute
    assert res.moved == layers_moved(split, res.split)


@st.composite
def interleaved_splits(draw):
    split, full = draw(splits_and_masks())
    vpp = draw(st.sampled_from([v for v in (1, 2, 3) if len(split) % v == 0]))
    return split, full, vpp


@settings(max_examples=200, deadline=None)
@given(interleaved_splits())
def test_nearest_valid_reports_every_changed_start_like_brute_force(case):
    """The whole answer against the brute force: split, 1-based starts, and one StartChange (with
    the stage's pipeline rank ``j % PP`` and virtual stage ``j // PP``) per stage whose start moved."""
    split, full, vpp = case
    res = nearest_valid(split, full, vpp)
    brute = brute_nearest(split, full)
    if brute is None:
        assert res is None
        return
    new = brute[2]
    pp = len(split) // vpp
    starts = [1 + sum(new[:j]) for j in range(len(new))]
    old_starts = [1 + sum(split[:j]) for j in range(len(split))]
    assert (res.moved, res.cut_shift, res.split, res.starts) == (brute[0], brute[1], new, starts)
    assert [(c.stage, c.pp_rank, c.vp_stage, c.old_start, c.new_start) for c in res.changed] == [
        (j, j % pp, j // pp, old_starts[j], starts[j]) for j in range(len(split)) if starts[j] != old_starts[j]]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"costs": [1, 1]}, r"len\(costs\) = 2 but len\(full\) = 3"),
        ({"pp": 0}, "pp must be >= 1"),
        ({"vpp": 0}, "vpp must be >= 1"),
        ({"costs": [1, -1, 1]}, "cost of layer 2 must be >= 0"),
        ({"costs": [1, float("nan"), 1]}, "cost of layer 2 must be finite"),
        ({"costs": [1, "2", 1]}, "cost of layer 2 must be a real number"),
        ({"first_stage_extra": -1}, "first_stage_extra must be >= 0"),
        ({"unit": "gpu"}, "unit must be one of"),
        ({"full": []}, "at least one layer"),
    ],
)
def test_bad_input_raises(kwargs, message):
    args = {"costs": [1, 1, 1], "full": [True, True, True], "pp": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        optimal_layout(**args)


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be >= 1"):
        k_best_layouts([1, 1], [True, True], pp=1, k=0)


def test_no_valid_layout_returns_none_not_raises():
    assert optimal_layout([1, 1, 1], [True, False, True], pp=3) is None  # 3 stages, 2 full layers
    assert optimal_layout([1, 1, 1], [False, True, True], pp=1) is None  # layer 1 shared
    assert k_best_layouts([1, 1, 1], [True, False, True], pp=3) == []
    assert len(k_best_layouts([1, 1, 1], [True, True, True], pp=3, k=5)) == 1  # only one exists


# --------------------------------------------------------------------------- limits and size


def test_rank_fallback_beyond_work_limit(monkeypatch):
    monkeypatch.setattr(opt, "RANK_DP_MAX_WORK", 5)
    costs = [1.0] * GLM_N
    best = optimal_layout(costs, GLM_MASK, pp=8, vpp=2)
    stage = optimal_layout(costs, GLM_MASK, pp=8, vpp=2, unit="stage")
    assert not best.exact and best.unit == "stage" and "not solved exactly" in best.note
    assert best.split == stage.split and stage.exact and stage.note == ""
    assert len(best.rank_costs) == 8
    assert [lay.exact for lay in k_best_layouts(costs, GLM_MASK, pp=8, vpp=2, k=2)] == [False, False]


def test_a_caller_may_bound_the_rank_dp_lower():
    """``work`` bounds one call's rank DP (the GPU-budget search asks for less than Balance): over
    it, the per-stage optimum, said so with the bound asked for; the default keeps the module's."""
    costs = [1.0] * GLM_N
    exact = optimal_layout(costs, GLM_MASK, pp=8, vpp=2)
    bounded = optimal_layout(costs, GLM_MASK, pp=8, vpp=2, work=5)
    stage = optimal_layout(costs, GLM_MASK, pp=8, vpp=2, unit="stage")
    assert exact.exact and exact.unit == "rank"
    assert not bounded.exact and bounded.split == stage.split and "5 work units" in bounded.note


def test_rank_fallback_beyond_boundary_limit(monkeypatch):
    # PP4 VPP4 on GLM-5.2: W = 21 - 16 + 1 = 6 choices per cut, C(6 + 2, 3) = 56 boundary tuples
    monkeypatch.setattr(opt, "RANK_DP_MAX_BOUNDARIES", 55)
    best = optimal_layout([1.0] * GLM_N, GLM_MASK, pp=4, vpp=4)
    assert not best.exact and "56 round-boundary tuples" in best.note
    monkeypatch.setattr(opt, "RANK_DP_MAX_BOUNDARIES", 56)
    assert optimal_layout([1.0] * GLM_N, GLM_MASK, pp=4, vpp=4).exact


def test_rank_fallback_beyond_depth_limit():
    n = 500  # PP * (VPP + 2) = 200 * 4 = 800 > 600
    best = optimal_layout([1.0] * n, [True] * n, pp=200, vpp=2)
    assert not best.exact and "depth" in best.note and best.max_cost == 2.0


def feasible(block_costs, num_stages, bound):
    """Can the blocks (full layer + its shared layers) be cut into num_stages consecutive,
    non-empty groups each costing <= bound? Independent forward reachability over starts."""
    prefix = [0]
    for c in block_costs:
        prefix.append(prefix[-1] + c)
    f = len(block_costs)
    reach = {0}
    for _ in range(num_stages):
        reach = {y for x in reach for y in range(x + 1, f + 1) if prefix[y] - prefix[x] <= bound}
    return f in reach


def test_large_instance_n1024_pp64_runs_and_is_optimal():
    """Size smoke (not timed): N = 1024, 256 full layers, PP = 64, VPP = 1, integer costs."""
    rng = random.Random(1024)
    n = 1024
    mask = [i % 4 == 0 for i in range(n)]
    costs = [rng.randint(1, 9) for _ in range(n)]
    best = optimal_layout(costs, mask, pp=64)
    check_layout(best, costs, mask, 64, 1)
    blocks = [sum(costs[i : i + 4]) for i in range(0, n, 4)]
    m = int(best.max_cost)
    assert feasible(blocks, 64, m) and not feasible(blocks, 64, m - 1)


def test_rank_objective_f64_s16_vpp2_is_exact():
    """A larger rank instance (F = 64 > 21) stays within the exact DP's work limit."""
    rng = random.Random(64)
    n = 256
    mask = [i % 4 == 0 for i in range(n)]
    costs = [rng.uniform(0.5, 2.0) for _ in range(n)]
    best = optimal_layout(costs, mask, pp=8, vpp=2, first_stage_extra=2.5, last_stage_extra=6.0)
    stage = optimal_layout(costs, mask, pp=8, vpp=2, first_stage_extra=2.5, last_stage_extra=6.0, unit="stage")
    assert best.exact and best.unit == "rank"
    check_layout(best, costs, mask, 8, 2, 2.5, 6.0)
    assert best.max_cost <= max(stage.rank_costs)
    total = sum(Fraction(c) for c in costs) + Fraction(2.5) + Fraction(6.0)
    assert best.max_cost >= float(total / 8)
    assert math.isclose(sum(best.rank_costs), float(total))
