"""trimtab attached to verl 0.9.1 the way the README says — installed (the ``verl.plugins`` entry point) plus one
Hydra override naming the server — while verl's own fit loops run on CPU (``tests/trainer/verl_harness.py`` says
exactly what is stubbed: the GPU compute of the worker groups, the rollout, weight sync, validation and checkpoint
bodies). Against a live API with the rebalancer in the loop: the job registers with the knobs verl's config makes
safe, every step is reported with phases that add up to the real step time including validation, a queued change
reaches the next worker call's data and is acknowledged only then, and a change verl cannot apply is refused,
stored as such and shown by ``GET /v1/decisions`` and ``trimtab check``."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from tests.support.frameworks import require

require("verl")

from click.testing import CliRunner  # noqa: E402

from tests.support.hook_api import reports_of  # noqa: E402
from tests.support.verl_runs import PHASE_COLUMNS, attached, verl_workers  # noqa: E402
from tests.support.waits import eventually  # noqa: E402
from tests.trainer import verl_harness as tests_harness  # noqa: E402
from tests.trainer.verl_legacy_harness import run_legacy_fit  # noqa: E402
from tests.trainer.verl_v1_sync_harness import run_v1_fit  # noqa: E402
from trimtab.cli.main import cli  # noqa: E402
from trimtab.contract.kinds import clean  # noqa: E402
from trimtab.contract.learning import BY_NAME as LEARNING  # noqa: E402
from trimtab.grading.rules import load_rules  # noqa: E402
from trimtab.trainer.adapters.verl_metrics import verl_step  # noqa: E402


def by_step(api, job: str) -> dict[int, dict]:
    return {r["step"]: r for r in reports_of(api, job)}


@pytest.mark.parametrize("fit, kind", [(run_v1_fit, "v1"), (run_legacy_fit, "legacy")], ids=["v1", "legacy"])
def test_every_verl_step_is_reported_with_phases_adding_up_to_the_step_including_validation(served, tmp_path,
                                                                                           fit, kind):
    api, start = served
    start()
    run = fit(tmp_path, steps=4, test_freq=2, save_freq=3, step_s=0.02,
              overrides=attached(api, tmp_path, f"verl-{kind}"))
    steps = {r["step"]: r["data"] for r in run.records if "timing_s/step" in r["data"]}
    assert sorted(steps) == [1, 2, 3, 4]
    reports = eventually(lambda: len(by_step(api, f"verl-{kind}")) == 4 and by_step(api, f"verl-{kind}"))
    for step, data in steps.items():
        r, t = reports[step], {k[9:]: v for k, v in data.items() if k.startswith("timing_s/")}
        after_the_step_timer = ("testing", "dump_rollout_generations") if kind == "v1" else \
            ("testing", "start_profile", "stop_profile")  # verl times these outside timing_s/step
        assert r["step_time_s"] == pytest.approx(t["step"] + sum(t.get(k, 0.0) for k in after_the_step_timer))
        assert r["step_time_s"] > t["step"] + t.get("testing", 0.0) - 1e-9
        assert sum(r[c] or 0.0 for c in PHASE_COLUMNS) == pytest.approx(r["step_time_s"], rel=1e-6)
        assert r["validation_s"] == (pytest.approx(t["testing"]) if step in (2, 4) else None)
        assert r["checkpoint_s"] == (pytest.approx(t["save_checkpoint"]) if step in (3, 4) else None)
        gen = pytest.approx(t["gen"])
        assert (r["wait_s"], r["generation_s"]) == ((gen, None) if kind == "v1" else (None, gen))
        assert r["evaluation_s"] == pytest.approx(t["old_log_prob"] + t["ref"] + t["values"] + t.get("reward", 0))
        assert r["update_s"] == pytest.approx(t["update_actor"] + t["update_critic"] + t["adv"])
        expected = verl_step(step, data, trainer=kind)
        assert (r["samples"], r["tokens"]) == (expected.samples, expected.tokens) and r["samples"] == 8
        # the workers' perf/max_memory_*_gb, through verl's own metric reduction (0 on CPU, but reported, not None)
        assert r["allocated_bytes"] == expected.memory["allocated_bytes"] is not None
        assert r["reserved_bytes"] == expected.memory["reserved_bytes"] is not None
        # verl's own learning metrics (its data metrics from the scores; the workers' policy-loss metrics through
        # its reduction) as trimtab's learning signals, by learning_names.toml
        assert "critic/score/mean" in data
        for signal, name in (("reward", "critic/score/mean"), ("clip_fraction", "actor/pg_clipfrac"),
                             ("kl", "actor/ppo_kl"), ("entropy", "actor/entropy")):
            # (the stub workers' values as verl reduced them; one outside the signal's range, a negative clip
            # fraction, is left out by the contract's kind, never stored)
            value = clean(LEARNING[signal].kind, data.get(name))
            assert r[f"learning_{signal}"] == (None if value is None else pytest.approx(value)), signal
        assert r["learning_reward"] is not None  # verl computes it from the scores itself: always there
    job = api.get(f"/v1/jobs/verl-{kind}").json()
    assert job["knobs"] == {
        "actor_update_micro_batch": {"value": 2, "min": 1, "max": 4},
        "log_prob_micro_batch": {"value": 2, "min": 1, "max": 8},
        "ref_log_prob_micro_batch": {"value": 2, "min": 1, "max": 8},
        # verl 0.9.1's critic engine batches by tokens whatever critic.use_dynamic_bsz says: its token budgets
        # (verl's default 32768; floor max_prompt_length 16 + max_response_length 16), not its micro-batch size
        "critic_max_tokens": {"value": 32768, "min": 32, "max": 32768},
        "critic_values_max_tokens": {"value": 32768, "min": 32, "max": 32768},
    }


def test_a_queued_change_reaches_the_next_worker_calls_data_and_is_acknowledged_only_then(served, tmp_path):
    api, start = served
    start()
    job = "verl-change"
    queued = {}

    def operator():  # an admin's change, queued while the run is going
        eventually(lambda: len(reports_of(api, job)) >= 1, timeout_s=60)
        r = api.post(f"/v1/jobs/{job}/changes", {"knob": "log_prob_micro_batch", "value": 4}, scope="admin")
        queued["id"] = r.json()["change_id"]

    thread = threading.Thread(target=operator)
    thread.start()
    run = run_v1_fit(tmp_path, steps=8, step_s=0.15, overrides=attached(api, tmp_path, job))
    thread.join(10)
    log_prob = [(step, keys) for step, name, keys in run.calls if name == "compute_log_prob"]
    carried = [step for step, keys in log_prob if keys.get("micro_batch_size_per_gpu") == 4]
    assert carried, f"the change never reached compute_log_prob: {log_prob}"
    first = carried[0]
    assert all(keys.get("micro_batch_size_per_gpu") == 2 for step, keys in log_prob if step < first)  # engine's own
    assert all(keys["n_micro_batches"] == 2 for step, keys in log_prob if step >= first)  # 8 per GPU ÷ 4
    change = next(c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["change_id"] == queued["id"])
    assert change["status"] == "applied" and change["applied_step"] == first
    other_calls = [keys for step, name, keys in run.calls if name == "compute_ref_log_prob" and step >= first]
    assert other_calls and all(k.get("micro_batch_size_per_gpu") == 2 for k in other_calls)  # its own knob
    assert api.get(f"/v1/jobs/{job}").json()["knobs"]["log_prob_micro_batch"]["value"] == 4


DYNAMIC = ("actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
           "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96",
           "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=96", "critic.ppo_max_token_len_per_gpu=96")


@pytest.mark.parametrize("fit, kind", [(run_v1_fit, "v1"), (run_legacy_fit, "legacy")], ids=["v1", "legacy"])
def test_under_dynamic_batching_a_token_budget_change_reaches_the_next_calls_data_acknowledged_with_that_step(
        served, tmp_path, fit, kind):
    api, start = served
    start()
    job = f"verl-tokens-{kind}"
    queued = {}

    def operator():  # an admin's change, queued while the run is going (the rebalancer's go the same way)
        eventually(lambda: len(reports_of(api, job)) >= 1, timeout_s=60)
        r = api.post(f"/v1/jobs/{job}/changes", {"knob": "actor_update_max_tokens", "value": 32}, scope="admin")
        queued["id"] = r.json()["change_id"]
        too_small = api.post(f"/v1/jobs/{job}/changes", {"knob": "log_prob_max_tokens", "value": 31}, scope="admin")
        queued["too_small"] = too_small.status_code, too_small.text

    thread = threading.Thread(target=operator)
    thread.start()
    run = fit(tmp_path, steps=8, step_s=0.15, overrides=attached(api, tmp_path, job, *DYNAMIC))
    thread.join(10)
    knobs = api.get(f"/v1/jobs/{job}").json()["knobs"]
    # max_prompt_length 16 + max_response_length 16 = 32 tokens: the floor; no micro-batch knob is moot-declared
    # top: the per-GPU (mini-)batch at that length (mini 2 × n 2 = 4, batch 4 × n 2 = 8), or the start if larger;
    # V1 builds the critic's training budget from ppo_infer_max_token_len_per_gpu (verl's default 32768)
    assert {k: (v["min"], v["max"]) for k, v in knobs.items()} == {
        "actor_update_max_tokens": (32, 128), "log_prob_max_tokens": (32, 256), "ref_log_prob_max_tokens": (32, 256),
        "critic_max_tokens": (32, 32768 if kind == "v1" else 128), "critic_values_max_tokens": (32, 32768)}
    # a budget below the longest sequence the run allows never reaches the job: 422 with the bounds
    assert queued["too_small"][0] == 422 and "[32, 256]" in queued["too_small"][1]
    update = [(step, keys) for step, name, keys in run.calls if name == "update_actor"]
    carried = [step for step, keys in update if keys["received"].get("max_token_len_per_gpu") == 32]
    assert carried, f"the change never reached update_actor: {update}"
    first = carried[0]
    assert all(keys["use_dynamic_bsz"] is True for _, keys in update)  # the worker batched by tokens throughout
    before = [keys for step, keys in update if step < first]
    assert before and all("max_token_len_per_gpu" not in k["received"] and k["max_token_len_per_gpu"] == 96
                          for k in before)  # the worker's own engine budget
    after = [keys for step, keys in update if step >= first]
    assert all(k["max_token_len_per_gpu"] == 32 for k in after)  # every call from then on, as verl's worker read it
    assert min(k["n_micro_batches"] for k in after) > max(k["n_micro_batches"] for k in before)  # smaller packs
    change = next(c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["change_id"] == queued["id"])
    assert change["status"] == "applied" and change["applied_step"] == first
    log_prob = [keys for step, name, keys in run.calls if name == "compute_log_prob" and step >= first]
    assert log_prob and all(k["max_token_len_per_gpu"] == 96 for k in log_prob)  # its own knob, untouched
    assert knobs["actor_update_max_tokens"]["value"] == 32


def only(rule: str, controller: dict) -> dict:
    """Overrides that leave ``rule`` the only one able to fire."""
    quiet = {name: {"healthy_below": 1e12, "act_above": 1e12} for name in load_rules().names() if name != rule}
    return {"controller": controller, "rules": quiet}


def test_a_change_verl_cannot_apply_is_refused_stored_and_shown(served, tmp_path):
    api, start = served
    overrides = only("evaluation_bound", {"window_min_s": 0.05, "window_min_steps": 2, "window_max_steps": 4})
    overrides["rules"]["evaluation_bound"] = {
        "healthy_below": 0.0, "act_above": 0.0,  # scoring always "dominates" this tiny CPU run
        "actions": [{"knob": "log_prob_micro_batch", "op": "mul", "by": 3}]}  # 2 → 6: does not divide 8 per GPU
    start(load_rules(None, overrides))
    job = "verl-refused"
    run_legacy_fit(tmp_path, steps=8, step_s=0.1, overrides=attached(api, tmp_path, job, "+trimtab.mode=auto"))
    decisions = eventually(lambda: [d for d in api.get("/v1/decisions", job=job).json()["decisions"]
                                    if d["outcome"] == "refused"], timeout_s=20)
    d = decisions[-1]
    assert (d["rule"], d["knob"], d["old_value"], d["new_value"]) == ("evaluation_bound", "log_prob_micro_batch", 2, 6)
    assert "does not divide the per-GPU batch of 8" in d["evidence"]["refused_reason"]
    change = next(c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["change_id"] == d["change_id"])
    assert change["status"] == "refused" and change["acks"] == []
    assert api.get(f"/v1/jobs/{job}").json()["knobs"]["log_prob_micro_batch"]["value"] == 2
    refused = [x for x in api.get("/v1/decisions", job=job).json()["decisions"]
               if x["knob"] == "log_prob_micro_batch" and x["new_value"] == 6]
    assert len(refused) == 1  # not asked again
    res = CliRunner().invoke(cli, ["check", "--server", api.url, "--window", "600"])
    print(res.output)  # docs/verl.md shows this output
    assert f"job {job}  mode auto" in res.output
    assert "log_prob_micro_batch 2 → 6" in res.output and "refused" in res.output
    assert "does not divide the per-GPU batch of 8" in res.output


def test_the_rebalancer_moves_a_token_budget_and_the_next_infer_call_carries_it_acknowledged_with_that_step(
        served, tmp_path):
    api, start = served
    overrides = only("evaluation_bound", {"window_min_s": 0.05, "window_min_steps": 2, "window_max_steps": 4})
    overrides["rules"]["evaluation_bound"] = {
        "healthy_below": 0.0, "act_above": 0.0,  # scoring always "dominates" this tiny CPU run
        "actions": [{"knob": "log_prob_max_tokens", "op": "div", "by": 2}]}  # 96 → 48, above the floor of 32
    start(load_rules(None, overrides))
    job = "verl-rebalanced-tokens"
    run = run_legacy_fit(tmp_path, steps=8, step_s=0.1,
                         overrides=attached(api, tmp_path, job, "+trimtab.mode=auto", *DYNAMIC))
    changes = api.get(f"/v1/jobs/{job}/changes").json()["changes"]
    first = min((c for c in changes if c["source"] == "rebalancer" and c["status"] == "applied"),
                key=lambda c: c["change_id"], default=None)
    assert first is not None, changes
    assert (first["knob"], first["value"]) == ("log_prob_max_tokens", 48)
    log_prob = [(step, keys) for step, name, keys in run.calls if name == "compute_log_prob"]
    at = [keys for step, keys in log_prob if step == first["applied_step"]]
    assert at and all(k["max_token_len_per_gpu"] == 48 and k["received"]["max_token_len_per_gpu"] == 48 for k in at)
    assert all("max_token_len_per_gpu" not in k["received"] and k["max_token_len_per_gpu"] == 96
               for step, k in log_prob if step < first["applied_step"])  # the worker's own budget until then
    decision = next(d for d in api.get("/v1/decisions", job=job).json()["decisions"]
                    if d["change_id"] == first["change_id"])
    assert (decision["rule"], decision["knob"], decision["old_value"]) == \
        ("evaluation_bound", "log_prob_max_tokens", 96)




def test_roles_are_found_from_verls_workers_and_shown_by_get_job_and_check_without_a_device_map(served, tmp_path):
    import ray

    api, start = served
    start()
    tests_harness._ensure_ray()
    workers = verl_workers({"actor_pool": ["0", "1"], "critic_pool": ["2"]})
    try:
        def give_workers(trainer):  # what init_workers() would have built: RayWorkerGroup.workers
            trainer.actor_rollout_wg.workers = workers["actor_pool"]
            trainer.critic_wg.workers = workers["critic_pool"]

        run_legacy_fit(tmp_path, steps=3, before_fit=give_workers,
                       overrides=attached(api, tmp_path, "verl-roles", *DYNAMIC))
        pids = {pool: sorted(ray.get([w.__ray_call__.remote(lambda _: os.getpid()) for w in ws]))
                for pool, ws in workers.items()}
    finally:
        for ws in workers.values():
            for w in ws:
                ray.kill(w)
    host = socket.gethostname()
    job = api.get("/v1/jobs/verl-roles").json()
    # ActorRolloutRef: one fused group, so actor, rollout and the reference share its GPUs
    assert job["gpus_by_role"] == {"actor": {host: [0, 1]}, "rollout": {host: [0, 1]}, "ref": {host: [0, 1]},
                                   "critic": {host: [2]}}
    assert job["device_map"] == {"actor": [0, 1], "critic": [2], "ref": [0, 1], "rollout": [0, 1]}  # derived
    roles = {r["role"]: r for r in job["roles"]}
    assert roles["critic"] == {"role": "critic", "node": host, "gpus": [2], "pids": pids["critic_pool"],
                               "source": "found"}
    assert roles["actor"]["pids"] == pids["actor_pool"] and len(set(pids["actor_pool"])) == 2
    res = CliRunner().invoke(cli, ["check", "--server", api.url, "--window", "600"])
    print(res.output)  # docs/verl.md shows this output
    assert f"roles: actor+ref+rollout {host} GPUs 0,1 · critic {host} GPU 2" in res.output, res.output


def reporter_threads(job: str) -> list:
    return [t for t in threading.enumerate() if t.name == f"trimtab-reporter-{job}" and t.is_alive()]


def test_the_hook_is_closed_when_fit_ends_by_its_last_step_or_by_an_exception(served, tmp_path):
    api, start = served
    start()
    (tmp_path / "ok").mkdir()
    (tmp_path / "crash").mkdir()
    run_legacy_fit(tmp_path / "ok", steps=3, overrides=attached(api, tmp_path, "verl-ends"))
    # legacy fit returns from inside its loop on the last step (no on_train_end): the hook still flushed and closed
    assert sorted(by_step(api, "verl-ends")) == [1, 2, 3] and reporter_threads("verl-ends") == []

    def crash_at_step_2(trainer):
        group, real = trainer.actor_rollout_wg, trainer.actor_rollout_wg.update_actor

        def update_actor(data, *a, **kw):
            if trainer.global_steps == 2:
                raise RuntimeError("worker died")
            return real(data, *a, **kw)

        group.update_actor = update_actor
        crash_at_step_2.seen = (trainer, group)

    with pytest.raises(RuntimeError, match="worker died"):
        run_legacy_fit(tmp_path / "crash", steps=3, before_fit=crash_at_step_2,
                       overrides=attached(api, tmp_path, "verl-crash"))
    assert sorted(by_step(api, "verl-crash")) == [1] and reporter_threads("verl-crash") == []
    trainer, group = crash_at_step_2.seen
    assert trainer.actor_rollout_wg is group  # the knob proxies are gone with the session
