"""NVML metric source: the only module in trimtab that imports ``pynvml`` (package ``nvidia-ml-py``).

The tick makes only cheap calls (a few µs each on an H200). PCIe and NVLink rates come from GPM on Hopper and
newer; on older GPUs from ``nvmlDeviceGetPcieThroughput`` (which blocks ~20 ms a call) and NVLink field values,
both read by one background thread whose cached values the tick picks up. Every NVML call goes through
``NvmlSource._query``: NOT_SUPPORTED is remembered and never asked again, GPU_IS_LOST retires that GPU with one
health event, any other error gives ``None`` and at most one event per (GPU, metric, error).
Processes come from ``nvmlDeviceGetComputeRunningProcesses_v3`` (``_v2`` where the library lacks v3).
Longer than most modules on purpose: every NVML detail (GPM, fallbacks, events, the slow thread) lives here alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from trimtab.agent.pcie import pcie_peak_bytes_per_s
from trimtab.agent.readings import (EVENT_GPU_LOST, EVENT_SOURCE_ERROR, EVENT_XID, GpuInfo, GpuProcess,
                                    GpuSample, HealthEvent, Readings)
from trimtab.agent.source import Inventory, SourceUnavailable

DEFAULT_SLOW_REFRESH_S = 3.0
# Read on a slower cadence than the tick: the process list changes rarely and XIDs are rare; together they were
# ~40 µs of the ~350 µs per-GPU tick measured on the lent H200 (BENCHMARKS.md).
PROCESSES_EVERY_S = 5.0
XID_EVERY_S = 2.0
GPM_MIN_INTERVAL_S = 0.1  # nvmlGpmMetricsGet needs samples more than 100 ms apart
MIB = 1024 * 1024
_ALL_LINKS = 0xFFFFFFFF  # field-value scopeId: sum over NVLink links
_MAX_EVENTS_PER_TICK = 32
NO_DRIVER_HINT = "Run `trimtab agent --simulate N` for a simulated node on a machine without NVIDIA GPUs."  # commands other than `agent` say their own
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by nvmlValueType_t
_NO_DRIVER_CODES = (9, 12)  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND
# GPM metric id → (GpuSample field, factor to the field's unit). NVLink ids are asked only where links exist.
_GPM_FIELDS: dict[int, tuple[str, float]] = {
    2: ("sm_active_pct", 1.0), 3: ("sm_occupancy_pct", 1.0), 5: ("tensor_active_pct", 1.0),
    10: ("dram_bw_util_pct", 1.0), 20: ("pcie_tx_bytes_per_s", MIB), 21: ("pcie_rx_bytes_per_s", MIB),
    60: ("nvlink_rx_bytes_per_s", MIB), 61: ("nvlink_tx_bytes_per_s", MIB),
}
_GPM_NVLINK_IDS = (60, 61)

OnCall = Callable[[str, float], None]


class _GpuLost(Exception):
    """Raised inside the source when a call reports GPU_IS_LOST; ends that GPU's work for this tick."""


def load_pynvml() -> Any:
    """Import ``pynvml`` (lazily, so importing trimtab never needs a driver). Missing → ``SourceUnavailable``."""
    try:
        import pynvml
    except ImportError as exc:
        raise SourceUnavailable(f"The NVML bindings are not installed ({exc}); `pip install nvidia-ml-py`. "
                                + NO_DRIVER_HINT) from None
    return pynvml


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle, equal for two ctypes pointers to the same device."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is None or math.isfinite(x) else None


@dataclass
class _Rate:
    """A cached reading of the background thread: (tx, rx) bytes/s and when it was taken (monotonic s)."""

    tx: Optional[float] = None
    rx: Optional[float] = None
    at: float = -math.inf


