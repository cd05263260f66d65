"""Prometheus exposition (text format 0.0.4) of the latest snapshot: ``GET /metrics`` renders it on every scrape.

Names follow dcgm-exporter where DCGM has the field, in dcgm-exporter's units and labels, so dashboards built for
DCGM work; everything else is ``trimtab_*`` in base units. A metric a GPU does not report is absent, never 0.
Nothing here calls NVML: GPU series come from :meth:`ApiContext.latest_gpus`, balance verdicts from one store
query per scrape, and a failing store drops only the series it feeds (counted in ``trimtab_scrape_errors_total``).

Labels of every per-GPU series: ``gpu`` (index), ``UUID``, ``modelName``, ``Hostname`` (dcgm-exporter's spelling),
``hostname`` (trimtab's, shared with the per-node series); plus ``simulated="true"`` on every series of a
simulated node (absent on real ones, so a real node's label set is dcgm-exporter's). ``trimtab_node_simulated``
says 0 or 1 for every node, for joins.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trimtab.agent.readings import GPU_METRICS
from trimtab.api.context import ApiContext
from trimtab.rebalancer.balance import SEVERITY, BalanceReport
from trimtab.store.queries import LatestSample

log = logging.getLogger(__name__)

# What render_metrics returns; spelled out because prometheus_client's CONTENT_TYPE_LATEST moved to 1.0.0.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BALANCE_WINDOW_S = 30.0  # the window `trimtab check` grades by default
MIB = 1024**2
_SPEC_HELP = {m.name: m.help for m in GPU_METRICS}


@dataclass(frozen=True)
class DcgmMetric:
    """One GpuSample field exported under its dcgm-exporter name: value / ``divisor``, help + ``unit_note``."""

    name: str
    field: str
    divisor: float  # stored unit → dcgm-exporter's unit (a division keeps 42.5 % → 0.425 exact in text)
    unit_note: str

    def help(self) -> str:
        return f"{_SPEC_HELP[self.field]} {self.unit_note}"


# Every GPU_METRICS field has a DCGM counterpart (tests pin that a new field gets a decision here).
# Units are dcgm-exporter's: percent for GPU_UTIL, ratios 0-1 for the PROF activities, MiB for framebuffer.
# Our SM/tensor/DRAM activities and PCIe/NVLink rates come from NVML GPM (Hopper+), NVML's counterparts of these
# DCGM profiling fields; DCGM_FI_DEV_FB_TOTAL is a DCGM field that dcgm-exporter's default list leaves out.
DCGM_METRICS: tuple[DcgmMetric, ...] = (
    DcgmMetric("DCGM_FI_DEV_GPU_UTIL", "util_pct", 1, "Unit: %."),
    DcgmMetric("DCGM_FI_PROF_SM_ACTIVE", "sm_active_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_DRAM_ACTIVE", "dram_bw_util_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_DEV_FB_USED", "mem_used_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_DEV_FB_RESERVED", "mem_reserved_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_DEV_FB_TOTAL", "mem_total_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s", 1, "Protocol headers included. Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s", 1, "Protocol headers included. Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_s", 1, "Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_s", 1, "Unit: bytes/s."),
    DcgmMetric("DCGM_FI_DEV_POWER_USAGE", "power_w", 1, "Unit: W."),
    DcgmMetric("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1, "Unit: C."),
    DcgmMetric("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "Unit: MHz."),
    # Newer DCGM also names this field DCGM_FI_DEV_CLOCKS_EVENT_REASONS (same id); dashboards use the old name.
    DcgmMetric("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "clock_event_mask", 1, "Unit: bitmask of NVML reasons."),
)


def _fb_free_mib(row: LatestSample) -> Optional[float]:
    """DCGM's identity total = used + reserved + free (NVML memory v2)."""
    m = row.metrics
    total, used = m.get("mem_total_bytes"), m.get("mem_used_bytes")
    if total is None or used is None:
        return None
    return max(0.0, total - used - (m.get("mem_reserved_bytes") or 0)) / MIB


def _ratio_of_pcie_peak(field: str) -> Callable[[LatestSample], Optional[float]]:
    def ratio(row: LatestSample) -> Optional[float]:
        value = row.metrics.get(field)
        return None if value is None or not row.pcie_peak_bytes_per_s else value / row.pcie_peak_bytes_per_s

    return ratio


# Per-GPU series computed from a sample and its GPU's facts: (name, help, value or None).
DERIVED_GPU_METRICS: tuple[tuple[str, str, Callable[[LatestSample], Optional[float]]], ...] = (
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free: total - used - reserved. Unit: MiB.", _fb_free_mib),
    ("trimtab_gpu_pcie_tx_ratio_of_peak", "PCIe TX as a ratio of the link's per-direction peak (max gen x width).",
     _ratio_of_pcie_peak("pcie_tx_bytes_per_s")),
    ("trimtab_gpu_pcie_rx_ratio_of_peak", "PCIe RX as a ratio of the link's per-direction peak (max gen x width).",
     _ratio_of_pcie_peak("pcie_rx_bytes_per_s")),
    ("trimtab_gpu_pcie_peak_bytes_per_second", "Per-direction PCIe peak of the GPU's link, from its max generation "
     "and width.", lambda row: row.pcie_peak_bytes_per_s),
    ("trimtab_gpu_nvlink_links", "Active NVLink links; absent where the GPU has no NVLink.",
     lambda row: row.nvlink_link_count),
    ("trimtab_gpu_sample_timestamp_seconds", "When the GPU's latest sample was taken (Unix time); stale data shows "
     "as an old timestamp.", lambda row: row.ts_ms / 1000),
)


def _finite(value) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


