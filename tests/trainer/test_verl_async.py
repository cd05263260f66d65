"""trimtab attached to verl 0.9.1's fully-async trainer and rollouter the way the README says (installed, plus the
``+trimtab.server`` override), while verl's own ``async def fit`` loops run on CPU against a live API with the
rebalancer in the loop. ``tests/trainer/verl_async_harness.py`` says what is stubbed: generation (the rollout
replicas), the actor's update on its GPU workers and the NCCL weight sync; trainer and rollouter share this process's
event loop instead of being two Ray actors (the Ray transport between them is an in-process stand-in).

Shown: each side reports each parameter version as its own rank/component (trainer = actor, rollouter = rollout)
with phases that add up; a ``prefetch`` (staleness_threshold) and a ``sync_every`` (trigger_parameter_sync_step)
change reach the process that owns the attribute, take effect where verl reads them (visible in verl's own metrics
of the following steps) and are acknowledged only then; a pair verl's MessageQueue cannot hold is refused with the
reason; a rollouter that never reached its staleness bound (it reports how far it got ahead) is not given a higher
one; with verl's dynamic scheduling on, trimtab declares nothing, says why in ``trimtab check`` and reports."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.frameworks import require

require("verl")

from click.testing import CliRunner  # noqa: E402

from tests.support.hook_api import reports_of  # noqa: E402
from tests.support.waits import eventually  # noqa: E402
from tests.support.verl_runs import PHASE_COLUMNS, attached, verl_workers  # noqa: E402
from tests.trainer.verl_async_harness import run_fully_async, steps_of  # noqa: E402
from trimtab.cli.main import cli  # noqa: E402
from trimtab.trainer.adapters.verl_async import DYNAMIC_REASON  # noqa: E402

pytestmark = pytest.mark.usefixtures("verl_ray")
OUTSIDE_STEP = ("start_profile", "stop_profile", "save_checkpoint")  # fully-async times these after timing_s/step


def by_rank(api, job: str, rank: int) -> dict[int, dict]:
    return {r["step"]: r for r in reports_of(api, job) if r["rank"] == rank}


def test_a_fully_async_run_reports_trainer_and_rollouter_each_version_with_phases_adding_up(served, tmp_path):
    """Roles too, found without ``--device-map``: the trainer's actor worker group and the rollouter's replica are
    verl's own ``Worker`` as Ray actors (``verl_workers``: the GPU stubbed, ``CUDA_VISIBLE_DEVICES`` set as Ray
    sets it); the replica holding them is a stand-in (a vLLM/SGLang server needs a GPU) with ``workers`` as verl's
    ``RolloutReplica`` has them, in the rollouter's ``llm_server_manager.rollout_replicas``."""
    import os
    import socket
    from types import SimpleNamespace

    import ray

    api, start = served
    start()
    job = "verl-fully-async"
    workers = verl_workers({"trainer_pool": ["0"], "rollout_pool": ["1"]})

    verl_paused: list[bool] = []  # verl's own word, per parameter version: did its rollouter pause on its bound?

    def give_workers(trainer, rollouter):  # what both init_workers() would have built
        trainer.actor_wg = trainer.actor_rollout_wg = SimpleNamespace(workers=workers["trainer_pool"])
        rollouter.llm_server_manager.rollout_replicas = [SimpleNamespace(workers=workers["rollout_pool"])]
        reset = rollouter.reset_staleness  # trimtab's wrap of verl's; its `paused` is cleared inside

        async def reset_staleness():
            verl_paused.append(bool(rollouter.paused))
            return await reset()
        rollouter.reset_staleness = reset_staleness  # the trainer calls it through the rollouter's handle

    try:
        run = run_fully_async(tmp_path, job=job, samples=16, staleness=1, trigger=2, before_fit=give_workers,
                              overrides=attached(api, tmp_path, job))
        pids = {pool: sorted(ray.get([w.__ray_call__.remote(lambda _: os.getpid()) for w in ws]))
                for pool, ws in workers.items()}
    finally:
        for ws in workers.values():
            for w in ws:
                ray.kill(w)
    steps = steps_of(run)
    assert len(steps) >= 3, steps
    registered = api.get(f"/v1/jobs/{job}").json()
    assert registered["ranks"] == 2
    host = socket.gethostname()
    # hybrid_engine=False: the actor's group holds no rollout; the rollouter's replica does (the trainer asked it)
    assert registered["gpus_by_role"] == {"actor": {host: [0]}, "rollout": {host: [1]}}
    assert registered["device_map"] == {"actor": [0], "rollout": [1]}  # derived from the roles
    assert {r["role"]: r["pids"] for r in registered["roles"]} == {"actor": pids["trainer_pool"],
                                                                    "rollout": pids["rollout_pool"]}
    # queue = 2 samples/step × (1 + 1) × 2 = 8: each knob alone may go as far as the queue holds with the other at 1/0
    assert registered["knobs"] == {"prefetch": {"value": 1, "min": 0, "max": 3},
                                   "sync_every": {"value": 2, "min": 1, "max": 4}}
    trainer = eventually(lambda: len(by_rank(api, job, 0)) == len(steps) and by_rank(api, job, 0), timeout_s=20)
    for step, data in steps.items():
        r, t = trainer[step], {k[len("timing_s/"):]: v for k, v in data.items() if k.startswith("timing_s/")}
        assert r["step_time_s"] == pytest.approx(t["step"] + sum(t.get(k, 0.0) for k in OUTSIDE_STEP))
        assert sum(r[c] or 0.0 for c in PHASE_COLUMNS) == pytest.approx(r["step_time_s"], rel=1e-6)
        assert r["wait_s"] == pytest.approx(t["gen"])  # waiting on the MessageQueue for the rollouter's samples
        assert r["update_s"] == pytest.approx(t["update_actor"] + t["adv"])
        assert r["evaluation_s"] == pytest.approx(t["reward"])
        assert r["communication_s"] == (pytest.approx(t["timing_s/param_sync"]) if "timing_s/param_sync" in t
                                        else None)
    assert any(r["communication_s"] for r in trainer.values())  # verl's timing_s/param_sync, as communication
    rollout = eventually(lambda: len(by_rank(api, job, 1)) >= len(steps) - 1 and by_rank(api, job, 1), timeout_s=20)
    for r in rollout.values():  # the rollouter's window per version: generating, or paused on its staleness bound
        assert r["step_time_s"] > 0
        assert (r["generation_s"] or 0) + (r["wait_s"] or 0) == pytest.approx(r["step_time_s"], rel=1e-6)
    # 8 prompts at once against a bound of 8: in the first version verl pauses the rollouter on its bound, and the
    # mark says so. Not later ones: near the data's end verl's pause and its count part ways (1 run in 8 here).
    assert verl_paused[0] and rollout[1]["queue_high_water"] >= 1, (rollout, verl_paused)
    assert sum(r["samples"] or 0 for r in rollout.values()) <= run.rollouter.total_generated_samples
    res = CliRunner().invoke(cli, ["check", "--server", api.url, "--window", "600"])
    print(res.output)  # the README's async subsection shows this output
    assert f"job {job}" in res.output and "prefetch" in res.output and "sync_every" in res.output
    assert f"roles: actor {host} GPU 0 · rollout {host} GPU 1" in res.output, res.output


