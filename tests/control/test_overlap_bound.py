"""A prefetch raise can only hide the rest of the step behind generation (src/trimtab/control/overlap_bound.py): a
gain larger than the share of the step outside generation could bring is the host's, re-measured — not kept."""

from __future__ import annotations

import pytest

from tests.support.plans import RULES, change, decision, job, state, steps
from trimtab.control.controller import plan


def raised(gen_before: float, after_s: float = 0.85, earlier=()):
    """Prefetch 2 → 4 applied at step 20 on 1 s steps that spend ``gen_before`` s generating (the rest updating);
    the steps after it take ``after_s``, their phases in the same proportions."""
    history = (steps(0, 20, step_time=1.0, gen=gen_before, ev=None, comm=None)
               + steps(20, 1, step_time=1.0, gen=gen_before, ev=None, comm=None)
               + steps(21, 14, step_time=after_s, gen=gen_before * after_s, ev=None, comm=None))
    d = decision(id=9, change_id=3, knob="prefetch", old=2, new=4)
    return plan(state(history, job(prefetch=4), changes=[change(knob="prefetch", value=4, previous=2, applied_step=20)],
                      decisions=[d, *earlier]), RULES)


def test_a_gain_no_overlap_could_bring_is_re_measured_not_kept():
    # generation is the whole step at prefetch 2 (the rest already hidden): 4 cannot make it 15 % shorter
    p = raised(gen_before=1.0)
    assert (p.outcome, p.rollback_to, p.rollback_knob) == ("rolled_back", 2, "prefetch"), p.note
    assert p.evidence["verdict"]["result"] == "gain" and p.evidence["remeasure"] is True
    assert p.evidence["beyond_overlap"]["most_gain_pct"] == 0.0 and "to be re-measured" in p.note


@pytest.mark.parametrize("after_s", [0.85, 0.6])
def test_a_gain_the_hidden_share_can_bring_is_kept(after_s):
    # 40 % of the step outside generation: hiding it could bring +67 % — the +18 % is the move's, and so is a +67 %
    # (all of it hidden: the interval straddles the most, as a fast regime's reading of such a move does)
    p = raised(gen_before=0.6, after_s=after_s)
    assert (p.outcome, p.rollback_to) == ("kept", None), p.note
    assert "beyond_overlap" not in p.evidence


def test_read_so_twice_the_move_goes_back_to_the_known_setting():
    first = decision(id=5, change_id=2, knob="prefetch", old=2, new=4, outcome="rolled_back",
                     evidence={"reading": {}, "remeasure": True})
    p = raised(gen_before=1.0, earlier=[first])
    assert p.outcome == "rolled_back" and p.evidence.get("back_to_known") is True and "remeasure" not in p.evidence


def at_depth(gen: float, comm=None):
    """Prefetch 2 set at step 0 on 1 s steps spending ``gen`` s generating and ``comm`` in the weight sync (the rest
    updating); the batch at its max: generation-bound, the rule's next action is prefetch +2."""
    history = steps(0, 20, step_time=1.0, gen=gen, ev=None, comm=comm)
    return plan(state(history, job(batch=64, batch_max=64, prefetch=2),
                      changes=[change(knob="prefetch", value=2, previous=0, applied_step=0)]), RULES)


def test_a_prefetch_raise_with_nothing_left_to_hide_is_not_made():
    p = at_depth(gen=0.995)  # 0.5 % of the step outside generation: +0.5 % at most, under the dead band
    assert p.change is None or p.change.knob != "prefetch", p.note
    assert any("outside generation and the weight sync at prefetch=2" in s and "under the 2 % dead band" in s
               for s in p.evidence.get("skipped", [])), p.evidence.get("skipped")
    q = at_depth(gen=0.9)  # 10 % outside: up to +11 %, the raise is tried
    assert q.change is not None and (q.change.knob, q.change.new_value) == ("prefetch", 4), q.note


def test_the_weight_sync_is_not_a_share_a_raise_can_hide():
    # 10 % of the step in the weight sync, the rest generating: the sync pauses generation, so no queue depth runs
    # ahead through it (the bank job, seed 5, tried 2 → 4 on a 4 % sync share and lost 7 % while it was judged)
    p = at_depth(gen=0.9, comm=0.1)
    assert p.change is None or p.change.knob != "prefetch", p.note
    assert any("+0.0 %, under the 2 % dead band" in s for s in p.evidence.get("skipped", [])), p.evidence.get("skipped")
