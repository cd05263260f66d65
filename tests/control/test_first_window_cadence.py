"""The job's first window is looked at every step while a first climb could still shorten it
(src/trimtab/control/memory_follow.py: ``climb_possible``): on the drifting bench's growing job with a validation every
20 steps (seed 17) the memory fit read on three steps forecast no room for a climb, the plan waited for a full
4 s window, and the first decision came at step 18 (135.5 % of the static batch); a fit a few steps later had room.
A job that reports no allocator peaks is planned per window, as before."""

from __future__ import annotations

from tests.control.test_memory_raises import with_memory
from tests.support.plans import RULES, job, state, steps
from trimtab.control.controller import Wait, plan

SHORT = dict(step_time=0.2, gen=0.19, ev=0.0, comm=0.0, samples=4)


def test_a_first_window_that_a_climb_could_shorten_is_planned_at_every_step():
    # batch 4 at 100 GiB of 141: the fit has no room for two rungs (×16) now, so no shorter window yet
    crowded = with_memory(steps(0, 3, **SHORT), lambda s: 100.0)
    p = plan(state(crowded, job(batch=4)), RULES)
    assert p.gate is not None and p.gate.name == "collecting_steps", p.note
    assert p.wait == Wait(steps=1), p.wait
    assert p.gate.expects_step is not None and p.gate.expects_step > 3  # the gate still says when the full one is in


def test_without_allocator_peaks_or_once_a_move_was_decided_the_first_window_waits_as_before():
    bare = steps(0, 3, **SHORT)
    p = plan(state(bare, job(batch=4)), RULES)
    assert p.wait.seconds > 3.0 and p.wait.enough_steps == 17, p.wait  # a 4 s window: 3.4 s or 17 steps more
    off = RULES.with_overrides({"controller": {"memory_first_window_x": 1.0}})
    crowded = with_memory(steps(0, 3, **SHORT), lambda s: 100.0)
    assert plan(state(crowded, job(batch=4)), off).wait.seconds > 3.0
