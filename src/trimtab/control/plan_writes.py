"""What a plan writes to the store, apart from how the plan was computed: the verdict that closes a decision (with
the change back of a rollback), the step a change took effect at, a change with its pending decision, advice.

Computing a plan only reads the store; writing it is a few short transactions. The two are kept apart so that the
daemon's planning process (plan_process.py), which runs at a lower CPU priority, never holds SQLite's one write
lock: a child at nice 10 that the kernel preempted while it held the lock made every report insert of the API
(nice 0) wait behind it — up to 0.3 s at load 3–4 on 2 cores (BENCHMARKS.md, issue 20). The child computes; the
API's process writes what it decided, here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from sqlalchemy import Engine

from trimtab.control.controller import Plan
from trimtab.store import decisions as decision_store
from trimtab.store.jobs import StoredJob

log = logging.getLogger("trimtab.control")


@dataclass
class Decided:
    """A plan computed and not yet written: what it decided, on which copy of the job, and what it learnt."""
    job: StoredJob                          # the job as the plan read it
    plan: Plan
    stored_applied_step: Optional[int]      # the measured decision's applied_step as stored (written once)
    cadence: Any                            # the service's _Cadence: when the job is next worth planning


def write_plan(engine: Engine, job: StoredJob, p: Plan, stored_applied_step: Optional[int] = None) -> list[str]:
    """Write what ``p`` decided for ``job``; the rebalancer's counters it adds one to (kept, changes_queued, …)."""
    counted: list[str] = []
    if p.close is not None:
        rollback = None
        if p.outcome == "rolled_back" and p.rollback_to is not None and p.rollback_knob is not None:
            rollback = (job.id, p.rollback_knob, p.rollback_to, f"rollback: {p.note}")
        fields: dict[str, Any] = {"throughput_after_samples_per_s": p.throughput_after}
        if p.applied_step is not None:
            fields["applied_step"] = p.applied_step
        decision_store.close_decision(engine, p.close, p.outcome or "kept", p.evidence, rollback=rollback, **fields)
        if p.outcome in ("rolled_back", "refused", "kept"):
            counted.append(p.outcome)
        log.info("rebalancer: job %s: %s", job.name, p.note)
    elif p.measuring is not None and p.applied_step is not None and p.applied_step != stored_applied_step:
        # (once: every plan while measuring would rewrite it, and SQLite has one writer for reports too)
        decision_store.set_applied_step(engine, p.measuring, p.applied_step)
    if p.change is not None:
        c = p.change
        decision_store.decide_change(engine, job.id, c.rule, p.evidence, c.knob, c.new_value, c.reason,
                                     throughput_before_samples_per_s=p.throughput_before, advice=p.advice)
        counted.append("changes_queued")
        log.info("rebalancer: job %s: %s", job.name, p.note)
    elif p.advised is not None:
        c = p.advised
        decision_store.add_decision(engine, job.id, c.rule, p.evidence, knob=c.knob, old_value=c.old_value,
                                    new_value=c.new_value, throughput_before_samples_per_s=p.throughput_before,
                                    outcome="advised", advice=f"{c.reason}. {p.advice or ''}".strip())
        counted.append("advised")
        log.info("rebalancer: job %s (advise): %s", job.name, p.note)
    elif p.advice_rule is not None:
        decision_store.add_decision(engine, job.id, p.advice_rule, p.evidence, outcome="advised", advice=p.advice,
                                    throughput_before_samples_per_s=p.throughput_before)
        counted.append("advised")
        log.info("rebalancer: job %s: %s", job.name, p.note)
    return counted
