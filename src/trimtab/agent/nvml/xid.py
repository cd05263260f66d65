"""XID critical errors as health events: one NVML event set for all GPUs, polled without blocking."""

from __future__ import annotations

from typing import Any, Optional

from trimtab.agent.nvml.calls import NvmlCalls, OnCall
from trimtab.agent.nvml.device import handle_key
from trimtab.contract.readings import EVENT_XID

XID_EVERY_S = 2.0  # XIDs are rare: polled every few ticks, not on every one
_MAX_EVENTS_PER_POLL = 32
EVENT_WAIT = ("nvmlEventSetWait_v2", "nvmlEventSetWait")


class XidWatch:
    def __init__(self, calls: NvmlCalls, on_call: Optional[OnCall] = None):
        self.calls, self.on_call = calls, on_call
        self.event_set: Any = calls.call(None, "xid_register", "nvmlEventSetCreate")
        self._by_handle: dict[Any, Any] = {}

    def register(self, gpu: Any) -> None:
        """Ask for ``gpu``'s XIDs (a GPU that cannot report them is simply not watched)."""
        if self.event_set is None:
            return
        nv = self.calls.nv
        register = lambda: nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, self.event_set)
        self.calls.call(gpu, "xid_register", register, quiet=(nv.NVML_ERROR_NOT_SUPPORTED,))

    def name(self, gpus: list) -> None:
        """The GPUs an event may name (by handle)."""
        self._by_handle = {handle_key(g.handle): g for g in gpus}

    def poll(self) -> None:
        """Turn the XIDs waiting in the event set into events (non-blocking; TIMEOUT means none waits)."""
        if self.event_set is None:
            return
        nv = self.calls.nv
        for _ in range(_MAX_EVENTS_PER_POLL):
            data = self.calls.call(None, "events", EVENT_WAIT, self.event_set, 0, quiet=(nv.NVML_ERROR_TIMEOUT,),
                                   on_call=self.on_call)
            if data is None:
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                gpu = self._by_handle.get(handle_key(data.device))
                where = f"GPU {gpu.index}" if gpu else "a GPU"
                self.calls.emit(EVENT_XID, f"XID {data.eventData} on {where}", gpu.info.uuid if gpu else None,
                                int(data.eventData))

    def close(self) -> None:
        if self.event_set is not None:
            self.calls.call(None, "event_set_free", "nvmlEventSetFree", self.event_set)
            self.event_set = None
