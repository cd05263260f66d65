"""A job registered in a real store and driven as its ranks would drive it (reports, acks), for the rebalancer's
service tests: two ranks, the three knobs a job declares."""

from __future__ import annotations

from trimtab.store import changes as change_store
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store

RANKS = 2
KNOBS = {"batch_size": {"value": 1, "min": 1, "max": 64}, "prefetch": {"value": 0, "min": 0, "max": 8},
         "sync_every": {"value": 1, "min": 1, "max": 8}}


def register(engine, mode="auto"):
    job, created = job_store.register_job(engine, "grpo", RANKS, {}, ["node-a"], KNOBS, mode, None, True)
    assert created
    return job


def report(engine, job, first: int, n: int, step_time: float, gen: float, samples: int = 64) -> None:
    """``n`` steps from ``first``, every rank reporting its half of the samples."""
    for step in range(first, first + n):
        for rank in range(RANKS):
            assert job_store.add_report(engine, job.id, dict(
                step=step, rank=rank, step_time_s=step_time, generation_s=gen, evaluation_s=0.5,
                communication_s=0.2, update_s=step_time - gen - 0.7, other_s=0.0, samples=samples // RANKS))


def ack(engine, job, change_id: int, step: int) -> None:
    for rank in range(RANKS):
        assert change_store.ack_change(engine, job.id, change_id, rank, step) is not None


def changes(engine, job):
    return change_store.list_changes(engine, job.id, limit=100, offset=0)  # newest first


def decisions(engine, job):
    return decision_store.list_decisions(engine, job.id, limit=100, offset=0)  # newest first
