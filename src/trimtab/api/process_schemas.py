"""What ``GET /v1/gpus/{uuid}/processes`` serves: a GPU's process rows over a window, each with its per-process
GPU activity (NVML's per-process utilization samples, or the simulated node's from its scenario)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from trimtab.api.schemas_base import Model

UNKNOWN = "null: unknown (unsupported on this GPU, the first interval after the agent started, or no call answered)."


class ProcessOut(Model):
    ts_ms: int = Field(description="When the process list was read, epoch milliseconds.")
    pid: int = Field(description="Host PID (a simulated node's PIDs lie above any a Linux host gives).")
    used_memory_bytes: Optional[int] = Field(description="GPU memory it used, bytes; null for a process seen busy "
                                                         "that held no context when the list was read.")
    name: Optional[str] = Field(description="Process name (\"simulated <role>\" on a simulated node).")
    sm_util_pct: Optional[float] = Field(description=(
        "Its SM utilization over (util_from_ms, util_to_ms], %: its mean over that whole interval (NVML's "
        "per-process records, each its mean since the agent's previous read, weighted by the time each covers), so "
        "sm_util_pct / 100 × (util_to_ms − util_from_ms) is its busy time; 0 with 0 records: NVML answered for the "
        "interval and never saw it busy; " + UNKNOWN))
    mem_util_pct: Optional[float] = Field(description="Its memory (frame buffer) utilization, %, the same way; "
                                                      + UNKNOWN)
    util_samples: Optional[int] = Field(description="NVML records the means are made of (one per agent read in "
                                                    "which the process was busy). " + UNKNOWN)
    util_from_ms: Optional[int] = Field(description="Start (exclusive) of the interval the activity covers, epoch "
                                                    "ms (NVML's record times). " + UNKNOWN)
    util_to_ms: Optional[int] = Field(description="End (inclusive) of that interval, epoch ms. " + UNKNOWN)


class ProcessesOut(Model):
    gpu_uuid: str = Field(description="The GPU.")
    hostname: str = Field(description="Its node.")
    simulated: bool = Field(description="True when the GPU belongs to a simulated node (its processes and their "
                                        "activity are simulated too).")
    start_ms: int = Field(description="Window start (inclusive), epoch milliseconds.")
    end_ms: int = Field(description="Window end (exclusive), epoch milliseconds.")
    truncated: bool = Field(description="More rows matched than max_rows: these are the latest max_rows.")
    processes: list[ProcessOut] = Field(description="The process rows, oldest first, then by PID.")
