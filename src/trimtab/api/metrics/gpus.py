"""Per-GPU series: dcgm-exporter's names, units and labels where DCGM has the field, ``trimtab_gpu_*`` in base
units for what is derived from a sample and its GPU's facts, and per-link NVLink with a ``link`` label.

Labels of every per-GPU series: ``gpu`` (index), ``UUID``, ``modelName``, ``Hostname`` (dcgm-exporter's spelling),
``hostname`` (trimtab's, shared with the per-node series); per-link series add ``link`` (NVML's link index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from prometheus_client.core import Metric

from trimtab.contract.readings import GPU_METRICS, NVLINK_LINK_METRICS
from trimtab.api.metrics.families import Spec, gauges
from trimtab.store.queries import GpuLabel, LatestLink, LatestSample

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

    def value(self, row: LatestSample) -> Optional[float]:
        v = row.metrics.get(self.field)
        return None if v is None else v / self.divisor


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


# Per-GPU series computed from a sample and its GPU's facts.
DERIVED_GPU_METRICS: tuple[Spec, ...] = (
    Spec("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free: total - used - reserved. Unit: MiB.", _fb_free_mib),
    Spec("trimtab_gpu_pcie_tx_ratio_of_peak", "PCIe TX as a ratio of the link's per-direction peak (max gen x width).",
         _ratio_of_pcie_peak("pcie_tx_bytes_per_s")),
    Spec("trimtab_gpu_pcie_rx_ratio_of_peak", "PCIe RX as a ratio of the link's per-direction peak (max gen x width).",
         _ratio_of_pcie_peak("pcie_rx_bytes_per_s")),
    Spec("trimtab_gpu_pcie_peak_bytes_per_second", "Per-direction PCIe peak of the GPU's link, from its max "
         "generation and width.", lambda row: row.pcie_peak_bytes_per_s),
    Spec("trimtab_gpu_nvlink_links", "Active NVLink links; absent where the GPU has no NVLink.",
         lambda row: row.nvlink_link_count),
    Spec("trimtab_gpu_sample_timestamp_seconds", "When the GPU's latest sample was taken (Unix time); stale data "
         "shows as an old timestamp.", lambda row: row.ts_ms / 1000),
)

# Per NVLink link: one family per per-link metric (trimtab_gpu_nvlink_link_tx_bytes_per_second, …), plus when
# the link was read (per-link counters are read every few seconds, not every tick).
LINK_METRICS: tuple[Spec, ...] = tuple(
    Spec(f"trimtab_gpu_nvlink_link_{m.name.removesuffix('_bytes_per_s')}_bytes_per_second",
         f"{m.help} Absent for GPUs without NVLink. Unit: bytes/s.",
         lambda row, _name=m.name: row.metrics.get(_name))
    for m in NVLINK_LINK_METRICS) + (
    Spec("trimtab_gpu_nvlink_link_timestamp_seconds", "When the link's latest per-link reading was taken (Unix "
         "time); per-link counters are read every few seconds, off the tick.", lambda row: row.ts_ms / 1000),
)


def gpu_labels(row: GpuLabel) -> dict[str, str]:
    return {"gpu": str(row.gpu_index), "UUID": row.gpu_uuid, "modelName": row.gpu_name,
            "Hostname": row.hostname, "hostname": row.hostname}


def _link_labels(row: LatestLink) -> dict[str, str]:
    return {**gpu_labels(row), "link": str(row.link)}


def _simulated(row: GpuLabel) -> bool:
    return row.simulated


def gpu_families(rows: list[LatestSample]) -> Iterator[Metric]:
    dcgm = [Spec(d.name, d.help(), d.value) for d in DCGM_METRICS]
    yield from gauges(dcgm + list(DERIVED_GPU_METRICS), rows, gpu_labels, _simulated)


def link_families(rows: list[LatestLink]) -> Iterator[Metric]:
    yield from gauges(LINK_METRICS, rows, _link_labels, _simulated)
