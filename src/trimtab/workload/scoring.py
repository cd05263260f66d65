"""Evaluation: the frozen reference, the reward model and the critic score each generated batch, in a worker
thread that pulls from the prefetch queue only while the trainer still needs samples for the current step.

Scoring never runs ahead of the trainer: the critic it uses is the one the update is about to change, so scoring
the next step's batches during the update would race with the optimizer. What prefetch overlaps is generation.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from .channel import BusyTotals, Closed, PrefetchQueue
from .config import DeviceMap, PipelineConfig
from .generation import GeneratedBatch
from .models import CausalLM, TokenScorer
from .ppo import response_logprobs, response_values
from .streams import WorkerStreams, autocast_for, hand_over
from .task import response_scores


@dataclass
class ScoredBatch:
    step: int
    tokens: torch.Tensor         # [B, P+R], on the actor's device
    old_logprobs: torch.Tensor   # [B, R] behaviour log-probs from the generation copy
    ref_logprobs: torch.Tensor   # [B, R] under the frozen initial actor
    values: torch.Tensor         # [B, R] critic estimates before each response token
    scores: torch.Tensor         # [B] reward model: estimated share of good response tokens
    policy_version: int
    regenerated: bool = False

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


@torch.no_grad()
def score(batch: GeneratedBatch, ref: CausalLM, reward_model: TokenScorer, critic: TokenScorer,
          config: PipelineConfig, devices: DeviceMap, streams: WorkerStreams) -> ScoredBatch:
    """Reference log-probs, reward and values for one batch, each on its component's device and stream."""
    prompt = config.prompt_tokens
    with streams.on(devices.ref):
        tokens = hand_over(batch.tokens).to(devices.ref)
        ref_logprobs = response_logprobs(ref, tokens, prompt, config.temperature)
    with streams.on(devices.reward):
        scores = response_scores(reward_model, hand_over(batch.tokens).to(devices.reward), prompt)
    with streams.on(devices.critic), autocast_for(devices.critic):
        values = response_values(critic, hand_over(batch.tokens).to(devices.critic), prompt)
    with streams.on(devices.actor):
        move = lambda t: hand_over(t).to(devices.actor)  # noqa: E731
        scored = ScoredBatch(batch.step, move(batch.tokens), move(batch.logprobs), move(ref_logprobs),
                             move(values.float()), move(scores.float()), batch.policy_version, batch.regenerated)
    streams.finish()
    return scored


class ScoringWorker:
    """Thread: for each sample count the trainer asks for, pull generated batches and score them."""

    def __init__(self, models: tuple[CausalLM, TokenScorer, TokenScorer], config: PipelineConfig,
                 devices: DeviceMap, source: PrefetchQueue, totals: BusyTotals,
                 refresh: Callable[[GeneratedBatch], GeneratedBatch] | None = None):
        self._ref, self._reward_model, self._critic = models
        self._config = config
        self._devices = devices
        self._source = source
        self._totals = totals
        self._refresh = refresh          # a batch too stale to train on comes back generated again
        self._streams = WorkerStreams()
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="trimtab-scoring", daemon=True)

    def start(self) -> "ScoringWorker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join()

    def collect(self, step: int, samples: int) -> list[ScoredBatch]:
        """Ask for ``samples`` scored samples of ``step`` and wait for them (the trainer's side)."""
        self._requests.put((step, samples))
        batches, got = [], 0
        while got < samples:
            item = self._results.get()
            if isinstance(item, BaseException):
                raise RuntimeError("the scoring pipeline failed") from item
            batches.append(item)
            got += item.size
        return batches

    def _run(self) -> None:
        try:
            while (request := self._requests.get()) is not None:
                step, samples = request
                while samples > 0:
                    batch = self._source.get()
                    if batch.step != step:
                        raise RuntimeError(f"generated batch for step {batch.step} arrived at step {step}")
                    if self._refresh is not None:
                        batch = self._refresh(batch)
                    with self._totals.timed("evaluation"):
                        scored = score(batch, self._ref, self._reward_model, self._critic, self._config,
                                       self._devices, self._streams)
                    samples -= scored.size
                    self._results.put(scored)
        except Closed:
            return
        except BaseException as error:
            self._results.put(error)
