"""Run verl 0.9.1's V1 ``separate_async`` trainer (``PPOTrainerSeparateAsync``, what ``main_ppo.TaskRunnerV1``
builds for ``trainer.v1.trainer_mode=separate_async``) on CPU, stubbing only what needs a GPU.

Built as ``verl_v1_sync_harness.run_v1_fit`` builds the ``sync`` trainer (same config composition from verl's
``ppo_trainer.yaml``, ``validate_config``, real ``__init__``, ``_init_tokenizer``, ``_init_dataloader``, replay
buffer, TransferQueue, ``_load_checkpoint``, ``fit``), plus what separate_async's ``_setup`` adds. Real (verl's own
code, unchanged): ``PPOTrainerSeparateAsync.__init__`` (its asserts, ``HybridRolloutSwitchConfig``), ``fit``,
``step()`` with its ``parameter_sync_step`` local updates, ``on_train_begin`` (the warm-up prompts),
``on_step_begin`` / ``on_step_end`` / ``on_sample_begin`` / ``on_sample_end``, ``prepare_step``, the Decoupled-PPO
``_compute_old_log_prob`` (its save/restore calls go to the stub group), ``ReplayBufferAsync`` with its off-policy
eviction (``max_off_policy_threshold``, ``drop``) and refill, the driver-side ``_update_actor`` etc., metrics and
``Tracking``.

Stubbed (GPU only), on top of ``verl_worker_stubs``'s stubs (the worker groups' compute, weight sync, ``_validate``,
``_save_checkpoint``) and ``verl_v1_sync_harness``'s agent loop (its generation): ``DetachActorWorker``'s
``save_model_to_cpu`` / ``restore_model_from_cpu`` / ``clear_cpu_model`` (copies of the GPU model's weights; recorded,
no model), the standalone rollout pool (``standalone_server_manager``: vLLM/SGLang replicas on their own GPUs) and its
``standalone_checkpoint_manager`` (NCCL weight sync, recorded per step). ``actor_rollout_ref.hybrid_engine=False``:
no colocated replicas, so verl never switches the trainer's GPUs to rollout (that needs GPU replicas).
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from tests.trainer import verl_harness, verl_worker_stubs
from tests.trainer.verl_engine_configs import _engine_configs
from tests.trainer.verl_harness import VerlRun
from tests.trainer.verl_v1_sync_harness import _V1AgentLoopManager, fit_v1


def separate_async_overrides(*, sync_step: int, mini: int, threshold: Optional[int], warmup: float,
                             prompts: int) -> list[str]:
    """verl's separate_async settings: train_batch_size = parameter_sync_step × ppo_mini_batch_size (verl asserts);
    GRPO without a critic or reference (fewer stubbed calls per step)."""
    return [
        "trainer.v1.trainer_mode=separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={sync_step}",
        f"trainer.v1.separate_async.num_warmup_batches={warmup}",
        f"trainer.v1.sampler.max_off_policy_threshold={'null' if threshold is None else threshold}",
        "trainer.v1.sampler.max_off_policy_strategy=drop",
        f"data.train_batch_size={sync_step * mini}",
        f"data.train_files=['verl_harness:train:{prompts}']",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ]


class _StubStandalone:
    """The standalone rollout pool's server manager (GPU replicas): none here; the agent loop stub generates."""

    rollout_replicas: list = []

    def get_replicas(self):
        return []

    def start_profile(self, *a, **k):
        pass

    def stop_profile(self, *a, **k):
        pass


class _StubStandaloneSync:
    """``standalone_checkpoint_manager``: NCCL weight sync to the standalone replicas, recorded with its step."""

    def __init__(self, run: VerlRun):
        self.run = run

    def update_weights(self, global_steps=None):
        self.run.events.append((global_steps, "standalone_update_weights"))
        time.sleep(verl_worker_stubs.WEIGHT_SYNC_SLEEP_S)
        return {}


def _cpu_copies(run: VerlRun, group) -> None:
    """DetachActorWorker's CPU copies of the GPU model (Decoupled PPO's π_old), recorded per step."""
    for name in ("save_model_to_cpu", "restore_model_from_cpu", "clear_cpu_model"):
        def call(n, _name=name):
            run.events.append((run.trainer.global_steps, f"{_name}({n})"))
        setattr(group, name, call)


def run_separate_async_fit(tmp_path, *, steps: int = 6, sync_step: int = 2, mini: int = 2,
                           threshold: Optional[int] = 8, warmup: float = 1, prompts: int = 64,
                           overrides: Sequence[str] = (), step_s: float = 0.0, before_fit=None) -> VerlRun:
    from omegaconf import OmegaConf

    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode
    from verl.workers.engine_workers import ActorRolloutRefWorker

    config = verl_harness.build_config(
        tmp_path, v1=True, steps=steps, test_freq=0, save_freq=0,
        overrides=[*separate_async_overrides(sync_step=sync_step, mini=mini, threshold=threshold, warmup=warmup,
                                             prompts=prompts), *overrides])
    verl_harness._validate(config)
    verl_harness._ensure_tq(config)
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    trainer = trainer_cls(config=config)  # real PPOTrainerSeparateAsync.__init__ (its asserts), replay buffer
    trainer.replay_buffer.poll_interval = 0.01
    run = VerlRun(trainer=trainer, calls=[], jsonl=verl_harness._with_logger_path(tmp_path, "v1_separate_async"),
                  records=[], wall_s=0.0, config=config)
    # --- what init() / _setup() would set ---
    trainer._init_tokenizer()
    trainer._init_dataloader()  # real: data.gen_batch_size forced to 1 in the async modes
    trainer._init_dump_executor()
    trainer.role_worker_mapping = {Role.ActorRollout: ActorRolloutRefWorker}
    trainer.mapping = {Role.ActorRollout: "global_pool", Role.RewardModel: "global_pool"}
    trainer.resource_pool_manager = ResourcePoolManager(
        resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes},
        mapping=trainer.mapping)
    trainer.ref_in_actor = False
    engines = _engine_configs(config, v1=True)
    trainer.actor_rollout_wg, _ = verl_worker_stubs._worker_groups(run, engines, use_critic=False)
    _cpu_copies(run, trainer.actor_rollout_wg)
    trainer.reward_loop_manager = verl_worker_stubs._StubRewardLoopManager()
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager = verl_worker_stubs._StubLLMServerManager()
    trainer.checkpoint_manager = verl_worker_stubs._StubCheckpointManager(run)
    trainer.standalone_server_manager = _StubStandalone()
    trainer.standalone_checkpoint_manager = _StubStandaloneSync(run)
    trainer.current_mode = HybridEngineMode.TRAINER  # _setup with hybrid_engine=False
    trainer._load_checkpoint()
    trainer.on_init_end()  # real: standalone update_weights(global_steps)
    trainer._validate = verl_worker_stubs._stub_validate(run)
    trainer._save_checkpoint = verl_worker_stubs._stub_save(run)
    agent_loop_manager = _V1AgentLoopManager(run, config, step_s)
    if before_fit is not None:
        before_fit(trainer)
    return fit_v1(run, agent_loop_manager)


def updates_by_step(run: VerlRun) -> dict[int, int]:
    """How many actor updates verl's ``step()`` made in each global step (the stub group records each call)."""
    out: dict[int, int] = {}
    for step, name, _ in run.calls:
        if name == "update_actor":
            out[step] = out.get(step, 0) + 1
    return out


def logged_steps(run: VerlRun) -> dict[int, dict]:
    """verl's own logged metrics per training step (its file logger's JSONL)."""
    return {r["step"]: r["data"] for r in run.records if "timing_s/step" in r["data"]}
