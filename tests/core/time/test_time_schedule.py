"""The pipeline-schedule simulator: closed forms, hand-computed cases, Megatron's order, refusals."""

from __future__ import annotations

import math
import time
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.time.schedule import ScheduleError, closed_form_bubble, rank_order, schedule_table, simulate


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 24), f=st.integers(1, 5), b=st.integers(1, 9))
def test_1f1b_uniform_costs_reproduce_the_closed_form(pp: int, m: int, f: int, b: int) -> None:
    # integer durations: every sum is exact in floating point
    s = simulate(pp, 1, m, [f] * pp, [b] * pp)
    assert s.makespan == (m + pp - 1) * (f + b)
    assert s.bubble_fraction == pytest.approx(closed_form_bubble(pp, 1, m), abs=1e-12)
    assert s.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 6), v=st.integers(2, 4), groups=st.integers(1, 6), f=st.integers(1, 5), b=st.integers(1, 9))
def test_interleaved_uniform_costs_reproduce_the_closed_form(pp: int, v: int, groups: int, f: int, b: int) -> None:
    m = pp * groups  # Megatron needs a multiple of PP micro-batches (default group size PP)
    s = simulate(pp, v, m, [f] * (pp * v), [b] * (pp * v))
    # per chunk f and b: a rank's micro-batch costs v * (f + b); the bubble is (pp - 1) chunk steps
    assert s.makespan == (v * m + pp - 1) * (f + b)
    assert s.bubble_fraction == pytest.approx((pp - 1) / (v * m + pp - 1), abs=1e-12)


def test_two_ranks_three_microbatches_by_hand() -> None:
    """Stage 0: F 1, B 2; stage 1: F 2, B 3. Rank 0 runs F0 F1 B0 F2 B1 B2 (one warm-up forward),
    rank 1 runs F0 B0 F1 B1 F2 B2. By hand: r0 F0 0-1, F1 1-2; r1 F0 1-3, B0 3-6; r0 B0 6-8;
    r1 F1 6-8; r0 F2 8-9; r1 B1 8-11; r0 B1 11-13; r1 F2 11-13, B2 13-16; r0 B2 16-18."""
    s = simulate(2, 1, 3, [1, 2], [2, 3])
    assert s.makespan == 18
    assert s.busy == (9, 15)
    assert s.bubble_fraction == pytest.approx(1 - 24 / 36)
    got = {(r, "B" if bw else "F", i): (a, e) for r, bw, i, a, e in
           zip(s.rank, s.backward, s.microbatch, s.start, s.end)}
    assert got[(0, "B", 0)] == (6, 8)
    assert got[(1, "F", 2)] == (11, 13)
    assert got[(0, "B", 2)] == (16, 18)
    # fill and drain with equal stages (PP 2, m 3): 1 / 4 of the time; the rest of the 1/3 bubble is
    # rank 0 waiting on rank 1's slower stage
    assert s.fill_drain_fraction == pytest.approx(1 / 4)
    assert s.bubble_fraction > s.fill_drain_fraction


def test_closed_form_facts_section_7() -> None:
    """(PP - 1) / (VPP x m + PP - 1): 7 / 15 for PP 8 over 8 micro-batches, 7 / 23 interleaved by 2;
    a count below 1 or not whole is refused."""
    assert closed_form_bubble(8, 1, 8) == pytest.approx(7 / 15)
    assert closed_form_bubble(8, 2, 8) == pytest.approx(7 / 23)
    assert closed_form_bubble(1, 1, 4) == 0.0
    for bad in ((8, 0, 8), (8, 1, 0), (8, True, 8), (8.0, 1, 8)):
        with pytest.raises(ValueError):
            closed_form_bubble(*bad)  # type: ignore[arg-type]


def test_two_ranks_with_send_time_by_hand() -> None:
    """The same with 1 s for every send: r0 F0 0-1; r1 F0 2-4, B0 4-7; r0 B0 8-10 (gradient at
    7 + 1); r1 F1 7-9; r0 F2 10-11; r1 B1 9-12; r0 B1 13-15; r1 F2 12-14, B2 14-17; r0 B2 18-20."""
    s = simulate(2, 1, 3, [1, 2], [2, 3], send_fwd=1.0, send_bwd=1.0)
    assert s.makespan == 20


