"""Run verl 0.9.1's own PPO trainer fit loops on CPU, stubbing only what needs a GPU.

``run_legacy_fit`` builds ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` (what ``main_ppo_v0.TaskRunner`` builds)
and ``run_v1_fit`` builds ``verl.trainer.ppo.v1.PPOTrainerSync`` (``get_trainer_cls("sync")``, what
``main_ppo.TaskRunnerV1`` builds), both from verl's real ``ppo_trainer.yaml`` composed with Hydra, run verl's
``validate_config`` on it, skip only ``init_workers()`` / ``_setup()`` (Ray worker groups on GPUs, vLLM/SGLang
servers) and set by hand what those would have set, then call the class's real ``fit()``.

Real (verl's own code, unchanged): config composition + ``validate_config``; the trainer classes, their ``fit``,
``_step_once``, ``_balance_batch``, ``_compute_*``/``_update_*`` driver code, advantage computation, metrics and
``Tracking``/``FileLogger`` (JSONL at ``VERL_FILE_LOGGER_PATH``); the tokenizer (a real HF fast tokenizer built in a
tiny local model directory, which also lets ``HFModelConfig`` and ``validate_config`` run); the datasets are
loaded through verl's ``data.custom_cls`` hook and batched by verl's ``StatefulDataLoader`` + ``collate_fn`` (V1:
by the real ``_init_tokenizer``/``_init_dataloader``); V1's ``ReplayBuffer.sample``; TransferQueue (a real
``tq.init()`` on a local Ray, started once per process); on the worker side, verl's ``tqbridge`` (KVBatchMeta ->
TensorDict with ``extra_info`` as non-tensor keys, output written back to TQ), ``tu.make_iterator`` (mini-batches)
and ``verl.workers.engine.utils.prepare_micro_batches`` (micro-batches).

Stubbed (GPU only): the worker groups' compute (no model forward/backward; the stub replays the worker's key
handling and returns outputs shaped like the real worker's), the rollout (legacy ``async_rollout_manager``; V1
agent-loop manager that fills TransferQueue from a background thread the way ``AgentLoopWorkerTQ`` does),
``checkpoint_manager`` (weight sync), ``llm_server_manager`` (profiling only), ``reward_loop_manager`` (rewards are
computed "in the agent loop"), ``_validate`` and ``_save_checkpoint`` (short sleeps so their timers are non-zero).
"""

import atexit
import contextlib
import copy
import dataclasses
import json
import os
import pickle
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

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


@dataclasses.dataclass
class VerlRun:
    trainer: Any
    calls: list  # (step, call_name, data_keys: dict)
    jsonl: Path
    records: list
    wall_s: float
    config: Any = None
    events: list = dataclasses.field(default_factory=list)  # (step, name) for weight sync / validate / save


# ----------------------------------------------------------------------------------------------------------------
# Session resources: tiny model dir (tokenizer + HF config), Ray + TransferQueue (started once, closed at exit)
# ----------------------------------------------------------------------------------------------------------------
_SESSION: dict = {}


def _tiny_model_dir() -> str:
    """A local HF directory with a 64-token WordLevel fast tokenizer and a 1-layer Qwen2 config (no weights):
    enough for verl's HFModelConfig (tokenizer, hf_config) and validate_config; no model is ever built."""
    if "model_dir" in _SESSION:
        return _SESSION["model_dir"]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    d = tempfile.mkdtemp(prefix="verl_harness_model_")
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(d)
    Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(d)
    _SESSION["model_dir"] = d
    atexit.register(shutil.rmtree, d, True)
    return d


def _ensure_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    t0 = time.time()
    # 2 logical CPUs: TransferQueue's controller and its one storage unit are each @ray.remote(num_cpus=1);
    # with num_cpus=1 tq.init() waits forever for the second actor.
    # Ray's session files in a directory of the suite's own, removed at exit (after ray.shutdown, registered later):
    # a suite run leaves nothing under /tmp (Ray's default /tmp/ray stays behind).
    temp_dir = tempfile.mkdtemp(prefix="trimtab-ray-")
    atexit.register(shutil.rmtree, temp_dir, True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, _temp_dir=temp_dir)
    _SESSION["ray_start_s"] = time.time() - t0
    _SESSION["ray_owned"] = True
    atexit.register(shutdown)


