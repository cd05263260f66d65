"""Files a :class:`~trimtab.contract.readings.Batch` into the store: one transaction a batch, one executemany per
table with ``ON CONFLICT DO NOTHING`` (a replayed batch adds nothing), and node/GPU rows written only when they
change, so a steady stream of one-tick batches costs little more than the sample inserts themselves.

The statements are SQLAlchemy Core constructs in the dialect's flavour, compiled once per writer and executed on
the pooled DB-API connection. This is the one hot path of the store: SQLAlchemy's per-execution work (a
connection checkout with PostgreSQL's pre-ping, a transaction object, an execution context, processing each
parameter of each row) costs more than SQLite's own insert of a one-tick batch, and these parameters are plain
numbers and strings that need no processing. Everything else in the store goes through SQLAlchemy as usual.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Iterator, Optional, Sequence

from sqlalchemy import Engine, bindparam, case, literal_column, or_, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

from trimtab.contract.readings import GPU_METRIC_NAMES, HOST_METRIC_NAMES, NVLINK_LINK_METRIC_NAMES, \
    STEP_BACK_MARGIN_MS, Batch, GpuInfo, NodeInfo
from trimtab.store.inserts import insert_for
from trimtab.store.models import (
    ROLLUP_STATE_ID,
    UNKNOWN_GPU_INDEX,
    gpu_latest,
    gpu_nvlink_latest,
    gpu_nvlink_samples,
    gpu_processes,
    gpu_samples,
    gpus,
    health_events,
    host_samples,
    nodes,
    rollup_state,
)
from trimtab.store.transactions import sqlite_writer_turn

# What one BatchWriter remembers of the nodes and GPUs it filed (so a steady stream costs no lookups): at most this
# many of each; past it, it forgets them all and looks up again the ones that still write. Host names that come and
# go (pods) would otherwise grow it by one entry per name ever seen, in each of a server's ingest writers.
MAX_REMEMBERED = 10_000
# nodes.last_seen_ms is refreshed at most this often (in sample time): one upsert a minute instead of one a batch.
LAST_SEEN_RESOLUTION_MS = 60_000


@dataclass(frozen=True)
class IngestResult:
    """What one :meth:`BatchWriter.write` stored. ``duplicates``: rows of the batch already in the store (or
    repeated within it), summed over the tables — a full replay has ``total_inserted == 0``."""

    gpu_samples_inserted: int = 0
    host_samples_inserted: int = 0
    processes_inserted: int = 0
    events_inserted: int = 0
    nvlink_samples_inserted: int = 0  # per-link NVLink rows
    duplicates: int = 0

    @property
    def total_inserted(self) -> int:
        return (self.gpu_samples_inserted + self.host_samples_inserted + self.processes_inserted
                + self.events_inserted + self.nvlink_samples_inserted)


@dataclass(frozen=True)
class _GpuRow:
    id: int
    node_id: int
    info: Optional[GpuInfo]  # None: a placeholder row, created from a sample before the inventory came


# (ts_ms, metric, …) of a reading, in one C call.
_gpu_values = attrgetter("ts_ms", *GPU_METRIC_NAMES)
_host_values = attrgetter("ts_ms", *HOST_METRIC_NAMES)
_link_values = attrgetter("ts_ms", "link", *NVLINK_LINK_METRIC_NAMES)
_process_values = attrgetter("ts_ms", "pid", "used_memory_bytes", "name", "sm_util_pct", "mem_util_pct",
                             "util_samples", "util_from_ms", "util_to_ms")
_ts = attrgetter("ts_ms")


def _finite(rows: list[tuple]) -> list[tuple]:
    """The rows with NaN and ±inf replaced by NULL (neither backend stores them portably, and they would
    poison AVG/MAX). One C-level sum over the whole batch answers "all finite?" in the common case; only a
    batch holding a bad value pays for a per-value pass (as does a sum that overflows, harmlessly)."""
    try:
        if math.isfinite(sum(filter(None, chain.from_iterable(rows)))):
            return rows
    except (TypeError, OverflowError):
        pass
    return [tuple(None if isinstance(v, float) and not math.isfinite(v) else v for v in row) for row in rows]


_PYFORMAT = re.compile(r"%\((\w+)\)s")


def _detail_hash(xid: Optional[int], detail: str) -> str:
    return hashlib.blake2b(f"{'' if xid is None else xid}\x1f{detail}".encode(), digest_size=16).hexdigest()


def _columns(table) -> tuple[str, ...]:
    return tuple(c.name for c in table.columns if c.name != "id")


def _rows(batch: Batch, node_id: int, ids: dict[str, int]) -> tuple[tuple[str, list[tuple]], ...]:
    """(table, rows) of the batch, each row a tuple in the table's column order (KeyError: a GPU not in ``ids``)."""
    return (
        ("gpu_samples", _finite([(ids[s.gpu_uuid], *_gpu_values(s)) for s in batch.gpu_samples])),
        ("host_samples", _finite([(node_id, *_host_values(h)) for h in batch.host_samples])),
        ("gpu_processes", _finite([(ids[p.gpu_uuid], *_process_values(p)) for p in batch.processes])),
        ("health_events", [(node_id, None if e.gpu_uuid is None else ids[e.gpu_uuid], e.gpu_uuid or "", e.ts_ms,
                            e.kind, e.xid, e.detail or "", _detail_hash(e.xid, e.detail or "")) for e in batch.events]),
        ("gpu_nvlink_samples", _finite([(ids[n.gpu_uuid], *_link_values(n)) for n in batch.nvlink_samples])),
    )


