"""The reference PPO pipeline end to end on CPU (tiny config): it trains and the reward rises, the prefetch bound
holds, the generation copy equals the actor exactly at sync steps and only there, knob changes apply from the next
step — from a plain mapping, and posted to the live API through the hook — an OOM in generation costs a smaller
batch, not the job, a failing worker stops the trainer with its error, and the CLI writes its records.
"""

from __future__ import annotations

import json
import time
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trimtab.trainer import attach
from trimtab.workload import generation
from trimtab.workload.config import preset
from trimtab.workload.loop import Pipeline

from tests.support.hook_api import reports_of
from tests.support.waits import eventually

REPO = Path(__file__).resolve().parents[2]
SMALL = preset("tiny", samples_per_step=16, train_micro_batch=8, reward_pretrain_steps=40)


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def knobs(batch_size: int = 1, prefetch: int = 0, sync_every: int = 1) -> dict:
    return {"batch_size": batch_size, "prefetch": prefetch, "sync_every": sync_every}


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_a_few_tiny_steps_train_with_finite_losses_and_a_reward():
    with Pipeline(SMALL, "cpu", knobs(batch_size=4, prefetch=1)) as pipeline:
        records = pipeline.run(3)
    assert [r.step for r in records] == [0, 1, 2]
    for record in records:
        assert record.samples == 16 and sum(record.generation_batch_sizes) == 16
        assert all(math.isfinite(x) for x in (record.policy_loss, record.value_loss, record.kl))
        assert 0.0 <= record.reward_mean <= 1.0
        assert record.samples_per_s > 0 and record.generation_s > 0 and record.update_s > 0
    assert pipeline.reward_accuracy > 0.95   # the reward model learned the rule it scores


def test_the_task_is_learnable_reward_rises_under_ppo():
    config = preset("tiny")
    with Pipeline(config, "cpu", knobs(batch_size=64)) as pipeline:
        records = pipeline.run(15)
    first = sum(r.reward_mean for r in records[:3]) / 3
    last = sum(r.reward_mean for r in records[-3:]) / 3
    assert last > first + 0.1, (first, last)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_prefetch_bounds_how_many_generated_batches_wait(prefetch):
    with Pipeline(SMALL, "cpu", knobs(batch_size=2, prefetch=prefetch)) as pipeline:
        records = pipeline.run(4)
    depths = [r.queue_max_depth for r in records]
    assert max(depths) <= prefetch
    if prefetch == 0:
        # Strictly sequential: every sample comes from the policy that is being trained.
        assert all(r.staleness_mean == 0 for r in records)
    else:
        assert max(depths) == prefetch   # generation ran ahead while the trainer updated
        assert any(r.staleness_mean > 0 for r in records[1:])


def test_generation_copy_equals_the_actor_exactly_at_sync_steps_and_differs_between():
    with Pipeline(SMALL, "cpu", knobs(batch_size=8, sync_every=2)) as pipeline:
        assert same_weights(pipeline.actor, pipeline.generation_model)
        for step in range(4):
            record = pipeline.step()
            assert record.synced == (step % 2 == 1)
            assert same_weights(pipeline.actor, pipeline.generation_model) == record.synced
        assert pipeline.syncs == 2


def test_knob_changes_take_effect_at_the_next_step():
    mapping = knobs(batch_size=1, prefetch=0, sync_every=1)
    with Pipeline(SMALL, "cpu", mapping) as pipeline:
        first = pipeline.step()
        mapping.update(batch_size=8, prefetch=2, sync_every=3)
        records = pipeline.run(3)
        assert pipeline.queue.capacity == 2
    assert first.generation_batch_sizes == [1] * 16 and first.synced
    assert records[0].generation_batch_sizes == [8, 8]
    assert [(r.batch_size, r.prefetch, r.sync_every) for r in records] == [(8, 2, 3)] * 3
    assert [r.synced for r in records] == [False, False, True]