def test_free_sends_in_the_same_pass() -> None:
    """``free_sends`` gives, beside the timed schedule (20 s by hand above), the makespan of the
    same steps with free sends: 18 s, the hand schedule of the test without sends."""
    s = simulate(2, 1, 3, [1, 2], [2, 3], send_fwd=1.0, send_bwd=1.0, free_sends=True)
    assert (s.makespan, s.free_makespan) == (20, 18)
    assert s.end == simulate(2, 1, 3, [1, 2], [2, 3], send_fwd=1.0, send_bwd=1.0).end
    assert simulate(2, 1, 3, [1, 2], [2, 3], send_fwd=1.0, send_bwd=1.0).free_makespan == 20  # not asked for


def test_megatron_interleaved_order() -> None:
    # get_schedule_table for M=4, VPP=2, group 2 (PP): (mb, chunk) per virtual micro-batch
    assert schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    order = rank_order(2, 2, 4, 0)
    # rank 0 warm-up: (PP - 0 - 1) * 2 + (VPP - 1) * PP = 4 forwards, then forward / backward pairs
    assert order[:4] == [(False, 0, 0), (False, 0, 1), (False, 1, 0), (False, 1, 1)]
    assert order[4:6] == [(False, 0, 2), (True, 1, 0)]  # backward runs the last chunk first
    assert len(order) == 2 * 4 * 2
    assert rank_order(2, 2, 4, 1)[:2] == [(False, 0, 0), (False, 0, 1)]  # rank 1 warm-up: 2
    # plain 1F1B: PP - rank - 1 warm-up forwards
    assert rank_order(4, 1, 6, 0)[:4] == [(False, 0, 0), (False, 0, 1), (False, 0, 2), (False, 0, 3)]
    assert rank_order(4, 1, 6, 3)[:2] == [(False, 0, 0), (True, 0, 0)]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pp=st.integers(2, 5), v=st.integers(1, 3), groups=st.integers(1, 4))
def test_dependencies_and_rank_streams_hold_for_any_costs(data: st.DataObject, pp: int, v: int, groups: int) -> None:
    n = pp * v
    m = pp * groups
    fwd = data.draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
    bwd = data.draw(st.lists(st.floats(0.1, 9.0), min_size=n, max_size=n))
    send = data.draw(st.floats(0.0, 2.0))
    s = simulate(pp, v, m, fwd, bwd, send_fwd=send, send_bwd=send)
    end = {}
    for r, c, i, bw, a, e in zip(s.rank, s.chunk, s.microbatch, s.backward, s.start, s.end):
        end[(c * pp + r, i, bw)] = (a, e)
    for (stage, i, bw), (a, _) in end.items():
        if not bw and stage > 0:
            assert a >= end[(stage - 1, i, False)][1] + send - 1e-9
        if bw:
            assert a >= end[(stage, i, False)][1] - 1e-9
            if stage < n - 1:
                assert a >= end[(stage + 1, i, True)][1] + send - 1e-9
    for r in range(pp):  # one compute stream per rank: its steps never overlap
        steps = sorted((a, e) for rr, a, e in zip(s.rank, s.start, s.end) if rr == r)
        assert all(x[1] <= y[0] + 1e-9 for x, y in pairwise(steps))
    assert s.makespan >= max(s.busy)


def test_parameters_ready_delays_the_first_forward() -> None:
    s = simulate(2, 1, 2, [1, 1], [1, 1], ready=[[5.0], [0.0]])
    assert min(a for r, a in zip(s.rank, s.start) if r == 0) == 5.0


def test_megatron_refusals() -> None:
    with pytest.raises(ScheduleError, match="remainder"):
        simulate(4, 2, 6, [1] * 8, [1] * 8)  # 6 % 4 = 2 < PP
    with pytest.raises(ScheduleError, match="range"):
        simulate(4, 2, 2, [1] * 8, [1] * 8)  # fewer micro-batches than PP
    with pytest.raises(ScheduleError, match="one per stage"):
        simulate(2, 1, 2, [1], [1, 1])
    with pytest.raises(ScheduleError):
        simulate(0, 1, 2, [], [])


