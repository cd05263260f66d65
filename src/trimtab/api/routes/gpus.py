"""Nodes, GPUs with their latest sample, one GPU's samples over a window (raw or rolled up), and its process rows
with their per-process activity."""

from __future__ import annotations

import time
from typing import Callable, Literal, Optional, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import NOT_FOUND, READ, get_ctx
from trimtab.api.errors import invalid
from trimtab.api.process_schemas import ProcessesOut, ProcessOut
from trimtab.api.schemas import GpuOut, GpusOut, LatestOut, NodeOut, NodesOut, PointOut, SamplesOut
from trimtab.api.schemas_base import MAX_EPOCH_MS
from trimtab.contract.kinds import NO_CONTROL_CHARS
from trimtab.store.clocks import node_clocks_by_host
from trimtab.store.processes import gpu_process_window
from trimtab.store.queries import LatestSample, StoredGpu, gpu_window, list_gpus, list_nodes

router = APIRouter(prefix="/v1", tags=["telemetry"])
MAX_WINDOW_S = 400 * 86400  # as long as the 1-hour rollups are kept
DEFAULT_WINDOW_S = 3600.0


def node_query(description: str = "Only this node (host name as its agent reports it).") -> Optional[str]:
    return Query(None, min_length=1, max_length=255, pattern=NO_CONTROL_CHARS, description=description)


@router.get("/nodes", response_model=NodesOut, responses=READ, summary="List nodes",
            description="Every node that has sent readings (also one whose every batch was refused for its clock), "
                        "with its GPU count, first/last time seen, when it was last heard from, its clock skew "
                        "against the receiver and why batches were refused; simulated nodes say so.")
def nodes(ctx: ApiContext = Depends(get_ctx)) -> NodesOut:
    counts: dict[str, int] = {}
    for gpu in list_gpus(ctx.engine):
        counts[gpu.hostname] = counts.get(gpu.hostname, 0) + 1
    clocks = node_clocks_by_host(ctx.engine)
    out = []
    for n in list_nodes(ctx.engine):
        clock = clocks.get(n.hostname)
        out.append(NodeOut(hostname=n.hostname, simulated=n.simulated, scenario=n.scenario,
                           driver_version=n.driver_version, nvml_version=n.nvml_version,
                           first_seen_ms=n.first_seen_ms, last_seen_ms=n.last_seen_ms,
                           gpu_count=counts.get(n.hostname, 0), heard_ms=clock and clock.heard_ms,
                           clock_skew_s=clock and clock.clock_skew_s, clock_off=bool(clock and clock.off),
                           clock_refused_ms=clock and clock.refused_ms,
                           clock_refused_detail=clock and clock.refused_detail))
    return NodesOut(simulated=any(n.simulated for n in out), nodes=out)


def _pcie_pct(latest: LatestSample) -> Optional[float]:
    tx, rx = latest.metrics.get("pcie_tx_bytes_per_s"), latest.metrics.get("pcie_rx_bytes_per_s")
    if tx is None or rx is None or not latest.pcie_peak_bytes_per_s:
        return None
    return 100.0 * max(tx, rx) / latest.pcie_peak_bytes_per_s


def _latest(sample: Optional[LatestSample], now_ms: int) -> Optional[LatestOut]:
    if sample is None:
        return None
    return LatestOut(ts_ms=sample.ts_ms, age_s=max(0.0, (now_ms - sample.ts_ms) / 1000),
                     pcie_pct_of_peak=_pcie_pct(sample), metrics=sample.metrics)


@router.get("/gpus", response_model=GpusOut, responses=READ, summary="List GPUs with their latest sample",
            description="Every GPU in the store (optionally of one node) with its static facts and its newest sample "
                        "of the last 300 s (null when none). Metrics are keyed by name, the unit in the name; a "
                        "metric the GPU does not support is null, never 0.")
def gpus(node: Optional[str] = node_query(), ctx: ApiContext = Depends(get_ctx)) -> GpusOut:
    now_ms = int(time.time() * 1000)
    latest = {s.gpu_uuid: s for s in ctx.latest_gpus() if node is None or s.hostname == node}
    out = []
    for g in list_gpus(ctx.engine, hostname=node):
        out.append(GpuOut(hostname=g.hostname, simulated=g.simulated, uuid=g.uuid, index=g.index, name=g.name,
                          memory_total_bytes=g.memory_total_bytes, pcie_max_gen=g.pcie_max_gen,
                          pcie_max_width=g.pcie_max_width, pcie_peak_bytes_per_s=g.pcie_peak_bytes_per_s,
                          nvlink_link_count=g.nvlink_link_count, gpm_supported=g.gpm_supported,
                          latest=_latest(latest.pop(g.uuid, None), now_ms)))
    for s in latest.values():  # seen in memory but not (yet) in the store
        out.append(GpuOut(hostname=s.hostname, simulated=s.simulated, uuid=s.gpu_uuid, index=s.gpu_index,
                          name=s.gpu_name, memory_total_bytes=s.metrics.get("mem_total_bytes"), pcie_max_gen=None,
                          pcie_max_width=None, pcie_peak_bytes_per_s=s.pcie_peak_bytes_per_s,
                          nvlink_link_count=s.nvlink_link_count, gpm_supported=None, latest=_latest(s, now_ms)))
    return GpusOut(simulated=any(g.simulated for g in out), gpus=out)


