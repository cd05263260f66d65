"""A value measured worse stays out until the job itself moved — its phase shares or its tokens per sample — by more
than the loss, not only its throughput level: a host that slows every step alike (the H200's regimes, a neighbour)
moves the level and leaves every relative effect as it was (src/trimtab/control/composition.py)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from tests.support.plans import RULES, change, decision, job, state, steps
from trimtab.control.bracket import blocked
from trimtab.control.composition import TOKENS_PER_SAMPLE, composition, moved
from trimtab.control.verdict import Sample

CTL = RULES.controller


def _job_steps(n: int, gen_share: float, tokens_per_sample: float = 512.0, slow: float = 1.0, seed: int = 1,
               first: int = 0) -> list:
    """Steps of 1 s (± 5 %) × ``slow``, ``gen_share`` of each generation, the rest update; 64 samples."""
    rng = random.Random(seed)
    out = []
    for s in steps(first, n, step_time=1.0):
        t = slow * (1 + rng.uniform(-0.05, 0.05))
        share = min(1.0, gen_share * (1 + rng.uniform(-0.02, 0.02)))
        out.append(replace(s, step_time_s=t, phases_s={"generation": share * t, "update": (1 - share) * t},
                           rl={"tokens": tokens_per_sample * 64 * (1 + rng.uniform(-0.03, 0.03))}))
    return out


def test_a_host_that_slows_every_step_alike_moves_no_part_of_the_job():
    then = composition(_job_steps(24, 0.7))
    assert set(then) == {"generation", "update", TOKENS_PER_SAMPLE}
    assert then["generation"][0] == pytest.approx(0.7, rel=0.01) and then["generation"][2] == 24
    assert moved(then, composition(_job_steps(24, 0.7, slow=1.2, seed=2)), math.log(1.07), CTL) is None


def test_a_phase_that_grew_or_lengths_that_grew_move_the_job():
    then = composition(_job_steps(24, 0.6))
    grew = moved(then, composition(_job_steps(24, 0.8, seed=2)), math.log(1.07), CTL)
    assert grew.startswith("generation share 60") and "→ 80" in grew, grew
    longer = moved(then, composition(_job_steps(24, 0.6, tokens_per_sample=1024, seed=3)), math.log(1.07), CTL)
    assert longer.startswith("tokens per sample 51") and "→ 102" in longer, longer
    # a shift smaller than the loss does not: 60 → 64 % of the step against a 7 % loss
    assert moved(then, composition(_job_steps(24, 0.64, seed=4)), math.log(1.07), CTL) is None
    assert moved(then, {}, math.log(1.07), CTL) == "nothing to compare"


def test_a_known_loser_stays_out_while_only_the_level_moved_and_is_tried_again_once_the_job_itself_moved():
    """16 → 64 measured −34 % (sure) and rolled back, the job at 16 again, the level now 60 % higher: with the
    verdict's composition, a level that moved alone (the host) keeps it out; the job's generation share moving by
    more than the loss lets it be tried again. A verdict recorded without one is judged by the level (as before),
    and so is one that could not tell."""
    before = _job_steps(24, 0.5)
    lost = decision(old=16, new=64, outcome="rolled_back",
                    evidence={"verdict": {"result": "worse", "ratio": 0.66},
                              "before_sample": Sample(12, math.log(40.0), 0.0001).evidence(),
                              "composition_before": composition(before)})
    action = RULES["generation_bound"].actions[0]
    level_moved = Sample(12, math.log(40.0 * 1.6), 0.0001)
    host_only = state(_job_steps(24, 0.5, slow=0.62, seed=5), job(batch=16), decisions=[lost])
    assert "rolled back" in blocked(host_only, RULES, action, 64.0, level_moved)
    job_moved = state(_job_steps(24, 0.95, seed=6), job(batch=16), decisions=[lost])
    assert blocked(job_moved, RULES, action, 64.0, level_moved) is None
    older = replace(lost, evidence={k: v for k, v in lost.evidence.items() if k != "composition_before"})
    assert blocked(state(_job_steps(24, 0.5, seed=5), job(batch=16), decisions=[older]), RULES, action, 64.0,
                   level_moved) is None
    # a verdict that could not tell is re-measured on the level alone: its windows may have straddled the host's
    # own move (the drifting host's sync move read +1.8 % across a 15 % slowdown)
    unsure = replace(lost, evidence={**lost.evidence, "verdict": {"result": "inconclusive", "ratio": 0.97},
                                     "back_to_known": True})
    assert blocked(replace(host_only, decisions=[unsure]), RULES, action, 64.0, level_moved) is None


# -- A, B, A′: the known setting measured again is every step at it since the move's own rollback ----------------------

def _drift_case(knob: str, old: float, new: float, ratio: float, known: float, after: float, n: int = 8):
    """A sure loss rolled back, with the composition of a job at 90 % generation (so that the level's move alone —
    the host — does not re-open it: only the drift retry could)."""
    return decision(id=5, knob=knob, old=old, new=new, outcome="rolled_back", applied_step=10,
                    evidence={"verdict": {"result": "worse", "ratio": ratio, "confidence_pct": 99.0},
                              "knobs": {"batch_size": 64 if knob != "batch_size" else old, "prefetch": 2,
                                        "sync_every": 1, knob: old},
                              "before_sample": Sample(n, math.log(known), 0.0004).evidence(),
                              "after_sample": Sample(n, math.log(after), 0.0004).evidence(),
                              "composition_before": composition(_job_steps(12, 0.9, seed=20))})


def test_a_drift_retry_reads_every_step_at_the_known_setting_since_the_rollback_not_a_later_slow_spell():
    """prefetch 2 → 4 read −11 % (99 % sure), back to 2 at step 20. A host that slowed right after (and stayed slow)
    explains the loss: tried again. A slow spell of 10 steps 80 steps later does not: among the 90 steps at 2 since
    the rollback it is one stretch (the regime-shifting host, seeds 2 and 16: a later regime read as the drift)."""
    lost = _drift_case("prefetch", 2, 4, 0.89, 64.0, 57.0)
    back = [change(id=7, knob="prefetch", value=2, previous=4, applied_step=20)]
    action = RULES["generation_bound"].actions[1]
    now = Sample(12, math.log(49.0), 0.0004)
    at = job(batch=64, prefetch=2, sync=1)
    spell = _job_steps(80, 0.9, first=20, seed=7) + _job_steps(10, 0.9, slow=1.3, first=100, seed=8)
    why = blocked(state(spell, at, changes=back, decisions=[lost]), RULES, action, 4.0, now)
    assert why is not None and "rolled back at decision 5" in why, why
    drifted = _job_steps(90, 0.9, slow=1.3, first=20, seed=9)
    assert blocked(state(drifted, at, changes=back, decisions=[lost]), RULES, action, 4.0, now) is None


def test_a_drift_retry_leaves_out_the_next_moves_trial_and_counts_the_known_setting_after_it_again():
    """batch 16 → 23 read −9 % (99 % sure), back to 16 at step 20; 16 → 8 was tried from 24 (slower, as batch 8 is)
    and went back at 54. The trial's steps are not A′; the steps at 16 before and after it are, and they read as
    before: the move stays out."""
    lost = _drift_case("batch_size", 16, 23, 0.91, 64.0, 58.2)
    moves = [change(id=7, knob="batch_size", value=16, previous=23, applied_step=20),
             change(id=8, knob="batch_size", value=8, previous=16, applied_step=24),
             change(id=9, knob="batch_size", value=16, previous=8, applied_step=54)]
    history = (_job_steps(4, 0.9, first=20, seed=12) + _job_steps(30, 0.9, slow=2.0, first=24, seed=13)
               + _job_steps(12, 0.9, first=54, seed=14))
    st = state(history, job(batch=16, prefetch=2), changes=moves, decisions=[lost])
    why = blocked(st, RULES, RULES["generation_bound"].actions[0], 23.0, Sample(12, math.log(51.0), 0.0004))
    assert why is not None and "rolled back at decision 5" in why, why
