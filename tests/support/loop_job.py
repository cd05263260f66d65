"""The job the in-the-loop tests register over HTTP, and one rank-0 report of it (45 s steps, 44 s generating: the
rebalancer raises the batch)."""

from __future__ import annotations

KNOBS = {"batch_size": {"value": 1, "min": 1, "max": 64}, "prefetch": {"value": 0, "min": 0, "max": 8},
         "sync_every": {"value": 1, "min": 1, "max": 8}}
JOB = {"name": "ppo", "ranks": 1, "device_map": {}, "hostnames": ["cpu-box"], "knobs": KNOBS, "mode": "auto"}


def report(step: int, step_time: float = 45.0, gen: float = 44.0) -> dict:
    return {"step": step, "rank": 0, "step_time_s": step_time, "samples": 64,
            "phases": {"generation": gen, "evaluation": 0.5, "update": 0.3, "communication": 0.05}}
