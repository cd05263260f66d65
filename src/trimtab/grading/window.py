"""A job's recent steps as the controller sees them: the ranks' step reports folded into one row per step, and the
window of steps a rule is judged on.

A step counts once every rank has reported it (or a later step has arrived, so the missing rank's report is lost,
not late). Across ranks a step lasts as long as its slowest rank, its samples add up, and each phase takes the
slowest rank's time: the job waits for the slowest. Throughput is samples over wall time of whole steps.

A window covers seconds or, for steps too fast to cover them soon (5–12 ms), a number of steps: the test counts
samples, not seconds. A step far off the job's own (``screen``) enters no window and is named in the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Engine

from trimtab.contract.step_report import PHASES, fold_ranks
from trimtab.store import steps as step_store

RL_COUNTS = ("tokens", "prompts", "completions")  # added up over ranks
RL_MEANS = ("completion_mean_tokens", "reward_mean")  # what the framework logged: the ranks' mean


@dataclass(frozen=True)
class JobStep:
    step: int
    ranks: int                          # how many ranks reported it
    step_time_s: float
    samples: Optional[float]
    phases_s: dict[str, Optional[float]]
    fragmentation: Optional[float]      # the worst rank's, fraction 0–1
    num_ooms: Optional[int]             # cumulative, the highest rank's
    collective_latency_us: Optional[float]
    start_ms: int                       # wall clock span of the step, from its ranks' ended_ms (else arrival)
    end_ms: int
    num_alloc_retries: Optional[int] = None  # cumulative, the highest rank's
    rollout_slowest_s: Optional[float] = None  # the slowest sample's generation time (the long tail)
    rollout_mean_s: Optional[float] = None     # the mean sample's
    rl: dict[str, Optional[float]] = field(default_factory=dict)  # RL_COUNTS and RL_MEANS (None: not reported)
    mem_peak_bytes: Optional[float] = None   # the worst rank's allocator peak (else its reserved bytes)
    mem_total_bytes: Optional[float] = None  # the smallest rank GPU's capacity
    reported: Mapping[str, Any] = field(default_factory=dict)  # every contract column, folded over the ranks

    def share_pct(self, phase: str) -> Optional[float]:
        value = self.phases_s.get(phase)
        if value is None or self.step_time_s <= 0:
            return None
        return min(100.0, 100.0 * value / self.step_time_s)


def fold_step(step: int, rows: Sequence[Mapping[str, Any]]) -> JobStep:
    """One step from its ranks' reports (flat, as the store keeps them), each field folded as the contract says."""
    f = fold_ranks(rows)
    # When the step ended by its ranks' clocks (the slowest rank's); else when its reports arrived (a hook before
    # ended_ms, or a clock too far ahead): a report sent late, after a head outage, arrived long after its step.
    end_ms = f["ended_ms"] if f["ended_ms"] is not None else max(r["received_ms"] for r in rows)
    ooms, retries = f["num_ooms"], f["num_alloc_retries"]
    return JobStep(step=step, ranks=f["rank"], step_time_s=f["step_time_s"], samples=f["samples"],
                   phases_s={p: f[f"{p}_s"] for p in PHASES}, fragmentation=f["fragmentation"],
                   num_ooms=int(ooms) if ooms is not None else None,
                   num_alloc_retries=int(retries) if retries is not None else None,
                   collective_latency_us=f["collective_latency_us"],
                   start_ms=end_ms - int(f["step_time_s"] * 1000), end_ms=end_ms,
                   rollout_slowest_s=f["rollout_slowest_s"], rollout_mean_s=f["rollout_mean_s"],
                   rl={name: f[name] for name in RL_COUNTS + RL_MEANS},
                   mem_peak_bytes=f["peak_allocated_bytes"] or f["reserved_bytes"], mem_total_bytes=f["total_bytes"],
                   reported=f)


def load_steps(engine: Engine, job_id: int, ranks: int, since_step: int = 0, limit: int = 200) -> list[JobStep]:
    """Complete steps ≥ ``since_step``, oldest first (at most the newest ``limit``)."""
    return load_jobs_steps(engine, {job_id: ranks}, limit, since_step).get(job_id, [])


def load_jobs_steps(engine: Engine, ranks_by_job: Mapping[int, int], depth: int,
                    since_step: int = 0) -> dict[int, list[JobStep]]:
    """Each job's newest ``depth`` complete steps ≥ ``since_step``, oldest first (job id → its ranks): one query."""
    return {job_id: [fold_step(s, rows) for s, rows in steps]
            for job_id, steps in step_store.complete_steps(engine, ranks_by_job, depth, since_step).items()}


