"""dcgm-exporter's two generations of names, units and host label, and which one /metrics speaks.

dcgm-exporter renamed what trimtab mirrors in three steps: 4.8.3 renamed the label ``Hostname`` to ``hostname``
(PR #655); 4.9.0 renamed the default and profiling fields that DCGM 4.7 deprecates to their DCGM 4.7 names, some
with new units (utilization % → ratio 0-1, MiB → bytes, MHz → Hz) and the driver label to
``DCGM_FI_SYSTEM_DRIVER_VERSION``; 4.10.0 renamed ``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` to
``…_BYTES_PER_SECOND``. ``current`` is 4.10.0's generation (the default); ``legacy`` is what exporters up to 4.8.2
export (``Hostname`` label, old names and units), for sites that still run one. trimtab emits no driver label in
either, so the driver label's rename does not touch it.

Where each name comes from is recorded, cited, in ``tests/api/metrics/dcgm_generations.toml``; a test holds every
name here to it.
"""

from __future__ import annotations

from dataclasses import dataclass

CURRENT, LEGACY = "current", "legacy"
GENERATIONS = (CURRENT, LEGACY)
MIB = 1024**2
MHZ_IN_HZ = 1e6


@dataclass(frozen=True)
class Named:
    """A DCGM name in one generation: the divisor that turns trimtab's stored unit into it, and the unit's note."""

    name: str
    divisor: float  # a division keeps 42.5 % → 0.425 exact in the text format
    unit_note: str


@dataclass(frozen=True)
class DcgmField:
    """One GpuSample field (``field``) under each generation's DCGM name."""

    field: str
    current: Named
    legacy: Named

    def named(self, generation: str) -> Named:
        return self.current if generation == CURRENT else self.legacy


def _same(field: str, current: str, legacy: str, divisor: float, unit_note: str) -> DcgmField:
    return DcgmField(field, Named(current, divisor, unit_note), Named(legacy, divisor, unit_note))


_RATIO = "Unit: ratio 0-1, as DCGM."

# Every GPU_METRICS field has a DCGM counterpart (tests pin that a new field gets a decision here). Our SM, tensor
# and DRAM activities and PCIe/NVLink rates come from NVML GPM (Hopper+), NVML's counterparts of these DCGM
# profiling fields.
DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("util_pct", Named("DCGM_FI_DEV_GPU_UTIL_RATIO", 100, _RATIO),
              Named("DCGM_FI_DEV_GPU_UTIL", 1, "Unit: %.")),
    _same("sm_active_pct", "DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_SM_ACTIVE", 100, _RATIO),
    _same("sm_occupancy_pct", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY", 100, _RATIO),
    _same("tensor_active_pct", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100, _RATIO),
    _same("dram_bw_util_pct", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_PROF_DRAM_ACTIVE", 100, _RATIO),
    DcgmField("mem_used_bytes", Named("DCGM_FI_DEV_FB_USED_BYTES", 1, "Unit: bytes."),
              Named("DCGM_FI_DEV_FB_USED", MIB, "Unit: MiB.")),
    DcgmField("mem_reserved_bytes", Named("DCGM_FI_DEV_FB_RESERVED_BYTES", 1, "Unit: bytes."),
              Named("DCGM_FI_DEV_FB_RESERVED", MIB, "Unit: MiB.")),
    # DCGM_FI_DEV_FB_TOTAL is a DCGM field the old default lists leave out; 4.9.0 collects FB_CAPACITY_BYTES.
    DcgmField("mem_total_bytes", Named("DCGM_FI_DEV_FB_CAPACITY_BYTES", 1, "Unit: bytes."),
              Named("DCGM_FI_DEV_FB_TOTAL", MIB, "Unit: MiB.")),
    _same("pcie_tx_bytes_per_s", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", "DCGM_FI_PROF_PCIE_TX_BYTES", 1,
          "Protocol headers included. Unit: bytes/s."),
    _same("pcie_rx_bytes_per_s", "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", "DCGM_FI_PROF_PCIE_RX_BYTES", 1,
          "Protocol headers included. Unit: bytes/s."),
    _same("nvlink_tx_bytes_per_s", "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND", "DCGM_FI_PROF_NVLINK_TX_BYTES", 1,
          "Unit: bytes/s."),
    _same("nvlink_rx_bytes_per_s", "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND", "DCGM_FI_PROF_NVLINK_RX_BYTES", 1,
          "Unit: bytes/s."),
    _same("power_w", "DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_POWER_USAGE", 1, "Unit: W."),
    _same("temperature_c", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_GPU_TEMP", 1, "Unit: C."),
    DcgmField("sm_clock_mhz", Named("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1 / MHZ_IN_HZ, "Unit: Hz."),
              Named("DCGM_FI_DEV_SM_CLOCK", 1, "Unit: MHz.")),
    _same("clock_event_mask", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1,
          "Unit: bitmask of NVML reasons."),
)

# Framebuffer free, derived (total - used - reserved): FB_FREE_BYTES in bytes, or FB_FREE in MiB.
FB_FREE = DcgmField("mem_free_bytes", Named("DCGM_FI_DEV_FB_FREE_BYTES", 1, "Unit: bytes."),
                    Named("DCGM_FI_DEV_FB_FREE", MIB, "Unit: MiB."))

# The host label of per-GPU series: dcgm-exporter's spelling in each generation. trimtab's own series say
# ``hostname`` in both, so the legacy generation carries both spellings.
HOST_LABELS = {CURRENT: ("hostname",), LEGACY: ("Hostname", "hostname")}


def check_generation(generation: str) -> str:
    """``generation`` if it is one of :data:`GENERATIONS`; a ValueError naming the choices otherwise."""
    if generation not in GENERATIONS:
        raise ValueError(f"unknown dcgm-exporter name generation {generation!r}; choose one of "
                         f"{', '.join(GENERATIONS)}")
    return generation


def emitted_names(generation: str) -> list[str]:
    """Every DCGM series name /metrics emits in ``generation``."""
    check_generation(generation)
    return [f.named(generation).name for f in DCGM_FIELDS + (FB_FREE,)]
