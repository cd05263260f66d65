"""verl's per-step metrics → one trimtab step: the single mapping both the JSONL tailer and the in-process plugin use.

verl logs the same dict to every backend (``Tracking.log(data=metrics, step=N)``; its ``file`` backend writes it as
``{"step": N, "data": {…}}``). What the keys mean, read from verl 0.9.1's fit loops:

* ``timing_s/step`` times the step *without* validation: ``timing_s/testing`` runs after it, outside the timer, in
  both the V1 trainer (``verl/trainer/ppo/v1/trainer_base.py``) and the legacy Ray trainer (``ray_trainer.py``).
  So a test step lasts ``step + testing`` (and in V1 also ``dump_rollout_generations``, timed outside the step
  there; legacy times it inside), and validation is a phase of its own — reporting ``step`` alone overstates
  samples/s on test steps by the validation's share.
* ``timing_s/gen`` is generation in the legacy trainer, but in V1 it is the time spent in
  ``replay_buffer.sample`` — the trainer *waiting* for rollout to hand it a batch (rollout runs elsewhere).
  V1's separate-async trainer adds ``switch_wait`` (waiting until enough is sampleable) and
  ``switch_to_trainer`` / ``switch_to_rollout`` (moving the GPUs between rollout and training).
* ``timing_s/save_checkpoint`` is inside the step: a phase of its own.
* ``timing_s/agent_loop/slowest/generate_sequences`` vs ``timing_s/agent_loop/generate_sequences/mean``: the
  slowest sample's generation time against the mean one's — the rollout's long tail.
* ``…perf/max_memory_allocated_gb`` / ``…reserved_gb`` (GiB, as ``torch.cuda.max_memory_*`` / 1024³; prefixed
  ``actor/`` or ``critic/`` by the driver): the workers' allocator peaks, which the driver process cannot see.

This module imports neither torch nor verl: ``trimtab verl-tail`` runs where neither is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from trimtab.trainer.adapters.learning_names import LearningNames

GIB = 1024 ** 3
V1, LEGACY = "v1", "legacy"
FULLY_ASYNC, ONE_STEP_OFF = "fully_async", "one_step_off"   # verl/experimental/: see verl_async.py
TRAINERS = (V1, LEGACY, FULLY_ASYNC, ONE_STEP_OFF)

# verl timer → trimtab phase, per trainer ("gen" is the one that differs).
_COMMON: dict[str, str] = {
    "reward": "evaluation", "ref": "evaluation", "values": "evaluation", "old_log_prob": "evaluation",
    "update_actor": "update", "update_critic": "update", "adv": "update",
    "update_weights": "communication", "switch_to_trainer": "communication", "switch_to_rollout": "communication",
    "switch_wait": "wait",
    "testing": "validation", "save_checkpoint": "checkpoint",
}
PHASE_OF: dict[str, dict[str, str]] = {
    V1: {**_COMMON, "gen": "wait"},
    LEGACY: {**_COMMON, "gen": "generation"},
    # The async trainers generate elsewhere (the rollouter, or a task one step ahead): their "gen" is the wait for
    # a batch. Fully-async times its parameter sync as "timing_s/param_sync" inside its own timer dict, so verl
    # logs it as timing_s/timing_s/param_sync; wait_for_enough_samples is dynamic scheduling waiting for rollout.
    FULLY_ASYNC: {**_COMMON, "gen": "wait", "timing_s/param_sync": "communication",
                  "wait_for_enough_samples": "wait"},
    ONE_STEP_OFF: {**{k: v for k, v in _COMMON.items() if k != "update_weights"}, "gen": "wait",
                   "sync_rollout_weights": "communication"},
}
# Timers verl runs after ``timing_s/step`` closed, per trainer: they belong to the step all the same.
OUTSIDE_STEP: dict[str, tuple[str, ...]] = {
    V1: ("testing", "dump_rollout_generations"),
    LEGACY: ("testing", "start_profile", "stop_profile"),
    FULLY_ASYNC: ("save_checkpoint", "start_profile", "stop_profile"),
    ONE_STEP_OFF: ("testing", "save_checkpoint", "start_profile", "stop_profile"),
}
# Timers counted in no phase: one-step-off generates its next batch beside the step (generate_async) and times
# update_weights inside sync_rollout_weights (counting both would count the sync twice).
NOT_COUNTED: dict[str, tuple[str, ...]] = {ONE_STEP_OFF: ("generate_async", "update_weights")}
SLOWEST_SAMPLE = "agent_loop/slowest/generate_sequences"
MEAN_SAMPLE = "agent_loop/generate_sequences/mean"


def number(x: Any) -> Optional[float]:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


@dataclass(frozen=True)
class VerlStep:
    """One verl step as trimtab reports it."""

    step: int
    step_time_s: float                               # the step as the job lived it: verl's step + what ran after
    phases_s: dict[str, float] = field(default_factory=dict)   # named phases; "other" is the rest
    samples: Optional[int] = None                    # responses (prompts × rollout.n)
    tokens: Optional[int] = None                     # prompt + response tokens
    memory: Optional[dict[str, int]] = None          # {"allocated_bytes", "reserved_bytes"}: the workers' peaks
    rollout_s: Optional[tuple[Optional[float], Optional[float]]] = None  # (slowest sample, mean sample)
    unmapped_timers: tuple[str, ...] = ()            # timers this mapping does not know (they land in "other")
    queue_high_water: Optional[int] = None           # how far generation got ahead, in the prefetch knob's unit
    learning: Optional[dict[str, float]] = None      # trimtab's learning signals from verl's names (learning_names)


def timers(data: Mapping[str, Any]) -> dict[str, float]:
    """``timing_s/<name>`` values by name (non-numbers dropped)."""
    out = {}
    for key, value in data.items():
        if isinstance(key, str) and key.startswith("timing_s/"):
            seconds = number(value)
            if seconds is not None:
                out[key[len("timing_s/"):]] = seconds
    return out


def _phases(timing: Mapping[str, float], trainer: str) -> tuple[dict[str, float], tuple[str, ...]]:
    phase_of, phases, unknown = PHASE_OF[trainer], {}, []
    for name, seconds in timing.items():
        phase = phase_of.get(name)
        if phase is not None:
            phases[phase] = phases.get(phase, 0.0) + max(0.0, seconds)
        elif name != "step" and not name.startswith("agent_loop/") and name not in OUTSIDE_STEP[trainer] \
                and name not in NOT_COUNTED.get(trainer, ()):
            unknown.append(name)
    return phases, tuple(sorted(unknown))


def _memory(data: Mapping[str, Any]) -> Optional[dict[str, int]]:
    peaks: dict[str, float] = {}
    for key, value in data.items():
        gib = number(value)
        if not isinstance(key, str) or gib is None or gib < 0:
            continue
        for suffix, name in (("perf/max_memory_allocated_gb", "allocated_bytes"),
                             ("perf/max_memory_reserved_gb", "reserved_bytes")):
            if key.endswith(suffix):
                peaks[name] = max(peaks.get(name, 0.0), gib)
    return {name: int(round(gib * GIB)) for name, gib in peaks.items()} or None


def verl_step(step: Any, data: Mapping[str, Any], *, trainer: str = V1, samples_per_step: Optional[int] = None,
              n_gpus: Optional[int] = None, names: Optional[LearningNames] = None) -> Optional[VerlStep]:
    """The step verl logged as ``Tracking.log(data, step)``, or None for a line that is no training step (the
    validation-only line verl writes before training has no ``timing_s/step``). ``names``: the run's mapper of
    verl's learning metrics (one per run: a stale count is read as its increase since the previous step)."""
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    if not isinstance(data, Mapping) or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    timing = timers(data)
    inside_s = timing.get("step", number(data.get("perf/time_per_step")))
    if inside_s is None:
        return None
    step_time_s = inside_s + sum(timing.get(name, 0.0) for name in OUTSIDE_STEP[trainer])
    phases, unknown = _phases(timing, trainer)
    phases["other"] = max(0.0, step_time_s - sum(phases.values()))
    tokens = number(data.get("perf/total_num_tokens"))
    throughput = number(data.get("perf/throughput"))  # tokens/s per GPU over verl's own step time
    if tokens is None and throughput is not None and n_gpus:
        tokens = throughput * inside_s * n_gpus
    samples: Optional[float] = samples_per_step
    per_sample = [number(data.get("prompt_length/mean")), number(data.get("response_length/mean"))]
    if samples is None and tokens is not None and None not in per_sample and sum(per_sample) > 0:
        samples = tokens / sum(per_sample)  # each sample's tokens are its prompt plus its response
    slowest, mean = timing.get(SLOWEST_SAMPLE), timing.get(MEAN_SAMPLE)
    return VerlStep(step=step, step_time_s=step_time_s, phases_s=phases,
                    samples=None if samples is None else round(samples),
                    tokens=None if tokens is None else round(tokens), memory=_memory(data),
                    rollout_s=(slowest, mean) if slowest is not None or mean is not None else None,
                    unmapped_timers=unknown,
                    learning=(names.signals(data, samples) or None) if names is not None else None)
