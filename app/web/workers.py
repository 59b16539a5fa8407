"""Expensive operations off the event loop: a bounded, killable process pool and a work budget.

Issue 9: one ``plan-search`` with ``pp=256&vpp=8`` ran over 4 minutes, Nearest valid on a
4,096-layer upload about 9 minutes of CPU, work went on after the client had gone, and 44-48
concurrent searches made ``/healthz`` unavailable for 30-110 s. Two defences, used together:

1. **Refuse before starting** (:class:`WorkBudget`): each expensive operation has a cost
   estimator below, an upper bound on its inner-loop steps counted from the algorithm (a *work
   unit*, the optimiser's own unit: one candidate cut examined, about a microsecond in CPython,
   :data:`app.core.optimise.optimiser.RANK_DP_MAX_WORK`). Beyond the budget the request is refused with
   :class:`TooMuchWork` (a ``ValueError``, 422) naming the limit and what to ask for instead.
2. **Bound what is started** (:class:`WorkerPool`, :func:`run_bounded`): accepted work runs in
   a small pool of worker *processes* with a deadline, a per-client concurrency limit
   (:class:`TooBusy`, 429 beyond it) and a bounded queue (429 too).

Why processes, not threads: the planner is pure Python and CPU-bound, so a thread holds the GIL
and starves the event loop (``/healthz``) exactly as the issue measured; and a thread cannot be
stopped - at the deadline, or when the client disconnects, the work would go on. A process is
killed (``SIGKILL``), the OS frees its memory at once, and ``RLIMIT_AS`` caps each worker's
address space so one job's blow-up is a ``MemoryError`` in the worker, not a dead server.
Workers come from a ``forkserver`` (never ``fork`` from a threaded server) that preloads the
domain modules, so replacing a killed worker costs a fork, not an interpreter start. Waiting for
a result happens in a dedicated thread per running job (``Connection.recv``), which ends by
itself when its worker is killed (``EOFError``).

Cancellation: :func:`run_bounded` takes ``is_disconnected`` (e.g. Starlette's
``request.is_disconnected``) and polls it while the job runs; a gone client kills the job and
raises :class:`ClientGone`. An ``asyncio`` cancellation of the awaiting task kills it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import resource
import shutil
import signal
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from app import settings as app_settings
from app.core.optimise.optimiser import RANK_DP_MAX_DEPTH, RANK_DP_MAX_WORK

log = logging.getLogger("isplan.workers")

#: Default work budget (units): ``ISPLAN_WORK_BUDGET`` overrides it. Measured on one core
#: (CPython 3.11): Nearest valid runs about 0.6 us per unit (800 layers, 80 stages: 2.1e7 units,
#: 13.5 s), so this bound is its ~12 s; the optimiser's estimate ignores its early exits and runs
#: far below it (1,024 layers all full, PP 8, k 4: 1.8e7 units, 0.5 s); the search on GLM-5.2 at
#: 2^20 GPUs, top 100: 9.6e6 units, 0.5 s.
DEFAULT_BUDGET = 20_000_000
#: Default deadline of one job in seconds (queue wait included): ``ISPLAN_WORK_DEADLINE``.
DEFAULT_DEADLINE = 20.0
#: Jobs one client may have running or queued at once: ``ISPLAN_WORK_PER_CLIENT``.
DEFAULT_PER_CLIENT = 2
#: Address-space limit of one worker process (bytes): ``ISPLAN_WORKER_MEMORY``.
DEFAULT_WORKER_MEMORY = 2 << 30
#: CPU niceness added to each worker process (batch work yields to the event loop).
WORKER_NICE = 10
#: Modules the forkserver imports once, so a new worker starts warm.
PRELOAD = ("app.core.optimise.plan_search", "app.core.optimise.search", "app.core.receipt", "app.core.launcher",
           "app.core.evaluate")
#: A worker whose resident memory is above this after a job is replaced (a burst of large jobs
#: leaves a Python heap that never shrinks; a fresh fork from the forkserver starts small).
RECYCLE_RSS_BYTES = 256 << 20


class TooMuchWork(ValueError):
    """The estimated work is over the budget (422); the message names the limit and the fix."""

    def __init__(self, message: str, field: str | None = None, *, estimate: int = 0, limit: int = 0):
        super().__init__(message)
        self.field = field
        self.estimate = estimate
        self.limit = limit


class TooBusy(Exception):
    """The client already has its share of jobs running, or the queue is full (429)."""

    status_code = 429


class WorkTimeout(Exception):
    """The job did not finish by its deadline and was killed (503)."""

    status_code = 503


class ClientGone(Exception):
    """The client disconnected; its job was killed."""


class WorkerLost(Exception):
    """The worker process running the job died before answering (the OOM killer, an operator's
    ``kill``): 503, the job is lost and may be retried; the pool replaces the worker."""

    status_code = 503


class WorkerOutOfMemory(TooMuchWork, MemoryError):
    """The job ran out of the worker's address space (``ISPLAN_WORKER_MEMORY``): 422 naming the
    limit, never a 500; the worker is replaced."""


# --------------------------------------------------------------------------- cost estimators


def _window(num_full: int, stages: int) -> int:
    """``W = F - S + 1``: the positions one cut can take (0 when no valid layout exists)."""
    return max(num_full - stages + 1, 0)


def _stage_table(stages: int, w: int) -> int:
    """Steps of one stage DP table: ``sum_j sum_x (candidates y)`` = ``(S - 1) * W * (W + 1) / 2``."""
    return max(stages - 1, 0) * w * (w + 1) // 2


def estimate_optimiser_work(num_layers: int, pp: int, vpp: int, k: int, *, num_full: int | None = None) -> int:
    """Upper bound on the work of :func:`app.core.optimise.optimiser.k_best_layouts` (``k`` layouts).

    Counted from the algorithm (``app/core/optimiser.py``, module docstring): with ``S = PP*VPP``
    stages, ``F`` full layers (default: all ``num_layers``, the worst case) and ``W = F - S + 1``,
    each stage-DP table (``G``, and one ``H`` per distinct bound) is at most
    ``(S - 1) * W * (W + 1) / 2`` steps without the early exits; Lawler's k-best partition adds
    about one ``H`` table per further layout and ``k * S`` completions of ``S * W`` steps. With
    ``VPP > 1`` the exact rank DP adds at most :data:`RANK_DP_MAX_WORK` (its own cap) when its
    recursion fits :data:`RANK_DP_MAX_DEPTH`. Plus ``num_layers`` for the per-layer costs."""
    f = num_layers if num_full is None else num_full
    s = pp * vpp
    w = _window(f, s)
    if w == 0:
        return num_layers  # S > F: no valid layout, answered without a search
    work = num_layers + _stage_table(s, w) * (1 + max(k, 1)) + max(k, 1) * s * s * w
    if vpp > 1 and pp * (vpp + 2) <= RANK_DP_MAX_DEPTH:
        work += RANK_DP_MAX_WORK
    return work


def estimate_nearest_work(num_layers: int, num_stages: int, *, num_full: int | None = None) -> int:
    """Upper bound on :func:`app.core.optimise.optimiser.nearest_valid`: its DP has no early exit, so it
    evaluates exactly ``(S - 1) * W * (W + 1) / 2`` transitions, then reconstructs the path in at
    most ``S * W`` more, plus ``num_layers`` to read the split."""
    f = num_layers if num_full is None else num_full
    w = _window(f, num_stages)
    return num_layers + _stage_table(num_stages, w) + num_stages * w


#: The search's enumeration (``app/core/search.py`` module docstring): PP and CP powers of two up
#: to 16, TP divisors of the head count up to 8, ETP in {1, TP}, VPP in {1, 2, 4}, and six
#: recompute x offload options, each shape evaluated at most once more as the leanest probe.
_SEARCH_PP = (1, 2, 4, 8, 16)
_SEARCH_CP = (1, 2, 4, 8, 16)
_SEARCH_VPP = (1, 2, 4)
_SEARCH_OPTIONS = 6


def _divisors(n: int, cap: int | None = None) -> list[int]:
    return [d for d in range(1, (min(n, cap) if cap else n) + 1) if n % d == 0] if n > 0 else [1]


def estimate_search_work(gpus: int, top: int, *, num_layers: int, num_heads: int, num_experts: int,
                         num_full: int | None = None) -> int:
    """Upper bound on :func:`app.core.optimise.search.search` for ``gpus`` GPUs.

    A shape (PP, TP, CP, EP, ETP, VPP) is evaluated only if its model-parallel groups fit the
    budget (``TP*CP*PP <= gpus`` and ``ETP*EP*PP <= gpus``; the search also needs divisibility,
    which this bound ignores so that it grows with ``gpus``). Each evaluated shape costs at most
    ``1 + 6`` memory evaluations of ``num_layers`` steps each; each (PP, VPP) one optimal layout
    (:func:`estimate_optimiser_work` with ``k = 1``); the ``top`` results are serialised with
    their per-layer flags (``num_layers`` each)."""
    tps = _divisors(num_heads, 8)
    eps = _divisors(num_experts) if num_experts else [1]
    f = num_layers if num_full is None else num_full
    pps = [p for p in _SEARCH_PP if p <= f]
    shapes = 0
    for pp in pps:
        for tp in tps:
            etps = {1, tp}
            cps = sum(1 for cp in _SEARCH_CP if tp * cp * pp <= gpus)
            experts = sum(1 for ep in eps for etp in etps if etp * ep * pp <= gpus)
            shapes += cps * experts * len(_SEARCH_VPP)
    layouts = sum(estimate_optimiser_work(num_layers, pp, vpp, 1, num_full=f) for pp in pps for vpp in _SEARCH_VPP)
    return shapes * (1 + _SEARCH_OPTIONS) * num_layers + layouts + max(top, 0) * num_layers


def estimate_verify_work(layouts: Sequence[tuple[int, int]], num_layers: int) -> int:
    """Upper bound on :func:`app.core.receipt.verify_receipt`: each recorded layout is
    materialised and compared stage by stage, linear in its layers and stages:
    ``sum (num_layers + stages)`` over ``(pp, vpp)`` pairs, times a small constant (4)."""
    return sum(4 * (num_layers + max(pp, 1) * max(vpp, 1)) for pp, vpp in layouts)


@dataclass(frozen=True)
class WorkBudget:
    """Refuse (``TooMuchWork``) an operation whose estimate is over ``limit`` work units."""

    limit: int = DEFAULT_BUDGET

    @classmethod
    def from_env(cls) -> WorkBudget:
        return cls(app_settings.current().work_budget)

    def check(self, estimate: int, what: str, *, field: str | None = None, fix: str = "") -> int:
        """Return ``estimate`` if within the budget, else raise :class:`TooMuchWork`."""
        if estimate <= self.limit:
            return estimate
        raise TooMuchWork(
            f"{what} would take about {estimate:,} work units (about a microsecond each); the limit is "
            f"{self.limit:,}" + (f"; {fix}" if fix else ""), field, estimate=estimate, limit=self.limit)


# --------------------------------------------------------------------------- the process pool


def _rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` (Linux ``/proc``), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _worker_main(conn: Connection, memory_limit: int) -> None:
    """A worker: run ``(fn, args)`` jobs from ``conn`` until it closes; answer ``(ok, value)``.

    It runs at a lower CPU priority (``nice`` +:data:`WORKER_NICE`) so that the server's event
    loop (``/healthz``, cheap pages) is scheduled first when the cores are busy."""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    if memory_limit > 0:
        with contextlib.suppress(ValueError, OSError):  # a lower hard limit is already in place
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:
            reply = (False, exc)
        try:
            conn.send(reply)
        except Exception as exc:
            conn.send((False, RuntimeError(f"the worker's answer cannot be sent back: {type(exc).__name__}")))


class _Worker:
    def __init__(self, ctx: Any, memory_limit: int):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, memory_limit), daemon=True)
        self.process.start()
        child.close()

    def kill(self, close: bool = True) -> None:
        """SIGKILL the process; ``close=False`` leaves our end open for a reader thread to finish."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        if close:
            self.conn.close()


