"""The change in flight: close its decision when the job refused it or it was replaced, wait while the job has not
applied it, then judge it — a t-test on the per-period throughputs of the windows before and after it (past the
settle steps), the after window lengthened while the test cannot tell — and keep it or go back.

Kept: a gain the test is sure of, or a change it could not tell from noise whose estimate is above the dead band
(an unconfirmed gain: kept, and the next move that way is judged on its own). Rolled back: a loss it is sure of,
and — the old setting being the one known to be good — a change it could not tell from noise (or measured within
the dead band) that is not above the dead band: the top is flat between the two, the search ends there. A before window whose
older half measured surely differently from its newer half (a slowdown began inside it) is cut to the newer half. A gain that the before window's own trend could explain (the tail of a warm-up: it climbed by at least half as
much) is re-measured — rolled back unjudged — not kept. Where the job's lengths drift, every step is read at the
length of the setting the change left (``drift.py``): what the job would have done without the change. A prefetch
raise read as a gain surely larger than hiding the step's rest behind generation could bring is the host's
(``overlap_bound.py``): re-measured.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Optional

from trimtab.contract.statuses import APPLIED, CANCELLED, KEPT, REFUSED, ROLLED_BACK, SUPERSEDED
from trimtab.control import memory_follow
from trimtab.control.bracket import REAPPLIED
from trimtab.control.holds import remeasured, same_move
from trimtab.control.overlap_bound import beyond_overlap
from trimtab.control.cadence import with_cadence
from trimtab.control.composition import composition
from trimtab.control.drain import drain_only, drain_read
from trimtab.control.drift import at_equal_length
from trimtab.control.lost_steps import lost_note, lost_steps, measured_throughput
from trimtab.control.memory_fit import GIB
from trimtab.control.persistence import Persistence, persistence
from trimtab.control.queue_use import own_verdict_from
from trimtab.control.settle import drained_from
from trimtab.control.plan import (JobState, Plan, Wait, before_window, leading, period, wait_to_cover,
                                  window_evidence, window_wait)
from trimtab.grading.rules import RuleSet
from trimtab.grading.signals import JobContext, job_reading
from trimtab.control.verdict import (GAIN, INCONCLUSIVE, WORSE, Trend, changed_level, compare, gain_within_trend,
                                     past_a_short_trend, unsettled)
from trimtab.grading.window import JobStep, as_period
from trimtab.store.changes import StoredChange, number
from trimtab.store.decisions import StoredDecision


def _at_old_setting(state: JobState, rules: RuleSet, change: StoredChange) -> list[JobStep]:
    """The steps before a change at the setting it changed: after the previous change's settle steps (and its
    drain, settle.py)."""
    earlier = [c for c in state.changes if c.status == APPLIED and c.applied_step is not None
               and c.applied_step < change.applied_step]
    start = drained_from(max(earlier, key=lambda c: c.applied_step), rules, change.knob) if earlier else 0
    return [s for s in state.steps if start <= s.step < change.applied_step]


def _before_steps(state: JobState, rules: RuleSet, change: StoredChange) -> list[JobStep]:
    """The newest steps at the setting a change left covering ``verdict_before_s`` (in whole periods of the old
    sync interval)."""
    every = _old_period(state, rules, change)
    candidates = _at_old_setting(state, rules, change)
    return _since_level_shift(before_window(candidates, rules, every), every, rules, state.persistence)


def _since_level_shift(before: list[JobStep], every: int, rules: RuleSet, kept: Persistence) -> list[JobStep]:
    """The before window's newer half alone when its older half measured surely differently (a slowdown that
    began inside it): else the slowdown would be charged to the change."""
    periods = len(before) // every
    if periods < 8:  # halves of fewer than 4 periods cannot show a shift: their spreads are guesses
        return before
    mid = (periods // 2) * every
    older, newer = kept.sample(before[:mid], every), kept.sample(before[mid:], every)
    return before[mid:] if changed_level(older, newer, rules.controller) else before


def _ladder_goes_on(state: JobState, rules: RuleSet, open_d: StoredDecision, change: StoredChange,
                    grown: list[JobStep], every: int, v) -> Optional[str]:
    """Why a rung of a geometric ladder need not be measured to the end: its estimate is not lower, over two
    periods at least, while the signal that asked for it still fires strongly (above the rule's ``strong_above``
    over the after window and each half) — the cause is still there: the next rung is tried rather than 6 periods
    spent telling +1.5 % from +2 % (or +2.1 % from noise: on the bench's ladder, seeds 33 and 46, a rung read just
    above the dead band was measured to its longest window, 64 steps at sync 16, and the best came at step 88).
    None otherwise."""
    rule = next((r for r in rules.rules if r.name == open_d.rule), None)
    if rule is None or rule.scope != "job" or rule.strong_above is None or v.n_after < 2:
        return None
    if not any(a.knob == change.knob and a.op in ("mul", "div") for a in rule.actions):
        return None
    if v.ratio < 1.0:
        return None
    reading = job_reading(rule, grown, JobContext(all_steps=state.steps, probe_baseline_us=state.probe_baseline_us,
                                                  period=every))
    halves = reading.detail.get("halves", [])
    if not reading.fires or reading.value is None or reading.value <= rule.strong_above \
            or any(h is not None and h <= rule.strong_above for h in halves):
        return None
    return (f"{rule.signal} still {reading.value:.1f} {rule.unit} (> {rule.strong_above:g} over the window and each "
            f"half): the ladder goes on")


def _explained_by_trend(before: list[JobStep], every: int, ratio: float, rules: RuleSet) -> Optional[Trend]:
    """The before window's trend when it could explain the verdict: sure at the verdicts' ``confidence_pct`` (a
    change was decided on it only if it looked settled at the stricter ``settled_confidence_pct``), the same way
    as the measured change, and — continued for another window — at least as large (a +3 % "gain" on the tail of a
    warm-up; never a +200 % one). A warm-up still climbing steeply when the change came; the flatter end of one,
    whose trend this test is not sure of, is :func:`trimtab.control.verdict.gain_within_trend`'s."""
    if not before or ratio <= 0:
        return None
    trend = unsettled(before, every, rules.controller, rules.controller.confidence_pct)
    if trend is None or trend.change_pct * (ratio - 1.0) <= 0:
        return None
    return trend if abs(math.log(ratio)) <= 2.0 * abs(math.log1p(trend.change_pct / 100.0)) else None


