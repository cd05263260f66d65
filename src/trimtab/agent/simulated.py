"""A simulated GPU node: the ``Source`` protocol for machines without an NVIDIA driver.

Used by `trimtab agent --simulate N --scenario …` and by `trimtab up` where there is no driver. Its inventory says
``simulated=True`` (and the scenario), so every place its data shows can say it is synthetic.
"""

from __future__ import annotations

import math
import socket
from typing import Optional

from trimtab.agent.activity import ActivityTally
from trimtab.agent.pcie import pcie_peak_bytes_per_s
from trimtab.contract.readings import GpuInfo, GpuProcess, GpuSample, NvlinkSample, Readings
from trimtab.agent.scenarios import (GPU_PROCESSES, NORMAL, SCENARIOS, RoleProfile, device_roles, get_scenario,
                                     phase_at, process_shares)
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
# Process rows every few ticks, as the NVML source reads the process list every 5 s at the default 1 s tick; each
# carries the activity of the ticks since the previous rows, from one record a tick per busy process (the NVML
# source reads per-process utilization every 1 s, off the tick, and gets one record per busy process a read).
PROCESS_EVERY_TICKS = 5
# Simulated PIDs lie above Linux's largest possible PID (PID_MAX_LIMIT, 2^22): they can never name a real process.
SIM_PID_BASE = 4_194_304 + 1_000_000

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
    links in fixed, uneven proportions drawn per (GPU, link), so the links of a GPU add up to its total.

    Processes (``scenarios.GPU_PROCESSES``): an actor GPU holds an actor and a reference-model process, the others
    one process of their role, named "simulated <role>", with PIDs above the largest a Linux host can give
    (``SIM_PID_BASE``), so they can never point at a real process. Every ``PROCESS_EVERY_TICKS``-th tick carries
    their rows (the GPU's memory used, shared evenly) with the per-process activity of the ticks since the previous
    rows, added up as the NVML source adds NVML's records (``trimtab.agent.activity``): each tick, each process busy
    in that tick's phase of the step (``scenarios.STEP``) gives one record covering the tick, its mean SM % its
    share of the GPU's util and its memory % its share of the DRAM bandwidth use; an idle one gives none, as NVML
    leaves idle processes out. So a GPU's processes add up to its util, which of them does the work follows the
    phase, and ``sm_util_pct / 100 × (util_to_ms − util_from_ms)`` of a row is the process's busy seconds. Tick 0's
    rows are the baseline (activity unknown, as the NVML source's first). No health events.
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
        self._processes_from_ms: Optional[int] = None  # when the previous process rows were taken
        pids = iter(range(SIM_PID_BASE, SIM_PID_BASE + 1_000_000))
        self._pids = [{name: next(pids) for name in GPU_PROCESSES[role]} for role in self.roles]

    def inventory(self) -> Inventory:
        return Inventory(gpus=list(self._gpus), simulated=True, scenario=self.scenario.name)

    def sample(self, ts_ms: int) -> Readings:
        readings = self.readings_at(self._tick, ts_ms, self._processes_from_ms)
        if readings.processes:
            self._processes_from_ms = ts_ms
        self._tick += 1
        return readings

    def readings_at(self, tick: int, ts_ms: int, processes_from_ms: Optional[int] = None) -> Readings:
        """The readings of tick ``tick`` (what the tick-th ``sample()`` returns), stamped ``ts_ms``;
        ``processes_from_ms``: when the previous process rows were taken (None: these are the first)."""
        readings = Readings(gpu_samples=[self._gpu_sample(i, tick, ts_ms) for i in range(len(self._gpus))])
        if tick % PROCESS_EVERY_TICKS == 0:
            readings.processes = self._processes(tick, ts_ms, processes_from_ms, readings.gpu_samples)
        if tick % NVLINK_LINK_EVERY_TICKS == 0:
            readings.nvlink_samples = [
                NvlinkSample(s.gpu_uuid, ts_ms, link, s.nvlink_tx_bytes_per_s * share, s.nvlink_rx_bytes_per_s * share)
                for s, shares in zip(readings.gpu_samples, self._link_shares) for link, share in enumerate(shares)]
        return readings

    def close(self) -> None:
        """Nothing to release."""

    def _processes(self, tick: int, ts_ms: int, from_ms: Optional[int], samples: list[GpuSample]) -> list[GpuProcess]:
        """The process rows of tick ``tick`` with their activity since ``from_ms`` (the ticks after the previous
        rows' tick, this one included)."""
        rows = []
        for i, (role, pids) in enumerate(zip(self.roles, self._pids)):
            tally = ActivityTally()
            if from_ms is not None:
                tally.start(from_ms)
                covered_ms = (ts_ms - from_ms) / PROCESS_EVERY_TICKS  # the ticks spread evenly over the interval
                for t in range(max(1, tick - PROCESS_EVERY_TICKS + 1), tick + 1):
                    t_ms = ts_ms - (tick - t) * (ts_ms - from_ms) // PROCESS_EVERY_TICKS  # for a scheduled scenario
                    util, dram = self._busy(i, t, t_ms)
                    for name, share in process_shares(role, phase_at(t)).items():
                        if share > 0:  # one record a read per busy process: its mean over the tick it covers
                            tally.add(pids[name], util * share, dram * share, covered_ms)
                tally.answered(ts_ms)
            shares, used = tally.take(), samples[i].mem_used_bytes // len(pids)
            rows.extend(GpuProcess(samples[i].gpu_uuid, ts_ms, pid, used, f"simulated {name}", *shares.of(pid))
                        for name, pid in pids.items())
        return rows

    def _draw(self, tick: int, gpu: int, channel: str, bounds: tuple[float, float]) -> float:
        """A value in ``bounds``: mid-range, ±35 % of the range in a slow wave, ±15 % of it in noise."""
        c = _CHANNELS.index(channel)
        phase = _unit(self.seed, gpu, c, 1)
        wave = math.sin(2 * math.pi * (tick / self._period_ticks + phase))
        noise = 2 * _unit(self.seed, gpu, c, tick + 2) - 1
        lo, hi = bounds
        return lo + (hi - lo) * (0.5 + 0.35 * wave + 0.15 * noise)

    def _util_at(self, i: int, tick: int, ts_ms: int) -> float:
        """GPU ``i``'s util % at tick ``tick`` (stamped ``ts_ms``): drawn from its role's range, or, in a scenario
        with a phase schedule, the schedule's."""
        if self.scenario.schedule is None:
            return self._draw(tick, i, "util", self._profiles[i].util_pct)
        return self._scheduled_util(i, tick, ts_ms)

    def _busy(self, i: int, tick: int, ts_ms: int) -> tuple[float, float]:
        """GPU ``i``'s util % and DRAM bandwidth use % at tick ``tick``, as its sample of that tick says them."""
        util = self._util_at(i, tick, ts_ms)
        return round(util, 1), round(min(100.0, util * self._draw(tick, i, "dram", self._profiles[i].dram_ratio)), 2)

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
        util = self._util_at(i, tick, ts_ms)
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