def _simulated(labels: dict[str, str], simulated: bool) -> dict[str, str]:
    if simulated:
        labels["simulated"] = "true"
    return labels


def gpu_labels(row: LatestSample) -> dict[str, str]:
    return _simulated({"gpu": str(row.gpu_index), "UUID": row.gpu_uuid, "modelName": row.gpu_name,
                       "Hostname": row.hostname, "hostname": row.hostname}, row.simulated)


def _gauges(specs: Iterable[tuple[str, str, Callable]], items, labels_of) -> Iterator[Metric]:
    """One gauge family per spec, one sample per item whose value is known; families with no sample are left out."""
    for name, help_text, value_of in specs:
        family = GaugeMetricFamily(name, help_text)
        for item in items:
            value = _finite(value_of(item))
            if value is not None:
                family.add_sample(name, labels_of(item), value)
        if family.samples:
            yield family


def _dcgm_value(d: DcgmMetric) -> Callable[[LatestSample], Optional[float]]:
    def value(row: LatestSample) -> Optional[float]:
        v = row.metrics.get(d.field)
        return None if v is None else v / d.divisor

    return value


def gpu_families(rows: list[LatestSample]) -> Iterator[Metric]:
    dcgm = [(d.name, d.help(), _dcgm_value(d)) for d in DCGM_METRICS]
    yield from _gauges(dcgm + list(DERIVED_GPU_METRICS), rows, gpu_labels)


def balance_families(reports: list[BalanceReport]) -> Iterator[Metric]:
    """``trimtab_balance_status`` (0 ok or no data, 1 watch, 2 act) and ``trimtab_balance_value`` per check."""
    verdicts = [(r, v) for r in reports for v in r.verdicts]
    specs = (
        ("trimtab_balance_status", f"Balance verdict of a check over the last {BALANCE_WINDOW_S:.0f} s: 0 ok (or no "
         "data), 1 watch, 2 act (as `trimtab check`).", lambda rv: SEVERITY[rv[1].status]),
        ("trimtab_balance_value", f"The value a check graded over the last {BALANCE_WINDOW_S:.0f} s: "
         "utilization_spread in points, pcie in % of link peak, memory in % of total; absent without data.",
         lambda rv: rv[1].value),
    )
    yield from _gauges(specs, verdicts,
                       lambda rv: _simulated({"hostname": rv[0].hostname, "check": rv[1].check}, rv[0].simulated))


def node_families(simulated_by_host: Mapping[str, bool]) -> Iterator[Metric]:
    family = GaugeMetricFamily("trimtab_node_simulated",
                               "1 if the node's data is synthetic (a simulated node), else 0.")
    for hostname, simulated in sorted(simulated_by_host.items()):
        family.add_sample("trimtab_node_simulated", {"hostname": hostname}, 1.0 if simulated else 0.0)
    if family.samples:
        yield family


def job_metric_families(ctx: ApiContext) -> Iterator[Metric]:
    """Job metrics (step time and phases, throughput, fragmentation) and rebalancer decisions: filled in by the
    trainer-hook and rebalancer issues. Keep them ``trimtab_job_*`` / ``trimtab_decision_*`` in base units."""
    return iter(())


# Scrape errors are counted for the life of the process (a counter must not reset per scrape).
SCRAPE_PARTS = ("gpus", "balance")
_errors: Counter[str] = Counter()
_failing: set[str] = set()
_errors_lock = threading.Lock()


def _guarded(part: str, read: Callable[[], list]) -> list:
    """``read()``, or [] when it fails: a store error drops this part's series, not the whole scrape."""
    try:
        result = read()
    except Exception as exc:  # noqa: BLE001 - whatever the store raises, the scrape must still answer
        with _errors_lock:
            _errors[part] += 1
            first = part not in _failing
            _failing.add(part)
        if first:  # once per outage, not once per scrape
            log.warning("/metrics: %s series left out: %s", part, " ".join(str(exc).split())[:300])
        return []
    with _errors_lock:
        if part in _failing:
            _failing.discard(part)
            log.info("/metrics: %s series are back", part)
    return result


def _error_family() -> Metric:
    family = CounterMetricFamily("trimtab_scrape_errors", "Scrapes of /metrics that left out a part's series because "
                                 "reading it failed (part: gpus, balance).", labels=["part"])
    with _errors_lock:
        for part in SCRAPE_PARTS:
            family.add_metric([part], _errors[part])
    return family


class TrimtabCollector:
    """A prometheus_client collector reading ``ctx`` on every ``collect()``; holds no values between scrapes."""

    def __init__(self, ctx: ApiContext):
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        from trimtab.rebalancer.node_report import node_reports

        rows = _guarded("gpus", self.ctx.latest_gpus)
        reports = _guarded("balance", lambda: node_reports(self.ctx.engine, BALANCE_WINDOW_S))
        simulated = {r.hostname: r.simulated for r in rows}
        simulated.update({r.hostname: r.simulated for r in reports})
        yield from gpu_families(rows)
        yield from node_families(simulated)
        yield from balance_families(reports)
        yield from job_metric_families(self.ctx)
        yield _error_family()


def render_metrics(ctx: ApiContext) -> bytes:
    """The exposition of ``ctx`` now (serve it with :data:`CONTENT_TYPE`). Blocking (one store query): call it
    from a sync route, which FastAPI runs in its thread pool."""
    registry = CollectorRegistry(auto_describe=False)  # no describe(): register() must not run a collect()
    registry.register(TrimtabCollector(ctx))
    return generate_latest(registry)


__all__ = ["CONTENT_TYPE", "DCGM_METRICS", "TrimtabCollector", "job_metric_families", "render_metrics"]