def _first_move(state: JobState, change: StoredChange) -> bool:
    """No change took effect before this one: its before window is the job's first baseline, the one a warm-up's
    tail may still be in (later baselines come after a verdict, long after any warm-up; a re-measured first move is
    judged the plain way the second time, so a real small gain costs one re-measure, not one each time)."""
    return not any(c.id != change.id and c.status == APPLIED and c.applied_step is not None
                   and c.applied_step < change.applied_step for c in state.changes)


def _old_period(state: JobState, rules: RuleSet, change: StoredChange) -> int:
    if change.knob == rules.controller.period_knob and change.previous_value:
        return with_cadence(as_period(change.previous_value), state.steps)
    return period(state.job, rules, state.steps)


def _within_bounds(spec: dict, value: Optional[float]) -> Optional[float]:
    """``value`` clamped to the knob's current [min, max]: a rollback never leaves what the job declares now."""
    if value is None:
        return None
    return number(max(float(spec["min"]), min(float(spec["max"]), float(value))))


def _after_bound(rules: RuleSet, every: int, after_steps: list[JobStep]) -> tuple[int, float]:
    """How far the after window may grow while the test cannot tell: ``verdict_max_after_s`` and
    ``verdict_max_after_periods`` whole periods (enough samples at a long sync interval), but no more than
    ``verdict_max_after_cap_s`` of step time."""
    ctl = rules.controller
    # Long periods of fast steps: 6 periods of 16 steps are 96 steps: at most verdict_enough_steps (whole periods,
    # two at least) once those hold verdict_max_after_s.
    steps = max(ctl.window_min_steps, ctl.verdict_max_after_periods * every)
    covered_s = sum(s.step_time_s for s in after_steps[:_whole(max(ctl.verdict_enough_steps, 2 * every), every)])
    if covered_s >= ctl.verdict_max_after_s:
        steps = min(steps, _whole(max(ctl.verdict_enough_steps, 2 * every), every))
    covered = 0.0
    for i, s in enumerate(after_steps):
        covered += s.step_time_s
        if covered >= ctl.verdict_max_after_cap_s and (i + 1) % every == 0:
            steps = min(steps, i + 1)
            break
    return steps, max(ctl.window_min_s, ctl.verdict_max_after_s)


def _whole(n: int, every: int) -> int:
    """``n`` rounded up to whole periods of ``every`` steps."""
    return n + (-n) % max(1, every)


