"""Per GPU and interval: the ranks' step spans cut to the interval and added up into cells, the time no step covers
as ``no_job``, a wait split over the roles it waited for (from the GPU samples), and the GPUs of roles that send no
step reports estimated from their activity.

Whom a wait was for: at each GPU sample inside a waiting rank's steps where its own GPU is idle, the roles whose
GPUs are busy at that moment get one vote, split evenly when several are busy; the rank's wait seconds are shared
by the votes. The samples say when each GPU worked; the reports say how long each role waited — joining them is
the point of the ledger. Without samples in the wait, whom it was for is ``unknown``, and the cell says so.

Per-process activity: ``process_busy_pct`` maps (node, GPU, pid) to the process's busy % of the window, from NVML's
per-process records as :mod:`trimtab.grading.ledger.shares` says (Σ smUtil × covered seconds over the time they
cover; the reader passes them to :func:`gpu_cells`). A role
placed on a GPU whose process sends no step reports — alone on it, or sharing it with a reporting rank — is then busy
for its processes' share of the interval (source ``process_activity``, estimated, and the notes say how the share
was made); without it, for the GPU's mean utilization (alone) or the utilization beyond the reporting ranks' own GPU
time (shared), estimated (``gpu_samples``), and the notes say so. Ranks that report split a GPU by their own
CUDA-event times and need neither.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from trimtab.contract.roles import RolePlacement
from trimtab.grading.ledger.model import (
    BUSY, GPU_SAMPLES, HOST, IDLE, NO_JOB, PHASE_WALL, PROCESS_ACTIVITY, PRORATED, SCALED, STEP_RESIDUAL, STEP_TIMELINE,
    UNKNOWN, UNKNOWN_ROLE, UNREPORTED_PHASE, WAITING, Cell, GpuKey, LedgerRules, merge_sources)
from trimtab.grading.ledger.timeline import StepSpan


@dataclass
class GpuTrace:
    """A GPU's utilization samples (ts_ms ascending, util %)."""

    ts_ms: list[int] = field(default_factory=list)
    util_pct: list[float] = field(default_factory=list)

    def at(self, ts_ms: float) -> Optional[float]:
        """The newest sample at or before ``ts_ms`` (None before the first)."""
        i = bisect.bisect_right(self.ts_ms, ts_ms) - 1
        return self.util_pct[i] if i >= 0 else None

    def between(self, start_ms: float, end_ms: float) -> range:
        return range(bisect.bisect_left(self.ts_ms, start_ms), bisect.bisect_left(self.ts_ms, end_ms))

    def mean_pct(self, start_ms: float, end_ms: float) -> Optional[float]:
        idx = self.between(start_ms, end_ms)
        return sum(self.util_pct[i] for i in idx) / len(idx) if len(idx) else None


@dataclass
class _Acc:
    """Cells of one GPU and interval being added up: seconds, sources, estimated, keyed like a cell."""

    seconds: dict[tuple, float] = field(default_factory=dict)
    sources: dict[tuple, set] = field(default_factory=dict)
    estimated: dict[tuple, bool] = field(default_factory=dict)

    def add(self, key: tuple, seconds: float, sources: tuple[str, ...], estimated: bool) -> None:
        if seconds <= 0:
            return
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.sources.setdefault(key, set()).update(sources)
        self.estimated[key] = self.estimated.get(key, False) or estimated

    def scale(self, kind: str, factor: float) -> None:
        for key in self.seconds:
            if key[0] == kind:
                self.seconds[key] *= factor
                self.sources[key].add(SCALED)
                self.estimated[key] = True

    def total(self, kind: Optional[str] = None) -> float:
        return sum(v for k, v in self.seconds.items() if kind is None or k[0] == kind)


def _covered_ms(spans: Sequence[StepSpan], start_ms: float, end_ms: float) -> float:
    """Wall time of [start, end) inside at least one span (the union: colocated ranks overlap)."""
    cuts = sorted((max(s.start_ms, start_ms), min(s.end_ms, end_ms)) for s in spans if s.overlap_ms(start_ms, end_ms))
    total, reach = 0.0, start_ms
    for a, b in cuts:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _wait_votes(span: StepSpan, start_ms: float, end_ms: float, own: GpuTrace, roles_by_gpu: Mapping[GpuKey, str],
                traces: Mapping[GpuKey, GpuTrace], rules: LedgerRules) -> dict[str, float]:
    """Votes for whom ``span``'s wait was for, from the samples inside it where its own GPU idles."""
    votes: dict[str, float] = {}
    me = GpuKey(span.hostname, span.gpu)
    for i in own.between(max(span.start_ms, start_ms), min(span.end_ms, end_ms)):
        if own.util_pct[i] >= rules.idle_below_util_pct:
            continue
        busy = sorted({roles_by_gpu[g] for g, t in traces.items()
                       if g != me and g in roles_by_gpu and (u := t.at(own.ts_ms[i])) is not None
                       and u >= rules.busy_from_util_pct})
        for role in busy:
            votes[role] = votes.get(role, 0.0) + 1.0 / len(busy)
    return votes


