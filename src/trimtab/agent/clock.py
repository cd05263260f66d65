"""Sample time from the wall clock, sample order from the monotonic clock.

A tick's stamp is the wall clock as it reads at that tick (epoch ms), so whoever reads the sample compares it with
their own clock and sees how old it is. The ticks' order and spacing are the monotonic clock's (the sampler's
grid), which never steps; a step of the wall clock shows as the gap between the two clocks changing by more than
``STEP_MIN_MS`` from one tick to the next (NTP's slewing moves it by at most 0.5 ms a second).

What a user sees across a step of the wall clock by D:

* **forward**: the node's samples jump D ahead; its series has a hole of D. Nothing else.
* **back**: the stamps go back by D at once and follow the wall clock from there — never ahead of it. (The agent
  used to stamp ``max(clock, last + 1 ms)``, which put every sample of the next D into the future: a server
  refused them all and the node looked dead.) For the next D the node's new samples land on times that already
  hold its samples from before the step: a window over those times holds both, and the store cannot tell them
  apart by time. A stamp this agent has already issued (after a step by a whole number of intervals, every tick
  lands on one) moves on by 1 ms, so (GPU, time) stays unique and no sample is taken for a duplicate. If the wall
  clock was right before the step, the node now runs D behind: a server shows its skew, and `check` and
  `/v1/balance` list it as stale, until the clock is set right.
* either way the agent records a ``clock_step`` health event on the node, dated at the first stamp after the step,
  saying by how much and, going back, which times now hold samples from both sides.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Callable, Optional

STEP_MIN_MS = 1000  # a change of (wall − monotonic) beyond this between two ticks is a step, not a slew
ISSUED_MEMORY = 86_400  # stamps remembered to keep them unique after a backward step: a day at 1 s, 0.7 MB


@dataclass(frozen=True)
class ClockStep:
    """The wall clock moved against the monotonic clock between two ticks."""

    by_ms: int  # > 0 forward, < 0 back
    at_ms: int  # the first stamp after the step
    overlap_until_ms: Optional[int] = None  # back: the newest stamp from before it; times up to it hold both sides

    def detail(self) -> str:
        way = "forward" if self.by_ms > 0 else "back"
        text = f"the wall clock stepped {way} {abs(self.by_ms) / 1000:.3f} s (against the monotonic clock)"
        if self.overlap_until_ms is None:
            return text + "; samples keep the wall clock's time"
        return (text + f"; samples keep the wall clock's time, so times {self.at_ms}..{self.overlap_until_ms} (epoch "
                       f"ms) hold this node's samples from before and after the step")


class WallStamps:
    """Hands out the stamps of successive ticks: the wall clock now, unique among the last ``ISSUED_MEMORY``."""

    def __init__(self, wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000):
        self._wall_ms = wall_ms
        self._monotonic_ms = monotonic_ms
        self._offset_ms: Optional[int] = None  # wall − monotonic at the last tick
        self._newest_ms = -1  # the newest stamp issued
        self._issued = array("q")  # a ring of the last ISSUED_MEMORY stamps
        self._at = 0
        self._taken: Optional[set[int]] = None  # after a backward step: issued stamps at or after the wall clock

    def next(self) -> tuple[int, Optional[ClockStep]]:
        """(stamp of this tick, the step of the wall clock since the last tick or None)."""
        wall = self._wall_ms()
        offset = wall - self._monotonic_ms()
        step = None
        if self._offset_ms is not None and abs(offset - self._offset_ms) > STEP_MIN_MS:
            back = offset < self._offset_ms and wall <= self._newest_ms
            step = ClockStep(offset - self._offset_ms, wall, self._newest_ms if back else None)
            self._taken = None  # a new step: what is taken is read again from the ring
        self._offset_ms = offset
        stamp = wall
        if stamp <= self._newest_ms:  # only after a backward step (of any size): times already handed out
            if self._taken is None:
                self._taken = {t for t in self._issued if t >= stamp}
            while stamp in self._taken:
                stamp += 1
            self._taken.add(stamp)
        else:
            self._taken = None
        self._remember(stamp)
        if step is not None and step.at_ms != stamp:
            step = ClockStep(step.by_ms, stamp, step.overlap_until_ms)
        return stamp, step

    def _remember(self, stamp: int) -> None:
        if len(self._issued) < ISSUED_MEMORY:
            self._issued.append(stamp)
        else:
            self._issued[self._at] = stamp
            self._at = (self._at + 1) % ISSUED_MEMORY
        self._newest_ms = max(self._newest_ms, stamp)
