"""After a node's clock steps back, its latest rows follow it (issue 39, item 4): the node's current readings
stamp older than the held row from before the step, and replaced it only once real time caught up with the step
(an hour's step: an hour of a frozen /metrics, /v1/gpus and balance). Now a reading whose time on the receiver's
clock (stamp + the node's skew) is STEP_BACK_MARGIN_MS newer replaces it — on SQLite and PostgreSQL, over HTTP's
ingest and an agent's own writes alike; a batch whose skew is not known keeps the stamp-only rule."""

import time

from trimtab.contract.readings import STEP_BACK_MARGIN_MS
from trimtab.store.ingest import BatchWriter
from trimtab.store.queries import latest_gpu_samples, latest_nvlink_samples
from trimtab.store.sink import StoreSink
from tests.store.conftest import T0_MS, make_batch
from tests.store.test_latest import with_links

HOUR_MS = 3_600_000


def latest(engine) -> tuple[set[int], set[int]]:
    """(the GPUs' latest stamps, the links' latest stamps)."""
    return ({s.ts_ms for s in latest_gpu_samples(engine)}, {n.ts_ms for n in latest_nvlink_samples(engine)})


def test_a_node_whose_clock_stepped_back_an_hour_is_followed_after_the_margin(store_engine):
    writer = BatchWriter(store_engine)
    before = T0_MS + 10_000  # the node's clock right: skew 0
    writer.write(with_links(make_batch([before - 1000, before])), now_ms=before, skew_ms=0)
    assert latest(store_engine) == ({before}, {before})
    # One second later by the receiver, the node's clock an hour back: its readings stamp an hour older.
    after = before + 1000 - HOUR_MS
    writer.write(with_links(make_batch([after])), now_ms=before + 1000, skew_ms=HOUR_MS)
    assert latest(store_engine) == ({before}, {before}), "within the margin a trip's jitter could explain: held"
    # Past the margin, on the receiver's clock: the node's current reading, however old its stamp.
    late = after + STEP_BACK_MARGIN_MS + 1000
    writer.write(with_links(make_batch([late])), now_ms=before + STEP_BACK_MARGIN_MS + 2000, skew_ms=HOUR_MS)
    assert latest(store_engine) == ({late}, {late})
    (gpu0,) = [s for s in latest_gpu_samples(store_engine) if s.gpu_uuid == "GPU-0000"]
    assert gpu0.metrics["util_pct"] == (late - T0_MS) / 1000, "the values of the node's newest tick"
    writer.write(with_links(make_batch([late + 1000])), now_ms=before + STEP_BACK_MARGIN_MS + 3000, skew_ms=HOUR_MS)
    assert latest(store_engine) == ({late + 1000}, {late + 1000}), "then by stamp, as always"
    writer.close()


def test_a_batch_from_before_the_step_replayed_after_it_holds_the_place_no_longer_than_the_margin(store_engine):
    writer = BatchWriter(store_engine)
    now = T0_MS + 100_000
    writer.write(make_batch([now - HOUR_MS]), now_ms=now, skew_ms=HOUR_MS)  # an hour behind, current
    # A batch spooled before the step (right clock), sent now: its stamp + today's skew would be an hour ahead.
    writer.write(make_batch([now - 30_000]), now_ms=now + 500, skew_ms=HOUR_MS)
    assert latest(store_engine)[0] == {now - 30_000}, "newer by its stamp: taken (the rule of the stamps)"
    current = now - HOUR_MS + STEP_BACK_MARGIN_MS + 2000
    writer.write(make_batch([current]), now_ms=now + STEP_BACK_MARGIN_MS + 2000, skew_ms=HOUR_MS)
    assert latest(store_engine)[0] == {current}, "its receiver time was capped at its arrival: the node wins back"
    writer.close()


def test_without_a_known_skew_the_stamp_alone_decides_as_before(store_engine):
    writer = BatchWriter(store_engine)
    writer.write(make_batch([T0_MS]))
    writer.write(make_batch([T0_MS - HOUR_MS]))
    writer.write(make_batch([T0_MS - HOUR_MS]), now_ms=T0_MS + HOUR_MS, skew_ms=HOUR_MS)  # the held row has none
    assert latest(store_engine)[0] == {T0_MS}
    writer.close()


def test_an_agent_writing_its_store_follows_its_own_clock_stepping_back(store_url):
    offset = [0]

    def node_clock() -> int:
        return time.time_ns() // 1_000_000 + offset[0]

    sink = StoreSink(store_url, clock_ms=node_clock)
    try:
        sampled = node_clock() - STEP_BACK_MARGIN_MS - 2000  # a batch a few seconds old as it is written
        sink.write(make_batch([sampled]))
        assert latest(sink.engine)[0] == {sampled}
        offset[0] = -HOUR_MS  # the node's clock steps back an hour
        now = node_clock()
        sink.write(make_batch([now]))
        assert latest(sink.engine)[0] == {now}, "the node's reading of now, an hour behind by its stamp"
    finally:
        sink.close()
