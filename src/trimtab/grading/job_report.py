"""Each live job graded as `trimtab check`, ``GET /v1/balance/jobs`` and ``/metrics`` show it: the job's newest
window of steps (the controller's window settings, changes ignored), one row per job rule (step composition,
fragmentation, collective latency with the shipped rules; :func:`trimtab.grading.grading.job_rows`) graded
ok / watch / act, its knobs, throughput and recent decisions.

The grading is the controller's own (:func:`trimtab.grading.signals.job_reading`: a row acts only when its
signal is above the line over the whole window and over each half of it), so a row that says ``act`` is one the
rebalancer would act on (fragmentation aside: the controller also wants memory pressure, see the row's message).

Reading is batched for the scrape: one query for the jobs, one for the newest steps of all of them, one for the
probe baselines not yet known (a complete baseline — the median of a job's first probes — never changes, so it is
kept per engine), whatever the number of jobs.
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import Engine

from trimtab.contract.roles import gpus_by_role
from trimtab.contract.statuses import ACT, NO_DATA, OK, REFUSED, SEVERITY, WATCH
from trimtab.grading.grading import LIVE_JOB_S, Verdict, job_checks, job_rows, live_since_ms, no_data, rules_for
from trimtab.grading.rules import RuleSet, default_rules
from trimtab.grading.learning_rules import advised_only
from trimtab.grading.step_facts import generation_cadence, learning_facts, rl_facts
from trimtab.grading.signals import WALL_TIME, JobContext, phase_share_pct, time_base
from trimtab.grading.window import PHASES, JobStep, as_period, load_jobs_steps, screen, throughput, window
from trimtab.store import decisions as decision_store
from trimtab.store import jobs as job_store
from trimtab.store import plan_status
from trimtab.store import steps as step_store
from trimtab.store.jobs import StoredJob

RECENT_DECISIONS = 5
NO_STEPS = "no step reports yet"


@dataclass
class DecisionRow:
    """One decision as `trimtab check` lists it."""
    id: int
    ts_ms: int
    rule: str
    knob: Optional[str]
    old_value: Optional[float]
    new_value: Optional[float]
    outcome: Optional[str]
    applied_step: Optional[int]
    throughput_before_samples_per_s: Optional[float]
    throughput_after_samples_per_s: Optional[float]
    note: Optional[str] = None                   # why it ended so, where the outcome needs a why (refused)
    waste: Optional[str] = None                  # the ledger's largest waste it addresses (control/waste_cite.py)
    verdicts: Optional[dict[str, str]] = None    # a learning knob's: {"throughput": …, "learning": …} in words

    @property
    def change(self) -> str:
        if self.knob is None:
            return "advice only"
        return f"{self.knob} {_fmt(self.old_value)} → {_fmt(self.new_value)}"


@dataclass
class JobSummary:
    """A job's newest window, graded. Shares and fragmentation are ratios 0–1; ``None`` is unknown, never 0."""
    name: str
    mode: str
    ranks: int
    hostnames: list[str]
    simulated: bool
    knobs: dict[str, dict[str, float]]
    last_report_ms: Optional[int]
    generated_at_ms: int
    window_steps: Optional[list[int]]            # [first, last] step of the window
    n_steps: int
    window_s: float                              # step time the window covers, seconds
    full_window: bool                            # False: fewer steps than the controller's window needs yet
    samples_per_s: Optional[float]
    step_time_s: Optional[float]                 # mean over the window
    phase_shares: dict[str, Optional[float]]     # phase → share of step time, 0–1, on ``time_base``
    fragmentation: Optional[float]               # mean of the window's steps, 0–1
    collective_latency_us: Optional[float]       # mean of the window's probes
    probe_baseline_us: Optional[float]           # median of the job's first probes
    verdicts: list[Verdict] = field(default_factory=list)
    decisions: list[DecisionRow] = field(default_factory=list)
    advise_only_reason: Optional[str] = None     # why the job declares no knobs
    rl: dict[str, Optional[float]] = field(default_factory=dict)  # step_facts.rl_facts: tokens/s, completions, …
    generation_cadence: Optional[dict[str, Any]] = None  # step_facts.generation_cadence: generation every k-th step
    time_base: str = WALL_TIME                   # what phase_shares (and the composition row) measure: gpu | wall
    wall_phase_shares: dict[str, Optional[float]] = field(default_factory=dict)  # the same on wall time, 0–1
    gpus_by_role: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # role → node → local GPUs
    planner: Optional[dict[str, Any]] = None     # the rebalancer's last word on it (store/plan_status.py); None: none
    learning: dict[str, float] = field(default_factory=dict)  # step_facts.learning_facts: signal → window mean
    learning_advice: Optional[str] = None        # learning_rules.advised_only: why its learning knobs are advice only

    @property
    def status(self) -> str:
        worst = max((SEVERITY[v.status] for v in self.verdicts), default=0)
        return {0: OK, 1: WATCH, 2: ACT}[worst]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        for row, dec in zip(d["decisions"], self.decisions):
            row["change"] = dec.change
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobSummary":
        """Inverse of :meth:`to_dict` (extra keys, e.g. ``status`` or the API's, are ignored)."""
        def pick(klass, item):
            return klass(**{k: v for k, v in item.items() if k in klass.__dataclass_fields__})

        out = pick(cls, d)
        out.verdicts = [pick(Verdict, v) for v in d.get("verdicts", [])]
        out.decisions = [pick(DecisionRow, x) for x in d.get("decisions", [])]
        return out


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return "?"
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


