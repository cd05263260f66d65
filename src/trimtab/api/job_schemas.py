"""Request and response models of jobs (registration, step reports, knob changes and acks), decisions and tokens.

The step report, knob declarations, pending changes, acks and refusals are generated from the contract
(:mod:`trimtab.contract`), which the hook builds its requests from: a field added there appears here. A job
declares its knobs with bounds when it registers; every change (manual or the rebalancer's) must stay inside them,
so the bounds are checked here, at the edge, and again against the stored job in the routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, StringConstraints, create_model, model_validator

from trimtab.api.contract_models import contract_field, input_type, message_model
from trimtab.api.end_state_schemas import EndStateOut
from trimtab.api.planner_schemas import PlannerOut
from trimtab.api.schemas_base import SLUG, Hostname, InputModel, Model, PageOut
from trimtab.contract.kinds import NO_CONTROL_CHARS
from trimtab.contract.knobs import ACK, KNOB_DECLARATION, KNOB_NAME, KNOB_VALUE, MAX_JOB_NAME, MAX_NAME, \
    PENDING_CHANGE, REFUSAL
from trimtab.contract.readings import MAX_CLOCK_AHEAD_S
from trimtab.contract.roles import MAX_GPUS_PER_NODE, MAX_PIDS, MAX_PLACEMENTS, SOURCES
from trimtab.contract.step_report import GPU_PHASES_GROUP, GROUPS, LEARNING_GROUP, MAX_REPORTS_PER_BATCH, \
    MEMORY_GROUP, PHASES_GROUP, REPORT_FIELDS

JobName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_JOB_NAME, pattern=SLUG)]
KnobName = input_type(KNOB_NAME)
ComponentName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME, pattern=SLUG)]
KnobValue = input_type(KNOB_VALUE)
Mode = Literal["auto", "advise", "off"]
Scope = Literal["agent", "job", "admin"]


class _WithinBounds(InputModel):
    @model_validator(mode="after")
    def _within_bounds(self) -> "_WithinBounds":
        if not self.min <= self.value <= self.max:
            raise ValueError(f"need min <= value <= max, got min={self.min}, value={self.value}, max={self.max}")
        return self


KnobSpec = message_model("KnobSpec", KNOB_DECLARATION, "A knob as the job declares it: value and bounds.",
                         _WithinBounds, inputs=True)


RoleSource = Literal[SOURCES]  # type: ignore[valid-type]
_ROLE_DOCS = {
    "role": "The role (actor, rollout, ref, critic, reward, …): a component name, as device_map's keys.",
    "node": "The node (hostname) its workers run on.",
    "gpus": "Local GPU indices (NVML's on that node) holding the role; empty when the job could not tell.",
    "pids": "The role's worker processes on that node (NVML's process list shows them on their GPUs).",
    "source": "found: from the framework's own workers (verl: its worker groups); nvml: GPUs the job could not "
              "tell, found by matching its pids to NVML's process list on the node (the agent's samples); "
              "declared: typed by the user.",
}


class RoleIn(InputModel):
    """One role of the job on one node (trimtab.contract.roles.RolePlacement)."""

    role: ComponentName = Field(description=_ROLE_DOCS["role"])
    node: Hostname = Field(description=_ROLE_DOCS["node"])
    gpus: list[Annotated[int, Field(ge=0, le=4095)]] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE,
                                                             description=_ROLE_DOCS["gpus"])
    pids: list[Annotated[int, Field(ge=1, le=2**31 - 1)]] = Field(default_factory=list, max_length=MAX_PIDS,
                                                                  description=_ROLE_DOCS["pids"])
    source: RoleSource = Field("found", description=_ROLE_DOCS["source"])


class RoleOut(Model):
    """One role of the job on one node."""

    role: str = Field(description=_ROLE_DOCS["role"])
    node: str = Field(description=_ROLE_DOCS["node"])
    gpus: list[int] = Field(description=_ROLE_DOCS["gpus"])
    pids: list[int] = Field(description=_ROLE_DOCS["pids"])
    source: RoleSource = Field(description=_ROLE_DOCS["source"])


class JobIn(InputModel):
    name: JobName = Field(description="The job's name (letters, digits, . _ -; ≤ 128): its identity.")
    ranks: int = Field(ge=1, le=4096, description="Number of ranks (processes) of the job.")
    device_map: dict[ComponentName, list[Annotated[int, Field(ge=0, le=4095)]]] = Field(
        default_factory=dict, max_length=64,
        description="Which local GPU indices each component (actor, critic, reward, ref, …) runs on. Keys: "
                    "component names, 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
                    "(^[A-Za-z0-9][A-Za-z0-9._-]*$); values: GPU indices 0-4095.")
    hostnames: list[Hostname] = Field(default_factory=list, max_length=4096, description="Nodes the job runs on.")
    roles: list[RoleIn] = Field(
        default_factory=list, max_length=MAX_PLACEMENTS,
        description="Where each role runs: one entry per role and node, with its local GPUs and worker pids, as the "
                    "job's adapter found them (the verl plugin: from verl's worker groups). An empty device_map is "
                    "derived from them (role → GPUs); a device_map given beside them overrides it for attribution.")
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


KnobOut = message_model("KnobOut", KNOB_DECLARATION, "A knob: current value and bounds.", Model, inputs=False)


class JobOut(Model):
    name: str = Field(description="The job's name.")
    ranks: int = Field(description="Number of ranks.")
    device_map: dict[str, list[int]] = Field(description="Component → local GPU indices.")
    hostnames: list[str] = Field(description="Nodes the job runs on.")
    roles: list[RoleOut] = Field(description="Where each role runs, one entry per role and node, as registered.")
    gpus_by_role: dict[str, dict[str, list[int]]] = Field(
        description="Role → node → local GPU indices, from roles (found or declared); where the job registered no "
                    "roles, from device_map on its only node. Colocated roles list the same GPUs.")
    knobs: dict[str, KnobOut] = Field(description="Knobs with current value and bounds.")
    mode: Mode = Field(description="auto, advise or off.")
    rules: Optional[dict[str, Any]] = Field(None, description="The job's overrides of the rules, as registered.")
    advise_only_reason: Optional[str] = Field(None, description="Why the job declares no knobs, as registered.")
    simulated: bool = Field(description="True when any of the job's hosts is a simulated node (a host whose only "
                                        "node is its simulated <host>-sim counts).")
    created_ms: int = Field(description="First registration, epoch milliseconds.")
    updated_ms: int = Field(description="Last registration, mode change or applied change, epoch milliseconds.")
    last_report_ms: Optional[int] = Field(description="When the newest step report arrived; null before any.")
    planner: Optional[PlannerOut] = Field(None, description="What the rebalancer last said about the job: its last "
                                         "plan's note, the gate that held it when nothing was decided (and the step "
                                         "at which it expects to decide), and whether planning the job fails (the "
                                         "error, since when, retried when); null before its first plan.")
    learning_advice: Optional[str] = Field(None, description="GET /v1/jobs/{name} only: why changes to the job's "
                                           "knobs that change what is learned are advice only — 'no learning signal "
                                           "reported: advising only on prefetch, sync_every' (rules.toml [learning] "
                                           "without_signals = advise); null when its newest window reports a "
                                           "learning signal or it has no such knob.")
    end_state: Optional[EndStateOut] = Field(None, description="GET /v1/jobs/{name} only (null in the list): the "
                                             "end state a balanced job reaches, over its last end_state_window_s "
                                             "seconds — each GPU's utilization band, step-time variation, scaling "
                                             "efficiency against the job's own history at another GPU count — and "
                                             "the word.")


class JobsOut(PageOut):
    simulated: bool = Field(description="True when any listed job runs on a simulated node.")
    jobs: list[JobOut] = Field(description="Jobs by name.")


def _group_model(group: str, name: str, doc: str) -> type:
    return message_model(name, [f for f in REPORT_FIELDS if f.group == group], doc, InputModel, inputs=True,
                         optional=True)


# (A model's own doc differs from its field's: where they are equal, the JSON Schema drops the field's.)
Phases = _group_model(PHASES_GROUP, "Phases", "Seconds of a step by phase; a phase left out was not measured.")
GpuPhases = _group_model(GPU_PHASES_GROUP, "GpuPhases", "GPU seconds of a step by phase, from CUDA events; a phase "
                         "left out had no GPU timing (step composition is then graded on wall time).")
MemoryIn = _group_model(MEMORY_GROUP, "MemoryIn", "The caching allocator's statistics, as torch.cuda keeps them.")
LearningIn = _group_model(LEARNING_GROUP, "LearningIn", "Learning signals of the step by trimtab's names (each "
                          "framework's own names are mapped onto these by the hook's adapters).")
_GROUP_MODELS = {PHASES_GROUP: Phases, GPU_PHASES_GROUP: GpuPhases, MEMORY_GROUP: MemoryIn, LEARNING_GROUP: LearningIn}


def _report_in() -> type:
    """``ReportIn``: the contract's top-level fields, each group as its nested model where it first appears."""
    fields: dict[str, Any] = {}
    for f in REPORT_FIELDS:
        if not f.group:
            fields[f.name] = contract_field(f, inputs=True, optional=not f.required)
        elif f.group not in fields:
            model, doc = _GROUP_MODELS[f.group], GROUPS[f.group].doc
            fields[f.group] = ((model, Field(default_factory=model, description=doc)) if GROUPS[f.group].always
                               else (Optional[model], Field(None, description=doc)))
    return create_model("ReportIn", __base__=InputModel, __doc__="One rank's report of one step.", **fields)


