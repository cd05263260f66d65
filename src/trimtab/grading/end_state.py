"""The end state of a balanced job as a verdict (`trimtab check`, ``GET /v1/jobs/{name}``): every GPU's utilization
flat in a band (60–75 % by default), step time steady (coefficient of variation under 5 %), and scaling close to
linear — each with its numbers, and one word: ``at_end_state``, ``not_yet`` (saying which part misses) or
``unknown`` (saying what is missing). Thresholds: the ``end_state_*`` keys of rules.toml's [controller].

Where the scaling baseline comes from: the job's own history in the store. Each step's GPU count is the number of
distinct GPUs (node, local GPU) its ranks reported from; the job's samples/s per GPU at the window's count is
compared with its samples/s per GPU at the smallest other count among its newest ``end_state_history_steps`` steps
(a job run at 2 GPUs, then re-registered at 4, under one name). Efficiency = (per-GPU throughput at the larger
count) / (per-GPU throughput at the smaller): 1.0 is linear. Without steps at another count, or without sample
counts, it is unknown and the verdict says so — it is never invented, and an unknown scaling does not hold the
word back (the other two parts decide), but the word says it is unknown.

Reads: the job's newest rank reports (one range read of the (job, received_ms) index, bounded by
``end_state_history_steps`` × ranks, at most ``MAX_HISTORY_ROWS``) and its GPUs' utilization samples in the
window (a range read of each GPU's (gpu, time) key).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Engine

from trimtab.grading.grading import rules_for
from trimtab.grading.ledger.read import job_gpu_keys
from trimtab.grading.ledger.timeline import role_of
from trimtab.grading.rule_types import ControllerSettings
from trimtab.grading.rules import RuleSet
from trimtab.store import ledger as ledger_store
from trimtab.store import steps as step_store
from trimtab.store.jobs import StoredJob

AT_END_STATE, NOT_YET, UNKNOWN = "at_end_state", "not_yet", "unknown"
BELOW, IN, ABOVE = "below", "in", "above"
MIN_STEPS = 3  # steps a variation or a throughput needs (a window or a baseline of fewer says unknown)
MAX_HISTORY_ROWS = 50_000  # rank reports one verdict reads at most (GET /v1/jobs/{name} stays a bounded read)


@dataclass(frozen=True)
class GpuBand:
    hostname: str
    gpu: int
    role: str
    mean_util_pct: Optional[float]   # None: no utilization samples in the window
    samples: int
    band: str                        # below | in | above | unknown


@dataclass(frozen=True)
class Scaling:
    efficiency: Optional[float]              # per-GPU throughput at the larger count / at the smaller (1.0: linear)
    gpus: Optional[int]                      # the window's GPU count
    samples_per_s_per_gpu: Optional[float]
    baseline_gpus: Optional[int]
    baseline_samples_per_s_per_gpu: Optional[float]
    baseline_steps: int
    source: str                              # where the baseline came from, or why there is none


@dataclass
class EndState:
    status: str
    word: str                                # "at end state" | "not yet: …" | "unknown: …"
    window_s: float
    start_ms: Optional[int]
    end_ms: Optional[int]
    util_band_pct: tuple[float, float]
    step_cv_max_pct: float
    scaling_min_pct: float
    gpus: list[GpuBand] = field(default_factory=list)
    steps: int = 0
    step_time_cv_pct: Optional[float] = None
    step_time_mean_s: Optional[float] = None
    scaling: Optional[Scaling] = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["util_band_pct"] = list(self.util_band_pct)
        return d


@dataclass(frozen=True)
class _Step:
    step: int
    end_ms: int
    step_time_s: float
    samples: Optional[float]
    gpus: frozenset   # (node, GPU) its ranks reported from; empty when a rank named none


def steps_of(rows: Sequence[Mapping[str, Any]], single_host: Optional[str]) -> list[_Step]:
    """Rank reports folded per step (oldest first): its slowest rank's time, its ranks' samples added up (None if
    any rank has none), the GPUs its ranks ran on."""
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    out = []
    for step, rs in by_step.items():
        named = [((r.get("hostname") or single_host), r["local_gpu"]) for r in rs]
        gpus = frozenset((h, int(g)) for h, g in named if h is not None and g is not None)
        samples = [r.get("samples") for r in rs]
        out.append(_Step(step, max(int(r["received_ms"]) for r in rs), max(float(r["step_time_s"] or 0) for r in rs),
                         None if any(v is None for v in samples) else float(sum(samples)),
                         gpus if len(gpus) == len(named) else frozenset()))
    return sorted(out, key=lambda s: (s.end_ms, s.step))


def _per_gpu(steps: Sequence[_Step], count: int) -> Optional[float]:
    seconds = sum(s.step_time_s for s in steps)
    if len(steps) < MIN_STEPS or seconds <= 0 or any(s.samples is None for s in steps):
        return None
    return sum(s.samples for s in steps) / seconds / count


def scaling_of(window: Sequence[_Step], history: Sequence[_Step]) -> Scaling:
    """The window's per-GPU throughput against the job's own at the smallest other GPU count in ``history``."""
    counts = {len(s.gpus) for s in window if s.gpus}
    if len(counts) != 1:
        why = ("the window's steps name no GPUs (hostname, local_gpu)" if not counts
               else f"the window's steps ran on {sorted(counts)} GPUs")
        return Scaling(None, None, None, None, None, 0, f"unknown: {why}")
    now = counts.pop()
    now_steps = [s for s in window if len(s.gpus) == now]
    per_gpu = _per_gpu(now_steps, now)
    others: dict[int, list[_Step]] = {}
    for s in history:
        if s.gpus and len(s.gpus) != now:
            others.setdefault(len(s.gpus), []).append(s)
    usable = {n: steps for n, steps in others.items() if _per_gpu(steps, n) is not None}
    if per_gpu is None or not usable:
        why = ("the window's steps report no sample counts" if per_gpu is None else
               f"no steps at another GPU count than {now} in the job's history in the store (with sample counts)")
        return Scaling(None, now, per_gpu, None, None, 0, f"unknown: {why}")
    base = min(usable)
    base_per_gpu = _per_gpu(usable[base], base)
    small, large = (base_per_gpu, per_gpu) if base < now else (per_gpu, base_per_gpu)
    return Scaling(large / small if small else None, now, per_gpu, base, base_per_gpu, len(usable[base]),
                   f"the job's own {len(usable[base])} steps at {base} GPUs in the store")


def band_of(util: Optional[float], ctl: ControllerSettings) -> str:
    if util is None:
        return UNKNOWN
    return BELOW if util < ctl.end_state_util_low_pct else ABOVE if util > ctl.end_state_util_high_pct else IN


def verdict(ctl: ControllerSettings, window_s: float, start_ms: Optional[int], end_ms: Optional[int],
            bands: list[GpuBand], window: Sequence[_Step], scaling: Scaling) -> EndState:
    """The word from the three parts (pure)."""
    times = [s.step_time_s for s in window]
    mean = statistics.fmean(times) if times else None
    cv = (100.0 * statistics.stdev(times) / mean) if len(times) >= MIN_STEPS and mean else None
    missing, misses = [], []
    off = [f"GPU {b.hostname}:{b.gpu} {b.mean_util_pct:.0f} % {b.band}" for b in bands if b.band in (BELOW, ABOVE)]
    if not bands:
        missing.append("the job names no GPUs")
    elif any(b.band == UNKNOWN for b in bands):
        unknown = ", ".join(f"{b.hostname}:{b.gpu}" for b in bands if b.band == UNKNOWN)
        missing.append(f"no utilization samples of GPU {unknown}")
    if off:
        misses.append(f"utilization outside {ctl.end_state_util_low_pct:g}–{ctl.end_state_util_high_pct:g} % "
                      f"({'; '.join(off)})")
    if cv is None:
        missing.append(f"fewer than {MIN_STEPS} steps in the last {window_s:g} s")
    elif cv >= ctl.end_state_step_cv_max_pct:
        misses.append(f"step time varies {cv:.1f} % (goal < {ctl.end_state_step_cv_max_pct:g} %)")
    if scaling.efficiency is not None and 100.0 * scaling.efficiency < ctl.end_state_scaling_min_pct:
        misses.append(f"scaling {100 * scaling.efficiency:.0f} % of linear from {scaling.baseline_gpus} to "
                      f"{scaling.gpus} GPUs (goal ≥ {ctl.end_state_scaling_min_pct:g} %)")
    if misses:
        status, word = NOT_YET, "not yet: " + "; ".join(misses + missing)
    elif missing:
        status, word = UNKNOWN, "unknown: " + "; ".join(missing)
    else:
        status = AT_END_STATE
        word = "at end state" + ("" if scaling.efficiency is not None else " (scaling unknown: no baseline)")
    return EndState(status, word, window_s, start_ms, end_ms,
                    (ctl.end_state_util_low_pct, ctl.end_state_util_high_pct), ctl.end_state_step_cv_max_pct,
                    ctl.end_state_scaling_min_pct, bands, len(window), cv, mean, scaling)


def job_end_state(engine: Engine, job: StoredJob, rules: RuleSet, now_ms: int) -> EndState:
    """The job's end state over its last ``end_state_window_s`` seconds up to its newest report (or now)."""
    ctl = rules_for(job, rules).controller
    single = job.hostnames[0] if len(job.hostnames) == 1 else None
    rows = step_store.newest_rank_rows(engine, job.id, min(MAX_HISTORY_ROWS,
                                                            int(ctl.end_state_history_steps) * max(1, job.ranks)))
    end_ms = min(now_ms, job.last_report_ms) if job.last_report_ms is not None else now_ms
    start_ms = end_ms - int(ctl.end_state_window_s * 1000)
    history = steps_of(rows, single)
    window = [s for s in history if start_ms <= s.end_ms <= end_ms]
    window_rows = [r for r in rows if start_ms <= int(r["received_ms"]) <= end_ms]
    keys = sorted(job_gpu_keys(job, window_rows))
    samples = ledger_store.utilization(engine, keys, start_ms, end_ms)
    bands = []
    for host, gpu in keys:
        utils = [u for _, u in samples.get((host, gpu), [])]
        mean = statistics.fmean(utils) if utils else None
        role, _ = role_of(None, host, gpu, job.roles, job.device_map, single is not None)
        bands.append(GpuBand(host, gpu, role, mean, len(utils), band_of(mean, ctl)))
    scaling = scaling_of(window, history)
    return verdict(ctl, ctl.end_state_window_s, start_ms, end_ms, bands, window, scaling)


