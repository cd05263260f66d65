"""A fake ``pynvml`` for the NVML source's error paths, on machines without a GPU.

It is not an NVML simulator (the simulated node is that): it answers with fixed, plausible values and raises
``NVMLError(code)`` where a test tells it to, counting every call. Constants, ctypes structs and the real
``NVMLError`` hierarchy are taken from the installed ``nvidia-ml-py``, so the source sees the same types as on a
GPU machine. Install with ``monkeypatch.setitem(sys.modules, "pynvml", fake.module)``.
"""

from __future__ import annotations

import time
import types
from collections import Counter
from typing import Any, Optional

import pynvml as _real

NVMLError = _real.NVMLError
NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
UNKNOWN = _real.NVML_ERROR_UNKNOWN
TIMEOUT = _real.NVML_ERROR_TIMEOUT
FUNCTION_NOT_FOUND = _real.NVML_ERROR_FUNCTION_NOT_FOUND
NOT_FOUND = _real.NVML_ERROR_NOT_FOUND


class FakeHandle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


class FakeNvml:
    """``n_gpus`` fake GPUs. ``gpm``: whether they report GPM support. ``nvlink_links``: active NVLink links
    (0 = links answer NOT_SUPPORTED, as on the single-GPU H200). ``init_error``: nvmlInit raises this code."""

    def __init__(self, n_gpus: int = 2, *, gpm: bool = False, nvlink_links: int = 0,
                 init_error: Optional[int] = None):
        self.n_gpus, self.gpm, self.nvlink_links, self.init_error = n_gpus, gpm, nvlink_links, init_error
        self.handles = [FakeHandle(i) for i in range(n_gpus)]
        self.calls: Counter = Counter()  # (function name, gpu index or None) → calls
        self.failures: dict[tuple[str, Optional[int]], int] = {}
        self.gpm_returns: dict[int, int] = {}  # GPM metric id → nvmlReturn it answers with
        self.field_values: dict[int, list[tuple[int, int, int]]] = {}  # gpu → [(value KiB, µs, nvmlReturn)] tx, rx
        # gpu → {(field id, link): (value KiB, µs, nvmlReturn)} for field values scoped by link
        self.link_values: dict[int, dict[tuple[int, int], tuple[int, int, int]]] = {}
        self.last_field_ids: dict[int, list[tuple[int, int]]] = {}  # gpu → the (field id, scope) pairs last asked
        self.xid_queue: list[tuple[int, int]] = []  # (gpu index, xid) waiting in the event set
        self.memory_versions: list[Any] = []
        self.activity_since: list[tuple[int, int]] = []  # (gpu, lastSeenTimeStamp) of each process-utilization call
        # The per-process utilization the fake driver answers with: its clock (µs) and, per GPU, the spans each pid was
        # busy (pid, from µs, to µs, SM %). A call answers one record per pid busy since lastSeenTimeStamp: its mean
        # SM % over (lastSeenTimeStamp, the read], as the H100 answered (bench/nvml_process_window.py).
        self.activity_now_us = 0
        self.activity_busy: dict[int, list[tuple[int, int, int, float]]] = {}
        self.activity_delay_s: dict[str, float] = {}  # function name → seconds each call sleeps (a slow driver)
        # True: a record is stamped at its process's last busy instant (≤ the read), as NVML stamps a process whose
        # last sample was early; False: at the read's sampling instant (bench/nvml_process_window.py on the H100)
        self.activity_stamp_last_busy = False
        self.freed: list[str] = []
        self.module = self._build_module()

    def fail(self, function: str, code: int, gpu: Optional[int] = None) -> None:
        """From now on ``function`` raises ``NVMLError(code)`` (for one GPU, or for all with ``gpu=None``)."""
        self.failures[(function, gpu)] = code

    def count(self, function: str, gpu: Optional[int] = None) -> int:
        return self.calls[(function, gpu)]

    # --- the module ----------------------------------------------------------------------------------------

    def _build_module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        for name, value in vars(_real).items():
            if not isinstance(value, types.FunctionType) and not name.startswith("__"):
                setattr(module, name, value)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(module, name, self._counted(name, getattr(self, name)))
        return module

    def _counted(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            gpu = args[0].index if args and isinstance(args[0], FakeHandle) else None
            self.calls[(name, gpu)] += 1
            code = self.failures.get((name, gpu), self.failures.get((name, None)))
            if code is not None:
                raise NVMLError(code)
            return fn(*args, **kwargs)
        return call

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.freed.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.00-fake"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580-fake"

    def nvmlDeviceGetCount(self) -> int:
        return self.n_gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        return self.handles[index]

    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        return f"GPU-fake-{h.index}"

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return "Fake GPU"

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: Any = None) -> Any:
        self.memory_versions.append(version)
        gib = 1 << 30
        memory = _real.c_nvmlMemory_v2_t()
        memory.version, memory.total, memory.reserved, memory.used = version or 0, 80 * gib, gib // 2, 10 * gib
        memory.free = 69 * gib + gib // 2
        return memory

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeHandle) -> int:
        return 4

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeHandle) -> int:
        return 16

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:
        if self.nvlink_links == 0:
            raise NVMLError(NOT_SUPPORTED)
        if link >= self.nvlink_links:
            raise NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _real.NVML_FEATURE_ENABLED

    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> Any:
        return types.SimpleNamespace(version=1, isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        return _real.c_nvmlGpmSample_t()  # a NULL pointer of the real type: the request struct checks it

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed.append("gpm_sample")

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: Any) -> Any:
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.nvmlReturn = self.gpm_returns.get(metric.metricId, _real.NVML_SUCCESS)
            metric.value = 42.0
        return request

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = 50, 20
        return util

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        return 150_000

    def nvmlDeviceGetTemperatureV(self, h: FakeHandle, sensor: int) -> int:
        return 40

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        return 41

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock: int) -> int:
        return 1500

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        return 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: FakeHandle) -> list:
        return [types.SimpleNamespace(pid=1000 + h.index, usedGpuMemory=1 << 30)]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: FakeHandle) -> list:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(h)

    def nvmlDeviceGetProcessesUtilizationInfo(self, h: FakeHandle, last_seen_us: int) -> list:
        return self._activity("nvmlDeviceGetProcessesUtilizationInfo", _real.c_nvmlProcessUtilizationInfo_v1_t, h,
                              last_seen_us)

    def nvmlDeviceGetProcessUtilization(self, h: FakeHandle, last_seen_us: int) -> list:
        return self._activity("nvmlDeviceGetProcessUtilization", _real.c_nvmlProcessUtilizationSample_t, h,
                              last_seen_us)

    def _activity(self, name: str, ctype: Any, h: FakeHandle, last_seen_us: int) -> list:
        self.activity_since.append((h.index, last_seen_us))
        if self.activity_delay_s.get(name):
            time.sleep(self.activity_delay_s[name])
        now, records = self.activity_now_us, []
        for pid in sorted({span[0] for span in self.activity_busy.get(h.index, ())}):
            spans = [(a, b, sm) for p, a, b, sm in self.activity_busy[h.index] if p == pid and b > last_seen_us
                     and a < now]
            if not spans:
                continue
            stamp = now  # the read's sampling instant for every process (bench/nvml_process_window.py on the H100)
            if self.activity_stamp_last_busy:
                stamp = min(now, max(b for _, b, _ in spans))
            busy = sum((min(b, stamp) - max(a, last_seen_us)) * sm / 100 for a, b, sm in spans)
            record = ctype()
            record.pid, record.timeStamp = pid, stamp
            record.smUtil = round(100 * busy / (stamp - last_seen_us))  # NVML's are whole percent
            record.memUtil = record.smUtil // 2
            records.append(record)
        if not records:
            raise NVMLError(NOT_FOUND)  # no process busy since: an answer
        return records

    def nvmlDeviceGetPcieThroughput(self, h: FakeHandle, counter: int) -> int:
        return 1000  # KB/s

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: list) -> Any:
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        self.last_field_ids[h.index] = list(field_ids)
        if all(scope == 0xFFFFFFFF for _, scope in field_ids):  # sums over all links
            readings = self.field_values.get(h.index, [(0, 0, _real.NVML_SUCCESS)] * len(field_ids))
        else:
            per_link = self.link_values.get(h.index, {})
            readings = [per_link.get(key, (0, 0, _real.NVML_SUCCESS)) for key in field_ids]
        for v, (field_id, scope), (kib, us, ret) in zip(values, field_ids, readings):
            v.fieldId, v.scopeId, v.timestamp, v.nvmlReturn = field_id, scope, us, ret
            v.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            v.value.ullVal = kib
        return values

    def nvmlEventSetCreate(self) -> Any:
        return object()

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, event_types: int, event_set: Any) -> None:
        return None

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        if not self.xid_queue:
            raise NVMLError(TIMEOUT)
        gpu, xid = self.xid_queue.pop(0)
        return types.SimpleNamespace(device=self.handles[gpu], eventType=_real.nvmlEventTypeXidCriticalError,
                                     eventData=xid, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed.append("event_set")
