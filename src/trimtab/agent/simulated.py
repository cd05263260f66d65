"""A simulated GPU node: the ``Source`` protocol for machines without an NVIDIA driver.

Used by `trimtab agent --simulate N --scenario …` and by `trimtab up` where there is no driver. Its inventory says
``simulated=True`` (and the scenario), so every place its data shows can say it is synthetic.
"""

from __future__ import annotations

import math
import socket
from typing import Optional

from trimtab.agent.pcie import pcie_peak_bytes_per_s
from trimtab.contract.readings import GpuInfo, GpuSample, NvlinkSample, Readings
from trimtab.agent.scenarios import NORMAL, SCENARIOS, RoleProfile, device_roles, get_scenario
from trimtab.agent.source import Inventory

__all__ = ["SCENARIOS", "SimulatedNode"]

GPU_NAME = "Simulated H100 80GB (trimtab)"
MEMORY_TOTAL_BYTES = 80 * 1024**3
MEMORY_RESERVED_BYTES = 616 * 1024**2  # what the driver reserved at idle on the measured H200
PCIE_GEN, PCIE_WIDTH = 5, 16
PCIE_PEAK_BYTES_PER_S = pcie_peak_bytes_per_s(PCIE_GEN, PCIE_WIDTH)
NVLINK_LINKS = 18
NVLINK_PEAK_BYTES_PER_S = NVLINK_LINKS * 25e9  # per direction: 18 NVLink-4 links × 25 GB/s
# Per-link readings come every few ticks, as the NVML source reads per-link counters off the tick (every 3 s).
NVLINK_LINK_EVERY_TICKS = 3
IDLE_POWER_W, MAX_POWER_W = 70.0, 700.0
MAX_SM_CLOCK_MHZ, CAPPED_SM_CLOCK_MHZ, IDLE_SM_CLOCK_MHZ = 1980, 1755, 345
CLOCK_EVENT_GPU_IDLE, CLOCK_EVENT_SW_POWER_CAP = 0x1, 0x4  # NVML clock-event reason bits

_MASK64 = (1 << 64) - 1
# One stream of noise per reading, so each wanders on its own.
_CHANNELS = ("util", "sm", "tensor", "occupancy", "dram", "mem", "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx",
             "power", "temperature")


