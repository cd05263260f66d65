"""Run verl 0.9.1's own PPO trainer fit loops on CPU, stubbing only what needs a GPU: what every harness shares.

``run_legacy_fit`` (:mod:`tests.trainer.verl_legacy_harness`) builds ``verl.trainer.ppo.ray_trainer.RayPPOTrainer``
(what ``main_ppo_v0.TaskRunner`` builds) and ``run_v1_fit`` (:mod:`tests.trainer.verl_v1_sync_harness`) builds
``verl.trainer.ppo.v1.PPOTrainerSync`` (``get_trainer_cls("sync")``, what ``main_ppo.TaskRunnerV1`` builds), both
from verl's real ``ppo_trainer.yaml`` composed with Hydra, run verl's ``validate_config`` on it, skip only
``init_workers()`` / ``_setup()`` (Ray worker groups on GPUs, vLLM/SGLang servers) and set by hand what those would
have set, then call the class's real ``fit()``.

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

This module holds what the harnesses share: the run record (``VerlRun``), the process-wide resources (the tiny
model directory, Ray, TransferQueue), the dataset verl loads from this file by path (``data.custom_cls``) and the
stand-in rollouts' prompt tokens and response lengths, the composed config, and the JSONL file logger's path. The
worker and manager stubs are in :mod:`tests.trainer.verl_worker_stubs`, the engine configs they read in
:mod:`tests.trainer.verl_engine_configs`.
"""

# No ``from __future__ import annotations`` here: verl loads this file by path (``data.custom_cls``) without putting
# it in ``sys.modules``, where ``dataclasses`` cannot resolve a string annotation.
import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset


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
# What the stand-in rollouts make of a prompt: its token ids (``w<i>`` is id ``3 + i`` in the tiny vocabulary) and
# a response length that varies with the sample
# ----------------------------------------------------------------------------------------------------------------
def _lengths(i: int, prompt_len: int, max_response: int) -> int:
    return 2 + (i * 5 + prompt_len) % max(1, max_response - 2)


def _prompt_ids(messages) -> list:
    text = " ".join(m["content"] for m in messages)
    return [3 + int(w[1:]) for w in text.split()]


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
# The run's record: verl's FileLogger JSONL
# ----------------------------------------------------------------------------------------------------------------
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
