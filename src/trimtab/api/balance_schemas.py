"""Response models of the balance reads: a node's per-GPU window means and verdicts (GET /v1/balance), and a
job's graded window with its recent decisions (GET /v1/balance/jobs).

Response models carry no input bounds: a store can hold what an older agent or a direct-to-store agent wrote,
and an out-of-range stored value must not turn a read into a 500.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field

from trimtab.api.schemas_base import Model

Status = Literal["ok", "watch", "act", "no_data", "unsupported"]


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

