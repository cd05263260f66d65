"""Request and response models of the read side (health, nodes, GPUs, samples, balance, events), the
constrained types every schema shares, and the makers of the models the contract (:mod:`trimtab.contract`) defines.

Response models carry no input bounds: a store can hold what an older agent or a direct-to-store agent wrote,
and an out-of-range stored value must not turn a read into a 500. Metric fields are generated from
``GPU_METRICS``, so the API documents each metric's unit where the agent defines it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError

from trimtab.contract.readings import GPU_METRICS
from trimtab.contract.kinds import NO_CONTROL_CHARS, NUMBER, Kind, Spec
from trimtab.contract.knobs import NAME_PATTERN

NO_NUL = r"^[^\x00]*$"
MAX_EPOCH_MS = 2**53 - 1  # exact in a JSON number (IEEE double), far inside BIGINT
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1

Hostname = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=NO_CONTROL_CHARS)]
GpuUuid = Annotated[str, StringConstraints(min_length=1, max_length=96, pattern=NO_CONTROL_CHARS)]
SLUG = NAME_PATTERN  # job names, knob and component names: safe in URLs, logs and Prometheus labels
EVENT_KIND = r"^[a-z][a-z0-9_]*$"
EpochMs = Annotated[int, Field(ge=0, le=MAX_EPOCH_MS)]
Status = Literal["ok", "watch", "act", "no_data", "unsupported"]


class Model(BaseModel):
    """Base of every response model (unknown attributes are ignored: these are built by the server)."""

    model_config = ConfigDict(from_attributes=True)


class InputModel(BaseModel):
    """Base of request bodies: unknown fields are an error (a typo must not pass silently); NaN/∞ never pass;
    a boolean is not a number (pydantic's lax mode would read ``false`` as 0 where the schema says integer)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if _holds_a_boolean(value) and not _may_hold_booleans(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("number_type", "Input should be a number, not a boolean (true/false)")
        return value


def _may_hold_booleans(annotation: Any) -> bool:
    """Whether a field of this type may take a bool itself (bool, Any), or leaves that to a nested model."""
    if annotation is bool or annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True  # the nested model checks its own fields
    return any(_may_hold_booleans(arg) for arg in get_args(annotation))


def _holds_a_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_a_boolean(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_a_boolean(v) for v in value.values())
    return False


class PageOut(Model):
    """Base of paginated listings."""

    next_offset: Optional[int] = Field(description="Offset of the next page; null on the last page.")


class ErrorOut(Model):
    detail: Union[str, list[dict[str, Any]]] = Field(
        description="What went wrong: a sentence, or (422) a list of {loc, msg, type} naming each invalid field.")


def _metric_model(name: str, doc: str, integers: bool) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for spec in GPU_METRICS:
        typ = Optional[int] if integers and spec.integer else Optional[float]
        fields[spec.name] = (typ, Field(None, description=f"{spec.help} Unit: {spec.unit or 'none'}. "
                                                            "null: unsupported by this GPU or not measured."))
    return create_model(name, __base__=Model, __doc__=doc, **fields)


GpuMetrics = _metric_model("GpuMetrics", "Every per-GPU metric at one instant, by name (unit in the name).", True)
GpuMetricMeans = _metric_model("GpuMetricMeans", "Every per-GPU metric averaged over a bucket.", False)


# -- models of the contract's messages -----------------------------------------------------------------------


def input_type(kind: Kind) -> Any:
    """The type a request field of ``kind`` takes: the kind's bounds in the JSON Schema, 422 outside them. (On a
    union the bounds sit on each member: on the union itself they would not reach the JSON Schema.)"""
    if kind.type is str:
        return Annotated[str, StringConstraints(min_length=kind.min_length, max_length=kind.max_length,
                                                pattern=kind.pattern)]
    if kind.type is dict:
        name = Annotated[str, StringConstraints(min_length=1, max_length=kind.key_max_length,
                                                pattern=NO_CONTROL_CHARS)]
        return dict[name, Annotated[float, Field(ge=kind.ge, le=kind.le)]]
    if kind.type == NUMBER:
        return Union[Annotated[int, Field(ge=int(kind.ge), le=int(kind.le))],
                     Annotated[float, Field(ge=kind.ge, le=kind.le)]]
    return Annotated[kind.type, Field(ge=kind.ge, le=kind.le)]


def output_type(kind: Kind) -> Any:
    """The type a response field of ``kind`` has: no bounds (a store holds what older writers wrote too)."""
    return {NUMBER: Union[int, float], dict: dict[str, float]}.get(kind.type, kind.type)


def contract_field(spec: Spec, inputs: bool, optional: bool) -> tuple[Any, Any]:
    """``(type, Field)`` of one contract field for ``create_model``; an optional one is null when absent (in a
    request: may be left out)."""
    typ = input_type(spec.kind) if inputs else output_type(spec.kind)
    entries = {"max_length": spec.kind.max_length} if inputs and spec.kind.type is dict else {}
    if not optional:
        return typ, Field(description=spec.doc, **entries)
    return Optional[typ], (Field(None, description=spec.doc, **entries) if inputs else
                           Field(description=spec.doc))


def message_model(name: str, specs: Any, doc: str, base: type[BaseModel], inputs: bool,
                  optional: bool = False) -> type[BaseModel]:
    """A request (``inputs``) or response model with one field per spec, in order."""
    fields = {s.name: contract_field(s, inputs, optional) for s in specs}
    return create_model(name, __base__=base, __doc__=doc, **fields)


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


# -- balance -------------------------------------------------------------------------------------------------


class BalanceGpuOut(Model):
    index: int = Field(description="NVML index on the node.")
    uuid: str = Field(description="GPU UUID.")
    name: str = Field(description="Product name.")
    n_samples: int = Field(description="Raw samples in the window.")
    util_pct: Optional[float] = Field(description="Mean kernel-busy utilization, %.")
    sm_active_pct: Optional[float] = Field(description="Mean GPM SM activity, % (null before Hopper).")
    mem_used_pct: Optional[float] = Field(description="Mean (used + reserved) / total memory, %.")
    pcie_tx_bytes_per_s: Optional[float] = Field(description="Mean PCIe TX, bytes/s.")
    pcie_rx_bytes_per_s: Optional[float] = Field(description="Mean PCIe RX, bytes/s.")
    pcie_pct_of_peak: Optional[float] = Field(description="Mean max(TX, RX) as % of the per-direction link peak.")
    nvlink_tx_bytes_per_s: Optional[float] = Field(description="Mean NVLink TX summed over links, bytes/s.")
    nvlink_rx_bytes_per_s: Optional[float] = Field(description="Mean NVLink RX summed over links, bytes/s.")
    nvlink_supported: bool = Field(description="Whether the GPU has NVLink.")


class VerdictOut(Model):
    check: str = Field(description="The check: utilization_spread, pcie, memory, step_composition, …")
    status: Status = Field(description="ok, watch, act (out of balance), no_data or unsupported.")
    value: Optional[float] = Field(description="The measured value, in `unit`; null without data.")
    unit: str = Field(description="Unit of value and thresholds (pts, %).")
    healthy_below: Optional[float] = Field(description="ok below this value.")
    act_above: Optional[float] = Field(description="act above this value (watch in between).")
    message: str = Field(description="One line saying what was measured.")
    advice: Optional[str] = Field(description="What to do, when not ok.")
    gpu_index: Optional[int] = Field(description="The GPU that set the value, where one did.")


class BalanceReportOut(Model):
    hostname: str = Field(description="The node.")
    simulated: bool = Field(description="True for a simulated node.")
    window_s: float = Field(description="Length of the graded window, seconds.")
    status: Literal["ok", "watch", "act"] = Field(description="The worst verdict of the node.")
    gpus: list[BalanceGpuOut] = Field(description="Per-GPU window means.")
    verdicts: list[VerdictOut] = Field(description="One verdict per check.")
    stale: bool = Field(description="True when the node's newest sample is older than stale_after_s: its agent "
                                    "stopped or cannot reach the store, and the verdicts are no current ones.")
    newest_sample_age_s: Optional[float] = Field(description="Age of the node's newest sample, seconds.")
    sample_interval_s: Optional[float] = Field(description="The node's sampling interval, measured from its samples "
                                                           "(null: one sample only).")
    stale_after_s: Optional[float] = Field(description="Older than this the node is stale: stale_after_intervals "
                                                       "sampling intervals, at least stale_min_s (rules.toml "
                                                       "[controller]); null: not judged.")
    clock_skew_s: Optional[float] = Field(None, description="The receiver's clock minus the node's, seconds (> 0: the "
                                                            "node is behind); null: not measured. See /v1/nodes.")
    clock_note: Optional[str] = Field(None, description="What is wrong with the node's clock (off by more than 5 s, "
                                                        "batches refused), or why a node heard from lately has no "
                                                        "sample in the window; null: nothing. Such a node is listed "
                                                        "with no GPUs and stale.")


class BalanceOut(Model):
    status: Literal["ok", "watch", "act", "no_data", "stale"] = Field(
        description="Worst status over the nodes; no_data when no node has samples in the window; stale when a "
                    "node's samples are too old to be a current verdict (its report says how old).")
    simulated: bool = Field(description="True when any reported node is simulated.")
    window_s: float = Field(description="Length of the graded window, seconds.")
    reports: list[BalanceReportOut] = Field(description="One report per node with samples in the window.")


class JobKnobStateOut(Model):
    value: Union[int, float] = Field(description="Current value (follows applied changes).")
    min: Union[int, float] = Field(description="Lower bound.")
    max: Union[int, float] = Field(description="Upper bound.")


class JobDecisionRowOut(Model):
    id: int = Field(description="Decision id (GET /v1/decisions has its evidence).")
    ts_ms: int = Field(description="When it was decided, epoch milliseconds.")
    rule: str = Field(description="The rule that fired.")
    change: str = Field(description="The change made or advised ('batch_size 1 → 4'), or 'advice only'.")
    knob: Optional[str] = Field(description="The knob changed; null for advice without a change.")
    old_value: Optional[Union[int, float]] = Field(description="The knob's value before.")
    new_value: Optional[Union[int, float]] = Field(description="The knob's new value.")
    outcome: Optional[str] = Field(description="advised, pending, kept, rolled_back, refused, superseded or cancelled.")
    applied_step: Optional[int] = Field(description="The step the job applied the change at.")
    throughput_before_samples_per_s: Optional[float] = Field(description="Throughput over the window before, "
                                                                         "samples/s.")
    throughput_after_samples_per_s: Optional[float] = Field(description="Throughput over the window after, "
                                                                        "samples/s.")
    note: Optional[str] = Field(None, description="Outcome refused: why the job could not apply the change.")
    verdicts: Optional[dict[str, str]] = Field(
        None, description="A decision on a knob that changes what is learned (prefetch, sync_every): both verdicts "
                          "in words — throughput ('+12.3 % (99 % sure): kept') and learning ('held: clip_fraction "
                          "0.04 → 0.06' or 'broke: …' naming the signal and its bound); null for other decisions.")


class JobCheckOut(Model):
    name: str = Field(description="The job.")
    mode: Literal["auto", "advise", "off"] = Field(description="How the rebalancer treats it.")
    ranks: int = Field(description="Number of ranks.")
    hostnames: list[str] = Field(description="Nodes the job runs on.")
    simulated: bool = Field(description="True when any of the job's hosts is a simulated node (a host whose only "
                                        "node is its simulated <host>-sim counts).")
    status: Literal["ok", "watch", "act"] = Field(description="The worst of the job's rows.")
    knobs: dict[str, JobKnobStateOut] = Field(description="Knobs with current value and bounds.")
    last_report_ms: Optional[int] = Field(description="When the newest step report arrived, epoch milliseconds.")
    generated_at_ms: int = Field(description="When this was graded, epoch milliseconds.")
    window_steps: Optional[list[int]] = Field(description="First and last step of the graded window; null before "
                                                          "any complete step.")
    n_steps: int = Field(description="Steps in the window.")
    window_s: float = Field(description="Step time the window covers, seconds.")
    full_window: bool = Field(description="False while the job has fewer steps than the controller's window needs.")
    samples_per_s: Optional[float] = Field(description="Throughput over the window, samples/s.")
    step_time_s: Optional[float] = Field(description="Mean step time over the window, seconds.")
    phase_shares: dict[str, Optional[float]] = Field(description="Phase → share of step time over the window, "
                                                                 "ratio 0-1 (null: not reported), on time_base: what "
                                                                 "the step_composition row grades.")
    time_base: Literal["gpu", "wall"] = Field(
        "wall", description="What phase_shares measure: gpu when every step of the window carries its phases' GPU "
                            "time (the hook's CUDA events; waiting for rollout, and phases a framework timed on the "
                            "host, keep their wall time), wall otherwise.")
    wall_phase_shares: dict[str, Optional[float]] = Field(
        default_factory=dict, description="Phase → share of step time over the window on wall time, ratio 0-1: "
                                          "beside phase_shares when those are on GPU time.")
    fragmentation: Optional[float] = Field(description="Mean allocator fragmentation over the window, ratio 0-1.")
    collective_latency_us: Optional[float] = Field(description="Mean collective-latency probe over the window, µs.")
    probe_baseline_us: Optional[float] = Field(description="The job's baseline: median of its first probes, µs.")
    verdicts: list[VerdictOut] = Field(description="step_composition, fragmentation and collective_latency, graded "
                                                   "by the rules (as the rebalancer sees them).")
    decisions: list[JobDecisionRowOut] = Field(description="The job's most recent rebalancer decisions, newest "
                                                           "first.")
    advise_only_reason: Optional[str] = Field(None, description="Why the job declares no knobs, as it registered.")
    gpus_by_role: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict, description="Role → node → local GPU indices, as GET /v1/jobs/{name} shows them (found "
                                          "by the job's adapter, or its typed device_map on its only node).")
    rl: dict[str, Optional[float]] = Field(
        default_factory=dict, description="Over the window (null: not reported): tokens_per_s; an RL trainer's "
                                          "prompts_per_step and completions_per_step, and the means of its logged "
                                          "completion_mean_tokens and reward_mean.")
    learning: dict[str, float] = Field(
        default_factory=dict, description="Learning signals the job reports (reward, clip_fraction, kl, "
                                          "eff_sample_size, grad_norm, entropy, stale_share): each one's mean over "
                                          "the window; a signal no step of the window reports is absent.")
    learning_advice: Optional[str] = Field(
        None, description="Why changes to the job's learning knobs are advice only: 'no learning signal reported: "
                          "advising only on prefetch, sync_every' (rules.toml [learning] without_signals = advise); "
                          "null when the job reports a learning signal or has no such knob.")
    generation_cadence: Optional[dict[str, Union[int, float]]] = Field(
        None, description="When only some steps generate (a generation batch feeds several optimizer steps, TRL's "
                          "steps_per_generation): generating_steps of steps, step_with_generation_s and "
                          "step_without_generation_s; null otherwise.")
    planner: Optional[dict[str, Any]] = Field(
        None, description="What the rebalancer last said about the job, as GET /v1/jobs/{name}'s planner (without "
                          "events): note, gate (name, rule, why, window, missing, expects_step: null = not before the "
                          "job moves), failing, failures, failing_since_ms, last_error, retry_at_ms; null before its "
                          "first plan.")


class BalanceJobsOut(Model):
    status: Literal["ok", "watch", "act", "no_data"] = Field(
        description="Worst status over the jobs; no_data when no job reported recently.")
    simulated: bool = Field(description="True when any listed job runs on a simulated node.")
    window_s: float = Field(description="Jobs that reported within max(window_s, 600) seconds are listed.")
    jobs: list[JobCheckOut] = Field(description="One entry per job, by name.")


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
