"""A plan that decides nothing says why as data (control/gates.py): the gate that held the job, the rule, the window,
what data it misses and the step at which it expects to decide — issue 38: a rule at ACT, "recent decisions: none"
and no word of why."""

from __future__ import annotations

from tests.support.plans import NOW, RULES, change, decision, job, nothing, state, steps
from trimtab.control import gates
from trimtab.control.controller import plan


def advised(rule: str) -> object:
    return decision(id=9, outcome="advised", change_id=None, knob=None, old=None, new=None, rule=rule,
                    ts_ms=NOW - 60_000)


def test_a_rule_at_act_whose_knobs_are_at_their_bounds_says_so_not_no_rule_fires():
    # generation-bound, batch and prefetch at their max, advised a minute ago: the plan said "no rule fires".
    p = plan(state(steps(0, 3), job(batch=64, prefetch=8), decisions=[advised("generation_bound")]), RULES)
    nothing(p)
    assert p.gate.name == gates.BOUND and p.gate.rule == "generation_bound", p.note
    assert "batch_size is at its max (64)" in p.gate.why and "prefetch is at its max (8)" in p.gate.why
    assert p.gate.window["steps"] == [2, 2] and p.gate.expects_step is None  # not before the job moves
    assert p.note.startswith("generation_bound: fires, no action possible")


def test_collecting_a_window_names_what_is_missing_and_the_step_it_expects():
    # 1 s steps: a window needs 4 s; three steps in, the fourth completes it.
    p = plan(state(steps(0, 3, step_time=1.0, gen=0.9, comm=0.02)), RULES)
    assert p.gate.name == gates.COLLECTING and p.gate.expects_step == 3, p.gate
    assert p.gate.missing.startswith("1.0 s more of step time") and p.gate.window["n_steps"] == 3


def test_a_trending_baseline_holds_a_firing_rule_as_settling_with_no_step_promised():
    climbing = [s for i in range(40) for s in steps(i, 1, step_time=1.0 - 0.01 * i, gen=0.9 * (1.0 - 0.01 * i),
                                                     comm=0.01)]
    p = plan(state(climbing), RULES)
    nothing(p)
    assert p.gate.name == gates.SETTLING and p.gate.rule == "generation_bound", p.note
    assert p.gate.expects_step is None and "moved" in p.gate.why


def test_a_change_being_measured_expects_its_verdict_at_a_step():
    history = steps(0, 20, step_time=1.0, gen=0.9, comm=0.02) + steps(20, 2, step_time=0.8, gen=0.7, comm=0.02)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=20)], decisions=[decision()]), RULES)
    assert p.close is None and p.gate.name == gates.MEASURING and p.gate.rule == "generation_bound", p.note
    assert p.gate.expects_step is not None and p.gate.expects_step > 21


def test_no_rule_fires_is_a_gate_too():
    p = plan(state(steps(0, 3, gen=18.0, ev=18.0, comm=2.0)), RULES)
    assert p.gate.name == gates.NO_RULE and p.note == "no rule fires"