def _lost_or_reply(recv: Callable[[], Any]) -> Callable[[], Any]:
    """``recv`` whose end-of-file (the worker died before answering) is a :class:`WorkerLost`
    reply instead of an ``EOFError`` that would surface as a bare 500 (issue 20, finding 13)."""

    def read() -> Any:
        try:
            return recv()
        except (EOFError, OSError):
            return (False, WorkerLost("the worker process running this request was lost (killed or out of "
                                      "memory) before it answered; the job is lost: retry the request"))

    return read


class WorkerPool:
    """``size`` worker processes; at most ``per_client`` jobs per client and ``max_waiting``
    queued jobs in all (:class:`TooBusy` beyond either)."""

    def __init__(self, size: int = 2, *, per_client: int = DEFAULT_PER_CLIENT, max_waiting: int = 32,
                 memory_limit: int = DEFAULT_WORKER_MEMORY, start_method: str = "forkserver",
                 preload: Sequence[str] = PRELOAD, recycle_rss: int = RECYCLE_RSS_BYTES):
        self.size = size
        self.per_client = per_client
        self.max_waiting = max_waiting
        self.memory_limit = memory_limit
        self.recycle_rss = recycle_rss
        self.start_method = start_method
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(list(preload))
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()  # idle and busy: everything shutdown() must stop
        self._slots: asyncio.Semaphore | None = None
        self._active: dict[str, int] = {}
        self._waiting = 0
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="isplan-worker-recv")
        self.killed = 0  # jobs stopped at a deadline, a disconnect or a cancellation
        self.recycled = 0  # workers replaced after a job because of their memory or a MemoryError
        self.closed = False

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        return self._slots

    def active(self, client: str) -> int:
        return self._active.get(client, 0)

    async def run(self, fn: Callable[..., Any], *args: Any, client: str, deadline: float,
                  is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> Any:
        """``fn(*args)`` in a worker process; its value, or its exception re-raised here."""
        if self._active.get(client, 0) >= self.per_client:
            raise TooBusy(f"this client already has {self.per_client} expensive requests running; "
                          "wait for them to finish")
        if self._waiting >= self.max_waiting:
            raise TooBusy(f"{self.max_waiting} expensive requests are already waiting; retry shortly")
        self._active[client] = self._active.get(client, 0) + 1
        self._waiting += 1
        queued = True
        try:
            async with asyncio.timeout(deadline):
                async with self._semaphore():
                    self._waiting -= 1
                    queued = False
                    return await self._call(fn, args, is_disconnected)
        except TimeoutError:
            raise WorkTimeout(f"the request took longer than {deadline:g} seconds and was stopped; "
                              "ask for less (fewer stages, a smaller top, a smaller model)") from None
        finally:
            if queued:
                self._waiting -= 1
            self._active[client] -= 1
            if not self._active[client]:
                del self._active[client]

    def _new_worker(self) -> _Worker:
        worker = _Worker(self._ctx, self.memory_limit)
        self._all.add(worker)
        return worker

    def _retire(self, worker: _Worker, close: bool = True) -> None:
        self._all.discard(worker)
        worker.kill(close=close)

    async def _worker(self) -> _Worker:
        """An idle worker, or a new one (started in a thread; killed if we are cancelled meanwhile)."""
        while self._idle:
            worker = self._idle.pop()
            if worker.process.is_alive():
                return worker
            self._retire(worker)
        starting = asyncio.ensure_future(asyncio.to_thread(self._new_worker))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(lambda f: None if f.cancelled() or f.exception() else self._retire(f.result()))
            raise

    async def start(self) -> None:
        """Start every worker now (e.g. at application startup) instead of on first use."""
        workers = await asyncio.gather(*(asyncio.to_thread(self._new_worker) for _ in range(self.size - len(self._idle))))
        self._idle.extend(workers)

    async def _call(self, fn: Callable[..., Any], args: tuple[Any, ...],
                    is_disconnected: Callable[[], Awaitable[bool]] | None) -> Any:
        worker = await self._worker()
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] | None = None
        try:
            worker.conn.send((fn, args))
            reply = loop.run_in_executor(self._threads, _lost_or_reply(worker.conn.recv))
            while True:
                done, _ = await asyncio.wait({reply}, timeout=0.25)
                if done:
                    ok, value = reply.result()
                    break
                if is_disconnected is not None and await is_disconnected():
                    raise ClientGone("the client disconnected; its request was stopped")
        except BaseException:
            self.killed += 1
            # the work really stops; the reader thread then ends with EOFError and closes our end
            self._retire(worker, close=reply is None)
            if reply is not None:  # retrieve its EOFError (no "never retrieved" log), then close
                reply.add_done_callback(lambda f: (f.cancelled() or f.exception(), worker.conn.close()))
            raise
        self._release(worker, ok, value)
        if ok:
            return value
        if isinstance(value, MemoryError):
            limit = f"{self.memory_limit / 2**30:g} GiB" if self.memory_limit else "the machine's memory"
            raise WorkerOutOfMemory(
                f"the request needed more memory than a planner worker may use ({limit}, ISPLAN_WORKER_MEMORY) "
                "and was stopped; ask for less (fewer stages, a smaller model or top)", None)
        raise value

    def _release(self, worker: _Worker, ok: bool, value: Any) -> None:
        """Back to the idle list, or replaced: dead, lost, out of memory, or grown past
        :attr:`recycle_rss` (its memory goes back to the OS at once)."""
        rss = _rss_bytes(worker.process.pid) if worker.process.pid is not None else None
        grown = rss is not None and self.recycle_rss > 0 and rss > self.recycle_rss
        failed = not ok and isinstance(value, (MemoryError, WorkerLost))
        if self.closed or not worker.process.is_alive() or grown or failed:
            self.recycled += grown or failed
            self._retire(worker)
        else:
            self._idle.append(worker)

    def pids(self) -> list[int]:
        """Process ids of the idle workers (for monitoring, e.g. their memory)."""
        return [w.process.pid for w in self._idle if w.process.pid is not None and w.process.is_alive()]

    def shutdown(self) -> None:
        """Stop every worker (idle or busy), the forkserver and its temporary directory: a clean
        stop leaves no process and no ``pymp-*`` directory behind (issue 20, finding 15)."""
        self.closed = True
        for worker in list(self._all):
            self._retire(worker)
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self.start_method == "forkserver":
            stop_forkserver()


