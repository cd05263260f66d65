"""verl's staleness bound in numbers, for the fully-async run (:mod:`.verl_async`): what verl fixed at start-up
that the two knobs must respect (``AsyncLimits``), and how far the rollouter got ahead of it in a version
(``versions_ahead``). Arithmetic only: no verl, no torch, no Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

PREFETCH, SYNC_EVERY = "prefetch", "sync_every"


@dataclass(frozen=True)
class AsyncLimits:
    """What verl fixed at start-up that the two knobs must respect."""

    required_samples: int     # ppo_mini_batch_size × require_batches: samples per trainer micro-step
    queue_samples: int        # the MessageQueue's maxlen: start-up max_required_samples

    @classmethod
    def of(cls, config: Any) -> "AsyncLimits":
        from trimtab.trainer.adapters.verl_knobs import select

        required = int(select(config, "actor_rollout_ref.actor.ppo_mini_batch_size")) \
            * int(select(config, "async_training.require_batches", 1))
        staleness = float(select(config, "async_training.staleness_threshold", 1))
        trigger = int(select(config, "async_training.trigger_parameter_sync_step"))
        return cls(required, int(required * (staleness + 1) * trigger))  # as set_max_required_samples() computes it

    def knobs(self, staleness: float, trigger: int) -> dict[str, tuple]:
        """(start, min, max) per knob: each alone within what the queue holds with the other at its minimum."""
        most = self.queue_samples // self.required_samples
        prefetch = (staleness, 0 if float(staleness).is_integer() else 0.0,
                    (most - 1) if float(staleness).is_integer() else float(most - 1))
        return {PREFETCH: prefetch, SYNC_EVERY: (int(trigger), 1, max(int(trigger), most))}

    def refusal(self, staleness: float, trigger: Any) -> Optional[str]:
        """Why verl cannot run with this pair, or None."""
        if not staleness >= 0:
            return f"staleness_threshold {staleness} < 0 (verl asserts staleness_threshold >= 0)"
        if not float(trigger).is_integer() or trigger < 1:
            return f"trigger_parameter_sync_step {trigger} is not an integer >= 1 (verl asserts it)"
        need = int(self.required_samples * (staleness + 1) * int(trigger))
        if need > self.queue_samples:
            return (f"staleness_threshold {staleness} with trigger_parameter_sync_step {int(trigger)} lets the "
                    f"rollouter run {need} samples ahead, but verl's MessageQueue holds {self.queue_samples} (fixed at "
                    f"start-up): it would drop the oldest samples")
        return None


def versions_ahead(peak_samples: int, bound_samples: int, version_samples: int, staleness: float) -> int:
    """How far the rollouter got ahead of the trainer in one parameter version's window, in the ``prefetch`` knob's
    own unit (``staleness_threshold``: versions), as the whole number a step report's ``queue_high_water`` carries.

    verl counts every sample it submits since the last sync, plus those still in flight or queued at it
    (``staleness_samples``, only growing inside a window), and pauses at ``max_required_samples`` =
    ``required × (staleness_threshold + 1) × trigger``: ``peak_samples`` / ``version_samples`` − 1 versions ahead.
    The rounding keeps the one comparison the rebalancer makes (mark ≥ the knob's value: the bound was reached,
    a higher one may let the rollouter do more) true to what verl did: at the bound, at least ⌈staleness⌉; short of
    it, rounded down (below any staleness it did not reach: the rollouter never waited on its bound, so a higher
    one would change nothing)."""
    ahead = max(0.0, peak_samples / max(1, version_samples) - 1.0)
    if peak_samples >= bound_samples:
        return max(math.ceil(ahead), math.ceil(staleness))
    return math.floor(ahead)
