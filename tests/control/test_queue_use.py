"""A deeper queue only where the queue was ever full (src/trimtab/control/queue_use.py). On the H200 reference
pipeline at batch 64 the worker never had more than one batch waiting, at prefetch 2 or 4 (runs 24–26): generation
was the bottleneck, the deeper queue stayed empty, and its trials (read −21 to +11 %) only cost steps. A job that
reports its queue's high-water mark below the depth is not sent deeper; a job that does not report it decides as
before."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest

from tests.support.loop_job import JOB, KNOBS, report
from tests.support.plans import RULES, THROUGHPUT_ONLY, acts, change, decision, job, state, steps
from trimtab.control.controller import plan
from trimtab.control.queue_use import queue_unused


def _generation_bound(high_water: Optional[list], n: int = 40) -> list:
    """``n`` steps of a job at batch 64 (its max) and prefetch 2, generation 95 % of each 0.8 s (± 3 %) step, each
    step's queue high-water mark from ``high_water`` (cycled; None: not reported)."""
    out = []
    for i in range(n):
        t = 0.8 * (1.03 if i % 2 else 0.97)
        s = steps(i, 1, step_time=t, gen=0.95 * t, ev=0.02 * t, comm=0.01 * t)[0]
        mark = None if high_water is None else high_water[i % len(high_water)]
        out.append(replace(s, reported={} if mark is None else {"queue_high_water": mark}))
    return out


AT_BEST = job(batch=64, prefetch=2, sync=4)


def test_a_queue_that_never_filled_is_not_made_deeper_and_the_plan_says_why():
    p = plan(state(_generation_bound([1, 0]), AT_BEST), RULES)
    assert p.change is None and p.advice_rule == "generation_bound", p.note
    skipped = " | ".join(p.evidence["skipped"])
    assert "prefetch +2: the queue never held more than 1 of the 2 its depth allows" in skipped, skipped
    assert "batch_size ×4: batch_size is at its max (64)" in skipped, skipped


def test_a_queue_that_filled_to_its_depth_once_at_it_may_be_made_deeper():
    acts(plan(state(_generation_bound([1, 1, 2, 1]), AT_BEST), RULES), "generation_bound", "prefetch", 2, 4)


def test_a_job_that_does_not_report_its_queue_or_not_on_every_step_decides_as_before():
    acts(plan(state(_generation_bound(None), AT_BEST), RULES), "generation_bound", "prefetch", 2, 4)
    acts(plan(state(_generation_bound([1, None]), AT_BEST), RULES), "generation_bound", "prefetch", 2, 4)


def test_switched_off_by_the_rules_the_queue_is_made_deeper_as_before():
    off = RULES.with_overrides({"controller": {"queue_raise_needs_fill": False}})
    assert RULES.controller.queue_raise_needs_fill is True  # as shipped
    acts(plan(state(_generation_bound([1, 0]), AT_BEST), off), "generation_bound", "prefetch", 2, 4)


def test_only_a_raise_of_the_queue_knob_is_held_and_a_queue_of_depth_0_is_always_full():
    never = state(_generation_bound([0], n=8), AT_BEST)
    assert queue_unused(never, RULES, "prefetch", 2, 4) is not None
    assert queue_unused(never, RULES, "prefetch", 2, 1) is None   # a lower
    assert queue_unused(never, RULES, "sync_every", 2, 4) is None  # another knob
    assert queue_unused(never, RULES, "prefetch", 0, 2) is None   # no queue yet: nothing to read off it
    assert queue_unused(state([], AT_BEST), RULES, "prefetch", 2, 4) is None


def test_the_steps_read_are_those_at_the_depth_since_it_was_set_not_only_the_window():
    """A bursty job fills its queue now and then: once at this depth is enough to let it deeper. Steps at the depth
    before (prefetch 0 → 2 applied at 20, its settle step 21) do not count."""
    filled_before_the_raise = _generation_bound([2] * 21 + [1] * 19)
    raised = change(id=1, knob="prefetch", value=2, previous=0, applied_step=20)
    assert "steps 21–39" in queue_unused(state(filled_before_the_raise, AT_BEST, changes=[raised]), RULES,
                                         "prefetch", 2, 4)
    filled_once_early = _generation_bound([1] * 22 + [2] + [1] * 17)  # step 22: long before the newest window
    assert queue_unused(state(filled_once_early, AT_BEST, changes=[raised]), RULES, "prefetch", 2, 4) is None


