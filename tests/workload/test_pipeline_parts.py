"""The reference pipeline's parts on their own: the KV cache gives the logits a full forward pass gives, the
prefetch queue's bound and its zero-capacity (strictly sequential) case, GAE, the weight sync, the device map."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trimtab.workload.channel import Closed, PrefetchQueue
from trimtab.workload.config import ModelSize, parse_device_map, preset
from trimtab.workload.generation import generate
from trimtab.workload.models import CausalLM
from trimtab.workload.ppo import Rollout, advantages_and_returns, response_logprobs
from trimtab.workload.weights import WeightSync


def tiny_lm(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(vocab_size=50, size=ModelSize(32, 2, 4), max_tokens=40).eval()


def test_kv_cache_generation_gives_the_logits_of_a_full_uncached_forward():
    model = tiny_lm()
    prompts = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    tokens, logprobs, cached = generate(model, prompts, 12, 1.0, torch.Generator().manual_seed(2),
                                        keep_logits=True)
    with torch.no_grad():
        full = model(tokens[:, :-1])[:, 6:]        # position t predicts token t + 1
        recomputed = response_logprobs(model, tokens, 7, 1.0)
    assert tokens.shape == (3, 19) and torch.equal(tokens[:, :7], prompts)
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logprobs, recomputed, rtol=1e-5, atol=1e-5)


def test_temperature_sampling_is_seeded_and_follows_the_distribution():
    model = tiny_lm()
    prompts = torch.zeros(64, 2, dtype=torch.long)
    first = generate(model, prompts, 4, 1.0, torch.Generator().manual_seed(5))[0]
    again = generate(model, prompts, 4, 1.0, torch.Generator().manual_seed(5))[0]
    cold = generate(model, prompts, 4, 1e-4, torch.Generator().manual_seed(5))[0]
    assert torch.equal(first, again)
    assert len(set(first[:, 2].tolist())) > 5        # temperature 1 spreads over the vocabulary
    assert len(set(cold[:, 2].tolist())) == 1        # near 0 it is greedy


def produce(queue: PrefetchQueue, made: list, count: int) -> threading.Thread:
    def run():
        try:
            for i in range(count):
                queue.reserve()
                made.append(i)
                queue.put(i)
        except Closed:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def settled(made: list, expected: list, quiet_s: float = 0.1) -> bool:
    """``made`` reaches ``expected`` and stays there for ``quiet_s`` (the producer went no further)."""
    deadline = time.monotonic() + 5
    while made != expected and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(quiet_s)
    return made == expected


def test_a_zero_capacity_queue_lets_the_producer_make_an_item_only_when_asked():
    queue, made = PrefetchQueue(0), []
    thread = produce(queue, made, 5)
    assert settled(made, [])               # nobody asked: nothing generated
    assert queue.get() == 0
    assert settled(made, [0])              # one ask, one item, no run-ahead
    queue.close()
    thread.join(2)
    assert queue.max_depth == 0


def test_a_queue_of_capacity_two_runs_two_ahead_and_no_further():
    queue, made = PrefetchQueue(2), []
    thread = produce(queue, made, 10)
    assert settled(made, [0, 1]) and queue.depth() == 2
    assert queue.get() == 0
    assert settled(made, [0, 1, 2])
    queue.resize(3)
    assert settled(made, [0, 1, 2, 3]) and queue.max_depth == 3
    queue.close()
    thread.join(2)


def test_gae_matrix_form_equals_the_backward_recursion():
    config = preset("tiny", kl_coef=0.1, gamma=0.99, gae_lambda=0.9)
    gen = torch.Generator().manual_seed(3)
    rollout = Rollout(tokens=torch.zeros(4, 10, dtype=torch.long), old_logprobs=-torch.rand(4, 6, generator=gen),
                      ref_logprobs=-torch.rand(4, 6, generator=gen), values=torch.randn(4, 6, generator=gen),
                      scores=torch.rand(4, generator=gen))
    _, returns = advantages_and_returns(rollout, config)
    rewards = -0.1 * (rollout.old_logprobs - rollout.ref_logprobs)
    rewards[:, -1] += rollout.scores
    advantage, expected = torch.zeros(4), torch.zeros(4, 6)
    for t in reversed(range(6)):
        next_value = rollout.values[:, t + 1] if t < 5 else torch.zeros(4)
        delta = rewards[:, t] + 0.99 * next_value - rollout.values[:, t]
        advantage = delta + 0.99 * 0.9 * advantage
        expected[:, t] = advantage + rollout.values[:, t]
    torch.testing.assert_close(returns, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("via", ["direct", "host"])
def test_weight_sync_makes_the_copy_bit_equal(via):
    source, target = tiny_lm(0), tiny_lm(1)
    sync = WeightSync(source, target, via)
    assert not torch.equal(source.trunk.tok.weight, target.trunk.tok.weight)
    sync.copy()
    assert all(torch.equal(p, q) for p, q in zip(source.parameters(), target.parameters()))
    assert sync.bytes_per_sync == sum(p.numel() * 4 for p in source.parameters())


def test_device_map_forms():
    cpu = torch.device("cpu")
    assert parse_device_map(None, cuda_count=0).critic == cpu
    both = parse_device_map('{"actor": [0, 1], "critic": [2], "reward": [3]}', cuda_count=4)
    pairs = parse_device_map("actor=0,1;critic=2;reward=3;ref=0", cuda_count=4)
    for devices in (both, pairs):
        assert (devices.actor, devices.rollout) == (torch.device("cuda", 0), torch.device("cuda", 1))
        assert (devices.critic.index, devices.reward.index, devices.ref.index) == (2, 3, 0)
    assert pairs.as_hook_map() == {"actor": [0], "rollout": [1], "ref": [0], "reward": [3], "critic": [2]}
    assert parse_device_map("cpu", cuda_count=0).as_hook_map() == {}
    with pytest.raises(ValueError, match="CUDA device"):
        parse_device_map("actor=0;critic=5", cuda_count=1)
    with pytest.raises(ValueError, match="components"):
        parse_device_map("policy=0", cuda_count=1)
