"""Exactly one server plans (issue 39: no single point of failure at the head): the planner's lease on the real
PostgreSQL, as two servers' engines see it. One takes it, the other follows; when the leader stops renewing (it
died) the other takes over within the lease; a former leader that lost it — even one that still believes it plans,
as a process paused past its lease does — cannot write a decision; a takeover waits for a decision in flight.
On SQLite the second process serves without planning and says so."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from trimtab.control.leadership import Leadership, NotLeading, lease_status
from trimtab.store.decisions import list_decisions
from trimtab.store.engine import open_engine
from trimtab.store.jobs import register_job
from trimtab.store.migrate import migrate
from trimtab.store.transactions import write_transaction

LEASE_S, RENEW_S = 2.0, 0.25


@pytest.fixture
def two_servers(pg_url):
    """Two engines on one fresh PostgreSQL schema, as two servers have; and a job to decide on."""
    engines = [open_engine(pg_url), open_engine(pg_url)]
    migrate(engines[0])
    job, _ = register_job(engines[0], "ppo", 1, {}, ["cpu-box"], {"batch_size": {"value": 1, "min": 1, "max": 64}},
                          mode="auto", token_id=None, token_is_admin=True)
    yield engines, job.id
    for engine in engines:
        engine.dispose()


def lead(engine, name) -> Leadership:
    return Leadership(engine, name, lease_s=LEASE_S, renew_s=RENEW_S)


def advise(leader: Leadership, engine, job_id: int) -> int:
    return leader.fenced_writes().add_decision(engine, job_id, "generation_bound", {"by": leader.holder},
                                               outcome="advised", advice="test")


pytestmark = pytest.mark.postgres


def test_one_server_plans_and_the_other_cannot_write_a_decision(two_servers):
    (eng_a, eng_b), job_id = two_servers
    a, b = lead(eng_a, "a"), lead(eng_b, "b")
    assert a.tick() and not b.tick() and not b.tick()
    assert a.leading and not b.leading
    status = lease_status(eng_b, b.holder, b.leading)
    assert status["planning_server"] == a.holder and status["epoch"] == 1 and not status["this_server_plans"]
    advise(a, eng_a, job_id)
    with pytest.raises(NotLeading):
        advise(b, eng_b, job_id)
    assert [d.evidence["by"] for d in list_decisions(eng_a, job_id, 10, 0)] == [a.holder]


@pytest.mark.serial  # a wall-clock bound: under xdist it runs after the other tests, alone
def test_the_other_takes_over_within_the_lease_and_the_fenced_former_leader_writes_nothing(two_servers):
    (eng_a, eng_b), job_id = two_servers
    a, b = lead(eng_a, "a"), lead(eng_b, "b")
    assert a.tick()
    b.start()
    try:
        time.sleep(2 * RENEW_S)
        assert not b.leading                      # a renews nothing from here on: it died
        died = time.monotonic()
        while not b.leading and time.monotonic() - died < 3 * LEASE_S:
            time.sleep(0.01)
        took_s = time.monotonic() - died
        assert b.leading and took_s <= LEASE_S + 2 * RENEW_S, f"took over after {took_s:.2f} s"
        assert b.term == 1 and b.epoch == 2
        advise(b, eng_b, job_id)
        # a was only paused, and wakes believing it still plans: its lease is fenced off all the same
        a._valid_until = time.monotonic() + 3600
        assert a.leading
        with pytest.raises(NotLeading):
            advise(a, eng_a, job_id)
        assert not a.tick() and not a.leading     # its next renewal finds it lost the lease
        assert [d.evidence["by"] for d in list_decisions(eng_a, job_id, 10, 0)] == [b.holder]
    finally:
        b.stop()
    assert lease_status(eng_a)["planning_server"] is None  # a clean stop frees the lease at once


def test_a_takeover_waits_for_the_decision_in_flight(two_servers):
    (eng_a, eng_b), job_id = two_servers
    a, b = lead(eng_a, "a"), lead(eng_b, "b")
    assert a.tick()
    with write_transaction(eng_a) as conn:       # a decision's transaction, fenced …
        a.fence(conn)
        time.sleep(LEASE_S + 0.2)                 # … and slow: the lease runs out before it commits
        taker = threading.Thread(target=b.tick)
        taker.start()
        taker.join(1.0)
        assert taker.is_alive(), "the takeover did not wait for the fenced transaction"
    taker.join(10)
    assert b.leading and b.epoch == 2
    with pytest.raises(NotLeading):
        advise(a, eng_a, job_id)


def test_a_second_process_on_one_sqlite_file_serves_without_planning_and_says_so(tmp_path, caplog):
    engine = open_engine(f"sqlite:///{tmp_path}/trimtab.db")
    migrate(engine)
    first, second = Leadership(engine, "first"), Leadership(engine, "second")
    with caplog.at_level(logging.WARNING, logger="trimtab.control"):
        assert first.tick() and not second.tick() and not second.tick()
    said = [r.getMessage() for r in caplog.records if "SQLite" in r.getMessage()]
    assert len(said) == 1 and first.holder in said[0] and "without planning" in said[0]
    first.stop()
    assert second.tick()  # the first stopped cleanly: the second plans at its next try
    engine.dispose()
