"""Workloads the rebalancer was not designed on (issue 15), end to end on a CPU: a synthetic job posts its step
reports to a live API (real store, real Rebalancer on every report) and applies the changes that come back (the
workloads and the scoring live in ``bench/workloads.py``, which runs them over several seeds for BENCHMARKS.md).
Each workload's best static setting is measured in the same test.

The goal for each: ≥ 95 % of its best static setting within 60 steps (and staying there to the end of the run),
no OOM, no change kept that measured worse with confidence, no gain kept that the static settings do not show
(warm-up credited to a change), no value measured worse with confidence tried again without the job having moved.
"""

from __future__ import annotations

import pytest

from bench.workloads import GOAL_STEPS, WORKLOADS, run, score
from trimtab.control.service import Rebalancer


@pytest.mark.parametrize("key", list(WORKLOADS))
def test_workload_reaches_its_best_static_setting_within_60_steps(sqlite_api, key):
    w = WORKLOADS[key]()
    sqlite_api.ctx.after_report = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules).after_report
    s = score(w, run(sqlite_api.http, sqlite_api.token("job"), w, seed=11))
    print(f"\n{s.line()}")
    assert s.ooms == 0
    assert s.kept_worse == []
    assert s.false_gains == [] and s.retried == [], s.line()
    assert s.within is not None and s.within <= GOAL_STEPS, s.line()
    assert s.reached >= 0.95, s.line()