ReportIn = _report_in()


PendingChangeOut = message_model("PendingChangeOut", PENDING_CHANGE, "A knob change waiting for the job.", Model,
                                 inputs=False)


UNTIMED = (f"its ended_ms was more than {MAX_CLOCK_AHEAD_S} s ahead of the server's clock (the rank's clock is "
           f"wrong): filed at its arrival instead")


class ReportAcceptedOut(Model):
    stored: bool = Field(description="False when this (step, rank) was stored before (a resend).")
    untimed: bool = Field(False, description=f"True when {UNTIMED}.")
    pending_changes: list[PendingChangeOut] = Field(
        description="Changes to apply at the next step boundary (rank 0 broadcasts them), then acknowledge.")


class ReportBatchIn(InputModel):
    reports: list[ReportIn] = Field(  # type: ignore[valid-type]
        min_length=1, max_length=MAX_REPORTS_PER_BATCH,
        description=f"1 to {MAX_REPORTS_PER_BATCH} step reports, each as POST /v1/jobs/{{name}}/reports takes "
                    f"it, of any ranks and in any order (the hook sends one rank's, oldest first).")


class ReportBatchAcceptedOut(Model):
    stored: int = Field(description="How many of the batch's reports were new; a (step, rank) stored before (a "
                                    "resend) is not counted, nor stored twice.")
    received: int = Field(description="How many reports the batch held (all of them valid: the batch was accepted).")
    untimed: int = Field(0, description=f"How many of them were filed at arrival: {UNTIMED}.")
    pending_changes: list[PendingChangeOut] = Field(
        description="Changes to apply at the next step boundary (rank 0 broadcasts them), then acknowledge; as in "
                    "the answer to one report.")


