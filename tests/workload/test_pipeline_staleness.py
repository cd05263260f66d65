"""The reference pipeline's bounded staleness and its wait report (the demo config uses both): a batch sampled more
than ``max_staleness`` updates before it is trained on is sampled again, so generation running further ahead costs
work twice; the trainer's wait for samples goes to the hook as the "wait" phase; a step's report carries its
whole time, the first step's included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trimtab.trainer import attach
from trimtab.workload.config import preset
from trimtab.workload.loop import Pipeline

# One generation call makes a whole step's samples, so prefetch N lets generation run N steps ahead.
SMALL = preset("tiny", samples_per_step=16, train_micro_batch=8, reward_pretrain_steps=40)
WHOLE_STEP = {"batch_size": 16, "sync_every": 1}


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def run(config, steps: int = 8, **knobs):
    with Pipeline(config, "cpu", {**WHOLE_STEP, **knobs}) as pipeline:
        return pipeline.run(steps)


def test_without_a_bound_generation_three_steps_ahead_trains_on_samples_more_than_one_update_stale():
    records = run(SMALL, prefetch=3)
    assert max(r.staleness_mean for r in records) > 1
    assert sum(r.regenerated for r in records) == 0


def test_with_a_bound_of_one_the_too_stale_batches_are_sampled_again_and_nothing_staler_is_trained_on():
    records = run(replace(SMALL, max_staleness=1), prefetch=3)
    assert all(r.staleness_mean <= 1 for r in records)
    assert sum(r.regenerated for r in records) > 0
    assert all(r.regenerated % 16 == 0 for r in records)   # whole batches, sampled again from their prompts


def test_with_a_bound_of_one_one_step_ahead_costs_nothing_twice():
    records = run(replace(SMALL, max_staleness=1), prefetch=1)
    assert sum(r.regenerated for r in records) == 0
    assert any(r.staleness_mean == 1 for r in records[1:])   # it did run one step ahead


@pytest.mark.parametrize("report_wait", [True, False])
def test_the_trainer_wait_for_samples_is_reported_as_the_wait_phase_only_where_the_config_says(report_wait):
    config = replace(SMALL, report_wait=report_wait)
    hook = attach(job="pipeline-wait", knobs={"batch_size": (4, 1, 16), "prefetch": (0, 0, 4),
                                              "sync_every": (1, 1, 4)})
    with Pipeline(config, "cpu", hook=hook) as pipeline:
        records = pipeline.run(2)
    hook.close()
    report = hook.last_report
    if report_wait:
        assert report.phases_s["wait"] == pytest.approx(records[-1].wait_s, rel=1e-6)
        assert 0 < report.phases_s["wait"] < report.step_time_s
    else:
        assert not report.phases_s.get("wait")


def test_the_first_step_under_a_hook_reports_its_whole_time_not_only_its_update():
    hook = attach(job="pipeline-first-step", knobs={"batch_size": (1, 1, 16), "prefetch": (0, 0, 4),
                                                    "sync_every": (1, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        (record,) = pipeline.run(1)
    hook.close()
    report = hook.last_report
    assert report.step == 0
    assert report.step_time_s == pytest.approx(record.step_s, rel=1e-6)
    # Strictly sequential at prefetch 0: generation happened inside the step, before the update.
    assert report.step_time_s > report.phases_s["generation"] + report.phases_s["update"]
