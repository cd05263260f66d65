"""What the job's past verdicts say about the next move: which moves are blocked (a rolled-back value, a direction
that gained nothing, a refused direction), where the best value of a knob lies (between the values measured worse
on either side: the bracket search, upward and downward), and when a rule follows a gain through below its line.

A verdict is about the setting it left the job in. It stops holding — the move may be measured again — when
another knob has moved since, or when the job is at that very setting and its throughput there has moved by more
than the verdict's effect and the job itself with it (its phase shares or tokens per sample, composition.py: a new
phase of training, lengths that grew; not a host that slows every step alike — for a verdict that was sure), or —
for a move rolled back — when the known setting, measured again, reads no higher than the move did (the job slowed
down while the move was measured: the loss was the job's). While the job is elsewhere on the same knob the verdict
still holds: nothing re-measured it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

from trimtab.contract.statuses import ADVISED, APPLIED, KEPT, PENDING, REFUSED, ROLLED_BACK
from trimtab.grading.rules import Action, Rule, RuleSet
from trimtab.grading.signals import Reading
from trimtab.control.plan import before_window, last_applied, period
from trimtab.control.composition import composition, moved as composition_moved
from trimtab.control.settle import drained_from, settled_from
from trimtab.control.verdict import GAIN, WORSE, Sample, _standard_error, _t_ppf, changed_level
from trimtab.store.decisions import StoredDecision

if TYPE_CHECKING:
    from trimtab.control.plan import JobState


def _evidence(d: StoredDecision) -> dict:
    return d.evidence if isinstance(d.evidence, dict) else {}


def verdict_ms(d: StoredDecision) -> int:
    return _evidence(d).get("verdict_ms", d.ts_ms)


def result_of(d: StoredDecision) -> Optional[str]:
    verdict = _evidence(d).get("verdict")
    return verdict.get("result") if isinstance(verdict, dict) else None


def left_at(d: StoredDecision) -> dict[str, float]:
    """The knobs as the verdict left them: the decision's knob at its old value (rolled back) or its new one."""
    knobs = {k: float(v) for k, v in (_evidence(d).get("knobs") or {}).items() if isinstance(v, (int, float))}
    knobs[d.knob] = float(d.old_value if d.outcome == ROLLED_BACK else d.new_value)
    return knobs


def remeasured(d: StoredDecision) -> bool:
    """A change rolled back unjudged (its before window had not settled): it says nothing about either value."""
    return bool(_evidence(d).get("remeasure"))


def still_holds(state: "JobState", rules: RuleSet, d: StoredDecision, now: Optional[Sample]) -> bool:
    """See the module docstring. A verdict holds until the job's level at its setting moved by more than the
    effect it measured (at least the dead band), surely: a job that drifted 3 % does not make a value measured
    34 % worse worth another try, nor re-open a bracket that said nothing is left on a side."""
    current = {k: float(v["value"]) for k, v in state.job.knobs.items()}
    then = left_at(d)
    if any(k != d.knob and k in current and current[k] != v for k, v in then.items()):
        return False  # another knob moved since: a different job now
    if current.get(d.knob) != then[d.knob]:
        return True
    ev = _evidence(d)
    level = Sample.from_evidence(ev.get("before_sample") if d.outcome == ROLLED_BACK else ev.get("after_sample"))
    if d.outcome == ROLLED_BACK and _drift_explains(state, rules, d):
        return False
    if not changed_level(level, now, rules.controller):
        return True
    ratio = (ev.get("verdict") or {}).get("ratio")
    if isinstance(ratio, (int, float)) and ratio > 0 and level is not None and now is not None:
        # moved by more than the effect the verdict measured (at least the dead band: a "flat" verdict that ended
        # a bracket is honoured too): the whole 95 % interval of the level's shift lies beyond it — a noisy
        # window reads a few % off by itself
        effect = max(abs(math.log(ratio)), math.log1p(rules.controller.dead_band_pct / 100.0))
        if not moved_beyond(level, now, effect, rules.controller):
            return True
        # … and, for a value measured worse with confidence (a sure loss, or the old value of a sure gain), the job
        # itself with it, not only its host (composition.py). A verdict that could not tell is re-measured on the
        # level alone: its windows may have straddled the host's own move (the drifting host: a +11 % sync move read
        # +1.8 % across a 15 % slowdown and went back; held until the job moved, it was never tried again)
        then = ev.get("composition_before" if d.outcome == ROLLED_BACK else "composition_after")
        if result_of(d) not in (GAIN, WORSE) or not isinstance(then, dict):
            return False
        return composition_moved(then, composition(_at_setting(state, rules)), effect, rules.controller) is None
    return False


