"""The update: PPO's clipped policy loss for the actor and a value loss for the critic, with the reward shaped by
a per-token KL penalty against the frozen reference and advantages from GAE (the InstructGPT / verl recipe).

The update works through the step's samples in fixed ``train_micro_batch`` minibatches, one Adam step each, so
its cost per step depends on ``samples_per_step`` only, never on the generation knobs.

It also gives the step's learning signals (trimtab's ``step_end(learning=...)``), each a by-product of the loss's own
tensors, summed on the device with the losses and read in the update's one host sync: the clip fraction (the share
of response tokens whose ratio π/π_behaviour lies outside [1 − ε, 1 + ε]), PPO's KL between the policy that
generated the samples and the one being trained (verl's ``actor/ppo_kl``: the mean of log π_behaviour − log π over
the tokens each minibatch trains on), the effective sample size of those ratios ((Σw)² / (n·Σw²), 1 on-policy), the
actor's gradient norm before clipping (what ``clip_grad_norm_`` returns) and the reward (the reward model's mean
score of the step's samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import PipelineConfig
from .models import CausalLM, TokenScorer
from .streams import autocast_for


def response_logprobs(model: CausalLM, tokens: torch.Tensor, prompt_tokens: int,
                      temperature: float) -> torch.Tensor:
    """log π(response token | everything before it), [B, R]; the same tempered distribution generation samples."""
    hidden = model.trunk(tokens[:, :-1])[:, prompt_tokens - 1:]
    logp = torch.log_softmax(model.logits(hidden).float() / temperature, dim=-1)
    return logp.gather(-1, tokens[:, prompt_tokens:, None]).squeeze(-1)


def response_values(critic: TokenScorer, tokens: torch.Tensor, prompt_tokens: int) -> torch.Tensor:
    """V(state before each response token), [B, R]."""
    return critic(tokens[:, :-1])[:, prompt_tokens - 1:]


@dataclass
class Rollout:
    """One step's scored samples, concatenated on the actor's device."""
    tokens: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor

    @classmethod
    def concat(cls, batches) -> "Rollout":
        return cls(*(torch.cat([getattr(b, name) for b in batches]) for name in
                     ("tokens", "old_logprobs", "ref_logprobs", "values", "scores")))


def advantages_and_returns(rollout: Rollout, config: PipelineConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over response tokens. Per-token reward = −kl_coef·(log π_behaviour − log π_ref), plus the score on the
    last token. The backward recursion A_t = δ_t + γλ·A_{t+1} is one matmul with a decay matrix."""
    rewards = -config.kl_coef * (rollout.old_logprobs - rollout.ref_logprobs)
    rewards[:, -1] += rollout.scores
    values = rollout.values
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    deltas = rewards + config.gamma * next_values - values
    length = deltas.shape[1]
    index = torch.arange(length, device=deltas.device)
    lag = (index[:, None] - index[None, :]).float()           # row j (later token), column t: j − t
    decay = torch.where(lag >= 0, (config.gamma * config.gae_lambda) ** lag.clamp(min=0), 0.0)
    advantages = deltas @ decay
    returns = advantages + values
    whitened = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return whitened, returns


def ppo_update(actor: CausalLM, critic: TokenScorer, actor_opt: torch.optim.Optimizer,
               critic_opt: torch.optim.Optimizer, rollout: Rollout, config: PipelineConfig,
               generator: torch.Generator) -> dict[str, float]:
    """One pass (``ppo_epochs`` times) over the rollout in minibatches; returns mean losses and diagnostics."""
    actor_device = rollout.tokens.device
    critic_device = next(critic.parameters()).device
    advantages, returns = advantages_and_returns(rollout, config)
    prompt, samples = config.prompt_tokens, rollout.tokens.shape[0]
    # policy loss, value loss, clip fraction, minibatches, then per token: Σ(log π_b − log π), Σw, Σw², tokens;
    # and the actor's gradient norm summed over minibatches
    sums = torch.zeros(9, device=actor_device)
    for _ in range(config.ppo_epochs):
        order = torch.randperm(samples, generator=generator).to(actor_device)
        for chunk in order.split(config.train_micro_batch):
            tokens = rollout.tokens[chunk]
            with autocast_for(actor_device):
                new_logprobs = response_logprobs(actor, tokens, prompt, config.temperature)
            ratio = torch.exp(new_logprobs - rollout.old_logprobs[chunk])
            adv = advantages[chunk]
            clipped = ratio.clamp(1 - config.clip_ratio, 1 + config.clip_ratio)
            policy_loss = torch.max(-adv * ratio, -adv * clipped).mean()
            actor_opt.zero_grad(set_to_none=True)
            policy_loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), config.max_grad_norm)
            actor_opt.step()

            critic_tokens = tokens.to(critic_device)
            with autocast_for(critic_device):
                values = response_values(critic, critic_tokens, prompt).float()
            value_loss = 0.5 * (values - returns[chunk].to(critic_device)).pow(2).mean()
            critic_opt.zero_grad(set_to_none=True)
            value_loss.backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters(), config.max_grad_norm)
            critic_opt.step()

            clip_fraction = ((ratio - 1).abs() > config.clip_ratio).float().mean()
            w = ratio.detach().float()
            sums += torch.stack([policy_loss.detach(), value_loss.detach().to(actor_device),
                                 clip_fraction.detach(), torch.ones((), device=actor_device),
                                 (rollout.old_logprobs[chunk] - new_logprobs.detach()).float().sum(), w.sum(),
                                 w.square().sum(), torch.tensor(float(w.numel()), device=actor_device),
                                 grad_norm.detach().float().to(actor_device)])
    kl_ref = (rollout.old_logprobs - rollout.ref_logprobs).mean()
    (policy_loss, value_loss, clip_fraction, count, old_minus_new, w_sum, w2_sum, tokens, grad_norm_sum,
     kl, reward) = torch.cat([sums, torch.stack([kl_ref.float(), rollout.scores.float().mean()])]).tolist()
    # ↑ the one host sync of the update
    return {"policy_loss": policy_loss / count, "value_loss": value_loss / count,
            "clip_fraction": clip_fraction / count, "kl": kl, "reward_mean": reward,
            "ppo_kl": old_minus_new / tokens, "eff_sample_size": w_sum * w_sum / (tokens * w2_sum),
            "grad_norm": grad_norm_sum / count}


def learning_signals(stats: dict[str, float], stale_share: float) -> dict[str, float]:
    """The step's learning group for trimtab (:mod:`trimtab.contract.learning`'s names) from :func:`ppo_update`'s
    figures: the reward, the clip fraction, PPO's KL to the behaviour policy (the ``kl`` signal is the one between
    the policy that generated and the one trained; the KL to the frozen reference shapes the reward and stays in
    the step record), the ratios' effective sample size, the gradient norm, and ``stale_share``: the share of the
    step's samples a policy older than the one trained generated."""
    return {"reward": stats["reward_mean"], "clip_fraction": stats["clip_fraction"], "kl": stats["ppo_kl"],
            "eff_sample_size": min(1.0, stats["eff_sample_size"]), "grad_norm": stats["grad_norm"],
            "stale_share": stale_share}