@dataclass(eq=False)
class _Gpu:
    index: int
    handle: Any
    info: GpuInfo
    lost: bool = False
    gpm_samples: list = field(default_factory=list)  # [previous, current], swapped after every GpmSampleGet
    gpm_request: Any = None  # one nvmlGpmMetricsGet_t, reused every tick
    gpm_ids: list = field(default_factory=list)  # the metric ids it asks for, in order
    gpm_prev_at: Optional[float] = None
    pcie: _Rate = field(default_factory=_Rate)
    nvlink: _Rate = field(default_factory=_Rate)
    nvlink_prev: Optional[tuple] = None  # (tx KiB, tx µs, rx KiB, rx µs) of the previous field-value read

    @property
    def uses_gpm(self) -> bool:
        return self.gpm_request is not None


class NvmlSource:
    """GPU telemetry from NVML (``kind = "nvml"``).

    ``indices``: NVML indices to sample (default all). ``slow_refresh_s``: period of the background thread that
    reads PCIe/NVLink throughput on GPUs without GPM; ``None`` starts no thread (call
    ``refresh_slow_metrics()`` yourself). ``on_call(name, seconds)``: optional hook timed around every NVML
    call (for the bench); without it the tick does no extra timing. ``use_gpm=False`` takes the pre-Hopper path
    even where GPM exists (to compare the two). ``last_tick_cost_s``: wall time of the latest ``sample()``.
    Raises ``SourceUnavailable`` when there is no driver, library or GPU.
    """

    kind = "nvml"

    def __init__(self, indices: Optional[Sequence[int]] = None, *,
                 slow_refresh_s: Optional[float] = DEFAULT_SLOW_REFRESH_S, on_call: Optional[OnCall] = None,
                 use_gpm: bool = True):
        self._nv = nv = load_pynvml()
        self._on_call, self._use_gpm = on_call, use_gpm
        self._slow_refresh_s = slow_refresh_s
        self._stale_after_s = 3 * (slow_refresh_s or DEFAULT_SLOW_REFRESH_S)
        self._lock = threading.Lock()  # guards the event queue and the once-only bookkeeping (two threads)
        self._pending: list[tuple[str, str, Optional[str], Optional[int]]] = []  # kind, detail, uuid, xid
        self._unsupported: set[tuple[Optional[int], str]] = set()  # (gpu index, metric): never asked again
        self._reported: set[tuple[Optional[int], str, Any]] = set()  # (gpu index, metric, error): said once
        self._variant: dict[tuple[Optional[int], str], str] = {}  # (gpu index, metric) → the function that works
        self._gpus: list[_Gpu] = []
        self._by_handle: dict[Any, _Gpu] = {}
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._driver_version = self._nvml_version = None
        self._closed = False
        self.last_tick_cost_s: Optional[float] = None
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            hint = "no NVIDIA driver found" if exc.value in _NO_DRIVER_CODES else "NVML failed to start"
            raise SourceUnavailable(f"NVML unavailable: {hint} ({exc}). {NO_DRIVER_HINT}") from None
        try:
            self._open(indices)
        except BaseException:
            self.close()
            raise

    # --- start ---------------------------------------------------------------------------------------------

    def _open(self, indices: Optional[Sequence[int]]) -> None:
        q = self._query
        count = q(None, "device_count", "nvmlDeviceGetCount") or 0
        if count == 0:
            raise SourceUnavailable(f"NVML found no GPU on this machine. {NO_DRIVER_HINT}")
        wanted = list(range(count)) if indices is None else list(indices)
        bad = [i for i in wanted if not 0 <= i < count]
        if bad:
            raise ValueError(f"GPU indices {bad} do not exist; NVML sees {count} GPU(s): 0..{count - 1}")
        self._driver_version = q(None, "driver_version", "nvmlSystemGetDriverVersion")
        self._nvml_version = q(None, "nvml_version", "nvmlSystemGetNVMLVersion")
        self._event_set = q(None, "xid_register", "nvmlEventSetCreate")
        for index in wanted:
            handle = q(None, "handle", "nvmlDeviceGetHandleByIndex", index)
            uuid = q(None, "uuid", "nvmlDeviceGetUUID", handle) if handle is not None else None
            if uuid is None:
                self._emit(EVENT_SOURCE_ERROR, f"GPU {index}: cannot read its handle or UUID; not sampled", None)
                continue
            gpu = _Gpu(index, handle, GpuInfo(uuid=uuid, index=index, name=f"GPU {index}"))
            self._gpus.append(gpu)
            try:
                self._describe(gpu)
            except _GpuLost:
                pass  # stays in the inventory as far as it was read; the gpu_lost event says the rest
        self._by_handle = {_handle_key(g.handle): g for g in self._gpus}
        if self._slow_refresh_s is not None and any(not g.uses_gpm and not g.lost for g in self._gpus):
            self._thread = threading.Thread(target=self._slow_loop, name="trimtab-nvml-slow", daemon=True)
            self._thread.start()

    def _describe(self, gpu: _Gpu) -> None:
        """Read the static facts of one GPU, set up GPM and register it for XID events."""
        nv, q, handle = self._nv, self._query, gpu.handle
        gpu.info = replace(gpu.info, name=q(gpu, "name", "nvmlDeviceGetName", handle) or gpu.info.name)
        mem = q(gpu, "memory", "nvmlDeviceGetMemoryInfo", handle, version=nv.nvmlMemory_v2)
        gen = q(gpu, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
        width = q(gpu, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle)
        # Links past the GPU's own count answer INVALID_ARGUMENT; a GPU without NVLink answers NOT_SUPPORTED.
        no_link = (nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_NOT_FOUND)
        states = [q(gpu, "nvlink_state", "nvmlDeviceGetNvLinkState", handle, link, quiet=no_link)
                  for link in range(nv.NVML_NVLINK_MAX_LINKS)]
        n_links = sum(1 for state in states if state == nv.NVML_FEATURE_ENABLED)
        support = q(gpu, "gpm_support", "nvmlGpmQueryDeviceSupport", handle)
        gpu.info = replace(gpu.info, memory_total_bytes=int(mem.total) if mem is not None else None,
                           pcie_max_gen=gen, pcie_max_width=width,
                           pcie_peak_bytes_per_s=pcie_peak_bytes_per_s(gen, width),
                           nvlink_link_count=n_links or None,
                           gpm_supported=bool(support is not None and support.isSupportedDevice))
        if gpu.info.gpm_supported and self._use_gpm:
            self._open_gpm(gpu)
        if self._event_set is not None:
            register = lambda: nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
            q(gpu, "xid_register", register, quiet=(nv.NVML_ERROR_NOT_SUPPORTED,))

    def _open_gpm(self, gpu: _Gpu) -> None:
        """Two GPM samples per GPU, allocated once, and one reusable request (it is ~20 KB of ctypes)."""
        samples = [self._query(gpu, "gpm_sample_alloc", "nvmlGpmSampleAlloc") for _ in range(2)]
        gpu.gpm_samples = [sample for sample in samples if sample is not None]
        if len(gpu.gpm_samples) < 2:
            return self._free_gpm(gpu)
        gpu.gpm_request = self._nv.c_nvmlGpmMetricsGet_t()
        gpu.gpm_request.version = self._nv.NVML_GPM_METRICS_GET_VERSION
        self._ask_gpm(gpu, [m for m in _GPM_FIELDS if gpu.info.nvlink_link_count or m not in _GPM_NVLINK_IDS])

    @staticmethod
    def _ask_gpm(gpu: _Gpu, metric_ids: list[int]) -> None:
        metrics = gpu.gpm_request.metrics
        for i, metric_id in enumerate(metric_ids):
            metrics[i].metricId = metric_id
        gpu.gpm_request.numMetrics = len(metric_ids)
        gpu.gpm_ids = metric_ids

    # --- the one door to NVML -----------------------------------------------------------------------------

    def _query(self, gpu: Optional[_Gpu], metric: str, func: Any, *args: Any, quiet: tuple = (),
               **kwargs: Any) -> Any:
        """Call NVML (a function name, a tuple of names to try in order, or a callable); the value or ``None``.

        A later name in a tuple is tried when an earlier one is missing from the bindings or the driver
        (FUNCTION_NOT_FOUND) or NOT_SUPPORTED; the one that works is remembered. ``quiet``: error codes that are
        expected answers (``None``, nothing cached or reported). Raises ``_GpuLost`` after retiring the GPU.
        """
        key = (gpu.index if gpu else None, metric)
        if key in self._unsupported:
            return None
        names = (self._variant[key],) if key in self._variant else (func if isinstance(func, tuple) else (func,))
        nv, on_call, failure = self._nv, self._on_call, None
        for name in names:
            fn = getattr(nv, name, None) if isinstance(name, str) else name
            if fn is None:
                continue
            started = time.perf_counter() if on_call else 0.0
            try:
                value = fn(*args, **kwargs)
            except nv.NVMLError as exc:
                failure = exc
                if exc.value in (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED):
                    continue
                break
            except Exception as exc:  # NVMLLibraryMismatchError, ctypes errors: a metric must not end the tick
                failure = exc
                break
            finally:
                if on_call:
                    on_call(metric, time.perf_counter() - started)
            if len(names) > 1:
                self._variant[key] = name
            return value
        code = getattr(failure, "value", None)
        if failure is None or code in (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED):
            if code not in quiet:
                self._unsupported.add(key)
        elif code == nv.NVML_ERROR_GPU_IS_LOST and gpu is not None:
            self._retire(gpu)
            raise _GpuLost(gpu.info.uuid)
        elif code not in quiet:
            self._report_once(gpu, metric, code if code is not None else type(failure).__name__, failure)
        return None

    def _report_once(self, gpu: Optional[_Gpu], metric: str, what: Any, error: Any) -> None:
        key = (gpu.index if gpu else None, metric, what)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        where = f"GPU {gpu.index}" if gpu else "NVML"
        self._emit(EVENT_SOURCE_ERROR, f"{where}: reading {metric} failed: {error} (reported once)",
                   gpu.info.uuid if gpu else None)

    def _retire(self, gpu: _Gpu) -> None:
        with self._lock:
            if gpu.lost:
                return
            gpu.lost = True
        self._emit(EVENT_GPU_LOST, f"GPU {gpu.index} is lost (NVML GPU_IS_LOST); no longer sampled", gpu.info.uuid)

    def _emit(self, kind: str, detail: str, gpu_uuid: Optional[str], xid: Optional[int] = None) -> None:
        with self._lock:
            self._pending.append((kind, detail, gpu_uuid, xid))

    # --- the tick ------------------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        return Inventory(gpus=[g.info for g in self._gpus], simulated=False,
                         driver_version=self._driver_version, nvml_version=self._nvml_version)

    def unsupported(self) -> list[tuple[Optional[int], str]]:
        """(GPU index or None, metric) pairs that answered NOT_SUPPORTED and are no longer asked."""
        return sorted(self._unsupported, key=str)

    def sample(self, ts_ms: int) -> Readings:
        started = time.perf_counter()
        readings = Readings()
        now = time.monotonic()
        procs_due = now >= getattr(self, "_procs_due_at", 0.0)
        if procs_due:
            self._procs_due_at = now + PROCESSES_EVERY_S
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                readings.gpu_samples.append(self._sample_gpu(gpu, ts_ms, readings.processes if procs_due else None))
            except _GpuLost:
                readings.processes[:] = [p for p in readings.processes if p.gpu_uuid != gpu.info.uuid]
        if now >= getattr(self, "_xid_due_at", 0.0):
            self._xid_due_at = now + XID_EVERY_S
            self._poll_xid()
        with self._lock:
            pending, self._pending = self._pending, []
        readings.events = [HealthEvent(ts_ms=ts_ms, kind=k, detail=d, gpu_uuid=u, xid=x) for k, d, u, x in pending]
        self.last_tick_cost_s = time.perf_counter() - started
        return readings

    def _sample_gpu(self, gpu: _Gpu, ts_ms: int, processes: Optional[list[GpuProcess]]) -> GpuSample:
        """One GPU's cheap readings; the process list only when ``processes`` is given (every few seconds)."""
        nv, q, h = self._nv, self._query, gpu.handle
        s = GpuSample(gpu_uuid=gpu.info.uuid, ts_ms=ts_ms)
        util = q(gpu, "util", "nvmlDeviceGetUtilizationRates", h)
        s.util_pct = float(util.gpu) if util is not None else None
        mem = q(gpu, "memory", "nvmlDeviceGetMemoryInfo", h, version=nv.nvmlMemory_v2)
        if mem is not None:  # v2 only: v1 `used` includes `reserved`, so never combine the two
            s.mem_used_bytes, s.mem_reserved_bytes = int(mem.used), int(mem.reserved)
            s.mem_total_bytes = int(mem.total)
        power_mw = q(gpu, "power", "nvmlDeviceGetPowerUsage", h)
        s.power_w = power_mw / 1000.0 if power_mw is not None else None
        temp = q(gpu, "temperature", ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), h,
                 nv.NVML_TEMPERATURE_GPU)
        s.temperature_c = float(temp) if temp is not None else None
        s.sm_clock_mhz = q(gpu, "sm_clock", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        s.clock_event_mask = q(gpu, "clock_events", ("nvmlDeviceGetCurrentClocksEventReasons",
                                                     "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
        procs = None if processes is None else q(gpu, "processes", ("nvmlDeviceGetComputeRunningProcesses_v3",
                                                                    "nvmlDeviceGetComputeRunningProcesses_v2"), h)
        for p in procs or ():
            used = getattr(p, "usedGpuMemory", None)
            processes.append(GpuProcess(gpu_uuid=gpu.info.uuid, ts_ms=ts_ms, pid=int(p.pid),
                                        used_memory_bytes=int(used) if used is not None else None))
        if gpu.uses_gpm:
            self._read_gpm(gpu, s)
        else:
            self._read_slow_cache(gpu, s)
        return s

    def _read_gpm(self, gpu: _Gpu, s: GpuSample) -> None:
        """Take a GPM sample and compute metrics against the previous one (> 100 ms older). A tick that comes
        sooner takes no sample, keeping the older one as the base, and leaves the GPM fields None."""
        now = time.monotonic()
        if gpu.gpm_prev_at is not None and now - gpu.gpm_prev_at <= GPM_MIN_INTERVAL_S:
            return
        previous, current = gpu.gpm_samples
        if self._query(gpu, "gpm_sample_get", "nvmlGpmSampleGet", gpu.handle, current) is None:
            gpu.gpm_prev_at = None
            return
        if gpu.gpm_prev_at is not None:
            request = gpu.gpm_request
            request.sample1, request.sample2 = previous, current
            if self._query(gpu, "gpm_metrics_get", "nvmlGpmMetricsGet", request) is not None:
                self._apply_gpm(gpu, s)
        gpu.gpm_samples.reverse()
        gpu.gpm_prev_at = now

    def _apply_gpm(self, gpu: _Gpu, s: GpuSample) -> None:
        """Each metric has its own return code: NOT_SUPPORTED ones are dropped from the request for good.
        (pynvml's structs make every attribute read cost ~0.4 µs, hence the ids kept on our side.)"""
        nv, keep = self._nv, []
        for metric_id, m in zip(gpu.gpm_ids, gpu.gpm_request.metrics):
            name, factor = _GPM_FIELDS[metric_id]
            ret = m.nvmlReturn
            if ret == nv.NVML_SUCCESS:
                setattr(s, name, _finite(m.value * factor))
            elif ret == nv.NVML_ERROR_NOT_SUPPORTED:
                self._unsupported.add((gpu.index, f"gpm:{name}"))
                continue
            else:
                self._report_once(gpu, f"gpm:{name}", ret, f"NVML error {ret}")
            keep.append(metric_id)
        if len(keep) < len(gpu.gpm_ids):
            self._ask_gpm(gpu, keep)

    def _read_slow_cache(self, gpu: _Gpu, s: GpuSample) -> None:
        now = time.monotonic()
        for rate, tx_field, rx_field in ((gpu.pcie, "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
                                         (gpu.nvlink, "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")):
            if now - rate.at <= self._stale_after_s:
                setattr(s, tx_field, rate.tx)
                setattr(s, rx_field, rate.rx)

    def _poll_xid(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        for _ in range(_MAX_EVENTS_PER_TICK):  # non-blocking; TIMEOUT means "no event waiting"
            data = self._query(None, "events", ("nvmlEventSetWait_v2", "nvmlEventSetWait"), self._event_set, 0,
                               quiet=(nv.NVML_ERROR_TIMEOUT,))
            if data is None:
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                gpu = self._by_handle.get(_handle_key(data.device))
                where = f"GPU {gpu.index}" if gpu else "a GPU"
                self._emit(EVENT_XID, f"XID {data.eventData} on {where}", gpu.info.uuid if gpu else None,
                           int(data.eventData))

    # --- GPUs without GPM: one slow thread -----------------------------------------------------------------

    def _slow_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_slow_metrics()
            except Exception as exc:  # the thread must outlive any surprise; say so once
                self._report_once(None, "slow_refresh", type(exc).__name__, exc)
            self._stop.wait(self._slow_refresh_s)

    def refresh_slow_metrics(self) -> None:
        """Read PCIe throughput (blocking ~20 ms per call) and NVLink counters of every GPU without GPM."""
        nv, q = self._nv, self._query
        for gpu in self._gpus:
            if gpu.lost or gpu.uses_gpm or self._stop.is_set():
                continue
            try:
                # KB/s per nvml.h, taken as KiB/s like NVML's other "KB" figures (to confirm against GPM)
                tx, rx = (q(gpu, "pcie_throughput", "nvmlDeviceGetPcieThroughput", gpu.handle, counter)
                          for counter in (nv.NVML_PCIE_UTIL_TX_BYTES, nv.NVML_PCIE_UTIL_RX_BYTES))
                gpu.pcie = _Rate(tx * 1024.0 if tx is not None else None, rx * 1024.0 if rx is not None else None,
                                 time.monotonic())
                if gpu.info.nvlink_link_count:
                    self._refresh_nvlink(gpu)
            except _GpuLost:
                continue

    def _refresh_nvlink(self, gpu: _Gpu) -> None:
        nv = self._nv
        ids = [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
               (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS)]
        values = self._query(gpu, "nvlink_fields", "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if values is None:
            return
        for v in values:
            if v.nvmlReturn != nv.NVML_SUCCESS:
                if v.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED:
                    self._unsupported.add((gpu.index, "nvlink_fields"))
                else:
                    self._report_once(gpu, "nvlink_fields", v.nvmlReturn, f"NVML error {v.nvmlReturn}")
                gpu.nvlink, gpu.nvlink_prev = _Rate(), None
                return
        tx, rx = values[0], values[1]
        now = (_field_number(tx), tx.timestamp, _field_number(rx), rx.timestamp)
        prev, gpu.nvlink_prev = gpu.nvlink_prev, now
        if prev is not None:
            gpu.nvlink = _Rate(_kib_rate(prev[0], prev[1], now[0], now[1]),
                               _kib_rate(prev[2], prev[3], now[2], now[3]), time.monotonic())

    # --- end -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread, free GPM samples and the event set, and shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for gpu in self._gpus:
            self._free_gpm(gpu)
        if self._event_set is not None:
            self._query(None, "event_set_free", "nvmlEventSetFree", self._event_set)
            self._event_set = None
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()

    def _free_gpm(self, gpu: _Gpu) -> None:
        for sample in gpu.gpm_samples:
            self._query(None, "gpm_sample_free", "nvmlGpmSampleFree", sample)
        gpu.gpm_samples, gpu.gpm_request = [], None


def _field_number(v: Any) -> float:
    """The number in an ``nvmlFieldValue_t``, read through the union member its ``valueType`` names."""
    return getattr(v.value, _VALUE_MEMBERS[v.valueType])


def _kib_rate(kib0: float, us0: int, kib1: float, us1: int) -> Optional[float]:
    """Bytes/s between two cumulative KiB readings stamped in µs; None across a wrap or reset."""
    if us1 <= us0 or kib1 < kib0:
        return None
    return (kib1 - kib0) * 1024.0 / ((us1 - us0) / 1e6)
