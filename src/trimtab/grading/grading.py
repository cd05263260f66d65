"""The rows `trimtab check`, ``GET /v1/balance``, ``GET /v1/balance/jobs`` and ``/metrics`` show, one per rule of the
rule set in force: each row is the rule's reading as the controller decides on it (:mod:`trimtab.grading.signals`)
written out with the rule's name, unit, lines and advice. A rule added to a rules file is a row everywhere.

Node rows are the GPU-scope rules over a node's GPUs (the GPUs that measure the signal); job rows are the job-scope
rules over a job's newest window: the phase-share rules fold into one ``step_composition`` row (the worst phase),
every other job rule is a row of its own, named after it. The OOM rule has no row: the hook acts on an OOM itself and
the decision it records says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from trimtab.contract.statuses import ACT, NO_DATA, OK, SEVERITY, UNSUPPORTED, WATCH
from trimtab.contract.step_report import PHASES
from trimtab.grading.rule_types import Rule
from trimtab.grading.rules import RuleSet
from trimtab.grading.rules_parse import RulesError
from trimtab.grading.signals import (GpuGrade, GpuWindow, JobContext, Reading, alloc_retries, grade_gpus,
                                       job_reading, time_base_words)
from trimtab.grading.window import JobStep

LIVE_JOB_S = 600.0  # a job that reported within this long is live: graded, shown (or longer: a check's window)
COMPOSITION = "step_composition"
SHARE_SUFFIX = "_share_pct"
NO_ROW_SIGNALS = {"ooms", "memory_forecast_pct"}  # the forecast needs the knob history: decisions show it
OPTIONAL_PHASES = {"wait"}  # shown only for jobs that report it (a trainer fed by a separate rollout)
NO_JOB_DATA = "no job data (jobs report through the trainer hook)"
OF_WHAT = {"pcie_pct_of_peak": "link peak", "mem_used_pct": "memory"}  # "highest GPU1 at 93.0 % of link peak"


@dataclass
class Verdict:
    """One graded row."""
    check: str
    status: str  # ok | watch | act | no_data | unsupported
    value: Optional[float]
    unit: str
    healthy_below: Optional[float]
    act_above: Optional[float]
    message: str
    advice: Optional[str] = None
    gpu_index: Optional[int] = None  # the GPU that set the value, where one did


def rules_for(job, rules: RuleSet, on_error: Optional[Callable[[RulesError], None]] = None) -> RuleSet:
    """The rules ``job`` is judged by: ``rules`` with the job's registration overrides. Overrides that no longer
    apply (validated at registration; the rules file changed since) leave the daemon's rules, after ``on_error``."""
    try:
        return rules.with_overrides(job.rules, source=f"job {job.name} rules")
    except RulesError as exc:
        if on_error is not None:
            on_error(exc)
        return rules


def live_since_ms(window_s: float, now_ms: int) -> int:
    """Jobs whose last report is at or after this are live for a check over ``window_s``."""
    return now_ms - int(max(window_s, LIVE_JOB_S) * 1000)


# -- node rows --------------------------------------------------------------------------------------------------


def node_rules(rules: RuleSet) -> list[Rule]:
    """The GPU-scope rules in the order a node's rows are listed: the node-wide spread first, memory last (highest
    priority number first — the order check has always printed)."""
    return sorted((r for r in rules.rules if r.scope == "gpu"), key=lambda r: (-r.priority, r.name))


def _node_verdict(g: GpuGrade) -> Verdict:
    rule = g.rule
    base = dict(check=rule.name, unit=rule.unit, healthy_below=rule.healthy_below, act_above=rule.act_above)
    advice = rule.advice if g.status in (WATCH, ACT) else None
    if g.spread:
        label = "SM activity" if g.key == "sm_active_pct" else "utilization"
        if g.status == NO_DATA:
            return Verdict(status=NO_DATA, value=None, message="no utilization readings in the window", **base)
        if len(g.values) < 2:
            return Verdict(status=OK, value=0.0, message=f"one GPU: no spread to measure ({label})", **base)
        hi, lo = g.values[g.gpu], g.values[g.low_gpu]
        return Verdict(status=g.status, value=g.value, advice=advice, gpu_index=g.gpu, **base,
                       message=f"{label} spread {g.value:.1f} pts (GPU{g.gpu} {hi:.1f} % vs GPU{g.low_gpu} {lo:.1f} %)")
    if g.status == NO_DATA:
        return Verdict(status=UNSUPPORTED, value=None, message=f"{rule.name}: not measured on these GPUs", **base)
    of = f" of {OF_WHAT[rule.signal]}" if rule.signal in OF_WHAT else ""
    return Verdict(status=g.status, value=g.value, advice=advice, gpu_index=g.gpu, **base,
                   message=f"highest GPU{g.gpu} at {g.value:.1f} {rule.unit}{of}")


def node_rows(rules: RuleSet, windows: Sequence[GpuWindow]) -> list[Verdict]:
    """A node's rows: every GPU-scope rule over the node's GPUs (each with at least one sample)."""
    gpus = sorted(windows, key=lambda w: w.gpu_index)
    return [_node_verdict(grade_gpus(rule, gpus, min_samples=1, every_gpu=False)) for rule in node_rules(rules)]


# -- job rows ---------------------------------------------------------------------------------------------------


def phase_rules(rules: RuleSet) -> list[tuple[str, Rule]]:
    """(phase, rule) of the phase-share rules, in the step report's phase order."""
    found = [(r.signal.removesuffix(SHARE_SUFFIX), r) for r in rules.rules
             if r.scope == "job" and r.signal.endswith(SHARE_SUFFIX)]
    order = {p: i for i, p in enumerate(PHASES)}
    return sorted(found, key=lambda pr: (order.get(pr[0], len(order)), pr[1].priority, pr[1].name))


