"""Whether a past verdict still holds: what the controller remembers of a move it measured.

A verdict is about the setting it left the job in. It stops holding — the move may be measured again — when
another knob has moved since, or when the job is at that very setting and its throughput there has moved by more
than the verdict's effect and the job itself with it (its phase shares or tokens per sample, composition.py: a new
phase of training, lengths that grew; not a host that slows every step alike — for a verdict that was sure), or —
for a move rolled back — when the known setting, measured again, reads no higher than the move did (the job slowed
down while the move was measured: the loss was the job's; A, B, A′). While the job is elsewhere on the same knob the
verdict still holds: nothing re-measured it. Until the known setting has been measured again after a move sent back
on a loss (A′), the search waits (``known_unmeasured``): a host that slowed as the move landed is then told from the
move. ``bracket.py`` reads it for where the next move may go.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from trimtab.contract.statuses import APPLIED, ROLLED_BACK
from trimtab.grading.rules import RuleSet
from trimtab.control.plan import before_window, last_applied, period
from trimtab.control.composition import composition, moved as composition_moved
from trimtab.control.settle import drained_from, settled_from
from trimtab.control.verdict import GAIN, WORSE, Sample, _standard_error, _t_ppf, changed_level
from trimtab.store.decisions import StoredDecision

if TYPE_CHECKING:
    from trimtab.control.plan import JobState


def evidence_of(d: StoredDecision) -> dict:
    return d.evidence if isinstance(d.evidence, dict) else {}


def verdict_ms(d: StoredDecision) -> int:
    return evidence_of(d).get("verdict_ms", d.ts_ms)


def result_of(d: StoredDecision) -> Optional[str]:
    verdict = evidence_of(d).get("verdict")
    return verdict.get("result") if isinstance(verdict, dict) else None


def left_at(d: StoredDecision) -> dict[str, float]:
    """The knobs as the verdict left them: the decision's knob at its old value (rolled back) or its new one."""
    knobs = {k: float(v) for k, v in (evidence_of(d).get("knobs") or {}).items() if isinstance(v, (int, float))}
    knobs[d.knob] = float(d.old_value if d.outcome == ROLLED_BACK else d.new_value)
    return knobs


def remeasured(d: StoredDecision) -> bool:
    """A change rolled back unjudged (its before window had not settled): it says nothing about either value."""
    return bool(evidence_of(d).get("remeasure"))


def other_knob_moved(state: "JobState", d: StoredDecision) -> bool:
    """Another knob of the job moved since ``d``'s verdict: a different job now (its levels; the curve's shape of
    ``d``'s knob may still be the same)."""
    current = {k: float(v["value"]) for k, v in state.job.knobs.items()}
    return any(k != d.knob and k in current and current[k] != v for k, v in left_at(d).items())


def still_holds(state: "JobState", rules: RuleSet, d: StoredDecision, now: Optional[Sample]) -> bool:
    """See the module docstring. A verdict holds until the job's level at its setting moved by more than the
    effect it measured (at least the dead band), surely: a job that drifted 3 % does not make a value measured
    34 % worse worth another try, nor re-open a bracket that said nothing is left on a side."""
    current = {k: float(v["value"]) for k, v in state.job.knobs.items()}
    then = left_at(d)
    if other_knob_moved(state, d):
        return False  # another knob moved since: a different job now
    if current.get(d.knob) != then[d.knob]:
        return True
    ev = evidence_of(d)
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
    return before_window([s for s in state.steps if s.step >= start], rules, period(state.job, rules, state.steps))


def same_move(a: StoredDecision, b: StoredDecision) -> bool:
    return a.knob == b.knob and a.old_value == b.old_value and a.new_value == b.new_value


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
    after = Sample.from_evidence(evidence_of(d).get("after_sample"))
    known = Sample.from_evidence(evidence_of(d).get("before_sample"))
    ratio = (evidence_of(d).get("verdict") or {}).get("ratio")
    if back is None or after is None or known is None or not isinstance(ratio, (int, float)) \
            or ratio > 1.0 - ctl.dead_band_pct / 100.0:
        return False  # a flat verdict claims no loss to explain: it stops holding only once the job surely moved
    same = [e for e in state.decisions if e.outcome == ROLLED_BACK and not remeasured(e) and same_move(e, d)]
    if len(same) > ctl.drift_retries:
        return False
    every = period(state.job, rules, state.steps)
    again = state.persistence.sample(_at_known(state, rules, d, back), every)
    return again is not None and again.n >= known.n and again.mean_log <= min(after.mean_log, known.mean_log) \
        and changed_level(known, again, ctl, drift_sure_pct(d, ctl))


