"""What the job's past verdicts say about the next move: which moves are blocked (a rolled-back value, a direction
that gained nothing, a refused direction), where the best value of a knob lies (between the values measured worse
on either side: the bracket search, upward and downward), and when a rule follows a gain through below its line.
Which verdicts still hold is ``holds.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from trimtab.contract.statuses import ADVISED, KEPT, PENDING, REFUSED, ROLLED_BACK
from trimtab.grading.rules import Action, Rule, RuleSet
from trimtab.grading.signals import Reading
from trimtab.control.holds import evidence_of, host_slowed, known_unmeasured, remeasured, \
    result_of, same_move, still_holds, verdict_ms
from trimtab.control.curve_levels import peak_between as _peak_between, \
    tied_points as _tied_points, worth_a_move as _worth_a_move
from trimtab.control.verdict import GAIN, Sample
from trimtab.store.decisions import StoredDecision

if TYPE_CHECKING:
    from trimtab.control.plan import JobState

REAPPLIED = "reapplies_after_host_slowdown"  # the decision's evidence: the rollback its move goes back on (holds.py)


def _no_gain_rungs(state: "JobState", d: StoredDecision, way: int) -> int:
    """How many moves in a row this way, ending with ``d``, were kept with no measurable gain."""
    n, at = 0, d
    while at is not None:
        ev = evidence_of(at)
        if not (at.outcome == KEPT and ev.get("no_gain") and not ev.get("unconfirmed_gain")
                and (at.new_value - at.old_value) * way > 0):
            break
        n += 1
        at = next((e for e in state.decisions if e.knob == at.knob and e.id != at.id and e.new_value is not None
                   and e.old_value is not None and float(e.new_value) == float(at.old_value)
                   and e.outcome == KEPT), None)
    return n


def blocked(state: "JobState", rules: RuleSet, action: Action, new: float, now: Optional[Sample],
            firing: bool = False, strong: bool = False, fires: bool = False) -> Optional[str]:
    """Why this move may not be tried now (a value measured worse, or a no-gain direction, whose verdict still
    holds; a recently refused direction), else None. ``firing``: the rule that asks for the move fires — then a
    "no measurable gain" on a ladder closes the direction only after ``ladder_look_further`` more steps that way
    also gained nothing (one small rung, +0.8 % at sync 8 → 16, is not the top of a ladder whose best is 64).
    ``strong``: it is far above its line (``strong_above``) — a move sent back once on a verdict that could not tell
    is made once more (``_flat_once``); ``fires``: it fires at all — such a move is made once more later
    (``_reopened``)."""
    current = float(state.job.knobs[action.knob]["value"])
    way = 1 if new > current else -1
    for d in state.decisions:
        if d.knob != action.knob or d.new_value is None or d.old_value is None or remeasured(d):
            continue
        same_way = (d.new_value - d.old_value) * way > 0
        if d.outcome == REFUSED and same_way:
            if state.now_ms - verdict_ms(d) > rules.controller.retry_after_s * 1000:
                continue  # the clock runs from the verdict, not from when the change was decided
            # The job's knob owner said no; asking again the same way would only be refused again.
            reason = evidence_of(d).get("refused_reason")
            return f"the job refused {action.knob} → {d.new_value:g} at decision {d.id} ({reason or 'no reason'})"
        if d.outcome == ROLLED_BACK and float(d.new_value) == new and still_holds(state, rules, d, now):
            if (strong and _flat_once(state, d)) or _reopened(state, rules, d, fires):
                continue  # could not tell, and the rule still fires (strongly, or long after): once more
            return f"{action.knob}={new:g} was rolled back at decision {d.id}"
        if d.outcome == KEPT and result_of(d) == GAIN and float(d.old_value) == new \
                and still_holds(state, rules, d, now):
            return f"{action.knob}={new:g} measured worse than {d.new_value:g} at decision {d.id}"
        if d.outcome == KEPT and evidence_of(d).get("no_gain") and not evidence_of(d).get("unconfirmed_gain") \
                and same_way \
                and float(d.new_value) == current and still_holds(state, rules, d, now):
            if firing and _no_gain_rungs(state, d, way) <= rules.controller.ladder_look_further:
                continue  # the signal that asked for the move still fires: one rung further before giving up
            return f"the last move of {action.knob} this way (decision {d.id}) gained nothing measurable"
    return None


@dataclass(frozen=True)
class Bound:
    """A value of the knob measured worse than one on the current value's side of it: the best lies short of it."""
    value: float
    decision: StoredDecision
    sure: bool     # a confident verdict, not one that could not be told apart from noise
    moved_from: float  # the value the worse one was measured against