def row_rules(rules: RuleSet) -> list[Rule]:
    """The job-scope rules that are rows of their own (not a phase share, not the OOM rule), by priority."""
    return [r for r in rules.rules if r.scope == "job" and not r.signal.endswith(SHARE_SUFFIX)
            and r.signal not in NO_ROW_SIGNALS]


def job_checks(rules: RuleSet) -> list[str]:
    """The names of a job's rows under ``rules``."""
    return ([COMPOSITION] if phase_rules(rules) else []) + [r.name for r in row_rules(rules)]


def no_job_data(rules: RuleSet) -> list[Verdict]:
    """A node's job rows while no job reports through the hook."""
    return [Verdict(check=c, status=NO_DATA, value=None, unit="", healthy_below=None, act_above=None,
                    message=NO_JOB_DATA) for c in job_checks(rules)]


def _verdict(check: str, rule: Rule, reading: Reading, message: Optional[str] = None) -> Verdict:
    status = reading.status if reading.status in SEVERITY else NO_DATA
    return Verdict(check=check, status=status, value=reading.value, unit=rule.unit, healthy_below=rule.healthy_below,
                   act_above=rule.act_above, message=message or reading.message,
                   advice=rule.advice if status in (WATCH, ACT) else None)


def no_data(check: str, rule: Optional[Rule], message: str) -> Verdict:
    return Verdict(check=check, status=NO_DATA, value=None, unit=rule.unit if rule else "",
                   healthy_below=rule.healthy_below if rule else None, act_above=rule.act_above if rule else None,
                   message=message)


def _composition(rules: RuleSet, win: Sequence[JobStep], ctx: JobContext, tp: Optional[float]) -> Verdict:
    phased = phase_rules(rules)
    graded = [(phase, rule, job_reading(rule, win, ctx)) for phase, rule in phased]
    graded = [g for g in graded if g[0] not in OPTIONAL_PHASES or g[2].value is not None]
    known = [g for g in graded if g[2].value is not None]
    if not known:
        return no_data(COMPOSITION, phased[0][1],
                       "no phase timings in the window's step reports (generation / evaluation / communication)")
    # The worst phase: the highest grade, then the one closest to (or furthest past) its own act line.
    phase, rule, reading = max(known, key=lambda g: (SEVERITY.get(g[2].status, 0),
                                                     g[2].value / g[1].act_above if g[1].act_above > 0 else g[2].value))
    parts = []
    for p, r, rd in graded:
        mark = {ACT: " ACT", WATCH: " watch"}.get(rd.status, "")
        share = "n/a" if rd.value is None else f"{rd.value:.1f} %"
        parts.append(f"{p} {share}{mark} (guide < {r.healthy_below:g}, act > {r.act_above:g})")
    steps = f"steps {win[0].step}–{win[-1].step}" if win[0].step != win[-1].step else f"step {win[0].step}"
    rate = f", {tp:.2f} samples/s" if tp is not None else ""
    message = " · ".join(parts) + f"; on {time_base_words(win)}; {steps}{rate}"
    if reading.status == ACT:
        message = f"{phase}-bound: " + message
    return _verdict(COMPOSITION, rule, reading, message)


def _fragmentation(rule: Rule, win: Sequence[JobStep], ctx: JobContext) -> Verdict:
    reading = job_reading(rule, win, ctx)
    if reading.value is None:
        return no_data(rule.name, rule, "no allocator statistics in the window's step reports")
    retries = alloc_retries(win, ctx)
    message = f"{reading.message}; {retries} allocator retries in the window"
    if reading.status == ACT and retries == 0:
        message += " (the rebalancer acts on fragmentation only under memory pressure)"
    return _verdict(rule.name, rule, reading, message)


def _latency_row(rule: Rule, win: Sequence[JobStep], ctx: JobContext, mean_us: Optional[float],
             baseline_steps: int) -> Verdict:
    """The latency rule's row: the reading (:func:`~trimtab.grading.signals.job_reading`) with the window's probe
    mean and the baseline written out, or why there is no row yet (no probes, no baseline)."""
    if mean_us is None:
        return no_data(rule.name, rule, "no collective-latency probes in the window (the hook's probe is off, or it "
                                        "probes less often)")
    reading = job_reading(rule, win, ctx)
    if ctx.probe_baseline_us is None:
        return no_data(rule.name, rule, f"window mean {mean_us:.1f} µs; no baseline yet (fewer than "
                                        f"{baseline_steps} probes so far)")
    message = f"{reading.message}; window mean {mean_us:.1f} µs vs baseline {ctx.probe_baseline_us:.1f} µs"
    return _verdict(rule.name, rule, reading, message)


def job_rows(rules: RuleSet, win: Sequence[JobStep], ctx: JobContext, tp: Optional[float],
                 mean_latency_us: Optional[float]) -> list[Verdict]:
    """A job's rows over its window ``win`` (``tp``: its throughput; ``mean_latency_us``: its probes' mean)."""
    out = [_composition(rules, win, ctx, tp)] if phase_rules(rules) else []
    for rule in row_rules(rules):
        if rule.signal == "fragmentation_pct":
            out.append(_fragmentation(rule, win, ctx))
        elif rule.signal == "collective_latency_x_baseline":
            out.append(_latency_row(rule, win, ctx, mean_latency_us, rules.controller.probe_baseline_steps))
        else:
            out.append(_verdict(rule.name, rule, job_reading(rule, win, ctx)))
    return out


__all__ = ["COMPOSITION", "LIVE_JOB_S", "Verdict", "job_checks", "job_rows", "live_since_ms", "no_data", "no_job_data", "node_rules", "node_rows",
           "rules_for"]
