"""trimtab's learning guards on verl 0.9.1's fully-async trainer (issue 41), reading verl's own logged metrics through
verl's real ``Tracking.log`` path: verl's real ``fit`` loops (tests/trainer/verl_async_harness.py) with trimtab
attached in ``auto`` mode; each sync cycle's metrics — ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``rollout_corr/*``,
``fully_async/count/stale_trajectory_processed`` — reach the step's learning group, and a staleness raise the
rebalancer makes is rolled back when a guard breaks, citing the signal.

Stubbed (GPU only), beyond the harness's generation and weight sync:

* the actor's forward/backward (``_update_actor``): the trained policy's log-probs are the rollout's, moved by noise
  that grows with each trajectory's lag behind the trainer (0.02 + 0.12 nats per version): a model of a policy that
  moved since the data was generated. Its metrics come from verl's own functions on those log-probs —
  ``core_algos.compute_policy_loss_vanilla`` (``actor/pg_clipfrac``, ``actor/ppo_kl``, …) and
  ``rollout_corr_helper.compute_rollout_correction_weights`` (``rollout_corr/*``, prefixed as verl's trainer logs
  them) — returned as the actor worker returns its metrics;
* the version tag of each generated trajectory (verl's agent loop writes the servers' ``global_steps`` into
  ``min_global_steps``/``max_global_steps``): the trainer's ``current_param_version`` when it was generated.

Everything else is verl's: the rollouter's staleness bound and pause, the MessageQueue, the trainer's stale count
(``_collect_metrics_from_samples``), ``MetricsAggregator`` and ``Tracking`` (``file`` backend)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.support.frameworks import require

require("verl")

import torch  # noqa: E402

from tests.support.hook_api import reports_of  # noqa: E402
from tests.support.verl_runs import attached  # noqa: E402
from tests.support.waits import eventually  # noqa: E402
from tests.trainer import verl_async_harness as harness  # noqa: E402

pytestmark = pytest.mark.usefixtures("verl_ray")
DRIFT_BASE, DRIFT_PER_VERSION = 0.02, 0.12
OFF_POLICY = ("clip_fraction", "kl", "eff_sample_size", "stale_share")


class _VersionedRollout(harness._StubRollout):
    """GPU: generation, as the harness stubs it, each trajectory tagged with the weights' version that made it."""

    def __init__(self, gen_s: float, trainer):
        super().__init__(gen_s)
        self.trainer = trainer

    async def generate_sequences_single(self, prompts):
        out = await super().generate_sequences_single(prompts)
        version = np.full(len(out), int(self.trainer.current_param_version), dtype=np.int64)
        out.non_tensor_batch["min_global_steps"] = version
        out.non_tensor_batch["max_global_steps"] = version.copy()
        return out


