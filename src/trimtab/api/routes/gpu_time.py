"""A job's GPU-time ledger over a window: where every GPU-second of its GPUs went (busy by role and phase, idle by
cause: waiting for which role, host-side work, communication, no job)."""

from __future__ import annotations

import re
import time
from typing import Optional

from fastapi import APIRouter, Depends, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import NOT_FOUND, READ, get_ctx
from trimtab.api.errors import invalid
from trimtab.api.ledger_schemas import GpuTimeCellOut, GpuTimeOut, GpuTimeTotalOut
from trimtab.api.routes.jobs import find_job, job_name_path
from trimtab.api.schemas_base import MAX_EPOCH_MS
from trimtab.grading.ledger.compute import MAX_INTERVALS
from trimtab.grading.ledger.model import BUSY
from trimtab.grading.ledger.read import job_ledger

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
MAX_WINDOW_S = 7 * 86400
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration_s(text: str, where: str) -> float:
    """'90', '90s', '15m', '2h', '1d' in seconds; a 422 naming the parameter otherwise."""
    match = _DURATION.match(text.strip())
    if not match:
        raise invalid(("query", where), f"{where}={text!r} is not a duration: a number of seconds, or with a unit "
                                         f"s, m, h or d (90, 90s, 15m, 2h, 1d)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise invalid(("query", where), f"{where}={text!r} is {seconds:g} s: it must be from 1 s to "
                                         f"{MAX_WINDOW_S // 86400} days")
    return seconds


def _cell_fields(kind: str, name: str, waiting_for: str) -> dict:
    if kind == BUSY:
        return {"phase": name}
    return {"cause": name, "waiting_for": waiting_for or None}


@router.get("/{name}/gpu-time", response_model=GpuTimeOut, responses={**READ, **NOT_FOUND},
            summary="Where a job's GPU time went",
            description="The job's GPU-time ledger over the window ending at end_ms (default now): for each of its "
                        "GPUs and each interval, GPU-seconds busy by role and phase (the ranks' CUDA-event phase "
                        "times, else their wall times, estimated) and idle by cause: waiting for another role (which "
                        "one, from the GPUs that were busy while this one idled), host-side work of its own role "
                        "(step time no GPU phase claims), communication / weight sync, no job on the GPU (no step "
                        "covered the time). The window starts no earlier than the job's registration (start_ms says where it starts). busy_gpu_s + idle_gpu_s = wall_gpu_s (wall time × GPUs). Each cell says "
                        "whether it was estimated and from what; notes say what was missing. window and interval: "
                        "seconds or a duration (90s, 15m, 2h, 1d), at most 7 days and 1000 intervals. 404 for an "
                        "unknown job, 422 for a bad parameter.")
def gpu_time(name: str = job_name_path(),
             window: str = Query("15m", max_length=32, description="How far back from end_ms: 90, 90s, 15m, 2h, 1d."),
             interval: Optional[str] = Query(None, max_length=32, description="Cut the window into intervals of "
                                                                              "this length (default: one)."),
             end_ms: Optional[int] = Query(None, ge=0, le=MAX_EPOCH_MS, description="End of the window (epoch ms; "
                                                                                     "default now)."),
             ctx: ApiContext = Depends(get_ctx)) -> GpuTimeOut:
    window_s = parse_duration_s(window, "window")
    interval_s = window_s if interval is None else parse_duration_s(interval, "interval")
    if interval_s > window_s:
        raise invalid(("query", "interval"), f"interval={interval!r} is longer than window={window!r}")
    if window_s / interval_s > MAX_INTERVALS:
        raise invalid(("query", "interval"), f"window {window_s:g} s in intervals of {interval_s:g} s is more than "
                                             f"{MAX_INTERVALS} intervals")
    job = find_job(ctx, name)
    end = int(time.time() * 1000) if end_ms is None else end_ms
    start = end - int(window_s * 1000)
    ledger = job_ledger(ctx.engine, job, start, end, int(interval_s * 1000))
    totals = [GpuTimeTotalOut(hostname=h, gpu=g, kind=k, role=r, gpu_s=v, **_cell_fields(k, n, w))
              for (h, g, k, r, n, w), v in sorted(ledger.totals().items())]
    cells = [GpuTimeCellOut(hostname=c.hostname, gpu=c.gpu, start_ms=c.start_ms, end_ms=c.end_ms, kind=c.kind,
                            role=c.role, gpu_s=c.gpu_s, estimated=c.estimated, sources=list(c.sources),
                            **_cell_fields(c.kind, c.name, c.waiting_for)) for c in ledger.cells]
    return GpuTimeOut(job=job.name, start_ms=ledger.start_ms, end_ms=ledger.end_ms, interval_s=interval_s,
                      gpus=[g.label() for g in ledger.gpus], busy_gpu_s=ledger.busy_gpu_s,
                      idle_gpu_s=ledger.idle_gpu_s, wall_gpu_s=ledger.wall_gpu_s, totals=totals, cells=cells,
                      notes=ledger.notes)
