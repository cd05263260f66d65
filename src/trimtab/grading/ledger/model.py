"""What the GPU-time ledger is made of: its cells (GPU-seconds of one GPU, one role, one phase or idle cause, one
interval), the classes of the step report's phases and the idle causes, as data.

The ledger answers "how many GPU-seconds did this run spend on what, and how many did it waste waiting for whom?".
Every GPU-second of a job's GPUs in a window lands in exactly one cell, busy or idle, so busy + idle = wall × GPUs.
Each cell says whether it was measured or estimated and from what (``sources``), so a share the store could not
measure is never shown with precision it does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

BUSY, IDLE = "busy", "idle"

# Idle causes. waiting: the role's process waited for another role (``waiting_for`` names which, from the GPU
# samples of the wait); host: its own process worked on the host (the step's time no phase claims, host-side
# phases, a phase's wall time beyond its GPU time); communication: collectives / weight sync; no_job: no step of
# the job covered the time (before its first step, between steps, after it stopped); unknown: a GPU the job holds
# whose process sends no step reports (its busy share estimated from the GPU's samples, the rest unexplained).
WAITING, HOST, COMMUNICATION, NO_JOB, UNKNOWN = "waiting", "host", "communication", "no_job", "unknown"
CAUSES = (WAITING, HOST, COMMUNICATION, NO_JOB, UNKNOWN)
UNKNOWN_ROLE = "unknown"
UNREPORTED_PHASE = "unreported"  # busy time of a role whose process sends no step reports

# How a step report's phase enters the ledger. gpu: busy GPU time (its CUDA-event time where reported, else its wall
# time, estimated); gpu_if_timed: busy only where its GPU time is reported, host otherwise (a checkpoint is
# mostly host-side I/O); an idle cause: the phase's wall time is idle for that cause.
PHASE_CLASSES: Mapping[str, str] = MappingProxyType({
    "generation": "gpu", "evaluation": "gpu", "update": "gpu", "validation": "gpu",
    "checkpoint": "gpu_if_timed", "communication": COMMUNICATION, "wait": WAITING, "other": HOST,
})

# Sources of a cell's figure.
CUDA_EVENTS = "cuda_events"          # the hook's CUDA events around the phase (measured)
WALL_PHASE = "wall_phase"            # the phase's wall time taken as GPU time (estimated: no CUDA events)
PHASE_WALL = "phase_wall"            # a phase's wall time, as the report says (communication, wait)
STEP_RESIDUAL = "step_residual"      # step time left over by the phases (host-side work of the role)
GPU_SAMPLES = "gpu_samples"          # the GPUs' utilization samples (whom a wait was for; unreported busy)
PROCESS_ACTIVITY = "process_activity"  # per-process SM % x covered seconds from NVML's records (estimated: .shares)
STEP_TIMELINE = "step_timeline"      # the ranks' step spans (what no step covered)
PRORATED = "prorated"                # a step cut by an interval edge, its time spread evenly over its span
SCALED = "scaled"                    # a step's phases (or two processes' times) added up to more than the wall


@dataclass(frozen=True)
class LedgerRules:
    """Thresholds of the ledger (the defaults are what the API, /metrics and check use; not yet in rules.toml)."""

    idle_below_util_pct: float = 10.0   # a GPU sample under this is an idle GPU (whose wait is it?)
    busy_from_util_pct: float = 10.0    # a GPU sample at or above this is a busy GPU (whom is it waited for?)
    balance_tolerance: float = 0.01     # busy + idle must equal wall × GPUs within this fraction


@dataclass(frozen=True)
class GpuKey:
    """A GPU of a job: its node and NVML index there."""

    hostname: str
    gpu: int

    def label(self) -> str:
        return f"{self.hostname}:{self.gpu}"


@dataclass(frozen=True)
class Cell:
    """GPU-seconds of one GPU in one interval: busy in ``role``'s ``phase``, or idle for ``cause`` (a waiting
    ``role`` waited for ``waiting_for``)."""

    hostname: str
    gpu: int
    start_ms: int
    end_ms: int
    kind: str                    # busy | idle
    role: str                    # whose GPU time it is ("" for no_job: no role's)
    name: str                    # the phase (busy) or the cause (idle)
    gpu_s: float
    waiting_for: str = ""        # the role waited for (cause waiting)
    estimated: bool = False
    sources: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.hostname, self.gpu, self.kind, self.role, self.name, self.waiting_for)


@dataclass
class Ledger:
    """A job's ledger over [start_ms, end_ms), in intervals of ``interval_ms``: its cells and notes saying what
    was missing and how it was estimated."""

    job: str
    start_ms: int
    end_ms: int
    interval_ms: int
    gpus: tuple[GpuKey, ...]
    cells: list[Cell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def wall_gpu_s(self) -> float:
        return len(self.gpus) * (self.end_ms - self.start_ms) / 1000.0

    @property
    def busy_gpu_s(self) -> float:
        return sum(c.gpu_s for c in self.cells if c.kind == BUSY)

    @property
    def idle_gpu_s(self) -> float:
        return sum(c.gpu_s for c in self.cells if c.kind == IDLE)

    def totals(self) -> dict[tuple, float]:
        """GPU-seconds by cell key over the whole window (intervals added up)."""
        out: dict[tuple, float] = {}
        for c in self.cells:
            out[c.key] = out.get(c.key, 0.0) + c.gpu_s
        return out

    def balanced(self, tolerance: float) -> bool:
        wall = self.wall_gpu_s
        return wall == 0 or abs(self.busy_gpu_s + self.idle_gpu_s - wall) <= tolerance * wall


def cause_label(cause: str, waiting_for: str = "") -> str:
    """The cause as one label value (/metrics, check): ``waiting_for_<role>`` for a wait."""
    return f"waiting_for_{waiting_for or UNKNOWN_ROLE}" if cause == WAITING else cause


def merge_sources(*groups: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({s for g in groups for s in g}))


def optional_float(value) -> Optional[float]:
    return None if value is None else float(value)
