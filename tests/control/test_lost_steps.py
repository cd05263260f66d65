"""Issue 38's shapes on the pure controller: a step lost to an OOM (``samples=0``, the OOM count up) is a lost step,
left out of a verdict's rates and named, never a rate of 0 (which the lone-period screen divided by); a window with
no measurable throughput decides nothing and a verdict on one waits or goes back to the known setting, saying "not
measurable" (never "kept"); ``gain_pct`` is what the verdict read."""

from __future__ import annotations

import pytest

from tests.support.plans import RULES, change, decision, job, nothing, state, steps
from trimtab.control.controller import plan


def neighbour_oom(first: int = 0, n: int = 40, oom_at: int = 20, step_time: float = 1.0):
    """1 s steps of 64 samples (generation-bound); step ``oom_at`` lost to an OOM a neighbour caused: the hook's
    report of it says samples=0 and the job's OOM count goes 0 → 1 (as ``oom_guard`` reports it)."""
    out = steps(first, oom_at - first, step_time=step_time, gen=0.95 * step_time, ooms=0)
    out += steps(oom_at, 1, step_time=step_time, gen=0.95 * step_time, samples=0, ooms=1)
    out += steps(oom_at + 1, first + n - oom_at - 1, step_time=step_time, gen=0.95 * step_time, ooms=1)
    return out


def test_an_oom_step_in_the_before_window_is_a_lost_step_not_a_zero_rate():
    # The change in flight (batch 1 → 4 at step 30); the before window holds the OOM step: its period's rate was 0,
    # the lone outlier, and `median / rates[lone]` raised ZeroDivisionError at every plan.
    history = neighbour_oom(n=30, oom_at=20) + steps(30, 14, step_time=1.0 / 1.3, gen=0.9 / 1.3, ooms=1)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=30)], decisions=[decision()]), RULES)
    assert p.close == 7, p.note
    before = p.evidence["before_sample"]
    assert before["lost_steps"] == [{"step": 20, "why": "lost to an OOM (samples 0, the job's OOM count 0 → 1)"}]
    assert before["lost_steps_count"] == 1 and "left_out" not in before  # not a "stall" either
    assert "1 lost step left out (step 20: lost to an OOM" in p.note
    assert p.evidence["verdict"]["result"] == "gain" and p.outcome == "kept"


def test_an_oom_step_in_the_decision_window_does_not_break_the_plan():
    # The same OOM step in the window a new decision reads: the plan goes on (the oom rule advises it).
    p = plan(state(neighbour_oom(n=24, oom_at=20)), RULES)
    assert p.advice_rule == "oom", p.note


def test_a_window_without_samples_decides_nothing_and_says_so():
    # The job reports step times and phases but no samples: generation-bound, and no throughput to judge a change on.
    p = plan(state(steps(0, 30, step_time=1.0, gen=0.9, comm=0.05, samples=None)), RULES)
    nothing(p)
    assert "no measurable throughput" in p.note, p.note


def test_a_verdict_whose_before_window_has_no_throughput_is_not_kept():
    # The garbage case: a change decided on a window whose samples/s was null. Its verdict formatted None (TypeError,
    # 30 plans in a row) and then closed as "kept (throughput not measurable)". Now: back to the known setting, named
    # "not measurable", to be measured again (not a verdict that holds against the move).
    history = steps(0, 30, step_time=1.0, gen=0.95, samples=None) + steps(30, 14, step_time=0.8, gen=0.75)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=30)],
                   decisions=[decision(before=None)]), RULES)
    assert (p.close, p.outcome, p.rollback_to) == (7, "rolled_back", 1), p.note
    assert "not measurable" in p.note and "kept" not in p.note
    assert p.evidence["not_measurable"]["side"] == "before" and p.evidence["remeasure"] is True


def test_a_verdict_whose_after_window_has_no_throughput_yet_waits():
    history = steps(0, 30, step_time=1.0, gen=0.95) + steps(30, 14, step_time=0.8, gen=0.75, samples=None)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=30)], decisions=[decision()]), RULES)
    assert p.close is None and "no measurable throughput after change 3 yet" in p.note, p.note


def test_gain_pct_is_what_the_verdict_read_not_the_windows_raw_throughput():
    # Periodic evaluation (issue 38): the before window holds one evaluation step 10× a training step, which the
    # verdict leaves out as a lone stalled period; the after window holds none. The raw samples/s of the two windows
    # differ by ~+30 % (where /v1/decisions' 31.21 came from) while the verdict read +0.0 %.
    history = (steps(0, 22, step_time=1.0, gen=0.6) + steps(22, 1, step_time=10.0, gen=0.6, ev=9.0)
               + steps(23, 7, step_time=1.0, gen=0.6) + steps(30, 40, step_time=1.0, gen=0.6))
    p = plan(state(history, job(batch=4), changes=[change(applied_step=30)], decisions=[decision()]), RULES)
    assert p.close == 7, p.note
    ratio_pct = 100.0 * (p.evidence["verdict"]["ratio"] - 1.0)
    assert p.evidence["gain_pct"] == pytest.approx(ratio_pct, abs=0.01)
    assert abs(p.evidence["gain_pct"]) < 1.0
    assert p.evidence["window_gain_pct"] > 25.0  # the raw figure, kept under its own name


def test_a_step_without_samples_in_the_before_window_is_a_lost_step_not_a_type_error():
    # One step of the before window reported no samples: the window's samples/s was null while its other periods
    # made a sample, and the verdict's figures formatted None (TypeError at every plan, 30 in a row).
    history = (steps(0, 25, step_time=1.0, gen=0.95) + steps(25, 1, step_time=1.0, gen=0.95, samples=None)
               + steps(26, 4, step_time=1.0, gen=0.95) + steps(30, 14, step_time=1.0 / 1.3, gen=0.9 / 1.3))
    p = plan(state(history, job(batch=4), changes=[change(applied_step=30)], decisions=[decision()]), RULES)
    assert (p.close, p.outcome) == (7, "kept"), p.note
    assert p.evidence["before_sample"]["lost_steps"] == [{"step": 25, "why": "no samples reported"}]
    assert p.evidence["gain_pct"] == pytest.approx(30.0, abs=0.5) and "1 lost step left out (step 25" in p.note