def bounds(state: "JobState", rules: RuleSet, knob: str, now: Optional[Sample]) -> tuple[Optional[Bound], Optional[Bound]]:
    """(below, above): the nearest values under and over the current one where the verdicts that still hold put an
    end to the search. For a curve with one peak, a value measured worse than another lies beyond the peak as seen
    from that other (a rolled-back move measured its new value worse, a kept gain its old one): the best lies
    short of it. A move that could not be told apart from noise (kept with no gain, or back to the known setting)
    says the top is flat between its two values: not worth searching (``sure`` False)."""
    current = float(state.job.knobs[knob]["value"])
    below: list[Bound] = []
    above: list[Bound] = []
    for d in state.decisions:
        if d.knob != knob or d.old_value is None or d.new_value is None or d.change_id is None or remeasured(d):
            continue
        old, new = float(d.old_value), float(d.new_value)
        ev = evidence_of(d)
        if d.outcome == ROLLED_BACK:
            worse, better, sure = new, old, not ev.get("back_to_known")
        elif d.outcome == KEPT and result_of(d) == GAIN:
            worse, better, sure = old, new, True
        elif d.outcome == KEPT and ev.get("no_gain") and ev.get("verdict"):
            # (an unconfirmed gain too: behind a ladder that goes on it bounds nothing ahead; in a bracket its old
            # value is a value tried, not one to step over — 23 → 19 kept, then 19 → 25 past 23 went back, worse)
            worse, better, sure = old, new, False
        else:
            continue
        if not still_holds(state, rules, d, now):
            continue
        bound = Bound(worse, d, sure=sure, moved_from=better)
        if worse > current and better < worse:
            above.append(bound)
        elif worse < current and better > worse:
            below.append(bound)
    return (max(below, key=lambda b: b.value, default=None), min(above, key=lambda b: b.value, default=None))


def _middle(a: float, b: float, action: Action, integer: bool) -> float:
    mid = math.sqrt(a * b) if action.op != "add" and a > 0 and b > 0 else (a + b) / 2.0
    return float(round(mid)) if integer else mid


def _between(a: float, b: float, action: Action, integer: bool, rules: RuleSet) -> tuple[Optional[float], str]:
    """The value to try between ``a`` and ``b``, or None and why not."""
    lo, hi = min(a, b), max(a, b)
    if lo > 0 and (hi / lo - 1.0) * 100.0 < rules.controller.bracket_min_gap_pct:
        return None, f"closer than {rules.controller.bracket_min_gap_pct:g} %, nothing left to try"
    mid = _middle(a, b, action, integer)
    if not lo < mid < hi:
        return None, "no value left between them"
    return mid, ""


def _top_side(state: "JobState", rules: RuleSet, action: Action, behind: float, current: float, ahead: float,
              now: Optional[Sample]) -> Optional[tuple[int, float]]:
    """Which side of the current value the top lies on (+1 ahead, −1 behind, in the action's direction) and where,
    from the parabola through the three measured levels (on the log scale for ×/÷ steps); None when the verdicts
    do not tie all three together."""
    points = _tied_points(state, rules, action, behind, current, ahead, now)
    top = None if points is None else _peak_between(points)
    if top is None:
        return None
    where = top if action.op == "add" else math.exp(top)
    return (1 if (where - current) * action.direction >= 0 else -1), where


def _flat_once(state: "JobState", d: StoredDecision) -> bool:
    """``d`` sent its move back on a verdict that could not tell (back to the known setting), and it is the only
    such verdict on that move: under a rule still far above its line, the move is made once more."""
    def flat(e: StoredDecision) -> bool:
        return e.outcome == ROLLED_BACK and bool(evidence_of(e).get("back_to_known")) and not remeasured(e)
    return flat(d) and sum(flat(e) and same_move(e, d) for e in state.decisions) == 1


def _untried_top(state: "JobState", rules: RuleSet, action: Action, flat: float, current: float, top: float,
                 integer: bool) -> Optional[float]:
    """The parabola's top between a flat rung ``flat`` (either side) and ``current`` (rounded for an integer knob)
    where it is more than ``bracket_min_gap_pct`` from both and no move of the knob went there yet (tried once: its
    verdict then ties it to the others); None otherwise, and on an additive step (prefetch +2: a few values, the
    middle is the search's own step; the noisy prefetch job tried 5 and 6 past its best, 4, that way). A non-monotone curve whose best (24) lay between a flat rung (19) and the
    current value (32) was never tried in 941 steps: "nothing left" ended the search at 0.80 of the grid."""
    if action.op == "add":
        return None
    value = float(round(top)) if integer else top
    gap = math.log1p(rules.controller.bracket_min_gap_pct / 100.0)
    lo, hi = min(flat, current), max(flat, current)
    if not lo < value < hi or value <= 0 or any(abs(math.log(value / v)) < gap for v in (lo, hi) if v > 0):
        return None
    tried = any(d.knob == action.knob and d.new_value is not None and float(d.new_value) == value
                and d.change_id is not None for d in state.decisions)
    return None if tried else value


