"""Plans in a process of their own (issue 20, control/plan_process.py): the daemon's rebalancer runs each plan in a
child process with its own interpreter and store connection, and what the plan decided and learnt comes back —
the change reaches the job in a report's response, the counters and the job's cadence are the parent's; a store
another process cannot open (in-memory SQLite) plans on the thread as before; a child that dies is replaced.
"""

from __future__ import annotations

import os
import signal
import time

from sqlalchemy import create_engine

from tests.support.loop_job import JOB, report
from tests.support.waits import eventually
from trimtab.control.plan_process import can_plan_apart
from trimtab.control.service import Rebalancer


def started(api) -> Rebalancer:
    rb = Rebalancer(api.ctx.engine, api.ctx.rules, interval_s=3600).start(own_process=True)
    api.ctx.after_report, api.ctx.after_refusal = rb.after_report, rb.after_refusal
    return rb


def pending(api, step: int) -> list:
    r = api.post("/v1/jobs/ppo/reports", report(step), scope="job")
    assert r.status_code == 200, r.text
    return [(c["knob"], c["value"]) for c in r.json()["pending_changes"]]


def test_a_plan_made_in_the_child_process_reaches_the_job_and_the_parents_counters(sqlite_api):
    rb = started(sqlite_api)
    try:
        child = rb._apart.pid()
        assert child != os.getpid()
        assert sqlite_api.post("/v1/jobs", JOB, scope="job").status_code == 201
        assert pending(sqlite_api, 0) == []  # the first generation-bound 45 s step completes a window
        assert rb.wait_planned(30)
        assert pending(sqlite_api, 1) == [("batch_size", 4)]  # decided and written by the child
        health = rb.health()
        assert health["evaluations"] >= 1 and health["changes_queued"] == 1 and health["errors"] == 0
        assert "ppo" in health["jobs"]
        # The cadence came back too: the next report is counted here, against the plan's wait, with no plan queued
        assert "ppo" in rb._cadence
        assert rb._apart.pid() == child  # one process for every plan
    finally:
        rb.stop()


def test_a_child_that_dies_is_replaced_and_its_plan_counted_as_an_error(sqlite_api):
    rb = started(sqlite_api)
    try:
        assert sqlite_api.post("/v1/jobs", JOB, scope="job").status_code == 201
        first = rb._apart.pid()
        os.kill(first, signal.SIGKILL)
        pending(sqlite_api, 0)
        eventually(lambda: rb.stats.errors == 1, timeout_s=20.0)
        assert "BrokenProcessPool" in rb.stats.last_error
        assert rb.wait_planned(30)
        # the job's plan failed: an error on the job, planned again after its backoff (plan_retry_min_s, 1 s)
        failure = rb.stats.failing["ppo"]
        assert (failure.type, failure.stage, failure.retry_in_s) == ("BrokenProcessPool", "the planning process died",
                                                                      1.0)
        time.sleep(failure.retry_in_s)
        assert pending(sqlite_api, 1) == []  # the failed plan decided nothing; the next report queues another
        assert rb.wait_planned(30)
        eventually(lambda: rb.stats.changes_queued == 1)
        assert rb._apart.pid() != first
    finally:
        rb.stop()


def test_the_stop_signals_sent_to_the_daemons_process_group_leave_the_child_to_its_parent(sqlite_api):
    """systemd's stop, Ctrl-C and `timeout` signal every process of the group: the child used to die of them first,
    breaking the plan in flight ("listing jobs failed" at every stop). It ignores them; the parent ends it."""
    rb = started(sqlite_api)
    try:
        assert sqlite_api.post("/v1/jobs", JOB, scope="job").status_code == 201
        child = rb._apart.pid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(child, sig)
        time.sleep(0.5)  # (a signal that kills does so at once)
        assert [j.name for j in rb._apart.jobs()] == ["ppo"] and rb._apart.pid() == child
        assert rb.stats.errors == 0
    finally:
        rb.stop()
    eventually(lambda: not _alive(child), timeout_s=10.0)  # stopped by its parent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_an_in_memory_store_plans_on_the_thread(sqlite_api):
    memory = create_engine("sqlite://")
    assert not can_plan_apart(memory) and can_plan_apart(sqlite_api.ctx.engine)
    rb = Rebalancer(memory, sqlite_api.ctx.rules, interval_s=3600).start(own_process=True)
    try:
        assert rb._apart is None
    finally:
        rb.stop()


def test_the_thread_rests_for_the_planning_processs_cpu_time_too(sqlite_api):
    rb = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules, interval_s=3600, plan_share=0.25)
    rests: list[float] = []
    real_wait = rb._stop.wait
    rb._stop.wait = lambda timeout=None: (rests.append(timeout), real_wait(timeout))[1]
    rb.start(own_process=True)
    sqlite_api.ctx.after_report = rb.after_report
    try:
        assert sqlite_api.post("/v1/jobs", JOB, scope="job").status_code == 201
        pending(sqlite_api, 0)
        eventually(lambda: rb.stats.evaluations >= 1 and rests)
        assert rb._apart.cpu_s > 0  # the child's CPU time for the plan came back
        # a quarter of the time planning: a rest of at least 3× the child's CPU time for the plan
        assert max(rests) >= 3 * rb._apart.cpu_s * 0.99
    finally:
        rb.stop()
