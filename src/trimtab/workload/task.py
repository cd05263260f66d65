"""The learnable toy task: seeded synthetic prompts, a rule that marks a share of the vocabulary "good", and a
reward model trained on that rule at start-up, so scoring is a real network's forward pass, not a lookup.

The reward of a response is the reward model's estimate of the fraction of its tokens that are good: about
``good_token_fraction`` for a fresh actor, rising towards 1 as PPO moves probability onto good tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import PipelineConfig
from .models import TokenScorer


class PromptSource:
    """Seeded random prompts; a CPU generator keeps the stream identical on every device."""

    def __init__(self, config: PipelineConfig, seed_offset: int = 0):
        self.vocab_size = config.vocab_size
        self.prompt_tokens = config.prompt_tokens
        self._generator = torch.Generator().manual_seed(config.seed * 1_000_003 + seed_offset)

    def next(self, batch: int, device: torch.device) -> torch.Tensor:
        prompts = torch.randint(0, self.vocab_size, (batch, self.prompt_tokens), generator=self._generator)
        return prompts.to(device)


class GoodTokenRule:
    """A fixed, seeded subset of the vocabulary counts as good."""

    def __init__(self, config: PipelineConfig):
        generator = torch.Generator().manual_seed(config.seed + 7)
        count = max(1, round(config.vocab_size * config.good_token_fraction))
        self.good = torch.zeros(config.vocab_size, dtype=torch.bool)
        self.good[torch.randperm(config.vocab_size, generator=generator)[:count]] = True

    def labels(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.good.to(tokens.device)[tokens].float()


def response_scores(reward_model: TokenScorer, tokens: torch.Tensor, prompt_tokens: int) -> torch.Tensor:
    """Per sample: the reward model's mean probability that a response token is good."""
    logits = reward_model(tokens)[:, prompt_tokens:]
    return torch.sigmoid(logits.float()).mean(dim=1)


def pretrain_reward_model(reward_model: TokenScorer, rule: GoodTokenRule, config: PipelineConfig,
                          device: torch.device) -> float:
    """Fit the reward model to the rule on random sequences; return its per-token accuracy on fresh ones.

    Random sequences cover every token in every context, so the fit carries over to whatever the actor writes.
    """
    generator = torch.Generator().manual_seed(config.seed + 11)
    shape = (config.reward_pretrain_batch, config.sequence_tokens)
    optimizer = torch.optim.Adam(reward_model.parameters(), lr=config.reward_lr)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    reward_model.train()
    for _ in range(config.reward_pretrain_steps):
        tokens = torch.randint(0, config.vocab_size, shape, generator=generator).to(device)
        with autocast:
            loss = F.binary_cross_entropy_with_logits(reward_model(tokens).float(), rule.labels(tokens))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)   # the frozen copy made from this model should not carry gradients
    tokens = torch.randint(0, config.vocab_size, shape, generator=generator).to(device)
    with torch.no_grad(), autocast:
        predicted = reward_model(tokens) > 0
    return (predicted == rule.labels(tokens).bool()).float().mean().item()