def test_large_schedule_is_fast() -> None:
    """512 micro-batches x PP 16 x VPP 4 = 65,536 steps (the bench figure is ~45 ms; this bound is
    loose so a busy machine does not fail it)."""
    t0 = time.perf_counter()
    s = simulate(16, 4, 512, [1.0] * 64, [2.0] * 64)
    assert time.perf_counter() - t0 < 1.0
    assert len(s.rank) == 2 * 512 * 64
    assert s.bubble_fraction == pytest.approx(closed_form_bubble(16, 4, 512))


def _reference_schedule(pp: int, v: int, m: int, fwd: list[float], bwd: list[float], send: float
                        ) -> dict[tuple[int, int, bool], tuple[float, float]]:
    """The schedule by plain relaxation, independent of the simulator's cached graph: sweep the
    ranks' Megatron orders (``rank_order``) again and again, running each rank's next step whenever
    its input exists, until every step has run."""
    orders = [rank_order(pp, v, m, r) for r in range(pp)]
    done: dict[tuple[int, int, bool], tuple[float, float]] = {}
    ptr, free, n = [0] * pp, [0.0] * pp, pp * v
    while any(ptr[r] < len(orders[r]) for r in range(pp)):
        for r in range(pp):
            while ptr[r] < len(orders[r]):
                is_b, c, i = orders[r][ptr[r]]
                s = c * pp + r
                need = (s + 1, i, True) if is_b and s < n - 1 else (s - 1, i, False) if not is_b and s > 0 else None
                if need is not None and need not in done:
                    break
                start = max(free[r], done[need][1] + send if need else 0.0)
                done[(s, i, is_b)] = (start, start + (bwd[s] if is_b else fwd[s]))
                free[r] = done[(s, i, is_b)][1]
                ptr[r] += 1
    return done


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pp=st.integers(1, 5), v=st.integers(1, 3), groups=st.integers(1, 4))
def test_the_cached_graph_runs_the_schedule_a_plain_relaxation_runs(data: st.DataObject, pp: int, v: int,
                                                                     groups: int) -> None:
    """The simulator builds each shape's dependency graph once and re-runs it with new durations;
    every step's start and end equal a plain re-implementation's, for any costs, twice in a row
    (the second run reuses the cached graph)."""
    v = 1 if pp == 1 else v
    n, m = pp * v, pp * groups
    for _ in range(2):
        fwd = data.draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
        bwd = data.draw(st.lists(st.floats(0.1, 9.0), min_size=n, max_size=n))
        send = data.draw(st.floats(0.0, 2.0))
        s = simulate(pp, v, m, fwd, bwd, send_fwd=send, send_bwd=send)
        want = _reference_schedule(pp, v, m, fwd, bwd, send)
        got = {(c * pp + r, i, bw): (a, e) for r, c, i, bw, a, e in
               zip(s.rank, s.chunk, s.microbatch, s.backward, s.start, s.end)}
        assert got.keys() == want.keys()
        for key, (a, e) in want.items():
            assert got[key] == pytest.approx((a, e), abs=1e-9), key
        assert s.makespan == pytest.approx(max(e for _, e in want.values()), abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), pp=st.integers(1, 6), v=st.integers(1, 3), groups=st.integers(1, 12))