def resolve_window(start_ms: Optional[int], end_ms: Optional[int], window_s: Optional[float],
                   now_ms: int) -> tuple[int, int]:
    """[start, end) from any two of start_ms, end_ms, window_s (end defaults to now, the window to an hour)."""
    if window_s is not None and start_ms is not None and end_ms is not None:
        raise invalid(("query", "window_s"), "give at most two of start_ms, end_ms and window_s")
    if end_ms is None:
        end_ms = start_ms + int(window_s * 1000) if start_ms is not None and window_s is not None else now_ms
    if start_ms is None:
        start_ms = end_ms - int((window_s if window_s is not None else DEFAULT_WINDOW_S) * 1000)
    if end_ms <= start_ms:
        raise invalid(("query", "end_ms"), "end_ms must be after start_ms")
    if end_ms - start_ms > MAX_WINDOW_S * 1000:
        raise invalid(("query", "window_s"), f"the window may be at most {MAX_WINDOW_S // 86400} days")
    return max(start_ms, 0), end_ms


def time_window(
    start_ms: Optional[int] = Query(None, ge=0, le=MAX_EPOCH_MS, description="Window start, epoch ms (inclusive)."),
    end_ms: Optional[int] = Query(None, ge=0, le=MAX_EPOCH_MS, description="Window end, epoch ms (exclusive)."),
    window_s: Optional[float] = Query(None, gt=0, le=MAX_WINDOW_S, description="Window length, seconds."),
) -> tuple[int, int]:
    """The [start, end) a request asks for (a dependency of the routes that read a window)."""
    return resolve_window(start_ms, end_ms, window_s, int(time.time() * 1000))


T = TypeVar("T")


def gpu_uuid_path() -> str:
    return Path(min_length=1, max_length=96, pattern=NO_CONTROL_CHARS, description="The GPU's UUID.")


def read_gpu(ctx: ApiContext, uuid: str, read: Callable[[], T]) -> tuple[StoredGpu, T]:
    """The GPU and what ``read()`` reads of it; 404 for a GPU the store does not know, or no longer knows by the
    time ``read()`` runs (it raises LookupError)."""
    gpu = next((g for g in list_gpus(ctx.engine) if g.uuid == uuid), None)
    try:
        if gpu is None:
            raise LookupError(uuid)
        return gpu, read()
    except LookupError:
        raise HTTPException(404, f"no GPU with uuid {uuid!r}") from None


@router.get("/gpus/{uuid}/samples", response_model=SamplesOut, responses={**READ, **NOT_FOUND},
            summary="One GPU's samples over a window",
            description="Samples of one GPU in [start_ms, end_ms), given as any two of start_ms, end_ms and window_s "
                        "(end defaults to now, the window to 1 h; at most 400 days). resolution=auto uses raw samples "
                        "up to 2 h, 1-minute rollups up to 3 days, 1-hour rollups beyond; the response says which. "
                        "At most max_points points, the latest ones (truncated says so). 404 for an unknown GPU.")
def samples(
    uuid: str = gpu_uuid_path(),
    span: tuple[int, int] = Depends(time_window),
    resolution: Literal["auto", "raw", "1m", "1h"] = Query("auto", description="auto, raw, 1m or 1h."),
    max_points: int = Query(1000, ge=1, le=20000, description="At most this many points (the latest)."),
    ctx: ApiContext = Depends(get_ctx),
) -> SamplesOut:
    start, end = span
    gpu, series = read_gpu(ctx, uuid, lambda: gpu_window(ctx.engine, uuid, start, end, resolution=resolution,
                                                          max_points=max_points))
    raw = series.resolution == "raw"
    points = [PointOut(ts_ms=p.ts_ms, n=p.n, mean=p.mean, min=None if raw else p.min, max=None if raw else p.max)
              for p in series.points]
    return SamplesOut(gpu_uuid=uuid, hostname=gpu.hostname, simulated=gpu.simulated, resolution=series.resolution,
                      start_ms=start, end_ms=end, truncated=series.truncated, points=points)


@router.get("/gpus/{uuid}/processes", response_model=ProcessesOut, responses={**READ, **NOT_FOUND},
            summary="One GPU's processes and their GPU activity over a window",
            description="The process rows of one GPU read in [start_ms, end_ms) (any two of start_ms, end_ms and "
                        "window_s; end defaults to now, the window to 1 h): the processes holding a context on it "
                        "(read every 5 s), each with its per-process activity since the previous rows — SM % and "
                        "memory % as the mean over NVML's per-process utilization samples, their count, and the "
                        "interval they cover. Unknown activity is null, never 0. At most max_rows rows, the latest "
                        "(truncated says so). 404 for an unknown GPU.")
def processes(
    uuid: str = gpu_uuid_path(),
    span: tuple[int, int] = Depends(time_window),
    max_rows: int = Query(1000, ge=1, le=20000, description="At most this many rows (the latest)."),
    ctx: ApiContext = Depends(get_ctx),
) -> ProcessesOut:
    start, end = span
    gpu, window = read_gpu(ctx, uuid, lambda: gpu_process_window(ctx.engine, uuid, start, end, max_rows=max_rows))
    return ProcessesOut(gpu_uuid=uuid, hostname=gpu.hostname, simulated=gpu.simulated, start_ms=start, end_ms=end,
                        truncated=window.truncated, processes=[ProcessOut(**vars(p)) for p in window.rows])