# -- reading, batched -----------------------------------------------------------------------------------------


def live_jobs(engine: Engine, since_ms: int, hostname: Optional[str] = None) -> list[StoredJob]:
    """Jobs whose newest step report arrived at or after ``since_ms`` (one query), by name."""
    out = [j for j in job_store.list_jobs(engine, limit=100_000, offset=0)
           if j.last_report_ms is not None and j.last_report_ms >= since_ms]
    return [j for j in out if hostname is None or hostname in j.hostnames]


# Complete baselines per engine: (job id, probes needed) → median µs. The first probes of a job never change.
_baselines: "weakref.WeakKeyDictionary[Engine, dict[tuple[int, int], float]]" = weakref.WeakKeyDictionary()
_baselines_lock = threading.Lock()


def probe_baselines(engine: Engine, wanted: Mapping[int, int]) -> dict[int, Optional[float]]:
    """Job id → median of its first ``wanted[job id]`` collective-latency probes (None: fewer probes so far).
    One query for the jobs whose baseline is not known yet."""
    with _baselines_lock:
        known = dict(_baselines.get(engine, {}))
    out: dict[int, Optional[float]] = {j: known.get((j, n)) for j, n in wanted.items()}
    missing = [j for j in wanted if out[j] is None]
    if not missing:
        return out
    probes = step_store.first_probes(engine, {j: wanted[j] for j in missing})
    for job_id in missing:
        n = wanted[job_id]
        first = probes.get(job_id, [])[:n]
        if n > 0 and len(first) >= n:
            out[job_id] = statistics.median(first)
            with _baselines_lock:
                _baselines.setdefault(engine, {})[(job_id, n)] = out[job_id]
    return out


# -- grading ----------------------------------------------------------------------------------------------------


def _shares(win: Sequence[JobStep], base: Optional[str] = None) -> dict[str, Optional[float]]:
    """Time-weighted share of each phase over the window, 0–1: as the rules see it (GPU time where the window has
    it), or on ``base``."""
    shares = {phase: phase_share_pct(win, phase, base) for phase in PHASES}
    return {phase: None if v is None else v / 100.0 for phase, v in shares.items()}