def stop_forkserver() -> None:
    """Stop this process's multiprocessing forkserver and remove the ``pymp-*`` directory that
    holds its listening socket.

    The standard library removes that directory in an ``atexit`` finalizer, which never runs
    here: uvicorn re-raises the SIGTERM it caught after a graceful shutdown, so the process ends
    by the signal (70-96 stale directories were found in one ``/tmp``). ``ForkServer._stop`` is the
    standard library's own (test-suite) way to stop it; the directory's finalizer (registered by
    ``multiprocessing.util.get_temp_dir``) is then run now instead of at exit."""
    from multiprocessing import forkserver, process, util

    server: Any = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        # its "alive" pipe is held by every worker it forked, another pool's included, so closing
        # our end alone may never end it: stop it directly (a later pool starts a new one)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(Exception):
        server._stop()
    with contextlib.suppress(Exception):
        registry = util._finalizer_registry  # type: ignore[attr-defined]
        for finalizer in list(registry.values()):
            if getattr(finalizer, "_callback", None) is util._remove_temp_dir:  # type: ignore[attr-defined]
                finalizer()  # removes the directory and unregisters itself
    tempdir = process.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
    if tempdir:  # (get_temp_dir makes a new one if this process forks again)
        shutil.rmtree(tempdir, ignore_errors=True)


