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

from bench.workloads import GOAL_STEPS, WORKLOADS, neighbour_score, run, score
from trimtab.control.service import Rebalancer


# prefetch, then sync, without the queue's mark: the 60-step goal missed either way (BENCHMARKS.md)
TWO_KNOBS = ("queue_sync", "queue_bank")
# issue 38's: scored on their own goals below (a neighbour's, a search that goes on)
ISSUE_38 = ("neighbour", "comm_noisy", "non_monotone_noisy", "slowdown_at_move", "mix")


@pytest.mark.parametrize("key", [k for k in WORKLOADS if k not in TWO_KNOBS + ISSUE_38])
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


def _scored(api, key: str, rules, job: str, seed: int = 11):
    w = WORKLOADS[key]()
    api.ctx.after_report = Rebalancer(api.ctx.engine, rules).after_report
    s = score(w, run(api.http, api.token("job"), w, seed=seed, job=job))
    print(f"\n{job}: {s.line()}")
    return s


def _decisions(api, job: str) -> list[dict]:
    return api.http.get("/v1/decisions", params={"job": job, "limit": 200}).json()["decisions"]


def test_a_sync_move_after_a_prefetch_raise_waits_out_the_drain_and_costs_a_job_without_one_only_the_wait(sqlite_api):
    """The settle after a prefetch raise (control/settle.py) on two knobs in series. A job whose raise leaves a
    bank that drains (the H200's pattern, modelled: 8 steps 15 % fast after 0 → 2): without the settle the sync
    trial is measured against the drain; with it the job reaches its best static's level with no false gain. A
    job without a bank: the wait only delays the sync move (at its best, 2/8, the job is still generation-bound; the
    rule's prefetch 4, worse, is not tried since 2026-12-06: the weight sync is all that is left outside generation,
    overlap_bound.py)."""
    rules = sqlite_api.ctx.rules
    off = rules.with_overrides({"controller": {"queue_raise_settle_steps": 0}})
    banked, banked_off = _scored(sqlite_api, "queue_bank", rules, "bank-on"), _scored(sqlite_api, "queue_bank", off,
                                                                                       "bank-off")
    assert banked.reached >= 0.95 and banked.false_gains == [] and banked.kept_worse == [], banked.line()
    assert banked_off.reached < banked.reached, (banked_off.line(), banked.line())
    plain = _scored(sqlite_api, "queue_sync", rules, "plain")
    assert plain.reached >= 0.95 and plain.within is not None and plain.within <= 80, plain.line()
    assert plain.false_gains == [] and plain.kept_worse == [] and plain.ooms == 0, plain.line()


def test_two_knobs_in_series_meet_the_goal_where_the_job_reports_its_queue_mark(sqlite_api):
    """The two-knob job (prefetch, then sync) as the reference pipeline now reports it, with its queue's high-water
    mark (never above 1: generation is the slower side): after 0 → 2 and the sync ladder the job is still
    generation-bound, and the rule's next prefetch raise (2 → 4, 8 % slower) is not made — the goal met, no
    rollback. Two checks each hold it back: the queue never filled (queue_use.py), and all of the step outside
    generation is the weight sync, which pauses generation (overlap_bound.py). With the queue-fill check off, the
    second still says why and the job still holds (until 2026-12-06 it tried 2 → 4 then, and rolled it back)."""
    rules = sqlite_api.ctx.rules
    off = rules.with_overrides({"controller": {"queue_raise_needs_fill": False}})
    held = _scored(sqlite_api, "queue_sync_mark", rules, "mark-on")
    tried = _scored(sqlite_api, "queue_sync_mark", off, "mark-off")
    for s in (held, tried):
        assert s.rollbacks == 0 and s.within is not None and s.within <= GOAL_STEPS, s.line()
        assert s.final == {"prefetch": 2, "sync_every": 8}, s.line()
    skipped = [why for d in _decisions(sqlite_api, "mark-off") for why in d["evidence"].get("skipped", [])]
    assert any("outside generation and the weight sync at prefetch=2" in why for why in skipped), skipped


