"""Upkeep of the store: 1-minute and 1-hour rollups of the GPU samples, retention of every table, and
:class:`Upkeep`, the one schedule they run on (in whichever component owns the store in this process: the agent's
store sink, or `trimtab server`'s main loop).

Both run as plain SQL that SQLite and PostgreSQL execute alike (``ts_ms - ts_ms % 60000`` buckets, ``INSERT …
SELECT … ON CONFLICT DO UPDATE``), in short transactions, so they can run beside a writing agent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from sqlalchemy import BigInteger, Connection, Engine, bindparam, case, delete, func, literal_column, select, update

from trimtab.contract.readings import ROLLUP_METRIC_NAMES
from trimtab.store.inserts import insert_for
from trimtab.store.models import (
    HOUR_MS,
    MINUTE_MS,
    ROLLUP_STATE_ID,
    ROLLUP_VALUE_COLUMNS,
    gpu_nvlink_samples,
    gpu_processes,
    gpu_rollup_1h,
    gpu_rollup_1m,
    gpu_samples,
    health_events,
    host_samples,
    rollup_state,
)
from trimtab.store.transactions import write_transaction

log = logging.getLogger(__name__)
DELETE_CHUNK_ROWS = 20_000  # rows per retention transaction: keeps SQLite's write lock short


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of row is kept, in seconds."""

    raw_s: int = 7 * 86400  # gpu_samples, host_samples, gpu_processes, gpu_nvlink_samples
    rollup_1m_s: int = 30 * 86400
    rollup_1h_s: int = 400 * 86400
    events_s: int = 90 * 86400


@dataclass(frozen=True)
class RollupResult:
    """Buckets written (inserted or recomputed) and the raw time range ``[from_ms, to_ms)`` rolled up."""

    minute_buckets: int = 0
    hour_buckets: int = 0
    from_ms: int | None = None
    to_ms: int | None = None


@dataclass(frozen=True)
class MaintenanceResult:
    rollup: RollupResult
    deleted: dict[str, int] = field(default_factory=dict)  # table name → rows deleted by retention


def _bucket(column, size_ms: int):
    # The size is rendered inline, not bound: PostgreSQL accepts "GROUP BY ts_ms - ts_ms % 60000" for the same
    # expression in the select list only when both carry the same literal, not two separate parameters.
    size = literal_column(str(size_ms), BigInteger)
    return column - column % size


def _minute_rollup(conn: Connection):
    """1-minute buckets of [start, end) recomputed from the raw samples."""
    s = gpu_samples.c
    bucket = _bucket(s.ts_ms, MINUTE_MS)
    values = []
    for name in ROLLUP_METRIC_NAMES:
        values += [func.min(s[name]), func.avg(s[name]), func.max(s[name])]
    query = (select(s.gpu_id, bucket, func.count(), *values)
             .where(s.ts_ms >= bindparam("start"), s.ts_ms < bindparam("end"))
             .group_by(s.gpu_id, bucket))
    return _upsert_from(conn, gpu_rollup_1m, query)


def _hour_rollup(conn: Connection):
    """1-hour buckets of [start, end) recomputed from the 1-minute rows: min of mins, max of maxes, and the mean
    of means weighted by each minute's sample count (minutes where the metric was NULL weigh nothing)."""
    m = gpu_rollup_1m.c
    bucket = _bucket(m.bucket_ms, HOUR_MS)
    values = []
    for name in ROLLUP_METRIC_NAMES:
        mean = m[f"{name}_mean"]
        weight = func.sum(case((mean.is_not(None), m.n)))
        values += [func.min(m[f"{name}_min"]), func.sum(mean * m.n) / weight, func.max(m[f"{name}_max"])]
    query = (select(m.gpu_id, bucket, func.sum(m.n), *values)
             .where(m.bucket_ms >= bindparam("start"), m.bucket_ms < bindparam("end"))
             .group_by(m.gpu_id, bucket))
    return _upsert_from(conn, gpu_rollup_1h, query)


def _upsert_from(conn: Connection, table, query):
    stmt = insert_for(conn.dialect, table).from_select(["gpu_id", "bucket_ms", "n", *ROLLUP_VALUE_COLUMNS], query)
    return stmt.on_conflict_do_update(
        index_elements=[table.c.gpu_id, table.c.bucket_ms],
        set_={c: stmt.excluded[c] for c in ("n", *ROLLUP_VALUE_COLUMNS)},
    ).execution_options(preserve_rowcount=True)  # buckets written, for the result


