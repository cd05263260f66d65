"""Changes judged on learning, not only samples per second (issue 41): the guards a change to a knob that changes
what is learned must hold, read from the learning signals the job reports (``step_end(learning=...)``, or its
framework's own metrics through the adapters).

Raising staleness or syncing less often buys samples per second by training on older data. A throughput verdict
alone would keep a +20 % staleness raise while the policy's importance ratios blow up. So a change to such a knob
(``[learning] changes_learning``) is kept only if, over its after window against its before window:

* each off-policy indicator the job reports stays within its bound — clip fraction and stale share at most so much
  higher, KL and gradient norm at most so many times higher (above a floor), the effective sample size at most so
  much lower — each side's mean over at least ``guard_min_steps`` steps that report it;
* where a reward is reported, the reward gained per wall-second (the slope of reward against the steps' wall time,
  by least squares) is not lower than before, at ``reward_rate_confidence_pct`` (a one-sided test on the two slopes
  with their standard errors), each side over at least ``reward_min_steps`` steps. A reward that saturates on its
  own reads slower after any change; the test needs the drop to stand out of both slopes' noise, so such a curve
  rolls back only what surely slowed it.

A guard that breaks rolls the change back at once — while the throughput verdict is still measuring too — with the
signal named in the reason. A change is never kept for throughput with no guard judged on a job that reports
learning (:func:`_unjudged`): too few steps of a signal after it, it is measured on; too few before it (another change
came just before, so that side cannot grow), it goes back to be re-measured, once a move. Under load (two CPU burners)
verl's fully-async test job kept a staleness raise "+175 % (77 % sure)" with its learning "not judged: fewer than 4
steps of a signal on a side" in 2 runs of 3: an operator's change had come three steps before it. A job that reports no learning signal gets advice, not an automatic change, on these
knobs (``[learning] without_signals = "advise"``, shipped: :func:`blind_to_learning`); a knob the job declares
``throughput_only`` is judged on samples/s alone, and ``without_signals = "throughput"`` judges every such knob so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from trimtab.contract.learning import SIGNAL_NAMES
from trimtab.contract.statuses import APPLIED, KEPT, ROLLED_BACK
from trimtab.control.follow_up import _at_old_setting
from trimtab.control.holds import same_move
from trimtab.control.plan import JobState, Plan, Wait
from trimtab.grading.learning_rules import LearningSettings, advised_only
from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep
from trimtab.store.decisions import StoredDecision


@dataclass(frozen=True)
class Broken:
    """A guard that does not hold: the signal, its before and after figures, and the bound it broke (in words)."""

    signal: str
    before: float
    after: float
    bound: str

    def words(self) -> str:
        return f"{self.signal} {self.before:.4g} → {self.after:.4g} ({self.bound})"


def _values(steps: Sequence[JobStep], signal: str) -> list[float]:
    return [v for v in (s.reported.get(f"learning_{signal}") for s in steps) if v is not None]


def reports_learning(steps: Sequence[JobStep]) -> bool:
    """True when any of ``steps`` reports any learning signal."""
    return any(s.reported.get(f"learning_{name}") is not None for s in steps for name in SIGNAL_NAMES)


def blind_to_learning(rules: RuleSet, knob: str, steps: Sequence[JobStep]) -> Optional[str]:
    """Why a change to ``knob`` must stay advice: it changes what is learned and the job reports no learning signal
    in ``steps``; None when it may be made."""
    if advised_only(rules.learning, [knob], reports_learning(steps)) is None:
        return None
    return (f"{knob} changes what is learned and the job reports no learning signal (reward, clip fraction, KL, "
            f"effective sample size: step_end(learning=...) or its framework's logs), so trimtab cannot judge a "
            f"change to it on learning: advice only")


def _slope(steps: Sequence[JobStep]) -> Optional[tuple[float, float, int]]:
    """(reward per wall-second, its standard error, points): least squares of reward on each step's end time."""
    points = [(s.end_ms / 1000.0, s.reported["learning_reward"]) for s in steps
              if s.reported.get("learning_reward") is not None]
    if len(points) < 3:
        return None
    xs, ys = zip(*points)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    se = math.sqrt(residual / (len(points) - 2) / sxx) if len(points) > 2 else math.inf
    return slope, se, len(points)


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _mean_guards(cfg: LearningSettings, before: Sequence[JobStep], after: Sequence[JobStep],
                 evidence: dict[str, Any]) -> Optional[Broken]:
    bounds: dict[str, Callable[[float, float], Optional[str]]] = {
        "clip_fraction": lambda b, a: f"rose by {a - b:+.3f}, bound +{cfg.clip_fraction_max_rise:g}"
        if a - b > cfg.clip_fraction_max_rise else None,
        "stale_share": lambda b, a: f"rose by {a - b:+.3f}, bound +{cfg.stale_share_max_rise:g}"
        if a - b > cfg.stale_share_max_rise else None,
        "eff_sample_size": lambda b, a: f"fell by {b - a:.3f}, bound {cfg.eff_sample_size_max_drop:g}"
        if b - a > cfg.eff_sample_size_max_drop else None,
        "kl": lambda b, a: f"above {cfg.kl_max_x:g}× the before window's (or {cfg.kl_floor:g})"
        if abs(a) > max(cfg.kl_max_x * abs(b), cfg.kl_floor) else None,
        "grad_norm": lambda b, a: f"above {cfg.grad_norm_max_x:g}× the before window's (or {cfg.grad_norm_floor:g})"
        if a > max(cfg.grad_norm_max_x * b, cfg.grad_norm_floor) else None,
    }
    broken = None
    for signal, bound in bounds.items():
        b_vals, a_vals = _values(before, signal), _values(after, signal)
        if len(b_vals) < cfg.guard_min_steps or len(a_vals) < cfg.guard_min_steps:
            continue
        b, a = statistics.fmean(b_vals), statistics.fmean(a_vals)
        why = bound(b, a)
        evidence[signal] = {"before": round(b, 6), "after": round(a, 6), "steps": [len(b_vals), len(a_vals)],
                            "holds": why is None}
        if why is not None and broken is None:
            broken = Broken(signal, b, a, why)
    return broken


