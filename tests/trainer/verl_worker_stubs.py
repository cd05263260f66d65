"""The GPU side of verl 0.9.1's trainers, stubbed for the CPU harnesses: the worker groups' compute (no model
forward/backward; the stub replays the worker's key handling, records each call's batching keys, and returns
outputs shaped like the real worker's), ``checkpoint_manager`` (weight sync), ``llm_server_manager``,
``reward_loop_manager``, and the trainers' ``_validate`` / ``_save_checkpoint`` (short sleeps so their timers are
non-zero). verl's own ``tqbridge``, ``tu.make_iterator`` and ``prepare_micro_batches`` run inside the stubs.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from typing import Callable

import torch

from tests.trainer.verl_engine_configs import _Engine

# Non-tensor keys recorded for each worker call (those that decide batching, plus a few that callers pass).
BATCHING_KEYS = (
    "micro_batch_size_per_gpu",
    "max_token_len_per_gpu",
    "use_dynamic_bsz",
    "mini_batch_size",
    "global_batch_size",
    "num_mini_batch",
    "epochs",
    "use_remove_padding",
    "use_fused_kernels",
    "calculate_entropy",
    "compute_loss",
    "temperature",
    "force_group_size",
    "sp_size",
)
STUB_SLEEP_S = 0.02  # _save_checkpoint stub
VALIDATE_SLEEP_S = 0.02  # _validate stub
WEIGHT_SYNC_SLEEP_S = 0.002


def _scalar_non_tensors(td) -> dict:
    from tensordict.tensorclass import NonTensorData

    out = {}
    for key in td.keys():
        val = td.get(key)
        if isinstance(val, NonTensorData):
            v = val.data
            if v is None or isinstance(v, (bool, int, float, str)):
                out[key] = v
            elif isinstance(v, dict) and key == "dataloader_kwargs":
                out[key] = dict(v)
    return out


def _mem_metrics() -> dict:
    """TrainingWorker._postprocess_output's memory metrics, read from verl's device module (CPU here)."""
    import psutil

    from verl.utils.device import get_torch_device

    dev = get_torch_device()
    out = {}
    for name, fn in (("perf/max_memory_allocated_gb", "max_memory_allocated"),
                     ("perf/max_memory_reserved_gb", "max_memory_reserved")):
        try:
            out[name] = getattr(dev, fn)() / (1024**3)
        except Exception:  # torch.cpu has no allocator statistics
            out[name] = 0.0
    out["perf/cpu_memory_used_gb"] = psutil.virtual_memory().used / (1024**3)
    return out


class _WorkerRank:
    """One dp rank (dp=1) of the worker. Methods take what the real worker methods receive (a TensorDict, already
    converted from KVBatchMeta by verl's tqbridge in V1) and follow engine_workers.py's key handling."""

    def __init__(self, run, engines: dict):
        self.run = run
        self.engines = engines

    # -- shared pieces --------------------------------------------------------------------------------------------
    def _inject(self, data, engine: _Engine, *, train: bool) -> list:
        from verl.utils import tensordict_utils as tu

        default_keys = dict(
            use_remove_padding=engine.use_remove_padding,
            use_dynamic_bsz=engine.use_dynamic_bsz,
            max_token_len_per_gpu=engine.max_token_len_per_gpu if train else engine.infer_max_token_len_per_gpu,
            micro_batch_size_per_gpu=engine.micro_batch_size_per_gpu if train else engine.infer_micro_batch_size_per_gpu,
            use_fused_kernels=engine.use_fused_kernels,
        )
        injected = []
        for key, val in default_keys.items():
            if key not in data.keys():  # the worker's rule: only if the data does not carry it
                tu.assign_non_tensor(data, **{key: val})
                injected.append(key)
        return injected

    def _micro_batches(self, data, engine: _Engine) -> int:
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import prepare_micro_batches

        tu.assign_non_tensor(data, sp_size=engine.sp_size)  # FSDPEngine.forward_backward_batch
        tu.assign_non_tensor(data, dp_size=1)
        micro_batches, _ = prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
        return len(micro_batches)

    def _record(self, name, received: dict, effective: dict, injected, n_micro, extra=None):
        keys = {k: effective[k] for k in BATCHING_KEYS if k in effective}
        keys.update({k: received[k] for k in ("mini_batch_size", "global_batch_size", "epochs") if k in received})
        keys["n_micro_batches"] = n_micro
        keys["injected"] = list(injected)
        keys["received"] = received
        if extra:
            keys.update(extra)
        self.run.calls.append((self.run.trainer.global_steps, name, keys))

    @staticmethod
    def _per_token(data, fill=None):
        ids = data["input_ids"]
        assert ids.is_nested, "the real worker receives no-padding (nested) input_ids"
        offsets = ids.offsets()
        n = int(offsets[-1])
        values = torch.full((n,), fill) if fill is not None else -torch.rand(n)
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)

    # -- TrainingWorker.infer_batch -------------------------------------------------------------------------------
    def _infer(self, name, data, engine: _Engine, outputs: Callable):
        from verl.utils import tensordict_utils as tu

        received = _scalar_non_tensors(data)
        tu.pop(data, key="no_lora_adapter", default=False)
        injected = self._inject(data, engine, train=False)
        effective = _scalar_non_tensors(data)
        n_micro = self._micro_batches(data, engine)
        self._record(name, received, effective, injected, n_micro)
        metrics = {"loss": 0.0, **_mem_metrics(), "mfu": 0.01 / 3.0}
        return tu.get_tensordict(tensor_dict=outputs(data), non_tensor_dict={"metrics": metrics}).cpu()

    # -- TrainingWorker.train_mini_batch -> train_batch -----------------------------------------------------------
    def _train(self, name, data, engine: _Engine, loss_keys: Sequence[str]):
        from verl.utils import tensordict_utils as tu
        from verl.utils.py_functional import append_to_dict

        received = _scalar_non_tensors(data)
        tu.pop(data, key="disable_auto_offload", default=False)
        mini_batch_size = tu.pop(data, key="mini_batch_size", default=None)
        num_mini_batch = tu.pop(data, key="num_mini_batch", default=None)
        epochs = tu.pop(data, key="epochs", default=1)
        seed = tu.pop(data, key="seed", default=42)
        dataloader_kwargs = tu.pop(data, key="dataloader_kwargs", default={})
        assert mini_batch_size is not None or num_mini_batch is not None
        if mini_batch_size is None:
            assert data.shape[0] % num_mini_batch == 0
            mini_batch_size_per_gpu = data.shape[0] // num_mini_batch
        else:
            mini_batch_size_per_gpu = mini_batch_size // 1  # dp size 1
        total_iterations = data.shape[0] // mini_batch_size_per_gpu * epochs
        per_mini, metrics, injected, effective = [], {}, [], {}
        for batch_idx, mini in enumerate(
            tu.make_iterator(data, mini_batch_size=mini_batch_size_per_gpu, epochs=epochs, seed=seed,
                             dataloader_kwargs=dataloader_kwargs)
        ):
            tu.assign_non_tensor(mini, update_lr_scheduler=batch_idx == total_iterations - 1,
                                 disable_auto_offload=True)
            injected = self._inject(mini, engine, train=True)
            if batch_idx == 0:
                effective = _scalar_non_tensors(mini)
            n_micro = self._micro_batches(mini, engine)
            per_mini.append(n_micro)
            out = {k: [float(-0.01 * (i + 1)) for i in range(n_micro)] for k in loss_keys}  # per micro-batch
            out.update(loss=0.1 * n_micro, grad_norm=1.0, **_mem_metrics(), mfu=0.01)
            if batch_idx == total_iterations - 1:
                out["lr"] = 1e-6
            append_to_dict(metrics, out)
        self._record(name, received, effective, injected, sum(per_mini),
                     {"n_mini_batches": len(per_mini), "micro_batches_per_mini_batch": per_mini})
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}).cpu()

    # -- the worker methods -----------------------------------------------------------------------------------
    def compute_log_prob(self, data):
        from verl.utils import tensordict_utils as tu

        def outputs(d):
            out = {"log_probs": self._per_token(d)}
            if tu.get(d, "calculate_entropy", False):
                out["entropy"] = self._per_token(d, fill=0.5)
            return out

        return self._infer("compute_log_prob", data, self.engines["actor"], outputs)

    def compute_ref_log_prob(self, data):
        return self._infer("compute_ref_log_prob", data, self.engines["ref"],
                           lambda d: {"log_probs": self._per_token(d)})

    def update_actor(self, data):
        keys = ["pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"]
        if self.run.trainer.config.actor_rollout_ref.actor.use_kl_loss:
            keys.append("kl_loss")
        return self._train("update_actor", data, self.engines["actor"], keys)

    def infer_batch(self, data):
        return self._infer("infer_batch", data, self.engines["critic"], lambda d: {"values": self._per_token(d, 0.1)})

    def train_mini_batch(self, data):
        return self._train("train_mini_batch", data, self.engines["critic"], ["vf_loss", "vf_clipfrac", "vpred_mean"])


def _ray_boundary(x):
    """The real call crosses a Ray boundary (dispatch chunk + serialisation): the worker mutates its own copy."""
    return pickle.loads(pickle.dumps(x))


class _StubWorkerGroup:
    """Driver-side worker group. ``blocking`` mirrors each method's @register: ActorRolloutRefWorker's
    compute_log_prob / compute_ref_log_prob / update_actor are blocking (return the collected TensorDict or, in V1,
    KVBatchMeta); TrainingWorker's infer_batch / train_mini_batch are blocking=False (return a DataProtoFuture)."""

    def __init__(self, rank: _WorkerRank, methods: dict, mesh: str):
        from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn
        from verl.utils.transferqueue_utils import tqbridge

        self._dispatch_info = {}
        self._collect_info = {}
        self._mesh = mesh
        self.world_size = 1
        self.calls_made = []
        for name, blocking in methods.items():
            # verl's register() wraps each worker method in tqbridge (no-op for a TensorDict, KVBatchMeta <-> TQ)
            worker_fn = tqbridge(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name=mesh))(
                getattr(rank, name)
            )
            setattr(self, name, self._make(name, worker_fn, blocking))

    def _make(self, name, worker_fn, blocking):
        def call(data, *args, **kwargs):
            import ray

            from verl.protocol import DataProtoFuture

            self.calls_made.append(name)
            output = worker_fn(_ray_boundary(data), *args, **kwargs)
            if blocking:
                return output
            return DataProtoFuture(collect_fn=None, futures=[ray.put(output)])

        call.__name__ = name
        return call

    def _query_dispatch_info(self, mesh_name):
        return [0]

    def save_checkpoint(self, *args, **kwargs):
        return None

    def load_checkpoint(self, *args, **kwargs):
        return None


