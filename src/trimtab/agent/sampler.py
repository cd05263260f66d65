"""The sampler loop: one tick every ``interval_s`` on a fixed grid (no drift), every source read, one batch out.

Ticks are scheduled at ``start + k * interval_s`` on the monotonic clock, so a slow tick does not push all later
ticks back; a tick that overruns a whole interval skips the ticks it missed and counts them, rather than firing
a burst. Samples are stamped with the wall clock (:mod:`trimtab.agent.clock`: what a step of it does). A source
that raises is recorded as a health event and the tick goes on with the others. Values that are not finite
numbers (a bad sample) become ``None``. Every ``status_every_s`` the loop logs one readable line.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from trimtab.contract.readings import (
    EVENT_CLOCK_STEP,
    EVENT_SOURCE_ERROR,
    Batch,
    GpuInfo,
    GpuSample,
    HealthEvent,
    HostSample,
    NodeInfo,
    NvlinkSample,
)
from trimtab.agent.clock import WallStamps
from trimtab.agent.source import Source

log = logging.getLogger(__name__)


@dataclass
class SamplerStats:
    ticks: int = 0
    ticks_skipped: int = 0
    source_errors: int = 0
    clock_steps: int = 0  # steps of the wall clock seen (trimtab.agent.clock)
    last_tick_cost_s: float = 0.0
    max_tick_cost_s: float = 0.0
    last_batch: Optional[Batch] = None


def node_info_for(sources: Sequence[Source], hostname: Optional[str] = None) -> tuple[NodeInfo, list[GpuInfo]]:
    """Merge the sources' inventories into the node's identity and its GPU list."""
    gpus: list[GpuInfo] = []
    simulated, driver, nvml, scenario = False, None, None, None
    for src in sources:
        inv = src.inventory()
        gpus.extend(inv.gpus)
        simulated = simulated or inv.simulated
        driver = driver or inv.driver_version
        nvml = nvml or inv.nvml_version
        scenario = scenario or inv.scenario
    name = hostname or socket.gethostname()
    if simulated and hostname is None:
        name = f"{name}-sim"
    return NodeInfo(hostname=name, simulated=simulated, driver_version=driver, nvml_version=nvml, scenario=scenario), gpus


def _clean(sample):
    """Replace NaN/inf (a bad reading) with None in a GpuSample/HostSample/NvlinkSample, in place."""
    bad = [name for name, v in vars(sample).items() if isinstance(v, float) and not math.isfinite(v)]
    for name in bad:
        setattr(sample, name, None)
    return sample


class Sampler:
    def __init__(
        self,
        sources: Sequence[Source],
        on_batch: Callable[[Batch], None],
        *,
        interval_s: float = 1.0,
        hostname: Optional[str] = None,
        status_every_s: float = 10.0,
        status_line: Optional[Callable[["Sampler"], str]] = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ):
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.sources = list(sources)
        self.on_batch = on_batch
        self.interval_s = interval_s
        self.status_every_s = status_every_s
        self.status_line = status_line
        self.stamps = WallStamps(clock_ms, monotonic_ms)  # wall-clock stamps; what a user sees across a step: there
        self.node, self.gpus = node_info_for(self.sources, hostname)
        self.stats = SamplerStats()
        self._errors_logged: set[tuple[str, str]] = set()

    def tick(self) -> Batch:
        """Read every source once and return the batch (also handed to ``on_batch``)."""
        ts_ms, step = self.stamps.next()
        batch = Batch(node=self.node, gpus=self.gpus)
        if step is not None:
            self.stats.clock_steps += 1
            log.warning("%s", step.detail())
            batch.events.append(HealthEvent(ts_ms=ts_ms, kind=EVENT_CLOCK_STEP, detail=step.detail()))
        started = time.perf_counter()
        for src in self.sources:
            try:
                r = src.sample(ts_ms)
            except Exception as exc:  # one bad source must not stop the others
                self.stats.source_errors += 1
                key = (src.kind, type(exc).__name__)
                if key not in self._errors_logged:
                    self._errors_logged.add(key)
                    log.exception("source %s failed (further identical errors are counted, not logged)", src.kind)
                    batch.events.append(HealthEvent(ts_ms=ts_ms, kind=EVENT_SOURCE_ERROR, detail=f"{src.kind}: {exc!r}"[:500]))
                continue
            batch.gpu_samples.extend(_clean(s) for s in r.gpu_samples if isinstance(s, GpuSample))
            if isinstance(r.host_sample, HostSample):
                batch.host_samples.append(_clean(r.host_sample))
            batch.processes.extend(r.processes)
            batch.events.extend(r.events)
            batch.nvlink_samples.extend(_clean(s) for s in r.nvlink_samples if isinstance(s, NvlinkSample))
        cost = time.perf_counter() - started
        self.stats.ticks += 1
        self.stats.last_tick_cost_s = cost
        self.stats.max_tick_cost_s = max(self.stats.max_tick_cost_s, cost)
        self.stats.last_batch = batch
        self.on_batch(batch)
        return batch

    def run(self, stop: threading.Event, duration_s: Optional[float] = None, on_tick: Optional[Callable[[], None]] = None) -> None:
        """Tick until ``stop`` is set (or ``duration_s`` has passed). ``on_tick`` runs after each tick (watchdog)."""
        start = time.monotonic()
        next_status = start + self.status_every_s
        k = 0
        while not stop.is_set():
            deadline = start + k * self.interval_s
            if duration_s is not None and deadline - start >= duration_s - 1e-9:
                break
            delay = deadline - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            self.tick()
            if on_tick is not None:
                on_tick()
            k += 1
            now = time.monotonic()
            behind = int((now - start) / self.interval_s) + 1 - k
            if behind > 0:  # overran: skip the ticks we missed instead of bursting
                self.stats.ticks_skipped += behind
                k += behind
                log.warning("tick took %.3f s (interval %.3f s): skipped %d ticks", self.stats.last_tick_cost_s, self.interval_s, behind)
            if self.status_line is not None and now >= next_status:
                next_status = now + self.status_every_s
                log.info("%s", self.status_line(self))
