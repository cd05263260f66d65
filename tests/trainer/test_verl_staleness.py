"""verl's staleness bound in numbers (``trimtab.trainer.adapters.verl_staleness``): arithmetic only, no verl."""

from __future__ import annotations

from trimtab.trainer.adapters.verl_staleness import versions_ahead


def test_how_far_the_rollouter_got_ahead_keeps_reached_its_bound_apart_from_did_not():
    """``versions_ahead`` (the mark, a whole number) against the knob's value, where staleness_threshold may be a
    fraction (verl's default is 0.1): ≥ the value exactly when verl's count reached its bound."""
    version = 4  # 2 samples a step × sync every 2
    for staleness in (0.1, 0.5, 1, 2, 2.5):
        bound = int(version * (staleness + 1))  # verl's max_required_samples
        for peak in range(0, bound + 3):
            mark = versions_ahead(peak, bound, version, staleness)
            assert (mark >= staleness) == (peak >= bound), (staleness, peak, mark)
            assert mark >= 0
    assert versions_ahead(6, 8, 4, 1) == 0   # half a version ahead: short of 1
    assert versions_ahead(12, 12, 4, 2) == 2  # two versions ahead, at its bound
