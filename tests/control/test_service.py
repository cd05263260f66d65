"""The rebalancer on a real store (SQLite file and PostgreSQL): a change and its decision are filed together, a
restarted daemon (a new Rebalancer on the same store) picks the change in flight up without queueing it twice,
the verdict (kept / rolled back) is written once, and an error in an evaluation is counted, not raised."""

from __future__ import annotations

import time

import pytest

from tests.support.jobs_in_a_store import ack, changes, decisions, register, report
from trimtab.control import service as service_mod
from trimtab.control.service import Rebalancer
from trimtab.store import changes as change_store
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store


@pytest.fixture
def engine(store_engine):
    """A migrated store on SQLite and on PostgreSQL (the shared ``store_engine`` fixture)."""
    return store_engine


def first_change(engine, job):
    """Batch 1 (45 s steps, 44 s generating, 64 samples) → the rebalancer queues batch 4 with a pending decision."""
    report(engine, job, 0, 3, step_time=45.0, gen=44.0)
    rb = Rebalancer(engine)
    p = rb.evaluate(job)
    assert p is not None and p.change is not None, p and p.note
    [c] = changes(engine, job)
    [d] = decisions(engine, job)
    assert (c.knob, c.value, c.previous_value, c.source, c.status) == ("batch_size", 4, 1, "rebalancer", "pending")
    assert (d.rule, d.outcome, d.change_id, d.knob, d.old_value, d.new_value) == \
        ("generation_bound", "pending", c.id, "batch_size", 1, 4)
    assert d.throughput_before_samples_per_s == pytest.approx(64 / 45)
    assert d.evidence["window"]["steps"] == [2, 2]
    assert rb.health()["changes_queued"] == 1 and rb.health()["errors"] == 0
    return c, d


def test_restart_mid_change_recovers_from_the_store_and_keeps_a_gain(engine):
    job = register(engine)
    c, d = first_change(engine, job)

    # the daemon restarts before the job applied the change: nothing is queued twice
    for _ in range(2):
        p = Rebalancer(engine).evaluate(job)
        assert p.note == f"waiting for the job to apply change {c.id} (batch_size → 4)"
    assert [x.id for x in changes(engine, job)] == [c.id] and [x.id for x in decisions(engine, job)] == [d.id]

    # both ranks apply it from step 3; batch 4 runs 12 s steps of 64 samples
    ack(engine, job, c.id, 3)
    assert job_store.get_job(engine, "grpo").knobs["batch_size"]["value"] == 4
    report(engine, job, 3, 1, step_time=12.0, gen=11.0)  # the settle step only
    rb = Rebalancer(engine)
    p = rb.evaluate(job)
    assert p.measuring == d.id and p.close is None
    assert decisions(engine, job)[0].applied_step == 3 and decisions(engine, job)[0].outcome == "pending"

    report(engine, job, 4, 2, step_time=12.0, gen=11.0)
    rb = Rebalancer(engine)  # another restart
    p = rb.evaluate(job)
    # one evaluation judges the change (kept) and, the job still generation-bound, decides the next: 4 → 16 rides
    # on the same report's response
    assert (p.change.knob, p.change.old_value, p.change.new_value) == ("batch_size", 4, 16)
    assert p.evidence["window"]["steps"] == [5, 5]
    new, kept = decisions(engine, job)
    assert kept.id == d.id and kept.outcome == "kept" and kept.applied_step == 3
    assert kept.throughput_after_samples_per_s == pytest.approx(64 / 12)
    # the verdict tests every step after the settle step there is, up to the after window's bound
    assert kept.evidence["gain_pct"] == 275.0 and kept.evidence["after_window"]["steps"] == [4, 5]
    assert kept.evidence["acks"] == [{"rank": 0, "applied_at_step": 3}, {"rank": 1, "applied_at_step": 3}]
    assert rb.health()["kept"] == 1 and rb.health()["rolled_back"] == 0 and rb.health()["evaluations"] == 2
    assert new.outcome == "pending" and new.throughput_before_samples_per_s == pytest.approx(64 / 12)
    assert [(x.status, x.value) for x in changes(engine, job)] == [("pending", 16), ("applied", 4)]


def test_worse_throughput_rolls_back_exactly_once_and_is_not_retried(engine):
    job = register(engine)
    c, d = first_change(engine, job)
    ack(engine, job, c.id, 3)
    report(engine, job, 3, 3, step_time=60.0, gen=59.0)  # batch 4: slower per sample (64 / 60 s)

    rb = Rebalancer(engine)
    p = rb.evaluate(job)
    assert (p.close, p.outcome, p.rollback_to) == (d.id, "rolled_back", 1)
    for again in (rb, Rebalancer(engine)):  # evaluating again, and after a restart: no second rollback
        p = again.evaluate(job)
        assert p.change is None and p.close is None and "is in flight" in p.note
    newest, first = changes(engine, job)
    assert first.id == c.id
    assert (newest.knob, newest.value, newest.previous_value, newest.status, newest.source) == \
        ("batch_size", 1, 4, "pending", "rebalancer")
    assert newest.reason.startswith("rollback: ")
    [rolled] = decisions(engine, job)
    assert rolled.outcome == "rolled_back" and rolled.applied_step == 3
    assert rolled.throughput_after_samples_per_s == pytest.approx(64 / 60)
    assert rolled.evidence["gain_pct"] == pytest.approx(-25.0)
    assert rb.health()["rolled_back"] == 1

    # the job applies the rollback; still generation-bound, but batch 4 was rolled back: a value between them
    ack(engine, job, newest.id, 6)
    assert job_store.get_job(engine, "grpo").knobs["batch_size"]["value"] == 1
    report(engine, job, 6, 2, step_time=45.0, gen=44.0)
    p = Rebalancer(engine).evaluate(job)
    assert (p.change.knob, p.change.old_value, p.change.new_value) == ("batch_size", 1, 2)
    assert p.evidence["step_policy"] == [f"bracket search between 1 and 4 (measured worse at decision {d.id}): 2"]
    assert [x.value for x in changes(engine, job)] == [2, 1, 4]


