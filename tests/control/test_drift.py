"""A drifting job's throughput read at equal length (src/trimtab/control/drift.py): a decode step's time grows with
the response length, so samples/s follows the length; the seconds per sample, fitted as a line in tokens per sample at
one setting, bring every step to one reference length. A drift the tokens explain is not a baseline still settling; a
warm-up they do not explain still is; a raise is judged by its own effect while the lengths move."""

from __future__ import annotations

import random
from dataclasses import replace

from tests.support.plans import NOW, RULES, T0, change, decision, job, state
from trimtab.control.controller import plan
from trimtab.control.drift import at_equal_length, fit
from trimtab.control.verdict import unsettled
from trimtab.grading.window import JobStep

CTL = RULES.controller
DECODE_S_PER_TOKEN = 1.5e-3  # one decode position of the whole batch


def decode_steps(first: int, n: int, batch: int, length_at, warm_up=lambda i: 1.0, seed: int = 1,
                 per_sample_s: float = 0.0) -> list[JobStep]:
    """Decode steps: time = length × (1.5 ms + ``per_sample_s`` × batch) × ``warm_up(step)`` (±2 %), generation
    98 % of it; ``tokens`` = batch × length."""
    rng = random.Random(seed)
    out, end = [], T0
    for i in range(first, first + n):
        length = length_at(i)
        t = length * (DECODE_S_PER_TOKEN + per_sample_s * batch) * warm_up(i) * (1 + rng.uniform(-0.02, 0.02)) + 0.004
        end += int(t * 1000)
        out.append(JobStep(step=i, ranks=1, step_time_s=t, samples=batch,
                           phases_s={"generation": t - 0.004, "update": 0.004}, fragmentation=None, num_ooms=None,
                           collective_latency_us=None, start_ms=end - int(t * 1000), end_ms=end,
                           rl={"tokens": batch * length}))
    return out


def growing(i: int) -> float:
    return 128 + 1.9 * i  # 128 → 512 over 200 steps


def test_the_line_recovers_the_time_per_token_and_the_drift_it_explains_is_not_unsettled():
    window = decode_steps(0, 40, 4, growing)
    assert unsettled(window, 1, CTL) is not None  # samples/s falls ~35 % across it: the old gate waited
    model = fit(window, CTL)
    assert model is not None
    assert abs(model.b_s_per_token - DECODE_S_PER_TOKEN / 4) / (DECODE_S_PER_TOKEN / 4) < 0.1
    adjusted, _ = at_equal_length(window, window, CTL)
    assert unsettled(adjusted, 1, CTL) is None


def test_lengths_that_barely_move_or_step_time_that_ignores_them_give_no_model():
    assert fit(decode_steps(0, 40, 4, lambda i: 256 + (i % 2)), CTL) is None
    flat = [replace(s, step_time_s=0.3) for s in decode_steps(0, 40, 4, growing)]
    assert fit(flat, CTL) is None
    no_tokens = [replace(s, rl={}) for s in decode_steps(0, 40, 4, growing)]
    assert fit(no_tokens, CTL) is None
    logged = [replace(s, rl={"completion_mean_tokens": s.rl["tokens"] / s.samples}) for s in decode_steps(0, 40, 4,
                                                                                                           growing)]
    assert fit(logged, CTL) is not None  # the framework's logged mean length does as well


def test_a_warm_up_the_tokens_do_not_explain_is_still_unsettled():
    """Lengths that wander (no trend) and a warm-up: the model takes out the lengths, not the warm-up."""
    wander = lambda i: 200 + 30 * ((i * 7) % 5 - 2)  # noqa: E731
    window = decode_steps(0, 40, 4, wander, warm_up=lambda i: 1.0 + 0.5 * 0.93 ** i)
    adjusted, model = at_equal_length(window, window, CTL)
    assert model is not None
    trend = unsettled(adjusted, 1, CTL)
    assert trend is not None and trend.change_pct > 0


def test_a_generation_bound_job_whose_lengths_grow_is_raised_instead_of_waiting_for_its_throughput_to_settle():
    p = plan(state(decode_steps(0, 30, 4, growing), the_job=job(batch=4, batch_max=1024)), RULES)
    assert p.change is not None and p.change.knob == "batch_size" and p.change.new_value > 4, p.note
    assert p.evidence["drift_model"]["reference_tokens_per_sample"] > 128


def _verdict(length_at, after_batch: int, seed: int = 3):
    """A raise 4 → ``after_batch`` applied at step 40 on a job whose lengths follow ``length_at``; the batch costs 25 µs
    a sample of each decode position (so 4 → 16 gains 3.2× at equal length), judged at step 80."""
    before = decode_steps(0, 40, 4, length_at, seed=seed, per_sample_s=25e-6)
    after = decode_steps(40, 40, after_batch, length_at, seed=seed + 1, per_sample_s=25e-6)
    raise_ = change(id=3, value=after_batch, previous=4, applied_step=40)
    pending = decision(id=7, change_id=3, old=4, new=after_batch, ts_ms=NOW - 60_000)
    return plan(state(before + after, the_job=job(batch=after_batch, batch_max=1024), changes=[raise_],
                      decisions=[pending]), RULES)


def test_a_raise_is_judged_at_equal_length_while_the_lengths_grow_or_shrink():
    shrinking = lambda i: 512 - 1.9 * i  # noqa: E731
    for length_at in (growing, shrinking):
        gained = _verdict(length_at, 16)
        assert gained.close == 7 and gained.outcome == "kept", gained.note
        ratio = gained.evidence["verdict"]["ratio"]
        assert 2.8 < ratio < 3.6, gained.note  # 16 / 4 × (1.5 + 0.1) / (1.5 + 0.4) = 3.37 at equal length
        assert "drift_model" in gained.evidence
        # the decision's row keeps what the job ran at: below the reference length's figure while lengths grow
        at_reference = gained.evidence["after_window"]["samples_per_s"]
        assert (gained.throughput_after < at_reference) == (length_at is growing), gained.note
    # a "raise" that changes nothing on a shrinking job: the shrink (samples/s +15 % across) is not its gain
    nothing = _verdict(shrinking, 4)
    v = nothing.evidence.get("verdict") or {}
    assert v.get("result") != "gain" and abs(v.get("ratio", 1.0) - 1.0) < 0.03, nothing.note
