"""Which action a rule that fires takes, and to what value: the first of its actions that may act — not at its
bound, not blocked by what the verdicts say (the bracket search, bracket.py), not a raise memory has no room for
(the memory fit, memory_forecast.py) — its step (the rule's larger one on strong evidence or after a rung that paid,
a first climb of several rungs where memory has room for them), and why each action before it was skipped. The
controller (controller.py) asks this once a rule fires on a window; a safety lower to the memory fit is sized here
too. Pure: reads a :class:`JobState`, writes nothing.
"""

from __future__ import annotations

import math
from typing import Optional

from trimtab.control import memory_follow, memory_forecast as forecast
from trimtab.control.bracket import blocked, bracket
from trimtab.control.holds import result_of
from trimtab.control.memory_fit import GIB
from trimtab.control.plan import JobState
from trimtab.control.queue_use import queue_unused
from trimtab.control.overlap_bound import nothing_to_hide
from trimtab.control.stride import paid_rung
from trimtab.control.verdict import GAIN, Sample
from trimtab.grading.rules import Action, Rule, RuleSet
from trimtab.grading.signals import Reading
from trimtab.store.decisions import StoredDecision


def _integer_knob(spec: dict) -> bool:
    return all(float(spec[k]).is_integer() for k in ("value", "min", "max"))


def _next_value(action: Action, spec: dict, strong: bool = False) -> float:
    current = float(spec["value"])
    new = action.apply(current, strong)
    if _integer_knob(spec):
        new = math.ceil(new - 1e-9) if action.direction > 0 else math.floor(new + 1e-9)
        new = max(new, current + 1) if action.direction > 0 else min(new, current - 1)
    return max(float(spec["min"]), min(float(spec["max"]), new))


def _headroom(state: JobState, rules: RuleSet, readings: dict[str, Reading], nvml: bool = True) -> Optional[str]:
    """None when a batch-size raise is safe, else why not. ``nvml`` False: the job's allocator peaks say what a
    raise needs (NVML's used memory counts the allocator's cache too, which a raise reuses)."""
    ctl = rules.controller
    mem = next((r for r in readings.values() if r.signal == "mem_used_pct"), None)
    if state.has_gpus and nvml:
        if mem is None or mem.value is None:
            return "GPU memory of the job's GPUs is unknown (no agent samples)"
        if mem.value > ctl.raise_batch_max_mem_pct:
            return f"GPU memory at {mem.value:.1f} % (raising needs < {ctl.raise_batch_max_mem_pct:g} %)"
    frag = next((r for r in readings.values() if r.signal == "fragmentation_pct"), None)
    if frag is not None and frag.value is not None and frag.value > ctl.raise_batch_max_fragmentation_pct:
        return f"fragmentation at {frag.value:.1f} % (raising needs < {ctl.raise_batch_max_fragmentation_pct:g} %)"
    return None


def _at_bound(state: JobState, knob: str, direction: float) -> bool:
    """The knob can go no further that way (its declared max, or min): a gain followed through on it goes on with
    the rule's next action (batch 16 → 64 gained, 64 is the max, generation still a third of the step: prefetch)."""
    spec = state.job.knobs.get(knob)
    if spec is None or direction == 0:
        return False
    value = float(spec["value"])
    return value >= float(spec["max"]) if direction > 0 else value <= float(spec["min"])


def _strong(rule: Rule, reading: Reading) -> bool:
    """The signal is far above its line (over the whole window and each half): the rule's larger step."""
    if rule.strong_above is None or reading.value is None or reading.value <= rule.strong_above:
        return False
    return all(h is None or h > rule.strong_above for h in reading.detail.get("halves", []))