def rollup(engine: Engine, now_ms: int) -> RollupResult:
    """Recompute every complete minute from ``rollup_state.dirty_from_ms`` up to the minute holding ``now_ms``
    (which is still filling), then the hours those minutes belong to; finally mark them done.

    Works an hour of raw data per transaction and skips spans without samples, so catching up after days of
    downtime neither holds SQLite's write lock for long nor walks empty hours. Concurrent writers are safe: a
    sample older than the mark lowers it again (see :class:`~trimtab.store.ingest.BatchWriter`), and no writer
    can commit samples while a chunk is being computed — on SQLite the chunk holds the write lock, on
    PostgreSQL it takes ``LOCK gpu_samples IN SHARE MODE``, which waits for writers in flight and holds new ones
    until the chunk commits, so a sample can never land behind the mark unseen.
    """
    complete_ms = now_ms - now_ms % MINUTE_MS
    minute_buckets = hour_buckets = 0
    from_ms = to_ms = None
    state = rollup_state.c
    while True:
        with write_transaction(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("LOCK TABLE gpu_samples IN SHARE MODE")
            dirty_ms = conn.execute(select(state.dirty_from_ms).where(state.id == ROLLUP_STATE_ID)).scalar()
            if dirty_ms is None or dirty_ms >= complete_ms:
                break
            first_ms = conn.execute(select(func.min(gpu_samples.c.ts_ms)).where(
                gpu_samples.c.ts_ms >= dirty_ms, gpu_samples.c.ts_ms < complete_ms)).scalar()
            if first_ms is None:  # nothing (left) to roll up before the open minute
                end_ms = complete_ms
            else:
                start_ms = first_ms - first_ms % MINUTE_MS
                hour_ms = start_ms - start_ms % HOUR_MS
                end_ms = min(hour_ms + HOUR_MS, complete_ms)
                minute_buckets += conn.execute(_minute_rollup(conn), {"start": start_ms, "end": end_ms}).rowcount
                hour_buckets += conn.execute(_hour_rollup(conn), {"start": hour_ms, "end": hour_ms + HOUR_MS}).rowcount
                from_ms = start_ms if from_ms is None else min(from_ms, start_ms)
                to_ms = end_ms if to_ms is None else max(to_ms, end_ms)
            conn.execute(update(rollup_state).where(state.id == ROLLUP_STATE_ID).values(dirty_from_ms=end_ms))
    return RollupResult(minute_buckets, hour_buckets, from_ms, to_ms)


# (table, time column, policy field): what retention trims, and by which age.
_RETAINED = (
    (gpu_samples, gpu_samples.c.ts_ms, "raw_s"),
    (host_samples, host_samples.c.ts_ms, "raw_s"),
    (gpu_processes, gpu_processes.c.ts_ms, "raw_s"),
    (gpu_nvlink_samples, gpu_nvlink_samples.c.ts_ms, "raw_s"),
    (gpu_rollup_1m, gpu_rollup_1m.c.bucket_ms, "rollup_1m_s"),
    (gpu_rollup_1h, gpu_rollup_1h.c.bucket_ms, "rollup_1h_s"),
    (health_events, health_events.c.ts_ms, "events_s"),
)


def apply_retention(engine: Engine, now_ms: int, policy: RetentionPolicy = RetentionPolicy(),
                    chunk_rows: int = DELETE_CHUNK_ROWS) -> dict[str, int]:
    """Delete rows older than the policy allows; returns rows deleted per table.

    Deletes in transactions of about ``chunk_rows`` rows, bounded by time rather than by key (neither backend
    has a portable ``DELETE … LIMIT``): the time of the chunk's last row is found on the time index, and
    everything up to it goes. Rows sharing that exact time go together, so a chunk may exceed the size by a tick.
    """
    deleted = {}
    for table, ts, policy_field in _RETAINED:
        cutoff_ms = now_ms - getattr(policy, policy_field) * 1000
        last_of_chunk = select(ts).where(ts < cutoff_ms).order_by(ts).offset(chunk_rows - 1).limit(1)
        total = 0
        while True:
            with write_transaction(engine) as conn:
                upto_ms = conn.execute(last_of_chunk).scalar()
                older = ts <= upto_ms if upto_ms is not None else ts < cutoff_ms
                total += conn.execute(delete(table).where(older)).rowcount
            if upto_ms is None:
                break
        deleted[table.name] = total
    return deleted


def run_maintenance(engine: Engine, now_ms: int, policy: RetentionPolicy = RetentionPolicy()) -> MaintenanceResult:
    """Roll up first (so raw rows about to expire are in the rollups), then apply retention."""
    return MaintenanceResult(rollup(engine, now_ms), apply_retention(engine, now_ms, policy))


class Upkeep:
    """Runs :func:`run_maintenance` at most every ``every_s`` seconds, the first time ``first_after_s`` after it
    is made; call :meth:`maybe_run` as often as convenient (a loop's tick). Never raises: a store hiccup must not
    stop the caller, and the next period tries again."""

    def __init__(self, every_s: float = 60.0, policy: Optional[RetentionPolicy] = None, first_after_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.every_s, self.policy, self._clock = every_s, policy or RetentionPolicy(), clock
        self._due = clock() + first_after_s

    def maybe_run(self, engine: Engine, now_ms: Optional[int] = None) -> Optional[MaintenanceResult]:
        """Upkeep of ``engine``'s store if it is due (its result), else None."""
        if self._clock() < self._due:
            return None
        self._due = self._clock() + self.every_s
        try:
            return run_maintenance(engine, now_ms if now_ms is not None else int(time.time() * 1000), self.policy)
        except Exception as exc:  # noqa: BLE001 - said and retried next period
            log.warning("store upkeep failed (will retry): %s", exc)
            return None