def _mean(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _pick_window(steps: Sequence[JobStep], rules: RuleSet) -> tuple[list[JobStep], bool]:
    ctl = rules.controller
    win = window(steps, ctl.window_min_steps, ctl.window_min_s, ctl.window_max_steps, 1, ctl.window_enough_steps)
    if win is not None:
        return win, True
    return list(steps[-ctl.window_max_steps:]), False


def grade(job: StoredJob, rules: RuleSet, steps: Sequence[JobStep], baseline_us: Optional[float], now_ms: int,
          simulated: bool = False, decisions: Sequence[DecisionRow] = ()) -> JobSummary:
    """The summary of one job from its loaded steps (oldest first) and probe baseline; no store access."""
    rules = rules_for(job, rules)
    base = dict(name=job.name, mode=job.mode, ranks=job.ranks, hostnames=list(job.hostnames), simulated=simulated,
                knobs={k: dict(v) for k, v in job.knobs.items()}, last_report_ms=job.last_report_ms,
                generated_at_ms=now_ms, decisions=list(decisions), advise_only_reason=job.advise_only_reason,
                gpus_by_role=gpus_by_role(job.roles, job.device_map, job.hostnames))
    if not steps:
        base["learning_advice"] = advised_only(rules.learning, job.knobs, reports_learning=False)
        return JobSummary(**base, window_steps=None, n_steps=0, window_s=0.0, full_window=False, samples_per_s=None,
                          step_time_s=None, phase_shares={p: None for p in PHASES}, fragmentation=None,
                          collective_latency_us=None, probe_baseline_us=baseline_us,
                          verdicts=[no_data(c, None, NO_STEPS) for c in job_checks(rules)])
    # the controller's own screen: a step far off the job's (a clock jump) is in no window here either
    spec = job.knobs.get(rules.controller.period_knob)
    every = as_period(spec.get("value")) if isinstance(spec, dict) else 1
    win, full = _pick_window(screen(steps, rules.controller.outlier_x_median, every)[0] or steps, rules)
    ctx = JobContext(all_steps=steps, probe_baseline_us=baseline_us)
    tp = throughput(win)
    mean_latency = _mean(s.collective_latency_us for s in win)
    verdicts = job_rows(rules, win, ctx, tp, mean_latency)
    if not full:
        ctl = rules.controller
        note = (f" (only {len(win)} steps, {sum(s.step_time_s for s in win):.1f} s so far: the controller waits for "
                f"{ctl.window_min_s:g} s of steps or {ctl.window_enough_steps} steps)")
        for v in verdicts:
            if v.status != NO_DATA:
                v.message += note
    # the window's time base once (each phase's share would read it again); on wall time the two are one
    graded_base = time_base(win)
    shares = _shares(win, graded_base)
    learning = learning_facts(win)
    base["learning_advice"] = advised_only(rules.learning, job.knobs, reports_learning=bool(learning))
    return JobSummary(**base, window_steps=[win[0].step, win[-1].step], n_steps=len(win),
                      window_s=sum(s.step_time_s for s in win), full_window=full, samples_per_s=tp,
                      step_time_s=statistics.fmean(s.step_time_s for s in win), phase_shares=shares,
                      fragmentation=_mean(s.fragmentation for s in win), collective_latency_us=mean_latency,
                      probe_baseline_us=baseline_us, verdicts=verdicts, rl=rl_facts(win), learning=learning,
                      generation_cadence=generation_cadence(win), time_base=graded_base,
                      wall_phase_shares=shares if graded_base == WALL_TIME else _shares(win, WALL_TIME))


def cited_waste(evidence: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The GPU-time waste a decision's evidence cites, in one phrase ("0.012 GPU-h reward waiting for actor over
    the last 600 s"); None where it cites none."""
    w = (evidence or {}).get("gpu_time_waste") if isinstance(evidence, Mapping) else None
    if not isinstance(w, Mapping) or w.get("gpu_hours") is None:
        return None
    return f"{w['gpu_hours']:.3f} GPU-h {w.get('what', w.get('cause'))} over the last {w.get('window_s', 0):g} s"


def _verdicts(evidence: Optional[Mapping[str, Any]]) -> Optional[dict[str, str]]:
    """Both verdicts of a learning knob's decision, as goodput.py worded them; None for any other decision."""
    v = evidence.get("verdicts") if isinstance(evidence, Mapping) else None
    return {k: str(v[k]) for k in ("throughput", "learning") if k in v} if isinstance(v, Mapping) else None


def _decision_rows(engine: Engine, job: StoredJob, n: int) -> list[DecisionRow]:
    if n <= 0:
        return []
    return [DecisionRow(d.id, d.ts_ms, d.rule, d.knob, d.old_value, d.new_value, d.outcome, d.applied_step,
                        d.throughput_before_samples_per_s, d.throughput_after_samples_per_s,
                        note=(d.evidence or {}).get("refused_reason") if d.outcome == REFUSED else None,
                        waste=cited_waste(d.evidence), verdicts=_verdicts(d.evidence))
            for d in decision_store.list_decisions(engine, job.id, limit=n, offset=0)]


def job_summaries(engine: Engine, jobs_: Sequence[StoredJob], rules: Optional[RuleSet] = None,
                  now_ms: Optional[int] = None, decisions: int = RECENT_DECISIONS,
                  simulated_hosts: Optional[set[str]] = None, planner: bool = True) -> list[JobSummary]:
    """Every job in ``jobs_`` graded. A fixed number of queries (``simulated_hosts``: the simulated nodes' names,
    if the caller has read them; ``planner``: what the rebalancer last said about each, one query), plus one per
    job for its last ``decisions`` decisions (0: none, as /metrics)."""
    rules = rules or default_rules()
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    if not jobs_:
        return []
    per_job = {j.id: rules_for(j, rules) for j in jobs_}
    depth = max(rs.controller.window_max_steps for rs in per_job.values()) + 1
    steps = load_jobs_steps(engine, {j.id: j.ranks for j in jobs_}, depth)
    probing = {j.id: per_job[j.id].controller.probe_baseline_steps for j in jobs_
               if any(s.collective_latency_us is not None for s in steps.get(j.id, []))}
    baselines = probe_baselines(engine, probing) if probing else {}
    if simulated_hosts is None:
        simulated_hosts = job_store.simulated_hostnames(engine)
    said = plan_status.plan_statuses(engine, [j.id for j in jobs_]) if planner else {}
    out = [grade(j, rules, steps.get(j.id, []), baselines.get(j.id), now,
                 simulated=any(h in simulated_hosts for h in j.hostnames),
                 decisions=_decision_rows(engine, j, decisions)) for j in jobs_]
    for summary, j in zip(out, jobs_):
        if j.id in said:
            summary.planner = _planner(said[j.id])
    return out


def _planner(s: plan_status.PlanStatus) -> dict[str, Any]:
    return {"note": s.note, "gate": s.gate, "planned_ms": s.planned_ms, "step": s.step, "failing": s.failing,
            "failures": s.failures, "failing_since_ms": s.failing_since_ms, "errors_total": s.errors_total,
            "last_error": s.last_error, "retry_at_ms": s.retry_at_ms}


def job_summary(engine: Engine, job: StoredJob, rules: Optional[RuleSet] = None, now_ms: Optional[int] = None,
                decisions: int = RECENT_DECISIONS) -> JobSummary:
    """One job graded over its newest window, with its knobs, throughput and last ``decisions`` decisions."""
    return job_summaries(engine, [job], rules, now_ms, decisions)[0]


def job_verdicts(engine: Engine, job: StoredJob, rules: Optional[RuleSet] = None,
                 now_ms: Optional[int] = None) -> list[Verdict]:
    """The job's rows (one per job rule: step_composition, fragmentation, collective_latency with the shipped
    rules) over its newest window."""
    return job_summary(engine, job, rules, now_ms, decisions=0).verdicts


def live_job_summaries(engine: Engine, window_s: float, rules: Optional[RuleSet] = None,
                       hostname: Optional[str] = None, now_ms: Optional[int] = None,
                       decisions: int = RECENT_DECISIONS) -> list[JobSummary]:
    """The jobs that reported within ``window_s`` (at least the last 10 minutes), graded: what check shows."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    return job_summaries(engine, live_jobs(engine, live_since_ms(window_s, now), hostname), rules, now, decisions)


__all__ = ["DecisionRow", "JobSummary", "LIVE_JOB_S", "grade", "job_summaries", "job_summary",
           "job_verdicts", "live_job_summaries", "live_jobs", "live_since_ms", "probe_baselines"]
