"""An agent writing its store itself (`agent --db`) applies the rule a server's ingest applies: a batch dated more
than MAX_CLOCK_AHEAD_S ahead of the store's clock is refused (the writer keeps it aside), the node stays listed
with why, and one clock_skew event says so; the store's clock (PostgreSQL's) is the reference."""

import time

import pytest

from trimtab.agent.spool import Spool
from trimtab.agent.writer import Writer
from trimtab.contract.readings import EVENT_CLOCK_SKEW
from trimtab.contract.sink import BatchRefused
from trimtab.store.clocks import node_clocks_by_host, store_now_ms
from trimtab.store.engine import open_engine
from trimtab.store.models import gpu_samples
from trimtab.store.queries import health_events
from trimtab.store.sink import StoreSink
from tests.store.conftest import NODE, count, make_batch
from tests.support.waits import eventually

HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_batch_an_hour_ahead_of_the_store_is_refused_as_over_http(store_url):
    sink = StoreSink(store_url)
    try:
        assert sink.write(make_batch([now_ms() - 1000, now_ms()])) > 0
        for _ in range(3):
            ahead = r"gpu_samples\[0\]: ts_ms \d+ is 3[56]\d\d s ahead of the store's clock"
            with pytest.raises(BatchRefused, match=ahead):
                sink.write(make_batch([now_ms() + HOUR_MS]))
        engine = sink.engine
        assert count(engine, gpu_samples) == 2 * 2, "nothing of the refused batches was stored"
        clock = node_clocks_by_host(engine)[NODE.hostname]
        assert clock.refused_ms is not None and "s ahead of the store's clock" in clock.refused_detail
        assert abs(clock.clock_skew_ms) < 1000, "this node's clock is the store's here"
        refused = [e for e in health_events(engine) if e.kind == EVENT_CLOCK_SKEW]
        assert len(refused) == 1 and refused[0].detail.startswith("batch refused"), refused
    finally:
        sink.close()


def test_the_writer_keeps_a_refused_batch_aside_and_goes_on(tmp_path, sqlite_url):
    sink = StoreSink(sqlite_url)
    writer = Writer(sink, Spool(tmp_path / "spool"))
    writer.start()
    writer.submit(make_batch([now_ms() + HOUR_MS]))
    eventually(lambda: writer.status.batches_rejected == 1, timeout_s=30)
    writer.submit(make_batch([now_ms()]))
    writer.stop()
    assert writer.status.batches_rejected == 1 and "s ahead of the store's clock" in writer.status.last_error
    assert len(list((tmp_path / "spool" / "rejected").glob("*.json"))) == 1
    engine = open_engine(sqlite_url)
    try:
        assert count(engine, gpu_samples) == 2, "the batch in time was stored"
    finally:
        engine.dispose()


def test_the_store_clock_is_the_database_servers(engine):
    assert abs(store_now_ms(engine) - now_ms()) < 2000  # one machine here: the same clock, read two ways
