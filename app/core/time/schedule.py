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
micro-batches, group - on the dependencies alone and yields a :class:`StepGraph` (cached); each
simulation is then one pass over that graph with the stages' durations and sends
(:func:`run_graph`): O(steps) time, about 2 * m * VPP * PP steps. With equal costs on every stage
and no send time, its makespan is exactly ``(m + (PP - 1) / VPP) * (f + b)`` for per-rank
forward / backward time ``f`` / ``b`` per micro-batch, i.e. the bubble ``(PP - 1) / (VPP * m + PP - 1)``
of FACTS.md section 7 (property-tested in ``tests/core/time/test_time_schedule.py``).
"""

from __future__ import annotations

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
    order the worklist runs it (module docstring), and for step ``k`` the index of the rank's
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
    rank_durations: tuple[tuple[int, ...], ...]  # per rank the ``dur`` index of its steps, in order
    #: ``(prev, dep, send, dur)`` of every step, in run order: the columns above as rows, which
    #: :func:`run_graph` walks without a ``ready`` (one tuple per step instead of a zip of five)
    steps: tuple[tuple[int, int, int, int], ...]


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


@lru_cache(maxsize=32)
def step_graph(pp: int, vpp: int, num_microbatches: int, group: int | None = None) -> StepGraph:
    """The :class:`StepGraph` of Megatron's schedule for these sizes (cached: a live page and a
    search time many plans of one shape; only the durations change between them)."""
    m = num_microbatches
    _check(pp, vpp, m, group)
    n_stages, none = pp * vpp, 2 * pp * vpp
    rows = _graph_steps(pp, vpp, m, rank_orders(pp, vpp, m, group))
    n = len(rows)
    prev, send, dur, first = [n] * n, [none] * n, [0] * n, [0] * n
    last_on, seen = [n] * pp, set()
    last_b = [[n] * vpp for _ in range(pp)]
    per_rank: list[list[int]] = [[] for _ in range(pp)]
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
        per_rank[r].append(dur[k])
    ranks, chunks, mbs, bwds, _stages, deps = zip(*rows) if rows else ((),) * 6
    dep = tuple(n if d < 0 else d for d in deps)
    return StepGraph(pp, vpp, m, ranks, chunks, mbs, tuple(map(bool, bwds)), tuple(prev), dep, tuple(send),
                     tuple(dur), tuple(first), tuple(tuple(row) for row in last_b), tuple(last_on),
                     tuple(tuple(x) for x in per_rank), tuple(zip(prev, dep, send, dur)))


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


def run_ends(g: StepGraph, durations: Sequence[float], sends: Sequence[float]) -> tuple[list[float], list[float]]:
    """:func:`run_graph` without a ``ready``, keeping only the ends (with the sends, and free):
    the live evaluation's pass (no timeline), over :attr:`StepGraph.steps`. The same additions
    and comparisons in the same order, so the same floats; a step's start, when needed, is
    :func:`start_of`."""
    end = [0.0] * (len(g.steps) + 1)
    free = end.copy()
    for k, (p, d, si, di) in enumerate(g.steps):
        a, a0 = end[p], free[p]
        b, b0 = end[d] + sends[si], free[d]
        if b > a:
            a = b
        if b0 > a0:
            a0 = b0
        t = durations[di]
        end[k] = a + t
        free[k] = a0 + t
    return end, free


def start_of(g: StepGraph, k: int, end: list[float], sends: Sequence[float]) -> float:
    """When step ``k`` started in :func:`run_ends`' schedule: ``max(end[prev], end[dep] + send)``,
    computed as the pass computed it."""
    a = end[g.prev[k]]
    b = end[g.dep[k]] + sends[g.send[k]]
    return b if b > a else a


def _busy(steps: tuple[int, ...], durations: list[float]) -> float:
    """A rank's compute time: its steps' durations added in run order (as its stream runs them, so
    the makespan is never below it by rounding)."""
    t = 0.0
    for di in steps:
        t += durations[di]
    return t


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
    g = step_graph(pp, vpp, m, group)
    n_stages = pp * vpp
    f_t, b_t = _per_stage(fwd, n_stages, "fwd"), _per_stage(bwd, n_stages, "bwd")
    sf, sb = _per_stage(send_fwd, n_stages, "send_fwd"), _per_stage(send_bwd, n_stages, "send_bwd")
    wait = None if ready is None else [0.0] + [float(ready[r][c]) for r in range(pp) for c in range(vpp)]
    durations, sends = f_t + b_t, sf + sb + [0.0]
    n = len(g.prev)
    if record or wait is not None:
        start, end, end_free = run_graph(g, durations, sends, wait)
        last_b = tuple(tuple((start[k], end[k]) for k in row) for row in g.last_backward)
    else:  # the live evaluation: no timeline, so only the starts of the last backwards are needed
        end, end_free = run_ends(g, durations, sends)
        last_b = tuple(tuple((start_of(g, k, end, sends) if k < n else 0.0, end[k]) for k in row)
                       for row in g.last_backward)
    busy = tuple(_busy(idx, durations) for idx in g.rank_durations)
    compute_end = tuple(end[k] for k in g.last_step)
    cols = ((g.rank, g.chunk, g.microbatch, g.backward, tuple(start[:n]), tuple(end[:n])) if record
            else ((), (), (), (), (), ()))
    makespan = max(compute_end) if compute_end else 0.0
    free_makespan = max((end_free[k] for k in g.last_step), default=0.0) if free_sends else makespan
    return Schedule(pp, vpp, m, makespan, busy, compute_end, last_b, *cols, free_makespan=free_makespan)


def closed_form_bubble(pp: int, vpp: int, num_microbatches: int) -> float:
    """``(PP - 1) / (VPP * m + PP - 1)``: the pipeline's fill and drain as a share of its time -
    the whole bubble with equal stage costs and free sends (FACTS.md section 7, 1F1B with
    interleaving), which :func:`simulate` reproduces (``tests/core/time/test_time_schedule.py``).
    Raises :class:`ScheduleError` unless all three are whole numbers >= 1."""
    for name, v in (("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{name} must be a whole number >= 1, got {v!r}")
    return (pp - 1) / (vpp * num_microbatches + pp - 1)
