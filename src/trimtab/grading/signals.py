"""Each rule's signal over a window: from the job's step reports (job scope) or the agent's samples of the job's
GPUs (GPU scope), graded against the rule, with the figures that go into a decision's evidence.

Hysteresis lives here: a job signal fires only when it is above ``act_above`` over the whole window *and* over
each half of it (so one slow step cannot fire a rule, yet a phase that happens every few steps — a weight sync
every 2nd step — is judged by its share of the time, not by the steps that lack it). Phase shares are time-weighted
(phase seconds / step seconds), on GPU time where the window's steps carry it (:func:`time_base`: a phase that
launches kernels and returns takes no wall time, the phase that next waits for the GPU would take the blame), on
wall time otherwise; fragmentation and latency are means of the steps that carry them. A GPU signal
fires when its window mean is above the line, with enough samples on every GPU. Missing data never fires
(``status == "no_data"``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from trimtab.contract.statuses import NO_DATA
from trimtab.contract.step_report import GPU_PHASES, NAMED_PHASES, OTHER_PHASE
from trimtab.grading.rule_types import Rule
from trimtab.grading.window import JobStep

GPU_TIME, WALL_TIME = "gpu", "wall"  # what a window's phase shares are measured on
TIME_BASE_WORDS = {GPU_TIME: "GPU time (CUDA events)", WALL_TIME: "wall time"}


class GpuWindow(Protocol):
    """What a GPU rule needs of one GPU's window (``trimtab.store.queries.GpuAggregate`` satisfies it)."""

    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    pcie_peak_bytes_per_s: Optional[float]
    nvlink_link_count: Optional[int]
    n_samples: int
    mean: Mapping[str, Optional[float]]
    max: Mapping[str, Optional[float]]


@dataclass
class Reading:
    rule: str
    signal: str
    unit: str
    status: str                          # ok | watch | act | no_data
    value: Optional[float]               # window mean (job) or the window's worst GPU (GPU)
    per_step: list[Optional[float]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def fires(self) -> bool:
        return self.status == "act"

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"signal": self.signal, "unit": self.unit, "value": _round(self.value),
                               "status": self.status, "message": self.message}
        if self.per_step:
            out["per_step"] = [_round(v) for v in self.per_step]
        out.update(self.detail)
        return out


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(float(v), 3)


@dataclass(frozen=True)
class JobContext:
    """What a job signal may look at besides the window: every loaded step (for OOM deltas) and the probe baseline."""
    all_steps: Sequence[JobStep]
    probe_baseline_us: Optional[float]
    ooms_since_step: Optional[int] = None  # the last change's step: an OOM in its settle step still counts
    ooms_reported: Optional[int] = None    # cumulative OOMs an "oom" decision already reported
    period: int = 1                        # steps per sync period (halves are split at a period boundary)


Aggregate = Callable[[Sequence[JobStep]], Optional[float]]


