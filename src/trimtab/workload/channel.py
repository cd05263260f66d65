"""The bounded hand-off between the generation worker and the scoring worker, and per-step busy-time totals.

``PrefetchQueue`` is demand-driven: the producer may start an item only while the items queued or in the making
do not exceed ``capacity`` plus the consumers already waiting. So ``capacity`` (the prefetch knob) is exactly how
many generated batches may wait unclaimed, and capacity 0 makes generation strictly sequential with scoring —
a batch is generated only once the scorer asks for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict, deque


class Closed(Exception):
    """The queue was closed (the pipeline is stopping or restarting its workers)."""


class PrefetchQueue:
    def __init__(self, capacity: int):
        self._cond = threading.Condition()
        self._items: deque = deque()
        self._capacity = capacity
        self._waiting = 0      # consumers blocked in get(): each entitles the producer to one more item
        self._producing = 0
        self._closed = False
        self._failure: BaseException | None = None
        self.max_depth = 0     # most items waiting with no consumer to claim them, since reset_max_depth()

    @property
    def capacity(self) -> int:
        return self._capacity

    def resize(self, capacity: int) -> None:
        """Change the bound; items already made stay queued (a smaller bound just holds the producer back)."""
        self._set_and_wake(_capacity=capacity)

    def fail(self, error: BaseException) -> None:
        """The producer died: consumers raise instead of waiting forever."""
        self._set_and_wake(_failure=error)

    def close(self) -> None:
        self._set_and_wake(_closed=True)

    def _set_and_wake(self, **fields) -> None:
        with self._cond:
            for name, value in fields.items():
                setattr(self, name, value)
            self._cond.notify_all()

    def reserve(self) -> None:
        """Producer: block until one more item is allowed, then count it as in the making."""
        with self._cond:
            while not self._closed and len(self._items) + self._producing >= self._capacity + self._waiting:
                self._cond.wait()
            if self._closed:
                raise Closed
            self._producing += 1

    def put(self, item) -> None:
        with self._cond:
            self._producing -= 1
            self._items.append(item)
            self.max_depth = max(self.max_depth, len(self._items) - self._waiting)
            self._cond.notify_all()

    def get(self):
        """Consumer: ask for one item (letting the producer make it if need be) and wait for it."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                while not self._items and not self._closed and self._failure is None:
                    self._cond.wait()
                if self._failure is not None:
                    raise RuntimeError("the generation worker failed") from self._failure
                if not self._items:
                    raise Closed
                return self._items.popleft()
            finally:
                self._waiting -= 1

    def depth(self) -> int:
        with self._cond:
            return len(self._items)

    def reset_max_depth(self) -> int:
        """The high-water mark since the last reset, then start a new one from the current depth."""
        with self._cond:
            high, self.max_depth = self.max_depth, max(0, len(self._items) - self._waiting)
            return high


class BusyTotals:
    """Seconds each phase kept its worker busy, summed per step. Workers overlap, so the phases of a step may add
    up to more than its wall time; that excess is the overlap prefetch buys."""

    def __init__(self):
        self._lock = threading.Lock()
        self._totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Wall time of the block (callers synchronize their device work inside it, so it includes GPU time)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._totals[phase] += seconds

    def take(self) -> dict[str, float]:
        with self._lock:
            totals, self._totals = dict(self._totals), defaultdict(float)
            return totals