def _mix(*parts: int) -> int:
    """A stable 64-bit hash (splitmix64 over the parts): the same on every run and machine, unlike hash()."""
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = (x + (part & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x


def _unit(*parts: int) -> float:
    """A number in [0, 1) that depends only on ``parts``."""
    return _mix(*parts) / 2.0**64


def _shares(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


class SimulatedNode:
    """``n_gpus`` simulated H100-class GPUs playing ``scenario`` (``kind = "simulated"``).

    Readings depend only on (``seed``, tick index, GPU index), never on the clock: the k-th call to
    ``sample()`` is tick k, so tests can run it at any pace and two nodes with the same seed agree exactly.
    Each reading stays inside its role's range (``trimtab.agent.scenarios``): a slow oscillation (a period of
    a few minutes at 1 Hz, its phase drawn per GPU) plus modest per-tick noise. GPUs are PCIe Gen5 x16, 80 GiB,
    18 NVLink links, GPM-capable, so every metric is populated. Every ``NVLINK_LINK_EVERY_TICKS``-th tick (from
    tick 0) also carries per-link NVLink readings: the GPU's NVLink TX and RX of that tick shared over its 18
    links in fixed, uneven proportions drawn per (GPU, link), so the links of a GPU add up to its total. No
    processes are reported: a simulated GPU has none, and making PIDs up would point at real host processes. No
    health events either.
    """

    kind = "simulated"

    def __init__(self, n_gpus: int = 4, scenario: str = "balanced", seed: int = 0,
                 hostname: Optional[str] = None):
        if n_gpus < 1:
            raise ValueError(f"a simulated node needs at least 1 GPU, not {n_gpus}")
        self.scenario = get_scenario(scenario)
        self.seed = seed
        self.roles = device_roles(n_gpus)
        self._profiles: list[RoleProfile] = [self.scenario.roles.get(r, NORMAL) for r in self.roles]
        host = hostname or socket.gethostname()
        self._gpus = [GpuInfo(uuid=f"GPU-sim-{host}-{i}", index=i, name=GPU_NAME,
                              memory_total_bytes=MEMORY_TOTAL_BYTES, pcie_max_gen=PCIE_GEN, pcie_max_width=PCIE_WIDTH,
                              pcie_peak_bytes_per_s=PCIE_PEAK_BYTES_PER_S, nvlink_link_count=NVLINK_LINKS,
                              gpm_supported=True) for i in range(n_gpus)]
        self._period_ticks = 120 + _mix(seed, 0xC0FFEE) % 120
        self._link_shares = [_shares([0.5 + _unit(seed, gpu, link, 0x11C) for link in range(NVLINK_LINKS)])
                             for gpu in range(n_gpus)]
        self._tick = 0

    def inventory(self) -> Inventory:
        return Inventory(gpus=list(self._gpus), simulated=True, scenario=self.scenario.name)

    def sample(self, ts_ms: int) -> Readings:
        readings = self.readings_at(self._tick, ts_ms)
        self._tick += 1
        return readings

    def readings_at(self, tick: int, ts_ms: int) -> Readings:
        """The readings of tick ``tick`` (what the tick-th ``sample()`` returns), stamped ``ts_ms``."""
        readings = Readings(gpu_samples=[self._gpu_sample(i, tick, ts_ms) for i in range(len(self._gpus))])
        if tick % NVLINK_LINK_EVERY_TICKS == 0:
            readings.nvlink_samples = [
                NvlinkSample(s.gpu_uuid, ts_ms, link, s.nvlink_tx_bytes_per_s * share, s.nvlink_rx_bytes_per_s * share)
                for s, shares in zip(readings.gpu_samples, self._link_shares) for link, share in enumerate(shares)]
        return readings

    def close(self) -> None:
        """Nothing to release."""

    def _draw(self, tick: int, gpu: int, channel: str, bounds: tuple[float, float]) -> float:
        """A value in ``bounds``: mid-range, ±35 % of the range in a slow wave, ±15 % of it in noise."""
        c = _CHANNELS.index(channel)
        phase = _unit(self.seed, gpu, c, 1)
        wave = math.sin(2 * math.pi * (tick / self._period_ticks + phase))
        noise = 2 * _unit(self.seed, gpu, c, tick + 2) - 1
        lo, hi = bounds
        return lo + (hi - lo) * (0.5 + 0.35 * wave + 0.15 * noise)

    def _scheduled_util(self, i: int, tick: int, ts_ms: int) -> float:
        """Utilization from the scenario's phase schedule at ``ts_ms``: the segment's, ±1 point of noise; 0–2 %
        where the GPU's role has no busy segment (waiting, host-side work)."""
        segment = self.scenario.schedule.segment_at(self.roles[i], ts_ms)
        noise = 2 * _unit(self.seed, i, 0x5C4ED, tick) - 1
        if segment is None or segment.gpu_s <= 0:
            return round(1.0 + noise, 1)  # rounded as reported, so SM activity (a share of it) stays below it
        return round(max(0.0, min(100.0, segment.util_pct + noise)), 1)

    def _gpu_sample(self, i: int, tick: int, ts_ms: int) -> GpuSample:
        p, draw = self._profiles[i], lambda channel, bounds: self._draw(tick, i, channel, bounds)
        util = draw("util", p.util_pct) if self.scenario.schedule is None else self._scheduled_util(i, tick, ts_ms)
        sm = util * draw("sm", p.sm_ratio)
        used = min(int(MEMORY_TOTAL_BYTES * draw("mem", p.mem_frac)), MEMORY_TOTAL_BYTES - MEMORY_RESERVED_BYTES)
        power = IDLE_POWER_W + (MAX_POWER_W - IDLE_POWER_W) * (0.3 * util + 0.7 * sm) / 100
        power = min(MAX_POWER_W, power * draw("power", (0.97, 1.03)))
        capped = power > 0.97 * MAX_POWER_W
        return GpuSample(
            gpu_uuid=self._gpus[i].uuid, ts_ms=ts_ms,
            util_pct=round(util, 1),
            sm_active_pct=round(sm, 2),
            sm_occupancy_pct=round(sm * draw("occupancy", p.occupancy_ratio), 2),
            tensor_active_pct=round(sm * draw("tensor", p.tensor_ratio), 2),
            dram_bw_util_pct=round(min(100.0, util * draw("dram", p.dram_ratio)), 2),
            mem_used_bytes=used, mem_reserved_bytes=MEMORY_RESERVED_BYTES, mem_total_bytes=MEMORY_TOTAL_BYTES,
            pcie_tx_bytes_per_s=PCIE_PEAK_BYTES_PER_S * draw("pcie_tx", p.pcie_frac),
            pcie_rx_bytes_per_s=PCIE_PEAK_BYTES_PER_S * draw("pcie_rx", p.pcie_frac),
            nvlink_tx_bytes_per_s=NVLINK_PEAK_BYTES_PER_S * draw("nvlink_tx", p.nvlink_frac),
            nvlink_rx_bytes_per_s=NVLINK_PEAK_BYTES_PER_S * draw("nvlink_rx", p.nvlink_frac),
            power_w=round(power, 1),
            temperature_c=round(28.0 + 0.06 * power + draw("temperature", (-1.0, 1.0)), 1),
            sm_clock_mhz=IDLE_SM_CLOCK_MHZ if util < 5 else CAPPED_SM_CLOCK_MHZ if capped else MAX_SM_CLOCK_MHZ,
            clock_event_mask=CLOCK_EVENT_GPU_IDLE if util < 5 else CLOCK_EVENT_SW_POWER_CAP if capped else 0,
        )
