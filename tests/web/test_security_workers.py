"""app.web.workers: the killable process pool (deadline, disconnect, per-client limit, memory
cap) and the cost estimators behind the work budget (issue 9, "unbounded work from one GET")."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from app.core.engines import role_rule
from app.core.model.config import load_preset
from app.core.model.roles import derive_roles
from app.web.workers import (
    ClientGone,
    TooBusy,
    TooMuchWork,
    WorkBudget,
    WorkerPool,
    WorkTimeout,
    estimate_nearest_work,
    estimate_optimiser_work,
    estimate_search_work,
    estimate_verify_work,
    run_bounded,
)

#: a live server, worker processes or latency under load: run on its own (the Makefile's second part)
pytestmark = pytest.mark.exclusive

# --------------------------------------------------------------------------- jobs (module level: picklable)


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


def spin_forever(pid_file: str) -> None:
    with open(pid_file, "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        pass


def allocate(n: int) -> int:
    return len(bytearray(n))


def _pid(path) -> int:
    for _ in range(200):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError("the job never started")


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(2, per_client=1, memory_limit=512 << 20)
    yield p
    p.shutdown()


def test_result_and_exception_come_back(pool):
    assert asyncio.run(run_bounded(add, 2, 3, client="a", deadline=30, pool=pool)) == 5
    with pytest.raises(ValueError, match="bad input"):
        asyncio.run(run_bounded(fail, "bad input", client="a", deadline=30, pool=pool))


def test_slow_job_is_killed_at_the_deadline(pool, tmp_path):
    pid_file = tmp_path / "pid"

    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(WorkTimeout, match="longer than 2 seconds"):
            await run_bounded(spin_forever, str(pid_file), client="a", deadline=2, pool=pool)
        return time.monotonic() - t0

    elapsed = asyncio.run(main())
    assert elapsed < 8
    assert _dead(_pid(pid_file)), "the worker process still runs after the deadline"
    assert asyncio.run(run_bounded(add, 1, 1, client="a", deadline=30, pool=pool)) == 2  # pool recovers


def test_disconnected_client_kills_its_job(pool, tmp_path):
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()

    async def gone() -> bool:
        return time.monotonic() - t0 > 1.0

    with pytest.raises(ClientGone):
        asyncio.run(run_bounded(spin_forever, str(pid_file), client="a", deadline=60, is_disconnected=gone,
                                pool=pool))
    assert time.monotonic() - t0 < 8
    assert _dead(_pid(pid_file))


def test_per_client_limit(pool, tmp_path):
    async def main() -> None:
        first = asyncio.ensure_future(run_bounded(spin_forever, str(tmp_path / "pid"), client="c1", deadline=3,
                                                  pool=pool))
        await asyncio.sleep(0.3)
        assert pool.active("c1") == 1
        with pytest.raises(TooBusy, match="already has 1 expensive request"):
            await run_bounded(add, 1, 2, client="c1", deadline=5, pool=pool)
        assert await run_bounded(add, 1, 2, client="c2", deadline=5, pool=pool) == 3  # another client is served
        with pytest.raises(WorkTimeout):
            await first
        assert pool.active("c1") == 0

    asyncio.run(main())


def test_memory_blowup_is_a_memory_error_in_the_worker(pool):
    with pytest.raises(MemoryError):
        asyncio.run(run_bounded(allocate, 1 << 30, client="m", deadline=30, pool=pool))
    assert asyncio.run(run_bounded(allocate, 1 << 20, client="m", deadline=30, pool=pool)) == 1 << 20


# --------------------------------------------------------------------------- estimators


def _brute_stage_transitions(s: int, w: int) -> int:
    """The optimiser's stage-DP loop structure, counted step by step: for stage j < S-1 and start
    x in [j, j+W), the next start y runs over (x, j+W]."""
    return sum(1 for j in range(s - 1) for x in range(j, j + w) for _ in range(x + 1, j + w + 1))


@pytest.mark.parametrize(("n", "s"), [(10, 3), (21, 8), (40, 7), (5, 5), (6, 1)])
def test_nearest_estimate_counts_the_dp_transitions(n, s):
    w = n - s + 1
    assert estimate_nearest_work(n, s) == n + _brute_stage_transitions(s, w) + s * w


def test_estimates_are_monotone():
    for n in (78, 200, 1000):
        for pp, vpp, k in ((4, 1, 1), (8, 1, 4), (8, 2, 4)):
            e = estimate_optimiser_work(n, pp, vpp, k)
            assert estimate_optimiser_work(n + 50, pp, vpp, k) >= e
            assert estimate_optimiser_work(n, pp, vpp, k + 3) >= e
    for n in (100, 400):
        assert all(estimate_nearest_work(n + 1, s) >= estimate_nearest_work(n, s) for s in range(1, 50))
    base = {"num_layers": 78, "num_heads": 64, "num_experts": 256}
    prev = 0
    for gpus in (1, 8, 64, 256, 4096, 1 << 20):
        e = estimate_search_work(gpus, 10, **base)
        assert e >= prev
        prev = e
    assert estimate_search_work(256, 100, **base) > estimate_search_work(256, 10, **base)
    assert estimate_search_work(256, 10, **{**base, "num_layers": 4096}) > estimate_search_work(256, 10, **base)


def test_issue_examples_are_refused_and_real_requests_accepted():
    budget = WorkBudget()
    glm = load_preset("glm-5.2")
    f = len(derive_roles(glm, role_rule("megatron")).full_layers)
    assert f == 21  # FACTS.md: 21 full layers
    # accepted: every PP x VPP the page offers on GLM-5.2, with the largest top
    for pp in range(1, 22):
        for vpp in (1, 2, 4):
            budget.check(estimate_optimiser_work(78, pp, vpp, 101, num_full=f), "plan")
    budget.check(estimate_nearest_work(78, 16, num_full=f), "nearest")
    budget.check(estimate_search_work(1 << 20, 100, num_layers=78, num_heads=64, num_experts=256, num_full=f),
                 "search")
    # refused: the issue's examples on a 4,096-layer upload where every layer computes indices
    with pytest.raises(TooMuchWork, match=r"plan-search would take about [\d,]+ work units .* the limit is 20,000,000"):
        budget.check(estimate_optimiser_work(4096, 256, 8, 4), "plan-search")
    with pytest.raises(TooMuchWork):
        budget.check(estimate_nearest_work(4096, 8), "Nearest valid")
    with pytest.raises(TooMuchWork):
        budget.check(estimate_search_work(1 << 20, 100, num_layers=4096, num_heads=64, num_experts=256), "search")


def test_budget_from_env(monkeypatch):
    monkeypatch.setenv("ISPLAN_WORK_BUDGET", "1000")
    with pytest.raises(TooMuchWork, match="the limit is 1,000; ask for fewer stages") as exc:
        WorkBudget.from_env().check(1001, "plan", field="pp", fix="ask for fewer stages")
    assert exc.value.field == "pp" and exc.value.limit == 1000


def test_the_largest_receipt_the_bounds_admit_fits_the_budget():
    """Receipt bounds (16 layouts, 4,096 layers, PP 256 x VPP 64) keep verification linear and
    inside the budget, so a receipt never needs a refusal beyond the bounds."""
    from app.core.plan import bounds

    worst = [(bounds.MAX_PP, bounds.MAX_VPP)] * bounds.MAX_RECEIPT_LAYOUTS
    assert estimate_verify_work(worst, bounds.MAX_LAYERS) == 16 * 4 * (4096 + 256 * 64)
    WorkBudget().check(estimate_verify_work(worst, bounds.MAX_LAYERS), "verify")


def test_a_real_plan_report_through_the_pool_matches_the_direct_call(pool):
    """The planner's own function, a ModelConfig and keyword arguments (functools.partial) cross
    the process boundary intact."""
    from functools import partial

    from app.core.optimise.plan_search import plan_report

    cfg = load_preset("glm-5.2")
    roles = derive_roles(cfg, role_rule("megatron"))
    job = partial(plan_report, cfg, roles, pp=8, vpp=1, top=3, near=(10, 10, 10, 10, 10, 10, 9, 9))
    remote = asyncio.run(run_bounded(job, client="p", deadline=60, pool=pool))
    assert remote == job()
    assert remote["near"]["split"] != [10, 10, 10, 10, 10, 10, 9, 9]  # seed 000: that split is invalid
