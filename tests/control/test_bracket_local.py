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
