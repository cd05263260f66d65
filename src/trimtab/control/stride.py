"""Bigger rungs on a ladder while the rungs pay well: after a sure gain of at least ``ladder_gain_pct`` by a ×/÷
step of an action that has a larger step (``strong_by``), the next move of the same knob the same way takes that
larger step.

Why: a ladder climbed one doubling at a time costs a verdict per rung, and at a long sync interval a verdict costs a
period of many steps. A doubling that paid a lot says the cost it removes is still large: sync every 4 → 8 on the
bench's noisy two-rank job read +17–28 % (true +20 %), so 8 → 16 (+11 %) and 16 → 32 (+6 %) are two more verdicts
of shrinking effect, each harder to tell from noise — the second took 64 steps in 6 runs of 10. 8 → 32 at once is
+17.6 %, one verdict that is easy to read. A rung that overshoots is rolled back and the bracket search tries the
middle; a gain below the line, or one the test could not confirm, keeps the usual step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from trimtab.contract.statuses import ADVISED, KEPT, PENDING
from trimtab.control.holds import evidence_of, result_of
from trimtab.control.verdict import GAIN
from trimtab.grading.rules import Action, Rule, RuleSet
from trimtab.store.decisions import StoredDecision

if TYPE_CHECKING:
    from trimtab.control.plan import JobState


def paid_rung(state: "JobState", rules: RuleSet, rule: Rule, action: Action) -> Optional[StoredDecision]:
    """The job's newest closed change when it lets ``action`` take its larger step: this rule's move of the same
    knob the same way, kept as a sure gain of at least ``ladder_gain_pct`` (its ratio), the knob still where it
    left it; else None (and None where the action has no larger step, is not ×/÷, or ``ladder_gain_pct`` is 0)."""
    ctl = rules.controller
    if ctl.ladder_gain_pct <= 0 or action.strong_by is None or action.op not in ("mul", "div"):
        return None
    closed = [d for d in state.decisions if d.change_id is not None and d.outcome not in (PENDING, ADVISED)]
    last = closed[0] if closed else None  # newest first
    if last is None or last.rule != rule.name or last.knob != action.knob or last.outcome != KEPT:
        return None
    if last.old_value is None or last.new_value is None or (last.new_value - last.old_value) * action.direction <= 0:
        return None
    spec = state.job.knobs.get(action.knob)
    if spec is None or float(spec["value"]) != float(last.new_value) or result_of(last) != GAIN:
        return None
    ratio = (evidence_of(last).get("verdict") or {}).get("ratio")
    if not isinstance(ratio, (int, float)) or (ratio - 1.0) * 100.0 < ctl.ladder_gain_pct:
        return None
    return last