def _after_enough(rules: RuleSet, bound_steps: int) -> int:
    """The after window's bound in steps for steps too fast to cover its seconds (``verdict_enough_steps``)."""
    return max(bound_steps, rules.controller.verdict_enough_steps)


def _closed_early(state: JobState, open_d: StoredDecision, change: Optional[StoredChange]) -> Optional[Plan]:
    """A refused, replaced, cancelled or overridden change: its decision is closed without a verdict."""
    if change is not None and change.status == REFUSED:
        why = f"the job could not apply it: {change.refused_reason or 'no reason given'}"
        return Plan(note=f"decision {open_d.id}: {change.knob} → {change.value:g} refused ({why})", close=open_d.id,
                    outcome=REFUSED, evidence={**open_d.evidence, "closed_because": why, "verdict_ms": state.now_ms,
                                                 "refused_reason": change.refused_reason})
    if change is None or change.status in (SUPERSEDED, CANCELLED):
        why = "replaced by a newer change" if change is not None and change.status == SUPERSEDED else \
            "cancelled before the job applied it (mode switched or bounds changed)"
        return Plan(note=f"decision {open_d.id}: {why}", close=open_d.id,
                    outcome=SUPERSEDED if change is not None and change.status == SUPERSEDED else CANCELLED,
                    evidence={**open_d.evidence, "closed_because": why})
    if change.status != APPLIED or change.applied_step is None:
        return None
    knob_now = state.job.knobs.get(change.knob, {}).get("value")
    if knob_now is None or float(knob_now) != float(change.value):
        why = f"the job changed {change.knob} to {knob_now} itself (an OOM, or a new registration)"
        return Plan(note=f"decision {open_d.id}: {why}", close=open_d.id, outcome=SUPERSEDED,
                    evidence={**open_d.evidence, "closed_because": why}, applied_step=change.applied_step)
    return None


def follow_up(state: JobState, rules: RuleSet, open_d: StoredDecision) -> Plan:
    """The open decision's next step: its throughput verdict, then — for a change to a knob that changes what is
    learned — the learning guards (goodput.py), which roll it back at once when learning does not keep up."""
    from trimtab.control.goodput import judge_learning

    return judge_learning(state, rules, open_d, _by_throughput(state, rules, open_d), _before_steps, _roll_back)