def _queue(api, job: str, knob: str, value) -> int:
    r = api.post(f"/v1/jobs/{job}/changes", {"knob": knob, "value": value}, scope="admin")
    assert r.status_code in (200, 201), r.text
    return r.json()["change_id"]


def _change(api, job: str, cid: int) -> dict:
    return next(c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["change_id"] == cid)


def _settled(api, job: str, cid: int):
    c = _change(api, job, cid)
    return c if c["status"] in ("applied", "refused") else None


def test_prefetch_and_sync_every_reach_their_owner_take_effect_where_verl_reads_them_and_an_unsafe_pair_is_refused(
        served, tmp_path):
    api, start = served
    start()
    job = "verl-async-knobs"
    ids: dict[str, int] = {}
    seen: dict[str, object] = {}

    async def operator(trainer, rollouter):
        def script():
            try:
                changes()
            finally:  # the data ends here: verl's feed loop stops at its next sample, the run drains and ends
                rollouter.total_rollout_steps = rollouter.global_steps

        def changes():
            eventually(lambda: len(by_rank(api, job, 0)) >= 1, timeout_s=60)
            ids["prefetch"] = _queue(api, job, "prefetch", 0)  # owned by the rollouter
            eventually(lambda: _settled(api, job, ids["prefetch"]), timeout_s=30)
            seen["max_required_after_prefetch"] = rollouter.max_required_samples
            ids["sync_every"] = _queue(api, job, "sync_every", 3)  # owned by the trainer
            eventually(lambda: _settled(api, job, ids["sync_every"]), timeout_s=30)
            # 2 × (3 + 1) × 3 = 24 samples ahead: verl's MessageQueue (maxlen 8, fixed at start-up) would drop some
            ids["unsafe"] = _queue(api, job, "prefetch", 3)
            eventually(lambda: _settled(api, job, ids["unsafe"]), timeout_s=30)
            seen["staleness_after_refusal"] = rollouter.staleness_threshold
            # back to 2 with prefetch 0: the rollouter may lower its bound only once the trainer's cycles are shorter
            ids["shorter"] = _queue(api, job, "sync_every", 2)
            eventually(lambda: _settled(api, job, ids["shorter"]), timeout_s=30)
            eventually(lambda: rollouter.max_required_samples == 4, timeout_s=30)

        await asyncio.to_thread(script)

    run = run_fully_async(tmp_path, job=job, samples=4000, staleness=1, trigger=2, gen_s=0.03, during=operator,
                          overrides=attached(api, tmp_path, job))
    steps = steps_of(run)
    prefetch, sync_every, unsafe, shorter = (_change(api, job, ids[k])
                                             for k in ("prefetch", "sync_every", "unsafe", "shorter"))

    # prefetch 1 → 0: applied by the rollouter through verl's set_max_required_samples (2 × (0+1) × 2 = 4) ...
    assert prefetch["status"] == "applied", prefetch
    assert seen["max_required_after_prefetch"] == 4
    p_step = prefetch["applied_step"]
    staleness = {s: d["fully_async/static/staleness_threshold"] for s, d in steps.items()}
    # ... acknowledged for the version after the sync where it landed: samples of earlier versions say 1 ...
    assert all(v == 1 for s, v in staleness.items() if s < p_step), staleness
    assert staleness[max(steps)] == 0  # ... and verl's own rollout statistics of later steps say 0
    # sync_every 2 → 3: the trainer's cycles grow from the version it was acknowledged for (verl's
    # training/global_step advances by one per micro-step, so its step between two logged versions is the cycle)
    assert sync_every["status"] == "applied", sync_every
    s_step = sync_every["applied_step"]
    global_step = {s: d["training/global_step"] for s, d in sorted(steps.items())}
    cycles = {s: global_step[s] - global_step[s - 1] for s in global_step if s - 1 in global_step}
    assert all(n == 2 for s, n in cycles.items() if s < s_step), cycles
    assert shorter["status"] == "applied", shorter
    back = shorter["applied_step"]
    longer = [n for s, n in cycles.items() if s_step <= s < back]
    assert longer and all(n == 3 for n in longer), cycles
    # the last cycle may be cut by the data's end
    assert all(n == 2 for s, n in cycles.items() if back <= s < max(steps)), cycles
    assert run.trainer.trigger_parameter_sync_step == 2
    # the rollouter re-derived its bound from the cycle length too: 2 × (0 + 1) × 3, then back to 2 × 1 × 2
    assert max(d["fully_async/static/max_required_samples"] for s, d in steps.items() if s_step < s < back) == 6
    assert run.rollouter.max_required_samples == 4
    # prefetch 0 → 3 with sync_every 3 would need 24 queued samples: refused, with verl's reason, nothing moved
    assert unsafe["status"] == "refused" and unsafe["acks"] == []
    assert "MessageQueue holds 8" in unsafe["refused_reason"] and "drop the oldest samples" in unsafe["refused_reason"]
    assert seen["staleness_after_refusal"] == 0 and run.rollouter.staleness_threshold == 0
    assert 3 not in staleness.values()
    knobs = api.get(f"/v1/jobs/{job}").json()["knobs"]
    assert (knobs["prefetch"]["value"], knobs["sync_every"]["value"]) == (0, 2)