def test_the_live_pass_jumps_the_steady_state_to_the_same_ends(data: st.DataObject, pp: int, v: int,
                                                              groups: int) -> None:
    """The live pass (no timeline) skips whole periods of the steady state once they repeat; what
    it reports is bit for bit what the full pass (the timeline's) computes, and within 1e-9 of the
    plain relaxation, for any costs, sends per boundary and micro-batch group size; with a group
    of other than PP micro-batches the relaxation is not at hand, so the full pass is the check."""
    v = 1 if pp == 1 else v
    n, m = pp * v, pp * groups
    group = data.draw(st.sampled_from([None, *range(pp + 1, m + 1)])) if v > 1 else None
    if group is not None and 0 < m % group < pp:
        group = None   # Megatron refuses that remainder (test_megatron_refusals)
    fwd = data.draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
    bwd = data.draw(st.lists(st.floats(0.1, 9.0), min_size=n, max_size=n))
    send = data.draw(st.floats(0.0, 2.0))
    sends = data.draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    live = simulate(pp, v, m, fwd, bwd, send_fwd=sends, send_bwd=sends[::-1], group=group, record=False,
                    free_sends=True)
    full = simulate(pp, v, m, fwd, bwd, send_fwd=sends, send_bwd=sends[::-1], group=group, record=True,
                    free_sends=True)
    assert (live.makespan, live.free_makespan, live.busy, live.compute_end, live.last_backward) == \
        (full.makespan, full.free_makespan, full.busy, full.compute_end, full.last_backward)
    live = simulate(pp, v, m, fwd, bwd, send_fwd=send, send_bwd=send, record=False, free_sends=True)
    want = _reference_schedule(pp, v, m, fwd, bwd, send)
    assert live.makespan == pytest.approx(max(e for _, e in want.values()), abs=1e-9)
    for r in range(pp):
        assert live.compute_end[r] == pytest.approx(max(e for (s, _, _), (_, e) in want.items() if s % pp == r),
                                                    abs=1e-9)


def test_the_live_pass_runs_a_fraction_of_a_long_steady_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """PP 4, 256 micro-batches, uneven stages: 2,048 steps, of which the live pass runs the
    warm-up until a window as long as the longest dependency repeats, and the drain (well under
    a tenth). The makespan by hand (stages F 1, 1, 2, 1; B 2, 2, 4, 2; free sends): micro-batch
    0's forward through the four stages (1 + 1 + 2 + 1) and its backward on the last (2) end at
    7, when the slowest rank 2 has run F0 and F1 (its one warm-up forward and the first steady
    one); from then it is never idle: B0 .. B255 and F2 .. F255 take 256 * 4 + 254 * 2 = 1,532;
    then B255 on ranks 1 and 0 (2 + 2): 7 + 1,532 + 4 = 1,543."""
    import app.core.time.schedule as schedule

    ran: list[int] = []
    real = schedule._advance

    def counting(steps: object, lo: int, hi: int, *rest: object) -> None:
        ran.append(hi - lo)
        real(steps, lo, hi, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(schedule, "_advance", counting)
    s = simulate(4, 1, 256, [1, 1, 2, 1], [2, 2, 4, 2], record=False)
    assert sum(ran) < 2048 / 10
    assert s.makespan == 7 + 256 * 4 + 254 * 2 + 2 + 2
    assert s.busy == (256 * 3, 256 * 3, 256 * 6, 256 * 3)


def test_times_are_rounded_to_a_grid_on_which_every_sum_is_exact() -> None:
    """(0.1 + 0.2) - 0.2 != 0.1 in floating point; on the grid (a power of two fine enough for the
    whole step) every sum the simulation makes is exact, so it can be undone and its order does not
    matter; each value moves by less than 1e-15 of the bound."""
    from app.core.time.schedule import exact_grid

    raw = [0.1, 0.2, 0.3, 0.7, 0.0]
    assert (raw[0] + raw[1]) - raw[1] != raw[0]
    durations, sends = raw[:3], raw[3:]
    exact_grid(10, durations, sends)
    values = durations + sends
    bound = 10 * sum(raw)
    assert all(abs(a - b) < 1e-15 * bound for a, b in zip(values, raw))
    assert all((a + b) - b == a for a in values for b in values)
    total = 0.0
    for x in values * 10:
        total += x
    assert total == sum(reversed(values * 10)) == 10 * sum(values)


@pytest.mark.parametrize("pp, m, fwd, bwd, send", [
    (1, 1, [1.7e308], [1.0], 0.0),            # a finite bound past 2**1023: no grid (was an OverflowError)
    (1, 9, [0.1], [0.2], [math.inf]),         # an unused send of infinity: no bound, so no jump (was rounded)
    (1, 3, [1.7e308], [5e-324], 0.0089),      # sums that overflow to infinity (was NaN)
    (3, 6, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0.0),
])
def test_off_the_grid_the_live_pass_runs_every_step(pp: int, m: int, fwd: list[float], bwd: list[float],
                                                    send: float | list[float]) -> None:
    """Where the durations cannot be put on an exact grid (an infinity, or a bound past the largest
    float) the live pass does not jump, so it reports what the full pass does, value for value."""
    live = simulate(pp, 1, m, fwd, bwd, send_fwd=send, send_bwd=send, record=False, free_sends=True)
    full = simulate(pp, 1, m, fwd, bwd, send_fwd=send, send_bwd=send, record=True, free_sends=True)
    assert repr((live.makespan, live.free_makespan, live.busy, live.compute_end, live.last_backward)) == \
        repr((full.makespan, full.free_makespan, full.busy, full.compute_end, full.last_backward))


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 400), f=st.floats(1e-6, 5.0), b=st.floats(1e-6, 5.0))
def test_one_stage_without_a_timeline_is_the_whole_pass_bit_for_bit(m: int, f: float, b: float) -> None:
    """PP 1 (one rank, nothing to wait for) is timed without the 2m-step graph; every figure the
    step time reads is the one the recorded pass gives, to the bit."""
    fast = simulate(1, 1, m, [f], [b], record=False, free_sends=True)
    full = simulate(1, 1, m, [f], [b], record=True, free_sends=True)
    for name in ("makespan", "busy", "compute_end", "last_backward", "free_makespan"):
        assert getattr(fast, name) == getattr(full, name), name
    assert fast.makespan == full.end[-1] and fast.bubble_fraction == full.bubble_fraction == 0.0


