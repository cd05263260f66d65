"""The accumulated GPU-time ledger's compare-and-set advance on both backends: several jobs advanced for the first
time in one transaction (PostgreSQL's driver reports rowcount -1 for such an insert: the advance must count the
rows it inserted, or no job on PostgreSQL ever accumulates), then moved on, and a stale advance adds nothing."""

from __future__ import annotations

from sqlalchemy import insert

from trimtab.store import ledger as ledger_store
from trimtab.store.models import jobs


def _jobs(engine, n: int) -> list[int]:
    with engine.begin() as c:
        return [c.execute(insert(jobs).values(name=f"j{i}", ranks=1, device_map={}, hostnames=["h"], knobs={},
                                              mode="off", created_ms=0, updated_ms=0).returning(jobs.c.id)).scalar_one()
                for i in range(n)]


def test_several_first_advances_then_moves_and_a_lost_race(store_engine):
    ids = _jobs(store_engine, 3)
    cell = ("h", 0, "idle", "", "no_job", "")
    assert ledger_store.accumulate(store_engine, {i: (None, 1000, {cell: 1.0}) for i in ids})
    assert ledger_store.ledger_through(store_engine, ids) == {i: 1000 for i in ids}
    assert ledger_store.accumulate(store_engine, {i: (1000, 2000, {cell: 1.0}) for i in ids})
    assert not ledger_store.accumulate(store_engine, {ids[0]: (1000, 3000, {cell: 5.0})})  # already at 2000
    assert not ledger_store.accumulate(store_engine, {ids[1]: (None, 3000, {cell: 5.0})})  # already started
    assert [r.gpu_s for r in ledger_store.accumulated(store_engine)] == [2.0, 2.0, 2.0]
    assert ledger_store.ledger_through(store_engine, ids) == {i: 2000 for i in ids}
