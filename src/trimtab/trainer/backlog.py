"""What the reporter has not sent yet: a bounded queue in memory with a spool on disk behind it.

The training thread only appends to a bounded in-memory queue (``put``: a lock and a deque, never a disk or a
socket). The reporter thread takes the oldest reports (``take``) and says how their POST went (``confirmed``,
``refused``, ``failed``). A thread of the backlog's own moves the memory queue to a disk spool
(:mod:`trimtab.trainer.report_spool`) once it holds half of ``queue_max`` while the server is away (three quarters
while it answers, slower than the job reports) — apart from the reporter, because the reporter may sit in a
request for its whole timeout while a fast job fills the queue. Order is kept: a failed POST's reports (the
``front``), then the spool, then memory; each report goes once it is confirmed, never before an older one.

Every report is counted (:class:`~trimtab.trainer.report_counts.ReportCounts`, ``counts``): what the server
stored, refused, may have, what was dropped and why, what waits and what was left on disk for the next process.

With the spool, the newest ``queue_max`` reports and the oldest ``spool_max_bytes`` survive any outage; a report
is dropped only once both are full (the middle of the outage goes), and that is said once an outage. They also
survive the process: one killed, or closed while no server answers, leaves its spool, and the job restarted picks
it up (:mod:`trimtab.trainer.report_spool`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional

from trimtab.paths import state_dir
from trimtab.trainer.report_counts import CLOSED, DISK_ERROR, QUEUE_FULL, SPOOL_FULL, ReportCounts
from trimtab.trainer.report_spool import DOUBT, ReportSpool, open_spool, stable_dir_name

log = logging.getLogger("trimtab.trainer")

RETRIED = 1  # a flag bit: a POST of the report failed once (it goes again)
SPOOL_MAX_BYTES = 64 * 1024 * 1024  # ≈ 100 000 reports of a GPU job (300–700 bytes each): 80 min at 20 steps/s
SPOOL_RETRY_S = 60.0  # after a disk error, the spool is tried again this long after
SPOOL_MIN_ROOM_BYTES = 1024  # less room than this: the spool counts as full (no write attempted)
FRONT, SPOOL, MEMORY = "front", "spool", "memory"  # where the reports in flight came from


def default_spool_dir() -> Path:
    """``$TRIMTAB_HOOK_SPOOL_DIR``, else ``hook-spool`` in trimtab's state directory (:mod:`trimtab.paths`)."""
    explicit = os.environ.get("TRIMTAB_HOOK_SPOOL_DIR")
    return Path(explicit) if explicit else state_dir() / "hook-spool"


