"""Run verl 0.9.1's fully-async trainer + rollouter, and its one-step-off-policy trainer, on CPU, stubbing only what
needs a GPU.

Fully async (what ``fully_async_main.FullyAsyncTaskRunner`` does, minus the GPU): the config is verl's own
``fully_async_ppo_trainer.yaml`` composed with Hydra; ``FullyAsyncRollouter`` and ``FullyAsyncTrainer`` are built by
their real ``__init__`` (the classes under ``@ray.remote``: ``__ray_actor_class__``), the rollouter's real
``set_max_required_samples()`` sizes verl's real ``MessageQueue`` (a Ray actor on the shared local Ray), the
trainer's real ``set_total_train_steps``, the initial ``_fit_update_weights()``, then both real ``async def fit`` run
concurrently, as the task runner's ``ray.wait`` loop runs them. Real on the way: the rollouter's dataloader
(``data.custom_cls``: the harness's ``TinyRLDataset``), ``_feed_samples``, ``_processor_worker`` with its staleness
pause, ``get_statistics``, ``reset_staleness``; the trainer's ``fit_step``, ``_get_samples_from_queue`` +
``assemble_batch_from_rollout_samples``, reward extraction, bypass-mode log-probs, GRPO advantages,
``_fit_update_local_step``, ``_fit_update_weights``, ``MetricsAggregator`` and ``Tracking`` (``file`` backend: JSONL
at ``VERL_FILE_LOGGER_PATH``).

Stubbed (GPU only): generation (the rollouter's ``async_rollout_manager.generate_sequences_single`` sleeps and
returns a batch shaped like the agent loop's, with rewards computed "in the agent loop"; its
``llm_server_manager`` counts one replica); the actor update (``_update_actor``: the worker group's
forward/backward); weight sync (``checkpoint_manager.update_weights``: NCCL). Not run as Ray actors: trainer and
rollouter live in this process on one event loop, and the trainer's ``rollouter`` handle is an in-process stand-in
whose ``.remote()`` calls run the rollouter's real methods (the Ray transport, not verl's logic, is replaced).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from tests.trainer import verl_harness

GEN_SLEEP_S = 0.02
UPDATE_SLEEP_S = 0.03
SYNC_SLEEP_S = 0.01


@dataclasses.dataclass
class AsyncRun:
    trainer: Any
    rollouter: Any
    records: list       # the trainer's Tracking lines ({"step", "data"}), as verl's file logger wrote them
    config: Any


def build_async_config(tmp_path, *, job: str, samples: int, staleness: float, trigger: int,
                       overrides: Sequence[str] = ()):
    import verl
    from hydra import compose, initialize_config_dir

    model = verl_harness._tiny_model_dir()
    base = [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        f"data.custom_cls.path={Path(verl_harness.__file__).resolve()}",
        "data.custom_cls.name=TinyRLDataset",
        f"data.train_files=['verl_harness:train:{samples}']",
        "data.val_files=['verl_harness:val:2']",
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "data.max_prompt_length=16",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=grpo",
        f"async_training.staleness_threshold={staleness}",
        f"async_training.trigger_parameter_sync_step={trigger}",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        f"rollout.total_rollout_steps={samples}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.val_before_train=False",
        "trainer.balance_batch=False",  # balancing asks the actor worker group for its DP size (GPU workers)
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={Path(tmp_path) / 'ckpt'}",
        "trainer.project_name=verl_async_harness",
        f"trainer.experiment_name={job}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "experimental", "fully_async_policy", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("fully_async_ppo_trainer", overrides=[*base, *overrides])


class _StubRollout:
    """GPU: the agent loop's generation of one prompt's ``n`` responses (sleeps; rewards as the agent loop's
    reward loop would attach them). Shapes as verl's agent loop returns them."""

    def __init__(self, gen_s: float):
        self.gen_s, self.calls = gen_s, 0

    async def generate_sequences_single(self, prompts):
        from verl import DataProto

        await asyncio.sleep(self.gen_s)
        self.calls += 1
        n, p, r = len(prompts), 4, 6
        prompt_ids = torch.randint(3, 64, (n, p))
        response_ids = torch.randint(3, 64, (n, r))
        attention = torch.ones(n, p + r, dtype=torch.long)
        attention[:, p + r - (self.calls % 3):] = 0  # responses of different lengths
        scores = torch.zeros(n, r)
        scores[:, -1] = torch.arange(n, dtype=torch.float32) % 2
        out = DataProto.from_dict(
            tensors={"prompts": prompt_ids, "responses": response_ids,
                     "input_ids": torch.cat([prompt_ids, response_ids], dim=1), "attention_mask": attention,
                     "position_ids": torch.arange(p + r).repeat(n, 1), "rollout_log_probs": -torch.rand(n, r),
                     "rm_scores": scores},
            non_tensors={"min_global_steps": np.zeros(n, dtype=np.int64),
                         "max_global_steps": np.zeros(n, dtype=np.int64)})
        out.meta_info["metrics"] = [{"generate_sequences": self.gen_s, "tool_calls": 0.0} for _ in range(n)]
        return out


