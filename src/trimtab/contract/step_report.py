"""The step report: what one rank of a training job says about one step, field by field.

``REPORT_FIELDS`` is the one list. The hook sends :func:`to_wire` of it; the API's ``ReportIn``/``ReportOut`` and
the store's ``job_reports`` columns are generated from it; the API files a report with :func:`to_columns`; the
rebalancer folds a step's ranks with :func:`fold_ranks`. A new field is one entry here (plus the migration that
adds its column, and whatever in the job produces its value).

On the wire a report is nested: phases under ``phases``, their GPU time under ``gpu_phases``, allocator statistics
under ``memory``, learning signals under ``learning``; everywhere else (store, API listings, the rebalancer) it is
flat, a phase named ``<phase>_s``, its GPU time ``gpu_<phase>_s`` and a learning signal ``learning_<name>``
(:attr:`ReportField.column`).

Why GPU time beside wall time: a phase that launches its kernels and returns (a reward model scoring into GPU
tensors) takes no wall time of its own; its cost lands on the next phase that waits for the GPU. The hook's CUDA
events around each phase block measure what the GPU did in it, so step composition is graded on them where a job
reports them (:func:`trimtab.grading.signals.time_base`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trimtab.contract.kinds import NO_CONTROL_CHARS, Kind, Spec, clean
from trimtab.contract.learning import LEARNING_SIGNALS
from trimtab.contract.readings import MAX_CLOCK_AHEAD_S

MAX_STEP = 2**53 - 1         # exact in a JSON number (IEEE double), far inside BIGINT
MAX_COUNT = 2**63 - 1        # BIGINT
MAX_RANK = 4095
MAX_SECONDS = 1e7            # a duration (116 days): anything longer is a broken clock
MAX_SCALAR = 1e300           # a logged value: finite in every JSON reader
MAX_LOGGED, MAX_LOGGED_KEY = 64, 128
MAX_REPORTS_PER_BATCH = 256  # step reports in one POST …/report-batches (a rank's queued reports; 422 beyond)

STEP = Kind(int, 0, MAX_STEP, "bigint")
EPOCH_MS = Kind(int, 0, MAX_STEP, "bigint")  # a wall-clock time, epoch milliseconds
RANK = Kind(int, 0, MAX_RANK, "integer")
GPU_INDEX = Kind(int, 0, 4095, "integer")
PID = Kind(int, 0, 2**31 - 1, "bigint")
SECONDS = Kind(float, 0, MAX_SECONDS)
COUNT = Kind(int, 0, MAX_COUNT, "bigint")
FRACTION = Kind(float, 0, 1)
MICROSECONDS = Kind(float, 0, 1e9)
TOKENS = Kind(float, 0, 1e9)  # a mean length, tokens
SCALAR = Kind(float, -MAX_SCALAR, MAX_SCALAR)
SCALARS = Kind(dict, -MAX_SCALAR, MAX_SCALAR, "json", max_length=MAX_LOGGED, key_max_length=MAX_LOGGED_KEY)
HOSTNAME = Kind(str, storage="text", min_length=1, max_length=255, pattern=NO_CONTROL_CHARS)

# How one step's ranks fold into one value: the job waits for its slowest rank (phases, step time: the most), its
# samples add up, a logged mean is the ranks' mean; who ran it (pid, host, GPU) is kept per rank.
SAME, COUNT_RANKS, MOST, LEAST, SUM, MEAN, MEDIAN, BY_RANK, MEAN_BY_NAME = (
    "same", "count", "max", "min", "sum", "mean", "median", "by_rank", "mean_by_name")

PHASES_GROUP, GPU_PHASES_GROUP, MEMORY_GROUP, LEARNING_GROUP = "phases", "gpu_phases", "memory", "learning"


@dataclass(frozen=True)
class ReportField(Spec):
    """One field of the step report. ``group``: nested under that key on the wire ("" for the top level);
    ``fold``: how a step's ranks combine; ``framework``: a value the framework logged (an adapter passes it on)."""

    group: str = ""
    fold: str = MOST
    required: bool = False
    framework: bool = False

    @property
    def column(self) -> str:
        """The field's name in the store, the API's listings and the rebalancer's step view."""
        if self.group == GPU_PHASES_GROUP:
            return f"gpu_{self.name}_s"
        if self.group == LEARNING_GROUP:
            return f"learning_{self.name}"
        return f"{self.name}_s" if self.group == PHASES_GROUP else self.name


@dataclass(frozen=True)
class Group:
    """A nested object of the wire form: ``always`` sent (as ``{}`` when empty), or left out when empty."""

    name: str
    doc: str
    always: bool


