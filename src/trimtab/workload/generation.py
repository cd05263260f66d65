"""Rollout: sampling responses with a KV cache, and the generation worker that keeps the prefetch queue filled.

The worker generates from its own copy of the actor (as an inference engine would), which only changes when the
trainer syncs weights into it; between syncs its samples are slightly off-policy, and the behaviour log-probs it
records let PPO's importance ratio correct for that. Batches are cut so that each step gets exactly
``samples_per_step`` samples: with ``batch_size`` b that is ceil(samples_per_step / b) calls.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from .channel import BusyTotals, Closed, PrefetchQueue
from .config import PipelineConfig
from .models import CausalLM
from .streams import WorkerStreams
from .task import PromptSource


@dataclass
class GeneratedBatch:
    step: int                    # the training step these samples are for
    tokens: torch.Tensor         # [B, prompt + response] token ids
    logprobs: torch.Tensor       # [B, response] behaviour log-probs (temperature applied)
    policy_version: int          # syncs the generation copy had received when it sampled these
    regenerated: bool = False    # sampled again at scoring time: the first sample was too stale (max_staleness)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def _gumbel(like: torch.Tensor, sampler: torch.Generator) -> torch.Tensor:
    uniform = torch.rand(like.shape, generator=sampler, device=like.device).clamp_(min=1e-20)
    return -torch.log(-torch.log(uniform))


@torch.no_grad()
def generate(model: CausalLM, prompts: torch.Tensor, response_tokens: int, temperature: float,
             sampler: torch.Generator, keep_logits: bool = False):
    """Sample ``response_tokens`` tokens after each prompt: one prefill, then one cached step per token.

    Returns (tokens [B, P+R], log-probs [B, R], logits [B, R, V] or None). Sampling is Gumbel-max, which
    draws from softmax(logits / temperature) without a device-to-host sync per token.
    """
    batch, prompt_tokens = prompts.shape
    cache = model.new_cache(batch, prompt_tokens + response_tokens)
    responses = torch.empty(batch, response_tokens, dtype=torch.long, device=prompts.device)
    logprobs = torch.empty(batch, response_tokens, dtype=torch.float32, device=prompts.device)
    kept = []
    logits = model.logits(model.trunk(prompts, cache, 0)[:, -1])
    for index in range(response_tokens):
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        if keep_logits:
            kept.append(logits.float())
        token = (logp + _gumbel(logp, sampler)).argmax(dim=-1)
        responses[:, index] = token
        logprobs[:, index] = logp.gather(-1, token[:, None]).squeeze(-1)
        if index + 1 < response_tokens:
            logits = model(token[:, None], cache, prompt_tokens + index)[:, -1]
    tokens = torch.cat([prompts, responses], dim=1)
    return tokens, logprobs, (torch.stack(kept, dim=1) if keep_logits else None)


class GenerationWorker:
    """Thread: reserve a slot in the queue, generate one batch, put it; pause between calls while weights sync."""

    def __init__(self, model: CausalLM, config: PipelineConfig, queue: PrefetchQueue, totals: BusyTotals,
                 first_step: int, batch_size: int, hook=None, data_seed_offset: int = 0):
        self.model = model
        self.device = next(model.parameters()).device
        self.batch_size = batch_size     # set by the trainer at step boundaries; read at the start of each call
        self.version = 0                 # bumped by the trainer inside paused()
        self._config = config
        self._queue = queue
        self._totals = totals
        self._hook = hook
        # data_seed_offset: another rank of a data-parallel job draws other prompts and samples (0: rank 0's).
        self._prompts = PromptSource(config, seed_offset=first_step + data_seed_offset)
        self._sampler = torch.Generator(device=self.device).manual_seed(config.seed + 13 + first_step +
                                                                        data_seed_offset)
        self._streams = WorkerStreams()
        self._step = first_step
        self._remaining = config.samples_per_step
        self._gate = threading.Condition()
        self._pause_requested = False
        self._stopping = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="trimtab-generation", daemon=True)

    def start(self) -> "GenerationWorker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._queue.close()
        with self._gate:
            self._stopping = True
            self._gate.notify_all()
        self._thread.join()

    @contextlib.contextmanager
    def paused(self):
        """Hold generation between two calls: wait for the call in flight, keep the next from starting."""
        with self._gate:
            self._pause_requested = True
            while self._busy:
                self._gate.wait()
        try:
            yield
        finally:
            with self._gate:
                self._pause_requested = False
                self._gate.notify_all()

    def _run(self) -> None:
        try:
            while True:
                self._queue.reserve()
                with self._gate:
                    while self._pause_requested and not self._stopping:
                        self._gate.wait()
                    if self._stopping:
                        return
                    self._busy = True
                try:
                    batch = self._generate_next()
                finally:
                    with self._gate:
                        self._busy = False
                        self._gate.notify_all()
                self._queue.put(batch)
        except Closed:
            return
        except BaseException as error:  # surfaces in the trainer's thread through the queue
            self._queue.fail(error)

    def _generate_next(self) -> GeneratedBatch:
        size = min(self.batch_size, self._remaining)
        guard = self._hook.oom_guard() if self._hook is not None else contextlib.nullcontext()
        result = None
        with self._totals.timed("generation"), self._streams.on(self.device), guard:
            prompts = self._prompts.next(size, self.device)
            result = generate(self.model, prompts, self._config.response_tokens, self._config.temperature,
                              self._sampler)
            self._streams.finish()
        if result is None:   # the hook swallowed an OOM: the same samples, in smaller calls from now on
            if size == 1:
                raise RuntimeError("generation runs out of memory even one sample at a time")
            self.batch_size = size // 2
            return self._generate_next()
        tokens, logprobs, _ = result
        batch = GeneratedBatch(self._step, tokens, logprobs, self.version)
        self._remaining -= size
        if self._remaining == 0:
            self._step += 1
            self._remaining = self._config.samples_per_step
        return batch