def test_a_queue_that_never_fills_is_not_made_deeper_and_one_that_fills_now_and_then_still_may_be(sqlite_api):
    """The queue-fill check (control/queue_use.py) on simulated bounded queues that report their high-water mark:
    generation-bound (0.5 s of generation, 0.35 s of training: past prefetch 1 no finished batch ever waits), the
    raise 0 → 2 and nothing deeper — without the check the rule tries 2 → 4 (6 % slower) and 2 → 3 and sends both
    back; bursty generation (the queue fills now and then) is let deeper either way."""
    rules = sqlite_api.ctx.rules
    off = rules.with_overrides({"controller": {"queue_raise_needs_fill": False}})
    held, tried = _scored(sqlite_api, "queue_steady", rules, "steady-on"), _scored(sqlite_api, "queue_steady", off,
                                                                                   "steady-off")
    assert (held.changes, held.rollbacks) == (1, 0) and held.within <= 5, held.line()
    assert tried.rollbacks >= 1 and tried.within > held.within, tried.line()
    bursty = _scored(sqlite_api, "queue_bursty", rules, "bursty-on")
    assert bursty.changes >= 2 and bursty.reached >= 0.95, bursty.line()  # 0 → 2, then deeper was tried


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("key,of_static_pct", [("up", 150.0), ("down", 130.0)])
def test_a_job_whose_lengths_drift_is_decided_on_within_30_steps_and_beats_the_static_batch(sqlite_api, key,
                                                                                             of_static_pct, seed):
    """Issue 38: decode time and memory grow with the response length (128 → 512 tokens, or back), the job reports
    ``tokens`` every step; samples/s follows the length for the whole run. Read at equal length (control/drift.py)
    the controller decides within 30 steps and stays above the largest static batch safe over the run, with no OOM
    after a raise (before: no decision in 200 steps on the growing job, 17 % of the static batch). The growing job
    at the goal, 150 %: its first climb decided on 4 steps and judged on 4 (143 % when both took 10), its batch sized
    until its next move lands (2 steps, was 4)."""
    from bench.drifting_jobs import JOBS, SeededJob, score
    from bench.moving_job import run_simulated

    sqlite_api.ctx.after_report = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules).after_report
    job = SeededJob(JOBS[key], seed)
    s = score(job, run_simulated(sqlite_api.http, sqlite_api.token("job"), job, key))
    print(f"\n{key}: {s['of_static_pct']:.1f} % of static, {s['of_oracle_pct']:.1f} % of the oracle, first decision "
          f"at {s['first_decision_step']}, OOMs {s['ooms']} ({s['ooms_after_a_raise']} after a raise)")
    assert s["first_decision_step"] is not None and s["first_decision_step"] <= 30, s
    assert s["ooms_after_a_raise"] == 0, s
    assert s["of_static_pct"] >= of_static_pct, s


@pytest.mark.parametrize("seed", [1, 2])
def test_a_neighbour_that_takes_memory_mid_run_costs_one_oom_at_most_and_the_batch_stays_under_the_lowered_line(
        sqlite_api, seed):
    """Another process takes part of the GPU mid-run (``bench/job_memory_models.py: neighbour``): the job reports the free
    memory it sees, the line comes down by what the neighbour holds, and after the OOM its arrival may cause (the
    hook halves the batch) no raise goes back into a second one; the batch fits under the line within 5 steps of
    the arrival, at ≥ 90 % of the best static setting that is safe beside the neighbour."""
    w = WORKLOADS["neighbour"]()
    sqlite_api.ctx.after_report = Rebalancer(sqlite_api.ctx.engine, sqlite_api.ctx.rules).after_report
    out = run(sqlite_api.http, sqlite_api.token("job"), w, seed=seed, job=f"neighbour-{seed}")
    got = neighbour_score(w, out)
    print(f"\n{got['line']}")
    assert got["ooms_after_first"] == 0, got["line"]
    assert got["lowered_after"] is not None and got["lowered_after"] <= 5, got["line"]
    assert got["ratio"] >= 0.90, got["line"]