def _reward_guard(cfg: LearningSettings, before: Sequence[JobStep], after: Sequence[JobStep],
                  evidence: dict[str, Any]) -> Optional[Broken]:
    if len(_values(before, "reward")) < cfg.reward_min_steps or len(_values(after, "reward")) < cfg.reward_min_steps:
        return None
    b, a = _slope(before), _slope(after)
    if b is None or a is None:
        return None
    se = math.hypot(b[1], a[1])
    sure_lower = _normal_cdf((b[0] - a[0]) / se) if se > 0 and math.isfinite(se) else 0.5
    holds = 100.0 * sure_lower < cfg.reward_rate_confidence_pct
    evidence["reward_per_s"] = {"before": round(b[0], 6), "after": round(a[0], 6), "steps": [b[2], a[2]],
                                "sure_lower_pct": round(100.0 * sure_lower, 1), "holds": holds}
    if holds:
        return None
    return Broken("reward per wall-second", b[0], a[0],
                  f"lower, {100.0 * sure_lower:.0f} % sure, bound {cfg.reward_rate_confidence_pct:g} %")


def guards(cfg: LearningSettings, before: Sequence[JobStep], after: Sequence[JobStep]) -> tuple[Optional[Broken],
                                                                                                  dict[str, Any]]:
    """The first guard that breaks (None: all that could be judged hold) and what each showed."""
    evidence: dict[str, Any] = {}
    broken = _mean_guards(cfg, before, after, evidence)
    reward = _reward_guard(cfg, before, after, evidence)
    return broken or reward, evidence


RollBack = Callable[..., Plan]


def _before(state: JobState, rules: RuleSet, change: Any, throughput_before: list[JobStep]) -> list[JobStep]:
    """The guards' before window: the throughput verdict's, stretched to the steps a signal needs (a 45 s step
    covers the verdict's seconds alone), never past the previous change (those steps ran another setting:
    ``follow_up._at_old_setting`` knows where they end)."""
    cfg = rules.learning
    return _at_old_setting(state, rules, change)[-max(len(throughput_before), cfg.guard_min_steps,
                                                      cfg.reward_min_steps):]


def throughput_words(evidence: dict[str, Any], outcome: Optional[str]) -> str:
    """The throughput verdict of a decision in words: "+12.3 % (99 % sure): kept"; "not judged yet" where the
    learning guards closed it first."""
    gain, v = evidence.get("gain_pct"), evidence.get("verdict") or {}
    if gain is None:
        return "not judged yet (closed on learning first)"
    sure = f" ({v['confidence_pct']:.0f} % sure)" if isinstance(v, dict) and v.get("confidence_pct") is not None \
        else ""
    return f"{gain:+.1f} %{sure}" + ("" if outcome is None else f": {outcome.replace('_', ' ')}")


def learning_words(shown: dict[str, Any], broken: Optional[Broken], min_steps: int) -> str:
    """The learning verdict in words: the broken guard ("broke: clip_fraction 0.04 → 0.15 (…)"), else each signal
    judged with its before and after ("held: clip_fraction 0.04 → 0.06, kl …"), else why none was judged."""
    if broken is not None:
        return f"broke: {broken.words()}"
    judged = [f"{'reward per wall-second' if name == 'reward_per_s' else name} {g['before']:.4g} → {g['after']:.4g}"
              for name, g in shown.items()]
    if judged:
        return "held: " + ", ".join(judged)
    return f"not judged: fewer than {min_steps} steps of a signal on a side"


UNJUDGED_AFTER_X = 10  # a side after the change this many times guard_min_steps long with too few signals: kept unjudged


def _signal_steps(steps: Sequence[JobStep]) -> int:
    """The most steps any one learning signal is reported on."""
    return max((len(_values(steps, name)) for name in SIGNAL_NAMES), default=0)