@pytest.mark.parametrize("why", ["actor died", "not attached"])
def test_a_sync_every_the_rollouter_cannot_be_told_is_refused_with_why_and_verl_keeps_its_cycle(why):
    """Error path, with fakes: the trainer's session as built by ``fit`` (its verl trainer, rollouter handle and
    channel are stand-ins) when the Ray call that tells the rollouter fails: a dead actor, or a rollouter trimtab is
    not attached to (``_follow_sync`` run on it, as Ray's ``__ray_call__`` would, its error in the call's future)."""
    import concurrent.futures
    from types import SimpleNamespace

    from trimtab.trainer.adapters.verl_async import TrainerSession
    from trimtab.trainer.adapters.verl_staleness import AsyncLimits

    def settled(call):  # a Ray call's future: its result, or its error
        f = concurrent.futures.Future()
        try:
            f.set_result(call())
        except Exception as exc:
            f.set_exception(exc)
        return SimpleNamespace(future=lambda: f)

    class Actor:
        def remote(self, fn, value):
            if why == "actor died":
                raise RuntimeError("The actor died unexpectedly before finishing this task.")
            return settled(lambda: fn(SimpleNamespace(), value))  # a rollouter without trimtab's session

    refused = []
    stats = {"static/staleness_threshold": 1, "static/max_required_samples": 8}
    rollouter = SimpleNamespace(get_statistics=SimpleNamespace(remote=lambda: settled(lambda: stats)),
                                __ray_call__=Actor())
    session = object.__new__(TrainerSession)
    session.trainer = SimpleNamespace(local_trigger_step=1, trigger_parameter_sync_step=2, rollouter=rollouter)
    session.limits = AsyncLimits(required_samples=2, queue_samples=8)
    reporter = SimpleNamespace(refuse=lambda cid, rank, reason: refused.append((cid, reason)))
    session.channel = SimpleNamespace(take=lambda knob: (5, 1), reporter=reporter)
    assert asyncio.run(session.before_step()) is None
    assert refused and refused[0][0] == 5 and "could not tell verl's rollouter" in refused[0][1], refused
    assert why in refused[0][1] and session.trainer.trigger_parameter_sync_step == 2


