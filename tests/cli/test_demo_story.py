"""The pieces of `trimtab demo`'s story that a full run (about 90 s) cannot pin on its own: on the demo config a
prefetch deeper than its staleness bound costs samples sampled twice and measures slower — the real cost behind
the rollback the demo shows — and the report says for a rolled-back change the rebalancer's verdict and the
pipeline's own count of what was sampled twice."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.frameworks import require

require("torch")

from trimtab.cli.demo_cmd import _decision_row, _print_rollback, _print_why, _story  # noqa: E402
from trimtab.workload import story  # noqa: E402
from trimtab.workload.config import preset  # noqa: E402
from trimtab.workload.loop import Pipeline  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def test_on_the_demo_config_prefetch_beyond_one_step_samples_batches_twice_and_is_slower():
    config = preset("demo")
    one_ahead = {"batch_size": config.samples_per_step, "prefetch": 1, "sync_every": 1}
    three_ahead = {**one_ahead, "prefetch": 3}
    rates = {1: [], 3: []}
    regenerated = {1: 0, 3: 0}
    with Pipeline(config, "cpu", dict(one_ahead)) as pipe:
        for _ in range(2):  # interleaved, so a neighbour's load on the machine falls on both
            for knobs in (one_ahead, three_ahead):
                tp, records = story.measure_static(pipe, knobs, warmup=1, steps=6)
                rates[knobs["prefetch"]].append(tp)
                regenerated[knobs["prefetch"]] += sum(r.regenerated for r in records)
    assert regenerated[1] == 0 and regenerated[3] > 0, regenerated
    assert sum(rates[3]) < sum(rates[1]), rates


def decision(outcome: str, after_steps=(10, 13)) -> dict:
    return {"id": 6, "rule": "generation_bound", "change_id": 7, "knob": "prefetch", "old_value": 1.0,
            "new_value": 3.0, "applied_step": 9, "throughput_before_samples_per_s": 200.0,
            "throughput_after_samples_per_s": 140.0, "outcome": outcome, "advice": None,
            "evidence": {"gain_pct": -30.0, "after_window": {"steps": list(after_steps)},
                         "verdict": {"result": "worse", "ratio": 0.7, "confidence_pct": 99.9,
                                     "ci_pct": [-37.2, -21.7], "n_before": 14, "n_after": 9}}}


def test_a_rolled_back_change_is_shown_with_its_verdict_and_the_samples_sampled_twice(capsys):
    records = [SimpleNamespace(step=s, samples=64, regenerated=64 if s >= 11 else 0) for s in range(8, 16)]
    d = decision("rolled_back")
    row = _decision_row(d, records)
    assert (row["regenerated_after"], row["samples_after"]) == (192, 256)  # steps 10–13 only
    _print_rollback(d, row)
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict: -30.0 % (95 % interval -37.2 … -21.7 %, 100 % sure; 14 sync periods before, 9 after): " \
           "worse, prefetch back to 1" in out
    assert "192 of the 256 samples after the change were sampled twice" in out


def test_a_change_rolled_back_as_no_better_than_noise_says_so(capsys):
    d = decision("rolled_back")
    d["evidence"]["back_to_known"] = True
    d["evidence"]["verdict"].update(result="inconclusive", ratio=0.97, confidence_pct=60.0)
    _print_rollback(d, _decision_row(d, []))
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict: -3.0 % " in out and "60 % sure" in out
    assert "not told apart from noise and no better, prefetch back to 1" in out and "worse," not in out


def test_a_rollback_without_samples_sampled_twice_claims_no_such_cause(capsys):
    records = [SimpleNamespace(step=s, samples=64, regenerated=0) for s in range(8, 16)]
    d = decision("rolled_back")
    _print_rollback(d, _decision_row(d, records))
    out = capsys.readouterr().out
    assert "verdict:" in out and "sampled twice" not in out


def test_the_story_counts_what_moved_what_was_kept_and_what_was_rolled_back():
    rows = [{"knob": "batch_size", "outcome": "kept"}, {"knob": "prefetch", "outcome": "kept"},
            {"knob": "prefetch", "outcome": "rolled_back"}, {"knob": None, "outcome": "advised"}]
    assert _story(rows) == {"knobs_moved": ["batch_size", "prefetch"], "knobs_kept": ["batch_size", "prefetch"],
                            "kept": 2, "rolled_back": 1}


def test_progress_lines_show_the_rebalancers_figures_not_a_single_steps_rate(monkeypatch):
    """Issue 23: "step 71: … prefetch 3 — 297.0 samples/s" read as a gain while decision #5 below it said −42 % and
    rolled it back. Each line now gives the figures the decisions are measured over, never one step's rate."""
    from trimtab.cli import demo_cmd

    forward = {"change_id": 9, "knob": "prefetch", "value": 3, "reason": "generation_bound: … → prefetch +2"}
    back = {"change_id": 10, "knob": "prefetch", "value": 1, "reason": "rollback: decision 5: worse"}
    pending = {"id": 5, "rule": "generation_bound", "change_id": 9, "knob": "prefetch", "outcome": "pending",
               "throughput_before_samples_per_s": 262.3, "throughput_after_samples_per_s": None,
               "evidence": {"window": {"steps": [41, 57]}}}
    rolled = {**pending, "outcome": "rolled_back", "throughput_before_samples_per_s": 262.3,
              "throughput_after_samples_per_s": 152.3,
              "evidence": {"window": {"steps": [41, 57]}, "gain_pct": -42.0,
                           "before_window": {"samples_per_s": 262.3},
                           "verdict": {"ratio": 0.58, "confidence_pct": 100.0, "ci_pct": [-46.2, -37.4]}}}
    api = {"changes": [forward], "decisions": [pending]}
    monkeypatch.setattr(story, "api_get", lambda _daemon, path: {
        "changes": api["changes"]} if "/changes" in path else {"decisions": api["decisions"]})
    lines = []
    show = demo_cmd._progress(lines.append, None, "demo-1", (64, 1, 1))
    show(SimpleNamespace(step=59, batch_size=64, prefetch=3, sync_every=1, samples_per_s=195.3))
    show(SimpleNamespace(step=60, batch_size=64, prefetch=3, sync_every=1, samples_per_s=310.0))  # no change: quiet
    api.update(changes=[back, forward], decisions=[rolled])
    show(SimpleNamespace(step=71, batch_size=64, prefetch=1, sync_every=1, samples_per_s=297.0))
    assert lines == [
        "  step   59: prefetch 1 → 3 (decision #5, generation_bound, at 262.3 samples/s over steps 41–57)",
        "  step   71: prefetch 3 → 1, rolled back on decision #5's verdict: -42.0 % (100 % sure), worse"]


def test_a_change_below_the_rules_act_line_says_it_followed_a_gain_through(capsys):
    d = decision("kept")
    d["evidence"].update(reading={"message": "generation share (wall time) 44.6 % of step over steps 30–49 (20 with "
                                             "data; lower half-window 43.7; act above 50)"},
                         step_policy=["following through: decision 2 (batch_size 4 → 16) measured a gain and the "
                                      "signal is still above 25 % of step", {"memory_prediction": {}}])
    _print_why(d)
    out = capsys.readouterr().out
    assert "why: generation share (wall time) 44.6 %" in out
    assert "following through: decision 2 (batch_size 4 → 16) measured a gain" in out
    del d["evidence"]["step_policy"]
    _print_why(d)
    assert "following through" not in capsys.readouterr().out
