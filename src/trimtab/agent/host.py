"""Host metric source (psutil): CPU, load, memory, and network and disk rates of the machine the agent runs on."""

from __future__ import annotations

import time
from typing import Optional

import psutil

from trimtab.contract.readings import HostSample, Readings
from trimtab.agent.source import Inventory


def _rate(now: Optional[int], before: Optional[int], dt_s: float) -> Optional[float]:
    """Bytes/s between two counter readings; None without both, or when the counter went back (NIC gone, reset)."""
    if now is None or before is None or dt_s <= 0 or now < before:
        return None
    return (now - before) / dt_s


class HostSource:
    """The host as one ``HostSample`` per tick (``kind = "host"``); no GPUs in its inventory.

    Everything measured over an interval (CPU %, network and disk rates) is over the time since the previous
    ``sample()``, so the first call reports ``None`` for those. Network sums every interface but loopback; disk
    sums every disk psutil sees (``None`` where it sees none, as in some containers).
    """

    kind = "host"

    def __init__(self) -> None:
        psutil.cpu_percent(None)  # starts psutil's CPU interval; the next call reports since this one
        self._loopback = {name for name, st in psutil.net_if_stats().items()
                          if "loopback" in getattr(st, "flags", "") or name in ("lo", "lo0")}
        self._prev: Optional[tuple[float, Optional[int], Optional[int], Optional[int], Optional[int]]] = None

    def inventory(self) -> Inventory:
        return Inventory()

    def _counters(self) -> tuple[float, Optional[int], Optional[int], Optional[int], Optional[int]]:
        """(monotonic s, net rx, net tx, disk read, disk write) — cumulative bytes."""
        nics = psutil.net_io_counters(pernic=True)
        rx = sum(c.bytes_recv for name, c in nics.items() if name not in self._loopback) if nics else None
        tx = sum(c.bytes_sent for name, c in nics.items() if name not in self._loopback) if nics else None
        disk = psutil.disk_io_counters()
        read, write = (disk.read_bytes, disk.write_bytes) if disk is not None else (None, None)
        return time.monotonic(), rx, tx, read, write

    def sample(self, ts_ms: int) -> Readings:
        now = self._counters()
        cpu = psutil.cpu_percent(None)
        mem = psutil.virtual_memory()
        s = HostSample(ts_ms=ts_ms, load1=psutil.getloadavg()[0],
                       mem_used_bytes=int(mem.total - mem.available), mem_total_bytes=int(mem.total))
        if self._prev is not None:
            dt = now[0] - self._prev[0]
            s.cpu_pct = cpu
            s.net_rx_bytes_per_s, s.net_tx_bytes_per_s, s.disk_read_bytes_per_s, s.disk_write_bytes_per_s = (
                _rate(n, b, dt) for n, b in zip(now[1:], self._prev[1:]))
        self._prev = now
        return Readings(host_sample=s)

    def close(self) -> None:
        """Nothing to release."""