def test_a_rollouter_that_never_reached_its_staleness_bound_is_not_given_a_higher_one(served, tmp_path):
    """The rollouter reports how far it got ahead in each parameter version (``queue_high_water``, read from verl's own
    ``staleness_samples`` just before ``reset_staleness()`` resets it: ``versions_ahead``). Here it generates one
    prompt at a time (verl's ``concurrent_samples_per_replica=1``), slower than the trainer takes them: it never
    reaches its bound of 2 × (1 + 1) × 2 = 8 samples, so a higher staleness_threshold would change nothing, while the
    trainer waits on it every cycle (what the rules answer with a higher prefetch). In auto mode the rebalancer
    skips that raise naming the queue, and nothing reaches verl; the same stored steps planned with
    ``queue_raise_needs_fill = false`` raise it (what the check prevents). The rules' window is 1 s here (4 s as
    shipped) to keep the run short. Stubbed as in the harness: generation (a sleep per prompt), the actor update,
    the NCCL weight sync."""
    from trimtab.control.controller import plan
    from trimtab.grading.rules import load_rules
    from trimtab.store.jobs import get_job

    api, start = served
    rules = load_rules().with_overrides({"controller": {"window_min_s": 1.0}})
    rebalancer = start(rules)
    job = "verl-rollout-bound"
    seen: dict[str, object] = {}

    async def watch(trainer, rollouter):
        def until_planned():
            try:
                seen["decisions"] = eventually(lambda: [
                    d for d in api.get("/v1/decisions", job=job).json().get("decisions", [])
                    if d["rule"] in ("generation_bound", "rollout_wait_bound")], timeout_s=60)
                off = rules.with_overrides({"controller": {"queue_raise_needs_fill": False}})
                seen["without_the_check"] = plan(rebalancer.load_state(get_job(api.ctx.engine, job), off), off)
            finally:  # the data ends here: verl's feed loop stops at its next sample, the run drains and ends
                rollouter.total_rollout_steps = rollouter.global_steps

        await asyncio.to_thread(until_planned)

    run = run_fully_async(tmp_path, job=job, samples=4000, staleness=1, trigger=2, gen_s=0.05, during=watch,
                          overrides=[*attached(api, tmp_path, job, "+trimtab.mode=auto"),
                                     "async_training.concurrent_samples_per_replica=1"])
    rollout = eventually(lambda: len(by_rank(api, job, 1)) >= 3 and by_rank(api, job, 1), timeout_s=20)
    # never paused on its bound (no wait in any window) and never a whole version ahead: the mark is 0 throughout
    assert all(r["wait_s"] == 0 for r in rollout.values()), rollout
    assert {r["queue_high_water"] for r in rollout.values()} == {0}, rollout
    trainer = by_rank(api, job, 0)
    # the trainer waits on rollout: about half of each cycle (~0.13 s of ~0.25 s), its update 0.06 s
    assert sum(r["wait_s"] for r in trainer.values()) > 0.4 * sum(r["step_time_s"] for r in trainer.values())
    first = seen["decisions"][0]
    skipped = first["evidence"]["skipped"]
    print(first["rule"], skipped)
    assert first["change_id"] is None and first["outcome"] == "advised", first
    assert any("prefetch +2: the queue never held more than 0 of the 1" in s for s in skipped), first
    assert [c for c in api.get(f"/v1/jobs/{job}/changes").json()["changes"] if c["knob"] == "prefetch"] == []
    assert run.rollouter.staleness_threshold == 1
    raised = seen["without_the_check"].change
    assert raised is not None and (raised.knob, raised.old_value) == ("prefetch", 1) and raised.new_value > 1, raised