def _by_throughput(state: JobState, rules: RuleSet, open_d: StoredDecision) -> Plan:
    ctl = rules.controller
    change = next((c for c in state.changes if c.id == open_d.change_id), None)
    early = _closed_early(state, open_d, change)
    if early is not None:
        return early
    if change.status != APPLIED or change.applied_step is None:
        # The job's ack moves its knob (a new registration key): planning resumes then, or after a window.
        return Plan(note=f"waiting for the job to apply change {change.id} ({change.knob} → {change.value})",
                    wait=Wait(steps=max(1, ctl.window_min_steps), seconds=ctl.window_min_s))
    kept = memory_follow.kept_once_run(state, rules, open_d, change.applied_step)
    if kept is not None:
        return kept
    # What the job would have done without the change, where its lengths drift: every step read at the old
    # setting's reference length (drift.py), the before window and the after window alike.
    as_run = state.steps
    at_length, length_model = at_equal_length(_at_old_setting(state, rules, change), as_run, ctl)
    state = replace(state, steps=at_length)
    every = period(state.job, rules, state.steps)
    first = own_verdict_from(change, rules, state.steps)
    known = functools.cache(lambda: persistence(state, rules))  # read once: by a drain's one-period side, the verdict
    drained = drain_read(change, rules, state.steps, first, every,  # a bank its own steps show drained (drain.py)
                         lambda: known().step_noise)
    first = first if drained is None else max(first, int(drained["to"]))
    after_steps = [s for s in state.steps if s.step >= first]
    # a first climb: judged from a window as short as the one before it
    wctl = memory_follow.climb_settings(ctl, memory_follow.after_window_x(open_d))
    after, complete = leading(after_steps, wctl.window_min_steps, wctl.window_min_s, every, wctl.window_enough_steps)
    measuring = Plan(note=f"measuring throughput after change {change.id} (from step {first})",
                     applied_step=change.applied_step, measuring=open_d.id if open_d.applied_step is None else None,
                     wait=wait_to_cover(after_steps, wctl.window_min_steps, wctl.window_min_s, every,
                                        wctl.window_enough_steps))
    if not complete or (drained is None and drain_only(change, rules, after_steps, first, every)):
        return measuring
    state = replace(state, persistence=known())  # a verdict's spreads widen by it (persistence.py)
    # While the test cannot tell, the after window grows (see _after_bound), then "no measurable gain".
    bound_steps, bound_s = _after_bound(rules, every, after_steps)
    grown, at_bound = leading(after_steps, bound_steps, bound_s, every, _after_enough(rules, bound_steps))
    before = _before_steps(state, rules, change)
    # over the steps that are not lost (an OOM's samples=0 is no work at a lower rate): lost_steps.py
    before_tp = measured_throughput(before) if before else open_d.throughput_before_samples_per_s
    after_tp = measured_throughput(grown)
    evidence = {**open_d.evidence, "after_window": window_evidence(grown), "verdict_ms": state.now_ms,
                "acks": [{"rank": a.rank, "applied_at_step": a.applied_at_step} for a in change.acks]}
    if before:
        evidence["before_window"] = window_evidence(before)
    if drained is not None:
        evidence["after_window_past_drain"] = drained
    # the decision's row keeps the samples/s the job ran at; the verdict's figures (and gain_pct) are at the
    # reference length where there is one
    ran_tp = after_tp if length_model is None else \
        measured_throughput([s for s in as_run if grown and grown[0].step <= s.step <= grown[-1].step])
    if length_model is not None:
        evidence["drift_model"] = length_model.evidence()
    b_sample = state.persistence.sample(before, _old_period(state, rules, change)) if before else None
    a_sample = state.persistence.sample(grown, every)
    if state.persistence.rho > 0:
        evidence["persistence"] = state.persistence.evidence()
    closed = dict(close=open_d.id, throughput_after=ran_tp, applied_step=change.applied_step)
    if before_tp and after_tp:  # the windows' samples/s, lone stalls included; gain_pct is the verdict's (below)
        evidence["window_gain_pct"] = round(100.0 * (after_tp / before_tp - 1.0), 2)
    predicted = evidence.get("memory_prediction")
    peaks = [s.mem_peak_bytes for s in grown if s.mem_peak_bytes is not None]
    if isinstance(predicted, dict) and peaks and predicted.get("predicted_gib"):
        seen = max(peaks) / GIB
        evidence["memory_observed"] = {"peak_gib": round(seen, 3), "predicted_gib": predicted["predicted_gib"],
                                       "error_pct": round(100.0 * (seen / predicted["predicted_gib"] - 1.0), 1)}
    if any(r.name == open_d.rule and r.safety for r in rules.rules):
        # A safety change (memory, fragmentation) is not undone for speed: it was made to stop an OOM.
        return Plan(note=f"decision {open_d.id}: safety change kept", outcome=KEPT, evidence=evidence, **closed)
    if b_sample is None or a_sample is None:
        return _not_measurable(state, open_d, change, before, grown, b_sample, at_bound, measuring, evidence, closed)
    v = compare(b_sample, a_sample, ctl)
    evidence.update(verdict=v.evidence(), before_sample=b_sample.evidence(), after_sample=a_sample.evidence(),
                    gain_pct=round(100.0 * (v.ratio - 1.0), 2))
    ladder = _ladder_goes_on(state, rules, open_d, change, grown, every, v) if v.result == INCONCLUSIVE else None
    if ladder is not None and not at_bound:
        above = (v.ratio - 1.0) * 100.0 >= ctl.dead_band_pct  # an unconfirmed gain: not a rung that gained nothing
        evidence.update(no_gain=True, ladder_goes_on=ladder, **({"unconfirmed_gain": True} if above else {}))
        return Plan(note=f"decision {open_d.id}: inconclusive ({100 * (v.ratio - 1):+.1f} %, not lower) but {ladder}: "
                         f"kept, {'an unconfirmed gain' if above else 'no measurable gain'}", outcome=KEPT,
                    evidence=evidence, throughput_after=ran_tp, close=open_d.id, applied_step=change.applied_step)
    if v.result == INCONCLUSIVE and not at_bound:
        measuring.note = (f"decision {open_d.id}: inconclusive so far ({100 * (v.ratio - 1):+.1f} %, "
                          f"{v.confidence_pct:.0f} % sure): lengthening the after window")
        # Tested again once another window's worth of steps is in (not on every step: fewer looks, less CPU).
        measuring.wait = window_wait(rules, every)
        return measuring
    # What "the job itself moved" compares against (composition.py), for the verdicts it is read for (a sure gain or
    # loss; the paths above close none): not on each look while the after window grows
    evidence.update(composition_after=composition(grown), **({"composition_before": composition(before)} if before
                                                             else {}))
    # only a change that would be kept for a gain (a loss is rolled back anyway: re-measuring it would retry it)
    credited = v.result == GAIN or (v.result == INCONCLUSIVE and (v.ratio - 1.0) * 100.0 >= ctl.dead_band_pct)
    every_before = _old_period(state, rules, change)
    drift = _explained_by_trend(before, every_before, v.ratio, rules) if credited else None
    if drift is not None and past_a_short_trend(before, every_before, grown, every, a_sample, ctl):
        evidence["past_a_short_trend"] = drift.evidence()
        drift = None
    line_end = (gain_within_trend(before, every_before, a_sample, ctl)
                if credited and drift is None and _first_move(state, change) else None)
    if drift is not None or line_end is not None:
        # The before window was still moving (a warm-up, a restart) the way the verdict went, by as much: the
        # change may be the settling's. Back to the old setting; the move is decided again on a settled baseline.
        trend = drift or line_end
        evidence.update(remeasure=True, before_not_settled=trend.evidence())
        why = (f"the before window had not settled (its throughput moved {trend.change_pct:+.1f} % across it, "
               f"{trend.confidence_pct:.0f} % sure)" if drift is not None else
               f"the job's first move, and not surely above the end of the before window's own line (it climbed "
               f"{trend.change_pct:+.1f} % across it: the tail of a warm-up)")
        return _roll_back(state, open_d, change, f"not judged: {why}, to be re-measured", evidence, closed)
    beyond = beyond_overlap(change, rules, before, v.ci_pct[0]) if credited else None
    if beyond is not None:  # more than hiding the step's rest behind generation could bring: the host's
        again = any(remeasured(d) and same_move(d, open_d) for d in state.decisions if d.id != open_d.id)
        evidence.update(beyond_overlap=beyond, **({"back_to_known": True} if again else {"remeasure": True}))
        why = (f"{100 * (v.ratio - 1):+.1f} % (95 % interval from {beyond['gain_low_pct']:+.1f} %), more than hiding the "
               f"{beyond['outside_generation_pct']:.0f} % of the step outside generation could bring "
               f"(+{beyond['most_gain_pct']:.1f} %)")
        return _roll_back(state, open_d, change, f"not judged: {why}" + (": read so twice, back to the known setting"
                                                                         if again else ", to be re-measured"),
                          evidence, closed)
    # the periods' geometric means: the two figures the verdict compared (their ratio is its +x %)
    at = "" if length_model is None else f" at {length_model.ref_tokens:.0f} tokens per sample"
    figures = (f"{math.exp(b_sample.mean_log):.2f} → {math.exp(a_sample.mean_log):.2f} samples/s{at} "
               f"({100 * (v.ratio - 1):+.1f} %, 95 % interval {v.ci_pct[0]:+.1f} … {v.ci_pct[1]:+.1f} %, "
               f"{v.confidence_pct:.0f} % sure{lost_note(b_sample.lost + a_sample.lost)})")
    if v.result == GAIN:
        return Plan(note=f"decision {open_d.id}: throughput {figures}: kept", outcome=KEPT, evidence=evidence,
                    **closed)
    # A move the test cannot tell from noise is kept only when it is likely not lower: kept on any estimate above
    # the old one, a move costing 2–3 % read ≥ +0 % in 4 of 10 verdicts on a ±20 % host, and a chain of them walked
    # the noisy job's prefetch from its best (4) to 8 (−5 %): a ratchet, each move kept on a coin flip.
    likely = v.not_lower_pct >= (ctl.keep_in_bracket_likely_pct if _in_bracket(open_d) else
                                 ctl.keep_unproven_likely_pct)
    # A move made again after its loss was read as the host's slowdown (A, B, A′: ``REAPPLIED``) has one verdict that
    # measured it worse already: one it cannot confirm now is no sign of a slope, the direction closes (the noisy
    # prefetch job, seed 7: 4 → 6 read −14 % across the slowdown, +4 % "unconfirmed" again, and 6 → 8, −5 %, followed)
    reapplied = bool(open_d.evidence.get(REAPPLIED)) if isinstance(open_d.evidence, dict) else False
    if likely and v.result == INCONCLUSIVE and (v.ratio - 1.0) * 100.0 >= ctl.dead_band_pct and not reapplied:
        # Not confirmed, but no sign of a flat top either: kept, and the next move this way is judged on its own.
        evidence.update(no_gain=True, unconfirmed_gain=True)
        return Plan(note=f"decision {open_d.id}: throughput {figures}: kept, no measurable gain (the estimate is "
                         f"above the {ctl.dead_band_pct:g} % dead band: an unconfirmed gain, the direction stays "
                         f"open)", outcome=KEPT, evidence=evidence, **closed)
    if likely and v.result != WORSE:
        # Not told apart from noise (or smaller than the dead band), but not lower either: kept as "no measurable
        # gain", and this direction is not pushed further. Kept rather than undone because a change that moves
        # nothing by itself can move the bottleneck (prefetch raises the communication a later sync-frequency change
        # then hides: the H200 pipeline's best setting is reached that way).
        evidence["no_gain"] = True
        return Plan(note=f"decision {open_d.id}: throughput {figures}: kept, no measurable gain (not lower; this "
                         f"direction is not pushed further)", outcome=KEPT, evidence=evidence, **closed)
    if v.result != WORSE:
        # Not told apart from noise, and lower or not likely enough higher: the old setting is the one known to be good.
        evidence["back_to_known"] = True
        figures += (f": not told apart from noise, {v.not_lower_pct:.0f} % likely not lower (under "
                    f"{ctl.keep_unproven_likely_pct:g} %), back to the known setting")
    return _roll_back(state, open_d, change, figures, evidence, closed)