GROUPS = {PHASES_GROUP: Group(PHASES_GROUP, "The step's time by phase, seconds.", always=True),
          GPU_PHASES_GROUP: Group(GPU_PHASES_GROUP, "GPU time of the step's phases, seconds: from the CUDA events the "
                                                    "hook records around each phase block, resolved once they "
                                                    "completed (never a sync). Left out where a phase was not timed "
                                                    "on a GPU (no CUDA, or a framework's own host-side timers).",
                                  always=False),
          MEMORY_GROUP: Group(MEMORY_GROUP, "Allocator statistics of the rank's GPU.", always=False),
          LEARNING_GROUP: Group(LEARNING_GROUP, "What the step says about learning, as the framework logged it: reward, "
                                                "clip fraction, KL, effective sample size, gradient norm, entropy, "
                                                "stale share (a change to a knob that changes what is learned is "
                                                "judged on these too). Left out where nothing was logged.",
                                always=False)}


def _phase(name: str, doc: str) -> ReportField:
    return ReportField(name, SECONDS, doc, group=PHASES_GROUP)


def _gpu_phase(name: str) -> ReportField:
    return ReportField(name, SECONDS, f"GPU time of the step's {name} phase (CUDA events around its blocks on the "
                                      f"rank's current stream), seconds.", group=GPU_PHASES_GROUP)


def _memory(name: str, kind: Kind, doc: str, fold: str = MOST) -> ReportField:
    return ReportField(name, kind, doc, group=MEMORY_GROUP, fold=fold)


REPORT_FIELDS: tuple[ReportField, ...] = (
    ReportField("step", STEP, "Training step the report is about.", fold=SAME, required=True),
    ReportField("rank", RANK, "Rank reporting (0 ≤ rank < the job's ranks).", fold=COUNT_RANKS, required=True),
    ReportField("step_time_s", SECONDS, "Wall time of the step, seconds.", required=True),
    ReportField("ended_ms", EPOCH_MS, "When the step ended, by the rank's wall clock, epoch milliseconds (the hook "
                                      "stamps it at the step's boundary: a report sent late, kept through a head "
                                      "outage, keeps its step's time). Absent, or more than "
                                      f"{MAX_CLOCK_AHEAD_S} s ahead of the server's clock: the server files the "
                                      "report at its arrival instead."),
    _phase("generation", "Rollout / generation time in the step, seconds."),
    _phase("evaluation", "Scoring time (reward, critic, reference), seconds."),
    _phase("communication", "Collective communication time, seconds."),
    _phase("update", "Optimizer / parameter update time, seconds."),
    _phase("validation", "A validation (test-set) run inside the step, seconds."),
    _phase("checkpoint", "Saving a checkpoint, seconds."),
    _phase("wait", "The trainer waiting for rollout to hand it a batch (e.g. verl V1's replay-buffer wait), seconds."),
    _phase("other", "Everything else, seconds."),
    # GPU time of the named phases, except waiting for rollout: an idle wait has no kernels, its meaning is wall.
    *(_gpu_phase(name) for name in ("generation", "evaluation", "communication", "update", "validation",
                                    "checkpoint")),
    ReportField("samples", COUNT, "Samples processed in the step.", fold=SUM),
    ReportField("tokens", COUNT, "Tokens processed in the step.", fold=SUM),
    _memory("allocated_bytes", COUNT, "torch.cuda allocated bytes."),
    _memory("reserved_bytes", COUNT, "torch.cuda reserved (cached) bytes."),
    _memory("peak_allocated_bytes", COUNT, "torch.cuda peak allocated bytes since the rank's previous sample (what "
                                           "this batch size needs at its high point)."),
    _memory("total_bytes", COUNT, "The rank's GPU memory capacity, bytes.", fold=LEAST),
    _memory("free_bytes", COUNT, "Free memory on the rank's GPU as the job sees it (torch.cuda.mem_get_info's free; "
                                 "a CPU job passes its own figure), bytes: total − free − the job's own reserved "
                                 "bytes is memory another process holds, which lowers the line a raise plans "
                                 "against.", fold=LEAST),
    _memory("fragmentation", FRACTION, "Free memory stranded in split blocks (torch's inactive_split_bytes) / "
                                       "reserved, a fraction 0–1 (healthy < 0.15)."),
    _memory("num_alloc_retries", COUNT, "Cumulative allocator retries (cudaMalloc after a cache flush) since the "
                                        "process started."),
    _memory("num_ooms", COUNT, "Cumulative out-of-memory errors since the process started."),
    ReportField("rollout_slowest_s", SECONDS, "Generation time of the step's slowest sample (the rollout's long "
                                              "tail), seconds."),
    ReportField("rollout_mean_s", SECONDS, "Mean generation time per sample in the step, seconds."),
    ReportField("queue_high_water", COUNT, "The most generated batches that waited unclaimed at once in the step "
                                           "(the prefetch queue's high-water mark), in the prefetch knob's unit "
                                           "(verl's fully-async rollouter: parameter versions it ran ahead, "
                                           "staleness_threshold's unit): below the queue's depth on every step, a "
                                           "deeper queue would stay empty.", framework=True),
    ReportField("prompts", COUNT, "RL: prompts the step trained on (each has several completions).", fold=SUM,
                framework=True),
    ReportField("completions", COUNT, "RL: completions the step trained on (generated in this step or reused from "
                                      "an earlier step's generation batch).", fold=SUM, framework=True),
    ReportField("completion_mean_tokens", TOKENS, "Mean completion length, tokens, as the framework logged it for "
                                                  "this step.", fold=MEAN, framework=True),
    ReportField("reward_mean", SCALAR, "Mean reward, as the framework logged it for this step.", fold=MEAN,
                framework=True),
    ReportField("logged", SCALARS, "The framework's own scalars logged at this step, by its names (TRL: step_time, "
                                   "num_tokens, completions/mean_length, reward, entropy, …; means over its logging "
                                   "window).", fold=MEAN_BY_NAME, framework=True),
    # Learning signals (issue 41): a step's ranks log the same optimizer step, so their mean.
    *(ReportField(s.name, s.kind, s.doc, group=LEARNING_GROUP, fold=MEAN) for s in LEARNING_SIGNALS),
    ReportField("knobs", SCALARS, "The knob values the step ran at, by name (the hook's, read before the step's "
                                  "boundary applies anything: after its own OOM halving too, which no change "
                                  "records).", fold=SAME),
    ReportField("collective_latency_us", MICROSECONDS, "Small all-reduce latency probe, microseconds.", fold=MEDIAN),
    ReportField("pid", PID, "The rank's host PID.", fold=BY_RANK),
    ReportField("hostname", HOSTNAME, "The rank's node.", fold=BY_RANK),
    ReportField("local_gpu", GPU_INDEX, "The rank's local GPU index.", fold=BY_RANK),
)

