"""What a synthetic job of ``bench/workloads.py`` is: a step model (setting, step, rng → step time, phases, samples),
its knobs, a grid of static settings to find its best, how long it runs, and the simulated GPU it runs on (its
memory, another process on it) — with the two step-time shapes the jobs share. The jobs are the
``bench/job_*_models.py`` modules; ``bench/job_models.py`` names them. Step times are simulated seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

GIB = 2**30
GOAL_STEPS = 60          # within 5 % of the best by this step …
TAIL_STEPS = 32          # … and measured over the next 32 (a whole number of periods of sync 1 … 32)
STEPS = GOAL_STEPS + TAIL_STEPS
LIMIT_GIB = 141.0        # the simulated GPU's memory: a setting whose peak is above it OOMs


@dataclass
class Workload:
    name: str
    knobs: dict                                   # name → {value, min, max}
    step: Callable[[dict, int, random.Random], tuple[float, dict, int]]  # (setting, step, rng) → t, phases, samples
    grid: list[dict]                              # static settings to measure
    ranks: int = 1
    memory_gib: Optional[Callable[[dict], float]] = None  # the setting's peak; above LIMIT_GIB it OOMs
    steps: int = STEPS                            # how long the run is (the tail is steps GOAL_STEPS … steps − 1)
    moved_at: Optional[int] = None                # the step where the job itself moves (a slowdown): a value
                                                  # measured worse before it may be tried again after it
    report: Optional[Callable[[], dict]] = None   # more top-level fields of the report of the step just modelled
    neighbour: Optional[Callable[[int], "Neighbour"]] = None  # seed → another process's memory on the GPU; an OOM
                                                  # then halves the batch as the hook does (a lost step, 0 samples)


@dataclass(frozen=True)
class Neighbour:
    """Another process on the job's GPU: it takes ``gib`` from step ``arrives`` until ``leaves`` (None: stays)."""
    arrives: int
    gib: float
    leaves: Optional[int] = None

    def held_gib(self, i: int) -> float:
        return self.gib if self.arrives <= i and (self.leaves is None or i < self.leaves) else 0.0


def learning_declaration(w: Workload) -> dict:
    """The rules override each simulated job registers with: every knob of it throughput-only. A job modelled here
    has step times and no policy — no knob of it changes what is learned, and it reports no learning signal — so it
    says so per knob, the way a real job declares a knob it knows changes only its speed (``[learning]
    throughput_only``). Without it the shipped rules (``without_signals = "advise"``) would only advise its
    prefetch and sync_every moves."""
    return {"learning": {"throughput_only": sorted(w.knobs)}}


def noisy_s(rng: random.Random, t: float, noise: float) -> float:
    """``t`` seconds, off by a uniform share of at most ±``noise`` (0.03: ±3 %)."""
    return t * (1 + rng.uniform(-noise, noise))


def batch_time_s(b: float) -> float:
    """A step's seconds at batch ``b`` on the batch jobs' shared curve: 0.3 s + 30 ms a sample."""
    return 0.3 + 0.03 * b