def _at_setting(state: "JobState", rules: RuleSet) -> list:
    """The job's newest steps at its setting now (after the last change's settle steps), a before window's worth."""
    last = last_applied(state)
    start = settled_from(last, rules) if last is not None else 0
    return before_window([s for s in state.steps if s.step >= start], rules, period(state.job, rules))


def _drift_explains(state: "JobState", rules: RuleSet, d: StoredDecision) -> bool:
    """A, B, A′: a move rolled back on a loss beyond the dead band (sure or not: a lower estimate it could not
    tell from noise too) whose known setting, measured again since the job came back to it (every step at it since
    the move's own rollback, ``_at_known``, at least as many periods as that before window had: a few steps of a
    slow regime are not a drift), reads no higher than the move itself had measured and surely lower than before
    (``drift_sure_pct``): the job slowed by itself while the move was measured (a host that drifts, a
    neighbour that arrived), so the loss was the drift's, not the move's (the H200 pipeline: sync 1 → 4 read −10 %
    while sync 1 itself then read −11 %). A real loss stays: the known setting reads above the move again, or no
    surer lower than noise makes it. Released ``drift_retries`` times per move: the next rollback of the same move
    holds, so a move that is truly a little worse is not tried over and over."""
    ctl = rules.controller
    back = _rollback_of(state, d)
    after = Sample.from_evidence(_evidence(d).get("after_sample"))
    known = Sample.from_evidence(_evidence(d).get("before_sample"))
    ratio = (_evidence(d).get("verdict") or {}).get("ratio")
    if back is None or after is None or known is None or not isinstance(ratio, (int, float)) \
            or ratio > 1.0 - ctl.dead_band_pct / 100.0:
        return False  # a flat verdict claims no loss to explain: it stops holding only once the job surely moved
    same = [e for e in state.decisions if e.knob == d.knob and e.outcome == ROLLED_BACK and not remeasured(e)
            and e.old_value == d.old_value and e.new_value == d.new_value]
    if len(same) > ctl.drift_retries:
        return False
    every = period(state.job, rules)
    again = state.persistence.sample(_at_known(state, rules, d, back), every)
    return again is not None and again.n >= known.n and again.mean_log <= min(after.mean_log, known.mean_log) \
        and changed_level(known, again, ctl, drift_sure_pct(d, ctl))


def _rollback_of(state: "JobState", d: StoredDecision):
    """The change that took the job back from ``d``'s move (``d.new_value`` → ``d.old_value``, applied): the first
    after the move where its step is known, else the latest."""
    backs = [c for c in state.changes if c.status == APPLIED and c.knob == d.knob and c.applied_step is not None
             and c.value is not None and c.previous_value is not None and float(c.value) == float(d.old_value)
             and float(c.previous_value) == float(d.new_value)]
    if d.applied_step is None:
        return max(backs, key=lambda c: c.applied_step, default=None)
    return min((c for c in backs if c.applied_step > d.applied_step), key=lambda c: c.applied_step, default=None)


