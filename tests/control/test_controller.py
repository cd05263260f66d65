"""The pure controller, ``plan(JobState, rules)``, on recorded windows: each rule and its action, hysteresis, settle and
cooldown, bounds, the OOM ceiling, memory headroom, priority and advise mode (a change in flight, its verdict and what it
leaves for the next move: test_follow_up.py). No store: the state is built by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.plans import Fetch, NOW, RULES, acts, change, decision, gpu, gpu_job, job, nothing, state, steps
from trimtab.control.controller import plan
from trimtab.grading.window import window


# -- each rule and its action ----------------------------------------------------------------------------------------

def test_generation_bound_raises_batch_size_x4_with_the_window_as_evidence():
    p = plan(state(steps(0, 3)), RULES)
    acts(p, "generation_bound", "batch_size", 1, 4)
    assert p.throughput_before == pytest.approx(64 / 45)
    assert p.evidence["window"] == {"steps": [2, 2], "n_steps": 1, "seconds": 45.0, "samples_per_s": 1.422}
    assert p.evidence["reading"]["value"] == pytest.approx(97.778, abs=1e-3)
    assert p.evidence["reading"]["status"] == "act"
    assert p.evidence["knobs"] == {"batch_size": 1, "prefetch": 0, "sync_every": 1}
    assert "batch_size ×4 (1 → 4)" in p.change.reason


def test_generation_bound_on_a_gpu_job_with_memory_headroom_raises_batch_and_reads_the_window_span():
    fetch = Fetch([gpu(0, mem_pct=60.0), gpu(1, mem_pct=40.0)])
    win = steps(0, 3)
    p = plan(state(win, gpu_job(), gpus=fetch), RULES)
    acts(p, "generation_bound", "batch_size", 1, 4)
    assert fetch.calls == [(win[2].start_ms, win[2].end_ms)]  # once, for the window's span


def test_generation_bound_at_max_batch_raises_prefetch_by_2():
    p = plan(state(steps(0, 3), job(batch=64)), RULES)
    acts(p, "generation_bound", "prefetch", 0, 2)
    assert p.evidence["skipped"] == ["batch_size ×4: batch_size is at its max (64)"]


def test_communication_bound_doubles_sync_every():
    p = plan(state(steps(0, 3, gen=20.0, ev=10.0, comm=9.0)), RULES)  # comm 20 % of 45 s
    acts(p, "communication_bound", "sync_every", 1, 2)


def test_evaluation_bound_raises_prefetch():
    p = plan(state(steps(0, 3, gen=15.0, ev=28.0, comm=1.0)), RULES)  # eval 62 %
    acts(p, "evaluation_bound", "prefetch", 0, 2)


def test_pcie_saturated_lowers_prefetch_by_one():
    balanced = dict(gen=18.0, ev=18.0, comm=2.0)  # 40 / 40 / 4 %: no job rule fires
    p = plan(state(steps(0, 3, **balanced), gpu_job(prefetch=4), gpus=[gpu(0, pcie_pct=95.0), gpu(1)]), RULES)
    acts(p, "pcie", "prefetch", 4, 3)
    assert p.evidence["reading"]["gpu"] == 0 and p.evidence["reading"]["value"] == pytest.approx(95.0)


def test_memory_full_halves_batch_size_even_when_generation_bound():
    p = plan(state(steps(0, 3), gpu_job(batch=16), gpus=[gpu(0, mem_pct=99.0), gpu(1)]), RULES)
    acts(p, "memory", "batch_size", 16, 8)


def test_fragmentation_halves_batch_size():
    p = plan(state(steps(0, 3, frag=0.30, retries=1), job(batch=16)), RULES)  # allocator retries: pressure
    acts(p, "fragmentation", "batch_size", 16, 8)
    assert p.evidence["reading"]["value"] == pytest.approx(30.0)
    assert p.evidence["reading"]["alloc_retries_in_window"] == 1  # the window is the last 45 s step


def test_fragmentation_without_memory_pressure_is_only_watched():
    p = plan(state(steps(0, 3, frag=0.30, gen=20.0), job(batch=16)), RULES)  # no retries, CPU job: no pressure
    nothing(p)
    frag = next(r for r in p.readings if r.rule == "fragmentation")
    assert frag.status == "watch" and "no memory pressure" in frag.message


def test_collective_latency_above_twice_baseline_doubles_sync_every():
    p = plan(state(steps(0, 3, latency_us=50.0), job(sync=2), baseline=20.0), RULES)
    acts(p, "collective_latency", "sync_every", 2, 4)
    assert p.evidence["reading"]["value"] == pytest.approx(2.5)
    assert p.evidence["reading"]["baseline_us"] == 20.0


def test_collective_latency_without_a_baseline_is_no_data():
    p = plan(state(steps(0, 3, gen=20.0, ev=10.0, comm=2.0, latency_us=500.0), job(sync=2)), RULES)
    nothing(p)
    latency = next(r for r in p.readings if r.rule == "collective_latency")
    assert latency.status == "no_data"


def test_oom_in_the_window_is_advice_only_and_blocks_speed_rules():
    history = steps(0, 2, ooms=0) + steps(2, 1, ooms=1)
    p = plan(state(history), RULES)
    assert p.change is None and p.advised is None
    assert p.advice_rule == "oom" and "out-of-memory" in p.advice
    assert p.evidence["reading"]["value"] == 1.0


def test_old_oom_before_the_window_does_not_fire():
    history = steps(0, 1, ooms=0) + steps(1, 2, ooms=1)  # the OOM was in step 1; the window is step 2
    p = plan(state(history), RULES)
    acts(p, "generation_bound", "batch_size", 1, 4)


def test_utilization_spread_raises_batch_and_attaches_placement_advice():
    balanced = dict(gen=18.0, ev=18.0, comm=2.0)
    proposal = {"device_map": {"actor": [0], "reward": [0]}, "expected_effect": "spread 75 → 20 pts"}
    p = plan(state(steps(0, 3, **balanced), gpu_job(batch=8), gpus=[gpu(0, sm=95.0), gpu(1, sm=20.0)]), RULES,
             placement=lambda st, readings, win: proposal)
    acts(p, "utilization_spread", "batch_size", 8, 16)
    assert p.evidence["placement"] == proposal
    assert "Proposed device_map: {'actor': [0], 'reward': [0]}" in p.advice


# -- hysteresis -----------------------------------------------------------------------------------------------------

def short(first, n, gen):
    return steps(first, n, step_time=1.5, gen=gen * 1.5 / 100, ev=0.1, comm=0.01)


def test_one_step_of_the_window_below_the_line_means_no_action():
    history = short(0, 2, gen=80) + short(2, 1, gen=48) + short(3, 2, gen=80)  # window = steps 2, 3, 4 (4.5 s)
    p = plan(state(history), RULES)
    nothing(p)
    gen = next(r for r in p.readings if r.rule == "generation_bound")
    assert gen.status == "watch" and gen.detail["steps"] == [2, 3, 4]


def test_every_step_of_the_window_above_the_line_acts():
    history = short(0, 2, gen=48) + short(2, 3, gen=80)  # the low steps are older than the window
    acts(plan(state(history), RULES), "generation_bound", "batch_size", 1, 4)


def test_missing_phases_mean_no_action():
    p = plan(state(steps(0, 3, gen=None, ev=None, comm=None)), RULES)
    nothing(p)
    assert p.note == "no rule fires"
    statuses = {r.rule: r.status for r in p.readings}
    assert statuses["generation_bound"] == statuses["communication_bound"] == "no_data"


def test_missing_gpu_samples_mean_no_gpu_rule_fires():
    p = plan(state(steps(0, 3, gen=18.0, ev=18.0, comm=2.0), gpu_job(prefetch=4),
                   gpus=[gpu(0, pcie_pct=99.0, n=2), gpu(1, n=2)]), RULES)  # 2 < gpu_min_samples
    nothing(p)
    assert {r.rule: r.status for r in p.readings}["pcie"] == "no_data"


# -- settle, cooldown, collecting -------------------------------------------------------------------------------------

def test_steps_before_applied_step_plus_settle_are_not_used():
    # change applied at step 10, step 10 is the settle step: steps 11, 12 (3 s) are not a window yet, though the
    # generation-bound steps 10 and before would complete one.
    history = short(0, 13, gen=80)
    st = state(history, job(batch=4), changes=[change(applied_step=10)])
    p = plan(st, RULES)
    nothing(p)
    assert p.note == "collecting a window (steps from 11)"
    p = plan(st, RULES.with_overrides({"controller": {"settle_steps": 0}}))
    acts(p, "generation_bound", "batch_size", 4, 16)
    assert p.evidence["window"]["steps"] == [10, 12]


def test_the_first_window_after_the_settle_steps_is_used():
    # step 10 (settle) was generation-light; steps 11–13 are a full window and fire
    history = short(6, 4, gen=20) + short(10, 1, gen=20) + short(11, 3, gen=80)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=10)]), RULES)
    acts(p, "generation_bound", "batch_size", 4, 16)
    assert p.evidence["window"]["steps"] == [11, 13]


def test_cooldown_steps_push_the_window_further():
    rules = RULES.with_overrides({"controller": {"cooldown_steps": 3}})
    history = short(0, 16, gen=80)
    p = plan(state(history, job(batch=4), changes=[change(applied_step=10)]), rules)
    assert p.note == "collecting a window (steps from 14)"  # 14, 15 = 3 s
    p = plan(state(history + short(16, 1, gen=80), job(batch=4), changes=[change(applied_step=10)]), rules)
    acts(p, "generation_bound", "batch_size", 4, 16)
    assert p.evidence["window"]["steps"] == [14, 16]


def test_no_steps_at_all_is_collecting():
    nothing(p := plan(state([]), RULES))
    assert p.note == "collecting a window (steps from 0)"


# -- bounds, rounding, OOM ceiling -----------------------------------------------------------------------------------

def test_raise_is_clamped_to_the_declared_max():
    acts(plan(state(steps(0, 3), job(batch=32)), RULES), "generation_bound", "batch_size", 32, 64)


def test_oom_lowered_max_is_never_exceeded():
    p = plan(state(steps(0, 3), job(batch=16, batch_max=24)), RULES)
    acts(p, "generation_bound", "batch_size", 16, 24)
    p = plan(state(steps(0, 3), job(batch=24, batch_max=24)), RULES)
    acts(p, "generation_bound", "prefetch", 0, 2)  # at the lowered max: the next action


def test_lowering_is_clamped_to_the_min_and_rounds_down():
    p = plan(state(steps(0, 3, frag=0.30, retries=1), job(batch=3)), RULES)
    acts(p, "fragmentation", "batch_size", 3, 1)  # 1.5 → 1


def test_sync_every_at_the_jobs_own_max_is_not_raised():
    p = plan(state(steps(0, 4, gen=20.0, ev=10.0, comm=9.0), job(sync=4, sync_max=4)), RULES)  # one whole period
    assert p.change is None and p.advice_rule == "communication_bound"
    assert p.evidence["skipped"] == ["sync_every ×2: sync_every is at its max (4)"]


@pytest.mark.parametrize("op, by, batch, expected", [
    ("mul", 1.5, 3, 5),   # 4.5 rounds up for a raise
    ("mul", 1.5, 1, 2),   # 1.5 → 2
    ("mul", 1.1, 4, 5),   # 4.4 → 5: an integer raise moves at least one step
    ("div", 1.5, 2, 1),   # 1.33 rounds down for a cut
    ("add", 0.5, 4, 5),
])
def test_integer_knobs_round_away_from_the_current_value(op, by, batch, expected):
    rules = RULES.with_overrides({"generation_bound": {"actions": [{"knob": "batch_size", "op": op, "by": by}]}})
    acts(plan(state(steps(0, 3), job(batch=batch)), rules), "generation_bound", "batch_size", batch, expected)


# -- memory headroom ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus, why", [
    ([gpu(0, mem_pct=90.0), gpu(1, mem_pct=30.0)], "GPU memory at 90.0 % (raising needs < 85 %)"),
    ([], "GPU memory of the job's GPUs is unknown"),
    ([gpu(0, n=2), gpu(1, n=2)], "GPU memory of the job's GPUs is unknown"),
])
def test_batch_raise_without_memory_headroom_is_skipped_for_the_next_action(gpus, why):
    p = plan(state(steps(0, 3), gpu_job(), gpus=gpus), RULES)
    acts(p, "generation_bound", "prefetch", 0, 2)
    assert len(p.evidence["skipped"]) == 1 and why in p.evidence["skipped"][0]


def test_batch_raise_with_high_fragmentation_is_skipped():
    p = plan(state(steps(0, 3, frag=0.20), job()), RULES)  # 20 %: under the fragmentation rule, over 15 %
    acts(p, "generation_bound", "prefetch", 0, 2)
    assert "fragmentation at 20.0 %" in p.evidence["skipped"][0]


# -- priority -------------------------------------------------------------------------------------------------------

def test_communication_goes_before_generation():
    p = plan(state(steps(0, 3, gen=27.0, ev=5.0, comm=9.0)), RULES)  # gen 60 %, comm 20 %
    acts(p, "communication_bound", "sync_every", 1, 2)


def test_a_safety_rule_that_fires_and_cannot_act_blocks_speed_rules():
    frag = steps(0, 3, frag=0.30, retries=1)  # batch at its min: the fragmentation rule cannot halve it
    p = plan(state(frag, job(batch=1)), RULES)
    assert p.change is None and p.advice_rule == "fragmentation"
    assert p.evidence["skipped"] == ["batch_size ÷2: batch_size is at its min (1)"]
    advised = decision(id=9, outcome="advised", change_id=None, knob=None, old=None, new=None,
                       rule="fragmentation", ts_ms=NOW - 60_000)
    p = plan(state(frag, job(batch=1), decisions=[advised]), RULES)  # advised already: still blocks
    nothing(p)
    assert p.note == "fragmentation: fires and blocks lower-priority rules (advised before)"


def test_a_speed_rule_that_cannot_act_and_was_advised_lets_the_next_rule_act():
    history = steps(0, 8, gen=27.0, ev=5.0, comm=9.0)  # sync every 8: a window is 8 steps
    advised = decision(id=9, outcome="advised", change_id=None, knob=None, old=None, new=None,
                       rule="communication_bound", ts_ms=NOW - 60_000)
    p = plan(state(history, job(sync=8), decisions=[advised]), RULES)
    acts(p, "generation_bound", "batch_size", 1, 4)


# -- modes ----------------------------------------------------------------------------------------------------------

def test_advise_mode_plans_the_change_without_making_it():
    p = plan(state(steps(0, 3), job(mode="advise")), RULES)
    assert p.change is None and p.advised is not None
    assert (p.advised.rule, p.advised.knob, p.advised.old_value, p.advised.new_value) == \
        ("generation_bound", "batch_size", 1, 4)
    assert p.note.startswith("advise: generation_bound")


def test_advise_mode_does_not_repeat_the_same_advice_within_advice_repeat():
    advised = decision(id=9, outcome="advised", change_id=None, ts_ms=NOW - 300_000)  # batch_size → 4
    p = plan(state(steps(0, 3), job(mode="advise"), decisions=[advised]), RULES)
    nothing(p)
    assert p.note == "generation_bound: advised before (batch_size → 4)"
    old = decision(id=9, outcome="advised", change_id=None, ts_ms=NOW - 601_000)
    p = plan(state(steps(0, 3), job(mode="advise"), decisions=[old]), RULES)
    assert p.advised is not None and p.advised.new_value == 4


def test_mode_off_does_nothing_even_with_work_pending():
    p = plan(state(steps(0, 3, frag=0.5), job(mode="off", batch=16), changes=[change(status="pending")],
                   decisions=[decision()]), RULES)
    nothing(p)
    assert p.note == "mode off" and p.readings == []


# -- found while testing ----------------------------------------------------------------------------------------------

def test_an_oom_on_the_step_a_change_took_effect_fires_the_oom_rule():
    # change 3 (batch 16 → 32) took effect at step 10 and OOMed there; the hook halved it to 16, max 31
    history = steps(0, 10, ooms=0) + steps(10, 1, ooms=1) + steps(11, 2, ooms=1)
    closed = decision(outcome="superseded", old=16, new=32)
    st = state(history, job(batch=16, batch_max=31), changes=[change(value=32, previous=16)], decisions=[closed])
    p = plan(st, RULES)
    assert p.change is None and p.advice_rule == "oom"
    assert p.evidence["reading"]["num_ooms_cumulative"] == 1
    # once that OOM is advised, later windows do not keep finding it: the generation rule may act again
    advised = decision(id=9, outcome="advised", change_id=None, knob=None, old=None, new=None, rule="oom",
                       ts_ms=NOW - 60_000, evidence=p.evidence)
    later = history + steps(13, 2, ooms=1)
    p = plan(state(later, job(batch=16, batch_max=31), changes=[change(value=32, previous=16)],
                   decisions=[advised, closed]), RULES)
    assert p.change is not None and (p.change.rule, p.change.knob, p.change.new_value) == \
        ("generation_bound", "batch_size", 31)


def test_a_window_spans_whole_sync_periods():
    # Sync every 2nd step: steps alternate 1.1 s (with the sync) and 0.43 s. Five steps holding 3 syncs read 8 %
    # slower than the truth; with the period the window waits for a sixth step.
    fast_slow = []
    for i in range(6):
        fast_slow += steps(40 + i, 1, step_time=1.1 if i % 2 == 0 else 0.43, gen=0.5, comm=0.33 if i % 2 == 0 else 0.0)
    assert [s.step for s in window(fast_slow[:5], 1, 4.0, 20, period=1)] == [40, 41, 42, 43, 44]
    assert window(fast_slow[:5], 1, 4.0, 20, period=2) is None
    assert [s.step for s in window(fast_slow, 1, 4.0, 20, period=2)] == [40, 41, 42, 43, 44, 45]
    # the cap bounds what is read, never cuts a window short of window_min_s (issue 15: sub-second verdicts)
    assert window(fast_slow * 1, 1, 100.0, 5, period=2) is None


# -- a change the job's knob owner refused ---------------------------------------------------------------------------

def test_a_refused_change_closes_its_decision_as_refused_with_the_reason():
    refused = replace(change(status="pending"), status="refused", refused_reason="rank 0: verl builds it at init")
    p = plan(state(steps(0, 14), job(batch=1), changes=[refused], decisions=[decision()]), RULES)
    assert (p.close, p.outcome, p.rollback_to) == (7, "refused", None)
    assert p.evidence["refused_reason"] == "rank 0: verl builds it at init"
    assert "could not apply it" in p.evidence["closed_because"]


def test_a_refused_direction_is_not_asked_again_within_retry_after():
    refused = decision(outcome="refused", evidence={"reading": {}, "verdict_ms": NOW - 60_000,
                                                    "refused_reason": "rank 0: not live"})
    p = plan(state(steps(0, 16), job(batch=1), decisions=[refused]), RULES)
    acts(p, "generation_bound", "prefetch", 0, 2)  # the next action, not batch_size again
    assert p.evidence["skipped"] == ["batch_size ×4: the job refused batch_size → 4 at decision 7 (rank 0: not live)"]
    later = replace(refused, evidence={**refused.evidence, "verdict_ms": NOW - 601_000})
    acts(plan(state(steps(0, 16), job(batch=1), decisions=[later]), RULES), "generation_bound", "batch_size", 1, 4)


def test_a_trainer_waiting_for_rollout_is_graded_as_waiting_not_as_generation():
    waiting = [replace(s, phases_s={**s.phases_s, "generation": None, "wait": 40.0}) for s in steps(0, 3)]
    p = plan(state(waiting, job(batch=1)), RULES)
    acts(p, "rollout_wait_bound", "prefetch", 0, 1)  # never a trainer batch raise: it would only wait longer
    assert p.evidence["reading"]["signal"] == "wait_share_pct"