def _add_span(acc: _Acc, span: StepSpan, start_ms: float, end_ms: float) -> float:
    """Adds the part of ``span`` inside [start, end) (its account spread evenly over it); returns its wait seconds."""
    length = span.end_ms - span.start_ms
    if length <= 0:
        return 0.0
    frac = span.overlap_ms(start_ms, end_ms) / length
    cut = (PRORATED,) if frac < 1 else ()
    scaled = (SCALED,) if span.account.scaled else ()
    for phase, seconds in span.account.busy_s.items():
        source = span.account.busy_sources[phase]
        acc.add((BUSY, span.role, phase, ""), seconds * frac, (source, *cut, *scaled),
                source != "cuda_events" or bool(cut) or bool(scaled))
    for cause, seconds in span.account.idle_s.items():
        if cause != WAITING:
            acc.add((IDLE, span.role, cause, ""), seconds * frac, (STEP_RESIDUAL if cause == HOST else PHASE_WALL,) + cut
                    + scaled, bool(cut) or bool(scaled))
    return span.account.idle_s.get(WAITING, 0.0) * frac


def _split_wait(acc: _Acc, role: str, wait_s: float, votes: dict[str, float], cut: bool) -> None:
    total = sum(votes.values())
    if total <= 0:
        acc.add((IDLE, role, WAITING, UNKNOWN_ROLE), wait_s, (PHASE_WALL,), True)
        return
    for other, n in votes.items():
        acc.add((IDLE, role, WAITING, other), wait_s * n / total, (PHASE_WALL, GPU_SAMPLES) + ((PRORATED,) if cut else ()),
                True)


def _unreported(acc: _Acc, gpu: GpuKey, roles: Sequence[RolePlacement], start_ms: float, end_ms: float,
                trace: Optional[GpuTrace], process_busy_pct: Mapping[tuple[str, int, int], float]) -> list[str]:
    """A GPU the job holds where no rank reports: its roles busy for their activity, the rest idle, cause unknown."""
    wall_s = (end_ms - start_ms) / 1000.0
    role = "+".join(sorted({p.role for p in roles})) or UNKNOWN_ROLE
    shares = [process_busy_pct[(gpu.hostname, gpu.gpu, pid)] for p in roles for pid in p.pids
              if (gpu.hostname, gpu.gpu, pid) in process_busy_pct]
    notes = []
    if shares:
        busy_s, source = min(wall_s, wall_s * sum(shares) / 100.0), PROCESS_ACTIVITY
        notes.append(_activity_note(gpu, role))
    elif trace is not None and (mean := trace.mean_pct(start_ms, end_ms)) is not None:
        busy_s, source = wall_s * mean / 100.0, GPU_SAMPLES
        notes.append(f"GPU {gpu.label()} ({role}) sends no step reports: its busy time is the GPU's mean utilization "
                     f"(estimated; per-process activity would split it by process)")
    else:
        busy_s, source = 0.0, GPU_SAMPLES
        notes.append(f"GPU {gpu.label()} ({role}) sends no step reports and has no samples: all of its time is "
                     f"idle, cause unknown")
    acc.add((BUSY, role, UNREPORTED_PHASE, ""), busy_s, (source,), True)
    acc.add((IDLE, role, UNKNOWN, ""), wall_s - busy_s, (source,), True)
    return notes


def _activity_note(gpu: GpuKey, role: str) -> str:
    from trimtab.grading.ledger.shares import HOW

    return (f"GPU {gpu.label()} ({role}) sends no step reports: its busy time is {HOW} (estimated: whole-percent "
            f"records over the agent's reads, not the window's edges)")


def _silent_placements(placed: Sequence[RolePlacement], spans: Sequence[StepSpan]) -> list[RolePlacement]:
    """Roles placed on the GPU beside reporting ranks that send no reports of their own (neither their role nor
    their pids among the reports')."""
    roles = {part for s in spans for part in s.role.split("+")}
    pids = {s.pid for s in spans if s.pid is not None}
    return [p for p in placed if p.role not in roles and not set(p.pids) & pids]


