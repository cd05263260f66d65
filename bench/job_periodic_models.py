"""Synthetic jobs with steps that recur unlike the rest (issue 38): a heavy step every n (a validation pass, a
checkpoint), and one generation step then k − 1 training steps (TRL's ``steps_per_generation``). A window that does
not hold whole periods reads a period's phase as the knob's doing.
"""

from __future__ import annotations

from bench.synthetic_job import Workload, noisy_s


def periodic_heavy(every: int = 20, x: float = 10.0, phase: str = "validation") -> Workload:
    """A generation-bound batch job (0.15 s + 12.5 ms a sample, ±5 %: batch 4 → 64, the job's max, pays 3.4×) with a
    heavy step every ``every`` steps: a validation pass (or a checkpoint save) inside the step, ``x`` times the
    step at the starting batch, whatever the batch (``trainer.test_freq``, ``eval_steps``, ``save_steps``). The
    knob does nothing to the heavy step; a window at batch 4 (4 s: 20 steps) holds one, and half of it holds it."""
    extra_s = (x - 1.0) * (0.15 + 0.0125 * 4)

    def step(k, i, rng):
        b = int(k["batch_size"])
        train = noisy_s(rng, 0.15 + 0.0125 * b, 0.05)
        heavy = extra_s if (i + 1) % every == 0 else 0.0
        phases = {"generation": 0.85 * train, "update": 0.15 * train, **({phase: heavy} if heavy else {})}
        return train + heavy, phases, b
    return Workload(f"periodic {phase} every {every} steps ({x:g}× a step)",
                    {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)], steps=160)


def generation_every(k: int = 4) -> Workload:
    """One generation step, then k − 1 training steps on what it made (TRL's ``steps_per_generation``): the step
    that generates takes 1.2 s + 40 ms a sample (decode) beside its training, each step trains 0.05 s + 6 ms a
    sample, all ±10 %; every step trains ``batch_size`` samples. Step times alternate one long, k − 1 short: a
    window that does not hold whole periods of k holds one generation more or less than its neighbour (at batch 4:
    1.66 s against 0.07 s). Generation is a phase the batch acts on — the job's work, not its schedule — so its
    steps stay in every window. Best at the max, 64 (samples/s rising 4.8× from batch 4)."""
    def step(kn, i, rng):
        b = int(kn["batch_size"])
        train = noisy_s(rng, 0.05 + 0.006 * b, 0.1)
        gen = noisy_s(rng, 1.2 + 0.04 * b, 0.1) if i % k == 0 else 0.0
        return gen + train, {"generation": gen, "update": train}, b
    return Workload(f"generation every {k} steps (TRL steps_per_generation)",
                    {"batch_size": {"value": 4, "min": 1, "max": 64}}, step,
                    [{"batch_size": b} for b in (4, 8, 16, 32, 64)], steps=160)