def _reopened(state: "JobState", rules: RuleSet, d: StoredDecision, fires: bool) -> bool:
    """A flat top re-opened: ``d`` is the only verdict that sent its move back on a verdict that could not tell
    (``_flat_once``), the rule that asks for the move still fires, and ``retry_after_s`` has passed since the
    verdict: the move is measured once more. A two-rank job stood at sync 8 for 5 100 steps ("the top is flat
    there") with communication at 19.7 % of the step (act above 15): 0.69 of its best static (32)."""
    return fires and _flat_once(state, d) and state.now_ms - verdict_ms(d) >= rules.controller.retry_after_s * 1000


def bracket(state: "JobState", rules: RuleSet, action: Action, new: float, integer: bool,
            now: Optional[Sample], strong: bool = False,
            fires: bool = False) -> tuple[Optional[float], Union[str, dict, None]]:
    """The move after what the verdicts say (new None when nothing is left to try), with a note for the evidence
    (a dict: fields of it — the rollback a move re-applies, ``REAPPLIED``):

    * a step that would reach or pass a value measured worse goes to the middle between the current value and
      that one (geometric for ×/÷ steps) until they are less than ``bracket_min_gap_pct`` apart;
    * when values on both sides of the current one measured worse and the verdicts tie the three together, the
      parabola through their levels says on which side the top lies: the middle of that side is tried — the
      other side too, below the current value for a raise (a non-monotone curve's peak behind the last raise);
    * a value that could not be told apart from the current one (no measurable gain, or back to the known setting
      on a lower estimate) ends the search on that side: the top is flat at what this job's noise can measure —
      unless the rule is still far above its line (``strong``) and that move went back so once only (two stalls
      in one window read −59 … +44 % for a move worth +11 %): it is made once more; and once more, too, where the
      rule still fires ``retry_after_s`` after that verdict (``_reopened``)."""
    current = float(state.job.knobs[action.knob]["value"])
    below, above = bounds(state, rules, action.knob, now)
    ahead, behind = (above, below) if action.direction > 0 else (below, above)
    if ahead is None or (new - ahead.value) * action.direction < 0:
        again = host_slowed(state, rules, action.knob, current, new)
        return new, None if again is None else {REAPPLIED: again}  # the step stays short of any value measured worse
    waiting = known_unmeasured(state, rules, ahead.decision) if ahead.sure else None
    if waiting is not None:
        return None, f"waiting: {waiting}"
    if not ahead.sure:
        if strong and new == ahead.value and _flat_once(state, ahead.decision):
            return new, (f"{ahead.value:g} could not be told apart from {ahead.moved_from:g} (decision "
                         f"{ahead.decision.id}), but the signal is still far above its line: tried once more")
        if new == ahead.value and _reopened(state, rules, ahead.decision, fires):
            return new, (f"{ahead.value:g} could not be told apart from {ahead.moved_from:g} (decision "
                         f"{ahead.decision.id}), but the signal still fires "
                         f"{rules.controller.retry_after_s:g} s later: the flat top re-opened, tried once more")
        side = _top_side(state, rules, action, behind.value, current, ahead.value, now) \
            if behind is not None and ahead.moved_from == current else None
        peak = _untried_top(state, rules, action, current, ahead.value, side[1], integer) \
            if side is not None and side[0] > 0 else None
        if peak is not None:
            return peak, (f"bracket search, the top: the levels measured at {behind.value:g}, {current:g} and "
                          f"{ahead.value:g} put it near {side[1]:.3g}, where {ahead.value:g} could not be told apart "
                          f"from {current:g}: {peak:g}, not tried yet")
        return None, (f"{ahead.value:g} could not be told apart from {ahead.moved_from:g} (decision "
                      f"{ahead.decision.id}): the top is flat there, nothing left to try on that side")
    where = f"between {current:g} and {ahead.value:g} (measured worse at decision {ahead.decision.id})"
    forward, why = _between(current, ahead.value, action, integer, rules)
    # the three levels tied by the verdicts that hold, however they were measured (64 against 16, then 32 against
    # 16: the parabola puts the top near 25, behind 32 — not 45, the middle ahead, a second overshoot)
    side = _top_side(state, rules, action, behind.value, current, ahead.value, now) if behind is not None else None
    if side is not None and side[0] < 0:
        top = (f"the levels measured at {behind.value:g}, {current:g} and {ahead.value:g} (decisions "
               f"{behind.decision.id}, {ahead.decision.id}) put the top near {side[1]:.3g}")
        if not behind.sure:  # the other side was tried and found flat: the top is around here — or at the top itself
            peak = _untried_top(state, rules, action, behind.value, current, side[1], integer)
            if peak is not None:
                return peak, (f"bracket search, the top: {top}, where {behind.value:g} could not be told apart from "
                              f"{current:g}: {peak:g}, not tried yet")
            return None, f"{top}, where {behind.value:g} could not be told apart from {current:g}: nothing left to try"
        if current > 0 and side[1] > 0 and abs(math.log(current / side[1])) < math.log1p(
                rules.controller.bracket_min_gap_pct / 100.0):
            return None, (f"{top}, closer than {rules.controller.bracket_min_gap_pct:g} % to {current:g}: nothing "
                          f"left to try")
        back, why_not = _between(behind.value, current, action, integer, rules)
        if back is None:
            return None, f"{top}, between {behind.value:g} and {current:g}: {why_not}"
        near = _toward_top(back, current, side[1], integer, rules)
        small = _worth_a_move(state, rules, action, behind.value, current, ahead.value, near, now)
        if small is not None:
            return None, f"{top}: {small}"
        if near != back:
            return near, f"bracket search, the other side: {top}: {near:g} (the top, nearer than the middle {back:g})"
        return back, f"bracket search, the other side: {top}: {back:g}"
    if forward is None:
        return None, f"{where}: {why}"
    small = _worth_a_move(state, rules, action, None if behind is None else behind.value, current, ahead.value,
                          forward, now)
    if small is not None:
        return None, f"{where}: {small}"
    return forward, f"bracket search {where}: {forward:g}"