_POOL: WorkerPool | None = None


def default_pool() -> WorkerPool:
    """The process-wide pool, sized from ``ISPLAN_WORKERS`` (default: the CPU count, at most 4)."""
    global _POOL
    if _POOL is None or _POOL.closed:
        s = app_settings.current()
        _POOL = WorkerPool(s.workers, per_client=s.work_per_client, memory_limit=s.worker_memory)
    return _POOL


def shutdown_default_pool() -> None:
    """Stop the process-wide pool (the app's lifespan does at shutdown)."""
    global _POOL
    pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown()
    else:
        stop_forkserver()


async def run_bounded(fn: Callable[..., Any], *args: Any, client: str, deadline: float | None = None,
                      is_disconnected: Callable[[], Awaitable[bool]] | None = None,
                      pool: WorkerPool | None = None) -> Any:
    """Run ``fn(*args)`` (a picklable, module-level function; ``functools.partial`` for keyword
    arguments) in the worker pool. ``client`` names who asked (e.g. ``request.client.host``), for
    the per-client limit.

    Raises :class:`TooBusy` (429) beyond the per-client limit or a full queue,
    :class:`WorkTimeout` (503) when ``deadline`` seconds (default ``ISPLAN_WORK_DEADLINE``, 20)
    pass, :class:`ClientGone` when ``is_disconnected()`` turns true; in the last two cases the
    worker process is killed. :class:`WorkerLost` (503) when the worker died before answering,
    :class:`WorkerOutOfMemory` (422) when the job ran out of the worker's memory. ``fn``'s own
    exceptions are re-raised unchanged."""
    seconds = deadline if deadline is not None else app_settings.current().work_deadline
    return await (pool or default_pool()).run(fn, *args, client=client, deadline=seconds,
                                              is_disconnected=is_disconnected)



