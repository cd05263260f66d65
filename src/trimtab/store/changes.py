"""Knob changes in the store: what a job is asked to change, and each rank's answer.

A change's life: the rebalancer (:func:`queue_change_in`, in the transaction that files its decision in
:mod:`trimtab.store.decisions`) or an operator (:func:`queue_change`, ``POST /v1/jobs/{name}/changes``) queues it
within the job's declared bounds; a newer change supersedes one still pending, and a new registration or mode that
no longer allows it cancels it (:func:`cancel_disallowed`); the job's hook picks it up in a report's response
(:func:`pending_changes`) and each rank acknowledges the step it ran it at (:func:`ack_change`: the first ack
marks it applied and moves the job's knob), or its knob's owner refuses it with why (:func:`refuse_change`).
A job has at most one change in flight (a partial unique index says so too).

Its own module, apart from a job's registration and step reports (:mod:`trimtab.store.jobs`): the jobs' module
calls in here when a registration cancels changes, and nothing here needs the jobs' module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from sqlalchemy import Connection, Engine, bindparam, func, insert, select, update

from trimtab.contract.statuses import APPLIED, CANCELLED, PENDING, REFUSED, SUPERSEDED
from trimtab.store.inserts import insert_ignoring
from trimtab.store.models import jobs, knob_acks, knob_changes
from trimtab.store.transactions import write_transaction
from trimtab.store.wall_clock import now_ms


class KnobOutOfBounds(ValueError):
    """A change to a value outside the job's current [min, max]: the hook would refuse it, and it would hold the
    job's one in-flight slot, so the store never queues one."""


@dataclass(frozen=True)
class StoredAck:
    rank: int
    applied_at_step: int
    acked_ms: int


@dataclass(frozen=True)
class StoredChange:
    id: int
    job_id: int
    knob: str
    value: float
    previous_value: Optional[float]
    reason: str
    source: str  # manual | rebalancer
    status: str
    created_ms: int
    applied_step: Optional[int]
    applied_ms: Optional[int]
    acks: tuple[StoredAck, ...] = field(default=())
    refused_reason: Optional[str] = None  # status "refused": why the code that owns the knob could not apply it


def number(value: Optional[float]):
    """A knob value as the job declared it: integral values come back as int (batch sizes, depths)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_CHANGE_COLUMNS = tuple(knob_changes.c)
_PENDING = (select(*_CHANGE_COLUMNS).where(knob_changes.c.job_id == bindparam("job_id"),
                                           knob_changes.c.status == PENDING).order_by(knob_changes.c.id))


def _change(row, acks: tuple[StoredAck, ...] = ()) -> StoredChange:
    return StoredChange(row.id, row.job_id, row.knob, number(row.value), number(row.previous_value), row.reason,
                        row.source, row.status, row.created_ms, row.applied_step, row.applied_ms, acks,
                        row.refused_reason)


def queue_change(engine: Engine, job_id: int, knob: str, value: float, reason: str,
                 source: str = "manual") -> StoredChange:
    """Queue a change for the job's hook. A change still pending is superseded by this one (one in flight)."""
    with write_transaction(engine) as conn:
        return queue_change_in(conn, job_id, knob, value, reason, source)


def queue_change_in(conn: Connection, job_id: int, knob: str, value: float, reason: str,
                    source: str = "manual") -> StoredChange:
    """:func:`queue_change` inside the caller's transaction (the rebalancer files its decision in the same one)."""
    knobs = conn.execute(select(jobs.c.knobs).where(jobs.c.id == job_id)).scalar_one()
    if knob not in knobs or not knobs[knob]["min"] <= value <= knobs[knob]["max"]:
        raise KnobOutOfBounds(f"{knob}={value} is outside the job's declared bounds {knobs.get(knob)}")
    previous = knobs.get(knob, {}).get("value")
    conn.execute(update(knob_changes).where(knob_changes.c.job_id == job_id, knob_changes.c.status == PENDING)
                 .values(status=SUPERSEDED))
    row = conn.execute(insert(knob_changes).values(
        job_id=job_id, knob=knob, value=value, previous_value=previous, reason=reason, source=source,
        status=PENDING, created_ms=now_ms()).returning(*_CHANGE_COLUMNS)).one()
    return _change(row)


def pending_changes(engine: Engine, job_id: int) -> list[StoredChange]:
    with engine.connect() as conn:
        return [_change(r) for r in conn.execute(_PENDING, {"job_id": job_id})]


def cancel_disallowed(conn: Connection, job_id: int, knobs: Mapping[str, Mapping[str, float]], mode: str) -> None:
    """Cancel, in the caller's transaction, the job's pending changes that its (re)declared knobs or its mode no
    longer allow: mode ``off``, a knob no longer declared, or a value outside its new bounds."""
    c = knob_changes.c
    for change in conn.execute(select(c.id, c.knob, c.value).where(c.job_id == job_id, c.status == PENDING)).all():
        bounds = knobs.get(change.knob)
        if mode == "off" or bounds is None or not bounds["min"] <= change.value <= bounds["max"]:
            conn.execute(update(knob_changes).where(c.id == change.id).values(status=CANCELLED))


