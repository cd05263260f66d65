"""Planning costs per window, not per step (issue 15): after a plan, the reports of the steps it said cannot
change anything are counted in memory and read nothing; the report that completes a window's worth plans; an
ack, a new registration or a mode switch plans at once; the background loop follows the same wait."""

from __future__ import annotations

import pytest

from tests.support.jobs_in_a_store import RANKS, ack, changes, register
from trimtab.control import service as service_mod
from trimtab.control.service import Rebalancer
from trimtab.store import jobs as job_store


@pytest.fixture
def engine(sqlite_engine):
    """A migrated SQLite store (tests/control/conftest.py)."""
    return sqlite_engine


@pytest.fixture
def reads(monkeypatch):
    """How many times the rebalancer read a job's steps from the store."""
    calls = []
    real = service_mod.load_steps

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(service_mod, "load_steps", counted)
    return calls


def step(engine, rb, job, n: int, step_time: float = 0.0625, gen: float = 0.025) -> None:
    """Step ``n`` reported by every rank, through ``after_report`` as the report route calls it."""
    for rank in range(RANKS):
        assert job_store.add_report(engine, job.id, dict(step=n, rank=rank, step_time_s=step_time, generation_s=gen,
                                                         evaluation_s=0.01, update_s=0.01, samples=8))
        rb.after_report(job_store.get_job(engine, "grpo"), n, step_time)


def test_steps_that_cannot_complete_a_window_read_nothing(engine, reads):
    job = register(engine)
    rb = Rebalancer(engine)
    step(engine, rb, job, 0)  # the first step: nothing known about the job yet, it plans
    assert rb.health()["evaluations"] == 1 and len(reads) == 1
    # 1/16 s steps: a 4 s window would need 64 of them, window_enough_steps (20) come first. The first plan said
    # so: steps 1–18 read nothing.
    for n in range(1, 19):
        step(engine, rb, job, n)
    assert rb.health()["evaluations"] == 1 and len(reads) == 1
    step(engine, rb, job, 19)  # 20 steps: a window; generation is 40 %, so no rule fires
    assert rb.health()["evaluations"] == 2 and rb.health()["jobs"]["grpo"] == "no rule fires"
    for n in range(20, 39):  # the next plan comes a window later
        step(engine, rb, job, n)
    assert rb.health()["evaluations"] == 2 and len(reads) == 2
    step(engine, rb, job, 39)
    assert rb.health()["evaluations"] == 3


def batch(engine, rb, job, rank: int, steps: range, step_time: float = 0.0625) -> None:
    """One rank's reports of ``steps`` in one batch, through ``after_report`` as the batch route calls it: once,
    with the newest report, the others as ``earlier``."""
    rows = [dict(step=n, rank=rank, step_time_s=step_time, generation_s=0.025, evaluation_s=0.01, update_s=0.01,
                 samples=8) for n in steps]
    assert job_store.add_reports(engine, job.id, rows) == len(rows)
    rb.after_report(job_store.get_job(engine, "grpo"), steps[-1], step_time,
                    earlier=[(n, step_time) for n in steps[:-1]])


def test_a_batch_counts_every_step_toward_the_wait_and_plans_at_the_step_it_completes(engine, reads):
    job = register(engine)
    rb = Rebalancer(engine)
    step(engine, rb, job, 0)  # plans; the next window is steps 1–19, as in the first test
    batch(engine, rb, job, 0, range(1, 19))
    batch(engine, rb, job, 1, range(1, 19))  # 18 steps: one short of the window, however they came
    assert rb.health()["evaluations"] == 1 and len(reads) == 1
    batch(engine, rb, job, 0, range(19, 26))  # the window's steps are in, but rank 1 has not reported step 19
    assert rb.health()["evaluations"] == 1
    # Rank 1's batch ends at step 30, which rank 0 has not reached; it completes steps 19–25: a window, planned.
    batch(engine, rb, job, 1, range(19, 31))
    assert rb.health()["evaluations"] == 2 and len(reads) == 2


def test_an_ack_plans_at_the_next_report_and_a_window_after_the_change_is_judged_once(engine):
    job = register(engine)
    rb = Rebalancer(engine)
    for n in range(0, 20):  # generation-bound 1/16 s steps: after a 20-step window, batch 1 → 4
        step(engine, rb, job, n, gen=0.055)
    [c] = changes(engine, job)
    assert c.value == 4 and rb.health()["evaluations"] == 2
    ack(engine, job, c.id, 20)  # the job's knobs moved: the next report plans (the measurement starts)
    fast = dict(step_time=0.03125, gen=0.025)
    step(engine, rb, job, 20, **fast)
    assert rb.health()["evaluations"] == 3 and rb.health()["jobs"]["grpo"].startswith("measuring")
    for n in range(21, 40):  # step 20 ran at batch 4 already and settles; the after window is 21…40 (20 steps)
        step(engine, rb, job, n, **fast)
    assert rb.health()["evaluations"] == 3 and rb.health()["kept"] == 0
    step(engine, rb, job, 40, **fast)  # the window is complete: judged (kept) and the next change decided
    assert rb.health()["evaluations"] == 5 and rb.health()["kept"] == 1
    assert [c.value for c in changes(engine, job)] == [16, 4]


def stored(engine, job, steps: range, step_time: float = 0.0625) -> None:
    """Reports stored without the rebalancer hearing of them (as if it had been busy)."""
    for n in steps:
        for rank in range(RANKS):
            assert job_store.add_report(engine, job.id, dict(step=n, rank=rank, step_time_s=step_time,
                                                             generation_s=0.025, samples=8))


def test_the_loop_follows_the_same_wait(engine):
    job = register(engine)
    rb = Rebalancer(engine)
    rb.run_once()  # nothing reported yet: nothing to plan
    stored(engine, job, range(0, 10))
    rb.run_once()
    assert rb.health()["evaluations"] == 1
    stored(engine, job, range(10, 19))  # 9 more steps, 0.56 s: not a window yet (one small query, no plan)
    rb.run_once()
    assert rb.health()["evaluations"] == 1
    stored(engine, job, range(19, 90))
    rb.run_once()
    assert rb.health()["evaluations"] == 2


def test_a_caller_without_the_step_time_plans_every_completed_step(engine):
    job = register(engine)
    rb = Rebalancer(engine)
    for n in range(3):
        stored(engine, job, range(n, n + 1))
        rb.after_report(job_store.get_job(engine, "grpo"), n)
    assert rb.health()["evaluations"] == 3
