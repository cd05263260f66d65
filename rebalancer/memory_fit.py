"""What a larger batch will need in memory, from what the job has shown: the allocator peak (or reserved bytes)
at each batch size it ran, fitted as a base plus a per-sample slope. With one batch size seen there is no slope
to fit: all of its memory is taken as per-sample (base 0) — an upper bound when memory grows with the batch, so
an uncertain prediction makes a smaller step, never a larger one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from trimtab.rebalancer.rules import ControllerSettings
from trimtab.rebalancer.window import JobStep
from trimtab.store.jobs import StoredChange

GIB = 2**30


def knob_history(changes: Sequence[StoredChange], knob: str, now_value: float):
    """step → the knob's value at that step, from the applied changes (``changes`` newest first)."""
    applied = sorted((c for c in changes if c.knob == knob and c.status == "applied" and c.applied_step is not None),
                     key=lambda c: c.applied_step)

    def at(step: int) -> Optional[float]:
        value = float(applied[0].previous_value) if applied and applied[0].previous_value is not None else None
        if not applied:
            return now_value
        for c in applied:
            if c.applied_step <= step:
                value = float(c.value)
        return value
    return at, {c.applied_step for c in applied}


@dataclass(frozen=True)
class MemoryFit:
    points: dict[float, float]    # batch size → the highest peak seen at it, bytes
    base_bytes: float
    per_sample_bytes: float
    margin_bytes: float
    line_bytes: float             # raise_batch_max_mem_pct of the GPU's capacity
    model: str

    def predict(self, batch: float) -> float:
        return self.base_bytes + self.per_sample_bytes * batch

    def largest_fitting(self) -> float:
        room = self.line_bytes - self.margin_bytes - self.base_bytes
        return math.floor(room / self.per_sample_bytes) if self.per_sample_bytes > 0 else math.inf

    def evidence(self, batch: float) -> dict[str, Any]:
        return {"model": self.model, "batch": batch, "predicted_gib": round(self.predict(batch) / GIB, 3),
                "margin_gib": round(self.margin_bytes / GIB, 3), "line_gib": round(self.line_bytes / GIB, 3),
                "points_gib": {f"{b:g}": round(p / GIB, 3) for b, p in sorted(self.points.items())}}


def fit(steps: Sequence[JobStep], changes: Sequence[StoredChange], knob: str, now_value: float,
        ctl: ControllerSettings) -> Optional[MemoryFit]:
    """The job's memory as a function of ``knob``; None without peaks or a capacity in its reports."""
    at, applied_steps = knob_history(changes, knob, now_value)
    points: dict[float, float] = {}
    totals = []
    for s in steps:
        if s.mem_total_bytes:
            totals.append(s.mem_total_bytes)
        value = at(s.step)
        if s.mem_peak_bytes is None or value is None or s.step in applied_steps:
            continue  # the step a change took effect at ran partly at the old value
        points[value] = max(points.get(value, 0.0), float(s.mem_peak_bytes))
    if not points or not totals:
        return None
    line = min(totals) * ctl.raise_batch_max_mem_pct / 100.0
    margin = min(totals) * ctl.memory_margin_pct / 100.0
    if len(points) == 1:
        [(b, peak)] = points.items()
        return MemoryFit(points, 0.0, peak / b, margin, line, "one batch size seen: all memory per sample (an upper bound)")
    xs, ys = list(points), [points[b] for b in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
    base = my - slope * mx
    residual = max(abs(y - (base + slope * x)) for x, y in zip(xs, ys))
    return MemoryFit(points, base, slope, margin + residual, line,
                     f"base + per-sample slope fitted on {len(points)} batch sizes")
