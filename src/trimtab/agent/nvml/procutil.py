"""The ways to make NVML's per-process utilization call, and picking the cheapest that answers.

Two NVML functions give the same records (pid, timestamp, SM %, memory %), fields in another order:
``nvmlDeviceGetProcessesUtilizationInfo`` (a v1 struct, newer drivers) and ``nvmlDeviceGetProcessUtilization``.
pynvml's wrapper of either makes **two** C calls a read — one with no buffer to learn the record count, then one
for the records — and on an H100 (driver 580) a read cost 2.7–2.9 ms. :class:`OneCall` makes one C call into a
buffer it keeps (grown and retried when NVML answers INSUFFICIENT_SIZE), exactly as the wrapper's second call.
:func:`candidates` lists every way these bindings have; the reader times each at its first read and keeps the
cheapest that answers (bench/nvml_tick.py prints their costs side by side).

A record :class:`OneCall` returns lives in its buffer: read its fields before the next call.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, NamedTuple

NEW, OLD = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"
ACTIVITY_CALLS = (NEW, OLD)  # newest first
# Each function's record struct and the fields read, in the struct's order (``structs`` reads them in one C call).
RECORD_STRUCTS = {NEW: ("c_nvmlProcessUtilizationInfo_v1_t", ("timeStamp", "pid", "smUtil", "memUtil")),
                  OLD: ("c_nvmlProcessUtilizationSample_t", ("pid", "timeStamp", "smUtil", "memUtil"))}
ONE_CALL = " (one C call)"
_FIRST_CAPACITY = 16  # records; a GPU rarely has more busy processes


class Way(NamedTuple):
    """One way to read the records: its label (the function's name, + ``ONE_CALL``), the NVML function it calls,
    and ``call(handle, last_seen_us)`` → the records (raises ``NVMLError``; NOT_FOUND: no record since)."""

    label: str
    function: str
    call: Callable[[Any, int], Any]


class OneCall:
    """``call(handle, last_seen_us)`` in one C call into a buffer kept between reads."""

    def __init__(self, nv: Any, function: str):
        self.nv, self.function = nv, function
        self._fn = nv._nvmlGetFunctionPointer(function)  # NVMLError(FUNCTION_NOT_FOUND) where the driver lacks it
        self._record = getattr(nv, RECORD_STRUCTS[function][0])
        self._grow(_FIRST_CAPACITY)
        if function == NEW:
            self._info = nv.c_nvmlProcessesUtilizationInfo_v1_t()
            self._info.version = nv.ProcessesUtilizationInfo_v1
        else:
            self._count = ctypes.c_uint(0)

    def _grow(self, capacity: int) -> None:
        self.capacity = capacity
        self._buffer = (self._record * capacity)()

    def __call__(self, handle: Any, last_seen_us: int) -> Any:
        nv = self.nv
        for _ in range(3):  # more busy processes than the buffer holds: grow to what NVML says, and again
            if self.function == NEW:
                info = self._info
                info.processSamplesCount = self.capacity
                info.lastSeenTimeStamp = last_seen_us
                info.procUtilArray = self._buffer
                ret = self._fn(handle, ctypes.byref(info))
                count = info.processSamplesCount
            else:
                self._count.value = self.capacity
                ret = self._fn(handle, self._buffer, ctypes.byref(self._count), ctypes.c_ulonglong(last_seen_us))
                count = self._count.value
            if ret == nv.NVML_ERROR_INSUFFICIENT_SIZE:
                self._grow(max(count, 2 * self.capacity))
                continue
            if ret != nv.NVML_SUCCESS:
                raise nv.NVMLError(ret)
            return self._buffer[0:min(count, self.capacity)]
        raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_SIZE)


def candidates(nv: Any) -> list[Way]:
    """Every way these bindings have to read the records, newest function first, one C call before the wrapper."""
    ways = []
    one_call = hasattr(nv, "_nvmlGetFunctionPointer") and hasattr(nv, "c_nvmlProcessesUtilizationInfo_v1_t")
    for function in ACTIVITY_CALLS:
        if one_call and hasattr(nv, RECORD_STRUCTS[function][0]):
            try:
                ways.append(Way(function + ONE_CALL, function, OneCall(nv, function)))
            except nv.NVMLError:  # not in this driver: the wrapper will say so too
                pass
        wrapper = getattr(nv, function, None)
        if wrapper is not None:
            ways.append(Way(function, function, wrapper))
    return ways