def render(e: Mapping[str, Any]) -> str:
    """The end state as check prints it (from :meth:`EndState.to_dict` or the API's ``end_state``)."""
    low, high = e["util_band_pct"]
    gpus = ", ".join(f"{g['hostname']}:{g['gpu']} {g['role']} "
                     + ("?" if g["mean_util_pct"] is None else f"{g['mean_util_pct']:.0f} % {g['band']}")
                     for g in e["gpus"]) or "none"
    cv = "?" if e["step_time_cv_pct"] is None else f"{e['step_time_cv_pct']:.1f} %"
    s = e["scaling"] or {}
    scale = (f"{100 * s['efficiency']:.0f} % of linear ({s['samples_per_s_per_gpu']:.3g} samples/s per GPU at "
             f"{s['gpus']} GPUs against {s['baseline_samples_per_s_per_gpu']:.3g} at {s['baseline_gpus']}: "
             f"{s['source']})" if s.get("efficiency") is not None else s.get("source", "unknown"))
    return (f"end state over the last {e['window_s']:g} s: {e['word']}\n"
            f"  utilization (band {low:g}–{high:g} %): {gpus}\n"
            f"  step time variation: {cv} over {e['steps']} steps (goal < {e['step_cv_max_pct']:g} %)\n"
            f"  scaling: {scale}")
