"""A side of a verdict that holds one sync period is given the job's own step noise from its earlier settings
(src/trimtab/control/persistence.py, verdict.py), not the assumed 10 % a step: the bench's banking job (±5 % a step)
ran prefetch 4 (−7 % true, at sync 8) for 16 steps past its drain because one period each side read
"inconclusive"; and a raise of the queue knob is not judged on its drain alone (drain.py)."""

from __future__ import annotations

import math
import statistics

from tests.control.test_drain import _history, _judge, _synced
from tests.support.plans import RULES, change, job, state, steps
from trimtab.control.drain import drain_only
from trimtab.control.persistence import ASSUMED_NOISE_DOF, MIN_STEP_NOISE_DOF, persistence
from trimtab.control.verdict import INCONCLUSIVE, WORSE, Sample, compare

SPREAD = (1.03, 0.97, 1.01, 0.99, 1.02, 0.98, 1.0, 1.03, 0.98, 0.99, 1.02, 0.97, 1.01, 1.0, 0.99, 1.02, 0.98, 1.01,
          0.97, 1.03)  # about ±2 % a step, no trend


def _spread_steps(first: int, n: int, x: float = 1.0, wide: float = 1.0) -> list:
    """``n`` steps of 0.5 s × ``x``, each off by SPREAD (``wide`` times as far from 1)."""
    out = []
    for i in range(first, first + n):
        out += steps(i, 1, step_time=0.5 * x * (1 + wide * (SPREAD[i % len(SPREAD)] - 1)), gen=0.4, ev=0.0,
                     comm=0.0, samples=16)
    return out


def test_the_step_noise_is_read_from_closed_stretches_and_not_from_the_one_in_flight():
    moved = change(id=5, knob="prefetch", value=2, previous=0, applied_step=20)
    quiet = _spread_steps(0, 20) + _spread_steps(20, 20)
    loud = _spread_steps(0, 20) + _spread_steps(20, 20, wide=10.0)  # the setting now: its spread is not the job's
    a = persistence(state(quiet, job(prefetch=2), changes=[moved]), RULES).step_noise
    b = persistence(state(loud, job(prefetch=2), changes=[moved]), RULES).step_noise
    assert a is not None and a == b, (a, b)
    var, dof = a
    logs = [math.log(16 / s.step_time_s) for s in quiet[:20]]
    prior = math.log1p(RULES.controller.assumed_noise_pct / 100.0) ** 2
    pooled = (19 * statistics.variance(logs) + ASSUMED_NOISE_DOF * prior) / (19 + ASSUMED_NOISE_DOF)
    assert dof == 19 + ASSUMED_NOISE_DOF and math.isclose(var, pooled, rel_tol=1e-6), (a, pooled)
    assert var < prior  # a quiet job's one-period sides are judged quieter than the assumed 10 % a step
    # too little history: no figure (the assumed noise stays)
    early = change(id=5, knob="prefetch", value=2, previous=0, applied_step=MIN_STEP_NOISE_DOF)
    short = _spread_steps(0, MIN_STEP_NOISE_DOF) + _spread_steps(MIN_STEP_NOISE_DOF, 20)
    assert persistence(state(short, job(prefetch=2), changes=[early]), RULES).step_noise is None


def test_one_period_a_side_is_judged_on_the_job_s_step_noise_where_its_history_shows_it():
    before, after = _synced(30, 8, 1.0), _synced(47, 8, 1.07)  # one period of sync 8 each, 7 % slower after
    ctl = RULES.controller
    assumed = compare(Sample.of_steps(before, 8), Sample.of_steps(after, 8), ctl)
    assert assumed.result == INCONCLUSIVE and "assumed noise" in assumed.method, assumed
    history = (math.log1p(0.02) ** 2, 20)  # ±2 % a step, 20 degrees of freedom
    own = compare(Sample.of_steps(before, 8, history=history), Sample.of_steps(after, 8, history=history), ctl)
    assert own.result == WORSE and "history" in own.method, own
    evidence = Sample.of_steps(after, 8, history=history).evidence()
    assert evidence["step_var_dof"] == 20, evidence
    # a noisier history keeps it inconclusive: the figure is the job's, not a smaller constant
    loud = (math.log1p(0.2) ** 2, 20)
    assert compare(Sample.of_steps(before, 8, history=loud), Sample.of_steps(after, 8, history=loud),
                   ctl).result == INCONCLUSIVE


def test_a_queue_raise_is_not_judged_on_its_drain_alone_and_is_judged_one_period_past_it():
    raise_ = change(id=5, knob="prefetch", value=4, previous=2, applied_step=38)
    drain = _history(bank=0.85, after=0)  # steps 39–46: the drain only, 9 % fast
    assert drain_only(raise_, RULES, [s for s in drain if s.step >= 39], 39, 8)
    waiting = _judge(drain)
    assert waiting.outcome is None and "measuring" in waiting.note, (waiting.outcome, waiting.note)
    past = _history(bank=0.85, after=8)  # … and one period of the setting itself
    assert not drain_only(raise_, RULES, [s for s in past if s.step >= 39], 39, 8)
    judged = _judge(past)
    assert judged.outcome == "rolled_back" and judged.evidence["verdict"]["result"] == "worse", judged.note
    assert judged.evidence["after_window"]["steps"] == [47, 54], judged.evidence["after_window"]
    # a cut, or another knob, never waits for a drain
    cut = change(id=5, knob="prefetch", value=2, previous=4, applied_step=38)
    sync = change(id=5, knob="sync_every", value=8, previous=2, applied_step=38)
    assert not drain_only(cut, RULES, [], 39, 8) and not drain_only(sync, RULES, [], 39, 8)


def test_a_queue_raise_s_drain_is_not_read_as_the_job_s_noise():
    # prefetch 0 → 2 at step 10: 8 steps of drain (settle.py: 4 a unit) 15 % fast, then the setting; the next
    # change at step 40 closes the stretch
    raise_ = change(id=5, knob="prefetch", value=2, previous=0, applied_step=10)
    later = change(id=6, knob="batch_size", value=32, previous=16, applied_step=40)

    def noise(bank: float):
        history = (_spread_steps(0, 10) + _spread_steps(10, 1) + _spread_steps(11, 8, x=bank)
                   + _spread_steps(19, 21) + _spread_steps(40, 10))
        return persistence(state(history, job(batch=32, prefetch=2), changes=[raise_, later]), RULES).step_noise

    assert noise(0.85) is not None and noise(0.85) == noise(1.0), (noise(0.85), noise(1.0))
