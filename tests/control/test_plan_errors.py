"""No job is left unplanned in silence (issue 38): a plan that raises is an error event on the job in the store (the
exception, the stage of the plan, the step, where), the job is planned again after a backoff that doubles up to
``plan_retry_max_s`` (one log line per change of it, not four a second), other jobs are planned as before, and the
first plan that succeeds again records "planning recovered". And the failure that started it, on a real job's
step rows: an OOM step (samples=0) no longer breaks the plan."""

from __future__ import annotations

import logging
import time

import pytest

from tests.support.jobs_in_a_store import KNOBS, RANKS, changes, decisions, register, report
from trimtab.control import service as service_mod
from trimtab.control.service import Rebalancer
from trimtab.grading.rules import default_rules
from trimtab.store import jobs as job_store
from trimtab.store import plan_status

FAST = default_rules().with_overrides({"controller": {"plan_retry_min_s": 0.2, "plan_retry_max_s": 0.4}})


def raising_for(name: str, real=service_mod.plan):
    def plan(state, rules, placement=None):
        if state.job.name == name:
            return 1.0 / 0.0
        return real(state, rules, placement=placement)
    return plan


def status(engine, job):
    return plan_status.plan_statuses(engine, [job.id]).get(job.id)


def test_a_failing_plan_is_an_event_on_the_job_retried_with_backoff_and_cleared_when_it_recovers(
        sqlite_engine, monkeypatch, caplog):
    job = register(sqlite_engine)
    report(sqlite_engine, job, 0, 3, step_time=45.0, gen=44.0)
    monkeypatch.setattr(service_mod, "plan", raising_for("grpo"))
    rb = Rebalancer(sqlite_engine, FAST)
    caplog.set_level(logging.WARNING, logger="trimtab.control")

    assert rb.evaluate(job) is None
    s = status(sqlite_engine, job)
    assert (s.failures, s.errors_total, s.failing) == (1, 1, True)
    err = s.last_error
    assert (err["type"], err["message"], err["stage"], err["step"]) == \
        ("ZeroDivisionError", "float division by zero", "planning", 2)
    assert err["where"].startswith("control/service.py:") and "plan(state, rules" in err["where"]
    assert s.retry_at_ms - err["at_ms"] == 200
    [event] = plan_status.events(sqlite_engine, job.id)
    assert event.kind == "planning_failed" and event.detail["type"] == "ZeroDivisionError"
    assert rb.health()["failing"]["grpo"]["failures"] == 1

    # reports inside the backoff plan nothing (they queued the job four times a second)
    for step in (2, 2, 2):
        rb.after_report(job, step)
    assert status(sqlite_engine, job).failures == 1 and rb.health()["errors"] == 1

    # each retry after its backoff: 0.2 s, then 0.4 s (the cap) twice; the same error is one event
    for failures in (2, 3):
        time.sleep(0.45)
        rb.after_report(job, 2)
        assert status(sqlite_engine, job).failures == failures
    s = status(sqlite_engine, job)
    assert s.errors_total == 3 and s.retry_at_ms - s.last_error["at_ms"] == 400
    assert [e.kind for e in plan_status.events(sqlite_engine, job.id)] == ["planning_failed"]
    lines = [r.getMessage() for r in caplog.records if "planning failed" in r.getMessage()]
    assert len(lines) == 2, lines  # 0.2 s, then 0.4 s; the third failure changed nothing worth a line
    assert "planned again in 0.4 s" in lines[-1] and "ZeroDivisionError: float division by zero" in lines[-1]

    monkeypatch.undo()
    time.sleep(0.45)
    rb.after_report(job, 2)
    s = status(sqlite_engine, job)
    assert (s.failures, s.failing_since_ms, s.retry_at_ms, s.errors_total) == (0, None, None, 3)
    assert s.note.startswith("generation_bound") and changes(sqlite_engine, job)
    recovered = plan_status.events(sqlite_engine, job.id)[0]
    assert recovered.kind == "planning_recovered" and recovered.detail["after_failures"] == 3
    assert "grpo" not in rb.health()["failing"]
    assert any("planning recovered after 3 failures" in r.getMessage() for r in caplog.records)


def test_other_jobs_are_planned_while_one_fails(sqlite_engine, monkeypatch):
    broken = register(sqlite_engine)
    fine, _ = job_store.register_job(sqlite_engine, "other", RANKS, {}, ["node-a"], KNOBS, "auto", None, True)
    for j in (broken, fine):
        report(sqlite_engine, j, 0, 3, step_time=45.0, gen=44.0)
    monkeypatch.setattr(service_mod, "plan", raising_for("grpo"))
    rb = Rebalancer(sqlite_engine, FAST)
    rb.run_once()
    assert changes(sqlite_engine, fine) and not changes(sqlite_engine, broken)
    assert status(sqlite_engine, broken).failing and not status(sqlite_engine, fine).failing
    assert list(rb.health()["failing"]) == ["grpo"]


def test_an_oom_step_in_a_real_jobs_rows_is_planned_not_a_zero_division(sqlite_engine):
    # Issue 38's neighbour: 1 s steps, the hook's report of the step an OOM lost says samples=0 and num_ooms 1. The
    # window's four periods held one of rate 0, the lone outlier: `median / rates[lone]` raised at every plan.
    job = register(sqlite_engine)
    for step in range(30):
        lost = step == 27
        for rank in range(RANKS):
            assert job_store.add_report(sqlite_engine, job.id, dict(
                step=step, rank=rank, step_time_s=1.0, generation_s=0.95, evaluation_s=0.02, communication_s=0.01,
                update_s=0.02, other_s=0.0, samples=0 if lost else 32, num_ooms=1 if step >= 27 else 0))
    rb = Rebalancer(sqlite_engine)
    p = rb.evaluate(job)
    assert rb.health()["errors"] == 0, rb.health()["last_error"]
    assert p is not None and p.advice_rule == "oom", p and p.note
    assert decisions(sqlite_engine, job)[0].rule == "oom"
    assert not status(sqlite_engine, job).failing


@pytest.mark.parametrize("key,value", [("plan_retry_min_s", 0.0), ("plan_retry_max_s", 0.5)])
def test_a_backoff_that_would_loop_or_shrink_is_refused(key, value):
    from trimtab.grading.rules_parse import RulesError
    with pytest.raises(RulesError, match="plan_retry"):
        default_rules().with_overrides({"controller": {key: value}})
