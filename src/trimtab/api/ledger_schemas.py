"""Response models of ``GET /v1/jobs/{name}/gpu-time``: the job's GPU-time ledger, cell by cell and in totals."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from trimtab.api.schemas_base import Model


class GpuTimeCellOut(Model):
    hostname: str = Field(description="The GPU's node.")
    gpu: int = Field(description="The GPU's NVML index on its node.")
    start_ms: int = Field(description="Start of the interval (epoch ms).")
    end_ms: int = Field(description="End of the interval (epoch ms, exclusive).")
    kind: str = Field(description="busy (a role's phase ran on the GPU) or idle (with a cause).")
    role: str = Field(description="Whose GPU time it is: the role(s) of the process on the GPU ('a+b' when "
                                  "colocated; 'unknown' when no placement names it; '' for no_job).")
    phase: Optional[str] = Field(None, description="busy: the step report's phase (generation, evaluation, update, "
                                                   "validation, checkpoint; 'unreported' for a role that sends no "
                                                   "step reports).")
    cause: Optional[str] = Field(None, description="idle: waiting (for waiting_for), host (host-side work of its "
                                                   "own role), communication (collectives, weight sync), no_job (no "
                                                   "step of the job covered the time), unknown.")
    waiting_for: Optional[str] = Field(None, description="cause waiting: the role waited for (from which GPUs were "
                                                         "busy while this one idled); 'unknown' without samples.")
    gpu_s: float = Field(description="GPU-seconds. Unit: seconds.")
    estimated: bool = Field(description="True when any part was estimated rather than measured (see sources).")
    sources: list[str] = Field(description="What the figure comes from: cuda_events (measured), wall_phase (a "
                                           "phase's wall time taken as GPU time), step_residual, gpu_samples, "
                                           "process_activity (a silent role's share of the GPU's per-process SM "
                                           "utilization × the GPU's utilization: estimated), step_timeline, "
                                           "prorated (a step cut by the interval's "
                                           "edge), scaled (times that added up to more than the wall time).")


class GpuTimeTotalOut(Model):
    hostname: str = Field(description="The GPU's node.")
    gpu: int = Field(description="The GPU's NVML index on its node.")
    kind: str = Field(description="busy or idle, as in cells.")
    role: str = Field(description="Whose GPU time it is, as in cells.")
    phase: Optional[str] = Field(None, description="busy: the phase, as in cells.")
    cause: Optional[str] = Field(None, description="idle: the cause, as in cells.")
    waiting_for: Optional[str] = Field(None, description="cause waiting: the role waited for, as in cells.")
    gpu_s: float = Field(description="GPU-seconds over the whole window. Unit: seconds.")


class GpuTimeOut(Model):
    job: str = Field(description="The job's name.")
    start_ms: int = Field(description="Start of the window (epoch ms).")
    end_ms: int = Field(description="End of the window (epoch ms, exclusive).")
    interval_s: float = Field(description="Length of each interval. Unit: seconds.")
    gpus: list[str] = Field(description="The job's GPUs as node:index.")
    busy_gpu_s: float = Field(description="GPU-seconds busy in the window, all GPUs. Unit: seconds.")
    idle_gpu_s: float = Field(description="GPU-seconds idle in the window, all GPUs. Unit: seconds.")
    wall_gpu_s: float = Field(description="Wall time × GPUs: busy + idle, checked within 1 %. Unit: seconds.")
    totals: list[GpuTimeTotalOut] = Field(description="GPU-seconds per GPU, role, phase or cause over the window.")
    cells: list[GpuTimeCellOut] = Field(description="The same per interval.")
    notes: list[str] = Field(description="What was missing and how it was estimated.")
