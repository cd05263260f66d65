"""The gates of the plans that wait on a change in flight or on advice already given (gates.py), apart from the
controller's order of business."""

from __future__ import annotations

from trimtab.contract.statuses import ADVISED, APPLIED
from trimtab.control import gates
from trimtab.control.follow_up import follow_up
from trimtab.control.gates import Gate, expected_step
from trimtab.control.plan import JobState, Plan
from trimtab.grading.rules import RuleSet
from trimtab.store.decisions import StoredDecision


def gated_follow_up(state: JobState, rules: RuleSet, open_d: StoredDecision) -> Plan:
    """The change in flight (follow_up.py), with the gate that holds the job while it is not judged yet."""
    result = follow_up(state, rules, open_d)
    if result.close is None and result.gate is None:
        change = next((c for c in state.changes if c.id == open_d.change_id), None)
        w = result.wait
        if change is not None and change.status == APPLIED:
            result.gate = Gate(gates.MEASURING, rule=open_d.rule, why=result.note,
                               expects_step=expected_step(state.steps, w.steps, w.seconds, w.enough_steps))
        else:
            result.gate = Gate(gates.APPLYING, rule=open_d.rule, why=result.note,
                               missing=f"the job's acknowledgement of change {open_d.change_id}")
    return result


def advised_gate(state: JobState, rules: RuleSet, rule: str, win: dict, move: str) -> Gate:
    """Advise mode, the same advice given within ``advice_repeat_s``: given again once that has passed (at the
    pace of the newest steps)."""
    given = max((d.ts_ms for d in state.decisions if d.rule == rule and d.outcome == ADVISED), default=state.now_ms)
    left_s = max(0.0, rules.controller.advice_repeat_s - (state.now_ms - given) / 1000.0)
    return Gate(gates.ADVISED, rule=rule, why=f"advised before ({move}); again in {left_s:.0f} s", window=win,
                expects_step=expected_step(state.steps, 1, left_s))
