"""The store's tables, as SQLAlchemy Core ``Table``s in one ``metadata``; metric columns come from the specs in
:mod:`trimtab.contract.readings` and step report columns from :mod:`trimtab.contract.step_report`, so a metric or a
report field is named in exactly one place.

Core, not ORM: ingest writes thousands of rows a second in executemany batches and reads are aggregates; neither
wants identity-mapped objects. Times are epoch milliseconds in BIGINT columns (``ts_ms``, ``bucket_ms``):
portable between SQLite and PostgreSQL, cheap to index and to bucket (``ts_ms - ts_ms % 60000``), and what
Grafana's epoch-millisecond macros take. Sample tables are keyed by (gpu or node, time), so a replayed batch
cannot add a row twice.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    JSON,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from trimtab.contract.readings import GPU_METRICS, HOST_METRICS, NVLINK_LINK_METRICS, ROLLUP_METRIC_NAMES, MetricSpec
from trimtab.contract.step_report import REPORT_FIELDS, ReportField

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
ROLLUP_STATE_ID = 1  # rollup_state holds this one row
UNKNOWN_GPU_INDEX = -1  # a GPU met in samples before its inventory: index and name are filled in when it comes

# Deterministic constraint names, so migrations can address them (and SQLite batch mode can rebuild tables).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING_CONVENTION)

# On SQLite a composite-key time series is best stored clustered on its key: without the hidden rowid b-tree
# each insert updates one b-tree less and the rows of one GPU lie together. PostgreSQL ignores the option.
_CLUSTERED = {"sqlite_with_rowid": False}

ROLLUP_AGGREGATES = ("min", "mean", "max")
ROLLUP_VALUE_COLUMNS: tuple[str, ...] = tuple(f"{m}_{agg}" for m in ROLLUP_METRIC_NAMES for agg in ROLLUP_AGGREGATES)


def metric_type(spec: MetricSpec):
    return BigInteger if spec.integer else Double


def _metric_columns(specs: tuple[MetricSpec, ...]) -> list[Column]:
    return [Column(s.name, metric_type(s), nullable=True) for s in specs]


def _gpu_fk() -> ForeignKey:
    return ForeignKey("gpus.id", ondelete="CASCADE")


nodes = Table(
    "nodes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("hostname", String(255), nullable=False, unique=True),
    Column("simulated", Boolean, nullable=False, default=False),
    Column("scenario", String(255)),
    Column("driver_version", String(64)),
    Column("nvml_version", String(64)),
    Column("first_seen_ms", BigInteger, nullable=False),
    Column("last_seen_ms", BigInteger, nullable=False),
)

gpus = Table(
    "gpus",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("uuid", String(96), nullable=False, unique=True),
    Column("gpu_index", Integer, nullable=False),
    Column("name", String(255), nullable=False),
    Column("memory_total_bytes", BigInteger),
    Column("pcie_max_gen", Integer),
    Column("pcie_max_width", Integer),
    Column("pcie_peak_bytes_per_s", Double),
    Column("nvlink_link_count", Integer),  # NULL: no NVLink, or unsupported
    Column("gpm_supported", Boolean, nullable=False, default=False),
)

gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("gpu_id", Integer, _gpu_fk(), nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    *_metric_columns(GPU_METRICS),
    PrimaryKeyConstraint("gpu_id", "ts_ms"),
    Index(None, "ts_ms"),  # retention, rollups and cross-GPU windows scan by time
    **_CLUSTERED,
)

# Per NVLink link: one row per (GPU, time, link), only for links that reported; a GPU without NVLink has none.
# Raw only (no rollups): the per-GPU sums in gpu_samples are what the rollups keep.
gpu_nvlink_samples = Table(
    "gpu_nvlink_samples",
    metadata,
    Column("gpu_id", Integer, _gpu_fk(), nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    Column("link", Integer, nullable=False),  # NVML's link index
    *_metric_columns(NVLINK_LINK_METRICS),
    PrimaryKeyConstraint("gpu_id", "ts_ms", "link"),
    Index(None, "ts_ms"),
    **_CLUSTERED,
)


def _receiver_ms() -> Column:
    """The latest row's sample time on the receiver's clock: ``ts_ms`` + the node's clock skew as its batch came,
    never after the batch's arrival; NULL: the skew was not known (a batch without ``sent_ms``)."""
    return Column("receiver_ms", BigInteger, nullable=True)


