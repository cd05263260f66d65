"""Drifting jobs (issue 38): the length's trend read through a turn, a batch bound by memory that follows the memory
line at every step (kept once run, not verdict-tested), and a first climb that takes two rungs where memory has room
for them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.control.test_memory_forecast import CTL, MIB, TOTAL, kv, moving
from tests.support.plans import GIB, RULES, acts, change, decision, job, state
from trimtab.control.controller import plan
from trimtab.control.memory_fit import fit
from trimtab.control.memory_follow import CAPPED, CLIMB, FOLLOW, climb_settings, climb_window_x, follow_steps, landing_steps

ROOM = (CTL.memory_line_pct - CTL.memory_margin_pct) / 100 * TOTAL - 2 * GIB  # under the line, less the margin


def v_shaped(step: int) -> float:
    """Tokens per sample that shrink 400 → 130 over 120 steps, then grow 1.5 a step (a curriculum's turn)."""
    return 400 - 2.25 * step if step < 120 else 130 + 1.5 * (step - 120)


def test_the_length_trend_sees_a_turn_from_shrinking_to_growing():
    # 30 steps (of 0.3 s) after the turn: a line through minutes of lengths still read them as shrinking, and "now"
    # 20 % low — a raise sized there met the longer sequences (the curriculum's OOMs after a raise).
    history = moving(0, 150, lambda s: 100, v_shaped, kv(2.0, 4.5), step_time=0.3)
    f = fit(history, [], "batch_size", 100, CTL)
    assert f.length_per_s == pytest.approx(1.5 / 0.3, rel=0.15)
    assert f.length_now == pytest.approx(v_shaped(149), rel=0.02)


def test_a_shrinking_length_is_read_at_the_newest_steps_not_off_a_bent_line():
    # 512 → 130 tokens over 200 steps whose time shortens with the length (0.8 s → 0.2 s): in step time the length
    # falls ever faster, and a line through it read "now" 27 % high — the shrinking job's batch sat a quarter under
    # what fit at its end
    def length(s: int) -> float:
        return 512 - 1.92 * s

    history = [replace(s, step_time_s=0.8 * length(s.step) / 512)
               for s in moving(0, 200, lambda s: 100, length, kv(2.0, 4.5))]
    f = fit(history, [], "batch_size", 100, CTL)
    assert f.length_now == pytest.approx(length(198), rel=0.02)


def bound_job(lengths, n=40, applied=20, old=16, new=60, capped=True, outcome="kept", result="gain"):
    """A batch raised 16 → 60 at ``applied`` (its verdict in), steps at 60 since."""
    history = moving(0, n, lambda s: old if s < applied else new, lengths, kv(2.0, 4.5), step_time=0.5)
    evidence = {"reading": {}, "verdict": {"result": result}, **({CAPPED: True} if capped else {})}
    d = decision(outcome=outcome, old=old, new=new, evidence=evidence, applied_step=applied)
    return history, [change(value=new, previous=old, applied_step=applied)], [d]


def test_a_batch_bound_by_memory_rises_to_the_line_at_once_as_lengths_shrink():
    # 60 was the line at 480 tokens; four steps later at 400 tokens the fit has room for ~70: moved there now,
    # not after a window and a verdict-tested rung
    history, changes, decisions = bound_job(lambda s: 480 if s < 36 else 400)
    p = plan(state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions), RULES)
    expected = int(ROOM // (400 * 4.5 * MIB))
    acts(p, "memory_forecast", "batch_size", 60, expected)
    assert FOLLOW in p.evidence and p.wait.steps == 1 and p.wait.seconds == 0


def test_a_raise_rolled_back_or_kept_flat_does_not_bind_the_batch_by_memory():
    lengths = lambda s: 480 if s < 36 else 400  # noqa: E731
    for outcome, result in (("rolled_back", "worse"), ("kept", "inconclusive")):
        history, changes, decisions = bound_job(lengths, outcome=outcome, result=result)
        p = plan(state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions), RULES)
        assert p.change is None or FOLLOW not in p.evidence, p.note
    history, changes, decisions = bound_job(lengths)  # the same raise kept for a gain: followed
    p = plan(state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions), RULES)
    assert p.change is not None and FOLLOW in p.evidence, p.note


