"""A full spool disk (a real tmpfs that answers ENOSPC): every dropped row is counted, a ``spool_dropped`` event
saying how many reaches the store, and the spool drains once the store returns, even while the disk stays full."""

from __future__ import annotations

import re
import threading
import time

from trimtab.contract.readings import EVENT_SPOOL_DROPPED, Batch, GpuSample, NodeInfo
from trimtab.contract.sink import SinkUnavailable
from trimtab.agent.spool import Spool
from trimtab.agent.writer import DROP_DETAIL, Writer
from tests.support.tmpfs import fill, free_bytes

NODE = NodeInfo(hostname="full-disk")
ROWS_PER_BATCH = 8


def batch(i: int) -> Batch:
    return Batch(node=NODE, gpu_samples=[GpuSample(gpu_uuid=f"GPU-{g}", ts_ms=1_000_000 + i, util_pct=float(g))
                                         for g in range(ROWS_PER_BATCH)])


class MemorySink:
    """A sink that keeps what it is given and can be switched off (SinkUnavailable), like a store that goes away."""

    description = "memory"

    def __init__(self):
        self.up = True
        self.samples: set[tuple[str, int]] = set()
        self.events = []
        self.lock = threading.Lock()

    def write(self, b: Batch) -> int:
        if not self.up:
            raise SinkUnavailable("switched off")
        with self.lock:
            self.samples.update((s.gpu_uuid, s.ts_ms) for s in b.gpu_samples)
            self.events.extend(b.events)
        return b.row_count()

    def maintenance(self, now_ms: int) -> None:
        pass

    def close(self) -> None:
        pass

    def reported_drops(self) -> int:
        pattern = re.compile(DROP_DETAIL.replace("{rows}", r"(\d+)").replace("{batches}", r"\d+"))
        return sum(int(pattern.match(e.detail).group(1)) for e in self.events if e.kind == EVENT_SPOOL_DROPPED)


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def drain(spool: Spool) -> int:
    batches = 0
    while items := spool.peek(limit=5):
        for it in items:
            spool.ack(it)
            batches += 1
    return batches


def test_appends_on_a_full_disk_return_what_was_dropped_and_never_tear_a_line(small_disk):
    disk = small_disk(256 * 1024)
    spool = Spool(disk / "spool", max_bytes=64 * 1024 * 1024, segment_bytes=16 * 1024)
    fill(disk, leave_bytes=40 * 1024)
    kept_or_dropped = dropped_batches = 0
    for i in range(400):
        dropped = spool.append(batch(i))
        dropped_batches += sum(d.batches for d in dropped)
        kept_or_dropped += 1
    assert dropped_batches > 0, "a 40 kB remainder cannot hold 400 batches"
    assert spool.corrupt_lines_skipped == 0
    assert free_bytes(disk) < 16 * 1024
    replayed = drain(spool)
    assert spool.corrupt_lines_skipped == 0, "a failed append left no torn line behind"
    assert replayed + dropped_batches == 400


def test_replay_drains_the_spool_while_the_disk_stays_full(small_disk):
    disk = small_disk(256 * 1024)
    spool = Spool(disk / "spool", segment_bytes=8 * 1024)
    for i in range(60):
        assert spool.append(batch(i)) == []
    fill(disk)  # not one byte left: the cursor must still move
    assert drain(spool) == 60
    assert spool.is_empty()
    assert drain(Spool(disk / "spool", segment_bytes=8 * 1024)) == 0, "a restart does not replay it again"