class _StubCheckpointManager:
    """CheckpointEngineManager: weight sync between the training engine and the rollout replicas (GPU)."""

    def __init__(self, run):
        self.run = run

    def update_weights(self, global_steps=None, *args, **kwargs):
        self.run.events.append((global_steps, "update_weights"))
        time.sleep(WEIGHT_SYNC_SLEEP_S)

    def sleep_replicas(self):
        self.run.events.append((getattr(self.run.trainer, "global_steps", None), "sleep_replicas"))
        time.sleep(WEIGHT_SYNC_SLEEP_S)


class _StubLLMServerManager:
    def start_profile(self, *a, **k):
        pass

    def stop_profile(self, *a, **k):
        pass

    def get_client(self):
        return None

    def get_replicas(self):
        return []


class _StubRewardLoopManager:
    # non-None: rewards are computed in the agent loop (rule-based reward), so the trainers skip the colocated RM
    reward_loop_worker_handles: list = []

    def compute_rm_score(self, batch):
        raise AssertionError("no colocated reward model in the harness")


def _stub_validate(run):
    def _validate(*args, **kwargs):
        run.events.append((run.trainer.global_steps, "validate"))
        time.sleep(VALIDATE_SLEEP_S)
        return {"val-core/harness/reward/mean@1": 0.5, "val-aux/harness/reward/std@1": 0.0}

    return _validate


def _stub_save(run):
    def _save_checkpoint(*args, **kwargs):
        run.events.append((run.trainer.global_steps, "save_checkpoint"))
        time.sleep(STUB_SLEEP_S)

    return _save_checkpoint


def _worker_groups(run, engines, use_critic):
    rank = _WorkerRank(run, engines)
    # ActorRolloutRef is one fused worker group in verl 0.9: ref_policy_wg is the same object as actor_rollout_wg
    actor = _StubWorkerGroup(rank, {"compute_log_prob": True, "compute_ref_log_prob": True, "update_actor": True},
                             mesh="actor")
    critic = _StubWorkerGroup(rank, {"infer_batch": False, "train_mini_batch": False}, mesh="train") if use_critic \
        else None
    return actor, critic