def test_a_raise_that_was_not_cut_binds_only_where_its_next_rung_would_not_fit():
    # 4 → 16 gained at 400 tokens: the next ×4 rung (64) fits, so it is measured, not followed; 15 → 60 gained and
    # the next rung (240) does not fit: followed to the line, no rung measured
    history, changes, decisions = bound_job(lambda s: 400, old=4, new=16, capped=False)
    p = plan(state(history, job(batch=16, batch_max=512), changes=changes, decisions=decisions), RULES)
    assert p.change is None or FOLLOW not in p.evidence, p.note
    history, changes, decisions = bound_job(lambda s: 400, old=15, new=60, capped=False)
    p = plan(state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions), RULES)
    acts(p, "memory_forecast", "batch_size", 60, int(ROOM // (400 * 4.5 * MIB)))
    assert FOLLOW in p.evidence


def test_a_memory_bound_batch_is_lowered_for_its_next_steps_as_lengths_grow():
    history, changes, decisions = bound_job(lambda s: 480 + 3 * s, n=60)
    p = plan(state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions), RULES)
    assert p.change is not None and p.change.new_value < 60 and FOLLOW in p.evidence, p.note
    ahead = CTL.memory_follow_lookahead_steps * 0.5
    at = p.evidence["memory_prediction"]["tokens_per_sample_at"]
    assert at == pytest.approx(480 + 3 * 59 + 3 / 0.5 * ahead, abs=3)  # sized for its next steps, not 5 s


def test_a_memory_bound_batch_is_sized_until_its_next_move_can_land():
    # the raise was decided on a window ending at step 19 and took effect at 20: the job applies a change at its
    # next step, so a move decided now lands at the next step, is kept once the step after shows its peak, and the
    # move after it lands a step later — sized for 2 steps, not 4; where changes landed 3 steps after their
    # decision, for 6
    sized = {}
    for decided in (19, 17):
        history, changes, decisions = bound_job(lambda s: 480 + 3 * s, n=60)
        d = decisions[0]
        decisions = [replace(d, evidence={**d.evidence, "window": {"steps": [10, decided]}})]
        st = state(history, job(batch=60, batch_max=512), changes=changes, decisions=decisions)
        assert landing_steps(st) == 20 - decided
        p = plan(st, RULES)
        assert p.change is not None and FOLLOW in p.evidence and p.evidence["decided_at_step"] == 59, p.note
        sized[decided] = p.evidence["memory_prediction"]["tokens_per_sample_at"]
    assert sized[19] == pytest.approx(480 + 3 * 59 + 3 * 2, abs=3)
    assert sized[17] == pytest.approx(480 + 3 * 59 + 3 * 6, abs=3)
    assert follow_steps(st, RULES) == 6


def test_a_following_move_is_kept_once_the_job_ran_at_it():
    history, changes, decisions = bound_job(lambda s: 480, n=43)
    follow = decision(id=8, change_id=4, old=60, new=66, rule="memory_forecast",
                      evidence={"reading": {}, FOLLOW: {"anchor_decision": 7}})
    applied = change(id=4, value=66, previous=60, applied_step=41)
    p = plan(state(history, job(batch=66, batch_max=512), changes=[applied] + changes,
                   decisions=[follow] + decisions), RULES)
    assert p.close == 8 and p.outcome == "kept" and p.rollback_to is None, p.note


def test_a_capped_raise_says_so_in_its_evidence():
    history = moving(0, 20, lambda s: 8 if s < 10 else 16, lambda s: 256 + 3 * s, kv(2.0, 15.0))
    p = plan(state(history, job(batch=16, batch_max=256), changes=[change(value=16, previous=8, applied_step=10)]),
             RULES)
    assert p.change is not None and p.evidence.get(CAPPED) is True, p.note


def test_the_first_raise_goes_as_far_as_memory_allows_where_it_has_room_for_two_rungs():
    history = moving(0, 20, lambda s: 4, lambda s: 128, kv(2.0, 4.5), step_time=0.3, gen=0.29)
    p = plan(state(history, job(batch=4, batch_max=1024)), RULES)
    upper = fit(history, [], "batch_size", 4, CTL).largest_fitting(128)  # one batch size seen: an upper bound
    assert 64 < upper < 256
    acts(p, "generation_bound", "batch_size", 4, upper)
    assert 2 * GIB + upper * 128 * 4.5 * MIB < ROOM + 2 * GIB  # it fits
    # where memory has room for one rung only, one rung
    tight = moving(0, 20, lambda s: 4, lambda s: 128, kv(20.0, 4.5), step_time=0.3, gen=0.29)
    acts(plan(state(tight, job(batch=4, batch_max=1024)), RULES), "generation_bound", "batch_size", 4, 16)


def test_a_climb_of_r_rungs_is_decided_and_judged_on_windows_one_r_squared_as_long():
    # a t-test needs samples in the inverse square of the effect: ×16 (2 rungs of ×4) on a quarter of a window,
    # ×64 on a ninth, never under 3 steps; no longer than memory_first_window_x, and off at 1
    assert climb_window_x(RULES, 4, 64, 4) == pytest.approx(0.25)
    assert climb_window_x(RULES, 4, 32, 4) == pytest.approx(1 / 1.5 ** 2)
    assert climb_window_x(RULES, 4, 256, 4) == pytest.approx(1 / 9)
    ninth = climb_settings(CTL, 1 / 9)
    assert ninth.window_min_s == pytest.approx(CTL.window_min_s / 9) and ninth.window_min_steps == 3
    assert ninth.window_enough_steps == 3 and climb_settings(CTL, 1.0) is CTL
    assert climb_window_x(RULES, 4, 8, 4) == pytest.approx(CTL.memory_first_window_x)  # half a rung: the cap
    off = replace(RULES, controller=replace(CTL, memory_first_window_x=1.0))
    assert climb_window_x(off, 4, 64, 4) == 1.0


def test_the_first_window_is_as_short_as_the_climb_it_decides_needs():
    # 0.3 s steps: a window is 4 s (14 steps); before a climb of ×30 (2.5 rungs of ×4) 3 steps decide (the half
    # window of 7 steps cost 4 more steps at batch 4, a thirtieth of what fits)
    history = moving(0, 8, lambda s: 4, lambda s: 128, kv(2.0, 4.5), step_time=0.3, gen=0.29)
    p = plan(state(history, job(batch=4, batch_max=1024)), RULES)
    assert p.change is not None and p.evidence["window"]["n_steps"] == 3, p.note
    x = p.evidence[CLIMB]["window_x"]
    assert x == pytest.approx(climb_window_x(RULES, 4, p.change.new_value, 4)) and x < 0.2
    tight = moving(0, 8, lambda s: 4, lambda s: 128, kv(20.0, 4.5), step_time=0.3, gen=0.29)
    assert plan(state(tight, job(batch=4, batch_max=1024)), RULES).change is None
    # 1 s steps: a sixth of 4 s is one step, but a window holds 3 at least
    slow = moving(0, 2, lambda s: 4, lambda s: 128, kv(2.0, 4.5), step_time=1.0, gen=0.97)
    assert plan(state(slow, job(batch=4, batch_max=1024)), RULES).change is None
    p = plan(state(moving(0, 3, lambda s: 4, lambda s: 128, kv(2.0, 4.5), step_time=1.0, gen=0.97),
                   job(batch=4, batch_max=1024)), RULES)
    assert p.change is not None and p.evidence["window"]["n_steps"] == 3, p.note


def test_a_first_climb_is_judged_once_an_equally_short_after_window_is_in():
    history = moving(0, 17, lambda s: 4 if s < 9 else 110, lambda s: 128, kv(2.0, 4.5), step_time=0.3, gen=0.29)
    climb = decision(old=4, new=110, evidence={"reading": {}, "knobs": {"batch_size": 4},
                                              "first_climb": {"rungs": 2, "window_x": 0.5}})
    p = plan(state(history, job(batch=110, batch_max=1024), changes=[change(value=110, previous=4, applied_step=9)],
                   decisions=[climb]), RULES)
    assert p.close == climb.id and p.outcome == "kept", p.note


@pytest.mark.parametrize("last", range(4))
def test_a_move_is_sized_for_one_step_as_long_as_the_lengths_run_not_their_newest_mean(last):
    # lengths ±3 % step to step around 200 (194, 200, 206, 200, …): the mean of the newest three reads 198–202,
    # and a batch sized there at 94 % of the GPU OOMed on the next 206 (the curriculum, seed 13, at its turn)
    pattern = [194, 200, 206, 200]
    n = 40 + last
    history = moving(0, n, lambda s: 100, lambda s: pattern[s % 4], kv(2.0, 4.5), step_time=0.3)
    f = fit(history, [], "batch_size", 100, CTL)
    assert f.length_ahead(0.0) >= max(pattern)
    assert f.predict(f.largest_fitting(f.length_ahead(0.0)), max(pattern)) <= ROOM + 2 * GIB


def test_lengths_on_a_line_add_no_spread_nor_noise_around_a_growing_trend():
    history = moving(0, 40, lambda s: 100, lambda s: 200 + 2 * s, kv(2.0, 4.5), step_time=0.3)
    f = fit(history, [], "batch_size", 100, CTL)
    assert f.length_spread == pytest.approx(0.0, abs=1e-6)
    # ±3 % around a trend that grows 6 % in the short line's 5 s: sized for the trend, the margin covers the steps
    # (the spread on top cost the growing bench job 2–3 % of its throughput, with no OOM before it)
    noisy = moving(0, 40, lambda s: 100, lambda s: (200 + 2 * s) * (0.97, 1.0, 1.03, 1.0)[s % 4], kv(2.0, 4.5),
                   step_time=0.3)
    g = fit(noisy, [], "batch_size", 100, CTL)
    assert g.length_per_s > 0 and g.length_spread == 0.0