def _newest_rows(rows: list[tuple], key_at: tuple[int, ...]) -> list[tuple]:
    """Of sample rows (gpu, time, …): the newest row of each key (the values at ``key_at``), the first one of a tie
    as the sample insert keeps the first, sorted by key — every writer then locks the latest rows in the same
    order, so two PostgreSQL writers of overlapping GPUs cannot deadlock."""
    newest: dict[tuple, tuple] = {}
    for row in rows:
        key = tuple(row[i] for i in key_at)
        held = newest.get(key)
        if held is None or row[1] > held[1]:
            newest[key] = row
    return [newest[k] for k in sorted(newest)]


def _latest_upsert(table, dialect: Dialect, key: Sequence[str], columns: Sequence[str]) -> "DriverStatement":
    """``INSERT … ON CONFLICT (key) DO UPDATE`` of a latest-row table (``columns`` end with ``receiver_ms``), taking
    the new row when it is newer by ``ts_ms``, or by ``receiver_ms`` past STEP_BACK_MARGIN_MS (a clock stepped
    back; NULL on either side: ``ts_ms`` alone decides)."""
    stmt = insert_for(dialect, table)
    new, held = stmt.excluded, table.c
    stmt = stmt.on_conflict_do_update(
        index_elements=[held[k] for k in key],
        set_={c: new[c] for c in columns if c not in key},
        where=or_(new.ts_ms > held.ts_ms,
                  new.receiver_ms > held.receiver_ms + literal_column(str(STEP_BACK_MARGIN_MS))))
    return DriverStatement(stmt, dialect, columns)


def _with_receiver_ms(rows: list[tuple], now_ms: Optional[int], skew_ms: Optional[int]) -> list[tuple]:
    """Latest rows (gpu, time, …) with their time on the receiver's clock appended: ``ts_ms + skew_ms``, at most
    ``now_ms`` (a batch kept from before a step, sent after it, must not claim a time to come); None without a
    skew."""
    if skew_ms is None or now_ms is None:
        return [(*row, None) for row in rows]
    return [(*row, min(row[1] + skew_ms, now_ms)) for row in rows]


