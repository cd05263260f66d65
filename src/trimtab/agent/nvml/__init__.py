"""NVML metric source: the call layer (``calls``, the only module importing ``pynvml``) and the source built on
it — the tick's prepared calls (``tick``), GPM (``gpm``), the background thread (``slow``), XIDs (``xid``), and
per-process utilization read off the tick by a thread of its own (``activity``, ``activity_reader``, ``procutil``)."""

from trimtab.agent.nvml.calls import NO_DRIVER_HINT, load_pynvml
from trimtab.agent.nvml.source import NvmlSource

__all__ = ["NO_DRIVER_HINT", "NvmlSource", "load_pynvml"]
