"""Verdicts by a test on per-period throughputs, not a 3 % dead band, and larger steps on strong evidence (issue
15), on recorded step windows."""

from __future__ import annotations

import random

from tests.rebalancer.test_controller import RULES, acts, change, decision, job, state, steps
from trimtab.rebalancer.controller import plan


def noisy(first: int, n: int, step_s: float, noise: float, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = step_s * (1 + rng.uniform(-noise, noise))
        out += steps(first + i, 1, step_time=t, gen=0.9 * t, ev=0.01, comm=0.01)
    return out


def follow(history, applied=40):
    return plan(state(history, job(batch=4), changes=[change(applied_step=applied)],
                      decisions=[decision(before=None)]), RULES)


def test_a_noisy_small_change_lengthens_the_after_window_instead_of_deciding_by_chance():
    # ±20 % noise on 0.5 s steps, a −3 % change: the first 4 s after it cannot tell.
    history = noisy(0, 40, 0.5, 0.2, seed=1) + noisy(40, 9, 0.5 / 0.97, 0.2, seed=2)
    p = follow(history)
    assert p.close is None and "inconclusive so far" in p.note and "lengthening" in p.note


def test_an_inconclusive_change_at_the_bound_is_kept_as_no_measurable_gain():
    history = noisy(0, 40, 0.5, 0.2, seed=1) + noisy(40, 30, 0.5 / 0.97, 0.2, seed=2)
    p = follow(history)
    assert p.outcome == "kept" and p.evidence["no_gain"] is True and p.rollback_to is None
    assert p.evidence["after_window"]["seconds"] >= RULES.controller.verdict_max_after_s


def test_a_real_gain_in_noise_is_kept_as_a_gain_with_its_confidence():
    history = noisy(0, 40, 0.5, 0.2, seed=3) + noisy(40, 30, 0.5 / 1.35, 0.2, seed=4)  # +35 %
    p = follow(history)
    assert p.outcome == "kept" and "no_gain" not in p.evidence
    assert p.evidence["verdict"]["result"] == "gain" and p.evidence["verdict"]["confidence_pct"] > 99


def test_a_real_loss_in_noise_is_rolled_back_with_its_confidence():
    history = noisy(0, 40, 0.5, 0.2, seed=5) + noisy(40, 30, 0.5 / 0.8, 0.2, seed=6)  # −20 %
    p = follow(history)
    assert p.outcome == "rolled_back" and p.evidence["verdict"]["confidence_pct"] > 95
    assert p.evidence["verdict"]["ci_pct"][1] < 0


def test_communication_far_above_its_line_takes_the_strong_step():
    p = plan(state(steps(0, 3, gen=10.0, ev=5.0, comm=27.0)), RULES)  # comm 60 % of the step
    acts(p, "communication_bound", "sync_every", 1, 4)
    assert p.evidence["step_policy"][0].startswith("strong evidence (60.0 > 40")


def test_communication_just_above_its_line_takes_the_normal_step():
    acts(plan(state(steps(0, 3, gen=20.0, ev=10.0, comm=9.0)), RULES), "communication_bound", "sync_every", 1, 2)