class _StubServers:
    """GPU: the vLLM/SGLang replicas; one. ``rollout_replicas`` as verl's ``LLMServerManager`` holds them (filled by
    a test that gives the replica its workers)."""

    def __init__(self):
        self.rollout_replicas: list = []

    def get_active_server_count(self) -> int:
        return 1


class _StubCheckpointManager:
    """GPU: NCCL weight sync from the trainer to the rollout replicas."""

    def __init__(self):
        self.versions: list[int] = []

    async def update_weights(self, global_steps=None):
        await asyncio.sleep(SYNC_SLEEP_S)
        self.versions.append(global_steps)


class _Call:
    def __init__(self, future):
        self._future = future

    def future(self):
        return self._future

    def __await__(self):
        return asyncio.wrap_future(self._future).__await__()


class _InProcessHandle:
    """The rollouter's Ray handle, in process: ``handle.method.remote(...)`` runs the real method on the loop
    (async ones as a task, answering ``.future()`` / ``await``); sync ones answer an ObjectRef for ``ray.get``."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop):
        self._target, self._loop = target, loop

    def __getattr__(self, name: str):
        import ray

        target = self._target
        # Ray's __ray_call__(fn, *args) runs fn(actor_instance, *args) in the actor
        method = (lambda fn, *a, **kw: fn(target, *a, **kw)) if name == "__ray_call__" else getattr(target, name)
        loop = self._loop

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                if asyncio.iscoroutinefunction(method):
                    return _Call(asyncio.run_coroutine_threadsafe(method(*args, **kwargs), loop))
                return ray.put(method(*args, **kwargs))

        return _Method


def _update_actor_stub(batch):
    """GPU: the actor worker group's PPO update (forward/backward/optimizer) — a sleep and its metrics."""
    from verl import DataProto

    time.sleep(UPDATE_SLEEP_S)
    return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0], "actor/grad_norm": [1.0]}})


def run_fully_async(tmp_path, *, job: str, samples: int = 24, staleness: float = 1, trigger: int = 2,
                    overrides: Sequence[str] = (), gen_s: float = GEN_SLEEP_S,
                    during: Optional[Callable[[Any, Any], Any]] = None,
                    before_fit: Optional[Callable[[Any, Any], None]] = None) -> AsyncRun:
    """One fully-async run to the end of its data; ``during(trainer, rollouter)`` (a coroutine function) runs
    beside both fits (e.g. queueing a change once the first step was reported); ``before_fit(trainer, rollouter)``
    runs once both are set up (e.g. giving them the workers ``init_workers()`` would have started)."""
    import ray
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter
    from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.utils import hf_tokenizer

    verl_harness._ensure_ray()
    config = build_async_config(tmp_path, job=job, samples=samples, staleness=staleness, trigger=trigger,
                                overrides=overrides)
    jsonl = verl_harness._with_logger_path(tmp_path, job)
    with verl_harness._file_logger_at(jsonl):
        tokenizer = hf_tokenizer(config.actor_rollout_ref.model.path)

        async def main():
            loop = asyncio.get_running_loop()
            trainer = FullyAsyncTrainer.__ray_actor_class__(
                config, tokenizer, role_worker_mapping={},
                resource_pool_manager=ResourcePoolManager({"trainer_pool": [1]}, mapping={}), device_name="cpu")
            trainer._update_actor = _update_actor_stub
            trainer.checkpoint_manager = _StubCheckpointManager()
            rollouter = FullyAsyncRollouter.__ray_actor_class__(config, tokenizer, processor=None, device_name="cpu")
            rollouter._init_async_objects()  # what its init_workers() does besides starting GPU servers
            rollouter.llm_server_manager = _StubServers()
            rollouter.async_rollout_manager = _StubRollout(gen_s)
            await rollouter.set_max_required_samples()
            trainer.rollouter = _InProcessHandle(rollouter, loop)  # set_rollouter() minus the GPU checkpoint engines
            trainer.set_total_train_steps(rollouter.get_total_train_steps())
            queue = MessageQueue.options(num_cpus=0).remote(config, rollouter.get_max_queue_size())
            client = MessageQueueClient(queue)
            await rollouter.set_message_queue_client(client)
            trainer.set_message_queue_client(client)
            await trainer._fit_update_weights()  # "Param sync before fit"
            if before_fit is not None:
                before_fit(trainer, rollouter)
            tasks = [rollouter.fit(), trainer.fit()]
            if during is not None:
                tasks.append(during(trainer, rollouter))
            try:
                await asyncio.gather(*tasks)
            finally:
                ray.kill(queue)
            return trainer, rollouter

        trainer, rollouter = asyncio.run(main())
    return AsyncRun(trainer, rollouter, verl_harness._read_jsonl(jsonl), config)


