"""Exact min-max pipeline layouts for IndexShare (full / shared DSA layer) models.

Problem
-------
A model has ``N`` decoder layers, 1-based. *Full* layers compute the sparse-attention top-k;
*shared* layers reuse the top-k of the nearest preceding full layer, so a pipeline stage may only
start on a full layer. A layout cuts the ``N`` layers into ``S = PP * VPP`` contiguous, non-empty
stages in vp-major order (stage ``i`` is pipeline rank ``i % PP``, virtual stage ``i // PP``). It
is *valid* iff every stage starts on a full layer; layer 1 must therefore be full, and with ``F``
full layers there are exactly ``C(F - 1, S - 1)`` valid layouts (choose the starts of stages
``1 .. S-1`` among the ``F - 1`` full layers after layer 1): :func:`count_valid_layouts`.

Layer ``n`` costs ``c[n] >= 0``; stage ``0`` also carries ``first_stage_extra`` (embedding) and
stage ``S-1`` carries ``last_stage_extra`` (lm_head + MTP + loss), both when ``S == 1``. The
*unit* is a stage (``unit="stage"``) or a pipeline rank (``unit="rank"``, the default: the sum of
the rank's ``VPP`` stages, i.e. its memory / compute). With ``VPP == 1`` the two coincide.

Order (objective and deterministic tie-breaks)
----------------------------------------------
Layouts are ordered by the key::

    (max unit cost, sum of squared unit costs, sum of squared stage costs, split)

minimise the largest unit; then prefer even units; then (for ranks) even stages inside them;
then the lexicographically smallest stage sizes (vp-major; the same as the smallest stage starts).
For ``unit="stage"`` the 2nd and 3rd items coincide. Equal splits are equal layouts, so the order
is total: :func:`optimal_layout` returns its first layout and :func:`k_best_layouts` its first
``k``, distinct by construction.

All arithmetic is exact: costs become :class:`fractions.Fraction` values scaled by their common
denominator to Python ``int`` (floats are dyadic, so this is lossless); ties are real ties, never
rounding artefacts. Reported costs are the exact sums rounded once to ``float``.

Methods, exactness and complexity
---------------------------------
A layout is its cut sequence ``0 = x_0 < x_1 < .. < x_{S-1} < F``: ``x_j`` is the full layer (0-based
index among the full layers) where stage ``j`` starts. ``x_j`` can only lie in ``[j, j + W - 1]``
with ``W = F - S + 1``, and a stage's cost is a difference of prefix sums, O(1).

*Stage objective* (``VPP == 1`` or ``unit="stage"``): three exact dynamic programmes over
(stage, start): ``G[j][x]``, the least max cost of stages ``j..S-1`` when stage ``j`` starts at
``x`` (``min_y max(cost_j(x, y), G[j+1][y])``), gives the optimum ``M``; ``H[j][x]``, the least sum
of squares of stages ``j..S-1`` with every stage ``<= M``; a forward pass taking the smallest next
start that keeps ``H`` optimal gives the smallest split. Each phase fixes one key item exactly
given the previous ones. O(S * W^2) time (inner loops stop once a stage alone exceeds the bound),
O(S * F) memory: GLM-5.2 is instant; N = 1024, F = 256, PP = 64 takes a fraction of a second.

*Rank objective, VPP > 1*: a rank sums non-contiguous stages, so the stage DP does not apply, and
a DP over stages in vp-major order would have to carry the partial sums of all pending ranks. The
DP here goes *rank-major* instead. Fix the round boundaries ``beta = (x_P, x_2P, .., x_(V-1)P)``
(``P = PP``, ``V = VPP``); then rank ``r`` owns the chunks ``[x_(vP+r), x_(vP+r+1))`` and its cost
depends only on the states ``sigma_r = (x_r, x_(P+r), .., x_((V-1)P+r))`` and ``sigma_(r+1)``. The
ranks are independent given their states, so the best cost-to-go is a function of
``(beta, r, sigma_r)``: an exact memoised DP from ``(0, beta)`` to ``(beta, F)``, with three phases
as above (least max; least (sum of squared rank costs, sum of squared stage costs), an additive
pair compared lexicographically; smallest split by one forward greedy pass per vp round over the
DAG of optimal transitions, pruned backward after each round); one enumeration of a rank's cuts
(``_RankSolver._walk_rank``) serves all three, each phase giving only its own cut rule. Phase 1 starts from the best
*stage* layout's rank maximum and only searches for strict improvements; transitions above the
current bound are cut (monotone in the cut), and so are states whose remaining cost cannot fit
``(ranks left) * bound``. Worst case O(W^(V-1) * P * W^(2V)) transitions (W^(V-1) boundary tuples,
W^V states per rank, W^V transitions each), far fewer with the cuts. Measured work units (one
per candidate cut examined, about a microsecond each): GLM-5.2 (F = 21, S = 16) a few thousand
at PP8 VPP2 (milliseconds) and up to a few 10^5 at PP2 VPP8; 78 all-full layers at PP8 VPP2
about 6 * 10^5; S = 16, F = 64, VPP = 2 from 10^4 to 10^6 for the optimum (k = 5: up to 2 * 10^6);
VPP >= 4 with ``F >> S`` grows out of reach.

*Stated limits*: the exact rank DP runs only while (a) the number of round-boundary tuples
``C(W + V - 2, V - 1)`` is at most :data:`RANK_DP_MAX_BOUNDARIES`, (b) the recursion depth
``PP * (VPP + 2)`` is at most :data:`RANK_DP_MAX_DEPTH` and (c) the work stays within
:data:`RANK_DP_MAX_WORK` units per call (about a second; the first boundary tuple's work is used
as a probe to give up early when the rest clearly cannot fit). Beyond any limit the functions
return the exact optimum of the *stage* objective instead, with ``exact=False``,
``unit="stage"`` and a ``note`` saying which limit was hit.

*k best* (both objectives): Lawler's partition over the cut sequence. Pop the best layout of a
sub-space (a fixed prefix of cuts plus forbidden values for the next cut) and split the rest of
that sub-space into disjoint sub-spaces, one per later cut. Each sub-space's best comes from the
DPs above run with those constraints (the stage ``H`` tables are cached per bound; the rank DP
reuses the parent's maximum as a lower bound). Exact, distinct and in key order by construction;
O(k * S) sub-space solves.

*Nearest valid layout* (:func:`nearest_valid`): a layer *moves* when its stage index changes;
their number is ``N - sum_j |old stage j & new stage j|``, which decomposes over consecutive
cuts, so a DP over (stage, start on a full layer) minimises it exactly in O(S * W^2) - the same
recursion as the stage objective's tables (:class:`_Cuts`, one home for both) - tie-broken
by the cut shift ``sum_j |new cut_j - old cut_j|`` and then the smallest split. The two counts
agree while no layer moves by more than one stage; the cut shift over-counts otherwise
(full layers 1, 4, 5 of 6: split 1,1,4 -> 3,1,2 moves 3 layers, cut shift 4).

Nothing here imports anything outside the standard library (the fast CLI imports ``app.core``).
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "RANK_DP_MAX_BOUNDARIES",
    "RANK_DP_MAX_DEPTH",
    "RANK_DP_MAX_WORK",
    "Layout",
    "NearestValid",
    "StartChange",
    "count_valid_layouts",
    "k_best_layouts",
    "nearest_valid",
    "optimal_layout",
]

UNITS = ("rank", "stage")
#: Work limit of the exact rank-objective DP (VPP > 1), in candidate cuts examined per call
#: (about 1 microsecond each in CPython); beyond it the per-stage optimum is returned instead.
RANK_DP_MAX_WORK = 1_000_000
#: The rank DP is not attempted when there are more round-boundary tuples than this.
RANK_DP_MAX_BOUNDARIES = 2_000
#: The rank DP recurses about PP * (VPP + 2) frames deep; beyond this it is not attempted.
RANK_DP_MAX_DEPTH = 600

_INF = math.inf


@dataclass(frozen=True)
class Layout:
    """One valid layout. Stages are vp-major; layer numbers are 1-based.

    ``unit_costs`` are per rank (``unit == "rank"``) or per stage (``unit == "stage"``) and
    ``max_cost`` is their maximum. ``exact`` is ``False`` only when a rank objective was asked for
    but the instance exceeded the exact-search limits (see ``note``).
    """

    split: list[int]
    stage_costs: list[float]
    unit_costs: list[float]
    max_cost: float
    starts: list[int]
    rank_costs: list[float]
    pp: int
    vpp: int
    unit: str
    exact: bool = True
    note: str = ""

    @property
    def num_stages(self) -> int:
        return len(self.split)


@dataclass(frozen=True)
class StartChange:
    """A stage whose first layer moved (1-based layers)."""

    stage: int
    pp_rank: int
    vp_stage: int
    old_start: int
    new_start: int


@dataclass(frozen=True)
class NearestValid:
    """The valid layout closest to a given split (see :func:`nearest_valid`)."""

    split: list[int]
    starts: list[int]
    moved: int  # layers whose stage index changes
    cut_shift: int  # sum over the S-1 cuts of |new cut - old cut|
    changed: tuple[StartChange, ...]


# --------------------------------------------------------------------------- input handling


def _check_mask(full: Sequence) -> list[bool]:
    mask = [bool(v) for v in full]
    if not mask:
        raise ValueError("full must describe at least one layer (got an empty mask)")
    return mask


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _fraction(value: object, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a real number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    frac = Fraction(value)  # type: ignore[call-overload]  # any numbers.Real, exactly
    if frac < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return frac


@dataclass
class _Problem:
    n: int
    pos: list[int]  # 0-based positions of full layers, plus pos[F] = N
    f: int
    s: int
    pp: int
    vpp: int
    w: int
    bp: list[int]  # bp[x] = scaled cost of layers before pos[x]
    fe: int
    le: int
    den: int

    def extra(self, j: int) -> int:
        return (self.fe if j == 0 else 0) + (self.le if j == self.s - 1 else 0)


def _problem(costs, full, pp, vpp, first_stage_extra, last_stage_extra, unit) -> _Problem | None:
    """Validate the input; ``None`` when no valid layout exists."""
    pp = _check_count(pp, "pp")
    vpp = _check_count(vpp, "vpp")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    mask = _check_mask(full)
    costs = list(costs)
    if len(costs) != len(mask):
        raise ValueError(f"len(costs) = {len(costs)} but len(full) = {len(mask)}; give one cost per layer")
    fracs = [_fraction(c, f"cost of layer {i + 1}") for i, c in enumerate(costs)]
    fe = _fraction(first_stage_extra, "first_stage_extra")
    le = _fraction(last_stage_extra, "last_stage_extra")
    n = len(mask)
    s = pp * vpp
    pos = [i for i, is_full in enumerate(mask) if is_full]
    f = len(pos)
    if not mask[0] or s > f:
        return None
    den = 1
    for fr in (*fracs, fe, le):
        den = math.lcm(den, fr.denominator)
    scaled = [fr.numerator * (den // fr.denominator) for fr in fracs]
    prefix = [0]
    for v in scaled:
        prefix.append(prefix[-1] + v)
    pos.append(n)
    bp = [prefix[p] for p in pos]
    return _Problem(
        n=n, pos=pos, f=f, s=s, pp=pp, vpp=vpp, w=f - s + 1, bp=bp,
        fe=fe.numerator * (den // fe.denominator), le=le.numerator * (den // le.denominator), den=den,
    )


# --------------------------------------------------------------------------- costs and keys


def _stage_ints(pb: _Problem, xs: Sequence[int]) -> list[int]:
    bp, s = pb.bp, pb.s
    return [bp[xs[j + 1] if j + 1 < s else pb.f] - bp[xs[j]] + pb.extra(j) for j in range(s)]


def _rank_ints(pb: _Problem, stage: list[int]) -> list[int]:
    return [sum(stage[v * pb.pp + r] for v in range(pb.vpp)) for r in range(pb.pp)]


def _key(pb: _Problem, xs: Sequence[int], unit: str) -> tuple:
    stage = _stage_ints(pb, xs)
    units = _rank_ints(pb, stage) if unit == "rank" else stage
    return (max(units), sum(u * u for u in units), sum(c * c for c in stage), tuple(xs))


def _layout(pb: _Problem, xs: Sequence[int], unit: str, exact: bool = True, note: str = "") -> Layout:
    starts0 = [pb.pos[x] for x in xs]
    split = [b - a for a, b in zip(starts0, starts0[1:] + [pb.n])]
    stage = _stage_ints(pb, xs)
    rank = _rank_ints(pb, stage)
    units = rank if unit == "rank" else stage
    den = pb.den
    return Layout(
        split=split,
        stage_costs=[v / den for v in stage],
        unit_costs=[v / den for v in units],
        max_cost=max(units) / den,
        starts=[p + 1 for p in starts0],
        rank_costs=[v / den for v in rank],
        pp=pb.pp,
        vpp=pb.vpp,
        unit=unit,
        exact=exact,
        note=note,
    )


# --------------------------------------------------------------------------- the cut recursion


def _best_next(links, rest: list, join_max: bool, monotone: bool) -> tuple:
    """One step of the recursion over stage starts on full layers: the least ``join(link, rest[y])``
    over the next starts ``y`` that ``links`` yields as ``(y, link)`` pairs in increasing ``y``, and
    the smallest ``y`` that reaches it (``(inf, None)`` when none does). ``join`` is ``max``
    (``join_max``) or ``+``; both are never below the link, so with ``monotone`` links (a stage only
    grows with ``y``) the scan stops once a link alone reaches the best value."""
    best, best_y = _INF, None
    for y, link in links:
        if monotone and link >= best:
            break
        r = rest[y]
        if r is _INF:
            continue  # no layout of the later stages from y
        v = (link if link > r else r) if join_max else link + r
        if v < best:
            best, best_y = v, y
    return best, best_y


class _Cuts:
    """The one recursion over cuts (``x_j``: the full layer where stage ``j`` starts, in
    ``[j, j + W - 1]``), shared by Balance's tables (least max stage cost ``G``, least sum of squared
    stage costs ``H``) and Nearest valid's (least moved layers, then cut shift): ``T[S-1][x]`` is the
    last stage's value and ``T[j][x]`` the :func:`_best_next` over its links; :meth:`path` walks the
    table forward, taking the smallest next start that keeps the optimum (the smallest split)."""

    def __init__(self, s: int, w: int, f: int, last, links, join_max: bool, monotone: bool):
        self.s, self.w, self.links, self.join_max, self.monotone = s, w, links, join_max, monotone
        table = [[_INF] * (f + 1) for _ in range(s)]
        for x in range(s - 1, s - 1 + w):
            table[s - 1][x] = last(x)
        for j in range(s - 2, -1, -1):
            rest, row = table[j + 1], table[j]
            for x in range(j, j + w):
                row[x] = _best_next(links(j, x), rest, join_max, monotone)[0]
        self.table = table

    def step(self, j: int, x: int, excluded: frozenset[int] = frozenset()) -> tuple:
        """``(value, y)`` of stage ``j`` starting at ``x`` with its next start not in ``excluded``."""
        links = self.links(j, x)
        if excluded:
            links = ((y, c) for y, c in links if y not in excluded)
        return _best_next(links, self.table[j + 1], self.join_max, self.monotone)

    def path(self, xs: Sequence[int]) -> list[int]:
        """Extend starts ``xs`` (stage ``len(xs) - 1`` starts at ``xs[-1]``) to every stage."""
        xs = list(xs)
        for j in range(len(xs) - 1, self.s - 1):
            y = self.step(j, xs[-1])[1]
            assert y is not None, "cut recursion: the table guarantees a successor"
            xs.append(y)
        return xs


# --------------------------------------------------------------------------- stage objective


class _StageSolver:
    """Exact DPs for the stage objective (see the module docstring), both on :class:`_Cuts`."""

    def __init__(self, pb: _Problem):
        self.pb = pb
        self.g = _Cuts(pb.s, pb.w, pb.f, self._last_cost, self._cost_links, join_max=True, monotone=True)
        self._h: dict[int, _Cuts] = {}

    def _last_cost(self, x: int) -> int:
        pb = self.pb
        return pb.bp[pb.f] - pb.bp[x] + pb.extra(pb.s - 1)

    def _cost_links(self, j: int, x: int):
        """``(y, cost of stage j = [x, y))`` for every next start ``y`` in ``(x, j + W]``."""
        bp = self.pb.bp
        base = bp[x] - self.pb.extra(j)
        return ((y, bp[y] - base) for y in range(x + 1, j + self.pb.w + 1))

    def h(self, bound: int) -> _Cuts:
        """H[j][x]: least sum of squared stage costs of stages j..S-1, every stage <= bound."""
        cuts = self._h.get(bound)
        if cuts is None:
            def last(x: int) -> float:
                c = self._last_cost(x)
                return c * c if c <= bound else _INF

            def links(j: int, x: int):
                bp = self.pb.bp
                base = bp[x] - self.pb.extra(j)
                for y in range(x + 1, j + self.pb.w + 1):
                    c = bp[y] - base  # the stage's cost (as in _cost_links)
                    if c > bound:
                        return  # and only grows with y
                    yield y, c * c

            cuts = self._h[bound] = _Cuts(self.pb.s, self.pb.w, self.pb.f, last, links, join_max=False, monotone=True)
        return cuts

    def best_in(self, prefix: tuple[int, ...], excluded: frozenset[int], floor: tuple | None = None) -> tuple | None:
        """Key of the best layout with the given prefix of starts and the next start not in
        ``excluded``; ``None`` if that sub-space is empty."""
        pb = self.pb
        j = len(prefix) - 1  # stage j starts at prefix[-1]; choose the start of stage j + 1
        stage = [pb.bp[prefix[i + 1]] - pb.bp[prefix[i]] + pb.extra(i) for i in range(j)]
        ps = sum(c * c for c in stage)
        least_max = self.g.step(j, prefix[-1], excluded)[0]
        if least_max is _INF:
            return None
        bound = int(max(max(stage, default=0), least_max))
        h = self.h(bound)
        best, best_y = h.step(j, prefix[-1], excluded)
        assert best_y is not None  # bound is finite, so some successor reaches it
        xs = h.path([*prefix, best_y])
        return (bound, ps + best, ps + best, tuple(xs))


def _lawler(best_in, s: int, k: int) -> list[tuple]:
    """Lawler's k-best partition over the cut sequence: keys of the ``k`` best layouts, in order.

    ``best_in(prefix, excl, floor)`` returns the key (last item: the cut tuple) of the best layout
    whose cuts start with ``prefix`` and whose next cut is not in ``excl``, or ``None``; ``floor``
    (``None`` or a key known to be no worse than that best) may be used to skip work.
    """
    root = best_in((0,), frozenset(), None)
    if root is None:
        return []
    heap: list[tuple[tuple, int, frozenset[int]]] = [(root, 1, frozenset())]  # (key, cut index, forbidden values)
    out: list[tuple] = []
    while heap:
        key, at, excluded = heapq.heappop(heap)
        out.append(key)
        if len(out) == k:
            break
        xs = key[-1]
        for t in range(at, s):
            forbid = (excluded | {xs[t]}) if t == at else frozenset((xs[t],))
            sub = best_in(xs[:t], forbid, key)  # a sub-space's best is never better than key
            if sub is not None:
                heapq.heappush(heap, (sub, t, forbid))
    return out


# --------------------------------------------------------------------------- rank objective


class _BudgetExceeded(Exception):
    pass


#: What the rank walk's ``admit`` answers for a candidate cut: take it, skip it, or stop (every
#: larger cut of that round costs more).
_TAKE, _SKIP, _STOP = object(), object(), object()


class _RankSolver:
    """Exact rank-major DP for the rank objective with VPP > 1 (see the module docstring).

    Cut ``j`` is the full index where stage ``j`` starts (``c_0 = 0``, ``c_S = F``). With the
    round boundaries ``beta = (c_P, c_2P, .., c_(V-1)P)`` fixed, rank ``r`` owns stages
    ``v*P + r`` and the *state* before rank ``r`` is ``sigma_r = (c_r, c_(P+r), .., c_((V-1)P+r))``:
    the ranks are independent given their states, so the least cost-to-go is a function of
    ``(beta, r, sigma_r)`` alone. A sub-space (Lawler) fixes ``c_1 .. c_(t-1)`` to ``prefix`` and
    forbids ``excl`` for ``c_t``.
    """

    def __init__(self, pb: _Problem, stage: _StageSolver, budget: int):
        self.pb = pb
        self.stage = stage
        self.budget = self.left = budget

    def _spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise _BudgetExceeded(f"the exact rank DP needs more than {self.budget:,} work units")

    @staticmethod
    def _ys(j: int, a: int, hi: int, prefix: tuple[int, ...]):
        """Candidate values of cut ``j`` above ``a`` and at most ``hi`` (prefix-constrained)."""
        if j < len(prefix):
            p = prefix[j]
            return (p,) if a < p <= hi else ()
        return range(a + 1, hi + 1)

    def _betas(self, prefix: tuple[int, ...], excl: frozenset[int]) -> list[tuple[int, ...]]:
        """Every admissible boundary tuple (each one costs a unit of the work budget)."""
        pb = self.pb
        p, v_count, w, t = pb.pp, pb.vpp, pb.w, len(prefix)
        # with b_v = beta_v - v*P the tuples are non-decreasing sequences in [0, W): count them
        count = math.comb(w + v_count - 2, v_count - 1)
        if count > RANK_DP_MAX_BOUNDARIES:
            raise _BudgetExceeded(
                f"{count:,} round-boundary tuples exceed the rank DP limit {RANK_DP_MAX_BOUNDARIES:,}"
            )
        out: list[tuple[int, ...]] = []

        def rec(v: int, lo: int, acc: tuple[int, ...]) -> None:
            if v == v_count:
                self._spend()
                out.append(acc)
                return
            j = v * p
            for b in self._ys(j, lo - 1, j + w - 1, prefix):
                if b < j or (j == t and b in excl):
                    continue
                rec(v + 1, b + p, acc + (b,))

        rec(1, p, ())
        return out

    def _walk_rank(self, r: int, st: tuple[int, ...], final: tuple[int, ...], prefix: tuple[int, ...],
                   excl: frozenset[int], admit, leaf) -> None:
        """The one enumeration behind the rank DP's three phases: every state ``sigma_(r+1)`` that
        rank ``r`` (state ``st``) can hand on. Round by round, cut ``j = v*P + r + 1`` takes each
        value above ``st[v]`` (the prefix's, if fixed; leaving a full layer for every later rank),
        ``c`` being the rank's cost so far (chunk costs, the embedding on rank 0's first chunk);
        ``admit(c, last_round)`` answers :data:`_TAKE`, :data:`_SKIP` or :data:`_STOP` (every larger
        value costs more), a forbidden ``excl`` value is skipped, and ``leaf(state, cost, sum of
        squared chunk costs)`` sees each complete state. Each candidate costs one work unit."""
        pb = self.pb
        p, nv, bp = pb.pp, pb.vpp, pb.bp
        rr, t = r + 1, len(prefix)
        ex = pb.fe if r == 0 else 0
        nxt = [0] * nv

        def rec(v: int, partial: int, sq: int) -> None:
            if v == nv:
                leaf(tuple(nxt), partial, sq)
                return
            a = st[v]
            base = bp[a] - (ex if v == 0 else 0)
            j = v * p + rr
            last = v == nv - 1
            seen = 0
            for y in self._ys(j, a, final[v] - (p - rr), prefix):
                seen += 1
                s = bp[y] - base
                c = partial + s
                verdict = admit(c, last)
                if verdict is _STOP:
                    break
                if verdict is _SKIP or (j == t and y in excl):
                    continue
                nxt[v] = y
                rec(v + 1, c, sq + s * s)
            self._spend(seen)

        rec(0, 0, 0)

    def _minmax(self, beta: tuple[int, ...], cap: float, prefix: tuple[int, ...], excl: frozenset[int]):
        """Least possible max rank cost with these boundaries, among layouts whose every rank
        costs <= cap (``inf`` if there is none)."""
        pb = self.pb
        p, bp, fe, le = pb.pp, pb.bp, pb.fe, pb.le
        final = beta + (pb.f,)
        phi_end = sum(bp[x] for x in final)
        memo: list[dict] = [{} for _ in range(p)]

        def f(r: int, st: tuple[int, ...], phi: int):
            got = memo[r].get(st)
            if got is not None:
                return got
            ex = fe if r == 0 else 0
            rest = phi_end - phi + ex + le  # this rank and the later ones, together
            if r == p - 1:
                res = rest if rest <= cap else _INF
            elif rest > (p - r) * cap:
                res = _INF
            else:
                best = [_INF]

                def admit(c: int, last: bool) -> object:
                    return _STOP if c >= best[0] or c > cap else _TAKE  # dearer for every larger y

                def leaf(nxt: tuple[int, ...], partial: int, sq: int) -> None:
                    sub = f(r + 1, nxt, phi + partial - ex)
                    cand = partial if partial > sub else sub
                    if cand < best[0]:
                        best[0] = cand

                self._walk_rank(r, st, final, prefix, excl, admit, leaf)
                res = best[0]
            memo[r][st] = res
            return res

        init = (0,) + beta
        return f(0, init, sum(bp[x] for x in init))

    def _sumsq(self, beta: tuple[int, ...], cap: int, prefix: tuple[int, ...], excl: frozenset[int]):
        """Least (sum of squared rank costs, sum of squared stage costs) with every rank <= cap;
        returns (value or None, memo)."""
        pb = self.pb
        p, nv, bp, fe, le = pb.pp, pb.vpp, pb.bp, pb.fe, pb.le
        final = beta + (pb.f,)
        phi_end = sum(bp[x] for x in final)
        memo: list[dict] = [{} for _ in range(p)]

        def g(r: int, st: tuple[int, ...], phi: int):
            d = memo[r]
            if st in d:
                return d[st]
            ex = fe if r == 0 else 0
            mass = phi_end - phi + ex + le  # this rank and the later ones, together
            if r == p - 1:
                stages = [bp[final[v]] - bp[st[v]] for v in range(nv)]
                stages[0] += ex
                stages[-1] += le
                c = sum(stages)
                d[st] = (c * c, sum(x * x for x in stages)) if c <= cap else None
            elif mass > (p - r) * cap:
                d[st] = None
            else:
                d[st] = self._sumsq_step(r, st, final, cap, mass, prefix, excl,
                                         lambda nxt, partial: g(r + 1, nxt, phi + partial - ex))
            return d[st]

        init = (0,) + beta
        return g(0, init, sum(bp[x] for x in init)), memo

    def _sumsq_step(self, r, st, final, cap, mass, prefix, excl, rest) -> tuple | None:
        """The least (sum of squared rank costs, sum of squared stage costs) of ranks ``r..P-1``
        from state ``st``, ``rest(state, rank r's cost)`` being the later ranks' value (or None)."""
        later = self.pb.pp - r - 1  # ranks after this one
        best: list = [None]

        def admit(c: int, last: bool) -> object:
            if c > cap:
                return _STOP
            if best[0] is not None:
                # This rank ends at some cost x >= c (== c for the last chunk) and the later
                # ranks share mass - x, so q >= x^2 + (mass - x)^2 / later: convex in x,
                # least at x = mass / (later + 1), increasing beyond it.
                x = c if last or c * (later + 1) >= mass else None
                if x is not None and (x * x) * later + (mass - x) ** 2 > best[0][0] * later:
                    return _STOP if c * (later + 1) >= mass else _SKIP  # a stop: it only grows with y
            return _TAKE

        def leaf(nxt: tuple[int, ...], partial: int, sq: int) -> None:
            sub = rest(nxt, partial)
            if sub is not None:
                cand = (partial * partial + sub[0], sq + sub[1])
                if best[0] is None or cand < best[0]:
                    best[0] = cand

        self._walk_rank(r, st, final, prefix, excl, admit, leaf)
        return best[0]

    def _optimal_edges(self, beta, r, st, cap, memo, prefix, excl):
        """Successor states of ``(beta, r, st)`` on optimal (phase-2) paths."""
        final = beta + (self.pb.f,)
        if r == self.pb.pp - 1:
            return [final]
        target = memo[r][st]
        out = []

        def admit(c: int, last: bool) -> object:
            return _STOP if c > cap or c * c > target[0] else _TAKE

        def leaf(nxt: tuple[int, ...], partial: int, sq: int) -> None:
            sub = memo[r + 1].get(nxt)
            if sub is not None and (partial * partial + sub[0], sq + sub[1]) == target:
                out.append(nxt)

        self._walk_rank(r, st, final, prefix, excl, admit, leaf)
        return out

    def best_in(self, prefix: tuple[int, ...], excl: frozenset[int], floor: tuple | None = None) -> tuple | None:
        """Key of the best layout of a sub-space by the rank objective, in three exact phases: the
        least maximum, the least (sum of squared rank costs, sum of squared stage costs) at it, the
        smallest cut sequence among those."""
        seed = self.stage.best_in(prefix, excl)  # a layout of this sub-space: an upper bound
        if seed is None:
            return None
        betas = self._betas(prefix, excl)
        bound = self._least_max(seed[-1], betas, prefix, excl, floor)
        memos, sums = {}, {}
        for beta in betas:
            val, memo = self._sumsq(beta, bound, prefix, excl)
            if val is not None:
                sums[beta], memos[beta] = val, memo
        best_sum = min(sums.values())
        starts = [beta for beta, val in sums.items() if val == best_sum]
        xs = self._smallest_path(starts, bound, memos, prefix, excl)
        return (bound, best_sum[0], best_sum[1], tuple(xs))

    def _least_max(self, seed_xs, betas, prefix, excl, floor) -> int:
        """Phase 1, the least maximum rank cost: search only for strict improvements on the seed's,
        unless the floor (a lower bound) already shows the seed's maximum is optimal."""
        pb = self.pb
        p, nv = pb.pp, pb.vpp
        cap = _key(pb, seed_xs, "rank")[0]
        if floor is not None and floor[0] >= cap:
            return cap
        seed_beta = tuple(seed_xs[v * p] for v in range(1, nv))
        for i, beta in enumerate(sorted(betas, key=lambda b: b != seed_beta)):
            before = self.left
            val = self._minmax(beta, cap - 1, prefix, excl)
            if i == 0 and (before - self.left) * len(betas) > self.left:
                # probe: at this rate the other boundary tuples would not fit the budget
                raise _BudgetExceeded(
                    f"the exact rank DP would need about {(before - self.left) * len(betas):,} work "
                    f"units (limit {self.budget:,})"
                )
            if val < cap:
                cap = val
        return cap

    def _smallest_path(self, betas, bound, memos, prefix, excl) -> list[int]:
        """Phase 3, the lexicographically smallest cut sequence among the optimal paths from the
        boundary tuples ``betas``: one forward greedy pass per vp round over the DAG of optimal
        transitions, pruned backward after each round."""
        pb = self.pb
        p, nv = pb.pp, pb.vpp
        layers: list[dict] = [{} for _ in range(p + 1)]
        for beta in betas:
            layers[0][(beta, (0,) + beta)] = None
        for r in range(p):
            for node in layers[r]:
                beta, st = node
                succ = [(beta, nst) for nst in self._optimal_edges(beta, r, st, bound, memos[beta], prefix, excl)]
                layers[r][node] = succ
                for nd in succ:
                    layers[r + 1].setdefault(nd, None)
        alive = [set(layer) for layer in layers]
        for v in range(nv):
            cur = alive[0]
            for r in range(1, p + 1):
                cand = {nd for node in cur for nd in layers[r - 1][node] if nd in alive[r]}
                low = min(nd[1][v] for nd in cand)
                cur = {nd for nd in cand if nd[1][v] == low}
                alive[r] = cur
            for r in range(p - 1, -1, -1):
                alive[r] = {node for node in alive[r] if any(nd in alive[r + 1] for nd in layers[r][node])}
        assert all(len(alive[r]) == 1 for r in range(p + 1)), "rank DP lexicographic pass"
        xs = [0] * pb.s
        for r in range(p):
            _, st = next(iter(alive[r]))
            for v in range(nv):
                xs[v * p + r] = st[v]
        return xs


# --------------------------------------------------------------------------- public API


def _solve(pb: _Problem, k: int, unit: str, work: int | None = None) -> list[Layout]:
    if pb.s == 1:
        return [_layout(pb, [0], unit)]
    stage = _StageSolver(pb)
    if unit == "stage" or pb.vpp == 1:
        return [_layout(pb, key[-1], unit) for key in _lawler(stage.best_in, pb.s, k)]
    depth = pb.pp * (pb.vpp + 2)
    if depth <= RANK_DP_MAX_DEPTH:
        rank = _RankSolver(pb, stage, RANK_DP_MAX_WORK if work is None else work)
        try:
            return [_layout(pb, key[-1], "rank") for key in _lawler(rank.best_in, pb.s, k)]
        except _BudgetExceeded as exc:
            reason = str(exc)
    else:
        reason = f"PP * (VPP + 2) = {depth} exceeds the rank DP depth limit {RANK_DP_MAX_DEPTH}"
    note = (
        f"rank objective not solved exactly ({reason}; S = {pb.s} stages, VPP = {pb.vpp}, "
        f"F = {pb.f} full layers): this is the exact optimum of the per-stage objective "
        "(unit='stage') instead; rank_costs are reported for reference"
    )
    return [_layout(pb, key[-1], "stage", exact=False, note=note) for key in _lawler(stage.best_in, pb.s, k)]


def optimal_layout(
    costs: Sequence[float],
    full: Sequence[bool],
    pp: int,
    vpp: int = 1,
    first_stage_extra: float = 0.0,
    last_stage_extra: float = 0.0,
    unit: str = "rank",
    work: int | None = None,
) -> Layout | None:
    """The exact min-max optimal valid layout (ties: sum of squares, then smallest split).

    ``costs[i]`` and ``full[i]`` describe layer ``i + 1``. Returns ``None`` when no valid layout
    exists (layer 1 shared, or more stages than full layers). Raises ``ValueError`` on bad input.
    ``work``: the rank DP's work limit (VPP > 1; :data:`RANK_DP_MAX_WORK` unless a caller that
    solves many shapes asks for less); beyond it the per-stage optimum (``exact=False``).
    """
    pb = _problem(costs, full, pp, vpp, first_stage_extra, last_stage_extra, unit)
    if pb is None:
        return None
    return _solve(pb, 1, unit, work)[0]


def k_best_layouts(
    costs: Sequence[float],
    full: Sequence[bool],
    pp: int,
    vpp: int = 1,
    k: int = 5,
    first_stage_extra: float = 0.0,
    last_stage_extra: float = 0.0,
    unit: str = "rank",
) -> list[Layout]:
    """The ``k`` best distinct valid layouts in the order of :func:`optimal_layout` (fewer when
    fewer exist; empty when none exists)."""
    k = _check_count(k, "k")
    pb = _problem(costs, full, pp, vpp, first_stage_extra, last_stage_extra, unit)
    if pb is None:
        return []
    return _solve(pb, k, unit)


def count_valid_layouts(full: Sequence[bool], num_stages: int) -> int:
    """Number of valid layouts of ``num_stages`` stages: ``C(F - 1, S - 1)`` if layer 1 is full."""
    s = _check_count(num_stages, "num_stages")
    mask = _check_mask(full)
    if not mask[0]:
        return 0
    return math.comb(sum(mask) - 1, s - 1)  # comb is 0 when S > F


def _nearest_input(split: Sequence[int], full: Sequence[bool], vpp: int) -> tuple[list[bool], list[int]]:
    """The mask and the stage sizes of a :func:`nearest_valid` question; ``ValueError`` on bad input."""
    vpp = _check_count(vpp, "vpp")
    mask = _check_mask(full)
    sizes = list(split)
    for i, v in enumerate(sizes):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ValueError(f"stage {i} size must be a non-negative integer, got {v!r}")
    if not sizes:
        raise ValueError("split must have at least one stage")
    if len(sizes) % vpp:
        raise ValueError(f"split has {len(sizes)} stages, not a multiple of vpp = {vpp}")
    total = sum(sizes)
    if total != len(mask):
        raise ValueError(f"split sums to {total} layers but the model has N = {len(mask)}")
    return mask, sizes


def nearest_valid(split: Sequence[int], full: Sequence[bool], vpp: int = 1) -> NearestValid | None:
    """The valid layout with ``len(split)`` stages that moves the fewest layers.

    A layer *moves* when its stage index changes. Ties: the smallest cut shift
    ``sum_j |new cut_j - old cut_j|``, then the lexicographically smallest split. Zero-sized
    stages are allowed in the input. Returns ``None`` when no valid layout of that many stages
    exists; raises ``ValueError`` when the split does not sum to the number of layers.

    The DP is :class:`_Cuts` (Balance's recursion) with the link ``moved * scale + shift`` summed
    over the stages: the shift of a cut is at most N, so the scale keeps the order lexicographic.
    """
    mask, sizes = _nearest_input(split, full, vpp)
    n, s = len(mask), len(sizes)
    pos = [i for i, is_full in enumerate(mask) if is_full]
    f = len(pos)
    if not mask[0] or s > f:
        return None
    pos.append(n)
    old = [0]
    for v in sizes:
        old.append(old[-1] + v)  # old[j] = 0-based first layer of stage j, old[s] = n
    scale = n * s + 1

    def moved_in(j: int, a: int, b: int) -> int:
        """Layers of new stage j = [a, b) that were not in old stage j."""
        overlap = min(b, old[j + 1]) - max(a, old[j])
        return (b - a) - (overlap if overlap > 0 else 0)

    def links(j: int, x: int):
        a = pos[x]
        return ((y, moved_in(j, a, pos[y]) * scale + abs(pos[y] - old[j + 1])) for y in range(x + 1, j + f - s + 2))

    cuts = _Cuts(s, f - s + 1, f, lambda x: moved_in(s - 1, pos[x], n) * scale, links, join_max=False, monotone=False)
    moved, shift = divmod(int(cuts.table[0][0]), scale)  # finite: the problem has a layout
    starts0 = [pos[x] for x in cuts.path([0])]
    pp = s // vpp
    changed = tuple(
        StartChange(stage=j, pp_rank=j % pp, vp_stage=j // pp, old_start=old[j] + 1, new_start=starts0[j] + 1)
        for j in range(s) if starts0[j] != old[j]
    )
    new_split = [b - a for a, b in zip(starts0, starts0[1:] + [n])]
    return NearestValid(split=new_split, starts=[p + 1 for p in starts0], moved=moved, cut_shift=shift, changed=changed)
