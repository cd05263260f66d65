"""Plans in a process of their own (issue 20, control/plan_process.py): the daemon's rebalancer runs each plan in a
child process with its own interpreter and store connection, and what the plan decided and learnt comes back —
the change reaches the job in a report's response, the counters and the job's cadence are the parent's; the child
only reads (its store connection refuses writes) and this process writes what it decided, so the child, at a lower
CPU priority, never holds SQLite's write lock that the reports need; a store another process cannot open
(in-memory SQLite) plans on the thread as before; a child that dies is replaced.
"""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import create_engine, event

from tests.support import jobs_in_a_store as in_store
from tests.support.loop_job import JOB, report
from tests.support.waits import eventually
from trimtab.control import plan_process
from trimtab.control.plan_process import can_plan_apart
from trimtab.control.service import Rebalancer
from trimtab.store import jobs as job_store


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
        assert pending(sqlite_api, 1) == []  # the failed plan decided nothing; the next report queues another
        assert rb.wait_planned(30)
        eventually(lambda: rb.stats.changes_queued == 1)
        assert rb._apart.pid() != first
    finally:
        rb.stop()


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


def _a_write_in_the_child() -> str:
    """(Runs in the planning process.) What a write through the child's store connection answers."""
    try:
        job_store.set_mode(plan_process._child.engine, "grpo", "off")
    except Exception as exc:  # noqa: BLE001 - the answer is the test's
        return str(exc)
    return "written"


@pytest.fixture
def apart(store_engine):
    """A rebalancer that plans in its own process, on SQLite and PostgreSQL; no sweep (the test calls evaluate)."""
    rb = Rebalancer(store_engine, interval_s=3600).start(own_process=True)
    yield rb
    rb.stop()


def test_the_child_only_reads_and_this_process_writes_what_it_decided(store_engine, apart):
    engine = store_engine
    written: list[str] = []  # the decisions-table writes made through this process's engine

    def seen(_conn, _cursor, statement, *_args) -> None:
        verb = statement.lstrip().split()[0].upper()
        if verb in ("INSERT", "UPDATE") and "decisions" in statement.split("(")[0].split(" SET ")[0]:
            written.append(verb)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        job = in_store.register(engine)
        in_store.report(engine, job, 0, 3, step_time=45.0, gen=44.0)
        p = apart.evaluate(job)
        assert (p.change.knob, p.change.old_value, p.change.new_value) == ("batch_size", 1, 4)
        [c] = in_store.changes(engine, job)
        assert c.status == "pending" and written == ["INSERT"]  # the change and its decision: written here

        # applied from step 3, 12 s steps: one plan in the child judges it (kept), this process closes the
        # decision, and the follow-up plan (in the child again, on the store with the verdict) decides 4 → 16
        in_store.ack(engine, job, c.id, 3)
        in_store.report(engine, job, 3, 3, step_time=12.0, gen=11.0)
        p = apart.evaluate(job)
        assert (p.change.knob, p.change.old_value, p.change.new_value) == ("batch_size", 4, 16)
        new, kept = in_store.decisions(engine, job)
        assert (kept.outcome, new.outcome) == ("kept", "pending") and written == ["INSERT", "UPDATE", "INSERT"]
        health = apart.health()
        assert (health["kept"], health["changes_queued"], health["evaluations"], health["errors"]) == (1, 2, 3, 0)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    # and the child could not have written it: its connection refuses every write
    words = apart._apart._call(_a_write_in_the_child)
    assert "read" in words.lower() and "only" in words.lower(), words
    assert job_store.get_job(engine, "grpo").mode == "auto"