def test_with_verls_dynamic_scheduling_on_trimtab_reports_declares_nothing_and_says_why_in_check(served, tmp_path):
    """Stubbed beyond the harness: the trainer's ``fit_step`` (dynamic scheduling needs hybrid rollout replicas on the
    trainer's GPUs); verl's real ``fit`` runs around it and logs one sync cycle through verl's ``Tracking``."""
    from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer, TrainingStopException
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.utils import hf_tokenizer

    from tests.trainer import verl_harness
    from tests.trainer.verl_async_harness import build_async_config

    api, start = served
    start()
    job = "verl-dynamic"
    config = build_async_config(tmp_path, job=job, samples=8, staleness=1, trigger=2,
                                overrides=[*attached(api, tmp_path, job),
                                           "async_training.use_dynamic_resource_scheduling=True"])
    jsonl = verl_harness._with_logger_path(tmp_path, job)
    with verl_harness._file_logger_at(jsonl):
        trainer = FullyAsyncTrainer.__ray_actor_class__(
            config, hf_tokenizer(config.actor_rollout_ref.model.path), role_worker_mapping={},
            resource_pool_manager=ResourcePoolManager({"trainer_pool": [1]}, mapping={}), device_name="cpu")
        trainer.message_queue_client, trainer.rollouter = object(), object()
        trainer.set_total_train_steps(1)
        calls = []

        async def fit_step():  # one cycle as verl's dynamic branch logs it, then the queue's end
            calls.append(1)
            if len(calls) > 1:
                raise TrainingStopException()
            trainer.current_param_version = 1
            trainer.logger.log(data={"timing_s/step": 0.5, "timing_s/wait_for_enough_samples": 0.2,
                                     "timing_s/gen": 0.1, "timing_s/update_actor": 0.15}, step=1)

        trainer.fit_step = fit_step
        asyncio.run(trainer.fit())
    registered = eventually(lambda: api.get(f"/v1/jobs/{job}").json() if reports_of(api, job) else None)
    assert registered["knobs"] == {} and registered["advise_only_reason"] == DYNAMIC_REASON
    report = reports_of(api, job)[0]
    assert report["wait_s"] == pytest.approx(0.3) and report["step_time_s"] == pytest.approx(0.5)
    # what verl's controller governs is not trimtab's to move: the API has no such knob to queue, verl's values stay
    assert api.post(f"/v1/jobs/{job}/changes", {"knob": "prefetch", "value": 0}, scope="admin").status_code >= 400
    assert (trainer.staleness_threshold, trainer.trigger_parameter_sync_step) == (1, 2)
    res = CliRunner().invoke(cli, ["check", "--server", api.url, "--window", "600"])
    print(res.output)
    assert f"job {job}" in res.output and "DynamicResourceController" in res.output