class DriverStatement:
    """A Core statement compiled once for a dialect, to run on that dialect's DB-API connection with rows given
    as tuples in ``columns`` order. Named parameters (psycopg's ``%(name)s``) are rewritten positional
    (``%s``): psycopg would otherwise rebuild every row's dict into a list itself."""

    def __init__(self, stmt, dialect: Dialect, columns: Sequence[str]):
        compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
        self.columns = tuple(columns)
        if compiled.positiontup is not None:
            self.sql, order = str(compiled), list(compiled.positiontup)
        elif dialect.paramstyle == "pyformat":
            order = _PYFORMAT.findall(str(compiled))
            self.sql = _PYFORMAT.sub("%s", str(compiled))
        else:
            raise ValueError(f"parameter style {dialect.paramstyle!r} of {dialect.name} is not supported")
        if set(order) != set(self.columns):
            raise ValueError(f"statement parameters {sorted(order)} are not the columns {sorted(self.columns)}")
        self._pick = None if order == list(self.columns) else [self.columns.index(n) for n in order]

    def params(self, row: tuple) -> tuple:
        return row if self._pick is None else tuple(row[i] for i in self._pick)

    def start_many(self, driver, rows: list[tuple]):
        """One executemany on a cursor of its own, whose ``rowcount`` then tells the rows affected (in a psycopg
        pipeline: once the pipeline has synced). None when there are no rows."""
        if not rows:
            return None
        cursor = driver.cursor()
        cursor.executemany(self.sql, rows if self._pick is None else list(map(self.params, rows)))
        return cursor

    def execute(self, driver, row: tuple):
        cursor = driver.cursor()
        cursor.execute(self.sql, self.params(row))
        return cursor

    def scalar(self, driver, row: tuple):
        """The first column of the first row returned (the id from ``RETURNING``), or None."""
        found = self.execute(driver, row).fetchone()
        return None if found is None else found[0]


