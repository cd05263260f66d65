"""The step timeline of a job's ranks: each step report as a span of wall time with its GPU-seconds split into busy
phases and idle causes (``StepAccount``), built from the reports' end stamps and step times.

A step's span ends at its report's stamp and lasts ``step_time_s``. Reports queued by the hook during an outage
arrive together and carry (nearly) one stamp; read as they are, their spans would pile up. So a rank's spans are
laid back to back from its newest step backwards: a step ends at its own stamp or where the next step began,
whichever is earlier. This holds whether the store stamps a report on arrival or keeps the hook's own stamp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from trimtab.contract.roles import RolePlacement
from trimtab.grading.ledger.model import (
    COMMUNICATION, CUDA_EVENTS, HOST, PHASE_CLASSES, SCALED, UNKNOWN_ROLE, WAITING, WALL_PHASE, optional_float)


@dataclass(frozen=True)
class StepAccount:
    """One rank's step, in seconds of its GPU: busy by phase, idle by cause (``waiting``: whom for is decided
    later, from the GPU samples), and where each figure came from."""

    busy_s: Mapping[str, float]
    busy_sources: Mapping[str, str]
    idle_s: Mapping[str, float]
    scaled: bool = False


@dataclass(frozen=True)
class StepSpan:
    """One rank's step on the wall clock, on its GPU, with its account."""

    rank: int
    step: int
    pid: Optional[int]
    hostname: str
    gpu: int
    role: str
    role_source: str
    start_ms: float
    end_ms: float
    account: StepAccount

    def overlap_ms(self, start_ms: float, end_ms: float) -> float:
        return max(0.0, min(self.end_ms, end_ms) - max(self.start_ms, start_ms))


def account_of(report: Mapping[str, Any]) -> StepAccount:
    """A step report (flat columns) as busy and idle seconds adding up to its step time. GPU phases count their
    CUDA-event time where reported, else their wall time (estimated); communication and wait count their wall
    time as idle; what the phases leave of the step time is host-side work. Phases that claim more than the step
    time (overlapping timers) are scaled down to it, and the account says so."""
    step_s = float(report["step_time_s"] or 0.0)
    busy, sources, idle = {}, {}, {COMMUNICATION: 0.0, WAITING: 0.0}
    for phase, cls in PHASE_CLASSES.items():
        wall, gpu = optional_float(report.get(f"{phase}_s")), optional_float(report.get(f"gpu_{phase}_s"))
        if cls in ("gpu", "gpu_if_timed") and gpu is not None:
            busy[phase], sources[phase] = gpu, CUDA_EVENTS
        elif cls == "gpu" and wall is not None:
            busy[phase], sources[phase] = wall, WALL_PHASE
        elif cls in (COMMUNICATION, WAITING) and (wall if wall is not None else gpu) is not None:
            idle[cls] += wall if wall is not None else gpu
    claimed = sum(busy.values()) + sum(idle.values())
    scaled = claimed > step_s * (1 + 1e-9)
    if scaled:
        factor = step_s / claimed if claimed > 0 else 0.0
        busy = {p: v * factor for p, v in busy.items()}
        idle = {c: v * factor for c, v in idle.items()}
        claimed = step_s
    idle[HOST] = max(0.0, step_s - claimed)
    return StepAccount({p: v for p, v in busy.items() if v > 0}, sources,
                       {c: v for c, v in idle.items() if v > 0}, scaled)


def role_of(pid: Optional[int], hostname: str, gpu: int, placements: Sequence[RolePlacement],
            device_map: Mapping[str, Iterable[int]], single_host: bool) -> tuple[str, str]:
    """(role, how it was found) of a rank: its pid in the job's placements; else the roles placed on its GPU; else
    the device map's components on its GPU (a one-node job). Several roles (colocated in one process or on one GPU)
    are joined with '+'."""
    by_pid = sorted({p.role for p in placements if p.node == hostname and pid is not None and pid in p.pids})
    if by_pid:
        return "+".join(by_pid), "pid"
    by_gpu = sorted({p.role for p in placements if p.node == hostname and gpu in p.gpus})
    if by_gpu:
        return "+".join(by_gpu), "placement"
    mapped = sorted({role for role, gpus in device_map.items() if gpu in set(gpus)}) if single_host else []
    if mapped:
        return "+".join(mapped), "device_map"
    return UNKNOWN_ROLE, "none"


def step_spans(reports: Iterable[Mapping[str, Any]], placements: Sequence[RolePlacement],
               device_map: Mapping[str, Iterable[int]], hostnames: Sequence[str]) -> tuple[list[StepSpan], list[str]]:
    """The spans of every report that names its node and GPU, and notes on those that do not (left out: their
    GPU-seconds cannot be placed on a GPU)."""
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    unplaced: set[int] = set()
    default_host = hostnames[0] if len(hostnames) == 1 else None
    for r in reports:
        if r.get("local_gpu") is None or (r.get("hostname") or default_host) is None:
            unplaced.add(int(r["rank"]))
            continue
        by_rank.setdefault(int(r["rank"]), []).append(r)
    spans: list[StepSpan] = []
    for rank, rows in by_rank.items():
        next_start: Optional[float] = None
        for r in sorted(rows, key=lambda x: x["step"], reverse=True):
            end = float(r["received_ms"]) if next_start is None else min(float(r["received_ms"]), next_start)
            start = end - 1000.0 * float(r["step_time_s"] or 0.0)
            host, gpu = r.get("hostname") or default_host, int(r["local_gpu"])
            role, how = role_of(r.get("pid"), host, gpu, placements, device_map, default_host is not None)
            spans.append(StepSpan(rank, int(r["step"]), r.get("pid"), host, gpu, role, how, start, end,
                                  account_of(r)))
            next_start = start
    notes = [f"rank {rank}'s reports name no node or GPU (hostname, local_gpu): their GPU time is not in the ledger"
             for rank in sorted(unplaced)]
    return sorted(spans, key=lambda s: (s.hostname, s.gpu, s.start_ms)), notes


def scaled_note(spans: Sequence[StepSpan]) -> list[str]:
    n = sum(1 for s in spans if s.account.scaled)
    return [f"{n} step(s) had phases adding up to more than their step time: scaled down to it ({SCALED})"] if n else []

