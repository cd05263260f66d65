"""The rebalancer's latest word on each job — its last plan's note and the gate that held it (why nothing was decided,
``control/gates.py``), and whether planning the job fails: since when, how many times in a row and in all, the last
error, when it is tried again — with the job's events (planning failed, planning recovered).

Written by whichever process plans (the daemon's planning process), read by the API (``GET /v1/jobs/{name}``,
``/healthz``, ``/metrics``) and ``trimtab check``: a job the planner fails on is never a WARNING in a log only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from sqlalchemy import Engine, insert, select, update

from trimtab.store.models import job_events, job_plan_status, jobs
from trimtab.store.transactions import write_transaction
from trimtab.store.wall_clock import now_ms

FAILED, RECOVERED = "planning_failed", "planning_recovered"


@dataclass(frozen=True)
class PlanStatus:
    job_id: int
    planned_ms: Optional[int]
    step: Optional[int]
    note: Optional[str]
    gate: Optional[dict[str, Any]]
    failing_since_ms: Optional[int]
    failures: int
    errors_total: int
    last_error: Optional[dict[str, Any]]
    retry_at_ms: Optional[int]

    @property
    def failing(self) -> bool:
        return self.failures > 0


@dataclass(frozen=True)
class JobEvent:
    id: int
    job_id: int
    ts_ms: int
    kind: str
    detail: dict[str, Any]


def describe(error: Mapping[str, Any]) -> str:
    """A stored plan error in one line: ``ZeroDivisionError: float division by zero (while planning, step 41;
    control/verdict.py:63 in of_steps: …)``."""
    where = [f"while {error['stage']}" if error.get("stage") else None,
             f"step {error['step']}" if error.get("step") is not None else None]
    head = ", ".join(w for w in where if w)
    tail = "; ".join(w for w in (head, error.get("where")) if w)
    return f"{error.get('type')}: {error.get('message')}" + (f" ({tail})" if tail else "")


def retry_delay_s(failures: int, min_s: float, max_s: float) -> float:
    """The wait before planning a job again after ``failures`` failures in a row: doubling from ``min_s``, at most
    ``max_s``."""
    return min(max_s, min_s * 2.0 ** max(0, min(failures - 1, 60)))


def _status(row) -> PlanStatus:
    return PlanStatus(row.job_id, row.planned_ms, row.step, row.note, row.gate, row.failing_since_ms, row.failures,
                      row.errors_total, row.last_error, row.retry_at_ms)


def record_plan(engine: Engine, job_id: int, step: Optional[int], note: str, gate: Optional[Mapping[str, Any]],
                ts_ms: Optional[int] = None) -> bool:
    """A plan of the job ran to its end: its note and gate are the job's latest; a run of failures ends (the event
    "planning recovered"). True when it ended one."""
    ts = ts_ms if ts_ms is not None else now_ms()
    values = dict(planned_ms=ts, step=step, note=note[:4000], gate=dict(gate) if gate else None,
                  failing_since_ms=None, failures=0, retry_at_ms=None)
    with write_transaction(engine) as conn:
        row = conn.execute(select(job_plan_status).where(job_plan_status.c.job_id == job_id)).first()
        if row is None:
            conn.execute(insert(job_plan_status).values(job_id=job_id, **values))
            return False
        conn.execute(update(job_plan_status).where(job_plan_status.c.job_id == job_id).values(**values))
        if row.failures > 0:
            conn.execute(insert(job_events).values(job_id=job_id, ts_ms=ts, kind=RECOVERED, detail={
                "after_failures": row.failures, "failing_since_ms": row.failing_since_ms,
                "last_error": row.last_error, "step": step}))
            return True
    return False


def record_failure(engine: Engine, job_id: int, error: Mapping[str, Any], min_s: float, max_s: float,
                   ts_ms: Optional[int] = None) -> tuple[int, float]:
    """A plan of the job raised (``error``: type, message, stage, step, where): counted, kept as its last error, and
    — when it starts a run of failures or differs from the last one — an event "planning failed". The job is tried
    again after :func:`retry_delay_s`. (failures in a row, the delay in seconds)."""
    ts = ts_ms if ts_ms is not None else now_ms()
    error = {**error, "at_ms": ts}
    with write_transaction(engine) as conn:
        row = conn.execute(select(job_plan_status).where(job_plan_status.c.job_id == job_id)).first()
        failures = (row.failures if row is not None else 0) + 1
        delay_s = retry_delay_s(failures, min_s, max_s)
        values = dict(failing_since_ms=row.failing_since_ms if row is not None and row.failures > 0 else ts,
                      failures=failures, errors_total=(row.errors_total if row is not None else 0) + 1,
                      last_error=error, retry_at_ms=ts + int(delay_s * 1000))
        if row is None:
            conn.execute(insert(job_plan_status).values(job_id=job_id, **values))
        else:
            conn.execute(update(job_plan_status).where(job_plan_status.c.job_id == job_id).values(**values))
        last = (row.last_error or {}) if row is not None and row.failures > 0 else {}
        if any(last.get(k) != error.get(k) for k in ("type", "message", "stage")):
            conn.execute(insert(job_events).values(job_id=job_id, ts_ms=ts, kind=FAILED,
                                                   detail={**error, "failures": failures, "retry_in_s": delay_s}))
    return failures, delay_s


def plan_statuses(engine: Engine, job_ids: Iterable[int]) -> dict[int, PlanStatus]:
    """Job id → its status (jobs never planned are absent); one query."""
    ids = list(job_ids)
    if not ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(job_plan_status).where(job_plan_status.c.job_id.in_(ids))).all()
    return {r.job_id: _status(r) for r in rows}


def failing_jobs(engine: Engine) -> list[tuple[str, str, PlanStatus]]:
    """(job name, mode, status) of every job whose planning fails now, by name."""
    query = (select(jobs.c.name, jobs.c.mode, job_plan_status).join_from(job_plan_status, jobs)
             .where(job_plan_status.c.failures > 0).order_by(jobs.c.name))
    with engine.connect() as conn:
        return [(r.name, r.mode, _status(r)) for r in conn.execute(query).all()]


def error_totals(engine: Engine) -> list[tuple[str, int]]:
    """(job name, failed plans ever) of every job the planner ever failed on: the /metrics counter."""
    query = (select(jobs.c.name, job_plan_status.c.errors_total).join_from(job_plan_status, jobs)
             .where(job_plan_status.c.errors_total > 0).order_by(jobs.c.name))
    with engine.connect() as conn:
        return [(r.name, int(r.errors_total)) for r in conn.execute(query).all()]


def events(engine: Engine, job_id: int, limit: int = 20) -> list[JobEvent]:
    """The job's events, newest first."""
    e = job_events.c
    query = select(job_events).where(e.job_id == job_id).order_by(e.ts_ms.desc(), e.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [JobEvent(r.id, r.job_id, r.ts_ms, r.kind, r.detail) for r in conn.execute(query).all()]