def _halves(window: Sequence[JobStep], period: int = 1) -> list[Sequence[JobStep]]:
    """The window's two halves, split at a sync-period boundary (a half of a period would hold no sync step and
    read 0 % communication); a window of one period is judged whole."""
    periods = len(window) // max(1, period)
    if periods < 2:
        return [window]
    mid = (periods // 2) * period
    return [window[:mid], window[mid:]]


def _sustained(rule: Rule, window: Sequence[JobStep], aggregate: Aggregate, values: list[Optional[float]],
               what: str, period: int = 1, absent_is_zero: bool = False) -> Reading:
    base = dict(rule=rule.name, signal=rule.signal, unit=rule.unit, per_step=values)
    whole = aggregate(window)
    if whole is None:
        return Reading(status=NO_DATA, value=None, message=f"no {what} in the window's reports", **base)
    halves = [aggregate(h) for h in _halves(window, period)]
    if absent_is_zero:  # a phase the window reports but one half never entered: 0 % there, not "no data"
        halves = [0.0 if h is None else h for h in halves]
    lowest = min((h for h in halves if h is not None), default=whole)
    status = "act" if whole > rule.act_above and lowest > rule.act_above else \
        ("watch" if rule.grade(whole) != "ok" else "ok")
    n = sum(v is not None for v in values)
    msg = (f"{what} {whole:.1f} {rule.unit} over steps {window[0].step}–{window[-1].step} ({n} with data; lower "
           f"half-window {lowest:.1f}; act above {rule.act_above:g})")
    return Reading(status=status, value=whole, message=msg,
                   detail={"steps": [s.step for s in window], "halves": [_round(h) for h in halves]}, **base)


def _gpu_s(step: JobStep, phase: str) -> Optional[float]:
    return step.reported.get(f"gpu_{phase}_s") if phase in GPU_PHASES else None


def _gpu_timed(step: JobStep) -> bool:
    return any(_gpu_s(step, p) is not None for p in GPU_PHASES)


def _timed(step: JobStep) -> bool:
    return any(v is not None for v in step.phases_s.values())


def time_base(steps: Sequence[JobStep]) -> str:
    """``"gpu"`` when every step of ``steps`` that reports phases also reports their GPU time (the hook's CUDA
    events), else ``"wall"``: one base for a whole window (and its halves), never a mix of the two."""
    timed = [s for s in steps if _timed(s)]
    return GPU_TIME if timed and all(_gpu_timed(s) for s in timed) else WALL_TIME


def time_base_words(steps: Sequence[JobStep]) -> str:
    """What the window's shares are measured on, as check says it: "GPU time for update, evaluation; wall time for
    wait" (a phase without events — waiting, a framework's host-side timer — keeps its wall time) or "wall time"."""
    if time_base(steps) != GPU_TIME:
        return TIME_BASE_WORDS[WALL_TIME]
    on_gpu = [p for p in GPU_PHASES if any(_gpu_s(s, p) is not None for s in steps)]
    on_wall = [p for p in NAMED_PHASES if p not in on_gpu and any(s.phases_s.get(p) for s in steps)]
    return f"GPU time for {', '.join(on_gpu)}" + (f"; wall time for {', '.join(on_wall)}" if on_wall else "")


def phase_seconds(step: JobStep, phase: str, base: str = WALL_TIME) -> Optional[float]:
    """The step's seconds in ``phase`` on ``base``. On GPU time a phase takes its GPU seconds where it has them and
    its wall seconds where it has not (waiting for rollout; a framework's host-side timer), and "other" is what the
    step's wall time leaves after the named phases so measured."""
    if base != GPU_TIME:
        return step.phases_s.get(phase)
    if phase == OTHER_PHASE:
        if not _timed(step):
            return None
        named = sum(phase_seconds(step, p, base) or 0.0 for p in NAMED_PHASES)
        return max(0.0, step.step_time_s - named)
    gpu = _gpu_s(step, phase)
    return gpu if gpu is not None else step.phases_s.get(phase)


def step_share_pct(step: JobStep, phase: str, base: str = WALL_TIME) -> Optional[float]:
    """One step's share of ``phase`` on ``base``, % (None when the step does not report it)."""
    value = phase_seconds(step, phase, base)
    if value is None or step.step_time_s <= 0:
        return None
    return min(100.0, 100.0 * value / step.step_time_s)


def phase_share_pct(steps: Sequence[JobStep], phase: str, base: Optional[str] = None) -> Optional[float]:
    """``phase``'s seconds over *all* the steps' seconds, capped at 100 %; None when no step reports it. A step
    that reports other phases but not this one spent no time in it (the hook leaves out phases a step never
    entered): a sync every 8th step is a share of every step's time, not only of the 8th step's. ``base``: GPU or
    wall time (default: :func:`time_base` of ``steps``) — the one place step composition is measured."""
    base = base or time_base(steps)
    timed = [s for s in steps if _timed(s)]
    if not any(s.phases_s.get(phase) is not None or (base == GPU_TIME and _gpu_s(s, phase) is not None)
               for s in timed):
        return None
    seconds = sum(s.step_time_s for s in timed)
    spent = sum(phase_seconds(s, phase, base) or 0.0 for s in timed)
    return min(100.0, 100.0 * spent / seconds) if seconds > 0 else None


def _share(phase: str, base: str) -> Aggregate:
    return lambda steps: phase_share_pct(steps, phase, base)


def _mean_of(values_of: Callable[[JobStep], Optional[float]]) -> Aggregate:
    def aggregate(steps: Sequence[JobStep]) -> Optional[float]:
        known = [v for v in map(values_of, steps) if v is not None]
        return statistics.fmean(known) if known else None
    return aggregate


def _ooms(rule: Rule, window: Sequence[JobStep], ctx: JobContext) -> Reading:
    first = window[0].step if ctx.ooms_since_step is None else min(window[0].step, ctx.ooms_since_step)
    last = window[-1].step
    before = [s.num_ooms for s in ctx.all_steps if s.step < first and s.num_ooms is not None]
    inside = [s.num_ooms for s in ctx.all_steps if first <= s.step <= last and s.num_ooms is not None]
    base = dict(rule=rule.name, signal=rule.signal, unit=rule.unit)
    if not inside:
        return Reading(status=NO_DATA, value=None, message="no allocator statistics in the window", **base)
    baseline = max(before[-1] if before else 0, ctx.ooms_reported or 0)
    new = max(0, max(inside) - baseline)
    status = "act" if new > rule.act_above else "ok"
    return Reading(status=status, value=float(new), message=f"{new} OOM(s) in steps {first}–{last}",
                   detail={"num_ooms_cumulative": max(inside)}, **base)


def _latency_reading(rule: Rule, window: Sequence[JobStep], ctx: JobContext) -> Reading:
    """Collective latency as a multiple of the job's probe baseline, sustained over the window (what the controller
    decides on; the row :mod:`trimtab.grading.grading` shows adds the probe mean)."""
    if ctx.probe_baseline_us is None or ctx.probe_baseline_us <= 0:
        return Reading(rule=rule.name, signal=rule.signal, unit=rule.unit, status=NO_DATA, value=None,
                       message="no collective-latency baseline yet (the hook's probe is off or too few probes)")
    def ratio(s: JobStep) -> Optional[float]:
        return None if s.collective_latency_us is None else s.collective_latency_us / ctx.probe_baseline_us

    reading = _sustained(rule, window, _mean_of(ratio), [ratio(s) for s in window], "collective latency vs baseline")
    reading.detail["baseline_us"] = _round(ctx.probe_baseline_us)
    return reading


def job_reading(rule: Rule, window: Sequence[JobStep], ctx: JobContext) -> Reading:
    signal = rule.signal
    if signal == "ooms":
        return _ooms(rule, window, ctx)
    if signal == "collective_latency_x_baseline":
        return _latency_reading(rule, window, ctx)
    if signal == "fragmentation_pct":
        def frag(s: JobStep) -> Optional[float]:
            return None if s.fragmentation is None else 100.0 * s.fragmentation

        return _sustained(rule, window, _mean_of(frag), [frag(s) for s in window], "allocator fragmentation")
    phase = signal.removesuffix("_share_pct")
    base = time_base(window)
    reading = _sustained(rule, window, _share(phase, base), [step_share_pct(s, phase, base) for s in window],
                         f"{phase} share ({TIME_BASE_WORDS[base]})", ctx.period, absent_is_zero=True)
    reading.detail["time_base"] = base
    return reading


def alloc_retries(window: Sequence[JobStep], ctx: JobContext) -> int:
    """Allocator retries (cudaMalloc after flushing the cache: the symptom of fragmentation that hurts) in the
    window."""
    first = window[0].step
    before = [s.num_alloc_retries for s in ctx.all_steps if s.step < first and s.num_alloc_retries is not None]
    inside = [s.num_alloc_retries for s in window if s.num_alloc_retries is not None]
    return max(inside) - (before[-1] if before else 0) if inside else 0


def mem_used_pct(w: GpuWindow) -> Optional[float]:
    """Used plus reserved memory over total, window mean, % (None where NVML does not report it)."""
    used, reserved = w.mean.get("mem_used_bytes"), w.mean.get("mem_reserved_bytes")
    total = w.mean.get("mem_total_bytes")
    if used is None or not total:
        return None
    return 100.0 * (used + (reserved or 0.0)) / total


def pcie_pct_of_peak(w: GpuWindow) -> Optional[float]:
    """The busier PCIe direction over the link's peak, window mean, % (None without readings or a known peak)."""
    tx, rx = w.mean.get("pcie_tx_bytes_per_s"), w.mean.get("pcie_rx_bytes_per_s")
    if (tx is None and rx is None) or not w.pcie_peak_bytes_per_s:
        return None
    return 100.0 * max(tx or 0.0, rx or 0.0) / w.pcie_peak_bytes_per_s


# The GPU-scope signals: per-GPU value of one GPU's window. "utilization_spread_pts" is across GPUs instead: the
# rule's gpu_signal (max − min), with its fallback where a GPU lacks it.
PER_GPU: dict[str, Callable[[GpuWindow], Optional[float]]] = {"mem_used_pct": mem_used_pct,
                                                              "pcie_pct_of_peak": pcie_pct_of_peak}
SPREAD = "utilization_spread_pts"


@dataclass(frozen=True)
class GpuGrade:
    """One GPU rule over a window, graded: the per-GPU values it read, the value and the GPU that set it. The
    controller's :class:`Reading` and a node's check row are both written from this, so they cannot disagree."""
    rule: Rule
    status: str                          # ok | watch | act | no_data
    value: Optional[float] = None
    gpu: Optional[int] = None            # the GPU that set the value (spread: the busiest)
    low_gpu: Optional[int] = None        # spread: the idlest GPU
    key: Optional[str] = None            # the per-GPU reading graded (spread: gpu_signal or its fallback)
    values: dict[int, Optional[float]] = field(default_factory=dict)
    why: str = ""                        # no_data: "no_gpus", "thin", "unmeasured"
    thin: tuple[int, ...] = ()
    min_samples: int = 1

    @property
    def spread(self) -> bool:
        return self.rule.signal == SPREAD

    def reading(self) -> Reading:
        """The controller's form (decision evidence)."""
        rule = self.rule
        base = dict(rule=rule.name, signal=rule.signal, unit=rule.unit, status=self.status, value=self.value)
        if self.why == "no_gpus":
            return Reading(message="no agent samples of the job's GPUs in the window", **base)
        if self.why == "thin":
            return Reading(message=f"fewer than {self.min_samples} agent samples of GPU {list(self.thin)} in the "
                                   f"window", **base)
        if self.spread:
            if self.why == "unmeasured":
                return Reading(message=f"{self.key} not measured on every GPU", **base)
            if len(self.values) < 2:
                return Reading(message="one GPU: no spread", detail={self.key: self.values}, **base)
            return Reading(detail={"per_gpu_" + self.key: _rounded(self.values)},
                           message=f"{self.key} spread {self.value:.1f} pts across GPUs {sorted(self.values)}", **base)
        if self.why == "unmeasured":
            return Reading(message=f"{rule.signal} not measured on these GPUs", **base)
        return Reading(detail={"per_gpu": _rounded(self.values), "gpu": self.gpu},
                       message=f"GPU {self.gpu} at {self.value:.1f} {rule.unit} (window mean)", **base)


def grade_gpus(rule: Rule, gpus: Sequence[GpuWindow], min_samples: int, every_gpu: bool = True) -> GpuGrade:
    """Grade a GPU-scope rule over the windows of ``gpus`` (index order: on a tie the lower index sets the value).

    ``every_gpu``: a spread needs the reading of every GPU (the controller must not act on the part of a job it
    can see); without it a GPU that lacks the reading is left out (a node's check grades the GPUs that measure it).
    """
    if not gpus:
        return GpuGrade(rule, NO_DATA, why="no_gpus", min_samples=min_samples)
    thin = tuple(g.gpu_index for g in gpus if g.n_samples < min_samples)
    if thin:
        return GpuGrade(rule, NO_DATA, why="thin", thin=thin, min_samples=min_samples)
    if rule.signal == SPREAD:
        key = rule.gpu_signal or "sm_active_pct"
        if any(g.mean.get(key) is None for g in gpus):
            key = rule.fallback_gpu_signal or "util_pct"
        values = {g.gpu_index: g.mean.get(key) for g in gpus}
        if not every_gpu:
            values = {i: v for i, v in values.items() if v is not None}
        if not values or any(v is None for v in values.values()):
            return GpuGrade(rule, NO_DATA, key=key, values=values, why="unmeasured", min_samples=min_samples)
        hi, lo = max(values, key=lambda i: values[i]), min(values, key=lambda i: values[i])
        if len(values) < 2:
            return GpuGrade(rule, "ok", value=0.0, gpu=hi, low_gpu=lo, key=key, values=values)
        spread = values[hi] - values[lo]
        return GpuGrade(rule, rule.grade(spread), value=spread, gpu=hi, low_gpu=lo, key=key, values=values)
    values = {g.gpu_index: PER_GPU[rule.signal](g) for g in gpus}
    known = {i: v for i, v in values.items() if v is not None}
    if not known:
        return GpuGrade(rule, NO_DATA, key=rule.signal, values=values, why="unmeasured", min_samples=min_samples)
    worst = max(known, key=lambda i: known[i])
    return GpuGrade(rule, rule.grade(known[worst]), value=known[worst], gpu=worst, key=rule.signal, values=values)


def gpu_reading(rule: Rule, gpus: Sequence[GpuWindow], min_samples: int) -> Reading:
    """A GPU rule's reading over the job's GPUs, as the controller decides on it."""
    return grade_gpus(rule, gpus, min_samples).reading()


def _rounded(values: dict[int, Optional[float]]) -> dict[str, Optional[float]]:
    return {str(i): _round(v) for i, v in sorted(values.items())}