# The newest reading of each GPU and of each NVLink link, kept current by ingest in the transaction that inserts
# the samples: a newer time replaces the row, an equal or older one does not (the row is the newest row of the
# sample table, first write winning as there) — unless the node's clock stepped back: then its new readings are
# older by ts_ms than the held one, and replace it once their receiver_ms passes the held one's by
# trimtab.contract.readings.STEP_BACK_MARGIN_MS (a reading is frozen for that long, not for the size of the step).
# Latest-sample reads (/metrics, /v1/gpus) then cost one row a GPU whatever the history. Retention never touches
# them: a GPU whose raw rows aged out keeps the last reading it had (readers judge its age); deleting the GPU
# deletes its row.
gpu_latest = Table(
    "gpu_latest",
    metadata,
    Column("gpu_id", Integer, _gpu_fk(), primary_key=True, autoincrement=False),
    Column("ts_ms", BigInteger, nullable=False),
    *_metric_columns(GPU_METRICS),
    _receiver_ms(),
)

gpu_nvlink_latest = Table(
    "gpu_nvlink_latest",
    metadata,
    Column("gpu_id", Integer, _gpu_fk(), nullable=False),
    Column("link", Integer, nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    *_metric_columns(NVLINK_LINK_METRICS),
    _receiver_ms(),
    PrimaryKeyConstraint("gpu_id", "link"),
)

host_samples = Table(
    "host_samples",
    metadata,
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    *_metric_columns(HOST_METRICS),
    PrimaryKeyConstraint("node_id", "ts_ms"),
    Index(None, "ts_ms"),
    **_CLUSTERED,
)

gpu_processes = Table(
    "gpu_processes",
    metadata,
    Column("gpu_id", Integer, _gpu_fk(), nullable=False),
    Column("ts_ms", BigInteger, nullable=False),
    Column("pid", BigInteger, nullable=False),
    Column("used_memory_bytes", BigInteger),
    Column("name", String(255)),
    # Its GPU activity over (util_from_ms, util_to_ms]: mean SM % and memory % over that whole interval, of util_samples
    # NVML records (busy seconds = sm_util_pct / 100 × the interval)
    # (0 over 0 records: idle while NVML answered); all NULL where unknown (trimtab.agent.activity). Migration 0020.
    Column("sm_util_pct", Double),
    Column("mem_util_pct", Double),
    Column("util_samples", Integer),
    Column("util_from_ms", BigInteger),
    Column("util_to_ms", BigInteger),
    PrimaryKeyConstraint("gpu_id", "ts_ms", "pid"),
    Index(None, "ts_ms"),
    **_CLUSTERED,
)

# An event's identity is (node, time, kind, GPU, hash of xid + detail): NULL never takes part in a unique key,
# because SQLite and PostgreSQL both treat NULLs as distinct there, which would let a replay duplicate a node-wide
# event. Hence gpu_uuid is '' for node-wide events, and the detail (unbounded text, too long for a PostgreSQL
# b-tree entry) is keyed by a fixed-size digest.
health_events = Table(
    "health_events",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, _gpu_fk(), nullable=True),
    Column("gpu_uuid", String(96), nullable=False, server_default=""),
    Column("ts_ms", BigInteger, nullable=False, index=True),
    Column("kind", String(32), nullable=False),
    Column("xid", Integer),
    Column("detail", Text, nullable=False, server_default=""),
    Column("detail_hash", String(32), nullable=False),
    UniqueConstraint("node_id", "ts_ms", "kind", "gpu_uuid", "detail_hash"),
)


def _rollup_table(name: str) -> Table:
    value_columns = []
    for spec in GPU_METRICS:
        if spec.rollup:
            value_columns += [
                Column(f"{spec.name}_min", metric_type(spec)),
                Column(f"{spec.name}_mean", Double),
                Column(f"{spec.name}_max", metric_type(spec)),
            ]
    return Table(
        name,
        metadata,
        Column("gpu_id", Integer, _gpu_fk(), nullable=False),
        Column("bucket_ms", BigInteger, nullable=False),  # start of the bucket
        Column("n", Integer, nullable=False),  # raw samples in the bucket (the weight of its means)
        *value_columns,
        PrimaryKeyConstraint("gpu_id", "bucket_ms"),
        Index(None, "bucket_ms"),
        **_CLUSTERED,
    )


gpu_rollup_1m = _rollup_table("gpu_rollup_1m")
gpu_rollup_1h = _rollup_table("gpu_rollup_1h")