def _at_known(state: "JobState", rules: RuleSet, d: StoredDecision, back) -> list:
    """A′: every step the job ran at ``d``'s known setting since the move's own rollback ``back`` (past each change's
    settle steps; not the trials made since): a drift lasts, so it shows in all of them, while a slow spell of a host
    that shifts in regimes long after the move is one stretch among them."""
    moves = sorted((c for c in state.changes if c.status == APPLIED and c.knob == d.knob and c.applied_step is not None
                    and c.applied_step >= back.applied_step), key=lambda c: c.applied_step)
    out = []
    for c, nxt in zip(moves, moves[1:] + [None]):
        if c.value is None or float(c.value) != float(d.old_value):
            continue
        start = drained_from(c, rules, d.knob)
        out += [s for s in state.steps if s.step >= start and (nxt is None or s.step < nxt.applied_step)]
    return out


def drift_sure_pct(d: StoredDecision, ctl) -> float:
    """How surely the known setting must read lower than before for the drift to explain ``d``'s loss: as surely
    as the loss itself was measured, at least ``drift_confidence_pct``, at most ``remeasure_confidence_pct``. A
    drift need not be surer than the loss it explains: on the H200 (run 17) sync 1 → 4 went back on a −8 % read
    90 % sure, and sync 1 itself then read 72–75 samples/s against 84 before, steadily — yet 99 % sure only at
    4 of the 120 steps it was replayed at (a short before window of 8 steps), and the job stood at the 12 % slower
    setting all that while."""
    loss = (_evidence(d).get("verdict") or {}).get("confidence_pct")
    if not isinstance(loss, (int, float)):
        return ctl.remeasure_confidence_pct
    return min(ctl.remeasure_confidence_pct, max(ctl.drift_confidence_pct, float(loss)))


def _no_gain_rungs(state: "JobState", d: StoredDecision, way: int) -> int:
    """How many moves in a row this way, ending with ``d``, were kept with no measurable gain."""
    n, at = 0, d
    while at is not None:
        ev = _evidence(at)
        if not (at.outcome == KEPT and ev.get("no_gain") and not ev.get("unconfirmed_gain")
                and (at.new_value - at.old_value) * way > 0):
            break
        n += 1
        at = next((e for e in state.decisions if e.knob == at.knob and e.id != at.id and e.new_value is not None
                   and e.old_value is not None and float(e.new_value) == float(at.old_value)
                   and e.outcome == KEPT), None)
    return n


def moved_beyond(then: Sample, now: Sample, effect_log: float, ctl) -> bool:
    """The level moved by more than ``effect_log`` (log scale): the whole interval of the shift, at
    ``remeasure_confidence_pct``, lies beyond it. A short window's spread is a guess (4 steps can read 5× too
    calm): each side gets the larger of the two."""
    spread = max((v for v in (then.var_log, now.var_log) if v is not None), default=None)
    a, b = replace(then, var_log=spread), replace(now, var_log=spread)
    se, df, _ = _standard_error(a, b, ctl)
    half = _t_ppf(1.0 - (1.0 - ctl.remeasure_confidence_pct / 100.0) / 2.0, df) * se
    return abs(now.mean_log - then.mean_log) - half > effect_log


def blocked(state: "JobState", rules: RuleSet, action: Action, new: float, now: Optional[Sample],
            firing: bool = False) -> Optional[str]:
    """Why this move may not be tried now (a value measured worse, or a no-gain direction, whose verdict still
    holds; a recently refused direction), else None. ``firing``: the rule that asks for the move fires — then a
    "no measurable gain" on a ladder closes the direction only after ``ladder_look_further`` more steps that way
    also gained nothing (one small rung, +0.8 % at sync 8 → 16, is not the top of a ladder whose best is 64)."""
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
            reason = _evidence(d).get("refused_reason")
            return f"the job refused {action.knob} → {d.new_value:g} at decision {d.id} ({reason or 'no reason'})"
        if d.outcome == ROLLED_BACK and float(d.new_value) == new and still_holds(state, rules, d, now):
            return f"{action.knob}={new:g} was rolled back at decision {d.id}"
        if d.outcome == KEPT and result_of(d) == GAIN and float(d.old_value) == new \
                and still_holds(state, rules, d, now):
            return f"{action.knob}={new:g} measured worse than {d.new_value:g} at decision {d.id}"
        if d.outcome == KEPT and _evidence(d).get("no_gain") and not _evidence(d).get("unconfirmed_gain") \
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
        ev = _evidence(d)
        if d.outcome == ROLLED_BACK:
            worse, better, sure = new, old, not ev.get("back_to_known")
        elif d.outcome == KEPT and result_of(d) == GAIN:
            worse, better, sure = old, new, True
        elif d.outcome == KEPT and ev.get("no_gain") and ev.get("verdict") and not ev.get("unconfirmed_gain"):
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


