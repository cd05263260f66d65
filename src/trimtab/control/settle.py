"""Where a change's setting starts to be measured: the steps right after a change took effect are the change
landing, not the setting running.

``settle_steps`` (1) covers a queue refilling or an allocator growing. A raise of the queue knob (``queue_knob``,
the prefetch depth) needs more before a move of *another* knob: while the raise lands the worker runs ahead into
the deeper queue, and the steps after it drain that bank and read faster than the setting runs. On the H200
pipeline the 7 steps after prefetch 0 → 2 read 8–20 % above the same setting later, in all four runs where it was
looked at (runs 17–20, BENCHMARKS.md), and a sync trial measured against those steps was sent back in three of them.
The bank is the raise's depth in batches and each step drains a share of a batch, so the drain lasts a number of
*steps* per unit raised, whatever a step's duration: ``queue_raise_settle_steps`` (4) more steps per unit before a
move of another knob may start, and before its baseline does. A cut leaves no bank.

Only a move of another knob waits. The raise's own verdict reads the drain as part of its gain (flattered, on a job
where the raise pays, not turned around), and a move of the queue knob itself is measured as it always was: a wait
there bought nothing on the CPU workloads, which bank nothing, and cost them 5 and 3 goals of 360 (seeds 1–30,
61–90: the noisy job's slowdown met later; the regime host's after windows, further from their before windows,
landing in another regime: false gains 5 → 9 and 6 → 12). A job whose only moving knob is the queue decides exactly
as without the settle. On the H200 (runs 21–23, the settle then also on the raise's own verdict) every sync trial
after the raise waited for the setting's own steps and was kept: 103.9, 98.0, 109.1 % of the best static paired,
against 88.4–102.5 % in runs 17–20 without it. ``bench/queue_settle_off.toml`` turns it off. One exception, for
jobs that report their queue's mark: a raise made while the queue was full is judged after its drain too
(:func:`trimtab.control.queue_use.own_verdict_from`) — there the after window would start on the full bank.
"""

from __future__ import annotations

import math
from typing import Optional

from trimtab.grading.rules import RuleSet
from trimtab.store.changes import StoredChange


def settled_from(change: StoredChange, rules: RuleSet) -> int:
    """The first step that measures ``change``'s setting for its own verdict and the job's persistence: its
    applied step plus ``settle_steps``."""
    return int(change.applied_step or 0) + rules.controller.settle_steps


def drained_from(change: StoredChange, rules: RuleSet, knob: str) -> int:
    """The first step a move of ``knob`` after ``change`` may be judged against: ``settled_from``, and after a
    raise of the queue knob, when ``knob`` is another knob, its drain too (``queue_raise_settle_steps`` a unit)."""
    ctl = rules.controller
    if change.knob != ctl.queue_knob or knob == ctl.queue_knob:
        return settled_from(change, rules)
    return drain_end(change, rules)


def drain_end(change: StoredChange, rules: RuleSet) -> int:
    """``settled_from``, plus the drain of a raise of the queue knob (``queue_raise_settle_steps`` a unit)."""
    return settled_from(change, rules) + math.ceil(_raised_by(change) * rules.controller.queue_raise_settle_steps)


def _raised_by(change: StoredChange) -> float:
    old: Optional[float] = change.previous_value
    if old is None or change.value is None:
        return 0.0
    return max(0.0, float(change.value) - float(old))
