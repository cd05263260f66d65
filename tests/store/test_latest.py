"""Latest-sample reads cost what is current, not what is stored (issue 39): ingest keeps one row a GPU (and a link)
current in the transaction of the samples, the reads use it, and what they return is what the samples say."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import delete, event, insert

from trimtab.contract.readings import NvlinkSample
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate
from trimtab.store.models import gpu_latest, gpu_nvlink_latest, gpu_samples, gpus, nodes
from trimtab.store.queries import latest_gpu_samples, latest_nvlink_samples, previous_sample_ms
from trimtab.store.rollup import RetentionPolicy, apply_retention
from tests.store.conftest import T0_MS, count, make_batch

SAMPLE_TABLES = ("gpu_samples", "gpu_nvlink_samples")


def with_links(batch, links: int = 2):
    batch.nvlink_samples = [NvlinkSample(s.gpu_uuid, s.ts_ms, link, tx_bytes_per_s=s.util_pct, rx_bytes_per_s=1.0)
                            for s in batch.gpu_samples for link in range(links)]
    return batch


def write_history(engine, ticks: int, start_tick: int = 0, n_gpus: int = 4, per_batch: int = 200) -> None:
    writer = BatchWriter(engine)
    for first in range(start_tick, start_tick + ticks, per_batch):
        writer.write(with_links(make_batch([T0_MS + 1000 * t for t in range(first, first + per_batch)],
                                           n_gpus=n_gpus)))
    writer.close()


@contextmanager
def statements(engine):
    """The SELECTs ``engine`` runs inside the block, with their parameters."""
    seen = []

    def grab(_conn, _cursor, statement, params, _context, _many):
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", grab)


def plan(engine, statement: str, params) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return " | ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params))
        return " | ".join(conn.exec_driver_sql(f"EXPLAIN {statement}", params).scalars())


def test_latest_reads_never_plan_a_read_of_the_sample_tables(store_engine):
    """Before: a scan of gpu_samples with a correlated MAX per row (1.3 s at 870 000 rows on SQLite)."""
    write_history(store_engine, 400)
    end_ms = T0_MS + 400_000
    with statements(store_engine) as seen:
        assert len(latest_gpu_samples(store_engine, not_after_ms=end_ms)) == 4
        assert len(latest_nvlink_samples(store_engine, not_after_ms=end_ms)) == 8
    assert seen
    for statement, params in seen:
        found = plan(store_engine, statement, params)
        assert not any(t in found for t in SAMPLE_TABLES), found


def test_a_gpus_previous_sample_is_one_step_back_on_its_key(store_engine):
    """Asked when a node has one sample in the balance window; PostgreSQL cannot turn MAX over a join into a
    backwards index step, so it read every earlier sample of the GPU."""
    write_history(store_engine, 400)
    with statements(store_engine) as seen:
        assert previous_sample_ms(store_engine, "GPU-0001", T0_MS + 399_000) == T0_MS + 398_000
    with store_engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE gpu_samples")
    found = [plan(store_engine, s, p) for s, p in seen if "gpu_samples" in s]
    assert found and all("Aggregate" not in f and "Bitmap" not in f for f in found), found


def test_the_cost_of_a_latest_read_does_not_grow_with_history(tmp_path):
    """SQLite's virtual-machine steps for the latest reads, with 200 ticks stored and then with 2 000: the same."""
    engine = open_engine(f"sqlite:///{tmp_path}/cost.db")
    migrate(engine)
    steps = [0]

    def count_step() -> int:
        steps[0] += 1
        return 0

    def on_checkout(dbapi_connection, _record, _proxy):
        dbapi_connection.set_progress_handler(count_step, 1)

    def cost(end_ms: int) -> int:
        steps[0] = 0
        event.listen(engine, "checkout", on_checkout)
        try:
            latest_gpu_samples(engine, not_after_ms=end_ms)
            latest_nvlink_samples(engine, not_after_ms=end_ms)
        finally:
            event.remove(engine, "checkout", on_checkout)
        return steps[0]

    write_history(engine, 200)
    small = cost(T0_MS + 200_000)
    write_history(engine, 1800, start_tick=200)
    large = cost(T0_MS + 2_000_000)
    engine.dispose()
    assert small > 0 and large == small, (small, large)


def test_the_latest_row_follows_the_newest_sample_never_a_late_or_replayed_one(store_engine):
    writer = BatchWriter(store_engine)
    writer.write(with_links(make_batch([T0_MS, T0_MS + 1000])))
    writer.write(with_links(make_batch([T0_MS + 5000])))
    writer.write(with_links(make_batch([T0_MS + 2000, T0_MS + 3000])))  # late: older than the newest
    writer.write(with_links(make_batch([T0_MS + 5000], util_pct=99.0)))  # a replay with other values: first wins
    latest = latest_gpu_samples(store_engine)
    assert [(r.gpu_uuid, r.ts_ms, r.metrics["util_pct"]) for r in latest] == [
        ("GPU-0000", T0_MS + 5000, 5.0), ("GPU-0001", T0_MS + 5000, 15.0)]
    links = latest_nvlink_samples(store_engine)
    assert [(r.gpu_uuid, r.link, r.ts_ms, r.metrics["tx_bytes_per_s"]) for r in links] == [
        ("GPU-0000", 0, T0_MS + 5000, 5.0), ("GPU-0000", 1, T0_MS + 5000, 5.0),
        ("GPU-0001", 0, T0_MS + 5000, 15.0), ("GPU-0001", 1, T0_MS + 5000, 15.0)]
    assert count(store_engine, gpu_latest) == 2 and count(store_engine, gpu_nvlink_latest) == 4