# --------------------------------------------------------------------------- the per-client gate


def has_action(query_string: bytes) -> bool:
    """Whether a query string holds a non-empty ``action`` once decoded (as Starlette decodes it)."""
    if b"ction" not in (unquote_to_bytes(query_string) if b"%" in query_string else query_string):
        return False  # no key can decode to "action": the common case (the page's split is "14%2C8..."), no parsing
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, max_num_fields=None)
    return any(key == "action" and value for key, value in pairs)


class ClientGate:
    """Pure ASGI middleware: at most ``per_client`` requests of one client in flight on the
    expensive routes (``paths``; a path listed with ``?action`` only when its query has an
    ``action``), counted from the moment the request arrives - before routing, validation,
    the model lookup or the cost estimate - so refusing a client that already has its share is
    a few microseconds (429 with ``Retry-After``), answered after ``refusal_delay`` seconds so
    that a client retrying at once cannot turn refusals into a flood. Without it, a client
    flooding the expensive routes made the server parse and validate every request before the
    pool's own limit (:class:`TooBusy`) refused it, and ``/healthz`` queued behind that work
    (bench/worst_load.py).

    The ``action`` of a query is found the way the route reads it, after percent-decoding
    (``%61ction=balance`` is an action too: issue 20)."""

    def __init__(self, app: Any, paths: Sequence[str], per_client: int | None = None, refusal_delay: float = 1.0):
        self.app = app
        self.refusal_delay = refusal_delay
        self.always = frozenset(p for p in paths if not p.endswith("?action"))
        self.with_action = frozenset(p[: -len("?action")] for p in paths if p.endswith("?action"))
        self.per_client = per_client or app_settings.current().work_per_client
        self.in_flight: dict[str, int] = {}

    def _gated(self, scope: dict[str, Any]) -> bool:
        path = scope.get("path", "")
        if path in self.always:
            return True
        return path in self.with_action and has_action(scope.get("query_string", b""))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self._gated(scope):
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown", 0))[0]
        if self.in_flight.get(client, 0) >= self.per_client:
            await asyncio.sleep(self.refusal_delay)  # a flooding client waits; the event loop does not
            body = (b'{"valid": false, "errors": [{"code": "too_busy", "message": "this client already has '
                    + str(self.per_client).encode() + b' expensive requests in flight; wait for them to finish", '
                    b'"field": null}]}')
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"), (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": body})
            return
        self.in_flight[client] = self.in_flight.get(client, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]