def steps_of(run: AsyncRun) -> dict[int, dict]:
    """The trainer's logged sync cycles (the lines with ``timing_s/step``), by step."""
    return {r["step"]: r["data"] for r in run.records if "timing_s/step" in r["data"]}


class _StubBatchRollout(_StubRollout):
    """GPU: the agent loop manager generating a whole batch (one-step-off calls ``generate_sequences``)."""

    async def generate_sequences(self, prompts):
        out = await self.generate_sequences_single(prompts)
        out.meta_info.pop("metrics")
        out.meta_info["timing"] = {}
        return out


class _SyncCheckpointManager:
    """GPU: the NCCL weight sync one-step-off runs before each step's generation is launched."""

    def __init__(self):
        self.versions: list[int] = []

    def update_weights(self, global_steps=None):
        time.sleep(SYNC_SLEEP_S)
        self.versions.append(global_steps)


class _ActorGroup:
    """GPU: the actor worker group (only its presence is asked for by verl's ``_fit_prepare_step``)."""


def run_one_step_off(tmp_path, *, job: str, steps: int = 4, overrides: Sequence[str] = (),
                     before_fit: Optional[Callable[[Any], None]] = None) -> AsyncRun:
    """verl's ``OneStepOffRayTrainer`` built by its real ``__init__`` from verl's ``ppo_trainer`` config plus what
    ``one_step_off_ppo_trainer.yaml`` sets, then its real ``async def fit``. Stubbed (GPU): the batch generation
    (``async_rollout_manager.generate_sequences``), ``_update_actor``, the weight sync and the actor worker group."""
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.utils import hf_tokenizer

    verl_harness._ensure_ray()
    config = verl_harness.build_config(tmp_path, v1=False, steps=steps, test_freq=-1, save_freq=-1, overrides=[
        "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.calculate_log_probs=True", "algorithm.rollout_correction.bypass_mode=True",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=False", "trainer.balance_batch=False",
        "trainer.logger=['file']", f"trainer.experiment_name={job}", *overrides])
    jsonl = verl_harness._with_logger_path(tmp_path, job)
    with verl_harness._file_logger_at(jsonl):
        trainer = OneStepOffRayTrainer(config, hf_tokenizer(config.actor_rollout_ref.model.path),
                                       role_worker_mapping={},
                                       resource_pool_manager=ResourcePoolManager({"global_pool": [1]}, mapping={}),
                                       device_name="cpu")
        trainer.async_rollout_manager = _StubBatchRollout(GEN_SLEEP_S)
        trainer.checkpoint_manager = _SyncCheckpointManager()
        trainer.actor_rollout_wg = trainer.actor_wg = _ActorGroup()
        trainer._update_actor = _update_actor_stub
        if before_fit is not None:
            before_fit(trainer)
        asyncio.run(trainer.fit())
    return AsyncRun(trainer, None, verl_harness._read_jsonl(jsonl), config)
