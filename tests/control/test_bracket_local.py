"""A bracket move of a ×/÷ step is not made where the three values the verdicts tie together lie within one rung of
the action (×4 for the batch) and the parabola through their levels puts the move under the dead band
(src/trimtab/control/bracket.py: ``_worth_a_move``). The non-monotone batch curve (peak 24, falling past 32): 4 → 16
gained, 16 → 64 went back, 16 → 32 gained, 32 → 25 gained (+2.6 %): the levels at 16, 25 and 32 put 28 under 25,
and its trial went back — a second rollback of the knob in every run. Across more than a rung (4, 16, 64) the
parabola is not trusted: a curve with a kink is none there (it put 32 at −14 % where it is +11 %)."""

from __future__ import annotations

from tests.control.test_search import CLIMB, at, verdict


def test_a_bracket_move_within_one_rung_that_the_levels_put_under_the_dead_band_is_not_made():
    p = at(25, CLIMB + [verdict(4, 32, 25, "kept", 1.026, "gain")])
    assert p.change is None or p.change.knob != "batch_size", p.note
    assert any("the levels measured at 16, 25 and 32 put 28 at" in s and "under the 2 % dead band" in s
               for s in p.evidence["skipped"]), p.evidence.get("skipped")


def test_where_the_levels_put_the_top_inside_the_bracket_or_span_more_than_a_rung_the_move_is_made():
    # 32 read only 1 % under 25 after 16 → 25 measured +100 %: the levels put 28 at +3 % over 25, it is tried
    steep = [verdict(1, 4, 16, "kept", 2.16, "gain"), verdict(2, 16, 64, "rolled_back", 0.548, "worse"),
             verdict(3, 16, 25, "kept", 2.0, "gain"), verdict(4, 25, 32, "rolled_back", 0.99, "worse")]
    p = at(25, steep)
    assert p.change is not None and p.change.knob == "batch_size" and 25 < p.change.new_value < 32, p.note
    # 4, 16 and 64 (two rungs apart): the parabola says nothing, 32 is tried as before
    wide = at(16, CLIMB[:2])
    assert wide.change is not None and wide.change.new_value == 32, wide.note


def test_where_the_value_behind_spans_two_rungs_a_tied_value_beyond_the_bracket_draws_the_parabola():
    # the curve peaking at 16 (non-monotone, peak 16, noisy): 4 → 16 gained, 16 → 64 and 16 → 32 went back, sure.
    # 4, 16 and 32 span two rungs; 16, 32 and 64 lie within one and put 23 at −1 %: not tried (it went back in every
    # run, the knob's third rollback)
    peak16 = [verdict(1, 4, 16, "kept", 1.8865, "gain"), verdict(2, 16, 64, "rolled_back", 0.652, "worse"),
              verdict(3, 16, 32, "rolled_back", 0.9187, "worse")]
    p = at(16, peak16)
    assert p.change is None or p.change.knob != "batch_size", p.note
    assert any("the levels measured at 16, 32 and 64 put 23 at" in s and "under the 2 % dead band" in s
               for s in p.evidence["skipped"]), p.evidence.get("skipped")
    # the same bracket where 32 read only 1 % under 16: 16, 32 and 64 put 23 above the dead band, it is tried
    flat = peak16[:2] + [verdict(3, 16, 32, "rolled_back", 0.99, "worse")]
    q = at(16, flat)
    assert q.change is not None and q.change.knob == "batch_size" and 16 < q.change.new_value < 32, q.note


def test_a_level_measured_before_another_knob_moved_still_gives_the_curve_its_shape():
    # 8 → 16 gained +25 % at prefetch 0; prefetch moved to 2 since, then 16 → 32 went back (−8 %, sure): the gain no
    # longer holds as a level, but 8, 16 and 32 still draw the curve's shape and put 23 at −0.5 %: not tried (the
    # prefetch-then-sync jobs: 0 → 2 gained at sync 1, 2 → 4 went back at sync 8, and 3 went back too)
    at_prefetch2 = {"batch_size": 16, "prefetch": 2, "sync_every": 1}
    history = [verdict(1, 8, 16, "kept", 1.25, "gain"),
               verdict(2, 16, 32, "rolled_back", 0.92, "worse", knobs=at_prefetch2)]
    p = at(16, history, prefetch=2)
    assert p.change is None or p.change.knob != "batch_size", p.note
    assert any("the levels measured at 8, 16 and 32 put 23 at" in s for s in p.evidence["skipped"]), \
        p.evidence.get("skipped")
