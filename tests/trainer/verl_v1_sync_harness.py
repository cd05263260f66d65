"""verl 0.9.1's V1 ``PPOTrainerSync`` (``get_trainer_cls("sync")``, what ``main_ppo.TaskRunnerV1`` builds) run on
CPU through its real ``fit(agent_loop_manager)``: built from verl's ``ppo_trainer.yaml``
(:func:`tests.trainer.verl_harness.build_config`) on a real TransferQueue, with ``_setup()`` skipped and what it
would set put in by hand; the agent-loop manager is the stub here (it fills TransferQueue from a background thread
the way ``AgentLoopWorkerTQ`` does), the workers those of :mod:`tests.trainer.verl_worker_stubs`. ``fit_v1`` and
the agent-loop stub serve the V1 ``separate_async`` harness too (:mod:`tests.trainer.verl_v1_harness`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence

import torch

from tests.trainer.verl_engine_configs import _engine_configs
from tests.trainer.verl_harness import (VerlRun, _clear_tq, _ensure_tq, _file_logger_at, _lengths, _prompt_ids,
                                        _read_jsonl, _validate, _with_logger_path, build_config)
from tests.trainer.verl_worker_stubs import (_stub_save, _stub_validate, _StubCheckpointManager, _StubLLMServerManager,
                                             _StubRewardLoopManager, _worker_groups)


class _V1AgentLoopManager:
    """AgentLoopManagerTQ: generate_sequences(TensorDict) returns at once; a background thread (AgentLoopWorkerTQ's
    fire-and-forget tasks) marks each prompt running, sleeps ``step_s``, puts each session's trajectory into
    TransferQueue with the real field set and tags, then marks the prompt finished."""

    def __init__(self, run, config, step_s):
        self.run, self.config, self.step_s = run, config, step_s
        self.threads, self.errors = [], []

    def generate_sequences(self, prompts) -> None:
        from tensordict import NonTensorData, NonTensorStack

        validate = bool(prompts["validate"]) if "validate" in prompts.keys() else False
        rows = []
        for i in range(len(prompts)):
            row = {}
            for k, v in prompts.items():
                if k == "validate":
                    continue
                if isinstance(v, torch.Tensor):
                    row[k] = v[i].clone()
                elif isinstance(v, NonTensorStack):
                    row[k] = copy.deepcopy(v[i].data)
                elif isinstance(v, NonTensorData):
                    row[k] = copy.deepcopy(v.data)
            rows.append(row)
        t = threading.Thread(target=self._run, args=(rows, validate), daemon=True)
        t.start()
        self.threads.append(t)

    def _run(self, rows, validate):
        import transfer_queue as tq

        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        partition = "val" if validate else "train"
        try:
            for row in rows:
                tq.kv_put(key=row["uid"], partition_id=partition, tag={"status": "running"})
            if self.step_s and not validate:
                time.sleep(self.step_s)
            rollout = self.config.actor_rollout_ref.rollout
            n = rollout.val_kwargs.n if validate else rollout.n
            for j, row in enumerate(rows):
                ids = _prompt_ids(row["raw_prompt"])
                for s in range(n):
                    rl = _lengths(j * n + s, len(ids), rollout.response_length)
                    response = torch.randint(3, 64, (rl,))
                    response[-1] = 1
                    prompts = torch.tensor(ids, dtype=torch.int64)
                    input_ids = torch.cat([prompts, response])
                    reward = float((j + s) % 2)
                    rm_scores = torch.zeros(rl, dtype=torch.float32)
                    rm_scores[-1] = reward
                    version = row["global_steps"] - 1
                    field = {
                        "prompts": prompts, "responses": response, "response_mask": torch.ones(rl, dtype=torch.int64),
                        "rm_scores": rm_scores, "num_turns": 2,
                        "metrics": {"generate_sequences": self.step_s, "tool_calls": 0.0, "compute_score": 0.0,
                                    "num_preempted": -1},
                        "extra_fields": {"min_global_steps": version, "max_global_steps": version,
                                         "reward_extra_info": {"acc": reward}},
                    }
                    field.update({k: v for k, v in row.items() if k != "agent_name"})
                    field["session_id"] = s
                    field["loss_mask"] = field["response_mask"]
                    field["input_ids"] = input_ids
                    field["position_ids"] = torch.arange(input_ids.numel())
                    field["multi_modal_inputs"] = {}
                    if rollout.calculate_log_probs:  # the server's response logprobs
                        field["rollout_log_probs"] = -torch.rand(rl)
                    tag = {"status": "success", "prompt_len": len(ids), "response_len": rl, "seq_len": len(ids) + rl,
                           "global_steps": row["global_steps"], "min_global_steps": version,
                           "max_global_steps": version}
                    tq.kv_batch_put(keys=[f"{row['uid']}_{s}_0"], fields=list_of_dict_to_tensordict([field]),
                                    tags=[tag], partition_id=partition)
                tq.kv_put(key=row["uid"], partition_id=partition, tag={"status": "finished"})
        except BaseException as e:  # surfaced after fit
            self.errors.append(e)
            for row in rows:
                tq.kv_put(key=row["uid"], partition_id=partition, tag={"status": "failure"})


def run_v1_fit(tmp_path, *, steps: int = 4, test_freq: int = 0, save_freq: int = 0,
               overrides: Sequence[str] = (), step_s: float = 0.0, before_fit=None) -> VerlRun:
    from omegaconf import OmegaConf

    config = build_config(tmp_path, v1=True, steps=steps, test_freq=test_freq, save_freq=save_freq,
                          overrides=overrides)
    _validate(config)  # main() validates before run_ppo
    _ensure_tq(config)
    import transfer_queue as tq  # noqa: F401

    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    # TaskRunnerV1.run
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    trainer = trainer_cls(config=config)  # real __init__: replay buffer, checkpoint callback, ...
    trainer.replay_buffer.poll_interval = 0.01  # constructor default is 2.0 s between TQ polls
    run = VerlRun(trainer=trainer, calls=[], jsonl=_with_logger_path(tmp_path, "v1"), records=[], wall_s=0.0,
                  config=config)
    # --- what init() / _setup() would set ---
    trainer._init_tokenizer()  # real: HFModelConfig(tiny dir).tokenizer
    trainer._init_dataloader()  # real: datasets via data.custom_cls, StatefulDataLoader, steps_per_epoch, totals
    trainer._init_dump_executor()
    # _init_resource_pool_mgr minus ray.remote(): role mapping + the real ResourcePoolManager (get_n_gpus)
    role = Role.ActorRolloutRef if need_reference_policy(config) else Role.ActorRollout
    trainer.role_worker_mapping = {role: ActorRolloutRefWorker}
    trainer.mapping = {role: "global_pool", Role.RewardModel: "global_pool"}
    if need_critic(config):
        trainer.role_worker_mapping[Role.Critic] = TrainingWorker
        trainer.mapping[Role.Critic] = "global_pool"
    trainer.resource_pool_manager = ResourcePoolManager(
        resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes},
        mapping=trainer.mapping,
    )
    trainer.ref_in_actor = False
    engines = _engine_configs(config, v1=True)
    trainer.actor_rollout_wg, critic_wg = _worker_groups(run, engines, trainer.use_critic)
    if critic_wg is not None:
        trainer.critic_wg = critic_wg
    if trainer.use_reference_policy:
        trainer.ref_policy_wg = trainer.actor_rollout_wg  # all_wg[str(actor_role)]
    trainer.reward_loop_manager = _StubRewardLoopManager()
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager = _StubLLMServerManager()
    trainer.checkpoint_manager = _StubCheckpointManager(run)
    trainer.checkpoint_manager.sleep_replicas()  # _setup: "sleep all replicas to load checkpoint"
    trainer._load_checkpoint()  # real: global_steps = 0 (no checkpoint under default_local_dir)
    trainer.on_init_end()  # PPOTrainerSync: update_weights(global_steps)
    trainer._validate = _stub_validate(run)
    trainer._save_checkpoint = _stub_save(run)
    agent_loop_manager = _V1AgentLoopManager(run, config, step_s)  # TaskRunnerV1.init_agent_loop_manager
    if before_fit is not None:
        before_fit(trainer)
    return fit_v1(run, agent_loop_manager)


def fit_v1(run: VerlRun, agent_loop_manager: "_V1AgentLoopManager") -> VerlRun:
    """A V1 trainer's real ``fit(agent_loop_manager)``, timed, its JSONL read back; TransferQueue cleared after."""
    trainer = run.trainer
    t0 = time.time()
    try:
        with _file_logger_at(run.jsonl):
            trainer.fit(agent_loop_manager)
    finally:
        run.wall_s = time.time() - t0
        for t in agent_loop_manager.threads:
            t.join(timeout=10)
        tracking = getattr(trainer, "logger", None)
        if tracking is not None:
            tracking.finish(exit_code=0)
        _clear_tq()
    if agent_loop_manager.errors:
        raise agent_loop_manager.errors[0]
    run.records = _read_jsonl(run.jsonl)
    return run
