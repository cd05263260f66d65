"""Synthetic jobs whose memory is the point (issues 15 and 38): a peak that grows with the batch on the 141 GiB
GPU, and another process arriving on the GPU mid-run (alone, and with a second knob).
"""

from __future__ import annotations

import random

from bench.synthetic_job import LIMIT_GIB, Neighbour, Workload, batch_time_s, noisy_s


def memory_growing() -> Workload:
    """2 GiB + 3 GiB per sample on a 141 GiB GPU (46 fits); throughput rises with the batch all the way."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = noisy_s(rng, batch_time_s(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b
    return Workload("memory-growing (3 GiB/sample, 141 GiB)", {"batch_size": {"value": 1, "min": 1, "max": 128}},
                    step, [{"batch_size": b} for b in (1, 4, 16, 32, 40, 46)],
                    memory_gib=lambda k: 2.0 + 3.0 * k["batch_size"])


def neighbour() -> Workload:
    """A generation-bound job (0.3 s + 30 ms a sample, ±3 %) whose memory grows 1.5 GiB a sample (2 GiB base) on
    the 141 GiB GPU, reporting its allocator's peak and reserved bytes and the GPU's free memory every step. At a
    step drawn per run from its random seed (40–80) another process takes 5–50 % of the GPU, and in half the runs
    leaves 60–100 steps later. Where the job's peak no longer fits beside it the step OOMs and the batch is halved
    from the next step, as the hook does (the batch never goes back above the size that failed). Scored on the
    steps the neighbour is there: OOMs after the first, steps until the batch fits under the line beside it, throughput
    against the best static setting that is safe beside it (``bench/workloads.py: neighbour_score``)."""
    def step(k, i, rng):
        b = int(k["batch_size"])
        t = noisy_s(rng, batch_time_s(b), 0.03)
        return t, {"generation": 0.9 * t, "update": 0.1 * t}, b

    def arrival(seed: int) -> Neighbour:
        rng = random.Random(seed * 7919 + 38)
        arrives, share = rng.randint(40, 80), rng.uniform(0.05, 0.5)
        return Neighbour(arrives, round(share * LIMIT_GIB, 1), arrives + rng.randint(60, 100) if rng.random() < 0.5
                         else None)
    return Workload("neighbour takes 5–50 % of the GPU (1.5 GiB/sample)",
                    {"batch_size": {"value": 4, "min": 1, "max": 128}}, step,
                    [{"batch_size": b} for b in range(4, 96, 4)], memory_gib=lambda k: 2.0 + 1.5 * k["batch_size"],
                    steps=220, neighbour=arrival)


def mix() -> Workload:
    """Two knobs on one job, and a neighbour: the noisy communication-bound ladder (sync_every) on a job whose
    generation grows with the batch (memory 2 GiB + 1.5 GiB a sample), another process arriving as in
    ``neighbour``."""
    def step(k, i, rng):
        b, sync = int(k["batch_size"]), int(k["sync_every"])
        comm = 0.5 if (i + 1) % sync == 0 else 0.0
        compute = noisy_s(rng, batch_time_s(b), 0.1)
        t = compute + comm
        return t, {"generation": 0.9 * compute, "update": 0.1 * compute,
                   **({"communication": comm} if comm else {})}, b
    w = neighbour()
    return Workload("mix: batch and sync, a neighbour arrives", {"batch_size": {"value": 4, "min": 1, "max": 128},
                                                                 "sync_every": {"value": 1, "min": 1, "max": 32}},
                    step, [{"batch_size": b, "sync_every": s} for b in range(8, 96, 8) for s in (1, 4, 16, 32)],
                    memory_gib=w.memory_gib, steps=220, neighbour=w.neighbour)
