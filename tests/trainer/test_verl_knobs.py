"""The verl knobs against verl's own pieces: the config verl's Hydra files compose, the data types its worker calls
carry (a TensorDict with ``tu.assign_non_tensor`` keys in the legacy trainer, a TransferQueue ``KVBatchMeta`` in V1)
and its worker-side ``prepare_micro_batches``; and the plugin that verl loads through its ``verl.plugins`` entry
point. Nothing is stubbed here but the worker group (a recorder: the real one starts GPU workers)."""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

import pytest

from tests.support.frameworks import require

verl = require("verl")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402

from trimtab.trainer.adapters import verl_plugin  # noqa: E402
from trimtab.trainer.adapters.verl_knobs import (CALL_KNOBS, VerlKnobApplier, declared_knobs,  # noqa: E402
                                                  wrap_worker_groups)
from trimtab.trainer.apply import KnobChange  # noqa: E402

CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
SMALL = ["data.train_batch_size=6", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
         "critic.ppo_mini_batch_size=3", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=2"]


def verl_config(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[*SMALL, *overrides])


def call(name: str):
    return next(c for c in CALL_KNOBS if c.method == name)


def worker_micro_batches(data: TensorDict, engine_micro: int) -> int:
    """What verl's TrainingWorker does with a call's data: its engine config's micro-batch size only where the data
    carries none (engine_workers.py, train_batch/infer_batch), then verl's own prepare_micro_batches."""
    if "micro_batch_size_per_gpu" not in data.keys():
        tu.assign_non_tensor(data, micro_batch_size_per_gpu=engine_micro)
    if "use_dynamic_bsz" not in data.keys():
        tu.assign_non_tensor(data, use_dynamic_bsz=False)
    micro, _ = prepare_micro_batches(data)
    return len(micro)


def test_knobs_come_from_the_runs_config_with_its_per_gpu_batches_as_bounds():
    knobs = declared_knobs(verl_config(), use_critic=True, use_reference=True)
    assert {k: spec for k, (_, spec, _) in knobs.items()} == {
        "actor_update_micro_batch": (2, 1, 6),    # ppo_mini_batch_size 3 × n 2 / 1 GPU
        "log_prob_micro_batch": (4, 1, 12),       # train_batch_size 6 × n 2 / 1 GPU
        "ref_log_prob_micro_batch": (4, 1, 12),
        # the critic's engine batches by tokens whatever critic.use_dynamic_bsz says: its budgets, not its micro-batch
        # (floor: max_prompt_length 512 + max_response_length 512; 32768 is verl's own default for both)
        "critic_max_tokens": (32768, 1024, 32768),
        "critic_values_max_tokens": (32768, 1024, 32768),
    }
    assert set(declared_knobs(verl_config(), use_critic=False, use_reference=False)) == {
        "actor_update_micro_batch", "log_prob_micro_batch"}
    assert "ref_log_prob_micro_batch" not in declared_knobs(verl_config(), ref_in_actor=True)  # LoRA: ref is actor


DYNAMIC = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
           "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true", "data.max_prompt_length=16",
           "data.max_response_length=16", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64",
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=96",
           "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=128", "critic.ppo_max_token_len_per_gpu=80")


