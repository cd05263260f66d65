"""Where a change's setting starts to be measured: the steps right after a change took effect are the change
landing, not the setting running.

``settle_steps`` (1) covers a queue refilling or an allocator growing. A raise of the queue knob (``queue_knob``,
the prefetch depth) needs more: while the change lands the worker runs ahead into the deeper queue, and the steps
after it drain that bank and read faster than the setting runs. On the H200 pipeline the 7 steps after prefetch
0 → 2 read 8–20 % above the same setting later, in all four runs where it was looked at (runs 17–20,
BENCHMARKS.md), and a sync trial measured against those steps was sent back in three of them. The bank is the
raise's depth in batches and each step drains a share of a batch, so the drain lasts a number of *steps* per unit
raised, whatever a step's duration: ``queue_raise_settle_steps`` more settle steps per unit. A cut leaves no bank.

Off in the shipped rules (0) until it is measured on the H200 (``bench/queue_settle.toml`` turns it on for a run):
on the CPU workloads, whose jobs bank nothing, 4 a unit only delays every prefetch move and its verdict: 5 of 360
goals lost on seeds 1–30 and 3 on the held-out 61–90 (the noisy job's slowdown met later, the regime host's after
windows landing in the next regime more often).
"""

from __future__ import annotations

import math
from typing import Optional

from trimtab.grading.rules import RuleSet
from trimtab.store.jobs import StoredChange


def settle_steps_after(change: StoredChange, rules: RuleSet) -> int:
    """How many steps after ``change`` took effect are its landing (not measured as its setting, nor as the
    baseline of the next move)."""
    ctl = rules.controller
    raised = _raised_by(change) if change.knob == ctl.queue_knob else 0.0
    return ctl.settle_steps + math.ceil(raised * ctl.queue_raise_settle_steps)


def settled_from(change: StoredChange, rules: RuleSet) -> int:
    """The first step that measures ``change``'s setting (its applied step plus its settle steps)."""
    return int(change.applied_step or 0) + settle_steps_after(change, rules)


def _raised_by(change: StoredChange) -> float:
    old: Optional[float] = change.previous_value
    if old is None or change.value is None:
        return 0.0
    return max(0.0, float(change.value) - float(old))