def choose(rule: Rule, state: JobState, rules: RuleSet, readings: dict[str, Reading], now: Optional[Sample] = None,
            follow: Optional[StoredDecision] = None) -> tuple[Optional[tuple[Action, float]], list[str], list]:
    """The first action of the rule that may act, with its new value; the actions skipped and why; how the step
    was chosen (strong evidence, bracket search, memory prediction). ``follow``: the rule follows this gain
    through, so only the action that made it may act."""
    skipped: list[str] = []
    # A rule lists actions for several kinds of job (one batch size, or a framework's per-call micro-batches);
    # the knobs a job did not declare are worth naming only when it declared none of them.
    declared_any = any(a.knob in state.job.knobs for a in rule.actions)
    strong = _strong(rule, readings[rule.name])
    followed_at_bound = follow is not None and _at_bound(state, follow.knob, follow.new_value - follow.old_value)
    for action in rule.actions:
        spec = state.job.knobs.get(action.knob)
        if spec is None:
            if not declared_any:
                skipped.append(f"{action.describe()}: the job declared no knob {action.knob!r}")
            continue
        if follow is not None and not followed_at_bound and (
                follow.knob != action.knob or (follow.new_value - follow.old_value) * action.direction <= 0):
            continue
        policy: list = []
        current = float(spec["value"])
        new = _next_value(action, spec, strong)
        if action.to_memory_fit:
            # A safety lower, sized by the forecast; not a search move (no bracket, no verdict to honour).
            new, why = _memory_lower(state, rules, action, spec, new, policy)
            if why is not None:
                skipped.append(f"{action.describe()}: {why}")
                continue
            return (action, new), skipped, policy
        if strong and action.strong_by is not None and new != current:
            policy.append(f"strong evidence ({readings[rule.name].value:.1f} > {rule.strong_above:g} over the "
                          f"window and each half): step {action.strong_by:g} instead of {action.by:g}")
        paid = None if strong else paid_rung(state, rules, rule, action)
        if paid is not None and _next_value(action, spec, True) != new:
            new = _next_value(action, spec, True)
            policy.append(f"the last rung paid: decision {paid.id} ({paid.knob} {paid.old_value:g} → "
                          f"{paid.new_value:g}) measured a gain of "
                          f"{100 * (paid.evidence['verdict']['ratio'] - 1):+.1f} % (≥ "
                          f"{rules.controller.ladder_gain_pct:g} %): step {action.strong_by:g} instead of "
                          f"{action.by:g}")
        climbed = memory_follow.first_climb(state, rules, action.knob, current, action.by) \
            if action.needs_memory_headroom and action.op == "mul" and not strong else None
        if climbed is not None:
            new = max(float(spec["min"]), min(float(spec["max"]), climbed))
            policy.append(f"first climb: memory has room for {rules.controller.memory_first_climb_rungs} rungs of "
                          f"×{action.by:g} at once ({current:g} → {new:g})")
            policy.append({memory_follow.CLIMB: {"rungs": rules.controller.memory_first_climb_rungs, "window_x":
                                                 memory_follow.climb_window_x(rules, current, new, action.by)}})
        if new == current:
            bound = "max" if action.direction > 0 else "min"
            skipped.append(f"{action.describe()}: {action.knob} is at its {bound} ({spec[bound]:g})")
            continue
        fires = readings[rule.name].fires
        bracketed, note = bracket(state, rules, action, new, _integer_knob(spec), now, strong, fires)
        if note is not None:
            policy.append(note)
        if bracketed is None:
            skipped.append(f"{action.describe()}: {note}")
            continue
        new = bracketed
        # a geometric ladder (×/÷) whose rule still fires (strongly, where the rule says what strongly is) looks one
        # rung past a step that gained nothing; an additive one (prefetch +2) does not
        ladder = action.op in ("mul", "div") and readings[rule.name].fires and (rule.strong_above is None or strong)
        why = (blocked(state, rules, action, new, now, firing=ladder, strong=strong, fires=fires)
               or queue_unused(state, rules, action.knob, current, new)
               or nothing_to_hide(state, rules, action.knob, current, new))
        if why is None and action.needs_memory_headroom and new > current:
            new, why = _memory_step(state, rules, readings, action, spec, new, policy)
        if why is not None:
            skipped.append(f"{action.describe()}: {why}")
            continue
        if follow is not None:
            policy.insert(0, f"following through: decision {follow.id} ({follow.knob} {follow.old_value:g} → "
                             f"{follow.new_value:g}) measured "
                             f"{'a gain' if result_of(follow) == GAIN else 'an unconfirmed gain'} and the signal is "
                             f"still above "
                             f"{rule.follow_above:g} {rule.unit}"
                             + (f"; {follow.knob} is at its bound: the rule's next action" if followed_at_bound
                                else ""))
        return (action, new), skipped, policy
    return None, skipped, []


