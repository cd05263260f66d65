"""The workers' engine configs (actor, ref, critic), derived from a composed verl 0.9.1 config exactly as the real
workers derive them (``ActorRolloutRefWorker.init_model``, the trainers' critic ``TrainingWorkerConfig`` set-up):
the batching keys the worker stubs inject where the data does not carry them come from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any


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
