"""Steps whose throughput cannot be a rate — a step lost to an OOM (``samples=0``, the job's OOM count up), a step
with no samples reported, no step time, or figures that are not numbers — are *lost steps*: a verdict leaves the
sync period that holds one out of its per-period rates, counts it and names it in its evidence; it is never a rate
of 0.

Why: a rate of 0 is not a slow period, it is no measurement. On a job whose neighbour took half the GPU's memory
(issue 38) the OOM step's ``samples=0`` gave its period a rate of 0; the lone-period screen picked it as the one
stalled period and divided the window's median by it: ``ZeroDivisionError`` at every plan of the job (87 in a
row), and the change in flight was never judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from trimtab.grading.window import JobStep, throughput


@dataclass(frozen=True)
class LostStep:
    step: int
    why: str

    def evidence(self) -> dict[str, Any]:
        return {"step": self.step, "why": self.why}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def why_lost(step: JobStep, previous: Optional[JobStep] = None) -> Optional[str]:
    """Why ``step``'s throughput cannot be a rate (None: it can). ``previous``: the step before it, for the OOM
    count's delta (without it, any OOM counted so far names the cause)."""
    if not _number(step.step_time_s) or step.step_time_s <= 0:
        return f"step time {step.step_time_s!r} s is not a duration"
    if step.samples is None:
        return "no samples reported"
    if not _number(step.samples) or step.samples <= 0:
        before = previous.num_ooms if previous is not None else 0
        if step.num_ooms is not None and step.num_ooms > (before or 0):
            return f"lost to an OOM (samples {step.samples!r}, the job's OOM count {before or 0} → {step.num_ooms})"
        return f"samples {step.samples!r}: no work done"
    return None


def lost_steps(steps: Sequence[JobStep]) -> list[LostStep]:
    """The lost steps of ``steps`` (oldest first), each with why."""
    out = []
    for i, s in enumerate(steps):
        why = why_lost(s, steps[i - 1] if i > 0 else None)
        if why is not None:
            out.append(LostStep(s.step, why))
    return out


def measurable_periods(steps: Sequence[JobStep], period: int) -> tuple[list[Sequence[JobStep]], list[LostStep]]:
    """The whole periods of ``period`` steps that hold no lost step (oldest first), and the lost steps of the
    periods left out: a period with a lost step has no rate (its time holds work that produced nothing)."""
    period = max(1, int(period))
    lost = {x.step: x for x in lost_steps(steps)}
    kept, dropped = [], []
    for i in range(0, len(steps) - period + 1, period):
        span = steps[i:i + period]
        gone = [lost[s.step] for s in span if s.step in lost]
        if gone:
            dropped.extend(gone)
        else:
            kept.append(span)
    return kept, dropped


def measured_throughput(steps: Sequence[JobStep]) -> Optional[float]:
    """Samples per second over the steps that are not lost (None: none is measurable)."""
    lost = {x.step for x in lost_steps(steps)}
    return throughput([s for s in steps if s.step not in lost])


def lost_note(lost: Sequence[LostStep]) -> str:
    """``"; 2 lost steps left out (step 41: lost to an OOM …)"`` for a verdict's note, or "" without any."""
    if not lost:
        return ""
    first = lost[0]
    return f"; {len(lost)} lost step{'s' if len(lost) > 1 else ''} left out (step {first.step}: {first.why})"
