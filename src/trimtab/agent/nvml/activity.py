"""Per-process GPU activity from NVML: its per-process utilization samples, one call per GPU per tick, added up
per pid (``trimtab.agent.activity``) until the next process rows carry them.

NVML keeps a short ring of per-process samples per GPU, one for each driver sampling period (1/6 s to 1 s by
product) in which a process was busy: "one sample per process running that had some non-zero utilization during
the sample period" (``nvml.h``). ``nvmlDeviceGetProcessesUtilizationInfo`` (or the older
``nvmlDeviceGetProcessUtilization``) returns the samples newer than the ``lastSeenTimeStamp`` it is given, and
NOT_FOUND when there are none — "nobody was busy since", an answer, not an error.

The rules, in the order they apply:

* **One call per GPU per tick**, passing the newest sample time seen so far, so each tick reads only new samples
  and none is read twice. The ring holds seconds; the process rows come every 5 s, so reading it only then could
  lose samples. A failed call does not move the time on: the next call reads what it missed.
* **The first answer is a baseline**: with ``lastSeenTimeStamp`` 0 NVML returns whatever its ring holds (seconds
  from before the agent started), so those samples are dropped and the interval starts at that tick.
* **Per pid, the mean of SM % and memory % over its samples, their count and the interval** they fall in (why:
  ``trimtab.agent.activity``). NVML does not say its sampling period, so nothing here assumes one.
* **A pid with a context and no sample: 0 %, 0 samples** — only when a call answered (samples for others, or
  NOT_FOUND) in the interval: NVML leaves idle processes out, so absent means idle over what the calls covered.
* **Unknown is None, never 0**: NOT_SUPPORTED (or a function missing from the bindings or driver) leaves the GPU's
  process rows without activity for good; so does the baseline interval, and an interval in which no call answered.
* **Errors**: GPU_IS_LOST retires the GPU (its readings stop, the other GPUs go on); any other error is counted
  (``failed_calls``), logged when the call's state changes (failing with a new code, answering again), said once
  per code as a health event, and ends nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from trimtab.agent.activity import ActivityTally, Shares
from trimtab.agent.nvml.calls import NvmlCalls, OnCall, timed
from trimtab.agent.nvml.structs import field_reader

log = logging.getLogger(__name__)

METRIC = "process_utilization"
# Newest first: the v1 struct call (newer drivers), then the older one; the same samples, fields in another order.
ACTIVITY_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
# Each call's sample struct and the fields read, in the struct's order (one C call reads them: ``structs``).
_SAMPLE_STRUCTS = {
    "nvmlDeviceGetProcessesUtilizationInfo": ("c_nvmlProcessUtilizationInfo_v1_t",
                                              ("timeStamp", "pid", "smUtil", "memUtil")),
    "nvmlDeviceGetProcessUtilization": ("c_nvmlProcessUtilizationSample_t", ("pid", "timeStamp", "smUtil", "memUtil")),
}


class ProcessActivity:
    """One GPU's per-process utilization: :meth:`read` on every tick, :meth:`take` when process rows are made."""

    def __init__(self, calls: NvmlCalls, gpu: Any, on_call: Optional[OnCall] = None):
        self.calls, self.gpu, self._on_call = calls, gpu, on_call
        nv = calls.nv
        self._functions = [(name, getattr(nv, name)) for name in ACTIVITY_CALLS if hasattr(nv, name)]
        self.supported = bool(self._functions)
        self._quiet = (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS)  # no sample since: an answer (pynvml raises 0 too)
        self._absent = (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED)
        self._use(0)
        self.last_seen_us = 0  # the newest sample time read (NVML's clock, µs)
        self.tally = ActivityTally()
        self.failed_calls = 0
        self._failing: Any = None  # the error of the current run of failures; None while answering
        if not self.supported:
            calls.mark_unsupported(gpu, METRIC)

    def _use(self, k: int) -> None:
        """Use the k-th function of those left (a later one after an earlier one proved absent)."""
        if not self._functions:
            return
        self._functions = self._functions[k:]
        name, fn = self._functions[0]
        self.call: Callable = fn if self._on_call is None else timed(self._on_call, METRIC, fn)
        struct_name, names = _SAMPLE_STRUCTS[name]
        ctype = getattr(self.calls.nv, struct_name, None)
        self._fields = _attributes if ctype is None else field_reader(ctype, names)
        self._stamp_first = ctype is not None and names[0] == "timeStamp"

    @property
    def function_name(self) -> Optional[str]:
        """The bindings function in use (the newest that answered), None where there is none."""
        return self._functions[0][0] if self._functions else None

    # --- every tick -----------------------------------------------------------------------------------------

    def read(self, ts_ms: int) -> None:
        """Read the samples since the last one seen and add them up per pid. May raise ``GpuLost``."""
        if not self.supported:
            return
        try:
            samples = self.call(self.gpu.handle, self.last_seen_us)
        except Exception as exc:  # noqa: BLE001 - sorted out below; a metric must not end the tick
            if not isinstance(exc, self.calls.nv.NVMLError) or exc.value not in self._quiet:
                self._failed(exc, ts_ms)
                return
            samples = ()
        if self._failing is not None:
            log.info("GPU %s: %s answers again (%d failed calls so far)", self.gpu.index, METRIC, self.failed_calls)
            self._failing = None
        fields, tally, newest = self._fields, self.tally, self.last_seen_us
        baseline = tally.from_ms is None  # what the ring held before the first answer is no interval of ours
        sums = tally.sums
        for s in samples:  # ActivityTally.add, inlined: up to a dozen samples a GPU a tick
            a, b, sm, mem = fields(s)
            pid, stamp = (b, a) if self._stamp_first else (a, b)
            if stamp > newest:
                newest = stamp
            if baseline:
                continue
            acc = sums.get(pid)
            if acc is None:
                sums[pid] = [sm, mem, 1]
            else:
                acc[0] += sm
                acc[1] += mem
                acc[2] += 1
        self.last_seen_us = newest
        if baseline:
            tally.start(ts_ms)
        else:
            tally.answered(ts_ms)

    def _failed(self, exc: BaseException, ts_ms: int) -> None:
        nv = self.calls.nv
        code = exc.value if isinstance(exc, nv.NVMLError) else type(exc).__name__
        if code in self._absent and len(self._functions) > 1:  # the older call may still be there
            self._use(1)
            self.read(ts_ms)
            return
        self.failed_calls += 1
        if self.calls.failed(self.gpu, METRIC, exc):  # unsupported (remembered); GpuLost propagates
            self.supported = False
            self.tally.forget()
            log.info("GPU %s: per-process utilization unsupported (%s); its process rows carry no activity",
                     self.gpu.index, exc)
            return
        if code != self._failing:
            self._failing = code
            log.warning("GPU %s: reading %s failed: %s (%d failed calls so far; the tick goes on)",
                        self.gpu.index, METRIC, exc, self.failed_calls)

    # --- when process rows are made -------------------------------------------------------------------------

    def take(self) -> Shares:
        """The activity of the interval that ends now, per pid (see ``ActivityTally.take``)."""
        return self.tally.take()


def _attributes(sample: Any) -> tuple:
    """The fields of a sample that is not one of the bindings' structs (read one by one)."""
    return sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil
