"""Request and response models of jobs (registration, step reports, knob changes and acks), decisions and tokens.

A job declares its knobs with bounds when it registers; every change (manual or the rebalancer's) must stay
inside them, so the bounds are checked here, at the edge, and again against the stored job in the routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, StringConstraints, model_validator

from trimtab.api.schemas import MAX_EPOCH_MS, MAX_INT64, NO_CONTROL_CHARS, SLUG, Hostname, InputModel, Model, \
    PageOut

JobName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=SLUG)]
KnobName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=SLUG)]
ComponentName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=SLUG)]
# Knob values: integral ones stay integers (batch sizes, depths); magnitudes a float holds exactly.
# (The bounds sit on each member of the union: on the union itself they would not reach the JSON Schema.)
KnobValue = Union[Annotated[int, Field(ge=-10**15, le=10**15)], Annotated[float, Field(ge=-1e15, le=1e15)]]
Mode = Literal["auto", "advise", "off"]
Scope = Literal["agent", "job", "admin"]
Step = Annotated[int, Field(ge=0, le=MAX_EPOCH_MS)]
Rank = Annotated[int, Field(ge=0, le=4095)]
Seconds = Annotated[float, Field(ge=0, le=1e7)]
Count = Annotated[int, Field(ge=0, le=MAX_INT64)]
LoggedKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NO_CONTROL_CHARS)]
Logged = Annotated[float, Field(ge=-1e300, le=1e300)]
MAX_LOGGED = 64


class KnobSpec(InputModel):
    value: KnobValue = Field(description="Current value in the job.")
    min: KnobValue = Field(description="Lowest value the rebalancer (or an admin) may set.")
    max: KnobValue = Field(description="Highest value the rebalancer (or an admin) may set.")

    @model_validator(mode="after")
    def _within_bounds(self) -> "KnobSpec":
        if not self.min <= self.value <= self.max:
            raise ValueError(f"need min <= value <= max, got min={self.min}, value={self.value}, max={self.max}")
        return self


class JobIn(InputModel):
    name: JobName = Field(description="The job's name (letters, digits, . _ -; ≤ 128): its identity.")
    ranks: int = Field(ge=1, le=4096, description="Number of ranks (processes) of the job.")
    device_map: dict[ComponentName, list[Annotated[int, Field(ge=0, le=4095)]]] = Field(
        default_factory=dict, max_length=64,
        description="Which local GPU indices each component (actor, critic, reward, ref, …) runs on. Keys: "
                    "component names, 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                    "(^[A-Za-z0-9][A-Za-z0-9._-]*$); values: GPU indices 0-4095.")
    hostnames: list[Hostname] = Field(default_factory=list, max_length=4096, description="Nodes the job runs on.")
    knobs: dict[KnobName, KnobSpec] = Field(
        default_factory=dict, max_length=32,
        description="Knobs the rebalancer may change (batch_size, prefetch, sync_every, …) with their bounds. "
                    "Keys: knob names, same pattern as device_map's keys.")
    mode: Mode = Field("advise", description="auto: the rebalancer applies changes; advise: it only records "
                                             "decisions; off: no changes are delivered.")
    rules: Optional[dict[str, Any]] = Field(
        None, max_length=16, description="This job's overrides of the daemon's rules, in the rules file's shape: "
                          "{\"controller\": {\"window_min_s\": 8}, \"rules\": {\"generation_bound\": {\"act_above\": 60}}} "
                          "(or just the rules table). Unknown rules or keys and bad values are refused (422).")
    advise_only_reason: Optional[Annotated[str, StringConstraints(max_length=1024, pattern=NO_CONTROL_CHARS)]] = Field(
        None, description="Why the job declares no knobs the rebalancer may change (its framework cannot change "
                          "them between steps); shown by trimtab check beside the job's knobs.")


class KnobOut(Model):
    value: Union[int, float] = Field(description="Current value (follows applied changes).")
    min: Union[int, float] = Field(description="Lower bound.")
    max: Union[int, float] = Field(description="Upper bound.")


class JobOut(Model):
    name: str = Field(description="The job's name.")
    ranks: int = Field(description="Number of ranks.")
    device_map: dict[str, list[int]] = Field(description="Component → local GPU indices.")
    hostnames: list[str] = Field(description="Nodes the job runs on.")
    knobs: dict[str, KnobOut] = Field(description="Knobs with current value and bounds.")
    mode: Mode = Field(description="auto, advise or off.")
    rules: Optional[dict[str, Any]] = Field(None, description="The job's overrides of the rules, as registered.")
    advise_only_reason: Optional[str] = Field(None, description="Why the job declares no knobs, as registered.")
    simulated: bool = Field(description="True when any of the job's hosts is a simulated node (a host whose only "
                                        "node is its simulated <host>-sim counts).")
    created_ms: int = Field(description="First registration, epoch milliseconds.")
    updated_ms: int = Field(description="Last registration, mode change or applied change, epoch milliseconds.")
    last_report_ms: Optional[int] = Field(description="When the newest step report arrived; null before any.")


class JobsOut(PageOut):
    simulated: bool = Field(description="True when any listed job runs on a simulated node.")
    jobs: list[JobOut] = Field(description="Jobs by name.")


class Phases(InputModel):
    generation: Optional[Seconds] = Field(None, description="Rollout / generation time in the step, seconds.")
    evaluation: Optional[Seconds] = Field(None, description="Scoring time (reward, critic, reference), seconds.")
    communication: Optional[Seconds] = Field(None, description="Collective communication time, seconds.")
    update: Optional[Seconds] = Field(None, description="Optimizer / parameter update time, seconds.")
    validation: Optional[Seconds] = Field(None, description="A validation (test-set) run inside the step, seconds.")
    checkpoint: Optional[Seconds] = Field(None, description="Saving a checkpoint, seconds.")
    wait: Optional[Seconds] = Field(None, description="The trainer waiting for rollout to hand it a batch (e.g. verl "
                                                      "V1's replay-buffer wait), seconds.")
    other: Optional[Seconds] = Field(None, description="Everything else, seconds.")


class MemoryIn(InputModel):
    allocated_bytes: Optional[Count] = Field(None, description="torch.cuda allocated bytes.")
    reserved_bytes: Optional[Count] = Field(None, description="torch.cuda reserved (cached) bytes.")
    peak_allocated_bytes: Optional[Count] = Field(None, description="torch.cuda peak allocated bytes since the "
                                                                   "rank's previous sample (what this batch size "
                                                                   "needs at its high point).")
    total_bytes: Optional[Count] = Field(None, description="The rank's GPU memory capacity, bytes.")
    fragmentation: Optional[float] = Field(None, ge=0, le=1,
                                           description="Free memory stranded in split blocks (torch's "
                                                       "inactive_split_bytes) / reserved, a fraction 0–1 "
                                                       "(healthy < 0.15).")
    num_alloc_retries: Optional[Count] = Field(None, description="Cumulative allocator retries (cudaMalloc after "
                                                                 "a cache flush) since the process started.")
    num_ooms: Optional[Count] = Field(None, description="Cumulative out-of-memory errors since the process started.")


class ReportIn(InputModel):
    step: Step = Field(description="Training step the report is about.")
    rank: Rank = Field(description="Rank reporting (0 ≤ rank < the job's ranks).")
    step_time_s: Seconds = Field(description="Wall time of the step, seconds.")
    phases: Phases = Field(default_factory=Phases, description="The step's time by phase, seconds.")
    samples: Optional[Count] = Field(None, description="Samples processed in the step.")
    tokens: Optional[Count] = Field(None, description="Tokens processed in the step.")
    memory: Optional[MemoryIn] = Field(None, description="Allocator statistics of the rank's GPU.")
    rollout_slowest_s: Optional[Seconds] = Field(None, description="Generation time of the step's slowest sample "
                                                                   "(the rollout's long tail), seconds.")
    rollout_mean_s: Optional[Seconds] = Field(None, description="Mean generation time per sample in the step, seconds.")
    prompts: Optional[Count] = Field(None, description="RL: prompts the step trained on (each has several completions).")
    completions: Optional[Count] = Field(None, description="RL: completions the step trained on (generated in this step "
                                                          "or reused from an earlier step's generation batch).")
    completion_mean_tokens: Optional[Annotated[float, Field(ge=0, le=1e9)]] = Field(
        None, description="Mean completion length, tokens, as the framework logged it for this step.")
    reward_mean: Optional[Logged] = Field(None, description="Mean reward, as the framework logged it for this step.")
    logged: Optional[dict[LoggedKey, Logged]] = Field(
        None, max_length=MAX_LOGGED, description="The framework's own scalars logged at this step, by its names "
                                                 "(TRL: step_time, num_tokens, completions/mean_length, reward, "
                                                 "entropy, …; means over its logging window).")
    collective_latency_us: Optional[float] = Field(None, ge=0, le=1e9,
                                                   description="Small all-reduce latency probe, microseconds.")
    pid: Optional[int] = Field(None, ge=0, le=2**31 - 1, description="The rank's host PID.")
    hostname: Optional[Hostname] = Field(None, description="The rank's node.")
    local_gpu: Optional[int] = Field(None, ge=0, le=4095, description="The rank's local GPU index.")


class PendingChangeOut(Model):
    change_id: int = Field(description="Id to acknowledge once applied.")
    knob: str = Field(description="The knob to change.")
    value: Union[int, float] = Field(description="The new value.")
    reason: str = Field(description="Why (rule or operator note).")


class ReportAcceptedOut(Model):
    stored: bool = Field(description="False when this (step, rank) was stored before (a resend).")
    pending_changes: list[PendingChangeOut] = Field(
        description="Changes to apply at the next step boundary (rank 0 broadcasts them), then acknowledge.")


class ReportOut(Model):
    step: int = Field(description="Training step.")
    rank: int = Field(description="Rank.")
    received_ms: int = Field(description="When the server received it, epoch milliseconds.")
    step_time_s: float = Field(description="Step wall time, seconds.")
    generation_s: Optional[float] = Field(description="Generation phase, seconds.")
    evaluation_s: Optional[float] = Field(description="Evaluation phase, seconds.")
    communication_s: Optional[float] = Field(description="Communication phase, seconds.")
    update_s: Optional[float] = Field(description="Update phase, seconds.")
    validation_s: Optional[float] = Field(description="Validation phase, seconds.")
    checkpoint_s: Optional[float] = Field(description="Checkpoint phase, seconds.")
    wait_s: Optional[float] = Field(description="Waiting for rollout, seconds.")
    other_s: Optional[float] = Field(description="Other time, seconds.")
    rollout_slowest_s: Optional[float] = Field(description="Slowest sample's generation time, seconds.")
    rollout_mean_s: Optional[float] = Field(description="Mean sample's generation time, seconds.")
    prompts: Optional[int] = Field(None, description="RL: prompts the step trained on.")
    completions: Optional[int] = Field(None, description="RL: completions the step trained on.")
    completion_mean_tokens: Optional[float] = Field(None, description="Mean completion length, tokens.")
    reward_mean: Optional[float] = Field(None, description="Mean reward.")
    logged: Optional[dict[str, float]] = Field(None, description="The framework's own scalars logged at this step.")
    samples: Optional[int] = Field(description="Samples in the step.")
    tokens: Optional[int] = Field(description="Tokens in the step.")
    allocated_bytes: Optional[int] = Field(description="Allocated bytes.")
    reserved_bytes: Optional[int] = Field(description="Reserved bytes.")
    fragmentation: Optional[float] = Field(description="Free memory stranded in split blocks / reserved, fraction.")
    num_alloc_retries: Optional[int] = Field(description="Cumulative allocator retries.")
    num_ooms: Optional[int] = Field(description="Cumulative OOMs.")
    collective_latency_us: Optional[float] = Field(description="All-reduce probe latency, microseconds.")
    pid: Optional[int] = Field(description="Host PID.")
    hostname: Optional[str] = Field(description="Node.")
    local_gpu: Optional[int] = Field(description="Local GPU index.")


class ReportsOut(PageOut):
    simulated: bool = Field(description="True when the job runs on a simulated node.")
    reports: list[ReportOut] = Field(description="Reports, newest step first.")


class AckIn(InputModel):
    change_id: int = Field(ge=1, le=MAX_INT64, description="The change applied.")
    applied_at_step: Step = Field(description="The step at whose start it took effect.")
    rank: Rank = Field(description="The rank acknowledging (each rank may ack).")


class RefusalIn(InputModel):
    change_id: int = Field(ge=1, le=MAX_INT64, description="The change that could not be applied.")
    rank: Rank = Field(description="The rank whose knob owner refused it.")
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=NO_CONTROL_CHARS)] = Field(
        description="Why the code that owns the knob could not apply it (kept with the change and its decision).")


class AckOut(Model):
    rank: int = Field(description="Rank.")
    applied_at_step: int = Field(description="Step at which the rank applied it.")
    acked_ms: int = Field(description="When the ack arrived, epoch milliseconds.")


class ChangeOut(Model):
    change_id: int = Field(description="Change id.")
    knob: str = Field(description="Knob.")
    value: Union[int, float] = Field(description="New value.")
    previous_value: Optional[Union[int, float]] = Field(description="The knob's value when the change was queued.")
    reason: str = Field(description="Why.")
    source: str = Field(description="manual (an admin) or rebalancer.")
    status: str = Field(description="pending, applied, refused (the code that owns the knob could not apply it), "
                                    "superseded (a newer change replaced it) or cancelled.")
    created_ms: int = Field(description="Queued at, epoch milliseconds.")
    applied_step: Optional[int] = Field(description="Step of the first ack.")
    applied_ms: Optional[int] = Field(description="Time of the first ack, epoch milliseconds.")
    acks: list[AckOut] = Field(description="Acks per rank.")
    refused_reason: Optional[str] = Field(None, description="Status refused: why, as the refusing rank said it.")


class ChangesOut(PageOut):
    changes: list[ChangeOut] = Field(description="Changes, newest first.")


class ChangeIn(InputModel):
    knob: KnobName = Field(description="A knob the job declared.")
    value: KnobValue = Field(description="New value, within the knob's declared bounds.")
    reason: Annotated[str, StringConstraints(max_length=1024, pattern=NO_CONTROL_CHARS)] = Field(
        "manual change", description="Why (kept with the change).")


class ModeIn(InputModel):
    mode: Mode = Field(description="auto, advise or off (off also cancels a pending change).")


class DecisionOut(Model):
    id: int = Field(description="Decision id.")
    job: str = Field(description="The job.")
    ts_ms: int = Field(description="When, epoch milliseconds.")
    rule: str = Field(description="The rule that fired (utilization_balance, pcie, step_composition, …).")
    evidence: dict[str, Any] = Field(description="The window's figures that made it fire (signal, value, per-step "
                                                 "values, halves, skipped actions and why), and once judged the "
                                                 "after-window, gain_pct and each rank's acknowledged step.")
    change_id: Optional[int] = Field(description="The knob change made, if any.")
    knob: Optional[str] = Field(description="Knob changed.")
    old_value: Optional[Union[int, float]] = Field(description="Value before.")
    new_value: Optional[Union[int, float]] = Field(description="Value after.")
    applied_step: Optional[int] = Field(description="Step at which the change took effect.")
    throughput_before_samples_per_s: Optional[float] = Field(description="Throughput before, samples/s.")
    throughput_after_samples_per_s: Optional[float] = Field(description="Throughput after, samples/s.")
    outcome: Optional[str] = Field(description="advised (advise mode, or no action possible), pending (change in "
                                               "flight), kept, rolled_back, refused (the job's knob owner "
                                               "could not apply the change; its reason is in the evidence), superseded "
                                               "(replaced before its verdict) or cancelled (mode switched off / bounds "
                                               "changed).")
    advice: Optional[str] = Field(description="Advice for a person (placement, dtype, …).")


class DecisionsOut(PageOut):
    simulated: bool = Field(description="True when any listed decision is about a job on a simulated node.")
    decisions: list[DecisionOut] = Field(description="Decisions, newest first.")


class TokenIn(InputModel):
    name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NO_CONTROL_CHARS)] = Field(
        description="What the token is for (e.g. agent@gpu-node-07).")
    scope: Scope = Field(description="agent: ingest; job: register and report jobs; admin: everything.")


class TokenOut(Model):
    id: int = Field(description="Token id (for revocation).")
    name: str = Field(description="Name.")
    scope: Scope = Field(description="agent, job or admin.")
    created_ms: int = Field(description="Created at, epoch milliseconds.")
    last_used_ms: Optional[int] = Field(description="Last use (updated at most once a minute), epoch milliseconds.")
    revoked: bool = Field(description="True once revoked.")
    revoked_ms: Optional[int] = Field(description="Revoked at, epoch milliseconds.")


class TokenCreatedOut(TokenOut):
    token: str = Field(description="The secret: shown only in this response. Send as Authorization: Bearer <token>.")


class TokensOut(Model):
    tokens: list[TokenOut] = Field(description="Every token, without secrets.")
