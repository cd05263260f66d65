"""A no-cost stand-in for ``libnvidia-ml`` under the real ``pynvml`` bindings (``bench/nvml_tick.py --fake-nvml``):
every function returns NVML_SUCCESS at once, writing only what start-up needs (a GPU count, handles, UUIDs, GPM
support) and, for the per-process utilization call (either function), ``FAKE_ACTIVITY_RECORDS`` records — so a run
without a GPU times the bindings' and trimtab's own Python, not NVML's.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

FAKE_ACTIVITY_RECORDS = 2  # per call: one record per busy process, two processes (as on the H100, driver 580)


def _ok(*_args: Any) -> int:
    return 0  # NVML_SUCCESS, touching nothing


class NoCostNvmlLibrary:
    """Stands in for the ``CDLL`` of libnvidia-ml under the real bindings: every function returns NVML_SUCCESS at
    once, writing only what start-up needs (a GPU count, handles, UUIDs, GPM support). Per-tick values stay 0."""

    def __init__(self, nv: Any, n_gpus: int, nvlink_links: int = 0):
        self.nv, self.n_gpus, self.nvlink_links = nv, n_gpus, nvlink_links

    def __getattr__(self, name: str) -> Callable[..., int]:
        special = getattr(type(self), "_" + name, None)
        if special is not None:
            return special.__get__(self)
        if name.startswith("nvml"):
            return _ok
        raise AttributeError(name)

    def _nvmlDeviceGetCount_v2(self, count) -> int:
        count._obj.value = self.n_gpus
        return 0

    def _nvmlDeviceGetHandleByIndex_v2(self, index, device) -> int:
        ctypes.cast(ctypes.byref(device._obj), ctypes.POINTER(ctypes.c_void_p))[0] = index.value + 1
        return 0

    def _nvmlDeviceGetUUID(self, handle, buffer, _size) -> int:
        buffer.value = f"GPU-nocost-{ctypes.cast(handle, ctypes.c_void_p).value - 1}".encode()
        return 0

    def _nvmlDeviceGetName(self, _handle, buffer, _size) -> int:
        buffer.value = b"no-cost NVML stand-in"
        return 0

    def _nvmlSystemGetDriverVersion(self, buffer, _size) -> int:
        buffer.value = b"none (no-cost stand-in)"
        return 0

    _nvmlSystemGetNVMLVersion = _nvmlSystemGetDriverVersion

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, _handle, out) -> int:
        out._obj.value = 5
        return 0

    def _nvmlDeviceGetMaxPcieLinkWidth(self, _handle, out) -> int:
        out._obj.value = 16
        return 0

    def _nvmlDeviceGetNvLinkState(self, _handle, link, out) -> int:
        if link >= self.nvlink_links:
            return self.nv.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = self.nv.NVML_FEATURE_ENABLED
        return 0

    def _nvmlGpmQueryDeviceSupport(self, _handle, out) -> int:
        out._obj.isSupportedDevice = 1
        return 0

    def _nvmlEventSetWait_v2(self, _event_set, _data, _timeout) -> int:
        return self.nv.NVML_ERROR_TIMEOUT  # no event waiting, as on a healthy GPU

    def _nvmlDeviceGetProcessesUtilizationInfo(self, _handle, info) -> int:
        """Records on every call, as on a GPU with two busy processes: with no buffer (or one too small) the count,
        else the records, copied in one C call from a template (filling them field by field in Python would time the
        stand-in, not us)."""
        info = info._obj
        template = self._template(self.nv.c_nvmlProcessUtilizationInfo_v1_t)
        if not info.procUtilArray or info.processSamplesCount < FAKE_ACTIVITY_RECORDS:
            info.processSamplesCount = FAKE_ACTIVITY_RECORDS
            return self.nv.NVML_ERROR_INSUFFICIENT_SIZE
        ctypes.memmove(info.procUtilArray, template, ctypes.sizeof(template))
        info.processSamplesCount = FAKE_ACTIVITY_RECORDS
        return 0

    def _nvmlDeviceGetProcessUtilization(self, _handle, samples, count, _last_seen) -> int:
        """The older function, the same records in its own struct."""
        count = count._obj
        template = self._template(self.nv.c_nvmlProcessUtilizationSample_t)
        if not samples or count.value < FAKE_ACTIVITY_RECORDS:
            count.value = FAKE_ACTIVITY_RECORDS
            return self.nv.NVML_ERROR_INSUFFICIENT_SIZE
        ctypes.memmove(samples, template, ctypes.sizeof(template))
        count.value = FAKE_ACTIVITY_RECORDS
        return 0

    def _template(self, ctype: Any) -> Any:
        templates = self.__dict__.setdefault("_templates", {})
        if ctype not in templates:
            templates[ctype] = (ctype * FAKE_ACTIVITY_RECORDS)()
            for i, record in enumerate(templates[ctype]):  # one a busy process, its mean over the time since
                record.pid, record.timeStamp, record.smUtil, record.memUtil = 1000 + i, 1, 40, 10
        return templates[ctype]


def install_no_cost_nvml(nv: Any, n_gpus: int) -> None:
    nv.nvmlLib = NoCostNvmlLibrary(nv, n_gpus)
    nv._nvmlGetFunctionPointer_cache.clear()