def test_in_standalone_mode_the_hook_gets_every_phase_and_the_knobs_it_declared():
    hook = attach(job="pipeline-test", knobs={"batch_size": (4, 1, 16), "prefetch": (1, 0, 4),
                                              "sync_every": (2, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        records = pipeline.run(2)
    hook.close()
    assert [(r.batch_size, r.prefetch, r.sync_every) for r in records] == [(4, 1, 2)] * 2
    report = hook.last_report
    assert report.step == 1 and report.samples == 16
    # generation and evaluation run in the workers and arrive as seconds; update and communication as blocks.
    for phase in ("generation", "evaluation", "update", "communication"):
        assert report.phases_s[phase] > 0, phase
    assert report.queue_high_water == records[-1].queue_max_depth <= 1  # prefetch 1: at most one batch waits
    assert report.to_wire()["queue_high_water"] == report.queue_high_water


def test_a_change_posted_to_the_live_api_resizes_the_running_pipeline_and_is_acknowledged(sqlite_api):
    api = sqlite_api
    hook = attach(job="ppo-pipeline", server=api.url, token=api.token("job"),
                  knobs={"batch_size": (2, 1, 16), "prefetch": (0, 0, 4), "sync_every": (1, 1, 4)})
    try:
        with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
            eventually(lambda: api.get("/v1/jobs/ppo-pipeline").status_code == 200)
            r = api.post("/v1/jobs/ppo-pipeline/changes", {"knob": "batch_size", "value": 8, "reason": "gen-bound"},
                         token=api.admin_token)
            assert r.status_code == 201, r.text
            records = [pipeline.step()]
            while records[-1].batch_size != 8 and len(records) < 200:
                records.append(pipeline.step())
            records.append(pipeline.step())
    finally:
        hook.close()
    first_8 = next(i for i, rec in enumerate(records) if rec.batch_size == 8)
    assert first_8 > 0 and all(rec.generation_batch_sizes == [2] * 8 for rec in records[:first_8])
    assert all(rec.generation_batch_sizes == [8, 8] for rec in records[first_8:])
    (change,) = api.get("/v1/jobs/ppo-pipeline/changes").json()["changes"]
    assert change["status"] == "applied" and change["applied_step"] == first_8
    reports = eventually(lambda: (got := reports_of(api, "ppo-pipeline")) and len(got) == len(records) and got)
    assert all(rep["generation_s"] > 0 and rep["update_s"] > 0 and rep["samples"] == 16 for rep in reports)
    # the queue's high-water mark, stored as the pipeline counted it (control/queue_use.py reads it)
    assert [rep["queue_high_water"] for rep in sorted(reports, key=lambda r: r["step"])] == \
        [rec.queue_max_depth for rec in records]


def test_a_generation_oom_is_survived_with_a_smaller_batch(monkeypatch):
    real = generation.generate
    calls = []

    def out_of_memory_once(model, prompts, *args, **kwargs):
        calls.append(prompts.shape[0])
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, prompts, *args, **kwargs)

    monkeypatch.setattr(generation, "generate", out_of_memory_once)
    hook = attach(job="pipeline-oom", knobs={"batch_size": (8, 1, 16), "prefetch": (0, 0, 4),
                                             "sync_every": (1, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        records = pipeline.run(2)
    hook.close()
    assert calls[:2] == [8, 4]                 # retried at once with half the batch
    assert sum(records[0].generation_batch_sizes) == 16
    assert records[1].batch_size == 4 and hook.ooms == 1   # the hook halved the knob from the next step


def test_a_failing_worker_surfaces_in_the_trainer(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("generation broke")

    monkeypatch.setattr(generation, "generate", broken)
    with Pipeline(SMALL, "cpu", knobs(batch_size=4)) as pipeline:
        with pytest.raises(RuntimeError, match="pipeline failed") as info:
            pipeline.step()
    assert "generation broke" in repr(info.value.__cause__.__cause__)


def test_cli_runs_three_steps_and_writes_records(tmp_path):
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "trimtab.workload", "--config", "tiny", "--steps", "3", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout and "summary:" in result.stdout
    data = json.loads(out.read_text())
    assert [r["step"] for r in data["records"]] == [0, 1, 2]
    assert (data["records"][0]["batch_size"], data["records"][0]["prefetch"],
            data["records"][0]["sync_every"]) == (1, 0, 1)   # the deliberately bad defaults
    assert data["summary"]["samples"] == 3 * 64


def test_cli_without_torch_says_what_to_install_in_one_line():
    """As `trimtab demo` does: no traceback. torch is made unimportable in the child (sys.modules[...] = None)."""
    blocked = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['pipeline', '--steps', '1']; "
               "runpy.run_module('trimtab.workload', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "pip install '.[trainer]'" in result.stderr and "download.pytorch.org/whl/cpu" in result.stderr


def test_a_benchmark_s_own_polling_between_auto_steps_is_not_the_job_s_step_time():
    """``story.run_auto`` asks the daemon whether the rebalancer settled (a ``GET /healthz``, 20+ ms on 2 cores) and
    prints each step: on the tiny pipeline's 50 ms steps that bookkeeping read as a 40 % slower job, in the figures
    and in the reports the rebalancer judged. It is off the job's clock, and asked at most every ``poll_s``."""
    from trimtab.workload import story

    asked = []

    def slow_settled() -> bool:
        asked.append(1)
        time.sleep(0.3)
        return False

    hook = attach(job="pipeline-test", knobs={"batch_size": (4, 1, 16), "prefetch": (0, 0, 4),
                                              "sync_every": (1, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        run = story.run_auto(pipeline, hook, max_steps=6, budget_s=60, tail_steps=100,
                             show=lambda r: time.sleep(0.3), settled=slow_settled, poll_s=0.0)
    hook.close()
    assert len(asked) == 6
    reported = [r.step_s for r in run.records]
    assert max(reported) < 0.6 * 0.9, reported  # each step would carry 0.6 s of the bench's sleeps
    assert sum(reported) < 0.5 * 6 * 0.6, reported
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        asked.clear()
        story.run_auto(pipeline, hook, max_steps=6, budget_s=60, tail_steps=100, settled=slow_settled, poll_s=10.0)
    assert len(asked) == 1  # the answer of the first ask stands for the steps within poll_s


def test_an_auto_run_ends_settled_only_on_a_fresh_answer():
    """An answer up to ``poll_s`` old stands for the steps in between, but it must not end the run: `trimtab demo`
    ended its auto phase on a second-old "settled" while the rebalancer was queueing a change."""
    from trimtab.workload import story

    answers = iter([True, False])
    asked = []

    def settled() -> bool:
        asked.append(1)
        return next(answers, False)

    hook = attach(job="pipeline-test", knobs={"batch_size": (4, 1, 16), "prefetch": (0, 0, 4),
                                              "sync_every": (1, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        run = story.run_auto(pipeline, hook, max_steps=6, budget_s=60, tail_steps=2, settled=settled, poll_s=60.0)
    hook.close()
    assert len(asked) == 2 and len(run.records) == 6 and run.stopped_because == "6 steps"


def test_a_time_budget_ends_no_auto_run_before_its_minimum_steps():
    """A budget in seconds is a different run on a slower host: on the H200 a 240 s budget held 60–90 auto steps on
    some days and 11–24 on others (runs 24–26), and the controller's climb went on in the paired blocks after it.
    ``min_steps`` holds the run to a step count first; the budget still ends it after that."""
    from trimtab.workload import story

    hook = attach(job="pipeline-test", knobs={"batch_size": (4, 1, 16), "prefetch": (0, 0, 4),
                                              "sync_every": (1, 1, 4)})
    with Pipeline(SMALL, "cpu", hook=hook) as pipeline:
        held = story.run_auto(pipeline, hook, max_steps=8, budget_s=0.0, tail_steps=100, min_steps=4)
        plain = story.run_auto(pipeline, hook, max_steps=8, budget_s=0.0, tail_steps=100)
    hook.close()
    assert len(held.records) == 4 and held.stopped_because == "time budget 0 s (after at least 4 steps)"
    assert len(plain.records) == 1 and plain.stopped_because == "time budget 0 s"
