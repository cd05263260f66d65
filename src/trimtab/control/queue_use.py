"""Whether a deeper queue could change anything: the queue knob (``queue_knob``, prefetch) is raised only where the
queue was ever full at its depth.

Why: the generation worker may run ahead of the trainer by as many batches as the queue's depth allows. Where the
job reports the most batches that waited unclaimed in each step (``queue_high_water``) and that mark stayed below
the depth on every step the job ran at that depth (since it was set, after its settle step), the depth never held
the worker back — it never got that far ahead — so a deeper queue leaves the job as it was: generation itself is
the bottleneck. On the H200 reference pipeline at batch 64 the mark was 1 in every step at prefetch 2 and at 4
(runs 24–26, BENCHMARKS.md); 64/4/4 alternated against 64/2/4 read 86.5 and 102.9 % (runs 6, 8), yet most runs
tried prefetch 2 → 4 (read −21 to +11 %) and paid for the trial in steps. Every step at the depth, not only the
window the rules read: a job whose generation comes in bursts fills its queue now and then, and a calm window of
it says less. A job that does not report the mark on every such step is not held back (no evidence either way);
``queue_raise_needs_fill = false`` switches this off. The mark is in the queue knob's own unit: batches for the
reference pipeline, parameter versions ahead for verl's fully-async rollouter (its staleness bound,
:func:`trimtab.trainer.adapters.verl_async.versions_ahead`), where the same test keeps a rollouter that never
reached its bound — generating one sample at a time slower than the trainer takes them — from a higher one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from trimtab.control.plan import last_applied
from trimtab.control.settle import settled_from
from trimtab.grading.rules import RuleSet

if TYPE_CHECKING:
    from trimtab.control.plan import JobState

HIGH_WATER = "queue_high_water"  # the step report's field (trimtab.contract.step_report)


def queue_unused(state: "JobState", rules: RuleSet, knob: str, current: float, new: float) -> Optional[str]:
    """Why raising ``knob`` from ``current`` to ``new`` would change nothing (the queue never filled at its depth
    in the steps the job ran at it), else None."""
    ctl = rules.controller
    if not ctl.queue_raise_needs_fill or knob != ctl.queue_knob or new <= current:
        return None
    set_at = last_applied(state, knob)
    since = settled_from(set_at, rules) if set_at is not None else 0
    at_depth = [s for s in state.steps if s.step >= since]
    marks = [s.reported.get(HIGH_WATER) for s in at_depth]
    if not marks or any(m is None for m in marks):
        return None
    high = max(marks)
    if high >= current:
        return None
    return (f"the queue never held more than {high:g} of the {current:g} its depth allows (steps "
            f"{at_depth[0].step}–{at_depth[-1].step}): generation never got that far ahead, a deeper queue would "
            f"stay empty")
