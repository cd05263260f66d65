"""Plans in a process of their own, for `trimtab up` and `trimtab server` (issue 20: report POST p99 under 50 ms
while the rebalancer plans 100 jobs, on 2 cores).

A planning *thread* was not enough: it shares the API's interpreter lock (GIL). While a plan computes, every
store call of a report gives the lock up and waits up to a switch interval to get it back, and the report's
threads then queue behind each other — on this machine p50 0.6 s and p99 4.9 s with 100 jobs planning, against
4.4 / 12 ms idle (BENCHMARKS.md). Here the planning thread keeps its queue and cadence (which jobs, when) but
hands each plan — the store reads, the controller, the decision writes — to one child process with its own
interpreter and its own connection to the store, lowered in CPU priority (``NICE``) so that on a busy machine
the kernel runs the API's threads first. The child is a :class:`~trimtab.control.service.Rebalancer` that was
never started (it plans on the caller's thread); what it learnt (counters, the job's note, when it is next worth
planning) comes back with each plan. The child only reads: its writes are made by the parent, on the planning
thread, at the API's priority (plan_writes.py: a low-priority process holding SQLite's write lock held every
report's write up on a busy machine).

Only a store another process can open qualifies (a file or a server, not ``:memory:``). A child that dies is
replaced at the next plan; the plan it was running counts as an error.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sqlalchemy import Engine

from trimtab.control.plan_errors import CHILD_DIED, PlanFailure, Stage, store_failure
from trimtab.control.plan_writes import ForwardedWrites, child_writes, serve_write
from trimtab.grading.rules import RuleSet
from trimtab.store.jobs import StoredJob

# How much lower the planning process runs in the kernel's eyes (nice(2) increment): the API's threads first.
NICE = 10
PARENT_CHECK_S = 0.2  # how often the child checks that its parent is alive
_COUNTERS = ("evaluations", "changes_queued", "advised", "kept", "rolled_back", "refused", "errors")
_child: Any = None  # in the child: its never-started Rebalancer


def can_plan_apart(engine: Engine) -> bool:
    """Whether another process can open ``engine``'s store (not an in-memory SQLite database)."""
    url = engine.url
    if url.get_backend_name() == "postgresql":
        return True
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and database not in ("", ":memory:") \
        and "mode=memory" not in database and url.query.get("mode") != "memory"


@dataclass
class ChildPlan:
    """One plan's result and what the child's Rebalancer learnt doing it."""
    plan: Any                       # the Plan, or None when it failed (counted in ``counts["errors"]``)
    failure: Any                    # the PlanFailure when it failed (stored by the child as the job's error event)
    evaluated: bool                 # a plan ran (False: the job was not worth planning after all)
    counts: dict[str, int]          # the child's counters' increments
    last_error: Optional[str]
    last_evaluation_ms: Optional[int]
    note: Optional[str]
    cadence: Any                    # the job's Cadence after the plan
    seen: Optional[tuple]
    cpu_s: float                    # the child's CPU time for the plan


