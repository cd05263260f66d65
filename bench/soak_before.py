"""The latest-sample queries as they were before migration 0012 (commit aa76a56), kept for ``bench/soak.py`` to time
against the current ones on the same store: the newest row of each GPU found by a correlated MAX joined back to the
sample table, which SQLite planned as a scan of every stored sample."""

from __future__ import annotations

from typing import Optional

from sqlalchemy import Engine, func, select

from trimtab.contract.readings import GPU_METRIC_NAMES, NVLINK_LINK_METRIC_NAMES
from trimtab.store.models import gpu_nvlink_samples, gpu_samples, gpus, nodes
from trimtab.store.queries import _LABEL_COLUMNS


def latest_gpu_samples_before(engine: Engine, not_after_ms: Optional[int] = None) -> list[dict]:
    return _newest_rows(engine, gpu_samples, GPU_METRIC_NAMES, not_after_ms)


def latest_nvlink_samples_before(engine: Engine, not_after_ms: Optional[int] = None) -> list[dict]:
    return _newest_rows(engine, gpu_nvlink_samples, ("link", *NVLINK_LINK_METRIC_NAMES), not_after_ms)


def _newest_rows(engine: Engine, table, names, not_after_ms: Optional[int]) -> list[dict]:
    t = table.c
    newest = select(func.max(t.ts_ms)).where(t.gpu_id == gpus.c.id)
    if not_after_ms is not None:
        newest = newest.where(t.ts_ms <= not_after_ms)
    newest = newest.correlate(gpus).scalar_subquery()
    query = (select(*_LABEL_COLUMNS, t.ts_ms, *(t[m] for m in names))
             .join_from(gpus, nodes).join(table, (t.gpu_id == gpus.c.id) & (t.ts_ms == newest))
             .order_by(nodes.c.hostname, gpus.c.gpu_index))
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]
