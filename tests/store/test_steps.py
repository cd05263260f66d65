"""The store's readers of step reports and of the rebalancer's record: complete steps of many jobs in one query,
the first probes, whether any job reported lately, decision and change counts, and the health probe's question."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError

from trimtab.contract.readings import NodeInfo
from trimtab.store import changes as change_store
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store
from trimtab.store import steps as step_store
from trimtab.store.ingest import BatchWriter
from trimtab.store.queries import StoreHealth, store_health
from trimtab.store.wall_clock import now_ms
from tests.store.conftest import T0_MS, make_batch

KNOBS = {"batch_size": {"value": 4, "min": 1, "max": 64}}


def job(engine, name: str, ranks: int):
    return job_store.register_job(engine, name, ranks, {}, ["node-a"], KNOBS, "auto", None, True)[0]


def report(engine, job_id: int, step: int, rank: int, **values) -> None:
    assert job_store.add_report(engine, job_id, dict(step=step, rank=rank, step_time_s=1.0, **values))


def steps_of(result, job_id):
    return [(step, [r["rank"] for r in reports]) for step, reports in result.get(job_id, [])]


def test_complete_steps_of_many_jobs_come_in_one_read(store_engine):
    a, b, idle = job(store_engine, "a", 2), job(store_engine, "b", 1), job(store_engine, "idle", 1)
    for step in range(1, 6):
        for rank in (0, 1):
            if (step, rank) != (3, 1):  # rank 1's report of step 3 is lost: later steps came, so step 3 counts
                report(store_engine, a.id, step, rank, samples=8)
    report(store_engine, a.id, 6, 0)  # the newest step, one rank still to come: not complete yet
    for step in (10, 20, 30):  # a job that reports every 10th step: "the newest 2 steps" are its last two
        report(store_engine, b.id, step, 0)
    ranks = {a.id: a.ranks, b.id: b.ranks, idle.id: idle.ranks}

    every = step_store.complete_steps(store_engine, ranks, depth=100)
    assert steps_of(every, a.id) == [(1, [0, 1]), (2, [0, 1]), (3, [0]), (4, [0, 1]), (5, [0, 1])]
    assert steps_of(every, b.id) == [(10, [0]), (20, [0]), (30, [0])] and idle.id not in every
    newest = step_store.complete_steps(store_engine, ranks, depth=3)
    assert steps_of(newest, a.id) == [(4, [0, 1]), (5, [0, 1])]  # steps 4-6 read; 6 waits for its rank 1
    assert steps_of(newest, b.id) == [(10, [0]), (20, [0]), (30, [0])]
    assert steps_of(step_store.complete_steps(store_engine, ranks, depth=2), b.id) == [(20, [0]), (30, [0])]
    assert steps_of(step_store.complete_steps(store_engine, {a.id: 2}, 3, since_step=5), a.id) == [(5, [0, 1])]
    (_, reports), = step_store.complete_steps(store_engine, {a.id: 2}, depth=2)[a.id][-1:]
    assert set(reports[0]) == {"job_id", *step_store.STEP_COLUMNS} and reports[0]["samples"] == 8
    assert step_store.complete_steps(store_engine, {}, depth=5) == {}


def test_the_first_probes_of_each_job_stop_at_how_many_it_asks(store_engine):
    a, b, none = job(store_engine, "a", 2), job(store_engine, "b", 1), job(store_engine, "none", 1)
    for step in range(4):
        for rank in (0, 1):
            report(store_engine, a.id, step, rank, collective_latency_us=10.0 * step + rank)
    report(store_engine, b.id, 0, 0)  # no probe
    report(store_engine, b.id, 1, 0, collective_latency_us=7.0)
    got = step_store.first_probes(store_engine, {a.id: 3, b.id: 5, none.id: 2})
    assert got == {a.id: [0.0, 1.0, 10.0], b.id: [7.0], none.id: []}
    assert step_store.first_probes(store_engine, {a.id: 1}) == {a.id: [0.0]}


def test_a_batch_of_reports_is_stored_in_one_transaction_and_a_resend_is_not_stored_twice(store_engine):
    a = job(store_engine, "a", 2)
    rows = [dict(step=s, rank=r, step_time_s=0.01 * (s + 1), samples=4) for s in range(3) for r in (0, 1)]
    assert job_store.add_reports(store_engine, a.id, rows) == 6
    stored = job_store.list_reports(store_engine, a.id, 100, 0)
    assert [(x["step"], x["rank"], x["step_time_s"]) for x in stored][:2] == [(2, 0, 0.03), (2, 1, 0.03)]
    assert len(stored) == 6 and len({x["received_ms"] for x in stored}) == 1
    # A resend grown by new reports, one of them twice: the indices of the new ones, each stored once.
    again = rows[4:] + [dict(step=3, rank=0, step_time_s=0.04), dict(step=3, rank=0, step_time_s=9.0),
                        dict(step=3, rank=1, step_time_s=0.04)]
    assert job_store.added_reports(store_engine, a.id, again) == [2, 4]
    assert job_store.add_reports(store_engine, a.id, again) == 0 and job_store.add_reports(store_engine, a.id, []) == 0
    assert [x["step_time_s"] for x in job_store.list_reports(store_engine, a.id, 2, 0)] == [0.04, 0.04]  # the first
    # One row the store refuses (no rank): nothing of the batch is stored, not even the rows before it.
    with pytest.raises(IntegrityError):
        job_store.add_reports(store_engine, a.id, [dict(step=4, rank=0, step_time_s=1.0),
                                                   dict(step=5, rank=None, step_time_s=1.0)])
    assert job_store.newest_step(store_engine, a.id) == 3


def test_a_batch_may_complete_a_step_below_its_newest(store_engine):
    a = job(store_engine, "a", 2)
    job_store.add_reports(store_engine, a.id, [dict(step=s, rank=0, step_time_s=1.0) for s in range(5)])
    assert not step_store.completes_a_step(store_engine, a.id, range(5), 2)  # rank 1 has reported nothing
    job_store.add_reports(store_engine, a.id, [dict(step=s, rank=1, step_time_s=1.0) for s in range(3, 8)])
    assert step_store.completes_a_step(store_engine, a.id, range(3, 8), 2)  # steps 3 and 4: not its newest, 7
    assert not step_store.completes_a_step(store_engine, a.id, [5, 6, 7], 2)
    assert step_store.completes_a_step(store_engine, a.id, [4], 2) and not step_store.completes_a_step(
        store_engine, a.id, [4], 3)


def test_whether_any_job_reported_lately(store_engine):
    assert not step_store.any_report_since(store_engine, 0)
    report(store_engine, job(store_engine, "a", 1).id, 0, 0)
    assert step_store.any_report_since(store_engine, 0)
    assert not step_store.any_report_since(store_engine, now_ms() + 60_000)


def test_decisions_and_changes_are_counted_by_job_rule_outcome_and_by_job_source_status(store_engine):
    a = job(store_engine, "a", 1)
    for outcome in ("kept", "kept", "advised"):
        decision_store.add_decision(store_engine, a.id, "generation_bound", {}, outcome=outcome)
    decision_store.decide_change(store_engine, a.id, "generation_bound", {}, "batch_size", 8, "gen-bound")
    change_store.queue_change(store_engine, a.id, "batch_size", 16, "by hand")  # supersedes the rebalancer's
    assert sorted(decision_store.decision_counts(store_engine)) == [
        ("a", "generation_bound", "advised", 1), ("a", "generation_bound", "kept", 2),
        ("a", "generation_bound", "pending", 1)]
    assert sorted(change_store.change_counts(store_engine)) == [("a", "manual", "pending", 1),
                                                                ("a", "rebalancer", "superseded", 1)]


def test_the_health_question_is_answered_even_when_the_store_is_gone(store_engine):
    assert store_health(store_engine) == StoreHealth(reachable=True, simulated=False)
    BatchWriter(store_engine).write(make_batch([T0_MS], node=NodeInfo(hostname="n-sim", simulated=True)))
    assert store_health(store_engine) == StoreHealth(reachable=True, simulated=True)
    nobody = create_engine("postgresql+psycopg://trimtab@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    assert store_health(nobody) == StoreHealth(reachable=False, simulated=False)  # an answer, not an exception


def test_a_job_s_newest_report_is_one_index_seek_not_a_scan_of_its_reports(engine):
    # Every read of a job (each report, ack and refusal; the sweep; /metrics) asks for max(received_ms) of its
    # reports. Through the unique (job_id, step, rank) index that read every report the job ever sent (26 ms at
    # 200 000 reports on SQLite); migration 0010's (job_id, received_ms) index answers it with one seek.
    from sqlalchemy import text

    one = job(engine, "long-job", 1)
    for step in range(3):
        report(engine, one.id, step, 0)
    assert job_store.get_job(engine, "long-job").last_report_ms is not None
    query = job_store._JOB_BY_NAME.compile(engine, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            plan = " | ".join(str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {query}"))
        else:  # three rows: PostgreSQL would scan them whatever the indexes; ask what it would do at scale
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = " | ".join(conn.exec_driver_sql(f"EXPLAIN {query}").scalars())
    assert "ix_job_reports_job_id_received_ms" in plan, plan


def test_a_change_decided_after_the_job_left_auto_is_filed_as_advice_and_never_queued(store_engine):
    """The plan runs on the job as it read it; a mode switch to advise can land in between (`trimtab demo` switched
    its job to advise to measure the settings left, and a prefetch change still reached the job a second later)."""
    a = job(store_engine, "a", 1)
    job_store.set_mode(store_engine, "a", "advise")
    decision_id, change = decision_store.decide_change(store_engine, a.id, "generation_bound", {"reading": {}},
                                                       "batch_size", 8, "gen-bound", advice="raise it")
    assert change is None and change_store.pending_changes(store_engine, a.id) == []
    d = next(d for d in decision_store.list_decisions(store_engine, a.id, 10, 0) if d.id == decision_id)
    assert (d.outcome, d.change_id, d.knob, d.new_value) == ("advised", None, "batch_size", 8)
    assert d.old_value == KNOBS["batch_size"]["value"]
    assert d.advice == "gen-bound (not applied: the job's mode is advise). raise it"
    job_store.set_mode(store_engine, "a", "auto")
    _, change = decision_store.decide_change(store_engine, a.id, "generation_bound", {}, "batch_size", 8, "gen-bound")
    assert change is not None and [c.id for c in change_store.pending_changes(store_engine, a.id)] == [change.id]
