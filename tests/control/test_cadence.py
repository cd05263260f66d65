"""Generation every k steps (src/trimtab/control/cadence.py): the period of a TRL ``steps_per_generation`` job is k
steps, read from which steps report generation."""

from __future__ import annotations

from tests.support.plans import RULES, job, steps
from trimtab.control.cadence import generation_every, with_cadence
from trimtab.control.plan import period


def _every(k: int, n: int, first: int = 0, gen_s: float = 1.2) -> list:
    """``n`` steps from ``first``; those at a multiple of ``k`` generate (``gen_s``), the others report 0 s."""
    out = []
    for i in range(first, first + n):
        g = gen_s if i % k == 0 else 0.0
        out += steps(i, 1, step_time=g + 0.1, gen=g, ev=0.0, comm=0.0, samples=8)
    return out


def test_a_job_that_generates_every_k_steps_has_a_period_of_k():
    assert generation_every(_every(4, 16)) == 4
    assert generation_every(_every(3, 12, first=5)) == 3
    assert period(job(sync=2), RULES, _every(4, 16)) == 4  # sync 2 and generation every 4: whole periods of both
    assert period(job(sync=8), RULES, _every(3, 24)) == 24
    assert period(job(sync=2), RULES) == 2 and with_cadence(2, []) == 2  # no steps: the sync interval alone


def test_no_cadence_without_a_schedule_the_steps_show():
    assert generation_every(_every(1, 16)) is None  # every step generates
    assert generation_every(_every(4, 8)) is None  # two generations: one spacing, not yet a schedule
    assert generation_every(steps(0, 16, step_time=1.0, gen=None)) is None  # generation not reported
    irregular = _every(4, 8) + _every(3, 9, first=8)  # generations at 0, 4, 8, 9, 12, 15: spacings 1 and 3
    assert generation_every(irregular) is None
    unreported = _every(4, 16)
    unreported[5] = steps(5, 1, step_time=0.1, gen=None)[0]  # a step between that says nothing
    assert generation_every(unreported) is None
