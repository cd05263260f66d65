"""``NvmlSource``: the ``Source`` protocol over NVML, built from the call layer and its readers.

The tick makes only cheap calls (a few µs each on an H200), prepared once per GPU (``tick``), plus a GPM sample
on Hopper and newer (``gpm``). What blocks or costs more is read off the tick: PCIe throughput on GPUs without GPM,
NVLink sums and per-link counters by one background thread (``slow``); the per-process utilization records (~2.8 ms
a call on an H100) by another, every ``activity_every_s`` (``activity_reader``); the process list every 5 s (with
each process's activity since the previous list, taken from what that thread added up) and XIDs every 2 s
(``xid``). Errors are sorted out in one place (``calls``).
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from trimtab.agent.activity import NO_SHARES
from trimtab.agent.nvml.activity import ProcessActivity
from trimtab.agent.nvml.activity_reader import ACTIVITY_EVERY_S, ActivityReader
from trimtab.agent.nvml.gpm import open_gpm
from trimtab.agent.nvml.calls import NO_DRIVER_HINT, GpuLost, NvmlCalls, OnCall, load_pynvml
from trimtab.agent.nvml.device import Gpu, describe
from trimtab.agent.nvml.slow import DEFAULT_SLOW_REFRESH_S, SlowReader
from trimtab.agent.nvml.tick import GpuTick, read_processes
from trimtab.agent.nvml.xid import XID_EVERY_S, XidWatch
from trimtab.contract.readings import EVENT_SOURCE_ERROR, GpuInfo, GpuProcess, NvlinkSample, Readings
from trimtab.agent.source import Inventory, SourceUnavailable

# Read on a slower cadence than the tick: the process list changes rarely; it was ~25 µs of a per-GPU tick on
# the lent H200.
PROCESSES_EVERY_S = 5.0


class NvmlSource:
    """GPU telemetry from NVML (``kind = "nvml"``).

    ``indices``: NVML indices to sample (default all). ``slow_refresh_s``: period of the background thread that
    reads PCIe/NVLink throughput on GPUs without GPM and per-link NVLink on GPUs with links; ``None`` starts no
    thread (call ``refresh_slow_metrics()`` yourself). ``on_call(name, seconds)``: optional hook timed around
    every NVML call (for tests and benches); without it nothing is timed but the tick as a whole.
    ``use_gpm=False`` takes the pre-Hopper path even where GPM exists (to compare the two).
    ``process_activity=False`` makes no per-process utilization call (a bench's "without"; the process rows then
    carry no activity). ``activity_every_s``: the cadence of the thread that reads it; ``None`` starts no thread
    (call ``read_activity()`` yourself). ``last_tick_cost_s``:
    wall time of the latest ``sample()``. Raises ``SourceUnavailable`` when there is no driver, library or GPU.
    """

    kind = "nvml"

    def __init__(self, indices: Optional[Sequence[int]] = None, *,
                 slow_refresh_s: Optional[float] = DEFAULT_SLOW_REFRESH_S, on_call: Optional[OnCall] = None,
                 use_gpm: bool = True, process_activity: bool = True,
                 activity_every_s: Optional[float] = ACTIVITY_EVERY_S):
        self._calls = NvmlCalls(load_pynvml())
        self._on_call, self._use_gpm, self._process_activity = on_call, use_gpm, process_activity
        self._gpus: list[Gpu] = []
        self._slow: Optional[SlowReader] = None
        self._activity: Optional[ActivityReader] = None
        self._activity_every_s = activity_every_s
        self._xid: Optional[XidWatch] = None
        self._driver_version = self._nvml_version = None
        self._procs_due_at = self._xid_due_at = 0.0
        self._closed = False
        self.last_tick_cost_s: Optional[float] = None
        self._calls.start()
        try:
            self._open(indices, slow_refresh_s)
        except BaseException:
            self.close()
            raise

    # --- start ---------------------------------------------------------------------------------------------

    def _open(self, indices: Optional[Sequence[int]], slow_refresh_s: Optional[float]) -> None:
        q = self._calls.call
        count = q(None, "device_count", "nvmlDeviceGetCount") or 0
        if count == 0:
            raise SourceUnavailable(f"NVML found no GPU on this machine. {NO_DRIVER_HINT}")
        wanted = list(range(count)) if indices is None else list(indices)
        bad = [i for i in wanted if not 0 <= i < count]
        if bad:
            raise ValueError(f"GPU indices {bad} do not exist; NVML sees {count} GPU(s): 0..{count - 1}")
        self._driver_version = q(None, "driver_version", "nvmlSystemGetDriverVersion")
        self._nvml_version = q(None, "nvml_version", "nvmlSystemGetNVMLVersion")
        self._xid = XidWatch(self._calls, self._on_call)
        for index in wanted:
            handle = q(None, "handle", "nvmlDeviceGetHandleByIndex", index)
            uuid = q(None, "uuid", "nvmlDeviceGetUUID", handle) if handle is not None else None
            if uuid is None:
                self._calls.emit(EVENT_SOURCE_ERROR, f"GPU {index}: cannot read its handle or UUID; not sampled", None)
                continue
            gpu = Gpu(index, handle, GpuInfo(uuid=uuid, index=index, name=f"GPU {index}"))
            self._gpus.append(gpu)
            try:
                describe(self._calls, gpu)
                if gpu.info.gpm_supported and self._use_gpm:
                    gpu.gpm = open_gpm(self._calls, gpu, self._on_call)
                self._xid.register(gpu)
            except GpuLost:
                pass  # stays in the inventory as far as it was read; the gpu_lost event says the rest
            gpu.tick = GpuTick(self._calls, gpu, self._on_call)
            if self._process_activity:
                gpu.activity = ProcessActivity(self._calls, gpu, self._on_call)
        self._xid.name(self._gpus)
        self._slow = SlowReader(self._calls, self._gpus, slow_refresh_s)
        self._slow.start()
        self._activity = ActivityReader(self._calls, self._gpus, self._activity_every_s)
        self._activity.start()

    # --- the tick ------------------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        return Inventory(gpus=[g.info for g in self._gpus], simulated=False,
                         driver_version=self._driver_version, nvml_version=self._nvml_version)

    def unsupported(self) -> list[tuple[Optional[int], str]]:
        """(GPU index or None, metric) pairs that answered NOT_SUPPORTED and are no longer asked."""
        return self._calls.unsupported()

    def sample(self, ts_ms: int) -> Readings:
        started = time.perf_counter()
        readings = Readings()
        samples, links = readings.gpu_samples, readings.nvlink_samples
        now = time.monotonic()
        processes: Optional[list[GpuProcess]] = None
        if now >= self._procs_due_at:
            self._procs_due_at = now + PROCESSES_EVERY_S
            processes = readings.processes
        stale_after_s = self._slow.stale_after_s
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                sample = gpu.tick.sample(ts_ms)
                activity = gpu.activity
                if processes is not None:
                    read_processes(self._calls, gpu, ts_ms, processes, self._on_call,
                                   activity.take() if activity is not None else NO_SHARES)
                if gpu.gpm is not None:
                    gpu.gpm.read(vars(sample))
                else:
                    gpu.slow.put(vars(sample), stale_after_s)
                samples.append(sample)
            except GpuLost:
                readings.processes[:] = [p for p in readings.processes if p.gpu_uuid != gpu.info.uuid]
                continue
            rates = gpu.slow.take_links() if gpu.links else None
            if rates:
                uuid = gpu.info.uuid
                links.extend(NvlinkSample(uuid, ts_ms, link, tx, rx) for link, tx, rx in rates)
        if now >= self._xid_due_at:
            self._xid_due_at = now + XID_EVERY_S
            self._xid.poll()
        readings.events = self._calls.take_events(ts_ms)
        self.last_tick_cost_s = time.perf_counter() - started
        return readings

    def tick_calls(self) -> list[tuple[Gpu, list]]:
        """For a bench: per GPU sampled, the (metric, bindings function, arguments) of the calls every tick makes
        now, GPM aside (``gpu.gpm`` says whether a tick also takes a GPM sample, and asks for which metrics)."""
        return [(g, g.tick.calls_made()) for g in self._gpus if not g.lost]

    def activity_failed_calls(self) -> dict[int, int]:
        """GPU index → per-process utilization calls that failed (errors other than unsupported or no sample)."""
        return {g.index: g.activity.failed_calls for g in self._gpus if g.activity is not None}

    def read_activity(self) -> None:
        """One read of every GPU's per-process utilization (what the reader's thread does every
        ``activity_every_s``)."""
        self._activity.read()

    def refresh_slow_metrics(self) -> None:
        """Read PCIe throughput (blocking ~20 ms per call) and NVLink sums of every GPU without GPM, and per-link
        NVLink counters of every GPU with links."""
        self._slow.refresh()

    # --- end -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread, free GPM samples and the event set, and shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._slow is not None:
            self._slow.stop()
        if self._activity is not None:
            self._activity.stop()
        for gpu in self._gpus:
            if gpu.gpm is not None:
                gpu.gpm.free()
                gpu.gpm = None
        if self._xid is not None:
            self._xid.close()
        self._calls.shutdown()