def test_advise_mode_records_advice_once_and_queues_nothing(sqlite_engine):
    job = register(sqlite_engine, mode="advise")
    report(sqlite_engine, job, 0, 3, step_time=45.0, gen=44.0)
    rb = Rebalancer(sqlite_engine)
    rb.evaluate(job)
    Rebalancer(sqlite_engine).evaluate(job)
    [d] = decisions(sqlite_engine, job)
    assert (d.rule, d.outcome, d.knob, d.old_value, d.new_value, d.change_id) == \
        ("generation_bound", "advised", "batch_size", 1, 4, None)
    assert "batch_size ×4 (1 → 4)" in d.advice
    assert changes(sqlite_engine, job) == []
    assert rb.health()["advised"] == 1


def test_an_error_in_an_evaluation_is_counted_not_raised(sqlite_engine, monkeypatch):
    job = register(sqlite_engine)
    report(sqlite_engine, job, 0, 3, step_time=45.0, gen=44.0)

    def broken(*args, **kwargs):
        raise RuntimeError("job_reports unreadable")

    monkeypatch.setattr(service_mod, "load_steps", broken)
    rb = Rebalancer(sqlite_engine)
    assert rb.evaluate(job) is None
    assert rb.evaluate(job) is None  # asked directly: planned, and fails again
    rb.after_report(job, 2)  # step 2 is complete, but the job's plans fail: not before its backoff (1 s, then 2 s)
    health = rb.health()
    assert health["errors"] == 2 and health["evaluations"] == 0
    assert health["last_error"].startswith("job 'grpo': RuntimeError: job_reports unreadable (while loading its steps")
    assert "2 errors" in rb.status_line() and "planning fails on grpo" in rb.status_line()
    assert changes(sqlite_engine, job) == [] and decisions(sqlite_engine, job) == []
    monkeypatch.undo()
    assert rb.evaluate(job).change is not None and rb.health()["errors"] == 2


def test_only_the_report_that_completes_a_step_evaluates(sqlite_engine):
    job = register(sqlite_engine)  # 2 ranks
    report(sqlite_engine, job, 0, 1, step_time=45.0, gen=44.0)
    assert job_store.add_report(sqlite_engine, job.id, dict(step=1, rank=0, step_time_s=45.0, generation_s=44.0,
                                                             samples=32))
    rb = Rebalancer(sqlite_engine)
    rb.after_report(job, 1)  # rank 1 has not reported step 1: no evaluation (nothing read, nothing decided)
    assert rb.health()["evaluations"] == 0 and changes(sqlite_engine, job) == []
    assert job_store.add_report(sqlite_engine, job.id, dict(step=1, rank=1, step_time_s=45.0, generation_s=44.0,
                                                             samples=32))
    rb.after_report(job, 1)  # the last rank's report completes the step: it evaluates and decides
    assert rb.health()["evaluations"] == 1
    [c] = changes(sqlite_engine, job)
    assert (c.knob, c.value) == ("batch_size", 4)


def test_the_loop_rereads_a_job_only_when_something_came_in(sqlite_engine):
    job = register(sqlite_engine, mode="advise")
    report(sqlite_engine, job, 0, 1, step_time=45.0, gen=44.0)
    rb = Rebalancer(sqlite_engine)
    rb.run_once()
    assert rb.health()["evaluations"] >= 1
    done = rb.health()["evaluations"]
    rb.run_once()
    rb.run_once()  # nothing new: the loop leaves the job alone
    assert rb.health()["evaluations"] == done
    time.sleep(0.002)
    report(sqlite_engine, job, 1, 1, step_time=45.0, gen=44.0)  # a new step: evaluated again
    rb.run_once()
    assert rb.health()["evaluations"] > done


def test_the_store_never_queues_a_change_outside_the_jobs_bounds(sqlite_engine):
    job = register(sqlite_engine)
    for knob, value in (("sync_every", 0), ("sync_every", 9), ("lr", 1)):
        with pytest.raises(change_store.KnobOutOfBounds):
            change_store.queue_change(sqlite_engine, job.id, knob, value, "test")
        decision = decision_store.add_decision(sqlite_engine, job.id, "r", {}, outcome="pending")
        with pytest.raises(change_store.KnobOutOfBounds):  # the rollback path: nothing closed, nothing queued
            decision_store.close_decision(sqlite_engine, decision, "rolled_back", {}, rollback=(job.id, knob, value, "x"))
    assert changes(sqlite_engine, job) == []
    assert all(d.outcome == "pending" for d in decision_store.list_decisions(sqlite_engine, job.id, 10, 0))