def _ensure_tq(config) -> None:
    """A real TransferQueue (SimpleStorage) on the local Ray, as TaskRunnerV1 does with tq.init(config.transfer_queue);
    started once per process and reused (partitions are cleared after each run)."""
    if _SESSION.get("tq"):
        return
    _ensure_ray()
    import transfer_queue as tq
    from omegaconf import OmegaConf

    t0 = time.time()
    conf = OmegaConf.create(OmegaConf.to_container(config.transfer_queue, resolve=True))
    conf.backend.SimpleStorage.num_data_storage_units = 1  # verl's default is 8 actors; 1 is enough here
    tq.init(conf)
    _SESSION["tq_start_s"] = time.time() - t0
    _SESSION["tq"] = True


def session_costs() -> dict:
    """One-off start costs measured in this process (seconds)."""
    return {k: v for k, v in _SESSION.items() if k.endswith("_s")}


def shutdown() -> None:
    """Close TransferQueue and Ray if this module started them (also registered with atexit)."""
    try:
        if _SESSION.pop("tq", False):
            import transfer_queue as tq

            tq.close()
    finally:
        if _SESSION.pop("ray_owned", False):
            import ray

            ray.shutdown()


def _clear_tq() -> None:
    import transfer_queue as tq

    listing = tq.kv_list() or {}
    for partition_id, items in listing.items():
        if items:
            tq.kv_clear(keys=list(items.keys()), partition_id=partition_id)


# ----------------------------------------------------------------------------------------------------------------
# Dataset (loaded by verl through data.custom_cls), shaped like verl 0.9.1's RLHFDataset.__getitem__
# ----------------------------------------------------------------------------------------------------------------
class TinyRLDataset(Dataset):
    """verl 0.9.1's RLHFDataset items: the parquet row (data_source, prompt, ability, reward_model, extra_info) plus
    raw_prompt (chat messages), dummy_tensor, index, tools_kwargs, interaction_kwargs. (Tokenisation moved to the
    agent loop in 0.9; there is no input_ids/attention_mask/raw_prompt_ids in the dataset item any more.)
    ``data_files`` is ``["verl_harness:<split>:<n>"]``."""

    def __init__(self, data_files, tokenizer=None, processor=None, config=None, max_samples=-1, **_):
        files = list(data_files) if not isinstance(data_files, str) else [data_files]
        self.n = int(str(files[0]).rsplit(":", 1)[1])
        self.split = str(files[0]).split(":")[1]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        words = " ".join(f"w{(i + k) % 61}" for k in range(2 + i % 3))
        messages = [{"role": "user", "content": words}]
        return {
            "data_source": "harness",
            "prompt": messages,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i % 2)},
            "extra_info": {"index": i, "split": self.split},
            "raw_prompt": messages,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "index": i,
            "tools_kwargs": {},
            "interaction_kwargs": {},
        }