def _levels(state: "JobState", rules: RuleSet, knob: str, now: Optional[Sample]) -> dict[float, float]:
    """The knob's values whose throughput the verdicts that still hold tie to the current value's, as log ratios
    to it (0 for the current value): each verdict measured new/old side by side, and ratios chain."""
    edges: dict[float, list[tuple[float, float]]] = {}
    for d in state.decisions:  # newest first: the first verdict on a pair is the one that counts
        ratio = (_evidence(d).get("verdict") or {}).get("ratio") if d.knob == knob else None
        if not isinstance(ratio, (int, float)) or ratio <= 0 or d.old_value is None or d.new_value is None:
            continue
        if d.outcome not in (KEPT, ROLLED_BACK) or remeasured(d) or not still_holds(state, rules, d, now):
            continue
        old, new, log_ratio = float(d.old_value), float(d.new_value), math.log(ratio)
        edges.setdefault(old, []).append((new, log_ratio))
        edges.setdefault(new, []).append((old, -log_ratio))
    levels = {float(state.job.knobs[knob]["value"]): 0.0}
    queue = list(levels)
    while queue:
        at = queue.pop(0)
        for other, log_ratio in edges.get(at, []):
            if other not in levels:
                levels[other] = levels[at] + log_ratio
                queue.append(other)
    return levels


def _peak_between(points: list[tuple[float, float]]) -> Optional[float]:
    """The top of the parabola through three (x, level) points, the middle one highest; None if they do not bend
    down."""
    (a, fa), (b, fb), (c, fc) = points
    num = (b - a) ** 2 * (fb - fc) - (b - c) ** 2 * (fb - fa)
    den = (b - a) * (fb - fc) - (b - c) * (fb - fa)
    return None if den <= 0 else b - 0.5 * num / den


def _top_side(state: "JobState", rules: RuleSet, action: Action, behind: float, current: float, ahead: float,
              now: Optional[Sample]) -> Optional[tuple[int, float]]:
    """Which side of the current value the top lies on (+1 ahead, −1 behind, in the action's direction) and where,
    from the parabola through the three measured levels (on the log scale for ×/÷ steps); None when the verdicts
    do not tie all three together."""
    levels = _levels(state, rules, action.knob, now)
    if behind not in levels or ahead not in levels or min(behind, current, ahead) <= 0 and action.op != "add":
        return None
    scale = (lambda v: v) if action.op == "add" else math.log
    xs = sorted((behind, current, ahead))
    top = _peak_between([(scale(x), levels[x]) for x in xs])
    if top is None:
        return None
    where = top if action.op == "add" else math.exp(top)
    return (1 if (where - current) * action.direction >= 0 else -1), where