def test_a_far_future_sample_does_not_hide_the_real_ones(store_engine):
    writer = BatchWriter(store_engine)
    writer.write(with_links(make_batch([T0_MS, T0_MS + 1000])))
    writer.write(with_links(make_batch([T0_MS + 3_600_000], n_gpus=1)))  # GPU 0's clock an hour ahead
    latest = latest_gpu_samples(store_engine, not_after_ms=T0_MS + 2000)
    assert [(r.gpu_uuid, r.ts_ms, r.metrics["util_pct"]) for r in latest] == [
        ("GPU-0000", T0_MS + 1000, 1.0), ("GPU-0001", T0_MS + 1000, 11.0)]
    assert [r.ts_ms for r in latest_gpu_samples(store_engine)] == [T0_MS + 3_600_000, T0_MS + 1000]
    links = latest_nvlink_samples(store_engine, not_after_ms=T0_MS + 2000)
    assert [(r.gpu_uuid, r.link, r.ts_ms) for r in links] == [
        ("GPU-0000", 0, T0_MS + 1000), ("GPU-0000", 1, T0_MS + 1000),
        ("GPU-0001", 0, T0_MS + 1000), ("GPU-0001", 1, T0_MS + 1000)]
    assert latest_gpu_samples(store_engine, not_after_ms=T0_MS - 1) == []


def test_a_link_that_stopped_reporting_leaves_the_gpus_newest_reading(store_engine):
    writer = BatchWriter(store_engine)
    writer.write(with_links(make_batch([T0_MS], n_gpus=1), links=3))
    writer.write(with_links(make_batch([T0_MS + 1000], n_gpus=1), links=2))  # link 2 no longer reads
    assert [(r.link, r.ts_ms) for r in latest_nvlink_samples(store_engine)] == [(0, T0_MS + 1000), (1, T0_MS + 1000)]


def test_retention_keeps_the_last_reading_a_gpu_had_and_deleting_the_gpu_drops_it(store_engine):
    """A GPU whose raw rows all aged out still has the reading it last sent (the live views judge its age and
    leave it out when old); the row goes only with the GPU itself."""
    write_history(store_engine, 10, n_gpus=2, per_batch=10)
    deleted = apply_retention(store_engine, T0_MS + 30 * 86_400_000, RetentionPolicy())
    assert deleted["gpu_samples"] == 20 and count(store_engine, gpu_samples) == 0
    assert [(r.gpu_uuid, r.ts_ms) for r in latest_gpu_samples(store_engine)] == [
        ("GPU-0000", T0_MS + 9000), ("GPU-0001", T0_MS + 9000)]
    with store_engine.begin() as conn:
        conn.execute(delete(gpus).where(gpus.c.uuid == "GPU-0000"))
    assert [r.gpu_uuid for r in latest_gpu_samples(store_engine)] == ["GPU-0001"]
    assert count(store_engine, gpu_latest) == 1 and {r.gpu_uuid for r in latest_nvlink_samples(store_engine)} == {
        "GPU-0001"}


def test_the_migration_fills_the_latest_rows_of_a_store_written_before_it(store_url):
    engine = open_engine(store_url)
    migrate(engine, "0011")
    with engine.begin() as conn:
        node_id = conn.execute(insert(nodes).returning(nodes.c.id), {
            "hostname": "old-node", "simulated": False, "first_seen_ms": T0_MS, "last_seen_ms": T0_MS}).scalar_one()
        ids = [conn.execute(insert(gpus).returning(gpus.c.id), {
            "node_id": node_id, "uuid": f"GPU-OLD{i}", "gpu_index": i, "name": "H200", "gpm_supported": False,
        }).scalar_one() for i in range(2)]
        conn.execute(insert(gpu_samples), [{"gpu_id": g, "ts_ms": T0_MS + 1000 * t, "util_pct": 10.0 * g + t}
                                           for g in ids for t in range(5)])
        conn.exec_driver_sql(
            "INSERT INTO gpu_nvlink_samples (gpu_id, ts_ms, link, tx_bytes_per_s) VALUES "
            f"({ids[0]}, {T0_MS}, 0, 1.0), ({ids[0]}, {T0_MS + 4000}, 0, 2.0), ({ids[0]}, {T0_MS + 4000}, 1, 3.0)")
    migrate(engine)
    latest = latest_gpu_samples(engine)
    assert [(r.gpu_uuid, r.ts_ms, r.metrics["util_pct"]) for r in latest] == [
        ("GPU-OLD0", T0_MS + 4000, 10.0 * ids[0] + 4), ("GPU-OLD1", T0_MS + 4000, 10.0 * ids[1] + 4)]
    assert [(r.link, r.ts_ms, r.metrics["tx_bytes_per_s"]) for r in latest_nvlink_samples(engine)] == [
        (0, T0_MS + 4000, 2.0), (1, T0_MS + 4000, 3.0)]
    engine.dispose()
