"""How long a move's before window must be for the effect the move can be expected to have: the job's measured noise
against the share of the step the rule's signal says the move removes.

Why: a before window of one long sync period is one draw of the job's noise. On the bench's noisy two-rank job a
follow-through rung (sync 16 → 32 with communication at 11 % of the step: +6 % expected, +5.8 % true) measured against
16 steps that ran fast by chance read −3 % and went back, in 3 runs of 10. Waiting for a longer before window costs
every move its steps, though: a batch raise with generation at 87 % of the step (expected ×2.9) needs none, and a
mix of both knobs waited 32 steps at a sync every 32 before each such raise (78 % of the best static, from 89 %).
So the before window is sized by the effect: the periods a two-sided test at ``confidence_pct`` needs to see the
expected gain four times in five, with after windows of the same length (each side ``n`` periods: a standard error
of √(2v/n) for a period variance v, the job's own where the window shows it), from one period up to
``verdict_before_max_periods``.

The expected gain of a share rule's ×f step: the signal's share s of the step, of which the step removes 1 − 1/f
(half of the communication for a sync interval doubled); the throughput ratio 1 / (1 − s(1 − 1/f)). An upper bound
where the work does not shrink in proportion (a batch raise): the wait it asks for is then the shorter one.
"""

from __future__ import annotations

import math
from typing import Optional

from trimtab.control import gates
from trimtab.control.gates import Gate, expected_step
from trimtab.control.plan import JobState, Plan, Wait
from trimtab.control.verdict import Sample
from trimtab.grading.rules import Action, ControllerSettings, Rule, RuleSet
from trimtab.grading.signals import Reading
from trimtab.grading.window import JobStep

POWER = 0.8  # how often a before window of the size asked for lets a verdict see the expected gain


def expected_gain_log(rule: Rule, reading: Reading, action: Action, current: float, new: float) -> Optional[float]:
    """The log throughput ratio a ×/÷ move of a job-scope share rule (``*_share_pct``) can be expected to bring; None
    for other rules and moves."""
    if rule.scope != "job" or not rule.signal.endswith("_share_pct") or reading.value is None:
        return None
    if action.op not in ("mul", "div") or current <= 0 or new <= 0:
        return None
    f = new / current if action.op == "mul" else current / new
    if f <= 1.0:
        return None
    removed = min(0.95, max(0.0, reading.value / 100.0) * (1.0 - 1.0 / f))
    return -math.log1p(-removed) if removed > 0 else None


def before_periods(sample: Optional[Sample], gain_log: Optional[float], ctl: ControllerSettings) -> int:
    """How many whole periods the before window of a move expected to bring ``gain_log`` needs (1 … the max; 1 where
    the rule says nothing of the gain to expect, or nothing is measured: the window the move was decided on)."""
    top = max(1, ctl.verdict_before_max_periods)
    if gain_log is None or gain_log <= 0 or sample is None:
        return 1
    from scipy.stats import norm  # lazily, as verdict.py does

    z = float(norm.ppf(1.0 - (1.0 - ctl.confidence_pct / 100.0) / 2.0) + norm.ppf(POWER))
    n = math.ceil(2.0 * sample.variance(ctl) * (z / gain_log) ** 2 - 1e-9)
    return max(1, min(top, n))


def before_too_short(state: JobState, rules: RuleSet, fired: tuple[Rule, Reading], choice: tuple[Action, float],
                     base: list[JobStep], every: int, window: Optional[dict] = None) -> Optional[Plan]:
    """The plan that waits when the steps at the current setting since the last change (``base``) hold fewer whole
    periods of ``every`` steps than the move ``choice`` of the rule that ``fired`` needs for its before window
    (``before_periods``); None when they hold enough, or the job syncs every step. ``window``: the plan's window,
    for the gate."""
    if every <= 1:
        return None
    (rule, reading), (action, new) = fired, choice
    gain = expected_gain_log(rule, reading, action, float(state.job.knobs[action.knob]["value"]), new)
    periods = before_periods(state.persistence.sample(base, every), gain, rules.controller)
    need = periods * every - len(base)
    if need <= 0:
        return None
    return Plan(note=f"{rule.name} fires; {action.knob} waits for {periods} sync periods of {every} steps at this "
                     f"setting, its before window ({len(base)} steps so far)", wait=Wait(steps=need),
                gate=Gate(gates.COLLECTING, rule=rule.name, window=window,
                          missing=f"{need} more steps (the before window: {periods} periods of {every} for the gain "
                                  f"this move can be expected to bring)",
                          expects_step=expected_step(state.steps, need)))