def test_a_full_disk_and_a_store_outage_lose_nothing_silently_and_the_spool_drains(small_disk):
    disk = small_disk(512 * 1024)
    sink = MemorySink()
    writer = Writer(sink, Spool(disk / "spool", segment_bytes=16 * 1024), retry_min_s=0.05, retry_max_s=0.1).start()
    try:
        writer.submit(batch(0))
        wait_for(lambda: len(sink.samples) == ROWS_PER_BATCH)
        sink.up = False
        filler = fill(disk, leave_bytes=64 * 1024)
        for i in range(1, 300):
            writer.submit(batch(i))
            time.sleep(0.002)
        wait_for(lambda: writer._queue.empty())
        assert writer.status.rows_dropped > 0, "64 kB cannot hold 299 batches"
        sink.up = True  # the store is back; the disk is still full
        wait_for(lambda: writer.spool.is_empty() and writer.spool.unreported_drops() == (0, 0))
        assert filler.exists()
        produced = 300 * ROWS_PER_BATCH
        assert len(sink.samples) + writer.status.rows_dropped == produced
        assert sink.reported_drops() == writer.status.rows_dropped, "the store hears of every dropped row"
        filler.unlink()  # space again: nothing more is dropped
        dropped_before = writer.status.rows_dropped
        sink.up = False
        for i in range(300, 320):
            writer.submit(batch(i))
        wait_for(lambda: writer._queue.empty() and writer.status.batches_spooled >= 20)
        sink.up = True
        wait_for(lambda: writer.spool.is_empty() and len(sink.samples) == produced - dropped_before + 20 * ROWS_PER_BATCH)
        assert writer.status.rows_dropped == dropped_before
    finally:
        writer.stop()


def test_the_drop_count_survives_a_restart_until_the_store_has_it(tmp_path):
    sink = MemorySink()
    sink.up = False
    spool = Spool(tmp_path / "spool", max_bytes=2000, segment_bytes=500)
    writer = Writer(sink, spool, retry_min_s=0.05, max_batch_rows=ROWS_PER_BATCH).start()
    for i in range(40):
        writer.submit(batch(i))
    writer.stop()
    lost = writer.status.rows_dropped
    assert lost > 0 and Spool(tmp_path / "spool", max_bytes=2000, segment_bytes=500).unreported_drops()[1] == lost
    sink.up = True
    again = Writer(sink, Spool(tmp_path / "spool", max_bytes=2000, segment_bytes=500), retry_min_s=0.05).start()
    again.submit(batch(100))
    wait_for(lambda: again.spool.unreported_drops() == (0, 0))
    again.stop()
    assert sink.reported_drops() == lost
    assert len(sink.samples) + lost == 41 * ROWS_PER_BATCH


class Switchable:
    """A real store sink that the test can cut off, as a store that goes away and comes back."""

    def __init__(self, sink):
        self.sink, self.up, self.description = sink, True, sink.description

    def write(self, b: Batch) -> int:
        if not self.up:
            raise SinkUnavailable("cut off by the test")
        return self.sink.write(b)

    def maintenance(self, now_ms: int) -> None:
        pass

    def close(self) -> None:
        self.sink.close()


def test_the_stores_events_account_for_every_row_an_overflowing_spool_dropped(tmp_path):
    from trimtab.store.sink import StoreSink
    from sqlalchemy import func, select

    from trimtab.store.models import gpu_samples
    from trimtab.store.queries import health_events

    sink = Switchable(StoreSink(f"sqlite:///{tmp_path}/store.db"))
    writer = Writer(sink, Spool(tmp_path / "spool", max_bytes=4000, segment_bytes=1000), retry_min_s=0.05,
                    retry_max_s=0.1, max_batch_rows=ROWS_PER_BATCH).start()
    try:
        writer.submit(batch(0))
        wait_for(lambda: writer.status.rows_written == ROWS_PER_BATCH)
        sink.up = False
        for i in range(1, 200):
            writer.submit(batch(i))
        wait_for(lambda: writer._queue.empty() and writer.status.rows_dropped > 0)
        sink.up = True
        wait_for(lambda: writer.spool.is_empty() and writer.spool.unreported_drops() == (0, 0))
    finally:
        writer.stop()
    events = [e for e in health_events(sink.sink.engine) if e.kind == EVENT_SPOOL_DROPPED]
    pattern = re.compile(DROP_DETAIL.replace("{rows}", r"(\d+)").replace("{batches}", r"\d+"))
    reported = sum(int(pattern.match(e.detail).group(1)) for e in events)
    assert reported == writer.status.rows_dropped > 0
    with sink.sink.engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(gpu_samples)).scalar_one()
    assert stored + reported == 200 * ROWS_PER_BATCH, "each row is in the store or in a drop event"
