"""The planning process reads the store and plans; the daemon's own process writes what it decided (issue 39).

Why: the planning process runs lowered in CPU priority (``plan_process.NICE``) so that the API's threads run
first. When it wrote its decisions itself, each write held SQLite's one write lock — and on a machine whose cores
were busy the kernel left that low-priority holder waiting, lock and all, while every report's write queued behind
it: report POST p99 241 ms against 59 ms with the rebalancer idle, 100 jobs, two CPU burners (BENCHMARKS.md). A
priority inversion, which shorter transactions do not cure: any write made at low priority can be caught holding
the lock. So the child never writes: each write the rebalancer makes (:data:`WRITES`, the decision store's
functions) is sent over a pipe to the parent, which makes it on the planning thread — at the API's priority,
queued with the reports' writes on the store's writer turn — and sends back the result (or the error, raised in
the child as :class:`ParentWriteError`). The child's reads need no lock (SQLite's WAL: readers never block the
writer).

``TRIMTAB_PLAN_WRITES=child`` brings back the old behaviour (the child writes itself), for the report-latency
bench's before/after in one run; nothing else should set it.
"""

from __future__ import annotations

import os
from typing import Any, Callable

# The rebalancer's writes (Rebalancer._execute): the decision store's functions, each one short transaction, and
# the job's plan status (its latest note and gate, a plan's failure: store/plan_status.py), made by the parent too.
DECISION_WRITES = ("add_decision", "decide_change", "close_decision", "set_applied_step")
STATUS_WRITES = ("record_plan", "record_failure")
WRITES = DECISION_WRITES + STATUS_WRITES
LEGACY_ENV = "TRIMTAB_PLAN_WRITES"


class ParentWriteError(RuntimeError):
    """The parent could not make a write the planning process asked for; the message is the parent's error."""


class RebalancerWrites:
    """Every write the rebalancer makes, on one object: the decision store's (``decisions``: the module, or the
    lease's fenced wrapper where several servers share the store) and the plan status's (unfenced: what a plan
    said, or that it failed, is the job's news whichever server planned it)."""

    def __init__(self, decisions: Any) -> None:
        self._decisions = decisions

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in STATUS_WRITES:
            from trimtab.store import plan_status

            return getattr(plan_status, name)
        return getattr(self._decisions, name)


def child_writes() -> bool:
    """Whether the planning process writes its decisions itself (the old behaviour, kept for the bench)."""
    return os.environ.get(LEGACY_ENV, "").strip().lower() == "child"


class ForwardedWrites:
    """In the planning process: the decision store's write functions, made by the parent. Each call sends
    (name, args, kwargs) without the engine (the parent uses its own) and waits for the parent's answer."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in WRITES:
            raise AttributeError(name)

        def forwarded(_engine, *args: Any, **kwargs: Any) -> Any:
            self._conn.send((name, args, kwargs))
            ok, value = self._conn.recv()
            if not ok:
                raise ParentWriteError(value)
            return value

        return forwarded


def serve_write(conn, writes: Any, engine) -> None:
    """In the parent: make the one write waiting on ``conn`` with ``writes`` (the rebalancer's, fenced where it
    plans under a lease) on ``engine``, and answer it."""
    name, args, kwargs = conn.recv()
    try:
        if name not in WRITES:
            raise ParentWriteError(f"not a rebalancer write: {name!r}")
        answer = (True, getattr(writes, name)(engine, *args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - sent back, raised in the child's plan (counted there as its error)
        answer = (False, f"{type(exc).__name__}: {exc}"[:500])
    conn.send(answer)

