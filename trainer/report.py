"""A step report (one rank, one step) and its wire form: exactly the API's ``ReportIn`` fields, nothing else.

The API refuses unknown fields (a typo must not pass silently), so what the hook knows beyond the schema —
samples/s, the component, GPU phase time, the probe's baseline, the OOM'd batch size — stays on the report for
local readers (``hook.last_report``) and is left out of ``to_wire()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from trimtab.trainer.wire import PHASES, WIRE_KEYS

MAX_SECONDS = 1e7  # the API's bound on a duration
MAX_LOGGED, MAX_LOGGED_KEY = 64, 128  # the API's bounds on a report's ``logged`` scalars
FRAMEWORK_FIELDS = ("prompts", "completions", "completion_mean_tokens", "reward_mean", "logged")


def _seconds(x: Any) -> Optional[float]:
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return min(float(x), MAX_SECONDS)


def _finite(x: Any) -> Optional[float]:
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or abs(x) > 1e300:
        return None
    return float(x)


def logged_scalars(logs: Any) -> dict[str, float]:
    """A framework's logged values as the API takes them: finite numbers under printable names (≤ 128 chars),
    at most 64 (the rest, by name, are left out rather than have the whole report refused)."""
    out = {}
    for key, value in sorted((logs or {}).items(), key=lambda kv: str(kv[0])):
        key, value = str(key), _finite(value)
        if value is not None and 0 < len(key) <= MAX_LOGGED_KEY and key.isprintable() and len(out) < MAX_LOGGED:
            out[key] = value
    return out


def _count(x: Any) -> Optional[int]:
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return int(round(x))


@dataclass
class StepReport:
    step: int
    rank: int
    step_time_s: float
    phases_s: dict[str, float] = field(default_factory=dict)
    samples: Optional[int] = None
    tokens: Optional[int] = None
    pid: Optional[int] = None
    hostname: Optional[str] = None
    local_gpu: Optional[int] = None
    memory: Optional[dict] = None
    collective_latency_us: Optional[float] = None
    rollout_slowest_s: Optional[float] = None  # the slowest sample's generation time (long tail)
    rollout_mean_s: Optional[float] = None
    # What the framework logged for the step (RL trainers such as TRL's): see FRAMEWORK_FIELDS.
    prompts: Optional[int] = None
    completions: Optional[int] = None
    completion_mean_tokens: Optional[float] = None
    reward_mean: Optional[float] = None
    logged: Optional[dict[str, float]] = None
    # Local only (not in the API's schema):
    component: Optional[str] = None
    collective_baseline_us: Optional[float] = None
    gpu_phases_s: dict[int, dict[str, float]] = field(default_factory=dict)  # earlier steps, resolved now
    oom: Optional[dict] = None  # {"ooms": count, "failed_batch_size": n, "new_batch_size": n}

    @property
    def samples_per_s(self) -> Optional[float]:
        return self.samples / self.step_time_s if self.samples is not None and self.step_time_s > 0 else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.tokens / self.step_time_s if self.tokens is not None and self.step_time_s > 0 else None

    def to_wire(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/jobs/{name}/reports``; absent values are omitted, never sent as 0."""
        body: dict[str, Any] = {"step": int(self.step), "rank": int(self.rank),
                                "step_time_s": _seconds(self.step_time_s) or 0.0}
        phases = {p: _seconds(self.phases_s.get(p)) for p in PHASES}
        body["phases"] = {p: s for p, s in phases.items() if s is not None}
        for key in ("samples", "tokens", "prompts", "completions"):
            value = _count(getattr(self, key))
            if value is not None:
                body[key] = value
        if self.memory:
            memory = {k: self.memory[k] for k in WIRE_KEYS if self.memory.get(k) is not None}
            if memory:
                body["memory"] = memory
        for key in ("rollout_slowest_s", "rollout_mean_s"):
            seconds = _seconds(getattr(self, key))
            if seconds is not None:
                body[key] = seconds
        if _seconds(self.completion_mean_tokens) is not None:
            body["completion_mean_tokens"] = min(_seconds(self.completion_mean_tokens), 1e9)
        if _finite(self.reward_mean) is not None:
            body["reward_mean"] = _finite(self.reward_mean)
        logged = logged_scalars(self.logged)
        if logged:
            body["logged"] = logged
        latency = _seconds(self.collective_latency_us)
        if latency is not None:
            body["collective_latency_us"] = latency
        for key in ("pid", "hostname", "local_gpu"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        return body
