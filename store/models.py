"""The store's tables, as SQLAlchemy Core ``Table``s in one ``metadata``; metric columns come from the specs in
:mod:`trimtab.agent.readings`, so a metric is named in exactly one place.

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
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from trimtab.agent.readings import GPU_METRICS, HOST_METRICS, ROLLUP_METRIC_NAMES, MetricSpec

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
