"""Following the memory line: a batch knob whose raise measured a gain and was cut by memory (the rule asked for
more than the memory fit said fits) is bound by memory, not by throughput — so from then on its value follows what
the fit says fits at the length the job's trend reaches, both ways, at every step, instead of one verdict-tested rung
a window.

Why: a job whose lengths drift moves its memory line all the time (128 → 512 tokens per sample is ÷4). Tested rungs
follow it a window and a verdict behind (7–16 steps, and a +3 % rung the verdict cannot tell from noise is sent
back): the growing bench job sat at 82–88 % of the follow-the-length oracle's batch, the shrinking one 10–30 % under
it. A move along the line is not a bet on throughput — the gain that made the knob memory-bound already showed that
a larger batch pays here; what is new is only how much memory there is for it — so it is kept once the job has run
at it (one step with an allocator peak, which the fit then reads), not judged by a t-test.

Bound by memory from a raise kept as a gain (or an unconfirmed gain) that the fit cut (``memory_capped`` in its
evidence), or whose next rung of the same size would not fit — until the knob's next move that is not a memory move
(a throughput decision on it ends the following, whichever way it went).
A raise along the line goes only where it is at least ``memory_follow_min_pct`` above the value (fewer, larger
moves); a lower comes as soon as the forecast fires (``memory_forecast.py``). Both are sized to fit until the next
move can land (``follow_steps``: from the job's own measured landing delay), not the forecast's look-ahead: the next
move comes that soon.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from trimtab.contract.statuses import KEPT, PENDING
from trimtab.control import memory_forecast as forecast
from trimtab.control.holds import evidence_of, result_of
from trimtab.control.memory_fit import MemoryFit
from trimtab.control.plan import JobState, NewChange, Plan, Wait, last_applied
from trimtab.control.verdict import GAIN
from trimtab.grading.rules import ControllerSettings, Rule, RuleSet
from trimtab.store.decisions import StoredDecision

FOLLOW = "memory_follow"   # a decision's evidence key: a move along the memory line
CAPPED = "memory_capped"   # a raise's evidence key: the memory fit cut it short of what the rule asked for
CLIMB = "first_climb"      # a raise's evidence key: a first climb of several rungs at once
LANDINGS = 3               # a move's landing delay: the most of this many newest measured
MIN_CLIMB_WINDOW_STEPS = 3  # a climb's windows hold at least this many steps (a spread on each side of the test)


def _forecast_rule(rules: RuleSet) -> Optional[Rule]:
    return next((r for r in rules.rules if r.signal == forecast.SIGNAL and r.safety), None)


def is_follow(d: StoredDecision) -> bool:
    return bool(evidence_of(d).get(FOLLOW))


def anchor(state: JobState, rules: RuleSet, knob: str) -> Optional[StoredDecision]:
    """The knob's newest throughput decision where it is a raise kept for a gain (or an unconfirmed gain), past the
    memory moves made since; None otherwise. It binds the knob by memory where it was cut by the fit, or where the
    next rung of the same size would not fit (``bound``)."""
    rule = _forecast_rule(rules)
    for d in state.decisions:  # newest first
        if d.knob != knob or d.new_value is None or d.old_value is None:
            continue
        if is_follow(d) or (rule is not None and d.rule == rule.name):
            continue  # memory moves (the forecast's lowers, the follow's own) do not end it
        ev = evidence_of(d)
        gained = result_of(d) == GAIN or bool(ev.get("unconfirmed_gain"))
        if d.outcome == KEPT and d.new_value > d.old_value and gained:
            return d
        return None
    return None


def bound(state: JobState, rules: RuleSet, knob: str, mfit: Optional[MemoryFit] = None) -> Optional[StoredDecision]:
    """The anchor (``anchor``) where memory binds ``knob``: the raise was cut by the memory fit, or the next rung
    of its size (×new/old from the value now) would not fit at the far look-ahead — the rule's next measured move
    would be cut to the line anyway, and the gain already showed that a larger batch pays."""
    d = anchor(state, rules, knob)
    if d is None or evidence_of(d).get(CAPPED):
        return d
    mfit = mfit or forecast.job_fit(state, rules, knob)
    if mfit is None or d.old_value <= 0:
        return None
    rung = float(state.job.knobs[knob]["value"]) * float(d.new_value) / float(d.old_value)
    return d if mfit.largest_fitting(forecast.far_length(mfit, rules)) < rung else None


def bound_knob(state: JobState, rules: RuleSet) -> Optional[str]:
    """The job's batch knob when memory binds it now (the forecast rule's knob, ``bound``), else None."""
    rule = _forecast_rule(rules)
    knob = forecast.forecast_knob(rule, state) if rule is not None else None
    return knob if knob is not None and bound(state, rules, knob) is not None else None


def landing_steps(state: JobState) -> Optional[int]:
    """Steps from the newest step a move was decided on to the step it took effect at, the most of the job's newest
    ``LANDINGS`` measured (1 where the job applies a change at its next step; more where its reports are queued
    or batched); None before any was measured. A decision's step is its window's newest (a rule's) or
    ``decided_at_step`` (a follow move's)."""
    seen: list[int] = []
    for d in state.decisions:  # newest first
        ev = evidence_of(d)
        at = ev.get("decided_at_step", ((ev.get("window") or {}).get("steps") or [None, None])[1])
        if d.applied_step is None or not isinstance(at, int) or d.applied_step < at:
            continue
        seen.append(d.applied_step - at)
        if len(seen) >= LANDINGS:
            break
    return max(seen) if seen else None


def follow_steps(state: JobState, rules: RuleSet) -> float:
    """How many steps past the newest a value the knob moves to must fit: until the move after it can land. A move
    decided at step i lands at i + lag (``landing_steps``), is kept once step i + lag + settle reports its peak, and
    the next move decided then lands lag steps later: the value runs to step i + 2 lag + settle − 1 (2 steps where the
    job applies a change at its next step). ``memory_follow_lookahead_steps`` until a landing was measured."""
    lag = landing_steps(state)
    if lag is None:
        return rules.controller.memory_follow_lookahead_steps
    return float(max(1, 2 * lag + rules.controller.settle_steps - 1))


def follow_ahead_s(state: JobState, rules: RuleSet) -> float:
    """How far ahead a knob that follows the memory line must fit: until its next move can land (``follow_steps``),
    at the median time of the newest steps (the forecast's own ``memory_lookahead_s`` covers a window and a verdict:
    5 s sized the growing job's batch for 38 tokens per sample more than it ran at, 20 % under its line; a fixed 4
    steps left it 4 % under the line at 200 tokens per sample, with the next move 2 steps away)."""
    recent = sorted(s.step_time_s for s in state.steps[-9:])
    median_s = recent[len(recent) // 2] if recent else 0.0
    return follow_steps(state, rules) * median_s


def move(state: JobState, rules: RuleSet) -> Optional[Plan]:
    """A move of the memory-bound knob to the line, or None (not bound, the fit has not seen the knob's value yet,
    or the value is within ``memory_follow_min_pct`` under the line)."""
    rule = _forecast_rule(rules)
    knob = forecast.forecast_knob(rule, state) if rule is not None else None
    if knob is None or state.job.mode != "auto" or any(d.outcome == PENDING for d in state.decisions):
        return None  # (advise mode: the rules' own plans advise)
    spec = state.job.knobs[knob]
    current = float(spec["value"])
    mfit = forecast.job_fit(state, rules, knob)
    bound_by = bound(state, rules, knob, mfit) if mfit is not None else None
    if bound_by is None:
        return None
    last = last_applied(state, knob)
    settled = (last.applied_step + rules.controller.settle_steps) if last is not None else 0
    if mfit is None or not any(s.step >= settled and s.mem_peak_bytes is not None for s in state.steps):
        return None  # the fit has not seen the value the knob runs at yet
    ahead_s = follow_ahead_s(state, rules)
    length = mfit.length_ahead(ahead_s)
    largest = mfit.largest_fitting(length)
    if math.isinf(largest):
        return None  # memory does not grow with the knob: nothing to follow
    target = max(float(spec["min"]), min(float(spec["max"]), float(largest)))
    reading = forecast.reading(rule, state, rules, ahead_s)
    if reading.fires:
        new = min(target, current - 1)
        if new < float(spec["min"]) or new >= current:
            return None  # at its min: the forecast rule's own plan says so
        why = f"memory forecast: {reading.message}"
    elif target >= current * (1.0 + rules.controller.memory_follow_min_pct / 100.0) and target >= current + 1:
        new = target
        at = "" if length is None or mfit.token_budget else f" at {length:.0f} tokens per sample"
        why = f"the memory line has room: {knob}={target:g} fits{at}"
    else:
        return None
    reason = (f"{rule.name}: {why} → {knob} follows the memory line ({current:g} → {new:g}; memory-bound since "
              f"decision {bound_by.id})")
    evidence = {FOLLOW: {"anchor_decision": bound_by.id, "target": target, "why": why},
                "decided_at_step": state.steps[-1].step,
                "memory_prediction": mfit.evidence(new, length), "reading": reading.evidence(),
                "knobs": {k: v["value"] for k, v in state.job.knobs.items()}, "mode": state.job.mode}
    change = NewChange(rule.name, knob, current, new, reason)
    return Plan(note=reason, change=change, evidence=evidence, wait=Wait(steps=1))


def first_climb(state: JobState, rules: RuleSet, knob: str, current: float, by: float) -> Optional[float]:
    """The first raise of a batch knob where the memory fit has room for ``memory_first_climb_rungs`` rungs of
    ×``by`` at the far look-ahead: as far as the fit allows, at most one rung more (the job reports allocator peaks
    and its GPU's capacity; none of the knob's moves decided yet); None otherwise. Each rung costs a window and a
    verdict (16 steps of the growing job's 0.2 s steps): with memory for ×27 at batch 4, two ×4 rungs spent 30 steps
    below a quarter of what fits. A fit from one batch size is an upper bound (its base counted per sample), so the
    move fits; it is still measured, and a loss sends it back for the bracket search to go between."""
    rungs = rules.controller.memory_first_climb_rungs
    if rungs <= 1 or by <= 1 or any(d.knob == knob for d in state.decisions):
        return None
    mfit = forecast.job_fit(state, rules, knob)
    if mfit is None:
        return None
    largest = mfit.largest_fitting(forecast.far_length(mfit, rules))
    return min(float(largest), current * by ** (rungs + 1)) if largest >= current * by ** rungs else None


def climb_window_x(rules: RuleSet, current: float, climbed: float, by: float) -> float:
    """The factor on ``window_min_s`` and ``window_enough_steps`` for the windows that decide and judge a first climb
    of ``current`` → ``climbed`` on a ladder of ×``by``: 1/r² for its r rungs, at most ``memory_first_window_x``
    (1: off). A t-test needs samples in the inverse square of the effect it must see, and r rungs are r times one
    rung's effect in log throughput (a rung the window is sized for): a ×16 climb is seen on a quarter of a window,
    ×64 on a ninth — never on fewer than ``MIN_CLIMB_WINDOW_STEPS`` steps (``climb_settings``)."""
    cap = rules.controller.memory_first_window_x
    if cap >= 1.0 or by <= 1.0 or current <= 0 or climbed <= current:
        return 1.0
    rungs = max(1.0, math.log(climbed / current) / math.log(by))
    return min(cap, 1.0 / rungs ** 2)


def climb_settings(ctl: ControllerSettings, x: float) -> ControllerSettings:
    """The window settings a climb's windows use (``climb_window_x``: ``x``): ``window_min_s`` and
    ``window_enough_steps`` × x, and at least ``MIN_CLIMB_WINDOW_STEPS`` steps (a spread on each side of the test:
    a ninth of 4 s is one step of 0.85 s)."""
    if x >= 1.0:
        return ctl
    least = max(ctl.window_min_steps, MIN_CLIMB_WINDOW_STEPS)
    return replace(ctl, window_min_s=ctl.window_min_s * x, window_min_steps=least,
                   window_enough_steps=max(least, round(ctl.window_enough_steps * x)))


def first_window_x(state: JobState, rules: RuleSet) -> float:
    """The factor on the job's first window where its first move would be a climb of several rungs
    (``first_climb``: a batch knob with memory for ×16 and no decision on the job yet; ``climb_window_x``), else 1.
    The move is large (×16 is +500–1 400 % on a generation-bound job) and still measured; the window before it is
    what the job runs at batch 4, the least it will run at — each step of it costs a step at a sixteenth or less of
    what fits."""
    if rules.controller.memory_first_window_x >= 1.0 or state.decisions:
        return 1.0
    seen: set[str] = set()
    for rule in rules.rules:  # by priority: the first rule that raises a knob is the one whose rung counts
        for a in rule.actions:
            spec = state.job.knobs.get(a.knob)
            if spec is None or not a.needs_memory_headroom or a.op != "mul" or a.knob in seen:
                continue
            seen.add(a.knob)
            current = float(spec["value"])
            climbed = first_climb(state, rules, a.knob, current, a.by)
            if climbed is not None:
                return climb_window_x(rules, current, min(float(spec["max"]), climbed), a.by)
    return 1.0


def climb_possible(state: JobState, rules: RuleSet) -> bool:
    """A first climb may still shorten the job's first window (``first_window_x``): none of its moves decided yet,
    and a batch knob a rule raises by ×. The memory fit that allows one changes with each step early on (on three
    steps of the drifting bench's job, ±3 % lengths read as a steep trend, it forecast no room: seed 17 waited for
    the full window, 18 steps at batch 4), so the first window is looked at every step while it could: while the
    job reports the allocator peaks a fit is made of (a job that reports none is planned per window)."""
    if rules.controller.memory_first_window_x >= 1.0 or state.decisions:
        return False
    knobs = {a.knob for rule in rules.rules for a in rule.actions
             if a.needs_memory_headroom and a.op == "mul" and a.knob in state.job.knobs}
    return any(forecast.job_fit(state, rules, knob) is not None for knob in knobs)


def after_window_x(open_d: StoredDecision) -> float:
    """The factor on the after window a first climb is judged on before the test may close it (its
    ``window_x``: the window that decided it was as short; a two-rung move is as large an effect to see), else 1.
    While the test cannot tell, the after window grows as any does."""
    climb = evidence_of(open_d).get(CLIMB)
    x = climb.get("window_x") if isinstance(climb, dict) else None
    return float(x) if isinstance(x, (int, float)) and 0 < x < 1 else 1.0


def kept_once_run(state: JobState, rules: RuleSet, open_d: StoredDecision, applied_step: int) -> Optional[Plan]:
    """A follow move is kept once the job ran at it (a step past the settle steps that reports its allocator peak):
    not a throughput bet, nothing to judge."""
    if not is_follow(open_d):
        return None
    first = applied_step + rules.controller.settle_steps
    if not any(s.step >= first and s.mem_peak_bytes is not None for s in state.steps):
        return None
    return Plan(note=f"decision {open_d.id}: memory-following move kept (the job ran at it; not a throughput bet)",
                close=open_d.id, outcome=KEPT, applied_step=applied_step,
                evidence={**open_d.evidence, "verdict_ms": state.now_ms}, wait=Wait(steps=1))


__all__ = ["CAPPED", "CLIMB", "FOLLOW", "after_window_x", "anchor", "bound", "bound_knob", "climb_settings", "climb_window_x",
           "first_climb",
           "first_window_x", "follow_ahead_s", "follow_steps", "landing_steps", "is_follow", "kept_once_run", "move"]
