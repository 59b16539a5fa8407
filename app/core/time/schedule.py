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

The simulation visits each step once (a worklist over ranks, each step's dependencies are
checked in O(1)): O(steps) time, about 2 * m * VPP * PP steps. With equal costs on every stage
and no send time, its makespan is exactly ``(m + (PP - 1) / VPP) * (f + b)`` for per-rank
forward / backward time ``f`` / ``b`` per micro-batch, i.e. the bubble ``(PP - 1) / (VPP * m + PP - 1)``
of FACTS.md section 7 (property-tested in ``tests/test_time_schedule.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the ranks' compute streams over the makespan (mean over ranks)."""
        if self.makespan <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.pp * self.makespan)

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

    def fwd(k: int) -> tuple[bool, int, int]:
        i, c = table[k]
        return (False, c, i)

    def bwd(k: int) -> tuple[bool, int, int]:
        i, c = table[k]
        return (True, vpp - 1 - c, i)

    order = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        order.append(fwd(warm + k))
        order.append(bwd(k))
    order.extend(bwd(k) for k in range(total - warm, total))
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
    """Every rank's :func:`rank_order` (computed once when one schedule is simulated twice)."""
    return [rank_order(pp, vpp, num_microbatches, r, group) for r in range(pp)]


def simulate(pp: int, vpp: int, num_microbatches: int, fwd: Sequence[float], bwd: Sequence[float], *,
             send_fwd: float | Sequence[float] = 0.0, send_bwd: float | Sequence[float] = 0.0,
             ready: Sequence[Sequence[float]] | None = None, group: int | None = None,
             orders: list[list[tuple[bool, int, int]]] | None = None, record: bool = True) -> Schedule:
    """Simulate one iteration (module docstring).

    ``fwd`` / ``bwd``: per-micro-batch time of each stage, vp-major (``PP * VPP`` values).
    ``send_fwd[s]``: activation transfer from stage ``s`` to ``s + 1``; ``send_bwd[s]``: gradient
    transfer from stage ``s + 1`` to ``s`` (scalars apply to every boundary). ``ready[r][c]``:
    earliest start of chunk ``c``'s first forward on rank ``r``. ``orders``: :func:`rank_orders`
    already computed for these PP / VPP / micro-batches; ``record=False`` keeps no timeline (the
    makespan, busy and end times only)."""
    m = num_microbatches
    _check(pp, vpp, m, group)
    n_stages = pp * vpp
    f_t = _per_stage(fwd, n_stages, "fwd")
    b_t = _per_stage(bwd, n_stages, "bwd")
    sf = _per_stage(send_fwd, n_stages, "send_fwd")
    sb = _per_stage(send_bwd, n_stages, "send_bwd")
    if orders is None:
        orders = rank_orders(pp, vpp, m, group)
    # flat step encoding: stage * m + micro-batch; -1.0 = not yet run
    f_end = [-1.0] * (n_stages * m)
    b_end = [-1.0] * (n_stages * m)
    free = [0.0] * pp
    busy = [0.0] * pp
    ptr = [0] * pp
    first_fwd_done = [[False] * vpp for _ in range(pp)]
    last_b: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * vpp for _ in range(pp)]
    col_rank: list[int] = []
    col_chunk: list[int] = []
    col_mb: list[int] = []
    col_bwd: list[bool] = []
    col_start: list[float] = []
    col_end: list[float] = []
    remaining = sum(len(o) for o in orders)
    last = n_stages - 1
    while remaining:
        progressed = False
        for r in range(pp):
            order = orders[r]
            p = ptr[r]
            t_free = free[r]
            while p < len(order):
                is_b, c, i = order[p]
                s = c * pp + r
                if is_b:
                    own = f_end[s * m + i]
                    if own < 0:
                        break
                    if s < last:
                        dep = b_end[(s + 1) * m + i]
                        if dep < 0:
                            break
                        dep += sb[s]
                        start = max(t_free, dep, own)
                    else:
                        start = max(t_free, own)
                    dur = b_t[s]
                    end = start + dur
                    b_end[s * m + i] = end
                    last_b[r][c] = (start, end)
                else:
                    if s > 0:
                        dep = f_end[(s - 1) * m + i]
                        if dep < 0:
                            break
                        start = max(t_free, dep + sf[s - 1])
                    else:
                        start = t_free
                    if ready is not None and not first_fwd_done[r][c]:
                        start = max(start, ready[r][c])
                        first_fwd_done[r][c] = True
                    dur = f_t[s]
                    end = start + dur
                    f_end[s * m + i] = end
                if record:
                    col_rank.append(r)
                    col_chunk.append(c)
                    col_mb.append(i)
                    col_bwd.append(is_b)
                    col_start.append(start)
                    col_end.append(end)
                busy[r] += dur
                t_free = end
                p += 1
                remaining -= 1
                progressed = True
            ptr[r] = p
            free[r] = t_free
        if not progressed:
            raise ScheduleError("the pipeline schedule deadlocked (a dependency that never completes)")
    makespan = max(free) if free else 0.0
    return Schedule(pp, vpp, m, makespan, tuple(busy), tuple(free),
                    tuple(tuple(x) for x in last_b), tuple(col_rank), tuple(col_chunk), tuple(col_mb),
                    tuple(col_bwd), tuple(col_start), tuple(col_end))


def closed_form_bubble(pp: int, vpp: int, num_microbatches: int) -> float:
    """``(PP - 1) / (VPP * m + PP - 1)``: the bubble with equal stage costs and free sends."""
    return (pp - 1) / (vpp * num_microbatches + pp - 1)
