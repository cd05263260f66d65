"""What the reporter has not sent yet, and the exact count of what became of every report.

The training thread only appends to a bounded in-memory queue (``put``: a lock and a deque, never a disk or a
socket). The reporter thread takes the oldest reports (``take``), says how their POST went (``confirmed``,
``refused``, ``failed``), and moves the memory queue to a disk spool (:mod:`trimtab.trainer.report_spool`) once it
holds half of ``queue_max`` — which it does only while the reports cannot go as fast as they come (a head outage,
a long backlog). The order is kept: the spool holds the oldest reports, memory the newest, and the reports in
flight are the front of both.

Counts, kept so that ``submitted == sent + rejected + dropped + unconfirmed + pending`` at every moment:

* ``sent``: the server confirmed them (``stored`` new by that answer, ``already_stored``: it had them — a POST whose
  answer was lost, resent); ``late``: of those, the ones that waited out an outage (resent after a failed POST, or
  read back from disk);
* ``rejected``: the server refused them (422);
* ``dropped``: lost without the server ever having them, by reason (``dropped_by``: ``queue_full`` with no spool,
  ``spool_full``, ``disk_error``, ``closed`` while some were still waiting);
* ``unconfirmed``: lost after a POST that got no answer (a timeout, a 5xx): the server may have stored them;
* ``pending``: still to send (memory, disk, in flight).

With the spool, the newest ``queue_max`` reports and the spool's oldest ``spool_max_bytes`` survive any outage; a
report is dropped only once both are full (the middle of the outage goes), and it is said once an outage.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional

from trimtab.trainer.report_spool import DOUBT, ReportSpool, spool_dir_name
from trimtab.paths import state_dir

log = logging.getLogger("trimtab.trainer")

RETRIED = 1  # a flag bit: a POST of the report failed once (it goes again)
SPOOL_MAX_BYTES = 64 * 1024 * 1024  # ≈ 100 000 reports of a GPU job (300–700 bytes each): 80 min at 20 steps/s
SPOOL_RETRY_S = 60.0  # after a disk error, the spool is tried again this long after
QUEUE_FULL, SPOOL_FULL, DISK_ERROR, CLOSED = "queue_full", "spool_full", "disk_error", "closed"
_serials = itertools.count(1)


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
        self.queue_max, self.spill_at = int(queue_max), max(1, int(queue_max) // 2)
        self._name = name
        self.spool_dir = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        self.spool_max_bytes = int(spool_max_bytes)
        self._lock = threading.Lock()
        self._memory: deque[list] = deque()  # [report, flags]
        self._spool: Optional[ReportSpool] = None
        self._spool_down_until = float("-inf")  # after a disk error: no spool until then
        self._full = False  # the spool refused reports for its bound (until it takes all it is given again)
        self._spool_bytes_peak = 0  # of the spools given up
        self._flight: list[list] = []  # the reports taken and not settled
        self._flight_from_spool = False
        self._moving = 0  # reports between memory and the spool (the reporter thread writing them)
        self._closed = False
        self._said: set[str] = set()  # what was said this outage
        self.submitted = self.sent = self.stored = self.already_stored = self.late = 0
        self.rejected = self.unconfirmed = self.spooled = self.spool_errors = 0
        self.dropped_by: dict[str, int] = {}

    # -- the training thread ------------------------------------------------------------------------------------

    def put(self, report: dict) -> int:
        """Queues ``report`` (the oldest in memory goes when it is full, counted); how many memory holds."""
        with self._lock:
            self.submitted += 1
            if self._closed:
                self._count_drop(0, CLOSED)
                return 0
            if len(self._memory) >= self.queue_max:
                self._drop_oldest()
            self._memory.append([report, 0])
            return len(self._memory)

    # -- the reporter thread ------------------------------------------------------------------------------------

    def take(self, n: int) -> list[dict]:
        """The oldest ``n`` reports at most (fewer at a spool segment's end), kept as in flight until settled."""
        spool = self._spool
        if spool is not None and spool.records:
            try:
                self._flight, self._flight_from_spool = spool.peek(n), True
                if not self._flight:
                    raise OSError(f"{spool.records} reports on record, none readable")
                return [item[0] for item in self._flight]
            except OSError as exc:
                self._spool_failed(exc)
        with self._lock:
            self._flight = [self._memory.popleft() for _ in range(min(n, len(self._memory)))]
            self._flight_from_spool = False
        return [item[0] for item in self._flight]

    def confirmed(self, stored: int) -> None:
        """The server has every report in flight; ``stored`` of them are new to it."""
        flight = self._flight
        stored = max(0, min(int(stored), len(flight)))
        with self._lock:
            self.sent += len(flight)
            self.stored += stored
            self.already_stored += len(flight) - stored
            self.late += sum(1 for item in flight if self._flight_from_spool or item[1] & RETRIED)
        self._settle()

    def refused(self) -> None:
        """The server refused the report in flight (422): it will never take it."""
        with self._lock:
            self.rejected += len(self._flight)
        self._settle()

    def failed(self, retried: bool, in_doubt: bool = False) -> None:
        """The reports in flight go back to the front, in order. ``retried``: a failed POST (they go again);
        ``in_doubt``: it got no answer, so the server may have them (counted apart if they are lost)."""
        flight, self._flight = self._flight, []
        bits = (RETRIED if retried else 0) | (DOUBT if in_doubt else 0)
        if self._flight_from_spool:
            if self._spool is not None:
                self._spool.flag(len(flight), bits)
            return
        for item in flight:
            item[1] |= bits
        with self._lock:
            self._memory.extendleft(reversed(flight))
        if len(self._memory) > self.queue_max:
            self.spill(away=retried)
        with self._lock:
            while len(self._memory) > self.queue_max:
                self._drop_oldest()

    def spill(self, away: bool) -> None:
        """Moves the memory queue to the spool once it holds ``spill_at`` reports while the server is ``away``
        (or a backlog is on disk already), three quarters of ``queue_max`` otherwise (a server answering slower
        than the job reports); what the spool cannot take (full, a disk error) stays in memory, whose oldest then
        go as newer ones come."""
        spool = self._spool
        behind = away or (spool is not None and spool.records > 0)
        if len(self._memory) < (self.spill_at if behind else self.queue_max * 3 // 4 or 1) \
                or not self.spool_max_bytes or self._closed:
            return
        spool = self._usable_spool()
        if spool is None or spool.room_bytes < 1024:
            self._note_full(spool)
            return
        with self._lock:
            items = list(self._memory)
            self._memory.clear()
            self._moving = len(items)
        written = 0
        try:
            written = spool.append(items)
        except OSError as exc:
            self._spool_failed(exc)
        with self._lock:
            self.spooled += written
            self._memory.extendleft(reversed(items[written:]))
            self._moving = 0
            while len(self._memory) > self.queue_max:
                self._drop_oldest()
        if written < len(items):
            self._note_full(spool)
        else:
            self._full = False

    def close(self) -> int:
        """Gives up what is still waiting (counted dropped, ``closed``; in flight: unconfirmed) and removes the
        spool; how many reports that was."""
        with self._lock:
            self._closed = True
            lost = len(self._memory) + len(self._flight) * (not self._flight_from_spool)
            for item in self._memory:
                self._count_drop(item[1], CLOSED)
            for item in self._flight if not self._flight_from_spool else ():
                self._count_drop(item[1] | DOUBT, CLOSED)
            self._memory.clear()
            self._flight = []
        spool, self._spool = self._spool, None
        if spool is not None:
            lost += self._lose_spool(spool, CLOSED)
        return lost

    # -- what the counters say ----------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        spool = self._spool
        return (len(self._memory) + (spool.records if spool is not None else 0) + self._moving
                + (0 if self._flight_from_spool else len(self._flight)))

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by.values())

    @property
    def memory_len(self) -> int:
        return len(self._memory)

    @property
    def spool_bytes(self) -> int:
        spool = self._spool
        return spool.bytes if spool is not None else 0

    @property
    def spool_bytes_peak(self) -> int:
        spool = self._spool
        return max(self._spool_bytes_peak, spool.bytes_peak if spool is not None else 0)

    def stats(self) -> dict:
        return {"submitted": self.submitted, "sent": self.sent, "stored": self.stored,
                "already_stored": self.already_stored, "late": self.late, "rejected": self.rejected,
                "dropped": self.dropped, "dropped_by": dict(self.dropped_by), "unconfirmed": self.unconfirmed,
                "pending": self.pending, "spooled": self.spooled, "spool_bytes": self.spool_bytes,
                "spool_bytes_peak": self.spool_bytes_peak, "spool_errors": self.spool_errors}

    def outage_over(self) -> None:
        """The server answers again: what is said once an outage may be said again."""
        self._said.clear()

    def describe(self) -> str:
        """Where reports wait while no server answers, for the "offline" line."""
        if not self.spool_max_bytes:
            return f"the newest {self.queue_max} wait in memory (no spool: the oldest are dropped)"
        return (f"the newest {self.queue_max} wait in memory, older ones on disk under {self.spool_dir} "
                f"(up to {self.spool_max_bytes / 2**20:.0f} MiB)")

    # -- inside --------------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        n, self._flight = len(self._flight), []
        if self._flight_from_spool and self._spool is not None and n:
            try:
                self._spool.commit(n)
            except OSError as exc:
                self._spool_failed(exc)

    def _drop_oldest(self) -> None:
        """Memory is full (lock held): its oldest report goes."""
        item = self._memory.popleft()
        if not self.spool_max_bytes:
            why = QUEUE_FULL
        elif self._spool is None and time.monotonic() < self._spool_down_until:
            why = DISK_ERROR
        else:  # the spool is full, or the reporter thread could not move memory to it in time (a long request)
            why = SPOOL_FULL if self._full else QUEUE_FULL
        self._count_drop(item[1], why)

    def _count_drop(self, flags: int, reason: str) -> None:
        if flags & DOUBT:
            self.unconfirmed += 1
        else:
            self.dropped_by[reason] = self.dropped_by.get(reason, 0) + 1

    def _usable_spool(self) -> Optional[ReportSpool]:
        if self._spool is not None or time.monotonic() < self._spool_down_until:
            return self._spool
        try:
            self._spool = ReportSpool(self.spool_dir / spool_dir_name(self._name, next(_serials)),
                                      self.spool_max_bytes)
        except (OSError, ValueError) as exc:
            self._spool_failed(exc)
            return None
        log.info("trimtab: reports wait on disk in %s (up to %.0f MiB)", self._spool.directory,
                 self.spool_max_bytes / 2**20)
        return self._spool

    def _note_full(self, spool: Optional[ReportSpool]) -> None:
        self._full = spool is not None
        if spool is not None and "full" not in self._said:
            self._said.add("full")
            log.warning("trimtab: the report spool %s is full (%.0f MiB): the reports between its newest and the "
                        "newest %d in memory are dropped until the server is back (counted: dropped_by "
                        "spool_full)", spool.directory, self.spool_max_bytes / 2**20, self.queue_max)

    def _spool_failed(self, exc: Exception) -> None:
        """A disk error: what the spool held is lost (counted), reports wait in memory only for a while."""
        self.spool_errors += 1
        self._spool_down_until = time.monotonic() + SPOOL_RETRY_S
        self._full = False
        spool, self._spool = self._spool, None
        lost = self._lose_spool(spool, DISK_ERROR) if spool is not None else 0
        if "disk" not in self._said:
            self._said.add("disk")
            log.warning("trimtab: cannot use the report spool under %s (%s): %d reports it held are lost; the "
                        "newest %d wait in memory, the spool is tried again in %.0f s (counted: dropped_by "
                        "disk_error, spool_errors)", self.spool_dir, exc, lost, self.queue_max, SPOOL_RETRY_S)

    def _lose_spool(self, spool: ReportSpool, reason: str) -> int:
        """Counts what ``spool`` still held as lost (its doubtful ones: unconfirmed) and removes it."""
        self._spool_bytes_peak = max(self._spool_bytes_peak, spool.bytes_peak)
        lost, doubtful = spool.records, spool.doubtful
        with self._lock:
            self.unconfirmed += doubtful
            if lost - doubtful:
                self.dropped_by[reason] = self.dropped_by.get(reason, 0) + lost - doubtful
            if self._flight_from_spool:
                self._flight = []
        spool.remove()
        return lost