def _toward_top(middle: float, current: float, top: float, integer: bool, rules: RuleSet) -> float:
    """The parabola's ``top`` instead of the bracket's ``middle`` where it lies between the middle and the current
    value, more than ``bracket_min_gap_pct`` from the current one: the smaller step of the two towards the top (the
    noisy non-monotone curve: 16 and 64 measured worse than 32, the top near 24.6 — 25, where the middle is 23).
    A top beyond the middle stays the middle: a parabola through a curve that is not one can put it far off (4, 32
    and 64 put it at 16.5 where the best is 24)."""
    value = float(round(top)) if integer else top
    lo, hi = min(middle, current), max(middle, current)
    if not lo < value < hi or value <= 0 or current <= 0:
        return middle
    if abs(math.log(current / value)) < math.log1p(rules.controller.bracket_min_gap_pct / 100.0):
        return middle
    return value


def _gained(rule: Rule, d: StoredDecision) -> bool:
    """A kept gain, or — on a geometric ladder (×/÷), as ``blocked`` looks one rung further on one — a kept estimate
    above the dead band that the test could not confirm (an unconfirmed gain: the direction stays open). The noisy
    two-rank job read sync 8 → 16 +2.8 % (88 % sure; +11 % true): held as the end of the ladder, it stood at 94 %
    of sync 32 with communication still 11 % of the step. An additive step (prefetch +2) is not followed on one:
    the bursty queue went 4 → 6 → 8 that way."""
    if result_of(d) == GAIN:
        return True
    geometric = any(a.knob == d.knob and a.op in ("mul", "div") for a in rule.actions)
    return geometric and bool(evidence_of(d).get("unconfirmed_gain"))


def follows_through(state: "JobState", rule: Rule, reading: Reading) -> Optional[StoredDecision]:
    """The rule's last change when it may take one more step below its act line: the newest closed change of the
    job was this rule's, measured a gain (or an unconfirmed one), and the rule's signal is still above
    ``follow_above`` over the window and each half (the gain says the knob still pays; the next verdict that is not
    a gain ends it)."""
    if rule.follow_above is None or reading.value is None or reading.value <= rule.follow_above:
        return None
    if any(h is not None and h <= rule.follow_above for h in reading.detail.get("halves", [])):
        return None
    closed = [d for d in state.decisions if d.change_id is not None and d.outcome not in (PENDING, ADVISED)]
    last = closed[0] if closed else None
    if last is not None and remeasured(last) and last.rule == rule.name \
            and sum(remeasured(d) and same_move(d, last) for d in closed) == 1:
        # A move this follow-through made, sent back because its before window had not settled, is decided again
        # on a settled baseline (once: a second re-measure of it ends the follow-through). Else the rule, below
        # its act line at the old setting, would never ask again: the CPU pipeline stood at 64/0/1, 62–72 % of
        # the best static, after prefetch 0 → 2 read +28–30 % (100 % sure) on a before window still climbing.
        last = next((d for d in closed[1:] if not remeasured(d)), None)
    if last is None or last.rule != rule.name or last.outcome != KEPT or not _gained(rule, last):
        return None
    if last.knob not in state.job.knobs or float(state.job.knobs[last.knob]["value"]) != float(last.new_value):
        return None
    return last
