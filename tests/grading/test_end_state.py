"""The end state as a verdict (trimtab.grading.end_state): each GPU's band, the step time's variation and the
scaling efficiency against the job's own steps at another GPU count — and the word each combination gives."""

from __future__ import annotations

import pytest

from trimtab.grading.end_state import (ABOVE, AT_END_STATE, BELOW, IN, NOT_YET, UNKNOWN, GpuBand, band_of,
                                       scaling_of, steps_of, verdict)
from trimtab.grading.rules import default_rules, load_rules
from trimtab.grading.rules_parse import RulesError

CTL = default_rules().controller


def rows(step0: int, n: int, gpus: int, step_s: float, samples_per_rank: float = 8.0, t0_ms: int = 0,
         jitter=lambda i: 0.0):
    """Rank reports of ``n`` steps on ``gpus`` GPUs (one rank each) of one node, ``step_s`` long."""
    out = []
    for i in range(n):
        end = t0_ms + int(1000 * sum(step_s + jitter(k) for k in range(i + 1)))
        for g in range(gpus):
            out.append({"step": step0 + i, "rank": g, "received_ms": end, "step_time_s": step_s + jitter(i),
                        "samples": samples_per_rank, "hostname": "n", "local_gpu": g})
    return out


def bands(*utils):
    return [GpuBand("n", i, "actor", u, 10, band_of(u, CTL)) for i, u in enumerate(utils)]


def test_the_band_is_the_rules_60_to_75_percent():
    assert [band_of(u, CTL) for u in (59.9, 60.0, 70.0, 75.0, 75.1, None)] == [BELOW, IN, IN, IN, ABOVE, UNKNOWN]


def test_scaling_is_per_gpu_throughput_against_the_jobs_own_smaller_gpu_count():
    history = steps_of(rows(1, 20, 2, 1.0) + rows(21, 20, 4, 1.25, t0_ms=100_000), None)
    window = [s for s in history if s.step > 20]
    s = scaling_of(window, history)
    # 2 GPUs: 16 samples/s, 8 per GPU; 4 GPUs: 32 samples / 1.25 s = 25.6/s, 6.4 per GPU: 80 % of linear
    assert (s.gpus, s.baseline_gpus, s.baseline_steps) == (4, 2, 20)
    assert s.samples_per_s_per_gpu == pytest.approx(6.4) and s.baseline_samples_per_s_per_gpu == pytest.approx(8.0)
    assert s.efficiency == pytest.approx(0.8)
    e = verdict(CTL, 300, 0, 1, bands(70, 70, 70, 70), window, s)
    assert e.status == NOT_YET and "scaling 80 % of linear from 2 to 4 GPUs" in e.word


def test_without_another_gpu_count_scaling_is_unknown_and_says_why():
    history = steps_of(rows(1, 20, 4, 1.0), None)
    s = scaling_of(history, history)
    assert s.efficiency is None and s.gpus == 4 and "no steps at another GPU count than 4" in s.source
    e = verdict(CTL, 300, 0, 1, bands(65, 70, 61, 74), history, s)
    assert e.status == AT_END_STATE and e.word == "at end state (scaling unknown: no baseline)"
    assert e.step_time_cv_pct == 0.0
    no_samples = steps_of([{**r, "samples": None} for r in rows(1, 20, 4, 1.0)], None)
    assert "no sample counts" in scaling_of(no_samples, no_samples).source


def test_step_time_variation_over_5_percent_is_not_yet():
    history = steps_of(rows(1, 30, 2, 1.0, jitter=lambda i: 0.1 if i % 2 else -0.1), None)
    e = verdict(CTL, 300, 0, 1, bands(70, 70), history, scaling_of(history, history))
    assert e.step_time_cv_pct == pytest.approx(10.17, abs=0.05)
    assert e.status == NOT_YET and "step time varies 10.2 % (goal < 5 %)" in e.word


def test_a_gpu_outside_the_band_is_not_yet_and_named():
    history = steps_of(rows(1, 10, 2, 1.0), None)
    e = verdict(CTL, 300, 0, 1, bands(97, 47), history, scaling_of(history, history))
    assert e.status == NOT_YET and "GPU n:0 97 % above; GPU n:1 47 % below" in e.word


def test_missing_samples_or_steps_are_unknown_never_a_pass():
    history = steps_of(rows(1, 10, 2, 1.0), None)
    e = verdict(CTL, 300, 0, 1, bands(70, None), history, scaling_of(history, history))
    assert e.status == UNKNOWN and "no utilization samples of GPU n:1" in e.word
    e = verdict(CTL, 300, 0, 1, bands(70, 70), history[:2], scaling_of(history[:2], history[:2]))
    assert e.status == UNKNOWN and "fewer than 3 steps" in e.word and e.step_time_cv_pct is None


def test_the_thresholds_are_data(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[controller]\nend_state_util_low_pct = 40.0\nend_state_step_cv_max_pct = 20.0\n")
    ctl = load_rules(path).controller
    assert band_of(50.0, ctl) == IN and band_of(50.0, CTL) == BELOW
    history = steps_of(rows(1, 30, 2, 1.0, jitter=lambda i: 0.1 if i % 2 else -0.1), None)
    assert verdict(ctl, 300, 0, 1, [GpuBand("n", 0, "a", 50, 5, IN)], history,
                   scaling_of(history, history)).status == AT_END_STATE
    path.write_text("[controller]\nend_state_util_low_pct = 80.0\n")
    with pytest.raises(RulesError, match="end_state_util_low_pct"):
        load_rules(path)
