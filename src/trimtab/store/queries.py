"""The reads the rest of trimtab makes of the store (CLI, rebalancer, API), returning plain dataclasses.

Callers never see SQLAlchemy rows, so the schema can change behind these functions. Every query is shaped to
use an index: the (gpu, time) primary keys for per-GPU reads, the time indexes for cross-GPU windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from sqlalchemy import Double, Engine, Select, cast, func, select, text
from sqlalchemy.exc import SQLAlchemyError

from trimtab.contract.readings import GPU_METRIC_NAMES, HOST_METRIC_NAMES, NVLINK_LINK_METRIC_NAMES, ROLLUP_METRIC_NAMES
from trimtab.store.models import (HOUR_MS, MINUTE_MS, ROLLUP_VALUE_COLUMNS, gpu_latest, gpu_nvlink_latest,
                                  gpu_nvlink_samples, gpu_rollup_1h, gpu_rollup_1m, gpu_samples, gpus, host_samples,
                                  nodes)
from trimtab.store.models import health_events as health_events_table

Resolution = Literal["auto", "raw", "1m", "1h"]
AUTO_RAW_MAX_MS = 2 * HOUR_MS  # auto: raw samples for windows up to 2 h …
AUTO_1M_MAX_MS = 72 * HOUR_MS  # … 1-minute rollups up to 3 days, 1-hour rollups beyond
Number = Optional[float]


@dataclass(frozen=True)
class StoredNode:
    id: int
    hostname: str
    simulated: bool
    scenario: Optional[str]
    driver_version: Optional[str]
    nvml_version: Optional[str]
    first_seen_ms: int
    last_seen_ms: int


@dataclass(frozen=True)
class StoredGpu:
    id: int
    hostname: str
    simulated: bool
    uuid: str
    index: int  # -1 for a placeholder created from samples before the GPU's inventory arrived
    name: str
    memory_total_bytes: Optional[int]
    pcie_max_gen: Optional[int]
    pcie_max_width: Optional[int]
    pcie_peak_bytes_per_s: Optional[float]
    nvlink_link_count: Optional[int]
    gpm_supported: bool


@dataclass(frozen=True)
class GpuLabel:
    """Which GPU a set of numbers belongs to, with the facts needed to read them (link peaks)."""

    hostname: str
    simulated: bool
    gpu_uuid: str
    gpu_index: int
    gpu_name: str
    pcie_peak_bytes_per_s: Optional[float]
    nvlink_link_count: Optional[int]


@dataclass(frozen=True)
class LatestSample(GpuLabel):
    ts_ms: int
    metrics: dict[str, Number]  # every GPU metric; None = not measured


@dataclass(frozen=True)
class LatestLink(GpuLabel):
    """The newest reading of one NVLink link of a GPU."""

    ts_ms: int
    link: int
    metrics: dict[str, Number]  # every per-link metric; None = not measured


@dataclass(frozen=True)
class GpuAggregate(GpuLabel):
    n_samples: int
    mean: dict[str, Number]  # every GPU metric; None where it was NULL in every sample of the window
    max: dict[str, Number]
    first_ts_ms: Optional[int] = None  # the oldest and newest sample in the window (how fresh, at which cadence)
    last_ts_ms: Optional[int] = None


@dataclass(frozen=True)
class WindowPoint:
    """One point of a series. Raw points: n = 1 and min, mean and max are the same dict (the sample's values)."""

    ts_ms: int  # sample time, or bucket start
    n: int
    mean: dict[str, Number]
    min: dict[str, Number]
    max: dict[str, Number]


@dataclass(frozen=True)
class GpuSeries:
    gpu_uuid: str
    resolution: Literal["raw", "1m", "1h"]
    start_ms: int
    end_ms: int
    points: list[WindowPoint]
    truncated: bool  # more points matched than max_points: these are the latest max_points


@dataclass(frozen=True)
class StoredEvent:
    id: int
    hostname: str
    ts_ms: int
    kind: str
    gpu_uuid: Optional[str]  # None for node-wide events
    xid: Optional[int]
    detail: str


@dataclass(frozen=True)
class HostPoint:
    ts_ms: int
    metrics: dict[str, Number]


@dataclass(frozen=True)
class StoreHealth:
    reachable: bool  # the store answered a trivial query
    simulated: bool  # it knows a simulated node (False when unreachable: unknown)


def store_health(engine: Engine) -> StoreHealth:
    """Whether the store answers, and whether any node it knows is simulated; an outage is an answer, never an
    exception (this is what the health probe asks)."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            simulated = conn.execute(select(nodes.c.id).where(nodes.c.simulated).limit(1)).first() is not None
    except (SQLAlchemyError, OSError):
        return StoreHealth(reachable=False, simulated=False)
    return StoreHealth(reachable=True, simulated=simulated)


def _node_filter(query: Select, hostname: Optional[str]) -> Select:
    return query if hostname is None else query.where(nodes.c.hostname == hostname)


def list_nodes(engine: Engine) -> list[StoredNode]:
    with engine.connect() as conn:
        rows = conn.execute(select(*nodes.c).order_by(nodes.c.hostname)).mappings().all()
    return [StoredNode(**row) for row in rows]


def list_gpus(engine: Engine, hostname: Optional[str] = None) -> list[StoredGpu]:
    g = gpus.c
    query = select(g.id, nodes.c.hostname, nodes.c.simulated, g.uuid, g.gpu_index.label("index"), g.name,
                   g.memory_total_bytes, g.pcie_max_gen, g.pcie_max_width, g.pcie_peak_bytes_per_s,
                   g.nvlink_link_count, g.gpm_supported).join_from(gpus, nodes)
    query = _node_filter(query, hostname).order_by(nodes.c.hostname, g.gpu_index, g.uuid)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [StoredGpu(**row) for row in rows]


_LABEL_COLUMNS = (nodes.c.hostname, nodes.c.simulated, gpus.c.uuid.label("gpu_uuid"),
                  gpus.c.gpu_index, gpus.c.name.label("gpu_name"), gpus.c.pcie_peak_bytes_per_s,
                  gpus.c.nvlink_link_count)


_LABEL_NAMES = tuple(c.name for c in _LABEL_COLUMNS)  # once: a column's .name costs ~0.1 ms a row (2 560 rows a scrape)


def _label(row) -> dict:
    return {name: row[name] for name in _LABEL_NAMES}


def latest_gpu_samples(engine: Engine, hostname: Optional[str] = None,
                       not_after_ms: Optional[int] = None) -> list[LatestSample]:
    """The newest sample of every GPU (of ``hostname``), read from ``gpu_latest`` (one row a GPU, kept current by
    ingest), so its cost does not grow with the samples stored. With ``not_after_ms`` the newest one not after it:
    a far-future sample must not hide the real ones, so a GPU whose latest row is later is looked up by one
    backwards step on its primary key in ``gpu_samples`` (rare: only a node with a wrong clock writes such rows).
    A GPU keeps its latest reading after retention deleted its raw rows; callers judge its age."""
    latest = gpu_latest.c
    columns = (*_LABEL_COLUMNS, latest.gpu_id, latest.ts_ms, *(latest[m] for m in GPU_METRIC_NAMES))
    query = _node_filter(select(*columns).join_from(gpus, nodes).join(gpu_latest, latest.gpu_id == gpus.c.id),
                         hostname).order_by(nodes.c.hostname, gpus.c.gpu_index)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
        if not_after_ms is not None and any(r["ts_ms"] > not_after_ms for r in rows):
            rows = [r if r["ts_ms"] <= not_after_ms else _sample_not_after(conn, r, not_after_ms) for r in rows]
    return [LatestSample(**_label(r), ts_ms=r["ts_ms"], metrics={m: r[m] for m in GPU_METRIC_NAMES})
            for r in rows if r is not None]


def _sample_not_after(conn, latest_row, not_after_ms: int):
    """The GPU of ``latest_row`` at its newest sample not after ``not_after_ms`` (a backwards step on the
    (gpu, time) primary key), with the row's labels; None when it has none."""
    s = gpu_samples.c
    found = conn.execute(select(s.ts_ms, *(s[m] for m in GPU_METRIC_NAMES))
                         .where(s.gpu_id == latest_row["gpu_id"], s.ts_ms <= not_after_ms)
                         .order_by(s.ts_ms.desc()).limit(1)).mappings().first()
    return None if found is None else {**latest_row, **found}


def latest_nvlink_samples(engine: Engine, hostname: Optional[str] = None,
                          not_after_ms: Optional[int] = None) -> list[LatestLink]:
    """Every link of every GPU at the GPU's newest per-link reading (a refresh reads all links at once: a link
    whose newest reading is older than its GPU's newest is left out), from ``gpu_nvlink_latest``; with
    ``not_after_ms`` the newest one not after it (a GPU whose links read later is looked up in
    ``gpu_nvlink_samples`` by its primary key, as :func:`latest_gpu_samples` does). GPUs without NVLink have no
    rows, so none here."""
    latest = gpu_nvlink_latest.c
    columns = (*_LABEL_COLUMNS, latest.gpu_id, latest.ts_ms, latest.link,
               *(latest[m] for m in NVLINK_LINK_METRIC_NAMES))
    query = _node_filter(select(*columns).join_from(gpus, nodes).join(gpu_nvlink_latest, latest.gpu_id == gpus.c.id),
                         hostname).order_by(nodes.c.hostname, gpus.c.gpu_index, latest.link)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
        by_gpu: dict[int, list] = {}
        for r in rows:
            by_gpu.setdefault(r["gpu_id"], []).append(r)
        out = []
        for links in by_gpu.values():
            if not_after_ms is not None and any(r["ts_ms"] > not_after_ms for r in links):
                links = _links_not_after(conn, links[0], not_after_ms)
            newest = max((r["ts_ms"] for r in links), default=None)
            out += [r for r in links if r["ts_ms"] == newest]
    return [LatestLink(**_label(r), ts_ms=r["ts_ms"], link=r["link"],
                       metrics={m: r[m] for m in NVLINK_LINK_METRIC_NAMES}) for r in out]


def _links_not_after(conn, latest_row, not_after_ms: int) -> list[dict]:
    """Every link of the GPU of ``latest_row`` at its newest per-link reading not after ``not_after_ms``."""
    n = gpu_nvlink_samples.c
    gpu_id = latest_row["gpu_id"]
    newest = conn.execute(select(n.ts_ms).where(n.gpu_id == gpu_id, n.ts_ms <= not_after_ms)
                          .order_by(n.ts_ms.desc()).limit(1)).scalar()
    if newest is None:
        return []
    found = conn.execute(select(n.ts_ms, n.link, *(n[m] for m in NVLINK_LINK_METRIC_NAMES))
                         .where(n.gpu_id == gpu_id, n.ts_ms == newest).order_by(n.link)).mappings().all()
    return [{**latest_row, **f} for f in found]


def gpu_aggregates(engine: Engine, start_ms: int, end_ms: int, hostname: Optional[str] = None) -> list[GpuAggregate]:
    """Mean and maximum of every metric per GPU over raw samples in ``[start_ms, end_ms)``; only GPUs with
    samples in the window. SQL AVG/MAX skip NULLs, so a metric a GPU never reported stays None (not 0)."""
    s = gpu_samples.c
    aggregates = []
    for m in GPU_METRIC_NAMES:
        aggregates += [cast(func.avg(s[m]), Double).label(f"mean_{m}"), func.max(s[m]).label(f"max_{m}")]
    per_gpu = (select(s.gpu_id, func.count().label("n_samples"), func.min(s.ts_ms).label("first_ts_ms"),
                      func.max(s.ts_ms).label("last_ts_ms"), *aggregates)
               .where(s.ts_ms >= start_ms, s.ts_ms < end_ms).group_by(s.gpu_id).subquery())
    query = select(*_LABEL_COLUMNS, per_gpu).join_from(gpus, nodes).join(per_gpu, per_gpu.c.gpu_id == gpus.c.id)
    query = _node_filter(query, hostname).order_by(nodes.c.hostname, gpus.c.gpu_index)
    with engine.connect() as conn:
        result = conn.execute(query)
        at = {key: i for i, key in enumerate(result.keys())}
        rows = result.all()
    # By position, each column's place looked up once: 32 lookups a GPU by name were ~70 ms of 1 280 GPUs (issue 39).
    label_at = [(name, at[name]) for name in _LABEL_NAMES]
    mean_at = [(m, at[f"mean_{m}"]) for m in GPU_METRIC_NAMES]
    max_at = [(m, at[f"max_{m}"]) for m in GPU_METRIC_NAMES]
    n_at, first_at, last_at = at["n_samples"], at["first_ts_ms"], at["last_ts_ms"]
    return [GpuAggregate(**{name: r[i] for name, i in label_at}, n_samples=r[n_at],
                         mean={m: _float(r[i]) for m, i in mean_at}, max={m: _float(r[i]) for m, i in max_at},
                         first_ts_ms=r[first_at], last_ts_ms=r[last_at])
            for r in rows]


def previous_sample_ms(engine: Engine, gpu_uuid: str, before_ms: int) -> Optional[int]:
    """The time of the GPU's newest sample before ``before_ms`` (one backwards step on its primary key), or None.
    ORDER BY … LIMIT 1, not MAX over a join: PostgreSQL turns only a one-table MAX into an index step, and
    otherwise reads every earlier sample of the GPU."""
    s = gpu_samples.c
    gpu_id = select(gpus.c.id).where(gpus.c.uuid == gpu_uuid).scalar_subquery()
    query = select(s.ts_ms).where(s.gpu_id == gpu_id, s.ts_ms < before_ms).order_by(s.ts_ms.desc()).limit(1)
    with engine.connect() as conn:
        return conn.execute(query).scalar()


def _float(value) -> Number:
    return None if value is None else float(value)


def pick_resolution(start_ms: int, end_ms: int) -> Literal["raw", "1m", "1h"]:
    span_ms = end_ms - start_ms
    return "raw" if span_ms <= AUTO_RAW_MAX_MS else "1m" if span_ms <= AUTO_1M_MAX_MS else "1h"


def gpu_window(engine: Engine, gpu_uuid: str, start_ms: int, end_ms: int, resolution: Resolution = "auto",
               max_points: int = 5000) -> GpuSeries:
    """One GPU's series over ``[start_ms, end_ms)``: raw samples or rollup buckets (those starting in the
    window's first bucket or later). ``auto`` picks raw up to 2 h, 1-minute rollups up to 3 days, else 1-hour.
    Raises LookupError for an unknown GPU."""
    used = pick_resolution(start_ms, end_ms) if resolution == "auto" else resolution
    with engine.connect() as conn:
        gpu_id = conn.execute(select(gpus.c.id).where(gpus.c.uuid == gpu_uuid)).scalar()
        if gpu_id is None:
            raise LookupError(f"no GPU with uuid {gpu_uuid!r} in the store")
        if used == "raw":
            t = gpu_samples.c
            names, time_col = GPU_METRIC_NAMES, t.ts_ms
            query = select(t.ts_ms, *(t[m] for m in names)).where(t.gpu_id == gpu_id, t.ts_ms >= start_ms)
        elif used in ("1m", "1h"):
            table = gpu_rollup_1m if used == "1m" else gpu_rollup_1h
            size_ms = MINUTE_MS if used == "1m" else HOUR_MS
            t = table.c
            names, time_col = ROLLUP_METRIC_NAMES, t.bucket_ms
            query = select(t.bucket_ms, t.n, *(t[c] for c in ROLLUP_VALUE_COLUMNS))  # min, mean, max a metric
            query = query.where(t.gpu_id == gpu_id, t.bucket_ms >= start_ms - start_ms % size_ms)
        else:
            raise ValueError(f"resolution must be auto, raw, 1m or 1h, not {resolution!r}")
        # Newest first, so a limit keeps the latest points; reversed below into time order.
        rows = conn.execute(query.where(time_col < end_ms).order_by(time_col.desc()).limit(max_points + 1)).all()
    truncated = len(rows) > max_points
    rows = rows[:max_points][::-1]
    if used == "raw":
        points = []
        for r in rows:
            values = dict(zip(names, r[1:]))
            points.append(WindowPoint(ts_ms=r[0], n=1, mean=values, min=values, max=values))
    else:
        points = [WindowPoint(ts_ms=r[0], n=r[1], min=dict(zip(names, r[2::3])), mean=dict(zip(names, r[3::3])),
                              max=dict(zip(names, r[4::3]))) for r in rows]
    return GpuSeries(gpu_uuid, used, start_ms, end_ms, points, truncated)


def health_events(engine: Engine, start_ms: Optional[int] = None, end_ms: Optional[int] = None,
                  hostname: Optional[str] = None, limit: int = 1000) -> list[StoredEvent]:
    """Events in ``[start_ms, end_ms)`` (either bound optional), newest first, at most ``limit``."""
    e = health_events_table.c
    query = select(e.id, nodes.c.hostname, e.ts_ms, e.kind, e.gpu_uuid, e.xid, e.detail).join_from(
        health_events_table, nodes)
    if start_ms is not None:
        query = query.where(e.ts_ms >= start_ms)
    if end_ms is not None:
        query = query.where(e.ts_ms < end_ms)
    query = _node_filter(query, hostname).order_by(e.ts_ms.desc(), e.id.desc()).limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [StoredEvent(**{**row, "gpu_uuid": row["gpu_uuid"] or None}) for row in rows]



def host_window(engine: Engine, hostname: str, start_ms: int, end_ms: int, max_points: int = 5000) -> list[HostPoint]:
    """A node's raw host samples in ``[start_ms, end_ms)``, oldest first; the latest ``max_points`` if more."""
    h = host_samples.c
    query = (select(h.ts_ms, *(h[m] for m in HOST_METRIC_NAMES)).join_from(host_samples, nodes)
             .where(nodes.c.hostname == hostname, h.ts_ms >= start_ms, h.ts_ms < end_ms)
             .order_by(h.ts_ms.desc()).limit(max_points))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [HostPoint(r[0], dict(zip(HOST_METRIC_NAMES, r[1:]))) for r in reversed(rows)]
