"""Periods that persist (a host whose speed shifts in regimes): the job's lag-1 autocorrelation at unchanged knobs,
measured on its own history, widens every window's spread — a window that sat in one fast regime is not a sure
gain. On recorded-by-hand histories."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from tests.support.plans import RULES, change, decision, job, state, steps
from trimtab.control.controller import plan
from trimtab.control.persistence import persistence
from trimtab.grading.rules import load_rules
from trimtab.grading.rules_parse import RulesError

import pytest


def timed(first: int, times: list[float]) -> list:
    """Steps of the given times (64 samples each, generation-bound)."""
    out = []
    for i, t in enumerate(times):
        out += steps(first + i, 1, step_time=t, gen=0.9 * t, ev=0.01, comm=0.01)
    return out


def regimes(n: int, seed: int, step_s: float = 0.8, switch: float = 0.12, slow: float = 1.2,
            noise: float = 0.05, start_slow: bool = False) -> list[float]:
    """Step times on a host that is 20 % slower for a while (~8 steps), then back, ±5 % besides."""
    rng, out, is_slow = random.Random(seed), [], start_slow
    for _ in range(n):
        if rng.random() < switch:
            is_slow = not is_slow
        out.append(step_s * (slow if is_slow else 1.0) * (1 + rng.uniform(-noise, noise)))
    return out


def independent(n: int, seed: int, step_s: float = 0.8, noise: float = 0.2) -> list[float]:
    rng = random.Random(seed)
    return [step_s * (1 + rng.uniform(-noise, noise)) for _ in range(n)]


def test_independent_periods_read_no_persistence():
    for seed in range(1, 6):  # ±20 % noise, 120 steps in three stretches: the estimate's own noise is not taken
        history = timed(0, independent(120, seed))
        changes = [change(id=1, applied_step=40), change(id=2, value=16, previous=4, applied_step=80)]
        assert persistence(state(history, job(batch=16), changes=changes), RULES).rho < 0.15


def test_regimes_read_as_persistence_and_widen_the_spread():
    history = timed(0, regimes(120, seed=3))
    kept = persistence(state(history, job(batch=4)), RULES)
    assert 0.3 < kept.rho <= RULES.controller.persistence_max
    assert kept.inflation > 1.8 and kept.var_floor == kept.var_log > 0


def test_periods_not_steps_a_sync_every_4_stretch_alternating_fast_and_slow_steps_is_not_persistent():
    # three fast steps and a slow sync step, over and over: step to step the times alternate (negative lag-1
    # correlation per step), period to period they are independent
    rng = random.Random(5)
    times = [0.25 * (1 + rng.uniform(-0.03, 0.03)) + (0.6 if (i + 1) % 4 == 0 else 0.0) for i in range(120)]
    the_job = job(sync=4, sync_max=8)
    changes = [change(knob="sync_every", value=4, previous=1, applied_step=0)]
    assert persistence(state(timed(0, times), the_job, changes=changes), RULES).rho < 0.15


def test_a_level_shift_made_by_a_change_is_not_persistence():
    # 60 steps at 0.8 s, a change, 60 at 0.4 s (twice as fast): one series would read ρ near 1; per stretch, none
    history = timed(0, independent(60, 1, noise=0.05)) + timed(60, independent(60, 2, step_s=0.4, noise=0.05))
    split = state(history, job(batch=16), changes=[change(value=16, previous=4, applied_step=60)])
    assert persistence(split, RULES).rho < 0.15


def test_a_warm_up_is_a_trend_not_persistence():
    # The first 80 steps twice as slow at first, settling (×(1 + e^(−step/10))), ±5 %: read with the stretch's mean
    # alone the warm-up's curve is "persistence" — and the widened spread would hide the warm-up from the trend test
    # (27 false gains on the warm-up bench over 10 seeds). The trend is taken out first.
    rng = random.Random(2)
    times = [0.3 * (1 + math.exp(-i / 10)) * (1 + rng.uniform(-0.05, 0.05)) for i in range(80)]
    assert persistence(state(timed(0, times), job(batch=4)), RULES).rho < 0.15


def test_persistence_max_caps_it_and_zero_switches_it_off():
    st = state(timed(0, regimes(200, seed=3, switch=0.03)), job(batch=4))
    capped = replace(RULES, controller=replace(RULES.controller, persistence_max=0.5))
    assert persistence(st, capped).rho == 0.5
    off = replace(RULES, controller=replace(RULES.controller, persistence_max=0.0))
    assert persistence(st, off).rho == 0.0 and persistence(st, off).var_floor is None


def test_persistence_max_must_be_below_one(tmp_path):
    bad = tmp_path / "rules.toml"
    bad.write_text("[controller]\npersistence_max = 1.0\n")
    with pytest.raises(RulesError, match="persistence_max: must be below 1"):
        load_rules(bad)


def test_a_window_that_sat_in_one_fast_regime_is_not_a_sure_gain():
    # A knob that does nothing, on a regime host: 100 steps of history at batch 4 (its persistence), the change at
    # step 100; the decision's before window ends in a slow regime, its after window runs fast. Without the job's
    # persistence the t-test took the calm, fast after window's periods as independent samples: a sure "gain" of
    # 20 % after 6 steps (interval ±2 %). With it, 6 steps are not enough to tell, and 14 give an interval 5× wider.
    def decided(n_after: int, rules):
        times = regimes(100, seed=11)
        times[88:100] = [0.96 * (1 + 0.02 * math.sin(i)) for i in range(12)]   # the before window: slow regime
        after = [0.8 * (1 + 0.02 * math.cos(i)) for i in range(n_after)]      # the after window: fast regime
        st = state(timed(0, times) + timed(101, after), job(batch=16),
                   changes=[change(value=16, previous=4, applied_step=100)],
                   decisions=[decision(old=4, new=16, before=None)])
        return plan(st, rules)

    off = replace(RULES, controller=replace(RULES.controller, persistence_max=0.0))
    was = decided(6, off)
    assert was.outcome == "kept" and was.evidence["verdict"]["result"] == "gain", was.note
    now = decided(6, RULES)
    assert now.close is None and "inconclusive so far" in now.note, now.note
    lo_was, hi_was = decided(14, off).evidence["verdict"]["ci_pct"]
    longer = decided(14, RULES)
    lo, hi = longer.evidence["verdict"]["ci_pct"]
    assert hi - lo > 5 * (hi_was - lo_was)
    assert longer.evidence["persistence"]["rho"] > 0.3 and longer.evidence["persistence"]["inflation"] > 2
