"""Per-GPU series: dcgm-exporter's names, units and host label where DCGM has the field (in the generation the
daemon's ``--metrics-dcgm-names`` picks, :mod:`trimtab.api.metrics.dcgm_names`), ``trimtab_gpu_*`` in base units
for what is derived from a sample and its GPU's facts, and per-link NVLink with a ``link`` label.

Labels of every per-GPU series: ``gpu`` (index), ``UUID``, ``modelName``, ``hostname`` (dcgm-exporter's spelling
since 4.8.3, and trimtab's, shared with the per-node series) and, in the legacy generation, ``Hostname`` (the older
exporters' spelling) too; per-link series add ``link`` (NVML's link index).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator, Optional

from prometheus_client.core import Metric

from trimtab.contract.readings import GPU_METRICS, NVLINK_LINK_METRICS
from trimtab.api.metrics.dcgm_names import CURRENT, DCGM_FIELDS, FB_FREE, HOST_LABELS, check_generation
from trimtab.api.metrics.families import Spec, gauges
from trimtab.store.queries import GpuLabel, LatestLink, LatestSample

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


def dcgm_metrics(generation: str) -> tuple[DcgmMetric, ...]:
    """Every GpuSample field under its DCGM name and unit in ``generation`` (``current`` or ``legacy``)."""
    check_generation(generation)
    return tuple(DcgmMetric(n.name, f.field, n.divisor, n.unit_note)
                 for f in DCGM_FIELDS for n in (f.named(generation),))


DCGM_METRICS: tuple[DcgmMetric, ...] = dcgm_metrics(CURRENT)


def _fb_free(divisor: float) -> Callable[[LatestSample], Optional[float]]:
    def free(row: LatestSample) -> Optional[float]:
        """DCGM's identity total = used + reserved + free (NVML memory v2)."""
        m = row.metrics
        total, used = m.get("mem_total_bytes"), m.get("mem_used_bytes")
        if total is None or used is None:
            return None
        return max(0.0, total - used - (m.get("mem_reserved_bytes") or 0)) / divisor

    return free


def _ratio_of_pcie_peak(field: str) -> Callable[[LatestSample], Optional[float]]:
    def ratio(row: LatestSample) -> Optional[float]:
        value = row.metrics.get(field)
        return None if value is None or not row.pcie_peak_bytes_per_s else value / row.pcie_peak_bytes_per_s

    return ratio


# Per-GPU series computed from a sample and its GPU's facts.
DERIVED_GPU_METRICS: tuple[Spec, ...] = (
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


def gpu_labels(row: GpuLabel, generation: str = CURRENT) -> dict[str, str]:
    labels = {"gpu": str(row.gpu_index), "UUID": row.gpu_uuid, "modelName": row.gpu_name}
    labels.update((name, row.hostname) for name in HOST_LABELS[generation])
    return labels


def _simulated(row: GpuLabel) -> bool:
    return row.simulated


@lru_cache(maxsize=None)
def _gpu_specs(generation: str) -> tuple[Spec, ...]:
    free = FB_FREE.named(generation)
    dcgm = [Spec(d.name, d.help(), d.value) for d in dcgm_metrics(generation)]
    return (*dcgm, Spec(free.name, f"Framebuffer memory free: total - used - reserved. {free.unit_note}",
                        _fb_free(free.divisor)), *DERIVED_GPU_METRICS)


def gpu_families(rows: list[LatestSample], generation: str = CURRENT) -> Iterator[Metric]:
    """The per-GPU families of ``rows`` with DCGM names, units and host label of ``generation``."""
    yield from gauges(_gpu_specs(check_generation(generation)), rows, lambda row: gpu_labels(row, generation),
                      _simulated)


def link_families(rows: list[LatestLink], generation: str = CURRENT) -> Iterator[Metric]:
    yield from gauges(LINK_METRICS, rows, lambda row: {**gpu_labels(row, generation), "link": str(row.link)},
                      _simulated)
