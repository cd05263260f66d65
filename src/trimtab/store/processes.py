"""The process rows of one GPU over a window, with their per-process activity (``GET /v1/gpus/{uuid}/processes``;
the GPU-time ledger reads them too). Activity NULL stays None: unknown is never read as 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine, select

from trimtab.store.models import gpu_processes, gpus

PROCESS_FIELDS = ("ts_ms", "pid", "used_memory_bytes", "name", "sm_util_pct", "mem_util_pct", "util_samples",
                  "util_from_ms", "util_to_ms")


@dataclass(frozen=True)
class StoredProcess:
    """One process row (see ``trimtab.contract.readings.GpuProcess`` for what the activity fields mean)."""

    ts_ms: int
    pid: int
    used_memory_bytes: Optional[int]
    name: Optional[str]
    sm_util_pct: Optional[float]
    mem_util_pct: Optional[float]
    util_samples: Optional[int]
    util_from_ms: Optional[int]
    util_to_ms: Optional[int]


@dataclass(frozen=True)
class ProcessWindow:
    rows: list[StoredProcess]  # oldest first, then by pid
    truncated: bool  # more rows matched than asked for: these are the latest


def gpu_process_window(engine: Engine, gpu_uuid: str, start_ms: int, end_ms: int,
                       max_rows: int = 5000) -> ProcessWindow:
    """The process rows of one GPU taken in ``[start_ms, end_ms)``, the latest ``max_rows`` of them (by the
    (gpu, time, pid) primary key). Raises LookupError for an unknown GPU."""
    p = gpu_processes.c
    with engine.connect() as conn:
        gpu_id = conn.execute(select(gpus.c.id).where(gpus.c.uuid == gpu_uuid)).scalar()
        if gpu_id is None:
            raise LookupError(f"no GPU with uuid {gpu_uuid!r} in the store")
        rows = conn.execute(select(*(p[f] for f in PROCESS_FIELDS))
                            .where(p.gpu_id == gpu_id, p.ts_ms >= start_ms, p.ts_ms < end_ms)
                            .order_by(p.ts_ms.desc(), p.pid.desc()).limit(max_rows + 1)).all()
    truncated = len(rows) > max_rows
    return ProcessWindow([StoredProcess(*row) for row in reversed(rows[:max_rows])], truncated)
