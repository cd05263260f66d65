"""Per-process GPU activity of one GPU over one interval, added up from per-process utilization samples — NVML's
(``trimtab.agent.nvml.activity``) or the simulated node's, which plays the same samples from its scenario.

A sample is one driver sampling period in which one process was busy: (pid, SM %, memory %). The interval is
``(from_ms, to_ms]`` on the agent's clock: from where the previous interval ended (or the baseline reading) to the
last reading that answered. Per pid the interval keeps the mean SM % and memory % over its samples and their count:
each sample is one period, so the mean is the process's share of the GPU while it was busy and
``mean × samples × period`` its busy time; the count tells a process busy in 2 periods from one busy in all of
them. A pid with no sample gets 0 % over 0 samples only when a reading answered in the interval (busy processes
are listed, idle ones left out); where nothing answered, or before the baseline, every pid is unknown (None).
"""

from __future__ import annotations

from typing import Optional

# (sm_util_pct, mem_util_pct, util_samples, util_from_ms, util_to_ms): the activity fields of a GpuProcess.
Activity = tuple[Optional[float], Optional[float], Optional[int], Optional[int], Optional[int]]
UNKNOWN: Activity = (None, None, None, None, None)


class Shares:
    """One interval's activity of a GPU's processes: :meth:`of` a pid; ``busy``: the pids with samples."""

    __slots__ = ("busy", "idle")

    def __init__(self, busy: dict[int, Activity], idle: Activity):
        self.busy, self.idle = busy, idle

    def of(self, pid: int) -> Activity:
        return self.busy.get(pid, self.idle)


NO_SHARES = Shares({}, UNKNOWN)


class ActivityTally:
    """The samples of one GPU's current interval, summed per pid."""

    __slots__ = ("from_ms", "to_ms", "sums")

    def __init__(self) -> None:
        self.from_ms: Optional[int] = None  # start of the interval; None until the baseline reading
        self.to_ms: Optional[int] = None  # the last reading that answered in this interval
        self.sums: dict[int, list] = {}  # pid → [SM % sum, memory % sum, samples]

    def start(self, ts_ms: int) -> None:
        """The baseline: the interval starts at ``ts_ms`` (samples of the baseline reading itself are not added)."""
        self.from_ms, self.to_ms, self.sums = ts_ms, None, {}

    def add(self, pid: int, sm_pct: float, mem_pct: float) -> None:
        acc = self.sums.get(pid)
        if acc is None:
            self.sums[pid] = [sm_pct, mem_pct, 1]
        else:
            acc[0] += sm_pct
            acc[1] += mem_pct
            acc[2] += 1

    def answered(self, ts_ms: int) -> None:
        """A reading at ``ts_ms`` answered (with samples or with none): the interval covers up to it."""
        self.to_ms = ts_ms

    def forget(self) -> None:
        """Unknown from now on (the GPU stopped answering for good): no baseline, nothing summed."""
        self.from_ms, self.to_ms, self.sums = None, None, {}

    def take(self) -> Shares:
        """The interval that ends now, per pid; the next one starts where it ended. Unknown for every pid when there
        is no baseline or no reading answered since it."""
        start, end = self.from_ms, self.to_ms
        if start is None or end is None or end <= start:
            return NO_SHARES
        busy: dict[int, Activity] = {pid: (sm / n, mem / n, n, start, end) for pid, (sm, mem, n) in self.sums.items()}
        self.sums = {}
        self.from_ms, self.to_ms = end, None
        return Shares(busy, (0.0, 0.0, 0, start, end))
