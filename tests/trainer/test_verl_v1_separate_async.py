"""trimtab's ``sync_every`` and ``prefetch`` live in verl 0.9.1's V1 ``separate_async`` trainer
(``trainer.v1.trainer_mode=separate_async``): attached the way the README says (installed, plus the
``+trimtab.server`` override) while verl's real ``PPOTrainerSeparateAsync.fit`` runs on CPU against a live API.
``tests/trainer/verl_v1_harness.py`` says what is stubbed: the worker groups' GPU compute and their CPU copies of
the model, generation (the agent loop writes TransferQueue from a thread), the standalone rollout replicas and the
weight syncs, validation and checkpoint bodies. verl's ``step()`` loop, its replay buffer (off-policy eviction and
refill) and its metrics are verl's own.

Shown: a queued change reaches the object verl reads it from (``PPOTrainer.parameter_sync_step``,
``ReplayBufferAsync.max_off_policy_threshold``), verl's next step runs with it (its own update count, its own
eviction metric) and the change is acknowledged with that step, not before; a change verl cannot run with is
refused with why; a knob verl's config turned off is not declared."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from tests.support.frameworks import require

require("verl")

from tests.support.hook_api import reports_of  # noqa: E402
from tests.support.verl_runs import attached  # noqa: E402
from tests.support.waits import eventually  # noqa: E402
from tests.trainer.verl_v1_harness import logged_steps, run_separate_async_fit, updates_by_step  # noqa: E402
from trimtab.trainer.adapters.verl_v1_async import V1AsyncApplier, declare  # noqa: E402
from trimtab.trainer.apply import KnobChange  # noqa: E402

pytestmark = pytest.mark.usefixtures("verl_ray")
EVICTED = "training/off_policy/evicted_samples"  # verl's ReplayBufferAsync: groups dropped as too stale


def run_with_a_change(served, tmp_path, job: str, knob: str, value, **fit) -> tuple:
    """verl's separate_async fit attached as the README says, with an admin's change of ``knob`` queued once the
    run has reported a step (the rebalancer's go the same way); the run and the change as the server settled it."""
    api, start = served
    start()
    queued: dict = {}

    def operator():
        eventually(lambda: len(reports_of(api, job)) >= 1, timeout_s=60)
        r = api.post(f"/v1/jobs/{job}/changes", {"knob": knob, "value": value}, scope="admin")
        queued["status"], queued["body"] = r.status_code, r.json()

    thread = threading.Thread(target=operator)
    thread.start()
    run = run_separate_async_fit(tmp_path, steps=8, sync_step=2, mini=2, step_s=0.1,
                                 overrides=attached(api, tmp_path, job), **fit)
    thread.join(10)
    assert queued["status"] in (200, 201), queued
    cid = queued["body"]["change_id"]
    change = eventually(lambda: (c := change_of(api, job, cid))["status"] != "pending" and c)
    return run, change


def change_of(api, job: str, cid: int) -> dict:
    return next(c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["change_id"] == cid)


def test_v1_separate_async_sync_every_moves_parameter_sync_step_live_acknowledged_with_the_first_step_verl_ran_it(
        served, tmp_path):
    api, job = served[0], "verl-v1-sync-every"
    run, change = run_with_a_change(served, tmp_path, job, "sync_every", 4)
    registered = api.get(f"/v1/jobs/{job}").json()["knobs"]
    # 64 prompts / ppo_mini_batch_size 2: the most updates one step's prompts allow; verl's default constant LR
    assert registered["sync_every"]["min"] == 1 and registered["sync_every"]["max"] == 32
    assert change["status"] == "applied", change
    acked = change["applied_step"]
    updates = updates_by_step(run)  # verl's step() loop: one update_actor per local update
    print(f"sync_every 2 → 4 acknowledged at step {acked}; update_actor calls per step: {updates}")
    assert 1 < acked <= 8
    assert all(n == 2 for step, n in updates.items() if step < acked), updates
    assert all(n == 4 for step, n in updates.items() if step >= acked), updates  # from the acknowledged step on
    # verl's invariant kept where it reads it: train_batch_size = parameter_sync_step × ppo_mini_batch_size
    assert run.trainer.parameter_sync_step == 4 and run.trainer.config.data.train_batch_size == 8
    # one optimizer step still learns from the same mini-batch: ppo_mini_batch_size 2 × rollout.n 2
    assert {keys["mini_batch_size"] for _, name, keys in run.calls if name == "update_actor"} == {4}
    # verl's own token count per step doubled with the step's prompts (4 → 8 prompts, 2 responses each)
    steps = logged_steps(run)
    samples = {s: round(d["perf/total_num_tokens"] / (d["prompt_length/mean"] + d["response_length/mean"]))
               for s, d in steps.items()}
    assert {samples[s] for s in steps if s < acked} == {8} and {samples[s] for s in steps if s >= acked} == {16}
    # one weight sync per step either way: more updates per sync is what a larger sync_every buys
    syncs = [step for step, name in run.events if name == "standalone_update_weights"]
    assert syncs == list(range(0, 9))
    assert api.get(f"/v1/jobs/{job}").json()["knobs"]["sync_every"]["value"] == 4


def test_v1_separate_async_prefetch_moves_the_replay_buffers_off_policy_threshold_live_acknowledged_at_its_step(
        served, tmp_path):
    api, job = served[0], "verl-v1-prefetch"
    run, change = run_with_a_change(served, tmp_path, job, "prefetch", 1, threshold=8)
    assert api.get(f"/v1/jobs/{job}").json()["knobs"]["prefetch"] == {"value": 1, "min": 1, "max": 8}
    assert change["status"] == "applied", change
    acked = change["applied_step"]
    steps = logged_steps(run)
    evicted = {s: d.get(EVICTED, 0) for s, d in steps.items()}
    print(f"prefetch 8 → 1 acknowledged at step {acked}; verl's {EVICTED} per step: {evicted}")
    assert run.trainer.replay_buffer.max_off_policy_threshold == 1  # the object verl reads it from
    # Each step trains on prompts submitted a step earlier (span 2): under 8 verl kept them, under 1 its sampler
    # drops them as stale and refills (its own metric), from the acknowledged step on and not before.
    assert 1 < acked <= 8
    assert all(n == 0 for s, n in evicted.items() if s < acked), evicted
    assert all(n > 0 for s, n in evicted.items() if s >= acked), evicted


def test_v1_separate_async_declares_no_prefetch_when_verl_turned_it_off_and_changes_it_cannot_take_never_reach_it(
        served, tmp_path):
    """``max_off_policy_threshold: null`` (verl's version control off): no ``prefetch`` is declared, so a change of
    it is rejected by the server and never reaches verl; so is a ``sync_every`` verl could not loop over (2.5)."""
    api, start = served
    start()
    job = "verl-v1-not-live"
    answers: dict = {}

    def operator():
        eventually(lambda: len(reports_of(api, job)) >= 1, timeout_s=60)
        for knob, value in (("prefetch", 2), ("sync_every", 2.5)):
            r = api.post(f"/v1/jobs/{job}/changes", {"knob": knob, "value": value}, scope="admin")
            answers[knob] = r.status_code, r.text

    thread = threading.Thread(target=operator)
    thread.start()
    run = run_separate_async_fit(tmp_path, steps=6, sync_step=2, mini=2, threshold=None, step_s=0.1,
                                 overrides=attached(api, tmp_path, job))
    thread.join(10)
    print(f"answers: {answers}")
    knobs = api.get(f"/v1/jobs/{job}").json()["knobs"]
    assert "prefetch" not in knobs and knobs["sync_every"]["value"] == 2
    assert answers["prefetch"][0] in (404, 422) and "prefetch" in answers["prefetch"][1]
    assert answers["sync_every"][0] == 422 and "integers" in answers["sync_every"][1]
    assert api.get(f"/v1/jobs/{job}/changes").json()["changes"] == []
    assert run.trainer.replay_buffer.max_off_policy_threshold is None
    assert run.trainer.parameter_sync_step == 2 and set(updates_by_step(run).values()) == {2}


def test_a_change_for_a_replay_buffer_not_built_is_refused_with_why():
    """The applier alone (no verl object: a trainer whose replay buffer is gone), and bounds checked at the job."""
    trainer = SimpleNamespace(replay_buffer=None, config=None, global_steps=3)
    applier = V1AsyncApplier(trainer, {"prefetch": ((8, 1, 8), "bounds"), "sync_every": ((2, 1, 4), "bounds")})
    assert applier.refusal("prefetch", 2) == "verl's replay buffer is not built"
    assert "outside [1, 4]" in applier.refusal("sync_every", 5)
    assert "not an integer >= 1" in applier.refusal("sync_every", 0)
    assert "no live setting" in applier.refusal("batch_size", 2)
    seen = []
    change = KnobChange("prefetch", 8, 2, step=3, change_id=7, _resolve=seen.append)
    applier.apply(change)
    assert change.status == "refused" and change.reason == "verl's replay buffer is not built" and seen == [change]


def test_declared_bounds_follow_what_verl_fixed_at_start():
    """``declare`` on a config alone (no verl object): a schedule verl sized at start caps ``sync_every`` at its
    start value; rollout skip (reads parameter_sync_step once) and a null threshold declare nothing, with why."""
    from omegaconf import OmegaConf

    def trainer(scheduler: str = "constant", skip: bool = False, threshold=4):
        config = OmegaConf.create({
            "trainer": {"v1": {"trainer_mode": "separate_async", "sampler": {"custom_sampler": {"path": None}}}},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2, "optim": {"lr_scheduler_type": scheduler}}},
            "skip": {"rollout_tq": {"enable": skip}}})
        return SimpleNamespace(config=config, replay_buffer=SimpleNamespace(max_off_policy_threshold=threshold),
                               parameter_sync_step=2, train_dataset=[None] * 64, total_training_steps=10,
                               use_critic=False)

    live, why_not = declare(trainer())
    assert live["sync_every"][0] == (2, 1, 32) and live["prefetch"][0] == (4, 1, 10) and why_not == {}
    live, _ = declare(trainer(scheduler="cosine"))
    assert live["sync_every"][0] == (2, 1, 2) and "lr_scheduler_type=cosine" in live["sync_every"][1]
    live, why_not = declare(trainer(skip=True, threshold=None))
    assert live == {} and "rollout skip" in why_not["sync_every"] and "is None" in why_not["prefetch"]