def test_dynamic_batching_declares_token_budgets_instead_of_micro_batches_bounded_by_the_longest_sequence():
    knobs = declared_knobs(verl_config(*DYNAMIC), use_critic=True)
    assert {k: spec for k, (_, spec, _) in knobs.items()} == {
        # floor 16 + 16 = 32 tokens; top: the whole per-GPU (mini-)batch at that length, or the start if larger
        "actor_update_max_tokens": (64, 32, 6 * 32),        # ppo_mini_batch_size 3 × n 2 per GPU
        "log_prob_max_tokens": (96, 32, 12 * 32),           # train_batch_size 6 × n 2 per GPU
        "ref_log_prob_max_tokens": (128, 32, 12 * 32),
        "critic_max_tokens": (80, 32, 6 * 32),
        "critic_values_max_tokens": (32768, 32, 32768),     # CriticConfig's default: verl's yaml does not set it
    }
    assert all(name.endswith("_max_tokens") for name in knobs)  # the memory model reads these as tokens
    # V1's trainer builds the critic's training budget from its infer one (trainer_base.py, _setup)
    assert declared_knobs(verl_config(*DYNAMIC), v1=True)["critic_max_tokens"][1][0] == 32768
    # Ulysses sequence parallelism multiplies the budget (max_token_len = per GPU × sp): the floor divides by it
    sp = declared_knobs(verl_config(*DYNAMIC, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"))
    assert sp["actor_update_max_tokens"][1][1] == 16 and sp["log_prob_max_tokens"][1][1] == 16
    # a budget already below the longest sequence: verl will fail on its own; trimtab declares nothing to move
    below = declared_knobs(verl_config(*DYNAMIC, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20"))
    assert "actor_update_max_tokens" not in below and "log_prob_max_tokens" in below


class Recorder:
    """Stands in for a verl worker group (the real one runs models on GPUs); records each call's batching."""

    world_size = 1

    def __init__(self, engine_micro: dict[str, int]):
        self.engine_micro, self.calls = engine_micro, []  # the micro-batch size each call's engine was built with

    def _record(self, name, data):
        if isinstance(data, KVBatchMeta):  # V1: extra_info becomes non-tensor keys on the worker side
            td = TensorDict({"x": torch.zeros(len(data), 1)}, batch_size=[len(data)])
            tu.assign_non_tensor(td, **data.extra_info)
        else:
            td = data
        carried = tu.get(td, "micro_batch_size_per_gpu") if "micro_batch_size_per_gpu" in td.keys() else None
        self.calls.append((name, carried, worker_micro_batches(td.clone(), self.engine_micro[name])))
        return "output"

    def compute_log_prob(self, data):
        return self._record("compute_log_prob", data)

    def update_actor(self, data):
        return self._record("update_actor", data)


class Trainer:
    def __init__(self):
        self.actor_rollout_wg = Recorder({"compute_log_prob": 4, "update_actor": 2})  # as SMALL configures them
        self.global_steps = 1


def legacy_data(n: int, **meta) -> TensorDict:
    td = TensorDict({"input_ids": torch.zeros(n, 3, dtype=torch.long)}, batch_size=[n])
    tu.assign_non_tensor(td, **meta)
    return td


@pytest.mark.parametrize("form", ["legacy TensorDict", "V1 KVBatchMeta"])
def test_a_change_reaches_the_next_calls_data_and_is_acknowledged_only_then(form):
    trainer = Trainer()
    applier = VerlKnobApplier(declared_knobs(verl_config(), use_critic=False),
                              step_of=lambda: trainer.global_steps)
    undo = wrap_worker_groups(trainer, applier)
    make = (lambda: legacy_data(12, calculate_entropy=True)) if form.startswith("legacy") else \
        (lambda: KVBatchMeta(keys=[str(i) for i in range(12)], tags=[{}] * 12, partition_id="train",
                             extra_info={"temperature": 1.0}))
    trainer.actor_rollout_wg.compute_log_prob(make())
    acked = []
    change = KnobChange("log_prob_micro_batch", 4, 6, step=2, change_id=9,
                        _resolve=lambda c: acked.append((c.status, c.applied_at_step)))
    applier.apply(change)
    assert acked == []  # installed, not yet used by verl
    trainer.global_steps = 2
    data = make()
    trainer.actor_rollout_wg.compute_log_prob(data)
    assert acked == [("applied", 2)]
    recorder = trainer.actor_rollout_wg._group
    assert recorder.calls == [("compute_log_prob", None, 3),   # the worker's own 4: 12 samples in 3 micro-batches
                              ("compute_log_prob", 6, 2)]      # carried 6: 2 micro-batches
    meta = data.extra_info if isinstance(data, KVBatchMeta) else None
    if meta is not None:  # V1 reuses one extra_info dict for every call of the step: the key is taken back out
        assert "micro_batch_size_per_gpu" not in meta and meta["temperature"] == 1.0
    undo()
    assert isinstance(trainer.actor_rollout_wg, Recorder)


def test_a_value_that_does_not_divide_the_per_gpu_batch_is_refused_and_the_call_goes_out_as_before():
    trainer = Trainer()
    applier = VerlKnobApplier(declared_knobs(verl_config(), use_critic=False), step_of=lambda: 3)
    wrap_worker_groups(trainer, applier)
    settled = []
    applier.apply(KnobChange("actor_update_micro_batch", 2, 4, step=3, change_id=11,
                             _resolve=lambda c: settled.append((c.status, c.reason))))
    trainer.actor_rollout_wg.update_actor(legacy_data(6, mini_batch_size=6))  # 6 per GPU; 4 does not divide it
    (status, reason), = settled
    assert status == "refused" and "does not divide the per-GPU mini-batch of 6" in reason
    assert trainer.actor_rollout_wg._group.calls == [("update_actor", None, 3)]  # the engine's 2: untouched


def test_the_plugin_is_registered_where_verl_looks_and_wraps_verls_fit_loops_and_tracking():
    assert "trimtab.trainer.adapters.verl_plugin" in [ep.value for ep in entry_points(group="verl.plugins")]
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tracking import Tracking
    for fn in (PPOTrainer.fit, RayPPOTrainer.fit, Tracking.log):
        assert getattr(fn, verl_plugin.WRAPPED, False), fn


def test_a_verl_whose_signatures_changed_leaves_trimtab_detached_and_says_so(caplog):
    class Tracking:
        def log(self, payload, at_step):  # not verl 0.9.1's (self, data, step, backend=None)
            pass

    with caplog.at_level(logging.WARNING, logger="trimtab.trainer"):
        assert verl_plugin._install(Tracking, "log", verl_plugin._wrap_log, ("self", "data", "step")) is False
    assert not getattr(Tracking.log, verl_plugin.WRAPPED, False)
    assert "trimtab is not attached" in caplog.text


def test_settings_come_from_hydra_overrides_or_the_environment_and_nothing_means_detached(monkeypatch, tmp_path):
    for var in ("TRIMTAB_SERVER", "TRIMTAB_JOB", "TRIMTAB_TOKEN", "TRIMTAB_TOKEN_FILE", "TRIMTAB_MODE",
                "TRIMTAB_DEVICE_MAP"):
        monkeypatch.delenv(var, raising=False)
    assert verl_plugin.settings(verl_config()) is None
    token = tmp_path / "job.token"
    token.write_text("s3cret\n")
    got = verl_plugin.settings(verl_config("+trimtab.server=http://head:9460", f"+trimtab.token_file={token}",
                                           "+trimtab.mode=auto", "trainer.experiment_name=qwen-grpo"))
    assert got == {"server": "http://head:9460", "token": "s3cret", "job": "qwen-grpo", "mode": "auto", "knobs": True,
                   "device_map": None}  # none typed: found from verl's workers when fit starts
    monkeypatch.setenv("TRIMTAB_SERVER", "http://127.0.0.1:9460")
    monkeypatch.setenv("TRIMTAB_JOB", "from-env")
    monkeypatch.setenv("TRIMTAB_KNOBS", "false")
    monkeypatch.setenv("TRIMTAB_DEVICE_MAP", "actor=0,1 critic=2")  # the override of the device map found
    got = verl_plugin.settings(verl_config())
    assert (got["server"], got["job"], got["knobs"]) == ("http://127.0.0.1:9460", "from-env", False)
    assert got["device_map"] == {"actor": [0, 1], "critic": [2]}


def nested_batch(lengths: list[int], **meta) -> TensorDict:
    """Data as verl's trainer hands it to a worker: no-padding (nested) input_ids, one row per sequence."""
    ids = torch.nested.nested_tensor([torch.ones(n, dtype=torch.long) for n in lengths], layout=torch.jagged)
    td = TensorDict({"input_ids": ids}, batch_size=[len(lengths)])
    tu.assign_non_tensor(td, **meta)
    return td


class TokenRecorder:
    """Stands in for the actor's worker group (the real one runs models on GPUs): applies the worker's rule (the
    engine config's budget only where the data carries none) and verl's own prepare_micro_batches to each call."""

    world_size = 1

    def __init__(self, engine_budget: int):
        self.engine_budget, self.calls = engine_budget, []

    def compute_log_prob(self, data):
        td = data.clone()
        carried = tu.get(td, "max_token_len_per_gpu") if "max_token_len_per_gpu" in td.keys() else None
        if "max_token_len_per_gpu" not in td.keys():
            tu.assign_non_tensor(td, max_token_len_per_gpu=self.engine_budget)
        tu.assign_non_tensor(td, use_dynamic_bsz=True)
        micro, _ = prepare_micro_batches(td)
        self.calls.append((carried, len(micro)))


def test_a_token_budget_reaches_the_next_calls_data_and_one_below_the_longest_sequence_is_refused_with_why():
    lengths = [32, 30, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]  # 12 sequences of at most 16 + 16 tokens, 144 in all
    tiny = nested_batch([32, 8])
    tu.assign_non_tensor(tiny, use_dynamic_bsz=True, max_token_len_per_gpu=20)
    with pytest.raises(AssertionError, match="max_token_len must be greater than the sequence length"):
        prepare_micro_batches(tiny)  # verl's own invariant: what trimtab must never send
    trainer = Trainer()
    trainer.actor_rollout_wg = TokenRecorder(engine_budget=96)
    applier = VerlKnobApplier(declared_knobs(verl_config(*DYNAMIC), use_critic=False),
                              step_of=lambda: trainer.global_steps)
    wrap_worker_groups(trainer, applier)
    settled = []
    resolve = lambda c: settled.append((c.knob, c.status, c.applied_at_step, c.reason))  # noqa: E731
    trainer.actor_rollout_wg.compute_log_prob(nested_batch(lengths))
    # the bounds check (API and hook) keeps the rebalancer above the floor; the applier checks again, at the call
    applier.apply(KnobChange("log_prob_max_tokens", 96, 20, step=2, change_id=5, _resolve=resolve))
    trainer.global_steps = 2
    trainer.actor_rollout_wg.compute_log_prob(nested_batch(lengths))
    (knob, status, _, reason), = settled
    assert (knob, status) == ("log_prob_max_tokens", "refused")
    assert "below the longest sequence the run allows (32 tokens per GPU" in reason and "asserts" in reason
    applier.apply(KnobChange("log_prob_max_tokens", 96, 40, step=3, change_id=6, _resolve=resolve))
    trainer.global_steps = 3
    data = nested_batch(lengths, temperature=1.0)
    trainer.actor_rollout_wg.compute_log_prob(data)
    assert settled[-1][:3] == ("log_prob_max_tokens", "applied", 3)
    assert trainer.actor_rollout_wg._group.calls == [
        (None, 2),  # the engine's own 96: 144 tokens in 2 micro-batches
        (None, 2),  # the refused 20 never reached verl: the call went out as before
        (40, 4),    # carried 40: 4 micro-batches
    ]
    assert "max_token_len_per_gpu" not in data.keys() and tu.get(data, "temperature") == 1.0  # taken back out
