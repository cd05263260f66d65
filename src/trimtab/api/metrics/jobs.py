"""Per-job series (``trimtab_job_*``, labels ``job`` and ``mode``) over each live job's newest window of steps,
the rebalancer's settled decisions and changes as counters (``trimtab_rebalancer_*``), and its failed plans per job
(``trimtab_plan_errors_total``)."""

from __future__ import annotations

from collections import Counter
from typing import Iterator, Optional

from prometheus_client.core import Metric

from trimtab.api.metrics.families import Row, Spec, counter, gauges
from trimtab.api.metrics.store_reads import JobScrape
from trimtab.contract.statuses import NO_DATA, PENDING, SETTLED_CHANGES, SETTLED_DECISIONS, SEVERITY
from trimtab.grading.window import PHASES

_WINDOW = "over the job's newest window of steps (the rebalancer's window)"


def _labels(job: str, mode: Optional[str], **extra: str) -> dict[str, str]:
    return {"job": job, **({"mode": mode} if mode is not None else {}), **extra}


def _base(j) -> dict[str, str]:
    return _labels(j.name, j.mode)


def _simulated(item) -> bool:
    return (item[0] if isinstance(item, tuple) else item).simulated


def job_families(data: JobScrape) -> Iterator[Metric]:
    """Per live job (labels job, mode): throughput, step time, phase shares, fragmentation, collective latency and
    its baseline over the job's newest window, knob values and bounds, the grade of each job row; then the
    rebalancer's decisions and changes as counters. Unknown values are absent series."""
    jobs = data.summaries
    yield from gauges((
        Spec("trimtab_job_samples_per_second", f"Throughput {_WINDOW}: samples / step time. Unit: samples/s.",
             lambda j: j.samples_per_s),
        Spec("trimtab_job_step_time_seconds", f"Mean step time (the slowest rank's) {_WINDOW}. Unit: seconds.",
             lambda j: j.step_time_s),
        Spec("trimtab_job_fragmentation_ratio", f"Mean allocator fragmentation (1 - allocated/reserved, worst rank) "
             f"{_WINDOW}. Unit: ratio 0-1.", lambda j: j.fragmentation),
        Spec("trimtab_job_collective_latency_seconds", f"Mean small all-reduce probe latency {_WINDOW}. Unit: "
             "seconds.", lambda j: None if j.collective_latency_us is None else j.collective_latency_us / 1e6),
        Spec("trimtab_job_collective_latency_baseline_seconds", "The job's own collective-latency baseline: median "
             "of its first probes (the collective_latency rule compares against it). Unit: seconds.",
             lambda j: None if j.probe_baseline_us is None else j.probe_baseline_us / 1e6),
        Spec("trimtab_job_composition_gpu_time", "1 when the job's phase shares are graded on GPU time (the hook's "
             "CUDA events around each phase), 0 when on wall time (no CUDA, or phases timed on the host).",
             lambda j: None if j.window_steps is None else float(j.time_base == "gpu")),
        Spec("trimtab_job_last_report_timestamp_seconds", "When the job's newest step report arrived (Unix time).",
             lambda j: None if j.last_report_ms is None else j.last_report_ms / 1000),
    ), jobs, _base, _simulated)
    yield from gauges((
        Spec("trimtab_job_phase_share_ratio", f"Share of step time spent in a phase (generation, evaluation, "
             f"communication, update, other) {_WINDOW}, as step composition is graded: on GPU time where the job "
             f"reports it (trimtab_job_composition_gpu_time 1), on wall time otherwise. Unit: ratio 0-1.",
             lambda jp: jp[0].phase_shares.get(jp[1])),
        Spec("trimtab_job_phase_wall_share_ratio", f"Share of step time spent in a phase {_WINDOW} on wall time "
             f"(when the host returned), beside the graded share. Unit: ratio 0-1.",
             lambda jp: jp[0].wall_phase_shares.get(jp[1])),
    ), [(j, p) for j in jobs for p in PHASES], lambda jp: {**_base(jp[0]), "phase": jp[1]}, _simulated)
    yield from gauges((
        Spec("trimtab_job_learning_signal", f"Mean of a learning signal the job reports (reward, clip_fraction, kl, "
             f"eff_sample_size, grad_norm, entropy, stale_share; by trimtab's names, mapped from the framework's) "
             f"{_WINDOW}. Unit: the signal's own (fractions 0-1).", lambda js: js[0].learning.get(js[1])),
    ), [(j, s) for j in jobs for s in sorted(j.learning)], lambda js: {**_base(js[0]), "signal": js[1]},
        _simulated)
    knobs = [(j, k, spec) for j in jobs for k, spec in sorted(j.knobs.items())]
    yield from gauges((
        Spec("trimtab_job_knob_value", "Current value of a job's knob (batch_size, prefetch, sync_every; follows "
             "applied changes).", lambda x: x[2].get("value")),
        Spec("trimtab_job_knob_min", "Lowest value the job allows for the knob.", lambda x: x[2].get("min")),
        Spec("trimtab_job_knob_max", "Highest value the job allows for the knob.", lambda x: x[2].get("max")),
    ), knobs, lambda x: {**_base(x[0]), "knob": x[1]}, _simulated)
    rows = [(j, v) for j in jobs for v in j.verdicts if v.status != NO_DATA]
    yield from gauges((
        Spec("trimtab_job_check_status", "Grade of a job row (check: step_composition, fragmentation, "
             "collective_latency) over the job's newest window: 0 ok, 1 watch, 2 act, as `trimtab check`; absent "
             "without data.", lambda jv: SEVERITY[jv[1].status]),
    ), rows, lambda jv: {**_base(jv[0]), "check": jv[1].check}, _simulated)
    yield from _rebalancer_families(data)


