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
:func:`trimtab.trainer.adapters.verl_staleness.versions_ahead`), where the same test keeps a rollouter that never
reached its bound — generating one sample at a time slower than the trainer takes them — from a higher one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from trimtab.control.plan import last_applied
from trimtab.control.settle import drain_end, settled_from
from trimtab.grading.rules import RuleSet
from trimtab.grading.window import JobStep
from trimtab.store.changes import StoredChange

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


def own_verdict_from(change: StoredChange, rules: RuleSet, steps: Sequence[JobStep]) -> int:
    """The first step of ``change``'s own after window: ``settled_from``, and for a raise of the queue knob made
    while the queue was full — the job's mark on the last step at the old depth reached that depth — the drain too
    (``drain_end``, as a move of another knob waits for it).

    Why: the check above lets a raise go right after the queue filled, so such a raise lands on a full queue: the
    trainer takes the banked batches without waiting while its before window, a stretch of the job's bursts,
    holds its waits — the after window's first steps read the bank, not the deeper setting (the bursty bounded
    queue: +37.8 % "99.7 % sure" kept for a 1 % effect). A raise made with room left in the queue, and every job that
    does not report the mark, is judged from its settle step as before."""
    start = settled_from(change, rules)
    ctl = rules.controller
    if change.knob != ctl.queue_knob or change.previous_value is None or change.applied_step is None \
            or not float(change.value) > float(change.previous_value) > 0:
        return start
    last = next((s for s in reversed(steps) if s.step < change.applied_step), None)  # steps: oldest first
    mark = last.reported.get(HIGH_WATER) if last is not None else None
    if mark is None or mark < float(change.previous_value):
        return start
    return drain_end(change, rules)
