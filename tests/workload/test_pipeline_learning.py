"""The reference pipeline's learning signals (issue 41) come from its own maths: on a tiny batch, ``ppo_update``'s
reward, clip fraction, PPO KL, effective sample size and gradient norm equal the same quantities computed here
independently from a copy of the actor taken before the update (one minibatch, one epoch: the ratios it trains on
are the copy's); and each step of the running pipeline reports them through ``step_end(learning=...)`` as its own
record has them, the stale share included (the samples an older policy generated)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from trimtab.trainer import attach
from trimtab.workload.config import preset
from trimtab.workload.loop import Pipeline
from trimtab.workload.models import CausalLM, TokenScorer
from trimtab.workload.ppo import Rollout, advantages_and_returns, learning_signals, ppo_update, response_logprobs

pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _tiny_rollout(config, actor: CausalLM, critic: TokenScorer, samples: int, seed: int) -> Rollout:
    """Random sequences scored by hand; behaviour log-probs the actor's own, pushed off-policy by a random shift
    per token (±0.5 nats: some ratios fall outside the clip range, some within)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (samples, config.sequence_tokens), generator=g)
    with torch.no_grad():
        own = response_logprobs(actor, tokens, config.prompt_tokens, config.temperature)
        values = critic(tokens[:, :-1])[:, config.prompt_tokens - 1:]
    shift = (torch.rand(own.shape, generator=g) - 0.5)
    ref = own + 0.1 * torch.randn(own.shape, generator=g)
    return Rollout(tokens, own + shift, ref, values, torch.rand(samples, generator=g))


ONE_MINIBATCH = preset("tiny", samples_per_step=8, train_micro_batch=8, ppo_epochs=1)


def _models_and_rollout(seed: int):
    torch.manual_seed(seed)
    config = ONE_MINIBATCH
    actor = CausalLM(config.vocab_size, config.actor, config.sequence_tokens)
    critic = TokenScorer(config.vocab_size, config.critic, config.sequence_tokens)
    return actor, critic, _tiny_rollout(config, actor, critic, 8, seed=seed + 2)


def _update(actor, critic, rollout) -> dict:
    return ppo_update(actor, critic, torch.optim.Adam(actor.parameters(), lr=1e-3),
                      torch.optim.Adam(critic.parameters(), lr=1e-3), rollout, ONE_MINIBATCH, torch.Generator())


def test_ppo_update_s_learning_signals_equal_an_independent_computation_on_a_tiny_batch():
    config = ONE_MINIBATCH
    actor, critic, rollout = _models_and_rollout(3)
    before = copy.deepcopy(actor)

    # independently: the ratios of the policy before its one update against the behaviour policy
    new = response_logprobs(before, rollout.tokens, config.prompt_tokens, config.temperature)
    ratio = torch.exp(new - rollout.old_logprobs)
    eps = config.clip_ratio
    outside = ((ratio < 1 - eps) | (ratio > 1 + eps)).float().mean().item()
    ppo_kl = (rollout.old_logprobs - new).mean().item()
    w = ratio.detach()
    ess = (w.sum() ** 2 / (w.numel() * (w ** 2).sum())).item()
    advantages, _ = advantages_and_returns(rollout, config)
    loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - eps, 1 + eps)).mean()
    loss.backward()
    grad_norm = math.sqrt(sum(float(p.grad.square().sum()) for p in before.parameters() if p.grad is not None))

    stats = _update(actor, critic, rollout)
    assert 0.0 < outside < 1.0  # the batch has ratios on both sides of the clip range: the test can tell
    assert stats["clip_fraction"] == pytest.approx(outside, abs=1e-6)
    assert stats["ppo_kl"] == pytest.approx(ppo_kl, rel=1e-4, abs=1e-7)
    assert stats["eff_sample_size"] == pytest.approx(ess, rel=1e-5)
    assert stats["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert stats["reward_mean"] == pytest.approx(rollout.scores.mean().item(), rel=1e-6)
    assert stats["kl"] == pytest.approx((rollout.old_logprobs - rollout.ref_logprobs).mean().item(), rel=1e-5)
    signals = learning_signals(stats, stale_share=0.25)
    assert signals == {"reward": stats["reward_mean"], "clip_fraction": stats["clip_fraction"],
                       "kl": stats["ppo_kl"], "eff_sample_size": min(1.0, stats["eff_sample_size"]),
                       "grad_norm": stats["grad_norm"],
                       "stale_share": 0.25}


def test_an_on_policy_batch_has_no_clipping_no_kl_and_a_full_effective_sample_size():
    config = ONE_MINIBATCH
    actor, critic, rollout = _models_and_rollout(4)
    with torch.no_grad():
        rollout.old_logprobs = response_logprobs(actor, rollout.tokens, config.prompt_tokens, config.temperature)
    stats = _update(actor, critic, rollout)
    assert stats["clip_fraction"] == 0.0
    assert stats["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["eff_sample_size"] == pytest.approx(1.0, abs=1e-6)


def test_each_step_of_the_pipeline_reports_its_own_learning_signals_through_the_hook():
    """prefetch 2 with a sync every 2 steps: samples come from older policies, and the stale share says how many."""
    config = preset("tiny", samples_per_step=16, train_micro_batch=8, reward_pretrain_steps=10)
    hook = attach("learning-pipeline", server=None,
                  knobs={"batch_size": (4, 1, 16), "prefetch": (2, 0, 4), "sync_every": (2, 1, 8)})
    reported = []
    try:
        with Pipeline(config, "cpu", hook=hook) as pipe:
            def keep(record):
                reported.append((record, hook.last_report.to_wire().get("learning")))
            pipe.run(6, on_record=keep)
    finally:
        hook.close()
    for record, learning in reported:
        assert learning == pytest.approx({"reward": record.reward_mean, "clip_fraction": record.clip_fraction,
                                          "kl": record.ppo_kl, "eff_sample_size": min(1.0, record.eff_sample_size),
                                          "grad_norm": record.grad_norm, "stale_share": record.stale_share})
        assert 0.0 <= learning["clip_fraction"] <= 1.0 and 0.0 < learning["eff_sample_size"] <= 1.0
    stale = [learning["stale_share"] for _, learning in reported]
    assert any(s > 0 for s in stale), stale  # a queue two deep and a sync every other step train on older samples