def test_the_rebalancers_communication_rule_moves_v1_separate_async_sync_every_unchanged_and_verl_runs_it(
        served, tmp_path):
    """trimtab's shipped rule for communication (``sync_every`` × 2), made to fire on this tiny CPU run (its weight
    sync is a 2 ms stub), in auto mode: the rebalancer's own change reaches verl's ``step()`` loop."""
    from tests.trainer.test_verl_e2e import only
    from trimtab.grading.rules import load_rules

    api, start = served
    overrides = only("communication_bound", {"window_min_s": 0.05, "window_min_steps": 2, "window_max_steps": 4})
    overrides["rules"]["communication_bound"] = {"healthy_below": 0.0, "act_above": 0.0, "follow_above": -1.0,
                                                 "strong_above": 1e12}
    start(load_rules(None, overrides))
    job = "verl-v1-rebalanced"
    run = run_separate_async_fit(tmp_path, steps=10, sync_step=2, mini=2, step_s=0.1,
                                 overrides=attached(api, tmp_path, job, "+trimtab.mode=auto"))
    changes = api.get(f"/v1/jobs/{job}/changes").json()["changes"]
    first = min((c for c in changes if c["source"] == "rebalancer" and c["status"] == "applied"),
                key=lambda c: c["change_id"], default=None)
    assert first is not None, changes
    assert (first["knob"], first["value"]) == ("sync_every", 4)
    updates = updates_by_step(run)
    print(f"rebalancer: sync_every 2 → 4 acknowledged at step {first['applied_step']}; updates per step {updates}")
    assert updates[first["applied_step"]] == 4
    assert all(n == 2 for step, n in updates.items() if step < first["applied_step"]), updates
