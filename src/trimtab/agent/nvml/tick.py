"""The tick's hot path for one GPU: the cheap NVML calls it makes every tick, prepared once, and the sample
built from their values.

Each call is a bindings function with its arguments bound at start; the loop calls them straight, with nothing
around a call that does not raise, and one function puts all their values into the sample. A call that
raises goes to the call layer (``NvmlCalls.failed``): a later variant is tried where one is named (the
deprecated name after its successor), an unsupported call leaves the list for good, a lost GPU ends the GPU's
tick. The sample is built from a prepared dict of its fields rather than through the dataclass constructor
(about half the cost), and struct fields are read in one C call (``trimtab.agent.nvml.structs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from trimtab.agent.activity import NO_SHARES, Shares
from trimtab.agent.nvml.calls import NvmlCalls, OnCall, timed
from trimtab.agent.nvml.structs import field_reader
from trimtab.contract.readings import GpuProcess, GpuSample

_new_sample = object.__new__


class Read:
    """One call of the tick: the metric it feeds, its slot among the tick's results, the functions to try
    (newest first) and its arguments. ``call`` is the function in use (timed when the source has an ``on_call``
    hook)."""

    __slots__ = ("metric", "slot", "functions", "args", "call", "_on_call")

    def __init__(self, metric: str, slot: int, functions: list, args: tuple, on_call: Optional[OnCall]):
        self.metric, self.slot, self.functions, self.args, self._on_call = metric, slot, functions, args, on_call
        self.call = self._wrap(functions[0])

    def _wrap(self, fn: Callable) -> Callable:
        return fn if self._on_call is None else timed(self._on_call, self.metric, fn)

    def next_variant(self) -> bool:
        """Move on to the next function to try; False when there is none."""
        if len(self.functions) < 2:
            return False
        self.functions = self.functions[1:]
        self.call = self._wrap(self.functions[0])
        return True


def tick_calls(nv: Any, handle: Any) -> list[tuple[str, Any, tuple]]:
    """(metric, function name or names to try in order, arguments) of every call a tick makes for one GPU, in
    the order of their slots in :func:`putter`."""
    return [
        ("util", "nvmlDeviceGetUtilizationRates", (handle,)),
        ("memory", "nvmlDeviceGetMemoryInfo", (handle, nv.nvmlMemory_v2)),
        ("power", "nvmlDeviceGetPowerUsage", (handle,)),
        ("temperature", ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), (handle, nv.NVML_TEMPERATURE_GPU)),
        ("sm_clock", "nvmlDeviceGetClockInfo", (handle, nv.NVML_CLOCK_SM)),
        ("clock_events", ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
         (handle,)),
    ]


def putter(nv: Any) -> Callable[[dict, list], None]:
    """``put(values, results)``: the tick's results (by slot; None = not read) into a sample's fields, in one
    function rather than one a metric (a Python call is a noticeable share of a call this cheap)."""
    util_of = field_reader(nv.c_nvmlUtilization_t, ("gpu",))
    memory_of = field_reader(nv.c_nvmlMemory_v2_t, ("total", "reserved", "used"))

    def put(values: dict, results: list) -> None:
        util, memory, power_mw, temperature, values["sm_clock_mhz"], values["clock_event_mask"] = results
        if util is not None:
            values["util_pct"] = float(util_of(util)[0])
        if memory is not None:  # v2 only: v1 `used` includes `reserved`, so never combine the two
            values["mem_total_bytes"], values["mem_reserved_bytes"], values["mem_used_bytes"] = memory_of(memory)
        if power_mw is not None:
            values["power_w"] = power_mw / 1000.0
        if temperature is not None:
            values["temperature_c"] = float(temperature)

    return put


class GpuTick:
    """One GPU's every-tick calls and the sample they make."""

    def __init__(self, calls: NvmlCalls, gpu: Any, on_call: Optional[OnCall] = None):
        self.calls, self.gpu = calls, gpu
        self.reads: list[Read] = []
        wanted = tick_calls(calls.nv, gpu.handle)
        for slot, (metric, names, args) in enumerate(wanted):
            functions = calls.functions(names)
            if functions:
                self.reads.append(Read(metric, slot, functions, args, on_call))
            else:  # none of the names in these bindings
                calls.mark_unsupported(gpu, metric)
        self._slots = len(wanted)
        self._put = putter(calls.nv)
        self._plan()
        self.template = {f.name: None for f in dataclasses.fields(GpuSample)}
        self.template["gpu_uuid"] = gpu.info.uuid

    def _plan(self) -> None:
        self.plan = [(r.slot, r.call, r.args, r) for r in self.reads]

    def sample(self, ts_ms: int) -> GpuSample:
        """Make the calls and return the sample (GPM and slow-thread fields are the caller's). May raise
        ``GpuLost``."""
        results = [None] * self._slots
        for slot, call, args, read in self.plan:
            try:
                results[slot] = call(*args)
            except Exception as exc:  # noqa: BLE001 - rare; the call layer says what it means
                results[slot] = self._failed(read, exc)
        values = self.template.copy()
        values["ts_ms"] = ts_ms
        self._put(values, results)
        sample = _new_sample(GpuSample)
        sample.__dict__ = values
        return sample

    def _failed(self, read: Read, exc: BaseException) -> Any:
        """The value after all (a later variant answered), or None."""
        nv = self.calls.nv
        while isinstance(exc, nv.NVMLError) and exc.value in (nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                                                              nv.NVML_ERROR_NOT_SUPPORTED) and read.next_variant():
            self._plan()
            try:
                return read.call(*read.args)
            except Exception as again:  # noqa: BLE001
                exc = again
        if self.calls.failed(self.gpu, read.metric, exc):  # unsupported: never asked again
            self.reads.remove(read)
            self._plan()
        return None

    def calls_made(self) -> list[tuple[str, Callable, tuple]]:
        """(metric, bindings function, arguments) of the calls the tick makes now: what a bench times bare."""
        return [(r.metric, r.functions[0], r.args) for r in self.reads]


PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")


def read_processes(calls: NvmlCalls, gpu: Any, ts_ms: int, out: list[GpuProcess],
                   on_call: Optional[OnCall] = None, shares: Shares = NO_SHARES) -> None:
    """Append the processes holding a context on ``gpu`` (host PIDs) to ``out``, each with its activity of the
    interval ``shares`` covers, then the pids seen busy in it that hold no context any more (memory None): their
    GPU time is not dropped."""
    uuid, listed = gpu.info.uuid, set()
    for p in calls.call(gpu, "processes", PROCESS_CALLS, gpu.handle, on_call=on_call) or ():
        pid, used = int(p.pid), getattr(p, "usedGpuMemory", None)
        listed.add(pid)
        out.append(GpuProcess(uuid, ts_ms, pid, int(used) if used is not None else None, None, *shares.of(pid)))
    for pid, activity in shares.busy.items():
        if pid not in listed:
            out.append(GpuProcess(uuid, ts_ms, pid, None, None, *activity))
