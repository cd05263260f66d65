"""The rebalancer's record: every decision with the rule that fired, its evidence, the change it made (if any)
and how it turned out. The API lists it; the rebalancer (a later issue) writes it through :func:`add_decision`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from sqlalchemy import Engine, insert, select

from trimtab.store.engine import write_transaction
from trimtab.store.jobs import now_ms, number
from trimtab.store.models import decisions, jobs


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


def add_decision(engine: Engine, job_id: int, rule: str, evidence: Mapping[str, Any], **fields: Any) -> int:
    """File a decision; ``fields`` are the optional columns (change_id, knob, old_value, …). Returns its id."""
    with write_transaction(engine) as conn:
        return conn.execute(insert(decisions).values(job_id=job_id, ts_ms=fields.pop("ts_ms", None) or now_ms(),
                                                     rule=rule, evidence=dict(evidence), **fields)
                            .returning(decisions.c.id)).scalar_one()


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
