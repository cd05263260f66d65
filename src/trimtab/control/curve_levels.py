"""The levels of a knob's values that the job's verdicts tie together, and the curve they draw: where a bracket
search's move would land on the parabola through three of them, and whether that is a gain a verdict could confirm
(``worth_a_move``). ``bracket.py`` reads it for where the next move may go.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from trimtab.contract.statuses import KEPT, ROLLED_BACK
from trimtab.control.holds import evidence_of, other_knob_moved, remeasured, still_holds
from trimtab.control.verdict import Sample
from trimtab.grading.rules import Action, RuleSet

if TYPE_CHECKING:
    from trimtab.control.plan import JobState


def levels_of(state: "JobState", rules: RuleSet, knob: str, now: Optional[Sample],
            shape_only: bool = False) -> dict[float, float]:
    """The knob's values whose throughput the verdicts that still hold tie to the current value's, as log ratios
    to it (0 for the current value): each verdict measured new/old side by side, and ratios chain. ``shape_only``:
    verdicts made before another knob moved too (the curve's shape, not its levels now: ``_third_point``)."""
    edges: dict[float, list[tuple[float, float]]] = {}
    for d in state.decisions:  # newest first: the first verdict on a pair is the one that counts
        ratio = (evidence_of(d).get("verdict") or {}).get("ratio") if d.knob == knob else None
        if not isinstance(ratio, (int, float)) or ratio <= 0 or d.old_value is None or d.new_value is None:
            continue
        if d.outcome not in (KEPT, ROLLED_BACK) or remeasured(d):
            continue
        if not still_holds(state, rules, d, now) and not (shape_only and other_knob_moved(state, d)):
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


def peak_between(points: list[tuple[float, float]]) -> Optional[float]:
    """The top of the parabola through three (x, level) points, the middle one highest; None if they do not bend
    down."""
    (a, fa), (b, fb), (c, fc) = points
    num = (b - a) ** 2 * (fb - fc) - (b - c) ** 2 * (fb - fa)
    den = (b - a) * (fb - fc) - (b - c) * (fb - fa)
    return None if den <= 0 else b - 0.5 * num / den


def tied_points(state: "JobState", rules: RuleSet, action: Action, behind: float, current: float, ahead: float,
                 now: Optional[Sample], levels: Optional[dict[float, float]] = None) -> Optional[list[tuple[float, float]]]:
    """The three values (on the log scale for ×/÷ steps), lowest first, with their levels as the verdicts that
    still hold tie them to the current value's (``levels``: these instead); None when they do not tie all three."""
    levels = levels_of(state, rules, action.knob, now) if levels is None else levels
    if behind not in levels or ahead not in levels or min(behind, current, ahead) <= 0 and action.op != "add":
        return None
    scale = (lambda v: v) if action.op == "add" else math.log
    return [(scale(x), levels[x]) for x in sorted((behind, current, ahead))]


def _within_a_rung(action: Action, values: tuple[float, ...]) -> bool:
    """The values lie within one rung of the action (×4 for the batch) on a ×/÷ step (any span on an additive one)."""
    if action.op == "add":
        return True
    return min(values) > 0 and max(values) / min(values) <= action.by


def _third_point(state: "JobState", rules: RuleSet, action: Action, behind: Optional[float], current: float,
                 ahead: float, value: float, now: Optional[Sample]) -> tuple[Optional[float], dict[float, float]]:
    """The third value whose level, with the current value's and ``ahead``'s, draws the parabola ``worth_a_move``
    reads at ``value``, and the levels it is read on: ``behind`` where the three lie within one rung, else the tied
    value nearest to ``value`` that does — one beyond ``ahead`` too (16, 32 and 64 for a move between 16 and 32,
    where 4, 16 and 32 span two rungs) — else one a verdict tied before another knob moved (its shape: prefetch
    0 → 2 gained +14 % at sync 1, 2 → 4 went back at sync 8, −6 %: 0, 2 and 4 put 3 at −1 %, and its trial went
    back in most runs of the prefetch-then-sync jobs, the knob's second rollback)."""
    levels = levels_of(state, rules, action.knob, now)
    if behind is not None and _within_a_rung(action, (behind, current, ahead)) and behind in levels:
        return behind, levels
    scale = (lambda v: v) if action.op == "add" else (lambda v: math.log(v) if v > 0 else -math.inf)
    for tied in (levels, levels_of(state, rules, action.knob, now, shape_only=True)):
        others = [x for x in tied if x not in (current, ahead) and _within_a_rung(action, (x, current, ahead))]
        if others and ahead in tied:
            return min(others, key=lambda x: abs(scale(x) - scale(value))), tied
    return None, levels


def worth_a_move(state: "JobState", rules: RuleSet, action: Action, behind: Optional[float], current: float,
                  ahead: float, value: float, now: Optional[Sample]) -> Optional[str]:
    """Why a bracket move to ``value`` of an additive step is not worth making, else None: the parabola through the
    three tied levels puts ``value`` less than the dead band above the current value — a gain no verdict could
    confirm (one within the dead band is "no measurable gain"), while the move's trial costs a window at a setting
    that is as likely worse. The eval-bound prefetch job: 2 → 4 read +25 %, 4 → 6 −3 % (sure): the parabola puts 5
    at +1.4 % over 4 (true +0.6 %), and the trial of 5 went back in half the runs — a second rollback of the knob
    for nothing. On ×/÷ steps only where the three values lie within one rung of the action (×4 for the batch), on
    the log scale: across more (4, 16, 64) a curve with a kink is no parabola — 4, 16 and 64 put 32 at −14 % where
    it is +11 % (the non-monotone curve then stood at 16, 87 %); within one (16, 25, 32 near its peak) it is, and
    the trial of 28 there went back in every run, a second rollback of the knob. Where the value behind spans more
    than a rung, a tied value beyond ``ahead`` within one is the third (``_third_point``): the curve peaking at 16,
    4 → 16 gained, 16 → 64 and 16 → 32 went back (−35 %, −8 %, sure): 16, 32 and 64 put 23 at −1 %, and its trial
    went back in every run, the knob's third rollback."""
    third, levels = _third_point(state, rules, action, behind, current, ahead, value, now)
    if third is None:
        return None
    points = tied_points(state, rules, action, third, current, ahead, now, levels)
    if points is None:
        return None
    x = value if action.op == "add" else math.log(value)
    level = sum(fy * math.prod((x - ox) / (fx - ox) for ox, _ in points if ox != fx) for fx, fy in points)
    gain_pct = math.expm1(level) * 100.0  # the current value's level is 0
    if gain_pct >= rules.controller.dead_band_pct:
        return None
    low, mid, high = sorted((third, current, ahead))
    return (f"the levels measured at {low:g}, {mid:g} and {high:g} put {value:g} at {gain_pct:+.1f} % over "
            f"{current:g}: under the {rules.controller.dead_band_pct:g} % dead band, no gain a verdict could confirm")


