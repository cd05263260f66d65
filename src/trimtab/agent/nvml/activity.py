"""Per-process GPU activity from NVML: its per-process utilization records, read **off the tick** (by
``trimtab.agent.nvml.activity_reader``'s thread, one call per GPU per read) and added up per pid
(``trimtab.agent.activity``) until the next process rows carry them.

Why off the tick: the call cost 2.7–2.9 ms per GPU on an H100 (driver 580), 7.1× the rest of the tick. Why each
record is an average over the time it covers, and how busy seconds follow from it: ``trimtab.agent.activity``.

The rules, in the order they apply:

* **One call per GPU per read**, passing ``lastSeenTimeStamp`` = the newest record time the previous reads saw,
  so a read covers (that time, the newest record's timestamp], and where each process has one record, each record
  is that process's mean over the whole read (on the H100 and H200, driver 580: ``bench/nvml_process_window.py``
  gives smUtil × the read's span within 1–3 % of a known duty cycle). Not (that time, the record's own timestamp]:
  a process whose last sample came early in the read would be credited a shorter span than its mean was taken
  over (two processes taking turns on the H200: the one whose records lagged read 0.63× its own CUDA-event time).
  A process with several records in one answer (a driver that returns one a sampling period) has each cover the
  time since its previous one. A failed call does not
  move the time on: the next read covers what it missed.
* **The cheapest way that answers**: the first read times each way the bindings have (either NVML function, in one
  C call or through pynvml's two-call wrapper: ``procutil``) and keeps the cheapest; a way that proves absent later
  gives way to the next.
* **The first answer with records is a baseline**: with ``lastSeenTimeStamp`` 0 NVML's records cover time from
  before the agent started, so they are dropped and the interval starts at their newest timestamp. Until then NVML's
  clock has not been seen and every pid is unknown.
* **NOT_FOUND** ("no record since") is an answer: nobody was busy since ``lastSeenTimeStamp``. The interval then
  covers up to the read's wall time less the lag NVML's newest record had behind the wall clock when records last
  came, less ``NOT_FOUND_MARGIN_US`` (a record stamped just before the call but not yet written must still fall
  after it), and ``lastSeenTimeStamp`` moves there — so a record after a long idle stretch still covers about one
  read, not the whole stretch. Only where NVML's clock proved to be the wall clock (records within
  ``CLOCK_AGREES_US`` of it); otherwise it stays, and the idle time is covered by the next record. The lag counts
  at most ``LAG_MAX_US``: NVML's newest record trails the wall clock by its write delay and up to one 200 ms sampling
  period when a process is busy, but by seconds when the newest is stale (the baseline taken while the processes
  load their models: on the H100 the first row after 12 s of start-up read 2.5× the processes' own busy time, its
  first records credited over seconds of idle that NVML's mean had not counted).
* **Unknown is None, never 0**: NOT_SUPPORTED (or a function missing from the bindings or driver) leaves the GPU's
  process rows without activity for good; so does the time before the baseline, and an interval no read answered.
* **Errors**: GPU_IS_LOST retires the GPU (its reads stop, the other GPUs go on); any other error is counted
  (``failed_calls``), logged when the call's state changes (failing with a new code, answering again), said once
  per code as a health event, and ends nothing.

The reader's thread writes the tally and the tick takes it, each under the GPU's lock (held for the adding up
only, never across the NVML call), so the tick never waits on NVML here.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Optional

from trimtab.agent.activity import ActivityTally, Shares
from trimtab.agent.nvml.calls import NvmlCalls, OnCall, timed
from trimtab.agent.nvml.procutil import RECORD_STRUCTS, Way, candidates
from trimtab.agent.nvml.structs import field_reader

log = logging.getLogger(__name__)

METRIC = "process_utilization"
PICK_CALLS = 3  # calls of each way timed at the first read (the cheapest of them counts)
NOT_FOUND_MARGIN_US = 1_000_000
LAG_MAX_US = 500_000
CLOCK_AGREES_US = 10_000_000


class ProcessActivity:
    """One GPU's per-process utilization: :meth:`read` on the reader's cadence, :meth:`take` when process rows are
    made. ``clock``: the wall clock, seconds (tests pass their own)."""

    def __init__(self, calls: NvmlCalls, gpu: Any, on_call: Optional[OnCall] = None,
                 clock: Callable[[], float] = time.time):
        self.calls, self.gpu, self._on_call, self._clock = calls, gpu, on_call, clock
        nv = calls.nv
        self._ways: list[Way] = candidates(nv)
        self.supported = bool(self._ways)
        self._quiet = (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS)  # no record since: an answer (pynvml raises 0 too)
        self._absent = (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED)
        self.pick_costs_s: Optional[dict[str, float]] = None  # label → the cheapest of its timed calls at the pick
        self.last_seen_us = 0  # the newest record time covered (NVML's clock, µs); 0 until the baseline
        self._lag_us: Optional[int] = None  # how far NVML's newest record trailed the wall clock (None: unchecked)
        self.tally = ActivityTally()
        self._lock = threading.Lock()
        self.failed_calls = 0
        self._failing: Any = None  # the error of the current run of failures; None while answering
        if self.supported:
            self._use(0)
        else:
            calls.mark_unsupported(gpu, METRIC)

    def _use(self, k: int) -> None:
        """Use the k-th way of those left (a later one after an earlier one proved absent)."""
        self._ways = self._ways[k:]
        if not self._ways:
            return
        way = self._ways[0]
        self.call: Callable = way.call if self._on_call is None else timed(self._on_call, METRIC, way.call)
        struct_name, names = RECORD_STRUCTS[way.function]
        ctype = getattr(self.calls.nv, struct_name, None)
        self._fields = _attributes if ctype is None else field_reader(ctype, names)
        self._stamp_first = ctype is not None and names[0] == "timeStamp"

    @property
    def function_name(self) -> Optional[str]:
        """The way in use (an NVML function's name, `` (one C call)`` where made so), None where there is none."""
        return self._ways[0].label if self._ways else None

    # --- the reader's thread --------------------------------------------------------------------------------

    def read(self) -> None:
        """Read the records since the last one seen and add them up per pid. May raise ``GpuLost``."""
        if not self.supported:
            return
        if self.pick_costs_s is None:
            self._pick()
            if not self.supported:
                return
        last_seen, started_us = self.last_seen_us, self._clock() * 1e6
        try:
            records = self.call(self.gpu.handle, last_seen)
        except Exception as exc:  # noqa: BLE001 - sorted out below; a metric must not end the reader
            if not isinstance(exc, self.calls.nv.NVMLError) or exc.value not in self._quiet:
                self._failed(exc)
                return
            records = ()
        fields, stamp_first = self._fields, self._stamp_first
        values = []
        for r in records:  # read now: a one-call way's records live in its buffer until the next call
            a, b, sm, mem = fields(r)
            values.append((b, a, sm, mem) if stamp_first else (a, b, sm, mem))
        if self._failing is not None:
            log.info("GPU %s: %s answers again (%d failed calls so far)", self.gpu.index, METRIC, self.failed_calls)
            self._failing = None
        with self._lock:
            self._add(values, last_seen, started_us, self._clock() * 1e6)

    def _add(self, values: list, last_seen: int, started_us: float, answered_us: float) -> None:
        tally = self.tally
        if not values:  # NOT_FOUND: nobody busy since last_seen
            if last_seen and self._lag_us is not None:
                through = int(started_us - self._lag_us - NOT_FOUND_MARGIN_US)
                if through > last_seen:
                    self.last_seen_us = through
                    tally.answered(through / 1000)
            return
        newest = max(v[1] for v in values)
        lag = answered_us - newest
        self._lag_us = int(min(max(0.0, lag), LAG_MAX_US)) if abs(lag) <= CLOCK_AGREES_US else None
        if not last_seen:  # the baseline: what NVML held before the agent is no interval of ours
            self.last_seen_us = newest
            tally.start(newest / 1000)
            return
        if newest <= last_seen:  # nothing newer than what was covered
            return
        pids = [v[0] for v in values]
        if len(set(pids)) == len(pids):  # one record a process: each is its mean over the whole read
            covered_ms = (newest - last_seen) / 1000
            for pid, _, sm, mem in values:
                tally.add(pid, sm, mem, covered_ms)
        else:  # a driver that returns one record a sampling period: each covers the time since the pid's previous
            since: dict[int, int] = {}
            for pid, stamp, sm, mem in sorted(values, key=lambda v: v[1]):
                start = since.get(pid, last_seen)
                if stamp > start:
                    tally.add(pid, sm, mem, (stamp - start) / 1000)
                    since[pid] = stamp
        self.last_seen_us = newest
        tally.answered(newest / 1000)

    def _pick(self) -> None:
        """Time each way ``PICK_CALLS`` times (``lastSeenTimeStamp`` 0: nothing of ours is read) and keep them
        cheapest first; absent ones leave. May raise ``GpuLost``."""
        nv, costs = self.calls.nv, {}
        for way in list(self._ways):
            best = math.inf
            for _ in range(PICK_CALLS):
                started = time.perf_counter()
                try:
                    way.call(self.gpu.handle, 0)
                except Exception as exc:  # noqa: BLE001 - an answer, an absent way, a lost GPU, or a failure
                    code = exc.value if isinstance(exc, nv.NVMLError) else None
                    if code in self._absent:
                        best = None
                        break
                    if code == nv.NVML_ERROR_GPU_IS_LOST:
                        self.calls.failed(self.gpu, METRIC, exc)  # retires the GPU and raises GpuLost
                    if code not in self._quiet:
                        break  # failing now: last in line, tried when the cheaper ones prove absent
                best = min(best, time.perf_counter() - started)
            if best is None:
                self._ways.remove(way)
            else:
                costs[way.label] = best
        self.pick_costs_s = costs
        self._ways.sort(key=lambda w: costs[w.label])
        if self._ways:
            self._use(0)
        else:
            self._unsupported("no way to read it answered")

    def _failed(self, exc: BaseException) -> None:
        nv = self.calls.nv
        code = exc.value if isinstance(exc, nv.NVMLError) else type(exc).__name__
        if code in self._absent and len(self._ways) > 1:  # the other function may still be there
            self._use(1)
            self.read()
            return
        self.failed_calls += 1
        if self.calls.failed(self.gpu, METRIC, exc):  # unsupported (remembered); GpuLost propagates
            self._unsupported(exc)
            return
        if code != self._failing:
            self._failing = code
            log.warning("GPU %s: reading %s failed: %s (%d failed calls so far; the reader goes on)",
                        self.gpu.index, METRIC, exc, self.failed_calls)

    def _unsupported(self, why: Any) -> None:
        self.supported = False
        self.calls.mark_unsupported(self.gpu, METRIC)
        with self._lock:
            self.tally.forget()
        log.info("GPU %s: per-process utilization unsupported (%s); its process rows carry no activity",
                 self.gpu.index, why)

    # --- when process rows are made (the tick) --------------------------------------------------------------

    def take(self) -> Shares:
        """The activity of the interval that ends now, per pid (see ``ActivityTally.take``)."""
        with self._lock:
            return self.tally.take()


def _attributes(record: Any) -> tuple:
    """The fields of a record that is not one of the bindings' structs (read one by one)."""
    return record.pid, record.timeStamp, record.smUtil, record.memUtil