# ----------------------------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------------------------
def build_config(tmp_path, *, v1: bool, steps: int, test_freq: int, save_freq: int, overrides: Sequence[str] = ()):
    import verl
    from hydra import compose, initialize_config_dir

    model = _tiny_model_dir()
    bsz = 4
    base = [
        f"trainer.use_v1={v1}",
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        f"data.custom_cls.path={Path(__file__).resolve()}",
        "data.custom_cls.name=TinyRLDataset",
        f"data.train_files=['verl_harness:train:{bsz * steps}']",
        "data.val_files=['verl_harness:val:2']",
        f"data.train_batch_size={bsz}",
        "data.max_prompt_length=16",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",  # -> reference policy (ref log-prob call)
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=gae",  # -> critic (values + update_critic calls)
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        f"trainer.test_freq={test_freq}",
        f"trainer.save_freq={save_freq}",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={Path(tmp_path) / 'ckpt'}",
        "trainer.project_name=verl_harness",
        f"trainer.experiment_name={'v1' if v1 else 'legacy'}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=[*base, *overrides])
    return config


def _validate(config) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


# ----------------------------------------------------------------------------------------------------------------
# Engine configs, derived exactly as the real workers derive them
# ----------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Engine:
    use_dynamic_bsz: bool
    max_token_len_per_gpu: Any
    micro_batch_size_per_gpu: Any
    infer_max_token_len_per_gpu: Any
    infer_micro_batch_size_per_gpu: Any
    use_remove_padding: bool
    use_fused_kernels: bool
    sp_size: int


def _engine_from(engine_cfg, model_cfg) -> _Engine:
    return _Engine(
        use_dynamic_bsz=engine_cfg.use_dynamic_bsz,
        max_token_len_per_gpu=engine_cfg.max_token_len_per_gpu,
        micro_batch_size_per_gpu=engine_cfg.micro_batch_size_per_gpu,
        infer_max_token_len_per_gpu=engine_cfg.infer_max_token_len_per_gpu,
        infer_micro_batch_size_per_gpu=engine_cfg.infer_micro_batch_size_per_gpu,
        # TrainingWorker.__init__: "we use the one defined in model"
        use_remove_padding=model_cfg.get("use_remove_padding", False),
        use_fused_kernels=model_cfg.get("use_fused_kernels", False),
        sp_size=getattr(engine_cfg, "ulysses_sequence_parallel_size", 1) or 1,
    )


def _engine_configs(config, *, v1: bool) -> dict:
    """ActorRolloutRefWorker.init_model (actor + ref) and the trainers' critic TrainingWorkerConfig set-up."""
    from omegaconf import OmegaConf, open_dict

    from verl.trainer.ppo.utils import need_critic
    from verl.utils.config import omega_conf_to_dataclass

    arr = config.actor_rollout_ref
    out = {}
    # actor: engine_workers.ActorRolloutRefWorker.init_model, "2. build actor model"
    actor_engine = omega_conf_to_dataclass(arr.actor).engine
    actor_engine.use_dynamic_bsz = arr.actor.use_dynamic_bsz
    actor_engine.infer_max_token_len_per_gpu = arr.rollout.log_prob_max_token_len_per_gpu
    actor_engine.infer_micro_batch_size_per_gpu = arr.rollout.log_prob_micro_batch_size_per_gpu
    actor_engine.max_token_len_per_gpu = arr.actor.ppo_max_token_len_per_gpu
    actor_engine.micro_batch_size_per_gpu = arr.actor.ppo_micro_batch_size_per_gpu
    out["actor"] = _engine_from(actor_engine, arr.model)
    # ref: "1. build reference model" (log_prob_* keys popped into ppo_* names, then copied to the engine config)
    ref = OmegaConf.create(OmegaConf.to_container(arr.ref, resolve=True))
    with open_dict(ref):
        ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    ref_engine = omega_conf_to_dataclass(ref).engine
    ref_engine.use_dynamic_bsz = ref.use_dynamic_bsz
    ref_engine.infer_max_token_len_per_gpu = ref.ppo_max_token_len_per_gpu
    ref_engine.infer_micro_batch_size_per_gpu = ref.ppo_micro_batch_size_per_gpu
    out["ref"] = _engine_from(ref_engine, arr.model)
    if need_critic(config):
        critic_cfg = omega_conf_to_dataclass(config.critic)
        engine = critic_cfg.engine
        engine.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
        # legacy RayPPOTrainer.init_workers uses ppo_max_token_len_per_gpu; V1 PPOTrainer._setup uses the infer one
        engine.max_token_len_per_gpu = (
            critic_cfg.ppo_infer_max_token_len_per_gpu if v1 else critic_cfg.ppo_max_token_len_per_gpu
        )
        # NB: nothing copies critic.ppo_micro_batch_size_per_gpu / critic.use_dynamic_bsz into this engine config
        out["critic"] = _engine_from(engine, critic_cfg.model)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Worker stubs
# ----------------------------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------------------------
# Rollout stubs
# ----------------------------------------------------------------------------------------------------------------
def _lengths(i: int, prompt_len: int, max_response: int) -> int:
    return 2 + (i * 5 + prompt_len) % max(1, max_response - 2)


def _prompt_ids(messages) -> list:
    text = " ".join(m["content"] for m in messages)
    return [3 + int(w[1:]) for w in text.split()]


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


# ----------------------------------------------------------------------------------------------------------------
# Running a fit
# ----------------------------------------------------------------------------------------------------------------
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


def _read_jsonl(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _with_logger_path(tmp_path, name):
    path = Path(tmp_path) / f"{name}.jsonl"
    if path.exists():
        path.unlink()
    return path


@contextlib.contextmanager
def _file_logger_at(path: Path):
    """verl's FileLogger writes to $VERL_FILE_LOGGER_PATH (set for the fit, restored after)."""
    old = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = old


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
