"""The verl CPU harness (tests/trainer/verl_harness.py) itself: verl 0.9.1's real fit loops run to completion.

What runs for real: verl's Hydra config (``ppo_trainer.yaml``) and ``validate_config``; ``RayPPOTrainer.fit`` (legacy,
``trainer.use_v1=False``) and ``PPOTrainerSync.fit`` (V1) with all their driver-side code (batch balancing,
padding <-> no-padding conversion, advantages, metrics, ``Tracking`` -> ``FileLogger`` JSONL); a real HF tokenizer
from a tiny local model dir; the datasets through verl's ``data.custom_cls`` hook and ``StatefulDataLoader``; for V1
a real TransferQueue (``tq.init()`` on a local Ray, once per process), the real ``ReplayBuffer.sample`` and verl's
``tqbridge`` on the worker side; on the worker side verl's ``tu.make_iterator`` and ``prepare_micro_batches``.

What is stubbed, because it needs a GPU or GPU processes: the worker groups' model compute (``compute_log_prob``,
``compute_ref_log_prob``, ``update_actor``, critic ``infer_batch`` / ``train_mini_batch``: the stub applies
``TrainingWorker``'s default-injection rule to the data, counts micro-batches with ``prepare_micro_batches`` and
returns outputs shaped like the real worker's), the rollout (vLLM/SGLang servers + agent loop), weight sync
(``checkpoint_manager``), rollout profiling (``llm_server_manager``), the reward loop (rewards come with the
rollout, as with a rule-based reward), ``_validate`` and ``_save_checkpoint`` (short sleeps).
"""

import pytest

from tests.support.frameworks import require

require("verl")
require("transfer_queue")

from tests.trainer import verl_harness as h  # noqa: E402
from tests.trainer import verl_worker_stubs as stubs  # noqa: E402
from tests.trainer.verl_legacy_harness import run_legacy_fit  # noqa: E402
from tests.trainer.verl_v1_sync_harness import run_v1_fit  # noqa: E402

STEPS = 3
COMMON_TIMERS = ("step", "gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
                 "update_weights")
EXPECTED_CALLS = ["compute_log_prob", "compute_ref_log_prob", "infer_batch", "train_mini_batch", "update_actor"]
# 4 prompts x n=2 = 8 trajectories; ppo_mini_batch_size 2 x n = 4 per mini-batch; all micro batch sizes 2
EXPECTED_MICRO = {"compute_log_prob": 4, "compute_ref_log_prob": 4, "update_actor": 4}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    old = stubs.VALIDATE_SLEEP_S
    stubs.VALIDATE_SLEEP_S = 0.2  # make "testing" dwarf any unmeasured overhead inside "step"
    try:
        legacy = run_legacy_fit(tmp_path_factory.mktemp("legacy"), steps=STEPS, test_freq=2, save_freq=2, step_s=0.05)
        v1 = run_v1_fit(tmp_path_factory.mktemp("v1"), steps=STEPS, test_freq=2, save_freq=2, step_s=0.05)
    finally:
        stubs.VALIDATE_SLEEP_S = old
    print("harness wall_s: legacy", round(legacy.wall_s, 2), "v1", round(v1.wall_s, 2), "one-off",
          h.session_costs())
    return {"legacy": legacy, "v1": v1}


@pytest.mark.parametrize("kind", ["legacy", "v1"])
def test_the_fit_runs_every_step_and_logs_verl_timers(fits, kind):
    run = fits[kind]
    assert run.trainer.global_steps == STEPS + 1  # fit() increments past the last step
    assert [r["step"] for r in run.records] == list(range(1, STEPS + 1))
    assert run.jsonl.read_text().count("\n") == STEPS
    for rec in run.records:
        d = rec["data"]
        for name in COMMON_TIMERS:
            assert d[f"timing_s/{name}"] > 0, (kind, rec["step"], name)
        for key in ("perf/total_num_tokens", "response_length/mean", "prompt_length/mean",
                    "actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb",
                    "critic/perf/max_memory_allocated_gb"):
            assert key in d, (kind, key)
        assert d["timing_s/gen"] >= 0.05  # step_s sleeps inside the rollout / replay-buffer wait
        test_step = rec["step"] % 2 == 0 or rec["step"] == STEPS
        assert ("timing_s/testing" in d) == test_step
        assert ("timing_s/save_checkpoint" in d) == test_step