# The one row (id = ROLLUP_STATE_ID, created by the initial migration) says from where raw samples still have
# to be rolled up. Writers only ever lower it; the rollup raises it to the minute it has completed.
rollup_state = Table(
    "rollup_state",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("dirty_from_ms", BigInteger, nullable=True),  # NULL: nothing waits to be rolled up
)

# --- API: tokens, jobs and the rebalancer's record ------------------------------------------------------------
# JSON columns hold what a job declares as a whole (device map, knobs): read and written together, never queried
# inside. Ids of the tables that grow with every step are BIGINT on PostgreSQL; on SQLite an INTEGER primary key
# is the 64-bit rowid already (and only that spelling auto-increments).
_BIG_ID = BigInteger().with_variant(Integer, "sqlite")

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False),
    Column("scope", String(16), nullable=False),  # agent | job | admin
    Column("secret_sha256", String(64), nullable=False, unique=True),  # hex digest; the secret itself is never kept
    Column("created_ms", BigInteger, nullable=False),
    Column("last_used_ms", BigInteger),
    Column("revoked_ms", BigInteger),  # NULL: active
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("ranks", Integer, nullable=False),
    Column("device_map", JSON, nullable=False),  # {component: [local GPU index, …]}
    Column("hostnames", JSON, nullable=False),  # [hostname, …]
    Column("knobs", JSON, nullable=False),  # {knob: {"value", "min", "max"}}; value follows applied changes
    Column("mode", String(8), nullable=False),  # auto | advise | off
    Column("rules", JSON),  # the job's overrides of rules.toml ({"controller": …, "rules": {name: {key: value}}})
    Column("advise_only_reason", String(1024)),  # why the job declares no knobs (its framework cannot change them)
    Column("roles", JSON),  # [{"role", "node", "gpus", "pids", "source"}, …] (trimtab.contract.roles); NULL: none
    Column("owner_token_id", Integer, ForeignKey("api_tokens.id", ondelete="SET NULL")),
    Column("created_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
)

_STORAGE = {"bigint": BigInteger, "integer": Integer, "double": Double, "json": JSON}  # a contract Kind's storage


def _report_column(f: ReportField) -> Column:
    storage = String(f.kind.max_length) if f.kind.storage == "text" else _STORAGE[f.kind.storage]
    return Column(f.column, storage, nullable=not f.required)

