"""Heavy steps that recur (src/trimtab/grading/periodic.py): a validation pass or a checkpoint every k steps is the
job's schedule — found from the step times (a spacing that repeats) or named by its phase, and left out of every
window; random stalls and generation every k steps (the knobs' own work) are not."""

from __future__ import annotations

import random

from tests.support.plans import RULES, job, state
from trimtab.control.controller import plan
from trimtab.grading.periodic import heavy_steps, without_heavy
from trimtab.grading.window import JobStep

CTL = RULES.controller


def training(n: int, heavy_every=None, heavy_s: float = 1.8, heavy_phase="validation", stall_phase=None,
             seed: int = 1, step_s: float = 0.2) -> list[JobStep]:
    """``n`` steps of a generation-bound job (85 % generation, ±5 %); every ``heavy_every``-th step carries
    ``heavy_s`` more in ``heavy_phase`` (None: in no phase at all)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = step_s * (1 + rng.uniform(-0.05, 0.05))
        phases = {"generation": 0.85 * t, "update": 0.15 * t}
        extra = heavy_s if heavy_every and (i + 1) % heavy_every == 0 else 0.0
        if extra and heavy_phase:
            phases[heavy_phase] = phases.get(heavy_phase, 0.0) + extra
        end = 1_700_000_000_000 + 1000 * i
        out.append(JobStep(step=i, ranks=1, step_time_s=t + extra, samples=4, phases_s=phases, fragmentation=None,
                           num_ooms=None, collective_latency_us=None, start_ms=end - int((t + extra) * 1000),
                           end_ms=end))
    return out


def test_a_validation_every_20_steps_is_found_by_its_spacing_and_left_out():
    steps = training(100, heavy_every=20, heavy_phase=None)  # reported in no phase: step times alone
    kept, found = without_heavy(steps, CTL.periodic_heavy_x, CTL.periodic_min_repeats)
    assert found is not None and found.every == 20 and found.phase == "other"
    assert found.steps == (19, 39, 59, 79, 99) and len(kept) == 95
    assert "every 20 steps" in found.evidence()["how"]


def test_a_few_heavy_steps_at_one_spacing_are_a_coincidence_unless_the_job_names_their_phase():
    assert CTL.periodic_min_repeats == 4  # as shipped
    assert heavy_steps(training(65, heavy_every=20, heavy_phase=None), CTL.periodic_heavy_x,
                       CTL.periodic_min_repeats) is None  # three of them: 19, 39, 59
    named = heavy_steps(training(45, heavy_every=20, heavy_phase="checkpoint"), CTL.periodic_heavy_x,
                        CTL.periodic_min_repeats)
    assert named is not None and named.steps == (19, 39) and named.phase == "checkpoint" and named.every is None


def test_random_stalls_and_generation_every_k_steps_are_not_left_out():
    rng = random.Random(5)
    stalls = training(150)
    for i in rng.sample(range(150), 5):  # 10× steps at random, in no phase
        s = stalls[i]
        stalls[i] = JobStep(**{**s.__dict__, "step_time_s": s.step_time_s * 10})
    found = heavy_steps(stalls, CTL.periodic_heavy_x, CTL.periodic_min_repeats)
    assert found is None or found.every is None and not found.steps
    trl = training(64, heavy_every=4, heavy_s=1.0, heavy_phase="generation")  # steps_per_generation = 4
    assert heavy_steps(trl, CTL.periodic_heavy_x, CTL.periodic_min_repeats) is None


def test_a_window_half_holding_the_validation_step_no_longer_hides_a_generation_bound_job():
    """20 steps of 0.2 s with one validation step 10× as long: generation is 59 % of the window and 44 % of the half
    that holds it; left out, every training step is 85 % generation and the rule acts."""
    steps = training(60, heavy_every=20, heavy_s=1.8)
    p = plan(state(steps, the_job=job(batch=4)), RULES)
    assert p.change is not None and p.change.rule == "generation_bound", p.note
    assert "validation named by the job's own phase" in p.note and "left out of every window" in p.note
    assert p.evidence["periodic_steps_left_out"]["steps"] == [19, 39, 59]