PHASES: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS if f.group == PHASES_GROUP)
OTHER_PHASE = "other"  # whatever the step's wall time leaves after the named phases
NAMED_PHASES: tuple[str, ...] = tuple(p for p in PHASES if p != OTHER_PHASE)
GPU_PHASES: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS if f.group == GPU_PHASES_GROUP)
WALL_ONLY_PHASES: tuple[str, ...] = tuple(p for p in NAMED_PHASES if p not in GPU_PHASES)  # never GPU-timed
MEMORY_KEYS: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS if f.group == MEMORY_GROUP)
FRAMEWORK_FIELDS: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS if f.framework)
LEARNING_KEYS: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS if f.group == LEARNING_GROUP)
COLUMNS: tuple[str, ...] = tuple(f.column for f in REPORT_FIELDS)


def top_level() -> tuple[ReportField, ...]:
    """The fields outside any group, in order."""
    return tuple(f for f in REPORT_FIELDS if not f.group)


def to_wire(report: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of ``POST /v1/jobs/{name}/reports`` from a wire-shaped mapping (groups as nested mappings):
    every field cleaned by its kind, so the API never refuses the report for one odd value; absent values are
    left out, never sent as 0; keys the contract does not name are dropped."""
    body: dict[str, Any] = {}
    for f in REPORT_FIELDS:
        source = (report.get(f.group) or {}) if f.group else report
        value = clean(f.kind, source.get(f.name))
        if value is None and f.required:
            value = f.kind.type(f.kind.ge or 0)
        if f.group and (value is not None or GROUPS[f.group].always):
            body.setdefault(f.group, {})
        if value is not None:
            (body[f.group] if f.group else body)[f.name] = value
    return body


def to_columns(report: Mapping[str, Any]) -> dict[str, Any]:
    """A wire-shaped report flattened to the store's columns (a phase ``p`` → ``p_s``); None where absent."""
    return {f.column: ((report.get(f.group) or {}) if f.group else report).get(f.name) for f in REPORT_FIELDS}


def untime_if_ahead(report: dict[str, Any], now_ms: int) -> bool:
    """Clears the report's ``ended_ms`` when it is more than MAX_CLOCK_AHEAD_S ahead of ``now_ms`` (the
    receiver's clock): the rule samples follow, except that a step report is kept (filed at its arrival) rather than
    refused — a rank whose clock is wrong still trains. Whether it did."""
    ended_ms = report.get("ended_ms")
    if ended_ms is not None and ended_ms > now_ms + MAX_CLOCK_AHEAD_S * 1000:
        report["ended_ms"] = None
        return True
    return False


def fold_ranks(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One step's flat reports (one per rank) folded into one value per column, each by its field's ``fold``;
    None where no rank reported the field."""
    return {f.column: _fold(f, reports) for f in REPORT_FIELDS}


def _fold(f: ReportField, reports: Sequence[Mapping[str, Any]]) -> Any:
    if f.fold == COUNT_RANKS:
        return len(reports)
    known = [r[f.column] for r in reports if r.get(f.column) is not None]
    if f.fold == BY_RANK:
        return {r["rank"]: r[f.column] for r in reports if r.get(f.column) is not None} or None
    if not known:
        return None
    if f.fold == MEAN_BY_NAME:
        names = sorted({name for values in known for name in values})
        return {n: statistics.fmean(v[n] for v in known if v.get(n) is not None) for n in names} or None
    return _REDUCE[f.fold](known)


_REDUCE = {SAME: lambda v: v[0], MOST: max, LEAST: min, SUM: lambda v: float(sum(v)), MEAN: statistics.fmean,
           MEDIAN: statistics.median}

