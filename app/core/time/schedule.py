"""Pipeline-schedule simulator: Megatron's 1F1B and interleaved 1F1B run on real stage costs.

Each pipeline rank executes one ordered list of forward (F) and backward (B) steps on its compute
stream; a step starts when the rank is free and its input has arrived:

* ``F(s, i)`` (stage ``s``, micro-batch ``i``) needs ``F(s - 1, i)`` finished plus the activation
  send time from stage ``s - 1`` (stage ``s`` is virtual stage ``s // PP`` of rank ``s % PP``,
  the vp-major order of :class:`app.core.layout.stages.StagePlan`);
* ``B(s, i)`` needs ``B(s + 1, i)`` finished plus the gradient send time, and ``F(s, i)``;
* optionally the first forward of a (rank, chunk) waits for that chunk's parameters
  (``ready``: the distributed optimizer's overlapped all-gather).

Sends are asynchronous (``overlap_p2p_comm``, Megatron's default for interleaving; for plain 1F1B
the blocking ``send_forward_recv_backward`` waits exactly for the gradient the next step needs,
so the dependencies are the same).

The per-rank order is Megatron's (NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``
@ d98e8a64ddf3): ``forward_backward_pipelining_without_interleaving`` runs
``min(PP - rank - 1, m)`` warm-up forwards, then one forward and one backward per step, then the
remaining backwards. ``forward_backward_pipelining_with_interleaving`` runs
``get_pp_rank_microbatches``' warm-up count ``(PP - rank - 1) * 2 + (VPP - 1) * G`` (capped at
``m * VPP``) with ``G = microbatch_group_size_per_vp_stage`` (default PP), then 1F1B over
virtual micro-batches, then the cool-down backwards; virtual micro-batch ``k`` maps to
(micro-batch, chunk) through ``get_schedule_table`` (groups of ``G`` micro-batches run chunk 0,
then chunk 1, ...), and backward ``k`` runs chunk ``VPP - 1 - chunk(k)``. Megatron refuses
``m % G`` in ``1 .. PP - 1`` (a ``RuntimeError``) and ``G > m``; so does :func:`simulate`.

The worklist over ranks (each step's dependencies checked in O(1)) runs once per shape - PP, VPP,
micro-batches, group - on the dependencies alone and yields a :class:`StepGraph` (cached), its
steps in the order they start when every step takes 1 s (a topological order that repeats itself
from one micro-batch group to the next); each simulation is then one pass over that graph with the
stages' durations and sends (:func:`run_graph`): O(steps) time, about 2 * m * VPP * PP steps.

The durations and sends are first rounded to a grid ``q`` fine enough that no time of the step
reaches ``2**52 * q`` (:func:`exact_grid`; ``q`` is about 1e-16 of the step), so every addition of
the simulation is exact and its result does not depend on the order of the additions. That lets
the live pass (:func:`run_ends`) stop simulating the steady state: once a window of steps as long
as the graph's longest dependency repeats the window one period earlier, shifted by the same
``lambda`` (exactly, on the grid), every later step of the repeating part of the graph does too
(max-plus algebra: ``max(x + lambda, y + lambda) + t = max(x, y) + t + lambda``), so the pass
jumps over whole periods and resumes for the drain. With equal costs on every stage
and no send time, its makespan is exactly ``(m + (PP - 1) / VPP) * (f + b)`` for per-rank
forward / backward time ``f`` / ``b`` per micro-batch, i.e. the bubble ``(PP - 1) / (VPP * m + PP - 1)``
of FACTS.md section 7 (property-tested in ``tests/core/time/test_time_schedule.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


class ScheduleError(ValueError):
    """A schedule Megatron refuses (micro-batch count against PP / VPP)."""


@dataclass(frozen=True)
class Schedule:
    """The simulated iteration. Times in seconds from the start of the step."""

    pp: int
    vpp: int
    num_microbatches: int
    makespan: float
    busy: tuple[float, ...]  # compute time per rank
    compute_end: tuple[float, ...]  # when each rank's last step ends
    last_backward: tuple[tuple[tuple[float, float], ...], ...]  # [rank][chunk] (start, end) of its last B
    # the timeline, one entry per step: parallel columns (compact for 65k steps)
    rank: tuple[int, ...]
    chunk: tuple[int, ...]
    microbatch: tuple[int, ...]
    backward: tuple[bool, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    #: the makespan of the same steps with free sends (``simulate(..., free_sends=True)``; else the makespan)
    free_makespan: float | None = None

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ranks' compute streams over the makespan (mean over ranks)."""
        if self.makespan <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.pp * self.makespan)

    @property
    def fill_drain_fraction(self) -> float:
        """The part of :attr:`bubble_fraction` the pipeline's fill and drain explain: the bubble of
        this schedule with equal stages and free sends (:func:`closed_form_bubble`). The rest is
        ranks waiting on slower stages, sends and parameter gathers."""
        return closed_form_bubble(self.pp, self.vpp, self.num_microbatches)

    def timeline(self) -> dict[str, Any]:
        """Columns for a figure: rank, chunk, micro-batch, kind (F/B), start, end."""
        return {"rank": list(self.rank), "chunk": list(self.chunk), "microbatch": list(self.microbatch),
                "kind": ["B" if b else "F" for b in self.backward], "start": list(self.start),
                "end": list(self.end)}


