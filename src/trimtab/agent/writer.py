"""The writer thread: takes batches from the sampler and gets each into the sink exactly once.

The sampler never waits on I/O: it hands a batch to :meth:`Writer.submit` and goes back to its tick. The writer
merges what has queued up into one write, and when the sink is down it appends to the on-disk spool, retries
with backoff, and on recovery replays the spool in order *before* newer data. Overflow of the spool and batches
the sink refuses are logged, kept or recorded as health events — never dropped silently.

A sink that refuses the agent as configured (:class:`~trimtab.contract.sink.SinkMisconfigured`: no such database,
a refused token) is not an outage: the writer says so once, marks itself ``failed`` and from then on only spools
(nothing is lost; once the configuration is fixed, the next start replays it). The agent stops on it.

Drops are counted in the spool (on disk, across restarts) until a ``spool_dropped`` event saying how many rows
were lost has been written to the sink itself. The event travels alone, never inside a batch that could be
spooled and dropped in turn, and one event covers every drop since the last one that arrived.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trimtab.contract.readings import EVENT_SPOOL_DROPPED, Batch, HealthEvent, NodeInfo
from trimtab.contract.sink import Sink, SinkMisconfigured, SinkUnavailable
from trimtab.agent.spool import Dropped, Spool

log = logging.getLogger(__name__)


@dataclass
class WriterStatus:
    rows_written: int = 0
    batches_spooled: int = 0
    batches_rejected: int = 0
    rows_dropped: int = 0
    sink_ok: bool = True
    sink_down_since: Optional[float] = None
    last_error: Optional[str] = None
    spool_bytes: int = 0
    failed: Optional[str] = None  # the sink refuses this configuration: what to fix (waiting will not help)


class Writer:
    def __init__(
        self,
        sink: Sink,
        spool: Spool,
        *,
        max_batch_rows: int = 5000,
        retry_min_s: float = 0.5,
        retry_max_s: float = 30.0,
        queue_max_batches: int = 1000,
    ):
        self.sink = sink
        self.spool = spool
        self.max_batch_rows = max_batch_rows
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self._queue: queue.Queue[Batch] = queue.Queue(maxsize=queue_max_batches)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._retry_at = 0.0
        self._retry_delay_s = retry_min_s
        self._node: Optional[NodeInfo] = None  # the node of the latest batch: the drop events' node
        self.status = WriterStatus(spool_bytes=spool.pending_bytes())

    # -- sampler side ----------------------------------------------------------------------------------------------
    def submit(self, batch: Batch) -> None:
        """Hand over a batch; never blocks. If the writer is stuck inside a long write, spool directly."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._spool(batch)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def start(self) -> "Writer":
        self._thread = threading.Thread(target=self._run, name="trimtab-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Flush: write what is queued (or spool it if the sink is down), then stop the thread. If the sink is
        up, the spool is replayed first for up to ``timeout_s`` so a clean stop leaves nothing behind; what
        remains stays on disk for the next start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if not self.spool.is_empty() and self.status.failed is None:
            self._replay()  # one more try even if the sink was down at the last attempt: it may be back
        self._drain_and_flush()
        self.sink.close()

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.2)
            except queue.Empty:
                first = None
            try:
                self._cycle(first)
            except Exception as exc:  # the loop must survive anything; nothing is lost (see _cycle)
                log.exception("writer cycle failed: %s", exc)
                self.status.last_error = str(exc)

    def _take_queued(self, first: Optional[Batch]) -> list[Batch]:
        batches = [first] if first is not None else []
        while True:
            try:
                batches.append(self._queue.get_nowait())
            except queue.Empty:
                return batches

    def _cycle(self, first: Optional[Batch]) -> None:
        for merged in self._merge(self._take_queued(first)):
            self._deliver(merged)
        if self.status.failed is not None:  # only a new configuration helps: keep what comes on disk
            self.status.spool_bytes = self.spool.pending_bytes()
            return
        retry_due = self.status.sink_ok or time.monotonic() >= self._retry_at  # also when no batch came in
        if retry_due and not self.spool.is_empty():
            self._replay()
        if retry_due and (self.status.sink_ok or self.spool.is_empty()):
            self._report_drops()
        if self.status.sink_ok:  # the sink keeps the schedule (a store sink: trimtab.store.rollup.Upkeep)
            try:
                self.sink.maintenance(int(time.time() * 1000))
            except Exception as exc:
                log.warning("store maintenance failed (will retry): %s", exc)
        self.status.spool_bytes = self.spool.pending_bytes()

    def _merge(self, batches: list[Batch]) -> list[Batch]:
        """Fold consecutive batches of one node into writes of at most ``max_batch_rows`` rows."""
        out: list[Batch] = []
        for b in batches:
            if b.node is not None:
                self._node = b.node
            last = out[-1] if out else None
            if last is not None and last.node == b.node and last.row_count() + b.row_count() <= self.max_batch_rows:
                last.extend(b)
            else:
                out.append(b.copy())
        return out

    def _deliver(self, batch: Batch) -> None:
        # Order: while anything is spooled, newer batches queue up behind it on disk.
        if self.status.failed is not None or (not self.status.sink_ok and time.monotonic() < self._retry_at):
            self._spool(batch)
            return
        if not self.spool.is_empty():
            if not self._replay():
                self._spool(batch)
                return
        self._write(batch, spool_on_failure=True)

    def _write(self, batch: Batch, spool_on_failure: bool) -> bool:
        try:
            rows = self.sink.write(batch)
        except SinkMisconfigured as exc:
            self._fail(str(exc))
            if spool_on_failure:
                self._spool(batch)
            return False
        except SinkUnavailable as exc:
            self._mark_down(str(exc))
            if spool_on_failure:
                self._spool(batch)
            return False
        except Exception as exc:
            self._reject(batch, exc)
            return True  # handled: kept aside, do not retry it
        self._mark_up()
        self.status.rows_written += rows
        return True

    def _replay(self) -> bool:
        """Write spooled batches oldest first; stop at the first failure. True when the spool is empty."""
        while True:
            items = self.spool.peek(limit=64)
            if not items:
                return True
            for item in items:
                if not self._write(item.batch, spool_on_failure=False):
                    return False
                self.spool.ack(item)
            log.info("replayed %d spooled batches", len(items))

    def _spool(self, batch: Batch) -> None:
        dropped = self.spool.append(batch)
        if not dropped or dropped[-1].segment != "-":
            self.status.batches_spooled += 1
        if dropped:
            self._record_drop(dropped)

    def _record_drop(self, dropped: list[Dropped]) -> None:
        batches, rows = sum(d.batches for d in dropped), sum(d.rows for d in dropped)
        self.status.rows_dropped += rows
        self.status.last_error = f"spool: dropped {rows} rows ({'; '.join(sorted({d.reason for d in dropped}))})"
        self.spool.record_drops(batches, rows)

    def _report_drops(self) -> None:
        """Write one ``spool_dropped`` event for every drop not yet reported; the count stays pending until the
        sink has stored it (sink down: the next cycle tries again, with whatever was dropped since)."""
        batches, rows = self.spool.unreported_drops()
        if not (batches or rows) or self._node is None:
            return
        event = HealthEvent(ts_ms=int(time.time() * 1000), kind=EVENT_SPOOL_DROPPED,
                            detail=drop_detail(batches, rows, self.spool.directory))
        report = Batch(node=self._node, events=[event])
        if self._write(report, spool_on_failure=False):
            self.spool.drops_reported(batches, rows)

    def _reject(self, batch: Batch, exc: Exception) -> None:
        """The sink refused this batch for a reason retrying will not fix: keep it on disk and say where."""
        rejected_dir = Path(self.spool.directory) / "rejected"
        path = rejected_dir / f"{int(time.time() * 1000)}-{self.status.batches_rejected}.json"
        self.status.batches_rejected += 1
        self.status.last_error = f"batch refused: {exc}"
        try:
            rejected_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(batch.to_json())
        except OSError as disk:
            path.unlink(missing_ok=True)
            log.error("the store refused a batch of %d rows (%s) and it cannot be kept (%s): dropped",
                      batch.row_count(), exc, disk)
            self._record_drop([Dropped(1, batch.row_count(), "-", f"refused by the store, not kept: {disk}")])
            return
        log.error("the store refused a batch of %d rows (%s); kept in %s", batch.row_count(), exc, path)

    def _fail(self, error: str) -> None:
        """Said once: the sink refuses this configuration, so retrying is pointless; the batches stay spooled."""
        if self.status.failed is None:
            log.error("%s refuses this agent: %s. Nothing more is sent; batches stay in %s until trimtab is "
                      "started with a corrected configuration", self.sink.description, error, self.spool.directory)
        self.status.failed = error
        self.status.sink_ok = False
        self.status.last_error = error

    def _mark_down(self, error: str) -> None:
        if self.status.sink_ok:
            log.warning("%s unreachable, spooling to %s: %s", self.sink.description, self.spool.directory, error)
            self.status.sink_down_since = time.time()
            self._retry_delay_s = self.retry_min_s
        else:
            self._retry_delay_s = min(self._retry_delay_s * 2, self.retry_max_s)
        self.status.sink_ok = False
        self.status.last_error = error
        self._retry_at = time.monotonic() + self._retry_delay_s

    def _mark_up(self) -> None:
        if not self.status.sink_ok:
            down_s = time.time() - (self.status.sink_down_since or time.time())
            log.warning("%s reachable again after %.0f s; replaying the spool", self.sink.description, down_s)
        self.status.sink_ok = True
        self.status.sink_down_since = None

    def _drain_and_flush(self) -> None:
        batches = self._merge(self._take_queued(None))
        for b in batches:
            if self.status.failed is None and self.status.sink_ok and self.spool.is_empty():
                if self._write(b, spool_on_failure=True):
                    continue
            else:
                self._spool(b)
        if self.status.sink_ok and self.status.failed is None:
            self._report_drops()  # else the count waits on disk for the next start
        self.status.spool_bytes = self.spool.pending_bytes()


DROP_DETAIL = "spool dropped {rows} rows in {batches} batches"


def drop_detail(batches: int, rows: int, spool_dir) -> str:
    """The ``spool_dropped`` event's text; tools may parse its first words (``DROP_DETAIL``) for the counts."""
    return (DROP_DETAIL.format(rows=rows, batches=batches)
            + f" since the last report ({spool_dir}: over its bound, or the disk was full)")
