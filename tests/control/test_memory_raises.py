"""Memory-aware batch raises (issue 15): the memory a larger batch needs is predicted from the allocator peaks at
the batch sizes the job ran, and a raise goes only as far as stays under the memory line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.plans import GIB, RULES, acts, change, decision, gpu, gpu_job, job, state, steps
from trimtab.control.controller import plan

TOTAL = 141 * GIB


def with_memory(history, peak_gib_of, total=TOTAL):
    return [replace(s, mem_peak_bytes=peak_gib_of(s.step) * GIB, mem_total_bytes=total) for s in history]


def test_a_raise_that_would_not_fit_is_cut_to_the_largest_batch_predicted_to_fit():
    # The H200 OOM: batch 16 at 48 GiB of 141 (34 %: the headroom check passes), ×4 would need 192 GiB.
    history = with_memory(steps(0, 3), lambda s: 48.0)
    p = plan(state(history, gpu_job(batch=16), gpus=[gpu(0, mem_pct=34.0), gpu(1, mem_pct=34.0)]), RULES)
    line = 0.95 * 141 - 0.03 * 141  # memory_line_pct less memory_margin_pct
    acts(p, "generation_bound", "batch_size", 16, int(line // 3))  # 3 GiB per sample, base 0 (one size: upper bound)
    prediction = p.evidence["memory_prediction"]
    assert prediction["predicted_gib"] == pytest.approx(3 * int(line // 3)) and prediction["points_gib"] == {"16": 48.0}
    assert prediction["model"].startswith("one value seen")
    assert any(n.startswith("memory: batch_size=64 would need 192.0 GiB") for n in p.evidence["step_policy"])


def test_with_two_batch_sizes_seen_the_fit_has_a_base_and_a_slope():
    # batch 8 → 30 GiB, batch 16 → 50 GiB: 10 GiB base + 2.5 GiB per sample; under the line (133.95 GiB less a
    # 4.23 GiB margin) fits (129.72 − 10) / 2.5 = 47.9 → 47, not 64; the one-size upper bound would have said 41.
    changes = [change(id=3, value=16, previous=8, applied_step=3)]
    history = with_memory(steps(0, 6), lambda s: 30.0 if s < 3 else 50.0)
    p = plan(state(history, job(batch=16), changes=changes), RULES)
    acts(p, "generation_bound", "batch_size", 16, 47)
    fit = p.evidence["memory_prediction"]
    assert set(fit["points_gib"].items()) == {("8", 30.0), ("16", 50.0)} and fit["model"].startswith("base + per sample")
    assert fit["base_gib"] == 10.0 and fit["per_sample_mib"] == 2.5 * 1024


def test_when_not_even_one_more_sample_fits_the_raise_is_skipped_for_the_next_action():
    history = with_memory(steps(0, 3), lambda s: 125.0)  # 17 × 125/16 + 4.23 GiB margin > 129.72 GiB
    p = plan(state(history, job(batch=16)), RULES)
    acts(p, "generation_bound", "prefetch", 0, 2)
    assert "memory predicted at batch_size=17" in p.evidence["skipped"][0]


def test_the_verdict_compares_the_prediction_with_what_was_then_observed():
    prediction = {"model": "m", "batch": 4, "predicted_gib": 10.0}
    history = with_memory(steps(0, 10) + steps(10, 1, step_time=1.0, gen=0.5) + steps(11, 1, step_time=12.0, gen=11.0),
                          lambda s: 3.0 if s < 10 else 11.0)
    p = plan(state(history, job(batch=4), changes=[change()],
                   decisions=[decision(evidence={"reading": {}, "memory_prediction": prediction})]), RULES)
    assert p.outcome == "kept"
    assert p.evidence["memory_observed"] == {"peak_gib": 11.0, "predicted_gib": 10.0, "error_pct": 10.0}
