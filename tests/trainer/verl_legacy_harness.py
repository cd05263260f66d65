"""verl 0.9.1's legacy ``RayPPOTrainer`` (what ``main_ppo_v0.TaskRunner`` builds) run on CPU through its real
``fit()``: built from verl's ``ppo_trainer.yaml`` (:func:`tests.trainer.verl_harness.build_config`), with
``init_workers()`` skipped and what it would set put in by hand; the rollout is the stub here
(``AgentLoopManager.generate_sequences``), the workers those of :mod:`tests.trainer.verl_worker_stubs`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from tests.trainer.verl_engine_configs import _engine_configs
from tests.trainer.verl_harness import (VerlRun, _ensure_ray, _file_logger_at, _lengths, _prompt_ids, _read_jsonl,
                                        _validate, _with_logger_path, build_config)
from tests.trainer.verl_worker_stubs import (_stub_save, _stub_validate, _StubCheckpointManager, _StubLLMServerManager,
                                             _StubRewardLoopManager, _worker_groups)


class _LegacyRollout:
    """AgentLoopManager.generate_sequences (legacy): DataProto in, padded DataProto out, with rm_scores computed in
    the loop (reward_loop_worker_handles given), the same non-tensor keys and meta_info["timing"]."""

    def __init__(self, run, config, step_s):
        self.run, self.config, self.step_s = run, config, step_s

    def generate_sequences(self, prompts):
        from verl import DataProto
        from verl.utils.model import compute_position_id_with_mask

        t0 = time.time()
        if self.step_s and not prompts.meta_info.get("validate", False):
            time.sleep(self.step_s)
        rollout = self.config.actor_rollout_ref.rollout
        P, R = rollout.prompt_length, rollout.response_length
        n = len(prompts)
        prompt_ids = torch.zeros(n, P, dtype=torch.long)
        prompt_mask = torch.zeros(n, P, dtype=torch.long)
        response_ids = torch.zeros(n, R, dtype=torch.long)
        response_mask = torch.zeros(n, R, dtype=torch.long)
        rm_scores = torch.zeros(n, R, dtype=torch.float32)
        acc = np.zeros(n, dtype=np.float64)
        for i in range(n):
            ids = _prompt_ids(prompts.non_tensor_batch["raw_prompt"][i])[:P]
            prompt_ids[i, P - len(ids):] = torch.tensor(ids)
            prompt_mask[i, P - len(ids):] = 1
            rl = _lengths(i, len(ids), R)
            response_ids[i, :rl] = torch.randint(3, 64, (rl,))
            response_ids[i, rl - 1] = 1  # eos
            response_mask[i, :rl] = 1
            acc[i] = float(i % 2)
            rm_scores[i, rl - 1] = acc[i]
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        optional = {}
        if rollout.calculate_log_probs:  # the server's response logprobs, padded like the responses
            optional["rollout_log_probs"] = -torch.rand(n, R) * response_mask
        out = DataProto.from_dict(
            tensors={
                "prompts": prompt_ids, "responses": response_ids, "response_mask": response_mask,
                "input_ids": torch.cat([prompt_ids, response_ids], dim=1), "attention_mask": attention_mask,
                "position_ids": compute_position_id_with_mask(attention_mask), "rm_scores": rm_scores, **optional,
            },
            non_tensors={
                "__num_turns__": np.full(n, 2, dtype=np.int32),
                "acc": acc,
                "multi_modal_inputs": np.array([{} for _ in range(n)], dtype=object),
                **{k: np.array([None] * n, dtype=object) for k in ("turn_scores", "tool_rewards", "extras")},
                "min_global_steps": np.array([self.run.trainer.global_steps - 1] * n, dtype=object),
                "max_global_steps": np.array([self.run.trainer.global_steps - 1] * n, dtype=object),
            },
        )
        dt = time.time() - t0
        out.meta_info = {
            "timing": {"agent_loop/generate_sequences/mean": dt, "agent_loop/generate_sequences/max": dt,
                       "agent_loop/slowest/generate_sequences": dt},
            "reward_extra_keys": ["acc"],
        }
        return out


def run_legacy_fit(tmp_path, *, steps: int = 4, test_freq: int = 0, save_freq: int = 0,
                   overrides: Sequence[str] = (), step_s: float = 0.0, before_fit=None) -> VerlRun:
    import ray  # noqa: F401

    from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role, create_rl_dataset, create_rl_sampler, need_critic
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    _ensure_ray()  # DataProtoFuture.get() is ray.get on ObjectRefs
    from omegaconf import OmegaConf

    config = build_config(tmp_path, v1=False, steps=steps, test_freq=test_freq, save_freq=save_freq,
                          overrides=overrides)
    OmegaConf.resolve(config)
    _validate(config)  # TaskRunner.run validates before building the trainer
    # TaskRunner.run: tokenizer/processor from the model config (real HF tokenizer from the tiny local dir)
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer, processor = model_config.tokenizer, model_config.processor
    train_ds = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True)
    val_ds = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False)
    # TaskRunner: role -> ray.remote(worker cls); only the keys are read by __init__, init_workers() is skipped
    role_worker_mapping = {Role.ActorRolloutRef: ActorRolloutRefWorker}
    mapping = {Role.ActorRolloutRef: "global_pool"}
    if need_critic(config):
        role_worker_mapping[Role.Critic] = TrainingWorker
        mapping[Role.Critic] = "global_pool"
    resource_pool_manager = ResourcePoolManager(
        resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes}, mapping=mapping
    )  # real object; get_n_gpus() reads the spec (create_resource_pool() is never called)
    trainer = RayPPOTrainer(
        config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=role_worker_mapping,
        resource_pool_manager=resource_pool_manager, ray_worker_group_cls=RayWorkerGroup, train_dataset=train_ds,
        val_dataset=val_ds, collate_fn=collate_fn, train_sampler=create_rl_sampler(config.data, train_ds),
    )  # __init__ builds the real StatefulDataLoaders and total_training_steps
    run = VerlRun(trainer=trainer, calls=[], jsonl=_with_logger_path(tmp_path, "legacy"), records=[], wall_s=0.0,
                  config=config)
    trainer.global_steps = 0  # fit() sets it too; the stubs read it
    # --- what init_workers() would set ---
    engines = _engine_configs(config, v1=False)
    trainer.actor_rollout_wg, trainer.critic_wg = _worker_groups(run, engines, trainer.use_critic)
    if trainer.use_reference_policy:
        trainer.ref_policy_wg = trainer.actor_rollout_wg  # all_wg[str(Role.ActorRolloutRef)]
    if trainer.critic_wg is None:
        del trainer.critic_wg
    trainer.reward_loop_manager = _StubRewardLoopManager()
    trainer.async_rollout_mode = True
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager = _StubLLMServerManager()
    trainer.async_rollout_manager = _LegacyRollout(run, config, step_s)  # the GPU rollout
    trainer.checkpoint_manager = _StubCheckpointManager(run)
    trainer._validate = _stub_validate(run)
    trainer._save_checkpoint = _stub_save(run)
    if before_fit is not None:
        before_fit(trainer)
    t0 = time.time()
    try:
        with _file_logger_at(run.jsonl):
            trainer.fit()
    finally:
        run.wall_s = time.time() - t0
    run.records = _read_jsonl(run.jsonl)
    return run