def host_slowed(state: "JobState", rules: RuleSet, knob: str, current: float, new: float) -> Optional[dict]:
    """What a move of ``knob`` from ``current`` to ``new`` re-applies, for the decision's evidence: the newest move
    the same way rolled back on a loss that the known setting, measured again since, shows was the job's (or its
    host's) own slowdown (``_drift_explains``: A, B, A′) — the move goes again, and that rollback was a measurement
    of the known setting, not a flip-flop of the knob. None when no such rollback is behind the move."""
    for d in state.decisions:  # newest first
        if d.knob != knob or d.outcome != ROLLED_BACK or remeasured(d) or d.old_value is None \
                or d.new_value is None or float(d.old_value) != current or float(d.new_value) != new:
            continue
        if not _drift_explains(state, rules, d):
            return None
        return {"decision": d.id, "why": f"{knob}={current:g} read slower since decision {d.id}'s rollback too: the "
                                          f"loss measured then was the host's slowdown, not the move's"}
    return None


def known_unmeasured(state: "JobState", rules: RuleSet, d: StoredDecision) -> Optional[str]:
    """Why a search move past ``d`` waits, else None: ``d`` sent its move back on a loss beyond the dead band
    that ``_drift_explains`` could still explain (retries left), the job stands at the known setting it went back
    to with no other knob moved, and that setting has not yet been measured again over as many periods as ``d``'s
    before window had (A′ incomplete). A host that slowed ×1.3 at the step a good move landed (prefetch 0 → 2,
    +18 % true) read −9 % sure; moving on at once (0 → 1, the middle) left the job at 1 with 2 still "measured
    worse": 76 % of the best static. A′ first tells the host's slowdown from the move's loss."""
    ctl = rules.controller
    ratio = (evidence_of(d).get("verdict") or {}).get("ratio")
    known = Sample.from_evidence(evidence_of(d).get("before_sample"))
    if d.outcome != ROLLED_BACK or remeasured(d) or known is None or not isinstance(ratio, (int, float)) \
            or ratio > 1.0 - ctl.dead_band_pct / 100.0 or ctl.drift_retries <= 0:
        return None
    if sum(e.outcome == ROLLED_BACK and not remeasured(e) and same_move(e, d) for e in state.decisions) \
            > ctl.drift_retries:
        return None
    current = {k: float(v["value"]) for k, v in state.job.knobs.items()}
    if any(current.get(k) != v for k, v in left_at(d).items() if k in current):
        return None  # elsewhere now: the known setting is not being re-measured
    back = _rollback_of(state, d)
    if back is None or back.applied_step is None:
        return None
    again = state.persistence.sample(_at_known(state, rules, d, back), period(state.job, rules, state.steps))
    periods = 0 if again is None else again.n
    if periods >= known.n:
        return None
    return (f"{d.knob}={d.old_value:g} is being measured again since decision {d.id}'s rollback ({periods} of "
            f"{known.n} periods): a slowdown of the host from then on would be read there too (A, B, A′)")


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
    loss = (evidence_of(d).get("verdict") or {}).get("confidence_pct")
    if not isinstance(loss, (int, float)):
        return ctl.remeasure_confidence_pct
    return min(ctl.remeasure_confidence_pct, max(ctl.drift_confidence_pct, float(loss)))


def moved_beyond(then: Sample, now: Sample, effect_log: float, ctl) -> bool:
    """The level moved by more than ``effect_log`` (log scale): the whole interval of the shift, at
    ``remeasure_confidence_pct``, lies beyond it. A short window's spread is a guess (4 steps can read 5× too
    calm): each side gets the larger of the two."""
    spread = max((v for v in (then.var_log, now.var_log) if v is not None), default=None)
    a, b = replace(then, var_log=spread), replace(now, var_log=spread)
    se, df, _ = _standard_error(a, b, ctl)
    half = _t_ppf(1.0 - (1.0 - ctl.remeasure_confidence_pct / 100.0) / 2.0, df) * se
    return abs(now.mean_log - then.mean_log) - half > effect_log
