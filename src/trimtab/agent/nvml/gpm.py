"""GPM (Hopper and newer): SM, tensor and DRAM activity and PCIe/NVLink rates, computed by NVML between two GPM
samples of one GPU taken more than 100 ms apart.

Per GPU: two samples allocated once and taken in turn, two reusable requests (~20 KB of ctypes each: one for
each order of the two samples, so no pointer is written on the tick), and the metric ids asked for kept on our
side. Each metric has its own return code: a NOT_SUPPORTED one is dropped
from the request for good. A tick that comes sooner than 100 ms after the last GPM sample takes none, keeping the
older one as the base, and leaves the GPM fields None.
"""

from __future__ import annotations

import ctypes
import math
import time
from operator import mul
from typing import Any, Optional

from trimtab.agent.nvml.calls import NvmlCalls, OnCall, timed
from trimtab.agent.nvml.structs import field_reader

GPM_MIN_INTERVAL_S = 0.1  # nvmlGpmMetricsGet needs samples more than 100 ms apart
MIB = 1024 * 1024
# GPM metric id → (GpuSample field, factor to the field's unit). NVLink ids are asked only where links exist.
GPM_FIELDS: dict[int, tuple[str, float]] = {
    2: ("sm_active_pct", 1.0), 3: ("sm_occupancy_pct", 1.0), 5: ("tensor_active_pct", 1.0),
    10: ("dram_bw_util_pct", 1.0), 20: ("pcie_tx_bytes_per_s", MIB), 21: ("pcie_rx_bytes_per_s", MIB),
    60: ("nvlink_rx_bytes_per_s", MIB), 61: ("nvlink_tx_bytes_per_s", MIB),
}
GPM_NVLINK_IDS = (60, 61)


class Gpm:
    """One GPU's GPM state; :meth:`read` is on the tick."""

    def __init__(self, calls: NvmlCalls, gpu: Any, samples: list, has_links: bool, on_call: Optional[OnCall]):
        nv = calls.nv
        self.calls, self.gpu, self.samples = calls, gpu, samples
        # requests[k]: sample2 = samples[k] (the one a read takes when `turn` is k), sample1 = the other (its base)
        self.requests = []
        for k in range(2):
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.sample1, request.sample2 = samples[1 - k], samples[k]
            self.requests.append(request)
        self.turn = 0  # index of the sample the next read takes
        self.sample_get, self.metrics_get = nv.nvmlGpmSampleGet, nv.nvmlGpmMetricsGet
        if on_call is not None:
            self.sample_get = timed(on_call, "gpm_sample_get", self.sample_get)
            self.metrics_get = timed(on_call, "gpm_metrics_get", self.metrics_get)
        self.prev_at: Optional[float] = None  # monotonic time of the base sample; None: no base
        self.enabled = True  # False once taking samples or computing metrics is unsupported
        self.ids: list[int] = []
        self.ask([m for m in GPM_FIELDS if has_links or m not in GPM_NVLINK_IDS])

    def ask(self, metric_ids: list[int]) -> None:
        """Ask for ``metric_ids`` from now on (and read their results in one C call)."""
        nv = self.calls.nv
        for request in self.requests:
            metrics = request.metrics
            for i, metric_id in enumerate(metric_ids):
                metrics[i].metricId = metric_id
            request.numMetrics = len(metric_ids)
        self.ids = metric_ids
        self.targets = [GPM_FIELDS[m] for m in metric_ids]
        self.names = [name for name, _ in self.targets]
        self.factors = [factor for _, factor in self.targets]
        self.results = field_reader(nv.c_nvmlGpmMetric_t, ("nvmlReturn", "value"),
                                    offset=nv.c_nvmlGpmMetricsGet_t.metrics.offset, count=len(metric_ids),
                                    stride=ctypes.sizeof(nv.c_nvmlGpmMetric_t))

    @property
    def request(self) -> object:
        """The request the latest read computed (its metric ids are those of both)."""
        return self.requests[1 - self.turn]

    def read(self, values: dict) -> None:
        """Take a GPM sample and put the metrics against the base sample into ``values``."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self.prev_at is not None and now - self.prev_at <= GPM_MIN_INTERVAL_S:
            return
        turn = self.turn
        try:
            self.sample_get(self.gpu.handle, self.samples[turn])
        except Exception as exc:  # noqa: BLE001 - the call layer sorts it out (may raise GpuLost)
            self.prev_at = None
            self.enabled = not self.calls.failed(self.gpu, "gpm_sample_get", exc)
            return
        if self.prev_at is not None:
            request = self.requests[turn]
            try:
                self.metrics_get(request)
            except Exception as exc:  # noqa: BLE001
                self.enabled = not self.calls.failed(self.gpu, "gpm_metrics_get", exc)
            else:
                self._put(values, request)
        self.turn = 1 - turn
        self.prev_at = now

    def _put(self, values: dict, request: object) -> None:
        flat = self.results(request)  # return code, value, return code, value, …
        if any(flat[0::2]):
            return self._put_checked(values, flat)
        scaled = list(map(mul, flat[1::2], self.factors))
        if not math.isfinite(sum(scaled)):  # one C-level check for the common case; NaN and inf become None
            scaled = [value if math.isfinite(value) else None for value in scaled]
        values.update(zip(self.names, scaled))

    def _put_checked(self, values: dict, flat: tuple) -> None:
        keep = []
        for metric_id, (name, factor), ret, value in zip(self.ids, self.targets, flat[0::2], flat[1::2]):
            if ret == 0:  # NVML_SUCCESS
                value *= factor
                values[name] = value if math.isfinite(value) else None
            elif self.calls.value_failed(self.gpu, f"gpm:{name}", ret):
                continue
            keep.append(metric_id)
        if len(keep) < len(self.ids):
            self.ask(keep)

    def free(self) -> None:
        for sample in self.samples:
            self.calls.call(None, "gpm_sample_free", "nvmlGpmSampleFree", sample)
        self.samples = []
        self.enabled = False


def open_gpm(calls: NvmlCalls, gpu: Any, on_call: Optional[OnCall] = None) -> Optional[Gpm]:
    """GPM for ``gpu``, or None when its two samples cannot be allocated."""
    samples = [calls.call(gpu, "gpm_sample_alloc", "nvmlGpmSampleAlloc") for _ in range(2)]
    samples = [sample for sample in samples if sample is not None]
    if len(samples) < 2:
        for sample in samples:
            calls.call(None, "gpm_sample_free", "nvmlGpmSampleFree", sample)
        return None
    return Gpm(calls, gpu, samples, has_links=bool(gpu.links), on_call=on_call)