# One row per (job, step, rank); its columns are the contract's step report fields (trimtab.contract.step_report:
# a phase p as p_s, memory keys by name, ``logged`` as JSON), so a new field there is a column here — and needs
# the migration that adds it.
job_reports = Table(
    "job_reports",
    metadata,
    Column("id", _BIG_ID, primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    *(_report_column(f) for f in REPORT_FIELDS),
    UniqueConstraint("job_id", "step", "rank"),  # a hook that resends a report after a timeout adds nothing
    Index(None, "received_ms"),
    Index(None, "job_id", "received_ms"),  # a job's newest report (every read of a job) in one seek
)

knob_changes = Table(
    "knob_changes",
    metadata,
    Column("id", _BIG_ID, primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("knob", String(64), nullable=False),
    Column("value", Double, nullable=False),
    Column("previous_value", Double),
    Column("reason", String(1024), nullable=False, server_default=""),
    Column("source", String(16), nullable=False),  # manual | rebalancer
    Column("status", String(16), nullable=False),  # pending | applied | refused | superseded | cancelled
    Column("created_ms", BigInteger, nullable=False),
    Column("applied_step", BigInteger),
    Column("applied_ms", BigInteger),
    Column("refused_reason", String(1024)),  # why the code owning the knob could not apply it
    Index(None, "job_id", "status"),
    # At most one change per job in flight (so each change is measured alone), enforced by the store
    # so two writers racing cannot both queue one.
    Index("uq_knob_changes_one_pending", "job_id", unique=True,
          sqlite_where=text("status = 'pending'"), postgresql_where=text("status = 'pending'")),
)

knob_acks = Table(
    "knob_acks",
    metadata,
    Column("change_id", _BIG_ID, ForeignKey("knob_changes.id", ondelete="CASCADE"), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("applied_at_step", BigInteger, nullable=False),
    Column("acked_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("change_id", "rank"),
)

def _job_history_columns() -> list[Column]:
    """The first columns of a row of a job's history (decisions, events): its id, the job (deleted with it), when."""
    return [Column("id", _BIG_ID, primary_key=True),
            Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
            Column("ts_ms", BigInteger, nullable=False)]


decisions = Table(
    "decisions",
    metadata,
    *_job_history_columns(),
    Column("rule", String(64), nullable=False),
    Column("evidence", JSON, nullable=False),
    Column("change_id", _BIG_ID, ForeignKey("knob_changes.id", ondelete="SET NULL")),
    Column("knob", String(64)),
    Column("old_value", Double),
    Column("new_value", Double),
    Column("applied_step", BigInteger),
    Column("throughput_before_samples_per_s", Double),  # over the window before the change
    Column("throughput_after_samples_per_s", Double),
    Column("outcome", String(16)),  # advised | pending | kept | rolled_back | refused | superseded | cancelled
    Column("advice", Text),
    Index(None, "job_id", "ts_ms"),
)

# The rebalancer's latest word on each job (control/gates.py, service.py): what its last plan said and why nothing
# was decided, and whether planning the job fails (since when, how often, the last error, when it is tried again).
job_plan_status = Table(
    "job_plan_status",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("planned_ms", BigInteger),  # the last plan that ran to its end; NULL: none yet
    Column("step", BigInteger),  # the newest step it saw
    Column("note", Text),
    Column("gate", JSON),  # {"name", "rule", "why", "window", "missing", "expects_step"}; NULL: it decided something
    Column("failing_since_ms", BigInteger),  # the first failure of the current run of failures; NULL: not failing
    Column("failures", Integer, nullable=False, server_default="0"),  # failures in a row (0 once a plan succeeds)
    Column("errors_total", BigInteger, nullable=False, server_default="0"),  # every failure ever (a counter)
    Column("last_error", JSON),  # {"type", "message", "stage", "step", "where", "at_ms"}
    Column("retry_at_ms", BigInteger),  # when the failing job is planned again (backoff); NULL: not failing
)

# Events about a job that are not decisions: planning failed (with the exception, the stage of the plan and the
# step) and planning recovered.
job_events = Table(
    "job_events",
    metadata,
    *_job_history_columns(),
    Column("kind", String(32), nullable=False),  # planning_failed | planning_recovered
    Column("detail", JSON, nullable=False),
    Index(None, "job_id", "ts_ms"),
)

# What the store knows of each node's clock (trimtab.store.clocks): when it was last heard from by the receiver's
# clock — even when its batches are refused — its skew (receiver's clock − node's clock), and when a batch of it was
# last refused for being dated ahead. Apart from ``nodes``, so the ingest path's node upsert stays as it is.
node_clocks = Table(
    "node_clocks",
    metadata,
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
    Column("heard_ms", BigInteger, nullable=False),  # receiver's clock, refreshed at least once a minute
    Column("clock_skew_ms", BigInteger),  # receiver − node; NULL: not measured (an agent that sends no clock)
    Column("refused_ms", BigInteger),  # receiver's clock when a batch was last refused for its clock; NULL: never
    Column("refused_detail", String(512)),  # why, in the ingest's own words
)

# Which server plans (control/leadership.py): one row, name "planner"; expires_ms in the database's clock; epoch
# goes up at every takeover, and a decision is written only by the holder of the current epoch.
planner_lease = Table(
    "planner_lease",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(200)),
    Column("epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("expires_ms", BigInteger, nullable=False, server_default=text("0")),
    Column("since_ms", BigInteger),
)

# The accumulated GPU-time ledger (trimtab.grading.ledger; /metrics' trimtab_job_gpu_seconds_total and
# trimtab_gpu_idle_seconds_total): GPU-seconds of each job's GPUs by kind (busy | idle), role and phase or cause,
# added up from when the ledger first saw the job; ``through_ms`` says up to when. Each scrape adds the time since
# (compare-and-set on through_ms, so two servers never add the same time twice): counters never go down, and no
# scrape reads more than the time since the last one.
job_ledger_state = Table(
    "job_ledger_state",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("through_ms", BigInteger, nullable=False),
)

job_gpu_ledger = Table(
    "job_gpu_ledger",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("kind", String(8), nullable=False),  # busy | idle
    Column("role", String(255), nullable=False),  # "" for no_job
    Column("name", String(64), nullable=False),  # the phase (busy) or the cause (idle)
    Column("waiting_for", String(255), nullable=False),  # the role a wait was for; "" otherwise
    Column("gpu_s", Double, nullable=False),
    PrimaryKeyConstraint("job_id", "hostname", "gpu_index", "kind", "role", "name", "waiting_for"),
)
