"""``bench/pooled_pairs.py``: the H200 reference figure pools paired blocks of runs on different days; its interval
must widen with the spread *between* runs, not only within them (pairs of one run share a day's host)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("pooled_pairs", Path(__file__).resolve().parents[2] / "bench" /
                                              "pooled_pairs.py")
pooled_pairs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pooled_pairs)


def test_the_interval_widens_with_the_spread_between_runs_at_the_same_pairs_and_mean():
    within = {"a": [90.0, 110.0] * 5, "b": [90.0, 110.0] * 5}  # each run spread, the runs agree
    between = {"a": [90.0] * 10, "b": [110.0] * 10}            # each run steady, the runs disagree
    a, b = pooled_pairs.pooled(within, draws=4000), pooled_pairs.pooled(between, draws=4000)
    assert a["mean_pct"] == b["mean_pct"] == 100.0 and a["pairs"] == b["pairs"] == 20
    assert b["per_run_pct"] == {"a": 90.0, "b": 110.0}
    width = lambda r: r["interval_pct"][1] - r["interval_pct"][0]  # noqa: E731
    assert width(b) > 1.5 * width(a)  # resampling pairs alone would give both the same
    assert b["interval_pct"] == (90.0, 110.0)  # two runs drawn: both a, both b, or one each


def test_a_run_given_without_pairs_is_refused():
    with pytest.raises(Exception, match="RUN=PCT"):
        pooled_pairs.parse_run("24=")
