"""The rebalancer's record: every decision with the rule that fired, its evidence, the change it made (if any)
and how it turned out. The API lists it; the rebalancer files it with :func:`add_decision` (advice) or
:func:`decide_change` (a change and its decision in one transaction, so a restart never finds one without the
other) and closes it with :func:`close_decision`. Each write takes ``fence``: called first in its transaction with
the connection, it raises to refuse the write (a server that lost the planner's lease, control/leadership.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from sqlalchemy import Connection, Engine, func, insert, select, update

from trimtab.contract.statuses import ADVISED, PENDING
from trimtab.store.changes import StoredChange, number, queue_change_in
from trimtab.store.models import decisions, jobs
from trimtab.store.transactions import write_transaction
from trimtab.store.wall_clock import now_ms

Fence = Optional[Callable[[Connection], None]]


def _fenced(conn: Connection, fence: Fence) -> Connection:
    if fence is not None:
        fence(conn)
    return conn


@dataclass(frozen=True)
class StoredDecision:
    id: int
    job: str
    ts_ms: int
    rule: str
    evidence: dict[str, Any]
    change_id: Optional[int]
    knob: Optional[str]
    old_value: Optional[float]
    new_value: Optional[float]
    applied_step: Optional[int]
    throughput_before_samples_per_s: Optional[float]
    throughput_after_samples_per_s: Optional[float]
    outcome: Optional[str]
    advice: Optional[str]


def add_decision(engine: Engine, job_id: int, rule: str, evidence: Mapping[str, Any], fence: Fence = None,
                 **fields: Any) -> int:
    """File a decision; ``fields`` are the optional columns (change_id, knob, old_value, …). Returns its id."""
    with write_transaction(engine) as conn:
        _fenced(conn, fence)
        return conn.execute(insert(decisions).values(job_id=job_id, ts_ms=fields.pop("ts_ms", None) or now_ms(),
                                                     rule=rule, evidence=dict(evidence), **fields)
                            .returning(decisions.c.id)).scalar_one()


def decide_change(engine: Engine, job_id: int, rule: str, evidence: Mapping[str, Any], knob: str, value: float,
                  reason: str, fence: Fence = None, **fields: Any) -> tuple[int, Optional[StoredChange]]:
    """Queue a rebalancer change and file its decision (outcome "pending") atomically: (decision id, change). A job
    no longer in mode ``auto`` when the change would be queued (switched while the plan ran on the job as it had
    read it) gets the decision as advice and no change: (decision id, None) — advise starts nothing new."""
    with write_transaction(engine) as conn:
        job = _fenced(conn, fence).execute(select(jobs.c.mode, jobs.c.knobs).where(jobs.c.id == job_id)).one()
        if job.mode != "auto":
            advice = fields.pop("advice", None)
            said = f"{reason} (not applied: the job's mode is {job.mode})" + (f". {advice}" if advice else "")
            return conn.execute(insert(decisions).values(
                job_id=job_id, ts_ms=fields.pop("ts_ms", None) or now_ms(), rule=rule, evidence=dict(evidence),
                knob=knob, old_value=(job.knobs.get(knob) or {}).get("value"), new_value=value, outcome=ADVISED,
                advice=said, **fields).returning(decisions.c.id)).scalar_one(), None
        change = queue_change_in(conn, job_id, knob, value, reason, source="rebalancer")
        decision_id = conn.execute(insert(decisions).values(
            job_id=job_id, ts_ms=fields.pop("ts_ms", None) or now_ms(), rule=rule, evidence=dict(evidence),
            change_id=change.id, knob=knob, old_value=change.previous_value, new_value=value, outcome=PENDING,
            **fields).returning(decisions.c.id)).scalar_one()
    return decision_id, change


def close_decision(engine: Engine, decision_id: int, outcome: str, evidence: Mapping[str, Any],
                   rollback: Optional[tuple[int, str, float, str]] = None, fence: Fence = None,
                   **fields: Any) -> Optional[StoredChange]:
    """Set a pending decision's outcome (kept, rolled_back, superseded, cancelled) and evidence; with ``rollback``
    = (job id, knob, old value, reason) the change back is queued in the same transaction. Only a decision still
    "pending" is closed (a second closer finds nothing to do): the change back is then not queued twice."""
    with write_transaction(engine) as conn:
        done = _fenced(conn, fence).execute(update(decisions).where(decisions.c.id == decision_id, decisions.c.outcome == PENDING)
                            .values(outcome=outcome, evidence=dict(evidence), **fields)).rowcount
        if done and rollback is not None:
            job_id, knob, value, reason = rollback
            return queue_change_in(conn, job_id, knob, value, reason, source="rebalancer")
    return None


def set_applied_step(engine: Engine, decision_id: int, step: int, fence: Fence = None) -> None:
    with write_transaction(engine) as conn:
        _fenced(conn, fence).execute(update(decisions).where(decisions.c.id == decision_id).values(applied_step=step))


def list_decisions(engine: Engine, job_id: Optional[int], limit: int, offset: int) -> list[StoredDecision]:
    """Newest first; all jobs, or one."""
    d = decisions.c
    query = select(d.id, jobs.c.name, *(d[c.name] for c in decisions.columns if c.name not in ("id", "job_id"))
                   ).join_from(decisions, jobs)
    if job_id is not None:
        query = query.where(d.job_id == job_id)
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(d.ts_ms.desc(), d.id.desc()).limit(limit).offset(offset)).all()
    return [StoredDecision(r.id, r.name, r.ts_ms, r.rule, r.evidence, r.change_id, r.knob, number(r.old_value),
                           number(r.new_value), r.applied_step, r.throughput_before_samples_per_s,
                           r.throughput_after_samples_per_s, r.outcome, r.advice) for r in rows]


def decision_counts(engine: Engine) -> list[tuple[str, str, Optional[str], int]]:
    """(job, rule, outcome, decisions) over every decision in the store: one GROUP BY."""
    d = decisions.c
    query = select(jobs.c.name, d.rule, d.outcome, func.count()).join_from(decisions, jobs)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query.group_by(jobs.c.name, d.rule, d.outcome))]
