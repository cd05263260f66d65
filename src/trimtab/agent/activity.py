"""Per-process GPU activity of one GPU over one interval, added up from per-process utilization records — NVML's
(``trimtab.agent.nvml.activity``) or the simulated node's, which plays the same records from its scenario.

A record is one process's **mean** SM % and memory % over the time it covers: from the ``lastSeenTimeStamp`` the
read passed to NVML to the record's own timestamp. On an H100 (driver 580, bench/process_activity.py) a read
returned one record per busy process whatever the time since the previous read, and reading its smUtil as one 0.2 s
sampling period undercounted each process's own CUDA-event busy time about five-fold (0.18×, 0.21× with 1 s reads),
while smUtil × the time since the process's previous record came to 0.94× and 1.06×: the record is an average
over the time since the last read, not one period. So a record adds ``smUtil × covered`` to its pid, and the
process's busy seconds over the interval are ``Σ smUtil / 100 × covered seconds`` over its records.

The interval is ``(from_ms, to_ms]``, on NVML's clock (epoch ms): from where the previous interval ended (or the
baseline read) to the newest time a read covered. Per pid it keeps the mean SM % and memory % **over the whole
interval** (its records' ``smUtil × covered`` summed, over the interval's length) and the number of records, so
``sm_util_pct / 100 × (util_to_ms − util_from_ms) / 1000`` is the process's busy seconds in it. A pid without a
record in an answered read was idle over what that read covered, so it gets 0 % with 0 records when some read
answered in the interval; where nothing answered, or before the baseline, every pid is unknown (None), never 0.

Why absent means idle, and what is left to check: ``nvml.h`` returns one record "per process running, that had
some non-zero utilization during the last sample period", and a ``lastSeenTimeStamp`` from a previous query reads
"utilization since the previous query". Read literally, a process busy early in a read's span and idle in its
last sampling period would get no record and its time would be lost; on the H100 two processes taking turns (one
busy ~0.3 s, the other ~0.12 s of every ~0.6 s) both had a record on nearly every 1 s read (median 2, max 2) and
smUtil × the time since the previous record came within 6 % of each one's own total, so records cover the whole
span. ``bench/process_activity.py`` checks it on each driver (``--idle-s`` adds reads with nobody busy).
"""

from __future__ import annotations

from typing import Optional

# (sm_util_pct, mem_util_pct, util_samples, util_from_ms, util_to_ms): the activity fields of a GpuProcess.
Activity = tuple[Optional[float], Optional[float], Optional[int], Optional[int], Optional[int]]
UNKNOWN: Activity = (None, None, None, None, None)


class Shares:
    """One interval's activity of a GPU's processes: :meth:`of` a pid; ``busy``: the pids with records."""

    __slots__ = ("busy", "idle")

    def __init__(self, busy: dict[int, Activity], idle: Activity):
        self.busy, self.idle = busy, idle

    def of(self, pid: int) -> Activity:
        return self.busy.get(pid, self.idle)


NO_SHARES = Shares({}, UNKNOWN)


class ActivityTally:
    """The records of one GPU's current interval, summed per pid as ``smUtil × covered ms``."""

    __slots__ = ("from_ms", "to_ms", "sums")

    def __init__(self) -> None:
        self.from_ms: Optional[float] = None  # start of the interval; None until the baseline read
        self.to_ms: Optional[float] = None  # the newest time an answered read covered in this interval
        self.sums: dict[int, list] = {}  # pid → [Σ SM % × covered ms, Σ memory % × covered ms, records]

    def start(self, at_ms: float) -> None:
        """The baseline: the interval starts at ``at_ms`` (the baseline read's own records are not added)."""
        self.from_ms, self.to_ms, self.sums = at_ms, None, {}

    def add(self, pid: int, sm_pct: float, mem_pct: float, covered_ms: float) -> None:
        """One record: ``pid`` averaged ``sm_pct`` and ``mem_pct`` over the ``covered_ms`` it covers."""
        acc = self.sums.get(pid)
        if acc is None:
            self.sums[pid] = [sm_pct * covered_ms, mem_pct * covered_ms, 1]
        else:
            acc[0] += sm_pct * covered_ms
            acc[1] += mem_pct * covered_ms
            acc[2] += 1

    def answered(self, through_ms: float) -> None:
        """A read answered (with records or with none) for the time up to ``through_ms``."""
        if self.to_ms is None or through_ms > self.to_ms:
            self.to_ms = through_ms

    def forget(self) -> None:
        """Unknown from now on (the GPU stopped answering for good): no baseline, nothing summed."""
        self.from_ms, self.to_ms, self.sums = None, None, {}

    def take(self) -> Shares:
        """The interval that ends now, per pid; the next one starts where it ended. Unknown for every pid when there
        is no baseline or no read answered since it."""
        start, end = self.from_ms, self.to_ms
        if start is None or end is None or end <= start:
            return NO_SHARES
        span = end - start
        first, last = round(start), round(end)
        busy: dict[int, Activity] = {pid: (min(100.0, sm / span), min(100.0, mem / span), n, first, last)
                                     for pid, (sm, mem, n) in self.sums.items()}
        self.sums = {}
        self.from_ms, self.to_ms = end, None
        return Shares(busy, (0.0, 0.0, 0, first, last))