def _share_with_silent(acc: _Acc, gpu: GpuKey, silent: Sequence[RolePlacement], start_ms: int, end_ms: int,
                       trace: Optional[GpuTrace], process_busy_pct: Mapping[tuple[str, int, int], float]) -> list[str]:
    """A GPU shared by a reporting rank and a silent role: the silent role is busy for its processes' share of the
    GPU (estimated from per-process activity, :mod:`.shares`), else for the GPU's utilization beyond the reporting
    ranks' own GPU time (estimated); that time is taken from the GPU's idle time (it ran while the reporting ranks
    did not)."""
    role = "+".join(sorted({p.role for p in silent}))
    wall_s = (end_ms - start_ms) / 1000.0
    shares = [process_busy_pct[(gpu.hostname, gpu.gpu, pid)] for p in silent for pid in p.pids
              if (gpu.hostname, gpu.gpu, pid) in process_busy_pct]
    if shares:
        busy_s, source, notes = wall_s * sum(shares) / 100.0, PROCESS_ACTIVITY, [_activity_note(gpu, role)]
    elif trace is not None and (mean := trace.mean_pct(start_ms, end_ms)) is not None:
        busy_s, source = max(0.0, wall_s * mean / 100.0 - acc.total(BUSY)), GPU_SAMPLES
        notes = [f"GPU {gpu.label()}: {role} shares it and sends no step reports: its busy time is the GPU's "
                 f"utilization beyond the reporting ranks' GPU time (estimated; per-process activity would measure "
                 f"it)"]
    else:
        return [f"GPU {gpu.label()}: {role} shares it, sends no step reports and the GPU has no samples: its busy "
                f"time is not in the ledger"]
    idle_s = acc.total(IDLE)
    taken_s = min(busy_s, idle_s)
    if taken_s > 0:
        acc.scale(IDLE, (idle_s - taken_s) / idle_s)
        acc.add((BUSY, role, UNREPORTED_PHASE, ""), taken_s, (source,), True)
    return notes


def gpu_cells(gpu: GpuKey, spans: Sequence[StepSpan], start_ms: int, end_ms: int, placed: Sequence[RolePlacement],
              roles_by_gpu: Mapping[GpuKey, str], traces: Mapping[GpuKey, GpuTrace], rules: LedgerRules,
              process_busy_pct: Mapping[tuple[str, int, int], float]) -> tuple[list[Cell], list[str]]:
    """The cells of one GPU over [start_ms, end_ms): busy + idle = the interval's length, by construction."""
    acc, notes = _Acc(), []
    inside = [s for s in spans if s.overlap_ms(start_ms, end_ms) > 0]
    if not spans and placed:
        notes += _unreported(acc, gpu, placed, start_ms, end_ms, traces.get(gpu), process_busy_pct)
    else:
        own = traces.get(gpu, GpuTrace())
        waits: dict[str, tuple[float, dict[str, float], bool]] = {}
        for span in inside:
            votes = _wait_votes(span, start_ms, end_ms, own, roles_by_gpu, traces, rules)
            wait_s = _add_span(acc, span, start_ms, end_ms)
            if wait_s > 0:
                total, all_votes, cut = waits.get(span.role, (0.0, {}, False))
                for role, n in votes.items():
                    all_votes[role] = all_votes.get(role, 0.0) + n
                waits[span.role] = (total + wait_s, all_votes, cut or span.overlap_ms(start_ms, end_ms)
                                    < span.end_ms - span.start_ms)
        for role, (wait_s, votes, cut) in waits.items():
            _split_wait(acc, role, wait_s, votes, cut)
        covered_s = _covered_ms(inside, start_ms, end_ms) / 1000.0
        busy_s, idle_s = acc.total(BUSY), acc.total(IDLE)
        if busy_s + idle_s > covered_s * (1 + 1e-9):  # ranks on one GPU overlap: the GPU has only the wall time
            if busy_s > covered_s:
                acc.scale(BUSY, covered_s / busy_s)
                acc.scale(IDLE, 0.0)
            else:
                acc.scale(IDLE, (covered_s - busy_s) / idle_s)
            notes.append(f"GPU {gpu.label()}: its processes' times add up to more than the wall time they cover "
                         f"(overlapping ranks): scaled to it")
        acc.add((IDLE, "", NO_JOB, ""), (end_ms - start_ms) / 1000.0 - covered_s, (STEP_TIMELINE,), False)
        silent = _silent_placements(placed, spans)
        if silent:
            notes += _share_with_silent(acc, gpu, silent, start_ms, end_ms, traces.get(gpu), process_busy_pct)
    cells = [Cell(gpu.hostname, gpu.gpu, start_ms, end_ms, kind, role, name, seconds, waiting_for,
                  acc.estimated[key], merge_sources(tuple(acc.sources[key])))
             for key, seconds in sorted(acc.seconds.items()) if seconds > 0
             for kind, role, name, waiting_for in [key]]
    return cells, notes