def _in_bracket(d: StoredDecision) -> bool:
    """The move was a bracket search's: between two values measured worse, near the top of the curve, where the
    settings within noise of each other are all near the best — going back on a verdict that cannot tell them apart
    flips the knob to and fro for nothing (the noisy non-monotone curve: 23 and 27 against 32, within 4 % of each
    other, each sent back: 3.7 rollbacks a run). A chain of such keeps cannot walk out of the bracket (the ratchet
    ``keep_unproven_likely_pct`` guards against walked an open ladder)."""
    notes = (d.evidence if isinstance(d.evidence, dict) else {}).get("step_policy") or []
    return any(isinstance(n, str) and n.startswith("bracket search") for n in notes)


def _not_measurable(state: JobState, open_d: StoredDecision, change: StoredChange, before: list[JobStep],
                    grown: list[JobStep], b_sample, at_bound: bool, measuring: Plan, evidence: dict,
                    closed: dict) -> Plan:
    """A side of the verdict without one measurable period (no samples reported, every period holding a lost step):
    the after window waits while it may still grow; otherwise the change is not judged — back to the known setting,
    to be measured again (``remeasure``: no verdict that holds against the move) — never "kept"."""
    side = "before" if b_sample is None else "after"
    lost = lost_steps(before if side == "before" else grown)
    why = f"{len(lost)} of its steps lost" + (f"; step {lost[0].step}: {lost[0].why}" if lost else "")
    if side == "after" and not at_bound:
        measuring.note = f"decision {open_d.id}: no measurable throughput after change {change.id} yet ({why})"
        return measuring
    evidence.update(not_measurable={"side": side, "lost_steps": [x.evidence() for x in lost[:20]],
                                    "lost_steps_count": len(lost)}, remeasure=True)
    return _roll_back(state, open_d, change, f"not measurable (no samples/s in the {side} window: {why}), to be "
                                             f"measured again", evidence, closed)


def _roll_back(state: JobState, open_d: StoredDecision, change: StoredChange, figures: str, evidence: dict,
               closed: dict) -> Plan:
    old = _within_bounds(state.job.knobs[change.knob],
                         open_d.old_value if open_d.old_value is not None else change.previous_value)
    if old is None or float(old) == float(change.value):
        # The job narrowed its bounds since (a new registration): the old value is out of them now.
        spec = state.job.knobs[change.knob]
        why = (f"throughput {figures} but {change.knob}'s old value is outside the job's bounds "
               f"[{spec['min']}, {spec['max']}] now: not rolled back")
        return Plan(note=f"decision {open_d.id}: {why}", outcome=KEPT,
                    evidence={**evidence, "no_gain": True, "rollback_blocked": why}, **closed)
    return Plan(note=f"decision {open_d.id}: throughput {figures}: rolling {change.knob} back to {old}",
                outcome=ROLLED_BACK, evidence=evidence, rollback_to=old, rollback_knob=change.knob, **closed)