def _exit_with(parent_pid: int) -> None:
    """Ends the child once its parent is gone (a daemon killed with SIGKILL would leave it behind, holding the
    daemon's stdout and stderr open)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _start_child(url: str, rules: RuleSet, log_level: int, nice: int, parent_pid: int, writes_conn,
                 setup: Optional[Callable[[Any], None]]) -> None:
    global _child
    from trimtab.control.service import Rebalancer
    from trimtab.store.engine import open_engine

    # A stop signals the whole process group (systemd's control-group kill, Ctrl-C, `timeout`): the parent stops
    # the child itself, after its own last plan (``close``), and the watch below ends it if the parent is gone.
    # Dying first, it broke the plan in flight and the daemon logged "listing jobs failed" at every stop.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent_pid,), name="trimtab-parent-watch", daemon=True).start()

    try:
        os.nice(nice)
    except OSError:  # not allowed here: plan at the same priority
        pass
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [planning process]: %(message)s")
    _child = Rebalancer(open_engine(url), rules)
    if not child_writes():  # its writes made by the parent, at the API's priority (plan_writes.py)
        _child.writes = ForwardedWrites(writes_conn)
    if setup is not None:
        setup(_child)
    # Start-up's objects out of the collector's sight, as daemon.settle_heap does for the API's process (which
    # this level may not import): a full collection that falls in a plan's write holds SQLite's lock its length.
    gc.collect()
    gc.freeze()


def _plan_in_child(job: StoredJob, check: bool) -> ChildPlan:
    from trimtab.store.jobs import get_job

    stats = _child.stats
    before = {k: getattr(stats, k) for k in _COUNTERS}
    cpu_s = time.thread_time()
    result, failure, evaluated = None, None, False
    if check:  # a queued job: still worth planning? (the store reads for that are the child's too)
        job = get_job(_child.engine, job.name) or job
    if not check or _child._worth_planning(job):
        (result, failure), evaluated = _child.plan_job(job), True
    counts = {k: getattr(stats, k) - before[k] for k in _COUNTERS}
    return ChildPlan(result, failure, evaluated, counts, stats.last_error if counts["errors"] else None,
                     stats.last_evaluation_ms,
                     stats.notes.get(job.name), _child._cadence.get(job.name) if evaluated else None,
                     _child._seen.get(job.name) if evaluated else None,
                     time.thread_time() - cpu_s)


def _pid() -> int:
    return os.getpid()


def _jobs() -> list[StoredJob]:
    from trimtab.store.jobs import list_jobs

    return list_jobs(_child.engine, limit=10_000, offset=0)


class PlanProcess:
    """The child process that runs a Rebalancer's plans (started at the first plan)."""

    def __init__(self, engine: Engine, rules: RuleSet, nice: int = NICE, writes: Any = None,
                 child_setup: Optional[Callable[[Any], None]] = None):
        """``writes``: what makes the child's writes here (the rebalancer's ``writes``; None: the child writes
        itself); ``child_setup``: called in the child with its Rebalancer once it started (tests pause plans)."""
        self._args = (engine.url.render_as_string(hide_password=False), rules,
                      logging.getLogger("trimtab").getEffectiveLevel(), nice, os.getpid())
        self._engine, self._writes, self._setup = engine, writes, child_setup
        self._pool: Optional[ProcessPoolExecutor] = None
        self._conn = None  # this end of the pipe the child's writes come in on
        self.cpu_s = 0.0  # the CPU time of the plans the child made (the planning thread rests after it)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawn, not fork: the API's threads hold locks a forked child would inherit
            context = multiprocessing.get_context("spawn")
            # a new pipe for each child: a child that died half-way through a request leaves nothing in this one
            self._conn, child_end = context.Pipe() if self._writes is not None else (None, None)
            self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_start_child,
                                             initargs=(*self._args, child_end, self._setup))
        return self._pool

    def pid(self) -> int:
        """The planning process's id (starts it)."""
        return self._call(_pid)

    def _call(self, fn, *args):
        try:
            future = self._executor().submit(fn, *args)
            if self._conn is not None:
                self._serve_writes_until(future)
            return future.result()
        except BrokenProcessPool:
            self._pool = None  # a new child at the next call
            raise

    def _serve_writes_until(self, future) -> None:
        """Make the child's writes as they come, until ``future`` is done: asleep in between (woken by the pipe or
        by the future's end through a pipe of its own, never polling: this thread shares the API's interpreter)."""
        wake_r, wake_w = os.pipe()
        woken = threading.Event()

        def wake(_future) -> None:
            os.write(wake_w, b"x")
            woken.set()

        future.add_done_callback(wake)
        while not future.done():
            if self._conn in multiprocessing.connection.wait([self._conn, wake_r]):
                serve_write(self._conn, self._writes, self._engine)
        # (the callback runs just after the future is done: its pipe is closed once it wrote, so that it never
        # writes to a descriptor number reused meanwhile)
        if woken.wait(5.0):
            os.close(wake_r)
            os.close(wake_w)

    def jobs(self) -> list[StoredJob]:
        """Every job, read by the child (the sweep's hundred jobs cost the API's interpreter nothing)."""
        return self._call(_jobs)

    def plan(self, rebalancer, job: StoredJob, check: bool = False):
        """Plan ``job`` in the child (``check``: only if the store says it is still worth planning) and record
        what it learnt on ``rebalancer``; the Plan (None if it failed or was not worth it). A child that died in
        the plan is that job's failure (stored here) before the error goes on to the planning thread."""
        try:
            out: ChildPlan = self._call(_plan_in_child, job, check)
        except BrokenProcessPool as exc:
            at = Stage(CHILD_DIED)
            rebalancer.after_plan(job.name, store_failure(rebalancer.engine, job, PlanFailure.of(exc, at),
                                                          rebalancer.rules.controller,
                                                          rebalancer.stats.failing.get(job.name),
                                                          rebalancer.writes))
            raise
        self.cpu_s += out.cpu_s
        stats = rebalancer.stats
        for k, n in out.counts.items():
            setattr(stats, k, getattr(stats, k) + n)
        if out.last_error:
            stats.last_error = out.last_error
        stats.last_evaluation_ms = out.last_evaluation_ms or stats.last_evaluation_ms
        if out.note is not None:
            stats.notes[job.name] = out.note
        if out.cadence is not None:
            rebalancer._cadence[job.name] = out.cadence
        if out.seen is not None:
            rebalancer._seen[job.name] = out.seen
        elif out.evaluated:  # failed: the sweep retries it once its backoff is over
            rebalancer._seen.pop(job.name, None)
        if out.evaluated:
            rebalancer.after_plan(job.name, out.failure)
        return out.plan

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
