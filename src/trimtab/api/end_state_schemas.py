"""Response model of a job's end state (``GET /v1/jobs/{name}``'s ``end_state``): each GPU's utilization band, the
step time's variation and the scaling efficiency against the job's own history, and the word
(trimtab.grading.end_state)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from trimtab.api.schemas_base import Model


class GpuBandOut(Model):
    hostname: str = Field(description="The GPU's node.")
    gpu: int = Field(description="The GPU's NVML index on its node.")
    role: str = Field(description="The role placed on it ('a+b' colocated; 'unknown' where nothing names one).")
    mean_util_pct: Optional[float] = Field(description="Mean NVML utilization over the window; null: no samples. "
                                                       "Unit: percent.")
    samples: int = Field(description="Utilization samples in the window.")
    band: Literal["below", "in", "above", "unknown"] = Field(
        description="Against the band end_state_util_low_pct–end_state_util_high_pct (rules.toml; 60–75 % shipped).")


class ScalingOut(Model):
    efficiency: Optional[float] = Field(description="Samples/s per GPU at the larger GPU count divided by samples/s "
                                                    "per GPU at the smaller (1.0: linear); null: no baseline.")
    gpus: Optional[int] = Field(description="GPUs the window's steps ran on (distinct node, local_gpu of its ranks).")
    samples_per_s_per_gpu: Optional[float] = Field(description="The window's samples/s divided by its GPUs.")
    baseline_gpus: Optional[int] = Field(description="The other GPU count compared with: the smallest one among the "
                                                     "job's own newest end_state_history_steps steps in the store.")
    baseline_samples_per_s_per_gpu: Optional[float] = Field(description="The job's samples/s per GPU at that count.")
    baseline_steps: int = Field(description="Steps the baseline was measured over.")
    source: str = Field(description="Where the baseline came from, or 'unknown: <why>'. Never invented.")


class EndStateOut(Model):
    status: Literal["at_end_state", "not_yet", "unknown"] = Field(
        description="at_end_state: every GPU in the band, step time varying under the goal, and scaling at least "
                    "its goal where a baseline is known; not_yet: a part misses (word says which); unknown: a part "
                    "has no data.")
    word: str = Field(description="'at end state' (with '(scaling unknown: no baseline)' without one), 'not yet: "
                                  "…' or 'unknown: …', naming the numbers.")
    window_s: float = Field(description="The window judged: the job's last end_state_window_s seconds up to its "
                                        "newest report. Unit: seconds.")
    start_ms: Optional[int] = Field(description="Start of the window (epoch ms).")
    end_ms: Optional[int] = Field(description="End of the window (epoch ms): the newest report, or now.")
    util_band_pct: list[float] = Field(description="[low, high] of the utilization band. Unit: percent.")
    step_cv_max_pct: float = Field(description="The goal: step time's coefficient of variation below this. Unit: "
                                               "percent.")
    scaling_min_pct: float = Field(description="The goal: scaling efficiency at least this. Unit: percent.")
    gpus: list[GpuBandOut] = Field(description="Each of the job's GPUs with its band.")
    steps: int = Field(description="Steps in the window.")
    step_time_cv_pct: Optional[float] = Field(description="Sample standard deviation / mean of the window's step "
                                                          "times (each step's slowest rank); null: fewer than 3 "
                                                          "steps. Unit: percent.")
    step_time_mean_s: Optional[float] = Field(description="Mean step time over the window. Unit: seconds.")
    scaling: Optional[ScalingOut] = Field(description="Scaling efficiency against the job's own history.")