class Backlog:
    """The reports of one reporter not sent yet. ``spool_dir``: where the spool's directory goes (None: the
    default); ``spool_max_bytes`` its bound (0: no spool, memory only); ``name`` names its directory."""

    def __init__(self, queue_max: int, name: str, spool_dir: Optional[os.PathLike] = None,
                 spool_max_bytes: int = SPOOL_MAX_BYTES):
        if queue_max < 1:
            raise ValueError(f"queue_max must be ≥ 1 report, not {queue_max!r}")
        if spool_max_bytes < 0:
            raise ValueError(f"spool_max_bytes must be ≥ 0 (0: no spool), not {spool_max_bytes!r}")
        self.queue_max = int(queue_max)
        self.spill_at, self._spill_online_at = max(1, self.queue_max // 2), max(1, self.queue_max * 3 // 4)
        self._name = name
        self.spool_dir = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        self.spool_max_bytes = int(spool_max_bytes)
        self.away = False  # the reporter's word: no server answers (spill sooner)
        self._lock = threading.Lock()  # memory, front, counters: held for a few operations, never over I/O
        self._io_lock = threading.Lock()  # the spool, and choosing where the next reports come from
        self._memory: deque[list] = deque()  # [report, flags], the newest
        self._front: list[list] = []  # a failed POST's reports: before the spool
        self._spool: Optional[ReportSpool] = None
        self._spool_down_until = float("-inf")  # after a disk error: no spool until then
        self._full = False  # the spool refused reports for its bound, and has not made room since
        self._spool_bytes_peak = 0  # of the spools given up
        self._flight: list[list] = []  # the reports taken and not settled
        self._flight_from = MEMORY
        self._moving = 0  # reports on their way from memory to the spool
        self._closed = False
        self._said: set[str] = set()  # what was said this outage
        self.counts = ReportCounts()
        self._spill_wake = threading.Event()
        self._spiller: Optional[threading.Thread] = None
        if self.spool_max_bytes and (self.spool_dir / stable_dir_name(name)).is_dir():
            self._pick_up()
        if self.spool_max_bytes:
            self._spiller = threading.Thread(target=self._spill_loop, name=f"trimtab-spool-{name}", daemon=True)
            self._spiller.start()

    # -- the training thread ------------------------------------------------------------------------------------

    def put(self, report: dict) -> int:
        """Queues ``report`` (the oldest goes when memory is full, counted); how many memory holds."""
        with self._lock:
            self.counts.submitted += 1
            if self._closed:
                self.counts.lost(1, 0, CLOSED)
                return 0
            if self._over(1):
                self._drop_oldest()
            self._memory.append([report, 0])
            queued = len(self._memory)
        spool = self._spool
        if self._spiller is not None and not self._full and queued >= (
                self.spill_at if self.away or (spool is not None and spool.records) else self._spill_online_at):
            self._spill_wake.set()
        return queued

    # -- the reporter thread ------------------------------------------------------------------------------------

    def take(self, n: int) -> list[dict]:
        """The oldest ``n`` reports at most (fewer at a spool segment's end), kept as in flight until settled."""
        with self._io_lock:
            spool = self._spool
            with self._lock:
                if self._front:  # a failed POST's reports, and newer ones from memory when none wait on disk
                    self._flight, self._front, self._flight_from = self._front[:n], self._front[n:], FRONT
                    if not self._front and (spool is None or not spool.records):
                        self._flight += [self._memory.popleft()
                                         for _ in range(min(n - len(self._flight), len(self._memory)))]
                    return [item[0] for item in self._flight]
            if spool is not None and spool.records:
                try:
                    self._flight, self._flight_from = spool.peek(n), SPOOL
                    if not self._flight:
                        raise OSError(f"{spool.records} reports on record, none readable")
                    return [item[0] for item in self._flight]
                except OSError as exc:
                    self._spool_failed(exc)
            with self._lock:
                self._flight = [self._memory.popleft() for _ in range(min(n, len(self._memory)))]
                self._flight_from = MEMORY
            return [item[0] for item in self._flight]

    def confirmed(self, stored: int) -> None:
        """The server has every report in flight; ``stored`` of them are new to it."""
        flight = self._flight
        stored = max(0, min(int(stored), len(flight)))
        with self._lock:
            self.counts.sent += len(flight)
            self.counts.stored += stored
            self.counts.already_stored += len(flight) - stored
            self.counts.late += sum(1 for item in flight if self._flight_from == SPOOL or item[1] & RETRIED)
        self._settle()

    def refused(self) -> None:
        """The server refused the reports in flight (422): it will never take them."""
        with self._lock:
            self.counts.rejected += len(self._flight)
        self._settle()

    def failed(self, retried: bool, in_doubt: bool = False) -> None:
        """The reports in flight go back to the front, in order. ``retried``: a failed POST (they go again);
        ``in_doubt``: it got no answer, so the server may have them (counted apart if they are lost)."""
        bits = (RETRIED if retried else 0) | (DOUBT if in_doubt else 0)
        with self._io_lock:
            flight, self._flight = self._flight, []
            if self._flight_from == SPOOL:
                if self._spool is not None:
                    self._spool.flag(len(flight), bits)
                return
            for item in flight:
                item[1] |= bits
            with self._lock:
                self._front[:0] = flight
                while self._over(0):
                    self._drop_oldest()

    def close(self) -> int:
        """Leaves what is still waiting on disk for the next process of this job and rank (counted ``left``; in
        flight: flagged unconfirmed), after the reports on disk and in their order; what the disk cannot take (no
        spool, full, an error) is given up (counted dropped, ``closed``; in flight: unconfirmed). How many reports
        were given up."""
        with self._lock:
            self._closed = True
        self._spill_wake.set()
        if self._spiller is not None:
            self._spiller.join(2.0)
        with self._io_lock:
            with self._lock:
                in_flight = [] if self._flight_from == SPOOL else self._flight
                for item in in_flight:
                    item[1] |= DOUBT  # its POST got no answer
                waiting = [*self._front, *in_flight, *self._memory]
                self._memory.clear()
                self._front, self._flight = [], []
            spool = self._usable_spool() if waiting and self.spool_max_bytes else self._spool
            kept = 0
            if spool is not None and waiting:
                try:
                    kept = spool.append(waiting)
                except OSError as exc:
                    self._spool_failed(exc)
                    spool = None
            with self._lock:
                self.counts.lost(len(waiting) - kept, sum(1 for item in waiting[kept:] if item[1] & DOUBT), CLOSED)
            spool, self._spool = self._spool, None
            if spool is not None and spool.records:
                with self._lock:
                    self.counts.left += spool.records
                self._spool_bytes_peak = max(self._spool_bytes_peak, spool.bytes_peak)
                spool.leave()
                log.info("trimtab: %d reports of %s wait on disk in %s for the next run of this job and rank",
                         spool.records, self._name, spool.directory)
            elif spool is not None:
                self._lose_spool(spool, CLOSED)  # nothing in it: removed
        return len(waiting) - kept

    # -- what the counters say ----------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        spool = self._spool
        return (len(self._memory) + len(self._front) + (spool.records if spool is not None else 0) + self._moving
                + (0 if self._flight_from == SPOOL else len(self._flight)))

    @property
    def on_disk(self) -> int:
        """Reports in the spool (sent before memory's)."""
        spool = self._spool
        return spool.records if spool is not None else 0

    @property
    def memory_len(self) -> int:
        """Reports waiting in memory (not on disk, not in flight)."""
        return len(self._memory) + len(self._front)

    @property
    def spool_bytes(self) -> int:
        spool = self._spool
        return spool.bytes if spool is not None else 0

    @property
    def spool_bytes_peak(self) -> int:
        spool = self._spool
        return max(self._spool_bytes_peak, spool.bytes_peak if spool is not None else 0)

    def stats(self) -> dict:
        c = self.counts
        return {"submitted": c.submitted, "inherited": c.inherited, "left": c.left, "sent": c.sent, "stored": c.stored,
                "already_stored": c.already_stored, "late": c.late, "rejected": c.rejected, "dropped": c.dropped,
                "dropped_by": dict(c.dropped_by), "unconfirmed": c.unconfirmed, "pending": self.pending,
                "spooled": c.spooled, "spool_bytes": self.spool_bytes, "spool_bytes_peak": self.spool_bytes_peak,
                "spool_errors": c.spool_errors}

    def set_away(self, away: bool) -> None:
        """The reporter's word on the servers: ``away`` (none answers: spill sooner) or back. A full spool or a
        disk error is said once an outage: again in the next one that starts with nothing on disk."""
        if away and not self.away:
            spool = self._spool
            if spool is None or not spool.records:
                self._said.clear()
        self.away = away

    def describe(self) -> str:
        """Where reports wait while no server answers, for the "offline" line."""
        if not self.spool_max_bytes:
            return f"the newest {self.queue_max} wait in memory (no spool: the oldest are dropped)"
        return (f"the newest {self.queue_max} wait in memory, older ones on disk under {self.spool_dir} "
                f"(up to {self.spool_max_bytes / 2**20:.3g} MiB)")

    # -- the spill thread -----------------------------------------------------------------------------------------

    def _spill_loop(self) -> None:
        while not self._closed:
            self._spill_wake.wait()  # close() sets it too
            self._spill_wake.clear()
            if not self._closed:
                try:
                    self.spill()
                except Exception:  # a bug here must not end the thread: reports would pile up in memory
                    self._say("bug", logging.ERROR, "trimtab: report spool error", exc_info=True)

    def spill(self) -> None:
        """Moves memory (and the front, when the spool is empty) to the spool once memory holds ``spill_at``
        reports (``away`` or a backlog on disk), three quarters of ``queue_max`` otherwise; what the spool cannot
        take (full, a disk error) stays in memory, whose oldest then go as newer ones come."""
        with self._io_lock:
            spool = self._spool
            behind = self.away or (spool is not None and spool.records > 0)
            if len(self._memory) < (self.spill_at if behind else self._spill_online_at):
                return
            spool = self._usable_spool()
            if spool is None or spool.room_bytes < SPOOL_MIN_ROOM_BYTES:
                self._note_full(spool)
                return
            with self._lock:
                items = list(self._memory)
                if not spool.records:  # the front may go first only while nothing is on disk before it
                    items[:0], self._front = self._front, []
                self._memory.clear()
                self._moving = len(items)
            written = 0
            try:
                written = spool.append(items)
            except OSError as exc:
                self._spool_failed(exc)
            with self._lock:
                self.counts.spooled += written
                self._memory.extendleft(reversed(items[written:]))
                self._moving = 0
                while len(self._memory) > self.queue_max:
                    self._drop_oldest()
            if written < len(items) and self._spool is not None:
                self._note_full(spool)
            else:
                self._full = False

    # -- inside --------------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        with self._io_lock:
            n, self._flight = len(self._flight), []
            spool = self._spool
            if self._flight_from == SPOOL and spool is not None and n:
                try:
                    spool.commit(n)
                except OSError as exc:
                    self._spool_failed(exc)
                if self._full and spool.room_bytes >= SPOOL_MIN_ROOM_BYTES * 4:
                    self._full = False

    def _over(self, coming: int) -> bool:
        """Whether memory would pass ``queue_max`` with ``coming`` more (lock held). Without a spool the front
        counts too (a failed POST's reports go back within the bound); with one it is apart (one POST's reports at
        most, saved to disk by the next spill)."""
        return len(self._memory) + (0 if self.spool_max_bytes else len(self._front)) + coming > self.queue_max

    def _drop_oldest(self) -> None:
        """Memory is full (lock held): its oldest report goes."""
        front = self._front and not self.spool_max_bytes
        item = self._front.pop(0) if front else self._memory.popleft()
        if not self.spool_max_bytes:
            why = QUEUE_FULL
        elif self._spool is None and time.monotonic() < self._spool_down_until:
            why = DISK_ERROR
        else:  # the spool is full, or could not be written as fast as the job reports
            why = SPOOL_FULL if self._full else QUEUE_FULL
        self.counts.lost(1, 1 if item[1] & DOUBT else 0, why)

    def _usable_spool(self) -> Optional[ReportSpool]:
        if self._spool is not None or time.monotonic() < self._spool_down_until:
            return self._spool
        try:
            self._spool = open_spool(self.spool_dir, self._name, self.spool_max_bytes)
        except (OSError, ValueError) as exc:
            self._spool_failed(exc)
            return None
        log.info("trimtab: reports wait on disk in %s (up to %.3g MiB)", self._spool.directory,
                 self.spool_max_bytes / 2**20)
        return self._spool

    def _pick_up(self) -> None:
        """At start: the spool an earlier process of this job and rank left, sent before anything of this one."""
        spool = self._usable_spool()
        if spool is not None and spool.adopted:
            self.counts.inherited = spool.adopted
            log.warning("trimtab: %d reports an earlier run of %s left in %s are sent first", spool.adopted,
                        self._name, spool.directory)

    def _note_full(self, spool: Optional[ReportSpool]) -> None:
        self._full = spool is not None
        if spool is not None:
            self._say("full", logging.WARNING, "trimtab: the report spool %s is full (%.3g MiB): the reports between "
                      "its newest and the newest %d in memory are dropped until the server is back (counted: "
                      "dropped_by spool_full)", spool.directory, self.spool_max_bytes / 2**20, self.queue_max)

    def _spool_failed(self, exc: Exception) -> None:
        """A disk error (io lock held): what the spool held is lost (counted), reports wait in memory only for a
        while."""
        self.counts.spool_errors += 1
        self._spool_down_until = time.monotonic() + SPOOL_RETRY_S
        self._full = False
        spool, self._spool = self._spool, None
        lost = self._lose_spool(spool, DISK_ERROR) if spool is not None else 0
        self._say("disk", logging.WARNING, "trimtab: cannot use the report spool under %s (%s): %d reports it "
                  "held are lost; the newest %d wait in memory, the spool is tried again in %.0f s (counted: "
                  "dropped_by disk_error, spool_errors)", self.spool_dir, exc, lost, self.queue_max, SPOOL_RETRY_S)

    def _lose_spool(self, spool: ReportSpool, reason: str) -> int:
        """Counts what ``spool`` still held as lost (its doubtful ones: unconfirmed) and removes it."""
        self._spool_bytes_peak = max(self._spool_bytes_peak, spool.bytes_peak)
        lost, doubtful = spool.records, spool.doubtful
        with self._lock:
            if self._flight_from == SPOOL:  # the reports in flight are in memory now: their POST decides
                self._flight_from = FRONT
                lost -= len(self._flight)
                doubtful -= sum(1 for item in self._flight if item[1] & DOUBT)
                for item in self._flight:
                    item[1] |= RETRIED  # read back from disk: late, as the others
            self.counts.lost(lost, doubtful, reason)
        spool.remove()
        return lost

    def _say(self, key: str, level: int, msg: str, *args, **kw) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, msg, *args, **kw)