def steps_since(engine: Engine, job_id: int, after_step: int) -> tuple[int, float]:
    """(steps, seconds of step time) the job has reported after ``after_step``: each step once, at its slowest
    rank's time — a cheap look at how much came in, without folding the steps."""
    return step_store.steps_since(engine, job_id, after_step)


def first_probes(engine: Engine, job_id: int, n: int) -> list[float]:
    """The job's first ``n`` collective-latency probe values (its own baseline)."""
    return step_store.first_probes(engine, {job_id: n}).get(job_id, [])


def window(steps: Sequence[JobStep], min_steps: int, min_s: float, max_steps: int,
           period: int = 1, enough_steps: Optional[int] = None) -> Optional[list[JobStep]]:
    """The newest steps covering at least ``min_steps`` steps and ``min_s`` seconds — or ``enough_steps`` steps,
    whichever comes first — in whole multiples of ``period`` steps; None when ``steps`` cannot cover that yet.
    ``max_steps`` only bounds what is read when the steps are too short to cover either (a stalled clock).
    Without ``enough_steps`` a window always covers ``min_s``; with it, fast steps (5–12 ms) make a window of
    ``enough_steps`` samples — as many as the test gets from slow ones — instead of 400–800 steps.

    ``period`` is the job's sync interval: with a weight sync every 2nd step, steps alternate fast and slow, and a
    window of 5 steps holding 3 syncs would read 8 % slower than one holding 2 — enough to roll back a good change.
    """
    period = max(1, int(period))
    cap = max(period, max_steps - max_steps % period)
    chosen: list[JobStep] = []
    total_s = 0.0
    for step in reversed(steps):
        chosen.append(step)
        total_s += step.step_time_s
        whole = len(chosen) % period == 0
        covered = total_s >= min_s or (enough_steps is not None and len(chosen) >= enough_steps)
        if whole and len(chosen) >= min_steps and covered:
            return list(reversed(chosen))
        if len(chosen) >= cap:
            return None
    return None


def as_period(value: Any) -> int:
    """A sync-period knob's value as steps per period (≥ 1; 1 for a missing or unreadable value)."""
    try:
        return max(1, int(round(float(value))))
    except (TypeError, ValueError):
        return 1


def screen(steps: Sequence[JobStep], outlier_x_median: float,
           every: int = 1) -> tuple[list[JobStep], list[dict[str, Any]]]:
    """(the steps a window may hold, the steps left out and why). A step more than ``outlier_x_median`` times
    longer or shorter than the median of the job's steps around it (a clock jump, a report of a paused process)
    says nothing about a setting's throughput: it is left out of every window, and named in the evidence. Longer is
    measured against the median *period* (``every`` steps, the longest sync interval the steps ran at): a sync
    step carries its period's communication — 120× a 10 ms step at sync 4 is a sync, not garbage."""
    if outlier_x_median <= 0 or len(steps) < 5:
        return list(steps), []
    times = sorted(s.step_time_s for s in steps)
    median = times[len(times) // 2]
    if median <= 0:
        return list(steps), []
    kept, out = [], []
    for s in steps:
        x = s.step_time_s / median
        if x > outlier_x_median * max(1, every) or x < 1.0 / outlier_x_median:
            out.append({"step": s.step, "step_time_s": s.step_time_s,
                        "reason": f"{x:.3g}× the median step of the job's recent steps ({median:.4g} s): "
                                  f"beyond outlier_x_median ({outlier_x_median:g}×)"})
        else:
            kept.append(s)
    return kept, out


def chunk_rates(steps: Sequence[JobStep], period: int = 1) -> list[float]:
    """Throughput (samples/s) of each whole sync period of ``steps``, oldest first: the per-period samples a
    verdict tests (a period, not a step, so a sync step is never compared with a step without one)."""
    period = max(1, int(period))
    out = []
    for i in range(0, len(steps) - period + 1, period):
        rate = throughput(steps[i:i + period])
        if rate is not None:
            out.append(rate)
    return out


def throughput(steps: Sequence[JobStep]) -> Optional[float]:
    """Samples per second over whole steps; None without sample counts."""
    seconds = sum(s.step_time_s for s in steps)
    samples = [s.samples for s in steps]
    if not steps or seconds <= 0 or any(v is None for v in samples):
        return None
    return sum(samples) / seconds