def _memory_step(state: JobState, rules: RuleSet, readings: dict[str, Reading], action: Action, spec: dict,
                 new: float, policy: list) -> tuple[float, Optional[str]]:
    """The raise cut to the largest value whose predicted memory — at the length the job's trend reaches at the
    forecast's far look-ahead — stays under the line (the prediction goes into the policy notes and, as a dict,
    into the decision's evidence); why not, when not even one step fits."""
    current = float(spec["value"])
    mfit = forecast.job_fit(state, rules, action.knob)
    why = _headroom(state, rules, readings, nvml=mfit is None)
    if mfit is None or why is not None:
        return new, why  # no allocator peaks or capacity reported: the headroom check alone
    length = forecast.far_length(mfit, rules)
    at = "" if length is None or mfit.token_budget else f" at {length:.0f} tokens per sample"
    largest = mfit.largest_fitting(length)
    others = f", lowered by {mfit.others_bytes / GIB:.1f} GiB other processes hold" if mfit.others_bytes > 0 else ""
    bound = memory_follow.bound(state, rules, action.knob, mfit)
    if bound is not None and new > largest:
        return new, (f"{action.knob} is bound by memory since decision {bound.id}: it follows the memory line "
                     f"(memory_follow.py), not rungs")
    if largest <= current:
        nxt = current + 1
        return new, (f"memory predicted at {action.knob}={nxt:g}{at}: {mfit.predict(nxt, length) / GIB:.1f} GiB + "
                     f"margin {mfit.margin_bytes / GIB:.1f} GiB, above the line ({mfit.line_bytes / GIB:.1f} GiB"
                     f"{others})")
    if new > largest:
        policy.append(f"memory: {action.knob}={new:g} would need {mfit.predict(new, length) / GIB:.1f} GiB{at} (line "
                      f"{mfit.line_bytes / GIB:.1f} GiB{others} less {mfit.margin_bytes / GIB:.1f} GiB margin): "
                      f"{largest:g} fits")
        new = float(largest)
        policy.append({memory_follow.CAPPED: True})
    policy.append({"memory_prediction": mfit.evidence(new, length)})
    return new, None


def _memory_lower(state: JobState, rules: RuleSet, action: Action, spec: dict, floor: float,
                  policy: list) -> tuple[float, Optional[str]]:
    """A forecast lower: to the largest value predicted to fit at the far look-ahead, at most the action's step
    (``floor``) and at least one step down; why not, when the knob is at its min or nothing is fitted."""
    current = float(spec["value"])
    target, evidence = forecast.lower_target(state, rules, action.knob, floor)
    if target is None:
        return current, "no allocator peaks or GPU capacity in the job's reports"
    new = min(target, current - 1) if _integer_knob(spec) else min(target, floor)
    new = max(float(spec["min"]), new)
    if new >= current:
        return current, f"{action.knob} is at its min ({spec['min']:g})"
    policy.append(f"memory forecast: {action.knob} {current:g} → {new:g}, the largest value predicted to fit "
                  f"{rules.controller.memory_lookahead_s * rules.controller.memory_lower_lookahead_x:g} s of steps "
                  f"ahead")
    policy.append(evidence)
    return new, None
