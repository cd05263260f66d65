"""Phase timing inside a step: wall clock always, CUDA event pairs where the phase ran with CUDA initialised.

Events are only *recorded* on the hot path (~11 µs each on the H200) and resolved later with ``Event.query()``
(~1 µs, never blocks): calling ``synchronize()`` or ``elapsed_time()`` on an unfinished event would stall the
training loop until the GPU drains, which is exactly the cost the hook must not add. So a step's GPU time is
known once its last event has completed — at its own ``step_end`` when the step ended in a host sync, a step or
two later when it did not — and the hook holds the step's report until then (:meth:`PhaseTimer.pending`).

Waiting for rollout (``WALL_ONLY_PHASES``) gets no events: an idle wait launches no kernels, its cost is wall time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Mapping, Optional

import torch

from trimtab.contract.step_report import NAMED_PHASES, PHASES, WALL_ONLY_PHASES

MAX_UNRESOLVED_STEPS = 32  # a step whose events never complete (a hung stream) must not grow memory forever


def cuda_in_use() -> bool:
    """True when CUDA is available *and* this process already initialised it (we never initialise it)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class Phase:
    """``with timer.phase("generation"):`` — adds the block's wall time (and CUDA events) to the open step."""

    __slots__ = ("_timer", "_name", "_t0", "_ev0")

    def __init__(self, timer: "PhaseTimer", name: str):
        self._timer, self._name, self._ev0 = timer, name, None

    def __enter__(self) -> "Phase":
        timer = self._timer
        if timer.first_entry_s is None:
            timer.first_entry_s = time.perf_counter()
        if timer.cuda_events and self._name not in WALL_ONLY_PHASES and cuda_in_use():
            self._ev0 = torch.cuda.Event(enable_timing=True)
            self._ev0.record()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        timer = self._timer
        timer.wall_s[self._name] = timer.wall_s.get(self._name, 0.0) + (time.perf_counter() - self._t0)
        if self._ev0 is not None:
            ev1 = torch.cuda.Event(enable_timing=True)
            ev1.record()
            timer.events.append((self._name, self._ev0, ev1))
            self._ev0 = None


class PhaseTimer:
    """Accumulates the open step's phases and knows where the step began; ``close_step`` turns them into the
    report's phases (with "other")."""

    def __init__(self, cuda_events: bool = True):
        self.cuda_events = cuda_events
        self.wall_s: dict[str, float] = {}
        self.events: list = []
        self.first_entry_s: Optional[float] = None  # the first phase ever entered: where step 0 starts
        self.attached_s = time.perf_counter()  # where step 0 starts when it ends before any phase was entered
        self.step_start_s: Optional[float] = None  # where the open step began (None: see step_time_s)
        self._unresolved: "OrderedDict[int, list]" = OrderedDict()
        self.unresolved_dropped = 0

    def phase(self, name: str) -> Phase:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: use one of {', '.join(PHASES)}")
        return Phase(self, name)

    def begin_step(self, at_s: Optional[float] = None) -> None:
        """The open step begins at ``at_s`` (default: now)."""
        self.step_start_s = time.perf_counter() if at_s is None else at_s

    def step_time_s(self, now_s: float) -> float:
        """Seconds since the open step began: since ``begin_step``, else the first phase entered, else attach."""
        start_s = self.step_start_s
        if start_s is None:
            start_s = self.first_entry_s or self.attached_s
        return max(0.0, now_s - start_s)

    def close_step(self, step: int, step_time_s: float,
                   extra_s: Optional[Mapping[str, float]] = None) -> dict[str, float]:
        """The step's phases in seconds: measured blocks plus ``extra_s`` (timings the caller got elsewhere, e.g.
        a framework's own timers); "other" = step time − the named phases (never negative: nested phases count
        twice, so their sum can exceed the step)."""
        phases = dict(self.wall_s)
        for name, seconds in (extra_s or {}).items():
            if name not in PHASES:
                raise ValueError(f"unknown phase {name!r}: use one of {', '.join(PHASES)}")
            phases[name] = phases.get(name, 0.0) + float(seconds)
        named = sum(phases.get(n, 0.0) for n in NAMED_PHASES)
        phases["other"] = max(0.0, step_time_s - named)
        self.wall_s = {}
        if self.events:
            self._unresolved[step] = self.events
            self.events = []
            while len(self._unresolved) > MAX_UNRESOLVED_STEPS:
                self._unresolved.popitem(last=False)
                self.unresolved_dropped += 1
        return phases

    def pending(self, step: int) -> bool:
        """True while ``step`` has events not resolved yet (its GPU time is still to come)."""
        return step in self._unresolved

    def forget(self, step: int) -> None:
        """Stop waiting for ``step``'s events (its report goes without GPU time)."""
        if self._unresolved.pop(step, None) is not None:
            self.unresolved_dropped += 1

    def resolve(self, wait: bool = False) -> dict[int, dict[str, float]]:
        """GPU seconds per phase of every step whose events have all completed (oldest first); steps that have not
        completed yet stay for a later call. Never blocks, unless ``wait`` (at close: the GPU's work is done then
        or nearly, and the last reports should carry their GPU time)."""
        done: dict[int, dict[str, float]] = {}
        for step, events in list(self._unresolved.items()):
            if wait:
                for _, _, ev1 in events:
                    ev1.synchronize()
            if not all(ev1.query() for _, _, ev1 in events):
                break  # the stream runs in order: later steps cannot have finished either
            gpu_s: dict[str, float] = {}
            for name, ev0, ev1 in events:
                gpu_s[name] = gpu_s.get(name, 0.0) + ev0.elapsed_time(ev1) / 1000.0
            done[step] = gpu_s
            del self._unresolved[step]
        return done
