"""One GPU as the NVML source sees it: its handle, the facts read once at start, and the state its readers keep."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from typing import Any

from trimtab.agent.nvml.calls import NvmlCalls
from trimtab.agent.pcie import pcie_peak_bytes_per_s
from trimtab.contract.readings import GpuInfo


@dataclass(eq=False)
class Gpu:
    index: int
    handle: Any
    info: GpuInfo
    lost: bool = False
    links: tuple[int, ...] = ()  # NVML indices of the active NVLink links
    gpm: Any = None  # trimtab.agent.nvml.gpm.Gpm where GPM is used, else None
    slow: Any = None  # trimtab.agent.nvml.slow.SlowCache: what the background thread read last
    tick: Any = None  # trimtab.agent.nvml.tick.GpuTick: the calls of every tick, prepared once
    activity: Any = None  # trimtab.agent.nvml.activity.ProcessActivity, or None when not read

    @property
    def uses_gpm(self) -> bool:
        return self.gpm is not None


def handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle, equal for two ctypes pointers to the same device."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def describe(calls: NvmlCalls, gpu: Gpu) -> None:
    """Read the static facts of one GPU into ``gpu.info`` and ``gpu.links``. May raise ``GpuLost``."""
    nv, q, handle = calls.nv, calls.call, gpu.handle
    gpu.info = replace(gpu.info, name=q(gpu, "name", "nvmlDeviceGetName", handle) or gpu.info.name)
    mem = q(gpu, "memory", "nvmlDeviceGetMemoryInfo", handle, version=nv.nvmlMemory_v2)
    gen = q(gpu, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    width = q(gpu, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle)
    # Links past the GPU's own count answer INVALID_ARGUMENT; a GPU without NVLink answers NOT_SUPPORTED.
    no_link = (nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_NOT_FOUND)
    states = [q(gpu, "nvlink_state", "nvmlDeviceGetNvLinkState", handle, link, quiet=no_link)
              for link in range(nv.NVML_NVLINK_MAX_LINKS)]
    gpu.links = tuple(link for link, state in enumerate(states) if state == nv.NVML_FEATURE_ENABLED)
    support = q(gpu, "gpm_support", "nvmlGpmQueryDeviceSupport", handle)
    gpu.info = replace(gpu.info, memory_total_bytes=int(mem.total) if mem is not None else None,
                       pcie_max_gen=gen, pcie_max_width=width,
                       pcie_peak_bytes_per_s=pcie_peak_bytes_per_s(gen, width),
                       nvlink_link_count=len(gpu.links) or None,
                       gpm_supported=bool(support is not None and support.isSupportedDevice))