def _drifting_update(trainer, seed: int = 0):
    """GPU: the actor update. Its metrics from verl's own policy-loss and rollout-correction functions."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import core_algos, rollout_corr_helper

    g = torch.Generator().manual_seed(seed)
    # the run's actor config, with the batch layout the actor worker adds on its GPUs (none here: one process)
    actor = OmegaConf.create({**OmegaConf.to_container(trainer.config.actor_rollout_ref.actor, resolve=True),
                              "global_batch_info": {}})

    def update(batch):
        import time

        time.sleep(harness.UPDATE_SLEEP_S)
        mask = batch.batch["response_mask"].float()
        old = batch.batch["old_log_probs"].float()
        versions = batch.non_tensor_batch["max_global_steps"]
        lag = torch.tensor([max(0, trainer.current_param_version - int(v)) for v in versions], dtype=torch.float32)
        scale = (DRIFT_BASE + DRIFT_PER_VERSION * lag)[:, None]
        log_prob = old + torch.randn(old.shape, generator=g) * scale
        _, loss_metrics = core_algos.compute_policy_loss_vanilla(old, log_prob, batch.batch["advantages"], mask,
                                                                 loss_agg_mode="token-mean", config=actor)
        _, is_metrics = rollout_corr_helper.compute_rollout_correction_weights(log_prob - old, mask)
        metrics = {**{k: [float(v)] for k, v in loss_metrics.items()},
                   **{f"rollout_corr/{k}": [float(v)] for k, v in is_metrics.items()}, "actor/grad_norm": [1.0]}
        return DataProto(meta_info={"metrics": metrics})

    return update


def test_a_staleness_raise_is_rolled_back_citing_the_signal_verl_logged(served, tmp_path):
    """trigger_parameter_sync_step 1 and staleness_threshold 3 at start (verl sizes its MessageQueue for them: 8
    samples); an operator lowers prefetch to 1 first, so the rebalancer's raise back (+2: 1 → 3) fits the queue. The
    trainer waits on the rollouter, which fills its bound: the rules raise prefetch; its older samples move the
    policy's ratios further (the update stub's drift per version), and the guards roll the raise back naming the
    signal. The rules' window is 1 s here (4 s as shipped) to keep the run short."""
    from trimtab.grading.rules import load_rules

    api, start = served
    start(load_rules().with_overrides({"controller": {"window_min_s": 1.0}}))
    job = "verl-learning-guards"
    seen: dict[str, object] = {}

    def before_fit(trainer, rollouter):
        rollouter.async_rollout_manager = _VersionedRollout(0.05, trainer)
        trainer._update_actor = _drifting_update(trainer)

    async def operator(trainer, rollouter):
        def script():
            try:
                eventually(lambda: len(reports_of(api, job)) >= 2, timeout_s=60)
                r = api.post(f"/v1/jobs/{job}/changes", {"knob": "prefetch", "value": 1}, scope="admin")
                assert r.status_code in (200, 201), r.text
                closed = eventually(lambda: [
                    d for d in api.get("/v1/decisions", job=job).json()["decisions"]
                    if d["knob"] == "prefetch" and d["outcome"] in ("kept", "rolled_back")
                    and not d["evidence"].get("remeasure")], timeout_s=150)
                # the first raise's verdict (on a loaded host the first raise can come too soon after the operator's
                # change for a learning baseline: it goes back to be re-measured, goodput._unjudged, and is made again)
                seen["decision"] = min(closed, key=lambda d: d["id"])
            finally:  # the data ends here (what the rebalancer said, for a failure's message)
                seen["said"] = (api.get("/v1/decisions", job=job).json()["decisions"],
                                (api.get(f"/v1/jobs/{job}").json().get("planner") or {}).get("note"))
                rollouter.total_rollout_steps = rollouter.global_steps

        await asyncio.to_thread(script)

    try:
        run = harness.run_fully_async(tmp_path, job=job, samples=4000, staleness=3, trigger=1, gen_s=0.05,
                                      during=operator, before_fit=before_fit,
                                      overrides=attached(api, tmp_path, job, "+trimtab.mode=auto"))
    except Exception:
        decisions, note = seen.get("said", ([], None))
        print("planner:", note)
        for d in decisions:
            print(d["rule"], d["knob"], d["old_value"], d["new_value"], d["outcome"], d.get("advice"),
                  d["evidence"].get("skipped"))
        raise
    logged = harness.steps_of(run)
    trainer = {r["step"]: r for r in reports_of(api, job) if r["rank"] == 0}
    # verl's own logged metrics are the step's learning group
    # (the API lists a stored report flat: its learning group as learning_<signal>)
    both = [s for s in logged if s in trainer and trainer[s].get("learning_clip_fraction") is not None]
    assert len(both) >= 8, (len(logged), len(trainer))
    for s in both:
        got, data = trainer[s], logged[s]
        assert got["learning_clip_fraction"] == pytest.approx(data["actor/pg_clipfrac"])
        assert got["learning_kl"] == pytest.approx(data["actor/ppo_kl"])
        assert got["learning_eff_sample_size"] == pytest.approx(data["rollout_corr/rollout_is_eff_sample_size"])
    counts = [logged[s]["fully_async/count/stale_trajectory_processed"] for s in sorted(logged)]
    assert counts[-1] > counts[0]  # verl counted stale trajectories: the stale share is read from its count
    assert any((trainer[s]["learning_stale_share"] or 0) > 0 for s in both)
    d = seen["decision"]
    print(d["outcome"], d["evidence"].get("verdicts"))
    assert (d["old_value"], d["new_value"]) == (1, 3), d
    broken = d["evidence"]["learning_broken"]
    assert d["outcome"] == "rolled_back" and broken["signal"] in OFF_POLICY, d
    assert d["evidence"]["verdicts"]["learning"].startswith(f"broke: {broken['signal']} ")
    back = [c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"]
            if c["reason"].startswith(f"rollback: decision {d['id']}: ")]
    assert len(back) == 1 and (back[0]["knob"], back[0]["value"]) == ("prefetch", 1), back
    assert f"learning does not keep up: {broken['signal']} " in back[0]["reason"], back