def _unjudged(state: JobState, rules: RuleSet, open_d: StoredDecision, change: Any, plan: Plan,
              before: Sequence[JobStep], after: Sequence[JobStep], evidence: dict[str, Any],
              roll_back: RollBack) -> Optional[Plan]:
    """The plan for a change kept for throughput that no learning guard could judge, on a job that reports learning:
    measured on while the side after it has fewer than ``guard_min_steps`` steps of a signal (until it is
    ``UNJUDGED_AFTER_X`` times that long); rolled back to be re-measured where the side before it has too few (it
    ran only a few steps at the old setting: it cannot grow), once a move. None: kept unjudged, as words say."""
    need = rules.learning.guard_min_steps
    n_before, n_after = _signal_steps(before), _signal_steps(after)
    if n_after < need and len(after) < UNJUDGED_AFTER_X * need:
        return Plan(note=f"decision {open_d.id}: throughput {throughput_words(plan.evidence or {}, plan.outcome)}; "
                         f"learning not judged yet ({n_after} of {need} steps of a signal after the change): "
                         f"measuring on", applied_step=change.applied_step,
                    measuring=open_d.id if open_d.applied_step is None else None, wait=Wait(steps=need - n_after))
    if n_before >= need or n_after < need or any(same_move(d, open_d) and "learning_not_judged" in (d.evidence or {})
                                                 for d in state.decisions if d.id != open_d.id):
        return None  # judged enough, or this move was re-measured for its learning once already
    counts = {"need": need, "before": n_before, "after": n_after}
    closed = dict(close=open_d.id, throughput_after=plan.throughput_after, applied_step=change.applied_step)
    out = roll_back(state, open_d, change, f"not judged on learning: {n_before} of {need} steps of a signal before "
                                           f"it (a change came just before), to be re-measured",
                    {**evidence, "remeasure": True, "learning_not_judged": counts}, closed)
    out.evidence = _with_verdicts(out.evidence, None, f"not judged: {n_before} of {need} steps of a signal before "
                                                      f"the change, to be re-measured")
    return out


def _with_verdicts(evidence: dict[str, Any], outcome: Optional[str], learning: str) -> dict[str, Any]:
    """``evidence`` with both verdicts of a learning knob's decision in words (``check``, the API and the
    dashboards show them as they are stored)."""
    return {**evidence, "verdicts": {"throughput": throughput_words(evidence, outcome), "learning": learning}}


def judge_learning(state: JobState, rules: RuleSet, open_d: StoredDecision, plan: Plan,
                   before_steps: Callable[[JobState, RuleSet, Any], list[JobStep]], roll_back: RollBack) -> Plan:
    """``plan`` (the throughput's follow-up of ``open_d``) with the learning guards of a change to a knob that
    changes what is learned: a broken guard rolls the change back at once, naming the signal; a change kept for
    throughput keeps the guards' figures in its evidence. A verdict on such a knob carries both verdicts in words
    (``evidence["verdicts"]``). Other knobs: ``plan`` as it is."""
    change = next((c for c in state.changes if c.id == open_d.change_id), None)
    if change is None or change.status != APPLIED or change.applied_step is None \
            or rules.learning.changes_learning_of(change.knob) is not True:
        return plan
    if plan.outcome == ROLLED_BACK:  # the throughput verdict undid it: learning need not be judged
        plan.evidence = _with_verdicts(plan.evidence or {}, plan.outcome, "not judged: rolled back on throughput")
        return plan
    before = _before(state, rules, change, before_steps(state, rules, change))
    after = [s for s in state.steps if s.step >= change.applied_step]
    broken, shown = guards(rules.learning, before, after)
    if not shown and not reports_learning(after):
        return plan
    evidence = {**(plan.evidence or open_d.evidence or {}), "learning_guards": shown}
    if broken is None and not shown and plan.close is not None and plan.outcome == KEPT:
        waiting = _unjudged(state, rules, open_d, change, plan, before, after, evidence, roll_back)
        if waiting is not None:
            return waiting
    if broken is None:
        if plan.close is not None:  # a verdict: it keeps the guards' figures; a plan still measuring has none
            plan.evidence = _with_verdicts(evidence, plan.outcome, learning_words(shown, None,
                                                                                  rules.learning.guard_min_steps))
        return plan
    evidence["learning_broken"] = {"signal": broken.signal, "before": broken.before, "after": broken.after,
                                   "bound": broken.bound}
    closed = dict(close=open_d.id, throughput_after=plan.throughput_after, applied_step=change.applied_step)
    out = roll_back(state, open_d, change, f"learning does not keep up: {broken.words()}", evidence, closed)
    out.evidence = _with_verdicts(out.evidence, None if plan.close is None else plan.outcome,
                                  learning_words(shown, broken, rules.learning.guard_min_steps))
    if out.outcome == ROLLED_BACK:
        out.note = (f"decision {open_d.id}: learning does not keep up: {broken.words()}: rolling {change.knob} back "
                    f"to {out.rollback_to:g}")
    return out


__all__ = ["Broken", "blind_to_learning", "guards", "judge_learning", "learning_words", "reports_learning",
           "throughput_words"]