def _check(pp: int, vpp: int, m: int, group: int | None) -> int:
    for name, v in (("pp", pp), ("vpp", vpp), ("num_microbatches", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{name} must be a whole number >= 1, got {v!r}")
    g = pp if group is None else group
    if vpp > 1:
        if pp < 2:
            raise ScheduleError("an interleaved schedule (VPP > 1) needs PP > 1")
        if g > m or g < pp:
            raise ScheduleError(
                f"the number of contiguous micro-batches in a virtual pipeline stage should range in "
                f"[PP={pp}, M={m}]; got {g} (Megatron raises ValueError): use at least PP micro-batches")
        if 0 < m % g < pp:
            raise ScheduleError(
                f"{m} micro-batches leave a final group of {m % g} < PP={pp} (Megatron raises RuntimeError: "
                "'The remainder of M ... divided by N ... should be 0, or larger than or equal to the "
                "pipeline-parallel size'); use a multiple of PP micro-batches")
    return g


def schedule_table(m: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's ``get_schedule_table``: (micro-batch, chunk) per virtual micro-batch id."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table.extend((i, c) for c in range(vpp) for i in range(lo, hi))
    return table


def rank_order(pp: int, vpp: int, m: int, rank: int, group: int | None = None) -> list[tuple[bool, int, int]]:
    """The steps of ``rank`` in execution order: (is_backward, chunk, micro-batch)."""
    g = _check(pp, vpp, m, group)
    if vpp == 1:
        warm = min(pp - rank - 1, m)
        order: list[tuple[bool, int, int]] = [(False, 0, i) for i in range(warm)]
        for k in range(m - warm):
            order.append((False, 0, warm + k))
            order.append((True, 0, k))
        order.extend((True, 0, k) for k in range(m - warm, m))
        return order
    total = m * vpp
    table = schedule_table(m, vpp, g)
    warm = min((pp - rank - 1) * 2 + (vpp - 1) * g, total)
    fwd = [(False, c, i) for i, c in table]
    bwd = [(True, vpp - 1 - c, i) for i, c in table]
    order = fwd[:warm]
    for k in range(total - warm):
        order.append(fwd[warm + k])
        order.append(bwd[k])
    order.extend(bwd[total - warm:])
    return order


def _per_stage(values: float | Sequence[float], n: int, name: str) -> list[float]:
    if isinstance(values, (int, float)):
        out = [float(values)] * n
    else:
        out = [float(v) for v in values]
    if len(out) != n:
        raise ScheduleError(f"{name} needs {n} values (one per stage), got {len(out)}")
    if any(v < 0 for v in out):
        raise ScheduleError(f"{name} must not be negative")
    return out


def rank_orders(pp: int, vpp: int, num_microbatches: int, group: int | None = None) -> list[list[tuple[bool, int, int]]]:
    """Every rank's :func:`rank_order` (what :func:`step_graph` runs the worklist over)."""
    return [rank_order(pp, vpp, num_microbatches, r, group) for r in range(pp)]


@dataclass(frozen=True)
class StepGraph:
    """The dependency structure of one iteration, independent of the durations: every step in the
    order it starts when every step takes 1 s (module docstring), and for step ``k`` the index of the rank's
    previous step (``prev``), of the step whose output it needs (``dep``: ``F(s - 1, i)`` for a
    forward, ``B(s + 1, i)`` for a backward), which send it waits for (``send``: ``s - 1`` forward,
    ``S + s`` backward, ``2 S`` none, for ``S`` stages) and which duration it takes (``dur``: ``s``
    forward, ``S + s`` backward). Index ``n`` (the step count) is a slot that stays 0. A backward's
    own forward ran earlier on its rank, so the rank's previous step already bounds it."""

    pp: int
    vpp: int
    num_microbatches: int
    rank: tuple[int, ...]
    chunk: tuple[int, ...]
    microbatch: tuple[int, ...]
    backward: tuple[bool, ...]
    prev: tuple[int, ...]
    dep: tuple[int, ...]
    send: tuple[int, ...]
    dur: tuple[int, ...]
    first: tuple[int, ...]  # 1 + rank * VPP + chunk on a (rank, chunk)'s first forward (its ``ready``), else 0
    last_backward: tuple[tuple[int, ...], ...]  # [rank][chunk] index of its last backward (n: none)
    last_step: tuple[int, ...]  # per rank the index of its last step
    #: ``(prev, dep, send, dur)`` of every step, in run order: the columns above as rows, which
    #: :func:`run_ends` walks (one tuple per step instead of a zip of five)
    steps: tuple[tuple[int, int, int, int], ...]
    #: the steps of one micro-batch group (one micro-batch without interleaving): ``2 * PP * VPP * G``
    period: int = 1
    #: ``[lo, hi)``: the longest run of steps each of which is the step ``period`` earlier moved on
    #: by one period (same send and duration, its previous step and its input ``period`` later;
    #: every one has a previous step): the steady state, which :func:`run_ends` may jump over
    repeating: tuple[int, int] = (0, 0)
    #: the longest dependency: ``max(k - prev[k], k - dep[k])`` over the steps
    lookback: int = 0
    #: the steps :func:`simulate` reads after the pass (each rank's last step, each chunk's last
    #: backward), ascending: a jump never skips one
    read_after: tuple[int, ...] = ()


def _graph_steps(pp: int, vpp: int, m: int, orders: list[list[tuple[bool, int, int]]]) -> list[tuple[int, ...]]:
    """The worklist over the ranks' orders, run on the dependencies alone: each rank runs its next
    steps while their inputs exist; one row ``(rank, chunk, micro-batch, backward, stage, dep)`` per
    step in run order, ``dep`` the run index of the input step or -1."""
    n_stages, last = pp * vpp, pp * vpp - 1
    f_idx = [-1] * (n_stages * m)
    b_idx = [-1] * (n_stages * m)
    ptr = [0] * pp
    rows: list[tuple[int, ...]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        before = remaining
        for r in range(pp):
            order, p = orders[r], ptr[r]
            while p < len(order):
                is_b, c, i = order[p]
                s = c * pp + r
                if is_b:
                    dep = b_idx[(s + 1) * m + i] if s < last else -2
                else:
                    dep = f_idx[(s - 1) * m + i] if s > 0 else -2
                if dep == -1:
                    break
                (b_idx if is_b else f_idx)[s * m + i] = len(rows)
                rows.append((r, c, i, int(is_b), s, max(dep, -1)))
                p += 1
                remaining -= 1
            ptr[r] = p
        if remaining == before:
            raise ScheduleError("the pipeline schedule deadlocked (a dependency that never completes)")
    return rows


def _in_start_order(rows: list[tuple[int, ...]], pp: int) -> list[tuple[int, ...]]:
    """The worklist's rows sorted by when each step starts if every step takes 1 s and sends are
    free (ties by rank), their ``dep`` renumbered. Every dependency then comes first (a step starts
    at least 1 s after its input's start), a rank keeps its order, and with equal costs the steady
    state repeats from one micro-batch group to the next, in this order too."""
    end, free = [0] * len(rows), [0] * pp
    start = []
    for k, (r, _c, _i, _b, _s, dep) in enumerate(rows):
        t = end[dep] if dep >= 0 and end[dep] > free[r] else free[r]
        start.append(t)
        end[k] = free[r] = t + 1
    order = sorted(range(len(rows)), key=[(t, row[0]) for t, row in zip(start, rows)].__getitem__)
    new = [0] * len(rows)
    for j, k in enumerate(order):
        new[k] = j
    return [(*rows[k][:5], new[rows[k][5]] if rows[k][5] >= 0 else -1) for k in order]


def _repeating(steps: Sequence[tuple[int, int, int, int]], period: int) -> tuple[int, int]:
    """:attr:`StepGraph.repeating`: the longest ``[lo, hi)`` of steps that repeat the step one
    ``period`` earlier (the zero slot ``n`` stays itself; a step without a previous one never counts)."""
    n, best, lo = len(steps), (0, 0), -1
    for k in range(period, n + 1):
        same = False
        if k < n:
            p, d, si, di = steps[k]
            p0, d0, si0, di0 = steps[k - period]
            same = (p < n and p0 < n and p == p0 + period and si == si0 and di == di0
                    and ((d0 < n and d == d0 + period) if d < n else d0 == n))
        if same and lo < 0:
            lo = k
        elif not same and lo >= 0:
            best, lo = max(best, (lo, k), key=lambda run: run[1] - run[0]), -1
    return best


@lru_cache(maxsize=32)
def step_graph(pp: int, vpp: int, num_microbatches: int, group: int | None = None) -> StepGraph:
    """The :class:`StepGraph` of Megatron's schedule for these sizes (cached: a live page and a
    search time many plans of one shape; only the durations change between them)."""
    m = num_microbatches
    g_size = _check(pp, vpp, m, group)
    n_stages, none = pp * vpp, 2 * pp * vpp
    rows = _in_start_order(_graph_steps(pp, vpp, m, rank_orders(pp, vpp, m, group)), pp)
    n = len(rows)
    prev, send, dur, first = [n] * n, [none] * n, [0] * n, [0] * n
    last_on, seen = [n] * pp, set()
    last_b = [[n] * vpp for _ in range(pp)]
    for k, (r, c, _i, is_b, s, _d) in enumerate(rows):
        prev[k], last_on[r] = last_on[r], k
        if is_b:
            last_b[r][c] = k
            dur[k] = n_stages + s
            if s < n_stages - 1:
                send[k] = n_stages + s
        else:
            dur[k] = s
            if s > 0:
                send[k] = s - 1
            if (r, c) not in seen:
                seen.add((r, c))
                first[k] = 1 + r * vpp + c
    ranks, chunks, mbs, bwds, _stages, deps = zip(*rows) if rows else ((),) * 6
    dep = tuple(n if d < 0 else d for d in deps)
    steps = tuple(zip(prev, dep, send, dur))
    period = 2 * n_stages * (g_size if vpp > 1 else 1)
    lookback = max((k - d for k, d in enumerate(prev) if d < n), default=0)
    lookback = max(lookback, max((k - d for k, d in enumerate(dep) if d < n), default=0))
    read_after = tuple(sorted({*last_on, *(k for row in last_b for k in row if k < n)}))
    return StepGraph(pp, vpp, m, ranks, chunks, mbs, tuple(map(bool, bwds)), tuple(prev), dep, tuple(send),
                     tuple(dur), tuple(first), tuple(tuple(row) for row in last_b), tuple(last_on),
                     steps, period, _repeating(steps, period), lookback,
                     read_after)


def run_graph(g: StepGraph, durations: Sequence[float], sends: Sequence[float],
              ready: Sequence[float] | None = None) -> tuple[list[float], list[float], list[float]]:
    """Start and end of every step of ``g`` (index ``n`` is the zero slot):
    ``start_k = max(end[prev_k], end[dep_k] + sends[send_k], ready[first_k])``,
    ``end_k = start_k + durations[dur_k]``; ``ready[0]`` = 0 for steps without a wait. The third
    list is ``end`` of the same steps with free sends (``sends`` all 0), computed in the same pass:
    one walk over the graph gives both schedules."""
    n = len(g.prev)
    start = [0.0] * (n + 1)
    end = [0.0] * (n + 1)
    free = [0.0] * (n + 1)
    wait = ready if ready is not None else ()
    for k, p, d, si, di, fi in zip(range(n), g.prev, g.dep, g.send, g.dur, g.first):
        a, a0 = end[p], free[p]
        b, b0 = end[d] + sends[si], free[d]
        if b > a:
            a = b
        if b0 > a0:
            a0 = b0
        if fi and wait:
            w = wait[fi]
            if w > a:
                a = w
            if w > a0:
                a0 = w
        t = durations[di]
        start[k] = a
        end[k] = a + t
        free[k] = a0 + t
    return start, end, free


def _advance(steps: Sequence[tuple[int, int, int, int]], lo: int, hi: int, end: list[float], free: list[float],
             durations: Sequence[float], sends: Sequence[float]) -> None:
    """Steps ``lo .. hi - 1`` of :func:`run_ends`' pass: ``end_k = max(end[prev], end[dep] +
    send) + duration``, and ``free`` the same with free sends."""
    for k in range(lo, hi):
        p, d, si, di = steps[k]
        a, a0 = end[p], free[p]
        b, b0 = end[d] + sends[si], free[d]
        if b > a:
            a = b
        if b0 > a0:
            a0 = b0
        t = durations[di]
        end[k] = a + t
        free[k] = a0 + t


def _shifted(times: list[float], lo: int, hi: int, period: int, lam: float) -> bool:
    """Whether ``times[k] == times[k - period] + lam`` for every ``k`` in ``lo .. hi - 1``."""
    return all(times[k] - times[k - period] == lam for k in range(lo, hi))


#: Cycles of the steady state tried, in periods: uniform stages with sends on PP ranks repeat every
#: PP micro-batches, not every one (two ranks: ends alternately 0.032 and 0.030 s apart).
CYCLES = tuple(range(1, 65))


def _steady(end: list[float], free: list[float], k: int, w: int, period: int, lo: int,
            cycles: Sequence[int]) -> tuple[float, float, int] | None:
    """``(lam, lam0, c)`` when the window ``[k - w, k)`` repeats the one ``c`` periods earlier
    shifted by ``lam`` (``lam0`` with free sends), for the smallest ``c`` of ``cycles`` whose
    earlier window lies in the repeating part from ``lo``; None when none does yet."""
    for c in cycles:
        p = c * period
        if k - w - p < lo:
            break
        lam, lam0 = end[k - 1] - end[k - 1 - p], free[k - 1] - free[k - 1 - p]
        if _shifted(end, k - w, k, p, lam) and _shifted(free, k - w, k, p, lam0):
            return lam, lam0, c
    return None


def run_ends(g: StepGraph, durations: Sequence[float], sends: Sequence[float], *,
             exact: bool = True, steady: list[tuple[float, float, int]] | None = None,
             cycles: Sequence[int] = (1,)) -> tuple[list[float], list[float]]:
    """:func:`run_graph` without a ``ready``, keeping only the ends (with the sends, and free): the
    live evaluation's pass (no timeline). Durations and sends on :func:`exact_grid`'s grid. In the
    steady state (:attr:`StepGraph.repeating`), once the last :attr:`StepGraph.lookback` steps
    repeat the ones a period earlier shifted by ``lam`` (and ``lam0`` with free sends), each
    later step of the repeating part would too (its inputs are among them and it repeats the
    step a period earlier): the pass sets the last window of the whole periods that remain
    (``end + j * lam``) and resumes there. Every step :func:`simulate` reads afterwards
    (:attr:`StepGraph.read_after`) lies after the jump, so the ends it reads are those of the
    whole pass, exactly (the grid makes every sum exact). ``exact=False`` (values off the grid:
    :func:`exact_grid` declined) runs every step. A step's start, when needed, is :func:`start_of`.
    The steady state may repeat every ``c`` periods of ``cycles`` (the live evaluation tries 1, which
    costs nothing when it fails; a long schedule :data:`CYCLES`), ``lam`` then being per ``c``.
    ``steady``: gets ``(lam, lam0, c)`` appended when the steady state was found (:func:`simulate`
    extends a long schedule by it)."""
    n, w = len(g.steps), g.lookback
    lo, hi = g.repeating
    end = [0.0] * (n + 1)
    free = end.copy()
    k, check = 0, lo + w   # the first window [check - w, check) inside the repeating part
    while exact and check + g.period <= hi:
        _advance(g.steps, k, check, end, free, durations, sends)
        k = check
        found = _steady(end, free, k, w, g.period, lo, cycles)
        if found is not None:
            lam, lam0, cycle = found
            if steady is not None:
                steady.append((lam, lam0, cycle))
            period = cycle * g.period
            stop = min(hi, next((q for q in g.read_after if q >= k), n))
            j = (stop - k) // period
            shift = j * period
            if j > 0:
                for i in range(k - w, k):
                    end[i + shift] = end[i] + j * lam
                    free[i + shift] = free[i] + j * lam0
                k += shift
            break
        check += g.period
    _advance(g.steps, k, n, end, free, durations, sends)
    return end, free


def start_of(g: StepGraph, k: int, end: list[float], sends: Sequence[float]) -> float:
    """When step ``k`` started in :func:`run_ends`' schedule: ``max(end[prev], end[dep] + send)``,
    computed as the pass computed it."""
    a = end[g.prev[k]]
    b = end[g.dep[k]] + sends[g.send[k]]
    return b if b > a else a


def exact_grid(m: int, durations: list[float], sends: list[float], ready: Sequence[float] = ()) -> bool:
    """Round ``durations``, ``sends`` and ``ready`` (in place) to the multiples of the power of two
    ``q`` for which ``m`` micro-batches of every duration and send after the latest ``ready``
    (a bound on every time of the step: each path through the schedule runs a step at most once)
    stay below ``2**52 * q``: then every sum of the simulation is exact (about 1e-16 of the step
    moves). ``(x + C) - C`` with ``C = 2**52 * q`` rounds ``0 <= x < C`` to that grid. Whether it
    did: values whose bound is not finite, or too large for ``C`` to be a float, are left as they
    are (and :func:`run_ends` does not jump on them)."""
    bound = max(ready, default=0.0) + m * (sum(durations) + sum(sends))
    if not (math.isfinite(bound) and 0 < bound < math.ldexp(1.0, 1023)):
        return bound == 0
    c = math.ldexp(1.0, math.frexp(bound)[1])
    for values in (durations, sends, ready):
        if isinstance(values, list):
            values[:] = [(x + c) - c for x in values]
    return True


def simulate(pp: int, vpp: int, num_microbatches: int, fwd: Sequence[float], bwd: Sequence[float], *,
             send_fwd: float | Sequence[float] = 0.0, send_bwd: float | Sequence[float] = 0.0,
             ready: Sequence[Sequence[float]] | None = None, group: int | None = None,
             record: bool = True, free_sends: bool = False) -> Schedule:
    """Simulate one iteration (module docstring) on :func:`step_graph` with :func:`run_graph`.

    ``fwd`` / ``bwd``: per-micro-batch time of each stage, vp-major (``PP * VPP`` values).
    ``send_fwd[s]``: activation transfer from stage ``s`` to ``s + 1``; ``send_bwd[s]``: gradient
    transfer from stage ``s + 1`` to ``s`` (scalars apply to every boundary). ``ready[r][c]``:
    earliest start of chunk ``c``'s first forward on rank ``r``. ``record=False`` keeps no
    timeline (the makespan, busy and end times only). ``free_sends``: also the makespan with free
    sends (:attr:`Schedule.free_makespan`, from the same pass of :func:`run_graph`)."""
    m = num_microbatches
    live = not record and ready is None
    one_stage = live and pp == vpp == 1   # no graph needed (:func:`_one_stage`)
    deferred = live and (one_stage or m > LONG_SCHEDULE)   # perhaps no graph of m (:func:`_long_schedule`)
    g = None if deferred else step_graph(pp, vpp, m, group)
    if deferred:
        _check(pp, vpp, m, group)
    n_stages = pp * vpp
    f_t, b_t = _per_stage(fwd, n_stages, "fwd"), _per_stage(bwd, n_stages, "bwd")
    sf, sb = _per_stage(send_fwd, n_stages, "send_fwd"), _per_stage(send_bwd, n_stages, "send_bwd")
    wait = None if ready is None else [0.0] + [float(ready[r][c]) for r in range(pp) for c in range(vpp)]
    durations, sends = f_t + b_t, sf + sb + [0.0]
    exact = exact_grid(m, durations, sends, wait or [])
    if one_stage and exact:
        return _one_stage(m, *durations)
    if exact and deferred and not one_stage:
        long = _long_schedule(pp, vpp, m, group, durations, sends, free_sends)
        if long is not None:
            return long
    if g is None:   # off the grid, or no steady state found: the whole pass, step by step
        g = step_graph(pp, vpp, m, group)
    n = len(g.prev)
    if record or wait is not None:
        start, end, end_free = run_graph(g, durations, sends, wait)
        last_b = tuple(tuple((start[k], end[k]) for k in row) for row in g.last_backward)
    else:  # the live evaluation: no timeline, so only the starts of the last backwards are needed
        end, end_free = run_ends(g, durations, sends, exact=exact)
        last_b = tuple(tuple((start_of(g, k, end, sends) if k < n else 0.0, end[k]) for k in row)
                       for row in g.last_backward)
    busy = _busy(pp, vpp, m, durations)
    compute_end = tuple(end[k] for k in g.last_step)
    cols = ((g.rank, g.chunk, g.microbatch, g.backward, tuple(start[:n]), tuple(end[:n])) if record
            else ((), (), (), (), (), ()))
    makespan = max(compute_end) if compute_end else 0.0
    free_makespan = max((end_free[k] for k in g.last_step), default=0.0) if free_sends else makespan
    return Schedule(pp, vpp, m, makespan, busy, compute_end, last_b, *cols, free_makespan=free_makespan)


def _busy(pp: int, vpp: int, m: int, durations: Sequence[float]) -> tuple[float, ...]:
    """Each rank's compute: ``m`` times its chunks' forward and backward (``durations``: every stage's
    forward, vp-major, then every backward; exact on the grid, as its stream adds them)."""
    n_stages = pp * vpp
    return tuple(m * sum(durations[c * pp + r] + durations[n_stages + c * pp + r] for c in range(vpp))
                 for r in range(pp))


#: Above this many micro-batches the live pass times the schedule through a shorter one of the same
#: shape (:func:`_long_schedule`).
LONG_SCHEDULE = 512


def _long_schedule(pp: int, vpp: int, m: int, group: int | None, durations: list[float], sends: list[float],
                   free_sends: bool) -> Schedule | None:
    """:func:`simulate`'s live pass of ``m`` > :data:`LONG_SCHEDULE` micro-batches without its
    ``2 m PP VPP``-step graph: ``j`` periods fewer (``m_s = m - j G`` micro-batches, ``G`` a period's:
    the group when interleaved, else 1, so the last group and the drain are the same) are simulated on
    the same grid, and once :func:`run_ends` finds their steady state (each later step ends ``lam``
    after the step a period earlier) every end the step time reads - in the drain - is the short
    schedule's plus ``j lam`` (``j lam0`` with free sends), which is what the whole pass computes
    (max-plus: ``max(x, y) + c = max(x + c, y + c)``, exact on the grid). None - run the whole pass - when
    ``m`` is not long or the short schedule found no steady state."""
    per = _check(pp, vpp, m, group) if vpp > 1 else 1
    keep = LONG_SCHEDULE // 2 + 4 * pp * per
    if m <= LONG_SCHEDULE or m - keep < per:
        return None
    found = _short_steady(pp, vpp, m - (m - keep) // per * per, group, durations, sends)  # its cycle c
    if found is None:
        return None
    j = (m - keep) // (found[2] * per) * found[2]   # periods dropped: whole cycles
    if j <= 0:
        return None
    found = _short_steady(pp, vpp, m - j * per, group, durations, sends)
    if found is None:
        return None
    g, end, free, (lam, lam0, cycle) = found[3], found[4], found[5], found[:3]
    if j % cycle:
        return None
    n, shift = len(g.prev), j // cycle * lam
    last_b = tuple(tuple((start_of(g, k, end, sends) + shift, end[k] + shift) if k < n else (0.0, 0.0) for k in row)
                   for row in g.last_backward)
    busy = _busy(pp, vpp, m, durations)
    compute_end = tuple(end[k] + shift for k in g.last_step)
    makespan = max(compute_end)
    free_makespan = max(free[k] for k in g.last_step) + j // cycle * lam0 if free_sends else makespan
    return Schedule(pp, vpp, m, makespan, busy, compute_end, last_b, (), (), (), (), (), (), free_makespan=free_makespan)


def _short_steady(pp: int, vpp: int, m: int, group: int | None, durations: list[float],
                  sends: list[float]) -> tuple[float, float, int, StepGraph, list[float], list[float]] | None:
    """:func:`run_ends` of ``m`` micro-batches: its steady state ``(lam, lam0, c)``, graph and ends,
    or None when it found none."""
    g = step_graph(pp, vpp, m, group)
    steady: list[tuple[float, float, int]] = []
    end, free = run_ends(g, durations, sends, exact=True, steady=steady, cycles=CYCLES)
    return (*steady[0], g, end, free) if steady else None


def _one_stage(m: int, f: float, b: float) -> Schedule:
    """:func:`simulate` of one stage without a timeline, its durations on :func:`exact_grid`'s grid:
    the rank runs each micro-batch's forward and backward in turn with nothing to wait for, so the
    step is ``m (f + b)`` - on the grid the very sum the pass adds up step by step (every partial sum
    and the product are below the grid's bound, so exact) - without building the ``2 m``-step graph
    (a fuzzed API request of 1.27 million micro-batches spent 8 s on it)."""
    end = m * (f + b)
    return Schedule(1, 1, m, end, (end,), (end,), (((end - b, end),),), (), (), (), (), (), (), free_makespan=end)


def closed_form_bubble(pp: int, vpp: int, num_microbatches: int) -> float:
    """``(PP - 1) / (VPP * m + PP - 1)``: the pipeline's fill and drain as a share of its time -
    the whole bubble with equal stage costs and free sends (FACTS.md section 7, 1F1B with
    interleaving), which :func:`simulate` reproduces (``tests/core/time/test_time_schedule.py``).
    Raises :class:`ScheduleError` unless all three are whole numbers >= 1."""
    for name, v in (("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{name} must be a whole number >= 1, got {v!r}")
    return (pp - 1) / (vpp * num_microbatches + pp - 1)
