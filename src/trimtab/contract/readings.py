"""Typed readings that cross every boundary: source → sampler → spool/HTTP → store.

One place defines what a GPU sample holds (``GPU_METRICS``), so the store's columns, the rollups, the API
schemas and the Prometheus names are all derived from the same list. ``None`` always means "unsupported or
not measured" and is stored as NULL; it is never replaced by 0.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class MetricSpec:
    """One numeric per-sample metric: its field name (with unit), unit, and meaning."""

    name: str
    unit: str
    help: str
    rollup: bool = True  # min/mean/max kept in the 1-minute and 1-hour rollups
    integer: bool = False  # stored as an integer column (bytes, masks, MHz)


GPU_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("util_pct", "%", "NVML kernel-busy utilization: share of time at least one kernel ran (what nvidia-smi shows)."),
    MetricSpec("sm_active_pct", "%", "GPM SM activity: share of SMs busy, averaged over the interval (Hopper+)."),
    MetricSpec("sm_occupancy_pct", "%", "GPM SM occupancy: active warps vs the theoretical maximum (Hopper+)."),
    MetricSpec("tensor_active_pct", "%", "GPM tensor activity: share of time any tensor core pipe was busy (Hopper+)."),
    MetricSpec("dram_bw_util_pct", "%", "GPM DRAM bandwidth used vs the theoretical maximum (Hopper+)."),
    MetricSpec("mem_used_bytes", "bytes", "Framebuffer memory used by processes (NVML memory v2 `used`).", integer=True),
    MetricSpec("mem_reserved_bytes", "bytes", "Framebuffer memory reserved by the driver (NVML memory v2 `reserved`).", integer=True),
    MetricSpec("mem_total_bytes", "bytes", "Framebuffer memory total.", rollup=False, integer=True),
    MetricSpec("pcie_tx_bytes_per_s", "bytes/s", "PCIe traffic from this GPU (GPM, or the PCIe throughput counter on pre-Hopper)."),
    MetricSpec("pcie_rx_bytes_per_s", "bytes/s", "PCIe traffic to this GPU (GPM, or the PCIe throughput counter on pre-Hopper)."),
    MetricSpec("nvlink_tx_bytes_per_s", "bytes/s", "NVLink traffic sent, summed over links; NULL where the GPU has no NVLink."),
    MetricSpec("nvlink_rx_bytes_per_s", "bytes/s", "NVLink traffic received, summed over links; NULL where the GPU has no NVLink."),
    MetricSpec("power_w", "W", "Board power draw."),
    MetricSpec("temperature_c", "°C", "GPU die temperature."),
    MetricSpec("sm_clock_mhz", "MHz", "Current SM clock.", integer=True),
    MetricSpec("clock_event_mask", "bitmask", "NVML clock-event (throttle) reasons bitmask.", rollup=False, integer=True),
)

GPU_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in GPU_METRICS)

# Per NVLink link, beside the per-GPU sums above: NVML's per-link data counters (payload). Read off the tick, every
# few seconds (see trimtab.agent.nvml.slow); a GPU without NVLink has no per-link readings at all, never zeros.
NVLINK_LINK_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("tx_bytes_per_s", "bytes/s", "NVLink data sent over one link (payload)."),
    MetricSpec("rx_bytes_per_s", "bytes/s", "NVLink data received over one link (payload)."),
)
NVLINK_LINK_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in NVLINK_LINK_METRICS)
ROLLUP_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in GPU_METRICS if m.rollup)

HOST_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("cpu_pct", "%", "Host CPU utilization over the interval, all cores."),
    MetricSpec("load1", "", "1-minute load average."),
    MetricSpec("mem_used_bytes", "bytes", "Host memory in use (total − available).", integer=True),
    MetricSpec("mem_total_bytes", "bytes", "Host memory total.", integer=True),
    MetricSpec("net_rx_bytes_per_s", "bytes/s", "Network bytes received per second, all interfaces but loopback."),
    MetricSpec("net_tx_bytes_per_s", "bytes/s", "Network bytes sent per second, all interfaces but loopback."),
    MetricSpec("disk_read_bytes_per_s", "bytes/s", "Disk bytes read per second, all disks."),
    MetricSpec("disk_write_bytes_per_s", "bytes/s", "Disk bytes written per second, all disks."),
)
HOST_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in HOST_METRICS)

# How far ahead of the receiving clock a reading may be dated (clock skew between nodes). A server refuses
# readings beyond it, and the live views ignore them: one sample dated 2^53 − 1 must not stay "the newest" for good.
MAX_CLOCK_AHEAD_S = 300
# A node's clock further off the receiver's than this is shown as such (/v1/nodes, /healthz, check, an event):
# its samples sit that far off in every window. NTP keeps clocks within milliseconds; a batch's trip adds less.
MAX_CLOCK_SKEW_S = 5.0
# The latest reading of a GPU (a link, a host) is the newest by its stamp — or, once the node's clock stepped back,
# one whose time on the receiver's clock (stamp + the node's skew as its batch came) is newer than the held one's by
# more than this: the node's current readings then stamp older than those from before the step, and would
# otherwise stay out of /v1/gpus and /metrics until real time caught up with the step. More than a batch's trip
# varies by (the trip is in the skew), so batches in order never trade places by it.
STEP_BACK_MARGIN_MS = 5_000
_DATED_PARTS = ("gpu_samples", "host_samples", "processes", "events", "nvlink_samples")


def first_ahead_of_clock(batch: Any, now_ms: int) -> Optional[tuple[str, int, int]]:
    """(part, index, ts_ms) of the batch's first reading dated more than MAX_CLOCK_AHEAD_S after ``now_ms``, else
    None. The one rule for every way into a store: a server's ingest (a 422) and an agent writing its store itself
    (the batch is kept aside, as a refused one). ``batch``: a :class:`Batch`, or anything with its lists."""
    bound = now_ms + MAX_CLOCK_AHEAD_S * 1000
    for part in _DATED_PARTS:
        for i, row in enumerate(getattr(batch, part)):
            if row.ts_ms > bound:
                return part, i, row.ts_ms
    return None


def ahead_of_clock_message(ts_ms: int, now_ms: int, whose: str = "the server's") -> str:
    return (f"ts_ms {ts_ms} is {(ts_ms - now_ms) / 1000:.0f} s ahead of {whose} clock ({now_ms}); at most "
            f"{MAX_CLOCK_AHEAD_S} s ahead is accepted (check the node's clock)")

# Health event kinds. Free text lives in `detail`; `kind` is what tools filter on.
EVENT_GPU_LOST = "gpu_lost"
EVENT_XID = "xid"
EVENT_SOURCE_ERROR = "source_error"
EVENT_SPOOL_DROPPED = "spool_dropped"
EVENT_CLOCK_STEP = "clock_step"  # the node's wall clock stepped (the agent saw it against its monotonic clock)
EVENT_CLOCK_SKEW = "clock_skew"  # the node's clock is off the receiver's: batches refused, or it runs behind


@dataclass(frozen=True)
class NodeInfo:
    """The machine an agent runs on. ``simulated`` marks a simulated node everywhere its data shows."""

    hostname: str
    simulated: bool = False
    driver_version: Optional[str] = None
    nvml_version: Optional[str] = None
    scenario: Optional[str] = None  # simulated nodes only


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, read once at start."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: Optional[int] = None
    pcie_max_gen: Optional[int] = None
    pcie_max_width: Optional[int] = None
    pcie_peak_bytes_per_s: Optional[float] = None  # per direction, from max gen × width × encoding
    nvlink_link_count: Optional[int] = None  # active links; None = no NVLink / unsupported
    gpm_supported: bool = False


@dataclass
class GpuSample:
    """One GPU at one instant. Every metric is optional: None = unsupported or not measured."""

    gpu_uuid: str
    ts_ms: int
    util_pct: Optional[float] = None
    sm_active_pct: Optional[float] = None
    sm_occupancy_pct: Optional[float] = None
    tensor_active_pct: Optional[float] = None
    dram_bw_util_pct: Optional[float] = None
    mem_used_bytes: Optional[int] = None
    mem_reserved_bytes: Optional[int] = None
    mem_total_bytes: Optional[int] = None
    pcie_tx_bytes_per_s: Optional[float] = None
    pcie_rx_bytes_per_s: Optional[float] = None
    nvlink_tx_bytes_per_s: Optional[float] = None
    nvlink_rx_bytes_per_s: Optional[float] = None
    power_w: Optional[float] = None
    temperature_c: Optional[float] = None
    sm_clock_mhz: Optional[int] = None
    clock_event_mask: Optional[int] = None


@dataclass
class NvlinkSample:
    """One NVLink link of one GPU at one instant; ``link`` is NVML's link index. None = not measured."""

    gpu_uuid: str
    ts_ms: int
    link: int
    tx_bytes_per_s: Optional[float] = None
    rx_bytes_per_s: Optional[float] = None


