"""The ingest body: a pydantic mirror of :class:`trimtab.contract.readings.Batch` with the bounds a reading can
plausibly have, so a broken or hostile agent gets a 422 naming the field instead of filling the store with junk.

Metric fields come from ``GPU_METRICS`` / ``HOST_METRICS`` with bounds by unit. Unknown fields are ignored here
(not forbidden as in other bodies): during a rolling upgrade a newer agent may send a metric this server does not
know yet, and dropping that one field is better than refusing every batch of the node.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import ConfigDict, Field, StrictBool, StringConstraints, create_model

from trimtab.contract.readings import (GPU_METRICS, HOST_METRICS, MAX_CLOCK_AHEAD_S, NVLINK_LINK_METRICS, Batch,
                                    MetricSpec, ahead_of_clock_message, first_ahead_of_clock)
from trimtab.api.schemas_base import EVENT_KIND, MAX_INT32, MAX_INT64, NO_NUL, EpochMs, GpuUuid, Hostname, InputModel, \
    Model
from trimtab.contract.kinds import NO_CONTROL_CHARS

SAMPLE_TIME = (f"Sample time, epoch milliseconds; at most {MAX_CLOCK_AHEAD_S} s ahead of the server's clock (422 "
               f"naming the field beyond that).")

# Bounds by unit. Percentages may overshoot 100 a little (GPM ratios of two counters read at slightly different
# instants); counts of bytes fit a BIGINT; every float is finite (allow_inf_nan=False below).
_BOUNDS_BY_UNIT: dict[str, dict[str, float]] = {
    "%": {"ge": 0, "le": 110},
    "bytes": {"ge": 0, "le": MAX_INT64},
    "bytes/s": {"ge": 0, "le": 1e15},
    "W": {"ge": 0, "le": 100_000},
    "°C": {"ge": -100, "le": 300},
    "MHz": {"ge": 0, "le": 1_000_000},
    "bitmask": {"ge": 0, "le": MAX_INT64},
    "": {"ge": 0, "le": 1e9},
}
Label = Annotated[str, StringConstraints(max_length=64, pattern=NO_CONTROL_CHARS)]
Name = Annotated[str, StringConstraints(max_length=255, pattern=NO_CONTROL_CHARS)]


class _BatchPart(InputModel):
    model_config = ConfigDict(extra="ignore")


def _metric_fields(specs: tuple[MetricSpec, ...]) -> dict[str, Any]:
    fields = {}
    for spec in specs:
        bounds = _BOUNDS_BY_UNIT.get(spec.unit, {})
        fields[spec.name] = (Optional[int] if spec.integer else Optional[float], Field(
            None, description=f"{spec.help} Unit: {spec.unit or 'none'}; null = unsupported or not measured.",
            **bounds))
    return fields


class NodeIn(_BatchPart):
    hostname: Hostname = Field(description="The node's host name (its identity in the store).")
    simulated: StrictBool = Field(False, description="True when the readings come from a simulated node.")
    driver_version: Optional[Label] = Field(None, description="NVIDIA driver version.")
    nvml_version: Optional[Label] = Field(None, description="NVML library version.")
    scenario: Optional[Name] = Field(None, description="Scenario of a simulated node.")


class GpuInfoIn(_BatchPart):
    uuid: GpuUuid = Field(description="GPU UUID, unique across nodes.")
    index: int = Field(ge=0, le=4095, description="NVML index on the node.")
    name: Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=NO_CONTROL_CHARS)] = Field(
        description="Product name.")
    memory_total_bytes: Optional[int] = Field(None, ge=0, le=MAX_INT64, description="Framebuffer size, bytes.")
    pcie_max_gen: Optional[int] = Field(None, ge=0, le=64, description="Maximum PCIe generation.")
    pcie_max_width: Optional[int] = Field(None, ge=0, le=64, description="Maximum PCIe link width, lanes.")
    pcie_peak_bytes_per_s: Optional[float] = Field(None, ge=0, le=1e15,
                                                   description="Per-direction PCIe peak, bytes/s.")
    nvlink_link_count: Optional[int] = Field(None, ge=0, le=64, description="Active NVLink links; null: none.")
    gpm_supported: StrictBool = Field(False, description="Whether GPM metrics are available.")


GpuSampleIn = create_model(
    "GpuSampleIn", __base__=_BatchPart, __doc__="One GPU at one instant.",
    gpu_uuid=(GpuUuid, Field(description="The GPU (need not be in this batch's inventory).")),
    ts_ms=(EpochMs, Field(description=SAMPLE_TIME)),
    **_metric_fields(GPU_METRICS))

HostSampleIn = create_model(
    "HostSampleIn", __base__=_BatchPart, __doc__="The host at one instant.",
    ts_ms=(EpochMs, Field(description=SAMPLE_TIME)),
    **_metric_fields(HOST_METRICS))


NvlinkSampleIn = create_model(
    "NvlinkSampleIn", __base__=_BatchPart, __doc__="One NVLink link of one GPU at one instant.",
    gpu_uuid=(GpuUuid, Field(description="The GPU (need not be in this batch's inventory).")),
    ts_ms=(EpochMs, Field(description=SAMPLE_TIME)),
    link=(int, Field(ge=0, le=255, description="NVML's index of the link.")),
    **_metric_fields(NVLINK_LINK_METRICS))


_ACTIVITY = ("over the whole of (util_from_ms, util_to_ms], from NVML's per-process utilization records (each the "
             "process's mean since the agent's previous read, weighted by the time it covers; NVML gives records for "
             "busy processes only); 0 with util_samples 0: NVML answered for the interval and never saw it busy; "
             "null: unknown (unsupported, before the first read that saw a busy process, no read answered), never "
             "0.")


class GpuProcessIn(_BatchPart):
    gpu_uuid: GpuUuid = Field(description="The GPU the process has a context on (or was seen busy on).")
    ts_ms: EpochMs = Field(description=SAMPLE_TIME)
    pid: int = Field(ge=0, le=MAX_INT32, description="Host PID.")
    used_memory_bytes: Optional[int] = Field(None, ge=0, le=MAX_INT64, description=(
        "GPU memory used, bytes; null for a process seen busy that held no context when the list was read."))
    name: Optional[Name] = Field(None, description="Process name.")
    sm_util_pct: Optional[float] = Field(None, ge=0, le=100, description=(
        "The process's SM utilization, %: its mean " + _ACTIVITY))
    mem_util_pct: Optional[float] = Field(None, ge=0, le=100, description=(
        "The process's memory (frame buffer) utilization, %: its mean " + _ACTIVITY))
    util_samples: Optional[int] = Field(None, ge=0, le=MAX_INT32, description=(
        "How many NVML records the means are made of (one per agent read in which the process was busy); null: "
        "unknown."))
    util_from_ms: Optional[EpochMs] = Field(None, description="Start (exclusive) of the interval the activity "
                                                              "covers, NVML's record times (the wall clock), epoch ms; null: unknown.")
    util_to_ms: Optional[EpochMs] = Field(None, description="End (inclusive) of the interval the activity covers, "
                                                            "epoch ms; null: unknown.")


class HealthEventIn(_BatchPart):
    ts_ms: EpochMs = Field(description=f"When, epoch milliseconds; at most {MAX_CLOCK_AHEAD_S} s ahead of the server's "
                                       f"clock.")
    kind: Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=EVENT_KIND)] = Field(
        description="gpu_lost, xid, source_error, spool_dropped (lower-case words joined by _).")
    detail: Annotated[str, StringConstraints(max_length=8192, pattern=NO_NUL)] = Field(
        "", description="Free text.")
    gpu_uuid: Optional[GpuUuid] = Field(None, description="The GPU concerned; null for node-wide events.")
    xid: Optional[int] = Field(None, ge=0, le=MAX_INT32, description="XID number of xid events.")


class BatchIn(_BatchPart):
    """A batch as the agent ships it (``Batch.to_json``): the node and GPU inventory travel with the readings."""

    node: NodeIn = Field(description="The node the readings come from.")
    gpus: list[GpuInfoIn] = Field(default_factory=list, max_length=4096,
                                  description="GPU inventory of the node (may be empty after the first batch).")
    gpu_samples: list[GpuSampleIn] = Field(default_factory=list, description="GPU samples.")  # type: ignore[valid-type]
    host_samples: list[HostSampleIn] = Field(default_factory=list, description="Host samples.")  # type: ignore[valid-type]
    processes: list[GpuProcessIn] = Field(default_factory=list, description="Processes on the GPUs.")
    events: list[HealthEventIn] = Field(default_factory=list, description="Health events.")
    nvlink_samples: list[NvlinkSampleIn] = Field(  # type: ignore[valid-type]
        default_factory=list, description="Per-link NVLink readings (none for GPUs without NVLink).")
    sent_ms: Optional[EpochMs] = Field(None, description="The node's wall clock when it sent this batch, epoch ms: "
                                                         "the server's clock minus this is the node's clock skew "
                                                         "(GET /v1/nodes). Null: not measured.")

    def row_count(self) -> int:
        return (len(self.gpu_samples) + len(self.host_samples) + len(self.processes) + len(self.events)
                + len(self.nvlink_samples))

    def too_far_ahead(self, now_ms: int) -> Optional[tuple[tuple, str]]:
        """(loc, message) of the first timestamp more than MAX_CLOCK_AHEAD_S past ``now_ms``, else None
        (:func:`~trimtab.contract.readings.first_ahead_of_clock`, the rule an agent writing a store also applies)."""
        ahead = first_ahead_of_clock(self, now_ms)
        if ahead is None:
            return None
        part, i, ts_ms = ahead
        return ("body", part, i, "ts_ms"), ahead_of_clock_message(ts_ms, now_ms)

    def to_batch(self) -> Batch:
        return Batch.from_dict(self.model_dump(exclude={"sent_ms"}))


class IngestOut(Model):
    inserted: int = Field(description="Rows newly stored (all tables).")
    duplicates: int = Field(description="Rows already stored (a replayed batch has inserted = 0).")
    gpu_samples_inserted: int = Field(description="New GPU samples.")
    host_samples_inserted: int = Field(description="New host samples.")
    processes_inserted: int = Field(description="New process rows.")
    events_inserted: int = Field(description="New health events.")
    nvlink_samples_inserted: int = Field(description="New per-link NVLink readings.")
