"""Generation every k steps (TRL's ``steps_per_generation``): one step generates, the k − 1 after it train on what it
made. The period of such a job is k steps, whatever its sync interval says.

Why: a verdict's sample is one throughput per period, and a period of one step there is a step that generates
(1.7 s at batch 4 on the bench's job) or one that does not (0.07 s): the periods' spread is the schedule, not the
setting's noise. A batch raise worth ×3 read "inconclusive, 95 % sure" and its before window "not settled" (a trend
through periods that alternate long and short), and was sent back to be measured again; the job reached its best
at step 69. Over whole periods of k steps every period holds one generation, and the spread is the noise again.

Read from the steps the job reports: generation > 0 on some steps and 0 on the others (steps that do not report
the phase say nothing), the newest ``MIN_REPEATS`` + 1 generating steps spaced alike, k ≥ 2 apart, with the
steps between them reporting no generation. A job whose generation comes at no one spacing keeps its period.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from trimtab.grading.window import JobStep

MIN_REPEATS = 3  # spacings alike in a row: two could be chance (one slow step among idle ones), three are a schedule


def generation_every(steps: Sequence[JobStep]) -> Optional[int]:
    """k where the newest steps generate once every k (k ≥ 2) and report no generation between, else None."""
    timed = [s for s in steps if s.phases_s.get("generation") is not None]
    generating = [s.step for s in timed if s.phases_s["generation"] > 0]
    if len(generating) < MIN_REPEATS + 1 or len(generating) == len(timed):
        return None
    newest = generating[-(MIN_REPEATS + 1):]
    gaps = {b - a for a, b in zip(newest, newest[1:])}
    if len(gaps) != 1:
        return None
    k = gaps.pop()
    idle = [s for s in timed if newest[0] < s.step < newest[-1] and s.phases_s["generation"] == 0]
    if k < 2 or len(idle) != MIN_REPEATS * (k - 1):  # every step between reported, and reported no generation
        return None
    return k


def with_cadence(every: int, steps: Sequence[JobStep]) -> int:
    """The period ``every`` steps (the sync interval) stretched to whole generation periods where the steps show
    one: the least common multiple of the two."""
    k = generation_every(steps) if steps else None
    return every if k is None else every * k // math.gcd(every, k)
