"""A rollback after the job narrowed its bounds (it registered again): clamped into the bounds it declares now, or,
when that leaves nothing to roll back, not queued at all, with the decision saying why (issue 14)."""

from __future__ import annotations

from dataclasses import replace

from trimtab.control.controller import Plan, plan
from trimtab.store.jobs import StoredJob
from tests.support.plans import RULES, change, decision, job, state, steps


def narrowed(sync_min: int, sync: int = 2) -> StoredJob:
    """sync_every went 1 → 2 (acked); then the job registered again with sync_every bounds [sync_min, 8]."""
    the_job = job()
    return replace(the_job, knobs={**the_job.knobs, "sync_every": {"value": sync, "min": sync_min, "max": 8}})


def follow_sync(the_job: StoredJob, old: int = 1, new: int = 2) -> Plan:
    slower = steps(0, 10) + steps(10, 1, step_time=1.0, gen=0.5) + steps(11, 8, step_time=60.0, gen=40.0)
    return plan(state(slower, the_job, changes=[change(knob="sync_every", value=new, previous=old)],
                      decisions=[decision(knob="sync_every", old=old, new=new, rule="communication_bound")]), RULES)


def test_a_rollback_below_the_new_lower_bound_is_not_queued_and_the_decision_says_why():
    p = follow_sync(narrowed(sync_min=2))
    assert (p.close, p.outcome, p.rollback_to) == (7, "kept", None)
    assert "outside the job's bounds [2, 8]" in p.evidence["rollback_blocked"]


def test_a_rollback_is_clamped_to_the_bounds_the_job_declares_now():
    p = follow_sync(narrowed(sync_min=2, sync=4), old=1, new=4)
    assert (p.outcome, p.rollback_knob, p.rollback_to) == ("rolled_back", "sync_every", 2)
