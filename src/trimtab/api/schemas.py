"""Response models of the node reads (health, nodes, GPUs, samples, events).

Response models carry no input bounds: a store can hold what an older agent or a direct-to-store agent wrote,
and an out-of-range stored value must not turn a read into a 500. Metric fields are generated from
``GPU_METRICS``, so the API documents each metric's unit where the agent defines it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field, create_model

from trimtab.api.schemas_base import Model, PageOut
from trimtab.contract.readings import GPU_METRICS


def _metric_model(name: str, doc: str, integers: bool) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for spec in GPU_METRICS:
        typ = Optional[int] if integers and spec.integer else Optional[float]
        fields[spec.name] = (typ, Field(None, description=f"{spec.help} Unit: {spec.unit or 'none'}. "
                                                            "null: unsupported by this GPU or not measured."))
    return create_model(name, __base__=Model, __doc__=doc, **fields)


GpuMetrics = _metric_model("GpuMetrics", "Every per-GPU metric at one instant, by name (unit in the name).", True)
GpuMetricMeans = _metric_model("GpuMetricMeans", "Every per-GPU metric averaged over a bucket.", False)


# -- health --------------------------------------------------------------------------------------------------


class PlanningFailureOut(Model):
    job: str = Field(description="The job the rebalancer fails to plan.")
    since_ms: Optional[int] = Field(description="Its first failure in a row, epoch milliseconds.")
    failures: int = Field(description="Failures in a row.")
    error: str = Field(description="The last one: type: message (while <stage>, step N; where).")
    retry_at_ms: Optional[int] = Field(description="When it is planned again (exponential backoff).")


class HealthOut(Model):
    status: Literal["ok", "degraded", "failed"] = Field(
        description="ok; degraded when the store cannot be reached (an outage: it may come back; HTTP 503) or when "
                    "the rebalancer fails to plan a live job (planning_failures names it; HTTP 200: the API serves, "
                    "a restart would not plan that job either), or when a node's clock is off or its batches are "
                    "refused for it (this server works: HTTP 200, see `clocks`); failed when a component refuses to "
                    "go on as configured (see its `failed` text: fix the configuration).")
    planning_failures: list[PlanningFailureOut] = Field(
        default_factory=list, description="The live jobs (reported within 10 minutes, mode not off) whose plans "
                                          "raise now, by name: GET /v1/jobs/{name} has the error and its events.")
    store_reachable: bool = Field(description="Whether a trivial query on the store succeeded just now.")
    version: str = Field(description="trimtab's version.")
    mode: Literal["up", "server"] = Field(description="up: one node (agent in this process); server: a head node.")
    simulated: bool = Field(description="True when any node known to this process is a simulated node.")
    uptime_s: float = Field(description="Seconds since the API context was created.")
    components: dict[str, Any] = Field(description="Status of the parts around the API (agent, writer, rebalancer).")
    clocks: list[str] = Field(default_factory=list, description="One line per node heard from in the last 5 minutes "
                                                                "whose clock is off by more than 5 s or whose batches "
                                                                "were refused for it: the node, its skew, what to do.")


# -- nodes and GPUs ------------------------------------------------------------------------------------------


class NodeOut(Model):
    hostname: str = Field(description="The node's host name as its agent reports it (simulated nodes end in -sim).")
    simulated: bool = Field(description="True for a simulated node: its numbers are synthetic, not from a GPU.")
    scenario: Optional[str] = Field(description="The simulated node's scenario (balanced, actor-hot, …); null otherwise.")
    driver_version: Optional[str] = Field(description="NVIDIA driver version; null on simulated nodes or if unknown.")
    nvml_version: Optional[str] = Field(description="NVML library version; null when unknown.")
    first_seen_ms: int = Field(description="Time of the node's oldest stored reading, epoch milliseconds.")
    last_seen_ms: int = Field(description="Time of its newest stored reading (refreshed once a minute), epoch ms.")
    gpu_count: int = Field(description="GPUs the store knows on this node.")
    heard_ms: Optional[int] = Field(None, description="When a batch of it last reached a writer of the store, by the "
                                                      "writer's clock (at most a minute old while it sends; also when "
                                                      "the batch was refused), epoch ms; null: not recorded.")
    clock_skew_s: Optional[float] = Field(None, description="The receiver's clock minus the node's, seconds (a "
                                                            "server's against the clock the batch was sent at; an "
                                                            "agent writing the store itself, the store's): > 0 the "
                                                            "node is behind. Null: not measured.")
    clock_off: bool = Field(False, description="True when |clock_skew_s| exceeds MAX_CLOCK_SKEW_S (5 s): its samples "
                                               "sit that far off in every window (/healthz is degraded).")
    clock_refused_ms: Optional[int] = Field(None, description="When a batch of it was last refused for being dated "
                                                              "ahead of the receiver's clock, epoch ms; null: never.")
    clock_refused_detail: Optional[str] = Field(None, description="Why, in the ingest's words.")


class NodesOut(Model):
    simulated: bool = Field(description="True when any listed node is simulated.")
    nodes: list[NodeOut] = Field(description="Every node in the store, by host name.")


class LatestOut(Model):
    ts_ms: int = Field(description="Sample time, epoch milliseconds.")
    age_s: float = Field(description="Seconds between the sample and this response.")
    pcie_pct_of_peak: Optional[float] = Field(
        description="max(PCIe TX, RX) as % of the link's per-direction peak; null when either is unknown.")
    metrics: GpuMetrics = Field(description="The sample's metrics; null ones are unsupported or not measured.")


class GpuOut(Model):
    hostname: str = Field(description="The node the GPU is in.")
    simulated: bool = Field(description="True when the GPU belongs to a simulated node.")
    uuid: str = Field(description="The GPU's UUID (GPU-…), unique across nodes.")
    index: int = Field(description="NVML index on its node; -1 while only samples (no inventory) have arrived.")
    name: str = Field(description="Product name, e.g. NVIDIA H200.")
    memory_total_bytes: Optional[int] = Field(description="Framebuffer size in bytes.")
    pcie_max_gen: Optional[int] = Field(description="Maximum PCIe generation of the link.")
    pcie_max_width: Optional[int] = Field(description="Maximum PCIe link width (lanes).")
    pcie_peak_bytes_per_s: Optional[float] = Field(description="Per-direction PCIe peak from max gen × width, bytes/s.")
    nvlink_link_count: Optional[int] = Field(description="Active NVLink links; null: no NVLink or unsupported.")
    gpm_supported: Optional[bool] = Field(description="Whether GPM metrics (SM/tensor activity) are available.")
    latest: Optional[LatestOut] = Field(description="The newest sample if one arrived in the last 300 s, else null.")


class GpusOut(Model):
    simulated: bool = Field(description="True when any listed GPU belongs to a simulated node.")
    gpus: list[GpuOut] = Field(description="GPUs by node and index.")


class PointOut(Model):
    ts_ms: int = Field(description="Sample time (raw) or bucket start (1m, 1h), epoch milliseconds.")
    n: int = Field(description="Raw samples behind the point (1 for raw points).")
    mean: GpuMetricMeans = Field(description="The sample's values (raw) or the bucket means (rollups).")
    min: Optional[GpuMetrics] = Field(description="Bucket minima; null for raw points. Metrics not rolled up: null.")
    max: Optional[GpuMetrics] = Field(description="Bucket maxima; null for raw points. Metrics not rolled up: null.")


class SamplesOut(Model):
    gpu_uuid: str = Field(description="The GPU.")
    hostname: str = Field(description="Its node.")
    simulated: bool = Field(description="True when the GPU belongs to a simulated node.")
    resolution: Literal["raw", "1m", "1h"] = Field(description="The resolution used (auto picks one by window length).")
    start_ms: int = Field(description="Window start (inclusive), epoch milliseconds.")
    end_ms: int = Field(description="Window end (exclusive), epoch milliseconds.")
    truncated: bool = Field(description="More points matched than max_points: these are the latest max_points.")
    points: list[PointOut] = Field(description="The points, oldest first.")


# -- events --------------------------------------------------------------------------------------------------


class EventOut(Model):
    id: int = Field(description="Event id.")
    hostname: str = Field(description="The node it happened on.")
    simulated: bool = Field(description="True when the node is simulated.")
    ts_ms: int = Field(description="When, epoch milliseconds.")
    kind: str = Field(description="gpu_lost, xid, source_error, spool_dropped, …")
    gpu_uuid: Optional[str] = Field(description="The GPU concerned; null for node-wide events.")
    xid: Optional[int] = Field(description="The XID number for xid events.")
    detail: str = Field(description="Free text.")


class EventsOut(PageOut):
    simulated: bool = Field(description="True when any listed event comes from a simulated node, or every node the "
                                        "query covers is simulated (also when no event is listed).")
    events: list[EventOut] = Field(description="Events, newest first.")
