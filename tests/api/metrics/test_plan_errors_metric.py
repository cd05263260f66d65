"""``trimtab_plan_errors_total{job}``: every plan of a job that raised, from the store (issue 38: a failing job
was a WARNING in the planning process's log and nothing in /metrics); a counter, so it stays when planning
recovers."""

from __future__ import annotations

from trimtab.store import jobs as job_store
from trimtab.store import plan_status

from .conftest import scrape

ERROR = {"type": "ZeroDivisionError", "message": "float division by zero", "stage": "planning", "step": 41,
         "where": "control/verdict.py:63 in of_steps"}


def test_failed_plans_are_a_counter_per_job_that_survives_recovery(ctx):
    job, _ = job_store.register_job(ctx.engine, "grpo", 1, {}, ["node-a"], {}, "auto", None, True)
    fine, _ = job_store.register_job(ctx.engine, "fine", 1, {}, ["node-a"], {}, "auto", None, True)
    plan_status.record_plan(ctx.engine, fine.id, 3, "no rule fires", None)
    assert "trimtab_plan_errors_total" not in scrape(ctx)  # no failure yet: no series
    for _ in range(3):
        plan_status.record_failure(ctx.engine, job.id, ERROR, 1.0, 60.0)
    assert scrape(ctx)["trimtab_plan_errors_total"] == [({"job": "grpo"}, 3.0)]
    plan_status.record_plan(ctx.engine, job.id, 44, "no rule fires", None)  # recovered: the counter stays
    plan_status.record_failure(ctx.engine, job.id, ERROR, 1.0, 60.0)
    assert scrape(ctx)["trimtab_plan_errors_total"] == [({"job": "grpo"}, 4.0)]