# An ack's statements (every rank acknowledges every change; the first ack of a change writes four rows), built
# once as the report path's are: acks arrive in bursts when many jobs apply their changes together, and a burst of
# acks built statement by statement was where the slow reports of the report-latency bench clustered (issue 20).
_CHANGE_OF_JOB = select(*_CHANGE_COLUMNS).where(knob_changes.c.id == bindparam("b_change"),
                                                knob_changes.c.job_id == bindparam("b_job"))
_ACKS_OF = (select(knob_acks.c.rank, knob_acks.c.applied_at_step, knob_acks.c.acked_ms)
            .where(knob_acks.c.change_id == bindparam("b_change")).order_by(knob_acks.c.rank))
_MARK_APPLIED = (update(knob_changes).where(knob_changes.c.id == bindparam("b_change"))
                 .values(status=APPLIED, applied_step=bindparam("b_step"), applied_ms=bindparam("b_ms")))
_JOB_KNOBS = select(jobs.c.knobs).where(jobs.c.id == bindparam("b_job"))
_SET_KNOBS = (update(jobs).where(jobs.c.id == bindparam("b_job"))
              .values(knobs=bindparam("b_knobs", type_=jobs.c.knobs.type), updated_ms=bindparam("b_ms")))


def ack_change(engine: Engine, job_id: int, change_id: int, rank: int, applied_at_step: int) -> Optional[StoredChange]:
    """Record that ``rank`` applied the change at ``applied_at_step``. The first ack marks the change applied and
    moves the job's knob to the new value; a repeated ack of the same rank keeps the first. None: no such change
    for this job."""
    now = now_ms()
    ids = {"b_change": change_id, "b_job": job_id}
    with write_transaction(engine) as conn:
        row = conn.execute(_CHANGE_OF_JOB, ids).first()
        if row is None:
            return None
        conn.execute(insert_ignoring(conn.dialect, knob_acks), {"change_id": change_id, "rank": rank,
                                                                "applied_at_step": applied_at_step, "acked_ms": now})
        if row.status != APPLIED:
            conn.execute(_MARK_APPLIED, {"b_change": change_id, "b_step": applied_at_step, "b_ms": now})
            knobs = conn.execute(_JOB_KNOBS, ids).scalar_one()
            if row.knob in knobs:
                knobs = {**knobs, row.knob: {**knobs[row.knob], "value": number(row.value)}}
                conn.execute(_SET_KNOBS, {"b_job": job_id, "b_knobs": knobs, "b_ms": now})
    return _one_change(engine, job_id, change_id)


def refuse_change(engine: Engine, job_id: int, change_id: int, rank: int, reason: str) -> Optional[StoredChange]:
    """Record that ``rank``'s knob owner could not apply the change: it ends "refused" with the reason, and the
    job's knob keeps its value. A change another rank already applied stays applied (that rank runs with it; its
    refusal is kept in the reason for the record only when nothing else is). None: no such change for this job."""
    c = knob_changes.c
    with write_transaction(engine) as conn:
        row = conn.execute(_CHANGE_OF_JOB, {"b_change": change_id, "b_job": job_id}).first()
        if row is None:
            return None
        if row.status in (PENDING, SUPERSEDED, CANCELLED):
            conn.execute(update(knob_changes).where(c.id == change_id)
                         .values(status=REFUSED, refused_reason=f"rank {rank}: {reason}"[:1024]))
    return _one_change(engine, job_id, change_id)


def _one_change(engine: Engine, job_id: int, change_id: int) -> StoredChange:
    """One change of the job with its per-rank acks (as :func:`list_changes` gives it)."""
    with engine.connect() as conn:
        row = conn.execute(_CHANGE_OF_JOB, {"b_change": change_id, "b_job": job_id}).one()
        acks = tuple(StoredAck(a.rank, a.applied_at_step, a.acked_ms)
                     for a in conn.execute(_ACKS_OF, {"b_change": change_id}))
    return _change(row, acks)


def list_changes(engine: Engine, job_id: int, limit: int, offset: int) -> list[StoredChange]:
    """Newest first, each with its per-rank acks."""
    c, a = knob_changes.c, knob_acks.c
    query = select(*_CHANGE_COLUMNS).where(c.job_id == job_id)
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(c.id.desc()).limit(limit).offset(offset)).all()
        acks: dict[int, list[StoredAck]] = {r.id: [] for r in rows}
        if rows:
            for ack in conn.execute(select(a.change_id, a.rank, a.applied_at_step, a.acked_ms)
                                    .where(a.change_id.in_(list(acks))).order_by(a.rank)):
                acks[ack.change_id].append(StoredAck(ack.rank, ack.applied_at_step, ack.acked_ms))
    return [_change(r, tuple(acks[r.id])) for r in rows]


def change_counts(engine: Engine) -> list[tuple[str, str, str, int]]:
    """(job, source, status, changes) over every knob change in the store: one GROUP BY."""
    c = knob_changes.c
    query = select(jobs.c.name, c.source, c.status, func.count()).join_from(knob_changes, jobs)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(query.group_by(jobs.c.name, c.source, c.status))]