@dataclass
class HostSample:
    """The host at one instant (psutil). Rates are over the interval since the previous sample."""

    ts_ms: int
    cpu_pct: Optional[float] = None
    load1: Optional[float] = None
    mem_used_bytes: Optional[int] = None
    mem_total_bytes: Optional[int] = None
    net_rx_bytes_per_s: Optional[float] = None
    net_tx_bytes_per_s: Optional[float] = None
    disk_read_bytes_per_s: Optional[float] = None
    disk_write_bytes_per_s: Optional[float] = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU (or seen busy on it since the last process row). PIDs are host PIDs.

    Its GPU activity over ``(util_from_ms, util_to_ms]`` (NVML's per-process utilization records, see
    ``trimtab.agent.activity``): ``sm_util_pct`` and ``mem_util_pct`` are the process's means over that whole
    interval, made of ``util_samples`` records (each its mean since the previous read, weighted by the time it
    covers), so ``sm_util_pct / 100 × (util_to_ms − util_from_ms) / 1000`` is its busy seconds; 0 with 0 records
    when NVML answered for the interval and never saw it busy. All five are None where the GPU cannot tell
    (unsupported, before the first read that saw a busy process, no read answered): unknown, never 0. ``used_memory_bytes`` is None for a process seen
    busy that no longer held a context when the process list was read.
    """

    gpu_uuid: str
    ts_ms: int
    pid: int
    used_memory_bytes: Optional[int] = None
    name: Optional[str] = None
    sm_util_pct: Optional[float] = None
    mem_util_pct: Optional[float] = None
    util_samples: Optional[int] = None
    util_from_ms: Optional[int] = None
    util_to_ms: Optional[int] = None


@dataclass(frozen=True)
class HealthEvent:
    """Something a person should know about: a lost GPU, an XID, a source failing, data dropped."""

    ts_ms: int
    kind: str
    detail: str = ""
    gpu_uuid: Optional[str] = None
    xid: Optional[int] = None


@dataclass
class Readings:
    """What one source returns for one tick."""

    gpu_samples: list[GpuSample] = field(default_factory=list)
    host_sample: Optional[HostSample] = None
    processes: list[GpuProcess] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)
    nvlink_samples: list[NvlinkSample] = field(default_factory=list)


@dataclass
class Batch:
    """A self-contained unit of writing: the node and GPU inventory travel with the samples, so a store (local
    or behind a server) can file a batch it has never seen the node of, and a replayed batch is idempotent."""

    node: NodeInfo
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    host_samples: list[HostSample] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)
    nvlink_samples: list[NvlinkSample] = field(default_factory=list)

    def row_count(self) -> int:
        return (len(self.gpu_samples) + len(self.host_samples) + len(self.processes) + len(self.events)
                + len(self.nvlink_samples))

    def is_empty(self) -> bool:
        return self.row_count() == 0

    def extend(self, other: "Batch") -> None:
        """Append another batch of the same node (inventory is replaced by the newer one)."""
        self.gpus = other.gpus or self.gpus
        self.gpu_samples.extend(other.gpu_samples)
        self.host_samples.extend(other.host_samples)
        self.processes.extend(other.processes)
        self.events.extend(other.events)
        self.nvlink_samples.extend(other.nvlink_samples)

    def copy(self) -> "Batch":
        """A batch of the same readings in lists of its own (extending it leaves this one as it is)."""
        return Batch(node=self.node, gpus=list(self.gpus), gpu_samples=list(self.gpu_samples),
                     host_samples=list(self.host_samples), processes=list(self.processes), events=list(self.events),
                     nvlink_samples=list(self.nvlink_samples))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, sent_ms: Optional[int] = None) -> str:
        """The batch as JSON; with ``sent_ms`` (the sender's clock as it sends) the receiver can tell its skew."""
        d = self.to_dict() if sent_ms is None else {**self.to_dict(), "sent_ms": sent_ms}
        return json.dumps(d, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Batch":
        return cls(
            node=NodeInfo(**d["node"]),
            gpus=[GpuInfo(**g) for g in d.get("gpus", ())],
            gpu_samples=[GpuSample(**s) for s in d.get("gpu_samples", ())],
            host_samples=[HostSample(**s) for s in d.get("host_samples", ())],
            processes=[GpuProcess(**p) for p in d.get("processes", ())],
            events=[HealthEvent(**e) for e in d.get("events", ())],
            nvlink_samples=[NvlinkSample(**n) for n in d.get("nvlink_samples", ())],  # absent from older agents
        )

    @classmethod
    def from_json(cls, text: str) -> "Batch":
        return cls.from_dict(json.loads(text))
