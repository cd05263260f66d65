"""The readings too slow for the tick, read by one background thread whose cached values the tick picks up.

* GPUs without GPM: PCIe throughput (``nvmlDeviceGetPcieThroughput`` samples a 20 ms window and blocks) and the
  NVLink sums (field values ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX`` over all links). The tick copies them
  into every sample while they are fresh (3 refresh periods).
* Every GPU with NVLink links: the same counters per link, all links in one ``nvmlDeviceGetFieldValues`` call
  (scoped by link, as nvitop reads them; ~0.6 ms a call on the H200 even for two fields). Each refresh's rates
  are handed to the next tick once, as per-link readings: per-link NVLink comes every refresh period (default 3 s),
  not every tick. A GPU without NVLink has no per-link readings at all.

Counters are cumulative KiB with a µs timestamp per value; a rate is taken between two refreshes, and is None
across a wrap or reset. Each value has its own return code: NOT_SUPPORTED leaves that value out for good.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from trimtab.agent.nvml.calls import GpuLost, NvmlCalls

DEFAULT_SLOW_REFRESH_S = 3.0
_ALL_LINKS = 0xFFFFFFFF  # field-value scopeId: sum over NVLink links
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by nvmlValueType_t
LinkRates = list[tuple[int, Optional[float], Optional[float]]]  # (link, tx bytes/s, rx bytes/s)


@dataclass
class Rate:
    """A cached reading of the background thread: (tx, rx) bytes/s and when it was taken (monotonic s)."""

    tx: Optional[float] = None
    rx: Optional[float] = None
    at: float = -math.inf


@dataclass(eq=False)
class SlowCache:
    """What the background thread last read for one GPU."""

    pcie: Rate = field(default_factory=Rate)
    nvlink: Rate = field(default_factory=Rate)
    nvlink_prev: Optional[tuple] = None  # (tx KiB, tx µs, rx KiB, rx µs) of the previous sum read
    link_fields: list[tuple[int, int, int]] = field(default_factory=list)  # (field id, link, 0 tx / 1 rx) asked
    link_prev: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)  # (link, dir) → (KiB, µs)
    # The rates of the latest refresh as (refresh number, rates): written by the thread only, while the tick
    # writes only `taken`, so a refresh that lands while a tick takes the previous one is never lost.
    fresh_links: tuple[int, Optional[LinkRates]] = (0, None)
    taken: int = 0

    def put(self, values: dict, stale_after_s: float) -> None:
        """Copy the fresh PCIe and NVLink sums into a sample's ``values`` (GPUs without GPM)."""
        now = time.monotonic()
        for rate, tx_field, rx_field in ((self.pcie, "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
                                         (self.nvlink, "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")):
            if now - rate.at <= stale_after_s:
                values[tx_field] = rate.tx
                values[rx_field] = rate.rx

    def take_links(self) -> Optional[LinkRates]:
        """The per-link rates of the latest refresh, once (None until the next refresh)."""
        refresh, rates = self.fresh_links
        if refresh == self.taken:
            return None
        self.taken = refresh
        return rates

    def give_links(self, rates: Optional[LinkRates]) -> None:
        self.fresh_links = (self.fresh_links[0] + 1, rates)


class SlowReader:
    """The background thread (``refresh_s`` apart; ``None``: no thread, call :meth:`refresh` yourself)."""

    def __init__(self, calls: NvmlCalls, gpus: list, refresh_s: Optional[float]):
        nv = calls.nv
        self.calls, self.gpus, self.refresh_s = calls, gpus, refresh_s
        self.stale_after_s = 3 * (refresh_s or DEFAULT_SLOW_REFRESH_S)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        for gpu in gpus:
            gpu.slow = SlowCache(link_fields=[(fid, link, d) for link in gpu.links for d, fid in enumerate(
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX))])

    def start(self) -> None:
        """Start the thread where some GPU needs it: one without GPM, or one with NVLink links."""
        if self.refresh_s is not None and any((not g.uses_gpm or g.links) and not g.lost for g in self.gpus):
            self._thread = threading.Thread(target=self._loop, name="trimtab-nvml-slow", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the thread must outlive any surprise; say so once
                self.calls.report_once(None, "slow_refresh", type(exc).__name__, exc)
            self._stop.wait(self.refresh_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def refresh(self) -> None:
        """Read PCIe throughput and NVLink sums of every GPU without GPM, and per-link NVLink of every GPU."""
        nv, q = self.calls.nv, self.calls.call
        for gpu in self.gpus:
            if gpu.lost or self._stop.is_set():
                continue
            try:
                if not gpu.uses_gpm:
                    # KB/s per nvml.h, taken as KiB/s like NVML's other "KB" figures (to confirm against GPM)
                    tx, rx = (q(gpu, "pcie_throughput", "nvmlDeviceGetPcieThroughput", gpu.handle, counter)
                              for counter in (nv.NVML_PCIE_UTIL_TX_BYTES, nv.NVML_PCIE_UTIL_RX_BYTES))
                    gpu.slow.pcie = Rate(tx * 1024.0 if tx is not None else None,
                                         rx * 1024.0 if rx is not None else None, time.monotonic())
                    if gpu.links:
                        self._refresh_nvlink_sum(gpu)
                if gpu.slow.link_fields:
                    self._refresh_links(gpu)
            except GpuLost:
                continue

    def _refresh_nvlink_sum(self, gpu: Any) -> None:
        nv, cache = self.calls.nv, gpu.slow
        ids = [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
               (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS)]
        values = self.calls.call(gpu, "nvlink_fields", "nvmlDeviceGetFieldValues", gpu.handle, ids)
        if values is None:
            return
        for v in values:
            if v.nvmlReturn != nv.NVML_SUCCESS:
                self.calls.value_failed(gpu, "nvlink_fields", v.nvmlReturn)
                cache.nvlink, cache.nvlink_prev = Rate(), None
                return
        tx, rx = values[0], values[1]
        now = (field_number(tx), tx.timestamp, field_number(rx), rx.timestamp)
        prev, cache.nvlink_prev = cache.nvlink_prev, now
        if prev is not None:
            cache.nvlink = Rate(kib_rate(prev[0], prev[1], now[0], now[1]),
                                kib_rate(prev[2], prev[3], now[2], now[3]), time.monotonic())

    def _refresh_links(self, gpu: Any) -> None:
        nv, cache = self.calls.nv, gpu.slow
        asked = cache.link_fields
        values = self.calls.call(gpu, "nvlink_link_fields", "nvmlDeviceGetFieldValues", gpu.handle,
                                 [(fid, link) for fid, link, _ in asked])
        if values is None:
            return
        rates: dict[int, list[Optional[float]]] = {}
        keep = []
        for asking, v in zip(asked, values):
            _, link, direction = asking
            key = (link, direction)
            if v.nvmlReturn != nv.NVML_SUCCESS:
                cache.link_prev.pop(key, None)
                if not self.calls.value_failed(gpu, f"nvlink_link{link}_{'rx' if direction else 'tx'}", v.nvmlReturn):
                    keep.append(asking)  # unsupported values are left out of the next call
                continue
            keep.append(asking)
            now = (field_number(v), v.timestamp)
            prev, cache.link_prev[key] = cache.link_prev.get(key), now
            if prev is not None:
                rates.setdefault(link, [None, None])[direction] = kib_rate(prev[0], prev[1], now[0], now[1])
        cache.link_fields = keep
        found = [(link, tx, rx) for link, (tx, rx) in sorted(rates.items()) if tx is not None or rx is not None]
        cache.give_links(found or None)


def field_number(v: Any) -> float:
    """The number in an ``nvmlFieldValue_t``, read through the union member its ``valueType`` names."""
    return getattr(v.value, _VALUE_MEMBERS[v.valueType])


def kib_rate(kib0: float, us0: int, kib1: float, us1: int) -> Optional[float]:
    """Bytes/s between two cumulative KiB readings stamped in µs; None across a wrap or reset."""
    if us1 <= us0 or kib1 < kib0:
        return None
    return (kib1 - kib0) * 1024.0 / ((us1 - us0) / 1e6)
