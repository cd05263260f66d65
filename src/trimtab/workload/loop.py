"""The training loop: builds the five components where the device map puts them, runs the generation and scoring
workers, and on this thread collects each step's samples, runs the PPO update and syncs the generation copy.

Knobs are read from a mapping (``hook.knobs``, or any dict) at every step boundary and take effect there: a new
``batch_size`` for the next generation calls, a new ``prefetch`` bound for the queue, a new ``sync_every`` for the
next sync decision.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping

import torch

from .channel import BusyTotals, PrefetchQueue
from .config import COMPONENTS, DEFAULT_KNOBS, DeviceMap, Knobs, PipelineConfig, parse_device_map
from .generation import GeneratedBatch, GenerationWorker, generate
from .models import CausalLM, TokenScorer, frozen_copy
from .ppo import Rollout, learning_signals, ppo_update
from .scoring import ScoringWorker
from .streams import WorkerStreams, inference_dtype
from .task import GoodTokenRule, pretrain_reward_model
from .weights import WeightSync

PHASES = ("generation", "evaluation", "update", "communication")
WORKER_PHASES = ("generation", "evaluation")   # timed in the worker threads, handed to the hook at step_end


def set_cpu_threads(devices: DeviceMap, threads: int | None = None) -> int:
    """Set torch's intra-op threads for this process (``threads``, or 1 when every component is on the CPU) and
    return the number in force. Three threads issue ops here (trainer, generation, scoring), each with its own
    OpenMP team; on a few cores those teams oversubscribe them and spin, and the small ops of the tiny config
    gain nothing from splitting — one thread each ran the tiny pipeline 2× faster on 2 cores."""
    all_cpu = all(getattr(devices, name).type == "cpu" for name in COMPONENTS)
    if threads is None and all_cpu:
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


@dataclass
class StepRecord:
    step: int
    samples: int
    tokens: int
    step_s: float
    samples_per_s: float
    generation_s: float          # busy seconds per phase in this step's wall time; workers overlap, so the
    evaluation_s: float          # four may add up to more than step_s
    update_s: float
    communication_s: float
    wait_s: float                # from the step's start until its samples were scored (the bubble the trainer sees)
    reward_mean: float
    policy_loss: float
    value_loss: float
    kl: float
    clip_fraction: float
    batch_size: int
    prefetch: int
    sync_every: int
    synced: bool
    generation_batch_sizes: list[int] = field(default_factory=list)
    staleness_mean: float = 0.0  # actor updates the generating policy was behind, averaged over samples
    queue_max_depth: int = 0     # most generated batches that waited unclaimed during this step
    regenerated: int = 0         # samples generated a second time: too stale to train on (config.max_staleness)
    ppo_kl: float = 0.0          # PPO's KL between the behaviour policy and the one trained (the learning signal)
    eff_sample_size: float = 1.0  # of the update's importance ratios, (Σw)² / (n·Σw²)
    grad_norm: float = 0.0       # the actor's, before clipping, mean over minibatches
    stale_share: float = 0.0     # share of the step's samples an older policy generated

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return (f"step {self.step:4d}  samples {self.samples}  {self.step_s:7.3f} s  "
                f"{self.samples_per_s:8.1f} samples/s  gen {self.generation_s:.3f} eval {self.evaluation_s:.3f} "
                f"update {self.update_s:.3f} comm {self.communication_s:.3f} s  reward {self.reward_mean:.3f}  "
                f"clip {self.clip_fraction:.3f} ppo_kl {self.ppo_kl:.4f} ess {self.eff_sample_size:.3f} "
                f"grad {self.grad_norm:.2f} stale {self.stale_share:.2f}  [bs {self.batch_size} prefetch {self.prefetch} sync {self.sync_every}]")


class Pipeline:
    """One PPO job. Use as a context manager (or call ``close()``) so the worker threads stop."""

    def __init__(self, config: PipelineConfig, device_map: DeviceMap | str | None = None,
                 knobs: Mapping | None = None, hook=None, log: Callable[[str], None] | None = None):
        self.config = config
        self.devices = device_map if isinstance(device_map, DeviceMap) else parse_device_map(device_map)
        self.hook = hook
        self.knobs = knobs if knobs is not None else (hook.knobs if hook is not None else dict(DEFAULT_KNOBS))
        self._log = log or (lambda _line: None)
        torch.manual_seed(config.seed)
        self._build_models()
        self._totals = BusyTotals()
        self.step_index = 0
        self.syncs = 0
        self._updates_in_version = {0: 0}   # sync number → actor updates the generation copy then held
        self._steps_since_sync = 0
        self._boundary_s: float | None = None   # where the last step ended: steps tile the wall clock
        self._shuffle = torch.Generator().manual_seed(config.seed + 17)
        # Regeneration of stale batches runs on the scoring thread, with its own sampler and streams.
        self._resampler = torch.Generator(device=self.devices.rollout).manual_seed(config.seed + 29)
        self._restreams = WorkerStreams()
        self.current = Knobs.read(self.knobs)
        self._start_workers()

    def _build_models(self) -> None:
        config, devices = self.config, self.devices
        max_tokens = config.sequence_tokens
        # Built on their devices: initialising a GPU-sized model on the CPU first would take seconds.
        with torch.device(devices.actor):
            self.actor = CausalLM(config.vocab_size, config.actor, max_tokens)
        with torch.device(devices.critic):
            self.critic = TokenScorer(config.vocab_size, config.critic, max_tokens)
        self.ref = frozen_copy(self.actor, devices.ref, inference_dtype(devices.ref))
        self.generation_model = frozen_copy(self.actor, devices.rollout, inference_dtype(devices.rollout))
        rule = GoodTokenRule(config)
        with torch.device(devices.reward):
            reward_model = TokenScorer(config.vocab_size, config.reward, max_tokens)
        self.reward_accuracy = pretrain_reward_model(reward_model, rule, config, devices.reward)
        self._log(f"reward model: per-token accuracy {self.reward_accuracy:.3f} on the rule after "
                  f"{config.reward_pretrain_steps} pre-training steps")
        self.reward_model = frozen_copy(reward_model, devices.reward, inference_dtype(devices.reward))
        self.rule = rule
        fused = {"fused": True} if devices.actor.type == "cuda" else {}
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr, **fused)
        fused = {"fused": True} if devices.critic.type == "cuda" else {}
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr, **fused)
        self._sync = WeightSync(self.actor, self.generation_model, config.sync_via)

    data_seed_offset = 0  # a data-parallel rank sets its own (trimtab.workload.ddp)

    def _start_workers(self) -> None:
        self.queue = PrefetchQueue(self.current.prefetch)
        self._generator = GenerationWorker(self.generation_model, self.config, self.queue, self._totals,
                                           self.step_index, self.current.batch_size, self.hook,
                                           data_seed_offset=self.data_seed_offset)
        self._generator.version = self.syncs
        refresh = self._fresh if self.config.max_staleness is not None else None
        self._scorer = ScoringWorker((self.ref, self.reward_model, self.critic), self.config, self.devices,
                                     self.queue, self._totals, refresh)
        self._generator.start()
        self._scorer.start()

    def _stop_workers(self) -> None:
        self._generator.stop()
        self._scorer.stop()

    def staleness(self, batch) -> int:
        """Actor updates the policy that sampled ``batch`` was behind the one its step trains."""
        return batch.step - self._updates_in_version[batch.policy_version]

    def _fresh(self, batch: GeneratedBatch) -> GeneratedBatch:
        """The batch, or — when it is more than ``max_staleness`` updates stale — the same prompts sampled again by
        the current generation copy (timed as generation). Called by the scoring worker, which works only while
        the trainer waits for its samples, so never during a weight sync."""
        if self.staleness(batch) <= self.config.max_staleness:
            return batch
        device = self.devices.rollout
        with self._totals.timed("generation"), self._restreams.on(device):
            prompts = batch.tokens[:, :self.config.prompt_tokens].to(device)
            tokens, logprobs, _ = generate(self.generation_model, prompts, self.config.response_tokens,
                                           self.config.temperature, self._resampler)
            self._restreams.finish()
        return GeneratedBatch(batch.step, tokens, logprobs, self.syncs, regenerated=True)

    def restart_workers(self) -> None:
        """Drop whatever was generated ahead and start the workers afresh at the current step (the grid benchmark
        does this between settings, so no batch made under one setting is counted under the next). The knobs are
        read first: new workers must not start a batch of the previous setting."""
        self._stop_workers()
        self.current = Knobs.read(self.knobs)
        self._totals.take()
        self._boundary_s = None
        self._start_workers()

    def apply_knobs(self) -> Knobs:
        """Read the knobs at a step boundary and hand them to the workers."""
        self.current = Knobs.read(self.knobs)
        self._generator.batch_size = self.current.batch_size
        if self.queue.capacity != self.current.prefetch:
            self.queue.resize(self.current.prefetch)
        return self.current

    def sync_weights(self) -> None:
        """Pause generation between calls, copy the trained weights into the generation copy, resume."""
        with self._generator.paused():
            self._sync.copy()
            self.syncs += 1
            self._updates_in_version[self.syncs] = self.step_index + 1
            self._generator.version = self.syncs

    @contextlib.contextmanager
    def _phase(self, name: str):
        """A phase of the trainer's own thread: timed here and, with its CUDA events, by the hook. The workers'
        phases go to the hook as seconds at ``step_end`` instead: its timer belongs to the training thread."""
        with self._totals.timed(name), (self.hook.phase(name) if self.hook is not None else contextlib.nullcontext()):
            yield

    def step(self) -> StepRecord:
        knobs = self.apply_knobs()
        samples = self.config.samples_per_step
        start = self._boundary_s if self._boundary_s is not None else time.perf_counter()
        batches = self._scorer.collect(self.step_index, samples)
        wait_s = time.perf_counter() - start
        rollout = Rollout.concat(batches)
        with self._phase("update"):
            stats = ppo_update(self.actor, self.critic, self.actor_opt, self.critic_opt, rollout, self.config,
                               self._shuffle)
        self._steps_since_sync += 1
        synced = self._steps_since_sync >= knobs.sync_every
        if synced:
            with self._phase("communication"):
                self.sync_weights()
            self._steps_since_sync = 0
        busy = self._totals.take()
        tokens = samples * self.config.sequence_tokens
        self._boundary_s = time.perf_counter()
        step_s = self._boundary_s - start
        high_water = self.queue.reset_max_depth()  # a deeper queue than this ever held would stay empty
        # How many actor updates behind the policy being trained each sample's generating policy was.
        staleness = sum(self.staleness(b) * b.size for b in batches) / samples
        stale_share = sum(b.size for b in batches if self.staleness(b) > 0) / samples
        if self.hook is not None:
            phases_s = {phase: busy.get(phase, 0.0) for phase in WORKER_PHASES}
            if self.config.report_wait:
                phases_s["wait"] = wait_s
            # The step's own time, its wait for samples included (steps tile the wall clock; the hook's own time
            # falls into the next step): by default the hook would start the first step at its first phase()
            # entry, the update, and report that step as its update alone.
            self.hook.step_end(samples=samples, tokens=tokens, step=self.step_index, phases_s=phases_s,
                               step_time_s=step_s, framework={"queue_high_water": high_water},
                               learning=learning_signals(stats, stale_share))
        record = StepRecord(
            step=self.step_index, samples=samples, tokens=tokens, step_s=step_s, samples_per_s=samples / step_s,
            **{f"{phase}_s": busy.get(phase, 0.0) for phase in PHASES}, wait_s=wait_s,
            reward_mean=stats["reward_mean"], policy_loss=stats["policy_loss"], value_loss=stats["value_loss"],
            kl=stats["kl"], clip_fraction=stats["clip_fraction"], batch_size=knobs.batch_size,
            prefetch=knobs.prefetch, sync_every=knobs.sync_every, synced=synced,
            generation_batch_sizes=[b.size for b in batches], staleness_mean=staleness,
            queue_max_depth=high_water, regenerated=sum(b.size for b in batches if b.regenerated),
            ppo_kl=stats["ppo_kl"], eff_sample_size=stats["eff_sample_size"], grad_norm=stats["grad_norm"],
            stale_share=stale_share)
        self.step_index += 1
        return record

    @contextlib.contextmanager
    def off_the_clock(self):
        """Time spent in here between two steps (a benchmark's own printing and polling of the daemon) is nobody's
        step: the next step starts where the last ended plus none of it. The hook's own time stays on the clock: a
        user pays it; a benchmark's ``GET /healthz`` after every step (20+ ms on 2 cores) is not the job's."""
        began = time.perf_counter()
        try:
            yield
        finally:
            if self._boundary_s is not None:
                self._boundary_s += time.perf_counter() - began

    def run(self, steps: int, on_record: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
        """``steps`` steps; within one call each starts where the previous ended (its printing included), the
        first where the call starts — so time spent between calls (another job's steps) is nobody's step."""
        self._boundary_s = None
        records = []
        for _ in range(steps):
            record = self.step()
            records.append(record)
            if on_record is not None:
                on_record(record)
        return records

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stop_workers()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