@pytest.mark.parametrize("kind", ["legacy", "v1"])
def test_testing_is_timed_outside_the_step(fits, kind):
    for rec in fits[kind].records:
        d = rec["data"]
        if "timing_s/testing" not in d:
            continue
        inner = sum(d.get(f"timing_s/{k}", 0.0) for k in (*COMMON_TIMERS[1:], "save_checkpoint", "reward"))
        assert d["timing_s/testing"] >= 0.2
        assert inner <= d["timing_s/step"] < inner + d["timing_s/testing"]  # step holds its phases, not testing


@pytest.mark.parametrize("kind", ["legacy", "v1"])
def test_worker_calls_carry_the_injected_config_micro_batch_sizes(fits, kind):
    run = fits[kind]
    for step in range(1, STEPS + 1):
        assert [name for s, name, _ in run.calls if s == step] == EXPECTED_CALLS
    for _, name, keys in run.calls:
        if name in EXPECTED_MICRO:
            assert keys["micro_batch_size_per_gpu"] == 2 and keys["use_dynamic_bsz"] is False
            assert "micro_batch_size_per_gpu" in keys["injected"]  # the caller did not send it: engine default
            assert keys["n_micro_batches"] == EXPECTED_MICRO[name], (name, keys)
        else:  # the critic's engine config keeps the engine default use_dynamic_bsz=True (see verl_engine_configs)
            assert keys["use_dynamic_bsz"] is True and keys["micro_batch_size_per_gpu"] is None
            assert keys["max_token_len_per_gpu"] == 32768
        if name in ("update_actor", "train_mini_batch"):
            assert keys["mini_batch_size"] == 4 and keys["n_mini_batches"] == 2


def _inject_micro_one(trainer):
    """What a knob applier does: put micro_batch_size_per_gpu into the data of update_actor calls."""
    from transfer_queue import KVBatchMeta

    from verl.utils import tensordict_utils as tu

    wg = trainer.actor_rollout_wg
    inner = wg.update_actor

    def update_actor(data, *args, **kwargs):
        if isinstance(data, KVBatchMeta):
            data.extra_info["micro_batch_size_per_gpu"] = 1
        else:
            tu.assign_non_tensor(data, micro_batch_size_per_gpu=1)
        return inner(data, *args, **kwargs)

    wg.update_actor = update_actor


@pytest.mark.parametrize("kind", ["legacy", "v1"])
def test_a_per_call_micro_batch_size_wins_over_the_engine_config(tmp_path, kind):
    fit = run_legacy_fit if kind == "legacy" else run_v1_fit
    run = fit(tmp_path, steps=2, before_fit=_inject_micro_one)
    assert len(run.records) == 2
    for _, name, keys in run.calls:
        if name == "update_actor":
            assert keys["micro_batch_size_per_gpu"] == 1 and "micro_batch_size_per_gpu" not in keys["injected"]
            assert keys["n_micro_batches"] == 8  # 2 mini-batches x (4 / 1)
        elif name in EXPECTED_MICRO:
            assert keys["micro_batch_size_per_gpu"] == 2 and keys["n_micro_batches"] == EXPECTED_MICRO[name]


def test_v1_extra_info_set_for_one_call_reaches_the_next_call_on_the_same_meta(tmp_path):
    """verl behaviour the knob code must respect: V1 passes one KVBatchMeta through several worker calls and only
    tq.kv_batch_put returns a fresh one, so a key put into extra_info for compute_ref_log_prob is still there for
    the critic's infer_batch, and one put for train_mini_batch is still there for update_actor."""
    def before_fit(trainer):
        wg = trainer.actor_rollout_wg
        inner = wg.compute_ref_log_prob

        def compute_ref_log_prob(meta, *a, **k):
            meta.extra_info["micro_batch_size_per_gpu"] = 1
            return inner(meta, *a, **k)

        wg.compute_ref_log_prob = compute_ref_log_prob

    run = run_v1_fit(tmp_path, steps=1, before_fit=before_fit)
    by_name = {name: keys for _, name, keys in run.calls}
    assert by_name["compute_log_prob"]["micro_batch_size_per_gpu"] == 2
    assert by_name["compute_ref_log_prob"]["micro_batch_size_per_gpu"] == 1
    assert by_name["infer_batch"]["received"].get("micro_batch_size_per_gpu") == 1  # leaked to the critic
    assert by_name["infer_batch"]["n_micro_batches"] == 1  # ...but the critic engine runs dynamic bsz anyway
    assert "micro_batch_size_per_gpu" not in by_name["update_actor"]["received"]  # kv_batch_put (adv) reset it