def test_a_one_step_off_run_is_attached_and_every_step_reported_with_phases_adding_up(served, tmp_path):
    """verl's OneStepOffRayTrainer and its real ``async def fit``; stubbed: batch generation, the actor update, the
    weight sync (``verl_async_harness.run_one_step_off``). Roles: verl's own ``Worker`` as the actor group's and the
    rollout replica's Ray actors (``verl_workers``); the replica and its server manager are stand-ins holding them
    as verl's ``LLMServerManager.rollout_replicas`` / ``RolloutReplica.workers`` do."""
    import socket
    from types import SimpleNamespace

    import ray

    from tests.trainer.verl_async_harness import run_one_step_off

    api, start = served
    start()
    job = "verl-one-step-off"
    workers = verl_workers({"actor_pool": ["0"], "rollout_pool": ["1"]})

    def give_workers(trainer):  # what init_workers() would have built
        trainer.actor_rollout_wg.workers = workers["actor_pool"]
        replica = SimpleNamespace(workers=workers["rollout_pool"])
        trainer.llm_server_manager = SimpleNamespace(rollout_replicas=[replica])

    try:
        run = run_one_step_off(tmp_path, job=job, steps=4, overrides=attached(api, tmp_path, job),
                               before_fit=give_workers)
    finally:
        for ws in workers.values():
            for w in ws:
                ray.kill(w)
    host = socket.gethostname()
    # hybrid_engine=False: the actor's group holds no rollout engine; its rollout replicas do
    assert api.get(f"/v1/jobs/{job}").json()["gpus_by_role"] == {"actor": {host: [0]}, "rollout": {host: [1]}}
    steps = steps_of(run)
    assert sorted(steps) == [1, 2, 3, 4]
    reports = eventually(lambda: len(by_rank(api, job, 0)) == 4 and by_rank(api, job, 0), timeout_s=20)
    for step, data in steps.items():
        r, t = reports[step], {k[len("timing_s/"):]: v for k, v in data.items() if k.startswith("timing_s/")}
        assert r["step_time_s"] == pytest.approx(t["step"] + t["start_profile"] + t["stop_profile"])
        assert sum(r[c] or 0.0 for c in PHASE_COLUMNS) == pytest.approx(r["step_time_s"], rel=1e-6)
        assert r["wait_s"] == pytest.approx(t["gen"])  # the batch generated one step ahead, awaited
        # the weight sync once (update_weights runs inside sync_rollout_weights); the next batch's generation
        # (generate_async) ran beside the step and is in no phase
        assert r["communication_s"] == pytest.approx(t["sync_rollout_weights"])
        assert r["update_s"] == pytest.approx(t["update_actor"] + t["adv"])
    assert run.trainer.checkpoint_manager.versions  # verl's own weight syncs ran (stubbed transport)
    assert api.get(f"/v1/jobs/{job}").json()["knobs"] == {}  # reported only: generation is fixed one step ahead