class BatchWriter:
    """Writes batches into one engine's store.

    Holds one pooled connection between batches and drops it on any error (the next write checks out a fresh,
    pre-pinged one). Remembers the node and GPU ids it has filed, so a batch whose inventory is unchanged
    costs no lookups. One writer per thread; :meth:`close` returns the connection to the pool.
    """

    def __init__(self, engine: Engine, max_remembered: int = MAX_REMEMBERED):
        self._engine = engine
        self.max_remembered = max_remembered
        self._pooled = None  # the pool's proxy of the DB-API connection held between batches
        self._node_ids: dict[str, tuple[int, NodeInfo, int]] = {}  # hostname → (id, info filed, last_seen_ms)
        self._gpus: dict[str, _GpuRow] = {}
        self._ids: dict[str, int] = {}  # uuid → id of self._gpus, for the row loops
        self._inventory: tuple[Optional[int], list[GpuInfo]] = (None, [])  # the node and GPUs last filed
        dialect = engine.dialect
        # SQLite: take the write lock first, like store.transactions.write_transaction. psycopg begins by itself.
        self._begin = "BEGIN IMMEDIATE" if dialect.name == "sqlite" else None
        self._pipelined = dialect.name == "postgresql"
        self._insert = {t.name: DriverStatement(insert_for(dialect, t).on_conflict_do_nothing(), dialect, _columns(t))
                        for t in (gpu_samples, host_samples, gpu_processes, health_events, gpu_nvlink_samples)}
        # The latest-row tables take rows in the sample tables' column order (gpu, time[, link], metrics).
        self._upsert_latest = {
            "gpu_samples": (_latest_upsert(gpu_latest, dialect, ("gpu_id",),
                                           (*_columns(gpu_samples), "receiver_ms")), (0,)),
            "gpu_nvlink_samples": (_latest_upsert(gpu_nvlink_latest, dialect, ("gpu_id", "link"),
                                                  (*_columns(gpu_nvlink_samples), "receiver_ms")), (0, 2))}
        state = rollup_state.c
        self._lower_dirty = DriverStatement(
            update(rollup_state)
            .where(state.id == literal_column(str(ROLLUP_STATE_ID)),  # inline: the one parameter is from_ms
                   or_(state.dirty_from_ms.is_(None), state.dirty_from_ms > bindparam("from_ms")))
            .values(dirty_from_ms=bindparam("from_ms")), dialect, ("from_ms",))
        node_stmt = insert_for(dialect, nodes)
        ex, cur = node_stmt.excluded, nodes.c
        self._upsert_node = DriverStatement(node_stmt.on_conflict_do_update(index_elements=[cur.hostname], set_={
            "simulated": ex.simulated, "scenario": ex.scenario,
            "driver_version": ex.driver_version, "nvml_version": ex.nvml_version,
            "first_seen_ms": case((ex.first_seen_ms < cur.first_seen_ms, ex.first_seen_ms), else_=cur.first_seen_ms),
            "last_seen_ms": case((ex.last_seen_ms > cur.last_seen_ms, ex.last_seen_ms), else_=cur.last_seen_ms),
        }).returning(cur.id), dialect, _columns(nodes))
        gpu_stmt = insert_for(dialect, gpus)
        self._upsert_gpu = DriverStatement(gpu_stmt.on_conflict_do_update(
            index_elements=[gpus.c.uuid], set_={c: gpu_stmt.excluded[c] for c in _columns(gpus) if c != "uuid"},
        ).returning(gpus.c.id), dialect, _columns(gpus))
        self._insert_placeholder = DriverStatement(gpu_stmt.on_conflict_do_nothing(index_elements=[gpus.c.uuid]),
                                                   dialect, ("node_id", "uuid", "gpu_index", "name", "gpm_supported"))
        self._gpu_id = DriverStatement(select(gpus.c.id).where(gpus.c.uuid == bindparam("uuid")), dialect, ("uuid",))

    def close(self) -> None:
        if self._pooled is not None:
            pooled, self._pooled = self._pooled, None
            pooled.close()

    def write(self, batch: Batch, now_ms: Optional[int] = None, skew_ms: Optional[int] = None) -> IngestResult:
        """Store ``batch`` in one transaction and return what was new. Idempotent: writing the same batch again
        inserts nothing. A GPU named by a sample but absent from ``batch.gpus`` gets a placeholder row.
        ``now_ms``/``skew_ms``: the receiver's clock as the batch came and the node's skew against it (receiver −
        node), so the latest rows follow a node whose clock stepped back (None: not known, ``ts_ms`` decides)."""
        if self._pooled is None:
            self._pooled = self._engine.raw_connection()
        driver = self._pooled.driver_connection
        new_nodes: dict[str, tuple[int, NodeInfo, int]] = {}
        new_gpus: dict[str, _GpuRow] = {}
        try:
            with sqlite_writer_turn(self._engine), self._driver_errors():
                if self._begin:
                    driver.execute(self._begin)
                node_id = self._node_id(driver, batch, new_nodes)
                ids = self._file_inventory(driver, batch, node_id, new_gpus)
                try:
                    tables = _rows(batch, node_id, ids)
                except KeyError:  # a GPU the store has no row for: rare, so looked for only when it happens
                    ids = self._with_placeholders(driver, batch, node_id, ids, new_gpus)
                    tables = _rows(batch, node_id, ids)
                samples = batch.gpu_samples
                # psycopg: all statements of the batch in one pipeline, i.e. one round trip instead of one each.
                with driver.pipeline() if self._pipelined else nullcontext():
                    cursors = [self._insert[name].start_many(driver, rows) for name, rows in tables]
                    for name, rows in tables:  # in the same transaction: the latest rows never lag the samples
                        if name in self._upsert_latest and rows:
                            upsert, key_at = self._upsert_latest[name]
                            upsert.start_many(driver, _with_receiver_ms(_newest_rows(rows, key_at), now_ms,
                                                                        skew_ms))
                    if samples:
                        # Late or replayed samples must be rolled up again. Last, so that on PostgreSQL a writer
                        # that lowers the mark holds the rollup_state row lock only until its commit.
                        self._lower_dirty.start_many(driver, [(min(map(_ts, samples)),)])
                inserted = [0 if c is None else c.rowcount for c in cursors]
                driver.commit()
        except BaseException:
            self._discard()
            raise
        forget = (len(self._node_ids) + len(new_nodes) > self.max_remembered
                  or len(self._gpus) + len(new_gpus) > self.max_remembered)
        if forget:  # the next batches look up again what they name (one upsert or select each)
            self._node_ids, self._gpus, self._ids = {}, {}, {}
        self._node_ids.update(new_nodes)  # only once committed: a rolled-back id must not be remembered
        if new_gpus:
            self._gpus.update(new_gpus)
            self._ids = {u: g.id for u, g in self._gpus.items()}
        self._inventory = (None, []) if forget else (node_id, list(batch.gpus))  # a copy: the caller may reuse it
        offered = sum(len(rows) for _, rows in tables)
        return IngestResult(*inserted, duplicates=offered - sum(inserted))

    @contextmanager
    def _driver_errors(self) -> Iterator[None]:
        """Driver errors raised as SQLAlchemy raises them, so callers tell a store that is down
        (``OperationalError``, ``connection_invalidated``) from a batch it refuses, as for any statement."""
        dialect = self._engine.dialect
        try:
            yield
        except dialect.loaded_dbapi.Error as exc:
            gone = dialect.is_disconnect(exc, self._pooled.dbapi_connection, None)
            if gone:
                self._pooled.invalidate(exc)
            raise DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=gone,
                                      dialect=dialect) from exc

    def _discard(self) -> None:
        """After any error: roll back if still possible and never reuse the connection."""
        try:
            if self._pooled is not None and self._pooled.dbapi_connection is not None:
                self._pooled.rollback()
        except Exception:  # noqa: BLE001 - the connection is being dropped either way
            self._pooled.invalidate()
        self.close()

    # -- node and GPUs ---------------------------------------------------------------------------------------

    def _node_id(self, driver, batch: Batch, new_nodes: dict) -> int:
        node = batch.node
        times = [t for rows in (batch.gpu_samples, batch.host_samples, batch.processes, batch.events,
                                batch.nvlink_samples) if rows
                 for t in (min(map(_ts, rows)), max(map(_ts, rows)))]
        last_ms = max(times) if times else int(time.time() * 1000)
        known = self._node_ids.get(node.hostname)
        if known is not None and (known[1] is node or known[1] == node) \
                and last_ms < known[2] + LAST_SEEN_RESOLUTION_MS:
            return known[0]
        node_id = self._upsert_node.scalar(driver, (
            node.hostname, node.simulated, node.scenario, node.driver_version, node.nvml_version,
            min(times) if times else last_ms, last_ms))
        new_nodes[node.hostname] = (node_id, node, max(last_ms, known[2]) if known else last_ms)
        return node_id

    def _file_inventory(self, driver, batch: Batch, node_id: int, new_gpus: dict[str, _GpuRow]) -> dict[str, int]:
        """Upsert the GPUs of ``batch.gpus`` that changed; return uuid → id of every GPU known."""
        if (node_id, batch.gpus) != self._inventory:  # list ==: element identity first, at C speed
            for info in batch.gpus:
                known = self._gpus.get(info.uuid)
                if known is None or known.node_id != node_id or not (known.info is info or known.info == info):
                    peak = info.pcie_peak_bytes_per_s
                    gpu_id = self._upsert_gpu.scalar(driver, (
                        node_id, info.uuid, info.index, info.name, info.memory_total_bytes, info.pcie_max_gen,
                        info.pcie_max_width, peak if peak is None or math.isfinite(peak) else None,
                        info.nvlink_link_count, info.gpm_supported))
                    new_gpus[info.uuid] = _GpuRow(gpu_id, node_id, info)
        return self._ids if not new_gpus else {**self._ids, **{u: g.id for u, g in new_gpus.items()}}

    def _with_placeholders(self, driver, batch: Batch, node_id: int, ids: dict[str, int],
                           new_gpus: dict[str, _GpuRow]) -> dict[str, int]:
        """The batch names GPUs the store has no row for: keep their readings, under rows the inventory will
        complete later (index -1, name unknown) — dropping data because the inventory lagged would be worse."""
        named = {s.gpu_uuid for s in batch.gpu_samples}.union(p.gpu_uuid for p in batch.processes)
        named.update(n.gpu_uuid for n in batch.nvlink_samples)
        named.update(e.gpu_uuid for e in batch.events if e.gpu_uuid is not None)
        ids = dict(ids)
        for uuid in sorted(named.difference(ids)):
            self._insert_placeholder.execute(driver, (node_id, uuid, UNKNOWN_GPU_INDEX, "unknown", False))
            ids[uuid] = self._gpu_id.scalar(driver, (uuid,))
            new_gpus[uuid] = _GpuRow(ids[uuid], node_id, None)
        return ids
