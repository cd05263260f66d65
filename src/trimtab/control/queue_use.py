"""Whether a deeper queue could change anything: the queue knob (``queue_knob``, prefetch) is raised only where the
queue was ever full.

Why: the generation worker may run ahead of the trainer by as many batches as the queue's depth allows. Where the
job reports the most batches that waited unclaimed in each step (``queue_high_water``) and that mark stayed below
the depth on every step of the window, the depth never held the worker back — it never got that far ahead — so a
deeper queue leaves the job as it was: generation itself is the bottleneck. On the H200 reference pipeline at batch
64 the mark was 1 in every step at prefetch 2 and at 4 (runs 24–26, BENCHMARKS.md); 64/4/4 alternated against
64/2/4 read 86.5 and 102.9 % (runs 6, 8), yet most runs tried prefetch 2 → 4 (read −21 to +11 %) and paid for
the trial in steps. A job that does not report the mark on every step of the window is not held back (no evidence
either way); ``queue_raise_needs_fill = false`` switches this off.
"""

from __future__ import annotations

from typing import Optional, Sequence

from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep

HIGH_WATER = "queue_high_water"  # the step report's field (trimtab.contract.step_report)


def queue_unused(rules: RuleSet, knob: str, current: float, new: float, window: Sequence[JobStep]) -> Optional[str]:
    """Why raising ``knob`` from ``current`` to ``new`` would change nothing (the queue never filled in
    ``window``), else None."""
    if not rules.controller.queue_raise_needs_fill or knob != rules.controller.queue_knob or new <= current:
        return None
    marks = [s.reported.get(HIGH_WATER) for s in window]
    if not marks or any(m is None for m in marks):
        return None
    high = max(marks)
    if high >= current:
        return None
    return (f"the queue never held more than {high:g} of the {current:g} batches its depth allows (steps "
            f"{window[0].step}–{window[-1].step}): generation never got that far ahead, a deeper queue would stay "
            f"empty")