def _rebalancer_families(data: JobScrape) -> Iterator[Metric]:
    jobs, simulated = data.summaries, data.simulated_jobs
    pending_decisions: Counter[str] = Counter()
    pending_changes: Counter[str] = Counter()
    decided, changed = [], []
    for job, rule, outcome, n in sorted(data.decisions, key=lambda r: tuple(str(x) for x in r)):
        if outcome in SETTLED_DECISIONS:  # settled only: a counter must never go down
            decided.append(Row(_labels(job, None, rule=rule, outcome=outcome), job in simulated, n))
        elif outcome == PENDING:
            pending_decisions[job] += n
    for job, source, status, n in sorted(data.changes):
        if status in SETTLED_CHANGES:
            changed.append(Row(_labels(job, None, source=source, status=status), job in simulated, n))
        elif status == PENDING:
            pending_changes[job] += n
    yield from gauges((
        Spec("trimtab_rebalancer_decisions_pending", "Decisions whose change is in flight or being measured (0 or 1 "
             "per job).", lambda j: pending_decisions[j.name]),
        Spec("trimtab_rebalancer_changes_pending", "Knob changes queued and not yet applied by the job (0 or 1 per "
             "job).", lambda j: pending_changes[j.name]),
    ), jobs, _base, _simulated)
    yield from counter("trimtab_rebalancer_decisions", "Rebalancer decisions by job, rule and outcome (advised, "
                       "kept, rolled_back, refused, superseded, cancelled), counted once settled; decisions still "
                       "measuring are trimtab_rebalancer_decisions_pending.", decided)
    yield from counter("trimtab_plan_errors", "Plans of a job that raised (each is an error event on the job: GET "
                       "/v1/jobs/{name}, /healthz degraded while it fails; the job is planned again with backoff).",
                       [Row(_labels(job, None), job in simulated, n) for job, n in data.plan_errors])
    yield from counter("trimtab_rebalancer_changes", "Knob changes by job, source (rebalancer, manual) and status "
                       "(applied, superseded, cancelled), counted once settled; changes waiting for the job are "
                       "trimtab_rebalancer_changes_pending.", changed)