@pytest.mark.parametrize("high_water, decided", [(1, ("advised", None)), (2, ("pending", 4))])
def test_through_the_api_the_mark_a_job_reports_is_what_the_rebalancer_reads(loop_api, rebalancer, high_water,
                                                                             decided):
    """The mark goes the way a job sends it (a step report's top-level field), is stored and folded, and the
    rebalancer on its own thread reads it: below the depth, an advice naming the queue; at the depth, prefetch 2 → 4."""
    api = loop_api
    at_best = {**JOB, "knobs": {**KNOBS, "batch_size": {"value": 64, "min": 1, "max": 64},
                                "prefetch": {"value": 2, "min": 0, "max": 8}},
               "rules": THROUGHPUT_ONLY}  # it reports no learning signal: its prefetch declared throughput-only
    assert api.post("/v1/jobs", at_best, scope="job").status_code == 201
    for i in range(12):
        t = 1.0 * (1.03 if i % 2 else 0.97)
        body = {**report(i, step_time=t, gen=0.95 * t), "queue_high_water": high_water}
        assert api.post("/v1/jobs/ppo/reports", body, scope="job").status_code == 200
    assert rebalancer.wait_planned()
    d = next(d for d in api.get("/v1/decisions", job="ppo").json()["decisions"] if d["rule"] == "generation_bound")
    assert (d["outcome"], d["new_value"]) == decided, d
    if high_water < 2:
        assert any("the queue never held more than 1 of the 2 its depth" in s for s in d["evidence"]["skipped"]), d
    stored = api.get("/v1/jobs/ppo/reports", limit=1).json()["reports"][0]
    assert stored["queue_high_water"] == high_water


def test_a_raise_made_on_a_full_queue_is_judged_after_its_bank_drained_and_one_with_room_from_its_settle_step():
    """The check lets a raise go right after the queue filled: the trainer then takes the banked batches without
    waiting and the raise's first steps read the bank (the bursty queue: +37.8 % kept for a 1 % effect). Its own
    after window starts after the drain (4 steps a unit raised) where the last step at the old depth had the queue
    full; with room left, or no mark reported, or a raise from 0, at its settle step as before."""
    from trimtab.control.queue_use import own_verdict_from

    raised = change(id=1, knob="prefetch", value=4, previous=2, applied_step=20)
    settle = RULES.controller.settle_steps
    full_at_raise = _generation_bound([1] * 19 + [2] + [1] * 20)       # step 19 (the last at depth 2): full
    room_at_raise = _generation_bound([2] * 19 + [1] + [1] * 20)       # full before, not at the raise
    assert own_verdict_from(raised, RULES, full_at_raise) == 20 + settle + 8
    assert own_verdict_from(raised, RULES, room_at_raise) == 20 + settle
    assert own_verdict_from(raised, RULES, _generation_bound(None)) == 20 + settle
    from_zero = change(id=1, knob="prefetch", value=2, previous=0, applied_step=20)
    assert own_verdict_from(from_zero, RULES, _generation_bound([0])) == 20 + settle
    cut = change(id=1, knob="prefetch", value=1, previous=2, applied_step=20)
    assert own_verdict_from(cut, RULES, full_at_raise) == 20 + settle
    # the follow-up of the change in flight measures from there
    in_flight = state(full_at_raise[:24], job(batch=64, prefetch=4, sync=4), changes=[raised],
                      decisions=[decision(id=7, change_id=1, knob="prefetch", old=2, new=4)])
    assert plan(in_flight, RULES).note.startswith(f"measuring throughput after change 1 (from step {20 + settle + 8})")