def test_a_million_micro_batches_on_one_stage_is_immediate() -> None:
    """A fuzzed API request (PP 1, 1,266,431 micro-batches) built a 2.5-million-step graph for 8 s."""
    t0 = time.perf_counter()
    s = simulate(1, 1, 1_266_431, [0.5], [1.0], record=False)
    assert s.makespan == 1_266_431 * 1.5 and time.perf_counter() - t0 < 1.0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), pp=st.integers(2, 6), v=st.integers(1, 3), groups=st.integers(3, 30),
       long=st.sampled_from([8, 16, 32]))
def test_a_long_schedule_through_a_shorter_one_is_the_whole_pass_bit_for_bit(
        data: st.DataObject, pp: int, v: int, groups: int, long: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``LONG_SCHEDULE`` micro-batches the live pass simulates whole steady-state cycles fewer and
    adds them back (:func:`_long_schedule`); with the bound lowered so that this runs on schedules the
    recorded pass can check, every figure it reports is that pass's, to the bit, for any costs and
    sends (uniform stages with sends cycle every PP micro-batches, not every one)."""
    import app.core.time.schedule as schedule

    monkeypatch.setattr(schedule, "LONG_SCHEDULE", long)
    n, m = pp * v, pp * groups + data.draw(st.integers(0, pp - 1)) * (v == 1)
    uniform = data.draw(st.booleans())
    fwd = [1.0] * n if uniform else data.draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n))
    bwd = [2.0] * n if uniform else data.draw(st.lists(st.floats(0.1, 9.0), min_size=n, max_size=n))
    sends = data.draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    kw = dict(send_fwd=sends, send_bwd=sends[::-1], free_sends=True)
    live, full = simulate(pp, v, m, fwd, bwd, record=False, **kw), simulate(pp, v, m, fwd, bwd, record=True, **kw)
    assert (live.makespan, live.free_makespan, live.busy, live.compute_end, live.last_backward) == \
        (full.makespan, full.free_makespan, full.busy, full.compute_end, full.last_backward)


def test_two_hundred_thousand_micro_batches_on_eight_ranks_in_a_blink() -> None:
    """PP 8 x 200,000 micro-batches (3.2 million steps) took 12.6 s step by step; with equal stages and
    free sends the makespan is the closed form (m + PP - 1)(f + b)."""
    t0 = time.perf_counter()
    s = simulate(8, 1, 200_000, [1.0] * 8, [2.0] * 8, record=False)
    assert s.makespan == (200_000 + 7) * 3.0 and time.perf_counter() - t0 < 1.0