def _report_out() -> type:
    """``ReportOut``: a stored report, flat (a phase ``p`` as ``p_s``, its GPU time as ``gpu_p_s``), with when it
    arrived."""
    fields: dict[str, Any] = {}
    for f in REPORT_FIELDS:
        fields[f.column] = contract_field(f, inputs=False, optional=not f.required)
        if f.name == "rank":
            fields["received_ms"] = (int, Field(description="When the server received it, epoch milliseconds."))
    return create_model("ReportOut", __base__=Model, __doc__="A stored step report.", **fields)


ReportOut = _report_out()


class ReportsOut(PageOut):
    simulated: bool = Field(description="True when the job runs on a simulated node.")
    reports: list[ReportOut] = Field(description="Reports, newest step first.")


AckIn = message_model("AckIn", ACK, "A rank applied a change at a step.", InputModel, inputs=True)
RefusalIn = message_model("RefusalIn", REFUSAL, "A rank's knob owner could not apply a change.", InputModel,
                          inputs=True)


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
                                                 "values, halves, skipped actions and why, step_policy: how the "
                                                 "step was chosen), and once judged the after-window, gain_pct, the "
                                                 "verdict with its before_sample/after_sample (a lone stalled period "
                                                 "left out of one is named under left_out) and each rank's "
                                                 "acknowledged step; gpu_time_waste: the GPU-time ledger's largest "
                                                 "waste over the job's last 600 s that the decided knob addresses "
                                                 "(gpu_s, gpu_hours, cause, role, waiting_for, gpus, what, action, "
                                                 "matched: how it was matched; the largest overall for advice that "
                                                 "names no knob).")
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
