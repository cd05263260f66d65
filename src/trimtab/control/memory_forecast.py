"""The memory forecast: will the job's batch knob, at the length its sequences are growing to, still fit? The
``memory_forecast_pct`` signal is the predicted allocator peak (plus the fit's largest recent miss) at the knob's
value and the tokens per sample the length's trend reaches ``memory_lookahead_s`` of step time from now, as a
share of the GPU. A rule on it (``rules.memory_forecast``) lowers the knob *before* the peak crosses its line — to
the largest value predicted to fit with the margin at ``memory_lower_lookahead_x`` times that look-ahead, so one
planned, measured change covers a while — instead of waiting for the OOM. Raises go only as far as the same far
look-ahead allows (the gap between the two is the hysteresis), and a raise still being measured is cut short
when the forecast fires: memory before speed. Memory another process holds on the GPU (``MemoryFit.others_bytes``)
counts in the signal: a neighbour that arrives makes the forecast fire at once where the job's own peak no longer
fits beside it.
"""

from __future__ import annotations

from typing import Optional

from trimtab.control.memory_fit import GIB, MemoryFit, fit
from trimtab.control.plan import JobState
from trimtab.grading.rules import Rule, RuleSet
from trimtab.contract.statuses import NO_DATA
from trimtab.grading.signals import Reading

SIGNAL = "memory_forecast_pct"


def forecast_knob(rule: Rule, state: JobState) -> Optional[str]:
    """The knob the rule's forecast is about: its first action that lowers to the memory fit, declared by the job."""
    return next((a.knob for a in rule.actions if a.to_memory_fit and a.knob in state.job.knobs), None)


def job_fit(state: JobState, rules: RuleSet, knob: str) -> Optional[MemoryFit]:
    return fit(state.steps, state.changes, knob, float(state.job.knobs[knob]["value"]), rules.controller)


def near_length(mfit: MemoryFit, rules: RuleSet) -> Optional[float]:
    """Tokens per sample the forecast fires on: the trend ``memory_lookahead_s`` ahead."""
    return mfit.length_ahead(rules.controller.memory_lookahead_s)


def far_length(mfit: MemoryFit, rules: RuleSet) -> Optional[float]:
    """Tokens per sample a move is sized for (a raise's ceiling, a lower's target)."""
    ctl = rules.controller
    return mfit.length_ahead(ctl.memory_lookahead_s * max(1.0, ctl.memory_lower_lookahead_x))


def reading(rule: Rule, state: JobState, rules: RuleSet, ahead_s: Optional[float] = None) -> Reading:
    """The forecast ``memory_lookahead_s`` ahead (``ahead_s``: this far instead — a batch that follows the memory
    line at every step needs to fit only until its next move, ``memory_follow.py``)."""
    base = dict(rule=rule.name, signal=rule.signal, unit=rule.unit)
    knob = forecast_knob(rule, state)
    if knob is None:
        return Reading(status=NO_DATA, value=None, message="the job declared none of the rule's knobs", **base)
    mfit = job_fit(state, rules, knob)
    if mfit is None:
        return Reading(status=NO_DATA, value=None, message="no allocator peaks or GPU capacity in the job's reports",
                       **base)
    value = float(state.job.knobs[knob]["value"])
    length = near_length(mfit, rules) if ahead_s is None else mfit.length_ahead(ahead_s)
    peak = mfit.predict(value, length) + mfit.miss_bytes
    pct = 100.0 * (peak + mfit.others_bytes) / mfit.total_bytes
    grade = rule.grade(pct)
    ahead = rules.controller.memory_lookahead_s if ahead_s is None else ahead_s
    at = "" if length is None or mfit.token_budget else f" at {length:.0f} tokens per sample"
    others = f" + {mfit.others_bytes / GIB:.1f} GiB held by other processes" if mfit.others_bytes > 0 else ""
    msg = (f"{knob}={value:g}: predicted peak {peak / GIB:.1f} GiB{at} within {ahead:.3g} s of steps{others} = "
           f"{pct:.1f} % of {mfit.total_bytes / GIB:.1f} GiB (act above {rule.act_above:g} %)")
    return Reading(status=grade, value=pct, message=msg, detail={"forecast": mfit.evidence(value, length)}, **base)


def lower_target(state: JobState, rules: RuleSet, knob: str, floor: float) -> tuple[Optional[float], dict]:
    """The largest value of ``knob`` predicted to fit with the margin at the far look-ahead, not below ``floor``
    (the action's largest step); None without a fit."""
    mfit = job_fit(state, rules, knob)
    if mfit is None:
        return None, {}
    length = far_length(mfit, rules)
    target = max(floor, float(mfit.largest_fitting(length)))
    return target, {"memory_prediction": mfit.evidence(target, length)}


def preempts(state: JobState, rules: RuleSet) -> Optional[tuple[Rule, Reading]]:
    """The forecast rule that fires now, if any (checked while a change is being measured)."""
    for rule in rules.rules:
        if rule.signal == SIGNAL and rule.safety:
            r = reading(rule, state, rules)
            if r.fires:
                return rule, r
    return None