def test_a_host_that_slows_as_a_good_move_lands_is_told_apart_from_the_move(sqlite_api):
    """The host slows ×1.3 at the very step prefetch 0 → 2 (+18 %) lands: the move reads −9 %, surely, and goes
    back. The next move of the knob waits until the known setting has been measured again (A, B, A′): it reads the
    slowdown too, so the loss was the host's, and the move is made again — not the middle (1) that a loss at 2
    would have put the search at, 76 % of the best static setting, for good."""
    s = _scored(sqlite_api, "slowdown_at_move", sqlite_api.ctx.rules, "slow-at-move", seed=3)
    assert s.reached >= 0.95 and s.within is not None and s.within <= GOAL_STEPS, s.line()
    assert s.kept_worse == [] and s.retried == [], s.line()
    # the rollback the move went back on is named the host's when the move is made again; past the best (4), 6
    # reads worse and 5 — which the levels at 2, 4 and 6 put under the dead band over 4 — is not tried: one
    # rollback of the knob that is the search's own (it made three: 2, 6 and 5)
    assert s.host_rollbacks == 1 and s.flip_flops <= 1, s.line()


def test_a_raise_whose_bank_drains_is_judged_on_the_setting_past_the_drain(sqlite_api):
    """Prefetch 2 → 4 at sync 8 (−7 % true) lands with a bank: 8 steps 15 % fast, then the setting. Read as one
    window the fast period hid the loss for 48 steps (back at step 87); judged past the drain its own steps show,
    it goes back within the goal."""
    s = _scored(sqlite_api, "queue_bank", sqlite_api.ctx.rules, "queue-bank", seed=1)
    assert s.reached >= 0.95 and s.within is not None and s.within <= GOAL_STEPS, s.line()


def test_an_unconfirmed_gain_on_a_ladder_is_followed_through_while_the_share_is_above_the_follow_line(sqlite_api):
    """The noisy two-rank communication-bound job (±20 % steps): sync 8 → 16 (+11 % true) reads +2.8 %, 88 % sure —
    kept as an unconfirmed gain. At 16 communication is 11 % of the step, under the act line (15) and above the
    follow line (5): the ladder goes on to 32, its best, instead of ending at 94 % of it."""
    s = _scored(sqlite_api, "comm_noisy", sqlite_api.ctx.rules, "comm-noisy", seed=1)
    assert s.final == {"sync_every": 32} and s.reached >= 0.95, s.line()


def test_a_non_monotone_curve_tries_the_top_its_measured_levels_point_to(sqlite_api):
    """Peak 24, ±10 % noise: 16 → 64 worse, 32 kept, 45 worse, 11 worse, 19 flat against 32 — the parabola through
    19, 32 and 45 puts the top near 24, between the flat rung and the current value: it is tried (once), not
    "nothing left to try" at 19 or 32."""
    s = _scored(sqlite_api, "non_monotone_noisy", sqlite_api.ctx.rules, "hump-noisy", seed=3)
    assert s.reached >= 0.95 and s.within is not None, s.line()


def test_generation_every_k_steps_is_judged_over_whole_periods(sqlite_api):
    """TRL's steps_per_generation (4): one step generates (1.4 s at batch 4), three train (0.07 s). Per step, a batch
    raise worth ×2.8 read "inconclusive" and its before window "not settled", and the job reached its best at step
    69; over whole periods of 4 steps it is kept at once."""
    s = _scored(sqlite_api, "generation_every_4", sqlite_api.ctx.rules, "gen-every-4", seed=1)
    assert s.reached >= 0.95 and s.within is not None and s.within <= GOAL_STEPS and s.rollbacks == 0, s.line()