def bracket(state: "JobState", rules: RuleSet, action: Action, new: float, integer: bool,
            now: Optional[Sample]) -> tuple[Optional[float], Optional[str]]:
    """The move after what the verdicts say (new None when nothing is left to try), with a note for the evidence:

    * a step that would reach or pass a value measured worse goes to the middle between the current value and
      that one (geometric for ×/÷ steps) until they are less than ``bracket_min_gap_pct`` apart;
    * when values on both sides of the current one measured worse and the verdicts tie the three together, the
      parabola through their levels says on which side the top lies: the middle of that side is tried — the
      other side too, below the current value for a raise (a non-monotone curve's peak behind the last raise);
    * a value that could not be told apart from the current one (no measurable gain, or back to the known setting
      on a lower estimate) ends the search on that side: the top is flat at what this job's noise can measure."""
    current = float(state.job.knobs[action.knob]["value"])
    below, above = bounds(state, rules, action.knob, now)
    ahead, behind = (above, below) if action.direction > 0 else (below, above)
    if ahead is None or (new - ahead.value) * action.direction < 0:
        return new, None  # the step stays short of any value measured worse
    if not ahead.sure:
        return None, (f"{ahead.value:g} could not be told apart from {ahead.moved_from:g} (decision "
                      f"{ahead.decision.id}): the top is flat there, nothing left to try on that side")
    where = f"between {current:g} and {ahead.value:g} (measured worse at decision {ahead.decision.id})"
    forward, why = _between(current, ahead.value, action, integer, rules)
    side = _top_side(state, rules, action, behind.value, current, ahead.value, now) \
        if behind is not None and ahead.moved_from == current else None
    if side is not None and side[0] < 0:
        top = (f"the levels measured at {behind.value:g}, {current:g} and {ahead.value:g} (decisions "
               f"{behind.decision.id}, {ahead.decision.id}) put the top near {side[1]:.3g}")
        if not behind.sure:  # the other side was tried and found flat: the top is around here
            return None, f"{top}, where {behind.value:g} could not be told apart from {current:g}: nothing left to try"
        if current > 0 and side[1] > 0 and abs(math.log(current / side[1])) < math.log1p(
                rules.controller.bracket_min_gap_pct / 100.0):
            return None, (f"{top}, closer than {rules.controller.bracket_min_gap_pct:g} % to {current:g}: nothing "
                          f"left to try")
        back, why_not = _between(behind.value, current, action, integer, rules)
        if back is None:
            return None, f"{top}, between {behind.value:g} and {current:g}: {why_not}"
        return back, f"bracket search, the other side: {top}: {back:g}"
    if forward is None:
        return None, f"{where}: {why}"
    return forward, f"bracket search {where}: {forward:g}"


def _same_move(a: StoredDecision, b: StoredDecision) -> bool:
    return a.knob == b.knob and a.old_value == b.old_value and a.new_value == b.new_value


def follows_through(state: "JobState", rule: Rule, reading: Reading) -> Optional[StoredDecision]:
    """The rule's last change when it may take one more step below its act line: the newest closed change of the
    job was this rule's, measured a gain, and the rule's signal is still above ``follow_above`` over the window and
    each half (the gain says the knob still pays; the next verdict that is not a gain ends it)."""
    if rule.follow_above is None or reading.value is None or reading.value <= rule.follow_above:
        return None
    if any(h is not None and h <= rule.follow_above for h in reading.detail.get("halves", [])):
        return None
    closed = [d for d in state.decisions if d.change_id is not None and d.outcome not in (PENDING, ADVISED)]
    last = closed[0] if closed else None
    if last is not None and remeasured(last) and last.rule == rule.name \
            and sum(remeasured(d) and _same_move(d, last) for d in closed) == 1:
        # A move this follow-through made, sent back because its before window had not settled, is decided again
        # on a settled baseline (once: a second re-measure of it ends the follow-through). Else the rule, below
        # its act line at the old setting, would never ask again: the CPU pipeline stood at 64/0/1, 62–72 % of
        # the best static, after prefetch 0 → 2 read +28–30 % (100 % sure) on a before window still climbing.
        last = next((d for d in closed[1:] if not remeasured(d)), None)
    if last is None or last.rule != rule.name or last.outcome != KEPT or result_of(last) != GAIN:
        return None
    if last.knob not in state.job.knobs or float(state.job.knobs[last.knob]["value"]) != float(last.new_value):
        return None
    return last
