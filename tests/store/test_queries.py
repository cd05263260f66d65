"""The read side: latest sample per GPU, windows at each resolution, window aggregates, events, host series."""

import pytest

from trimtab.contract.readings import GPU_METRIC_NAMES, Batch, HealthEvent, NodeInfo
from trimtab.store.ingest import BatchWriter
from trimtab.store.queries import (gpu_aggregates, gpu_window, health_events, host_window, latest_gpu_samples,
                                   list_gpus, list_nodes)
from trimtab.store.rollup import rollup
from tests.store.conftest import NODE, T0_MS, make_batch

MIN = 60_000
HOUR = 3_600_000
OTHER = NodeInfo(hostname="node-b", simulated=True, scenario="imbalanced")


@pytest.fixture
def two_nodes(engine):
    """node-a: GPUs 0-1 sampled each 20 s for 3 minutes; node-b (simulated): one GPU, two samples."""
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS + k * 20_000 for k in range(9)],
                            power_w=lambda i, t: 100.0 + i + (t - T0_MS) / 1000))
    writer.write(make_batch([T0_MS, T0_MS + 30_000], n_gpus=1, node=OTHER, uuid_prefix="GPU-B", util_pct=90.0))
    return engine


def test_nodes_and_gpus_are_listed_with_their_facts(two_nodes):
    nodes = list_nodes(two_nodes)
    assert [(n.hostname, n.simulated, n.scenario, n.first_seen_ms, n.last_seen_ms) for n in nodes] == [
        ("node-a", False, None, T0_MS, T0_MS + 160_000), ("node-b", True, "imbalanced", T0_MS, T0_MS + 30_000)]
    assert [(g.hostname, g.uuid, g.index) for g in list_gpus(two_nodes)] == [
        ("node-a", "GPU-0000", 0), ("node-a", "GPU-0001", 1), ("node-b", "GPU-B0000", 0)]
    gpu = list_gpus(two_nodes, hostname="node-b")[0]
    assert (gpu.simulated, gpu.name, gpu.pcie_peak_bytes_per_s, gpu.nvlink_link_count, gpu.gpm_supported) == \
           (True, "NVIDIA H200", 63e9, None, True)


def test_latest_sample_is_the_newest_row_of_each_gpu(two_nodes):
    latest = latest_gpu_samples(two_nodes)
    assert [(s.hostname, s.gpu_uuid, s.gpu_index, s.ts_ms, s.metrics["util_pct"], s.metrics["power_w"])
            for s in latest] == [("node-a", "GPU-0000", 0, T0_MS + 160_000, 160.0, 260.0),
                                 ("node-a", "GPU-0001", 1, T0_MS + 160_000, 170.0, 261.0),
                                 ("node-b", "GPU-B0000", 0, T0_MS + 30_000, 90.0, None)]
    assert set(latest[0].metrics) == set(GPU_METRIC_NAMES)
    assert [s.gpu_uuid for s in latest_gpu_samples(two_nodes, hostname="node-b")] == ["GPU-B0000"]


def test_aggregates_give_mean_and_max_and_keep_never_measured_metrics_none(two_nodes):
    aggs = gpu_aggregates(two_nodes, T0_MS, T0_MS + MIN)  # samples at 0, 20, 40 s
    assert [(a.hostname, a.gpu_uuid, a.n_samples) for a in aggs] == [
        ("node-a", "GPU-0000", 3), ("node-a", "GPU-0001", 3), ("node-b", "GPU-B0000", 2)]
    a0, a1, b0 = aggs
    assert (a0.mean["util_pct"], a0.max["util_pct"], a1.mean["util_pct"], a1.max["power_w"]) == \
           (20.0, 40.0, 30.0, 141.0)
    assert b0.mean["power_w"] is None and b0.max["power_w"] is None and b0.simulated
    assert a0.mean["nvlink_tx_bytes_per_s"] is None and set(a0.mean) == set(a0.max) == set(GPU_METRIC_NAMES)
    assert (a0.gpu_index, a0.gpu_name, a0.pcie_peak_bytes_per_s, a0.nvlink_link_count) == (0, "NVIDIA H200", 63e9, None)
    assert [a.gpu_uuid for a in gpu_aggregates(two_nodes, T0_MS + 40_000, T0_MS + HOUR, hostname="node-a")] == \
           ["GPU-0000", "GPU-0001"]
    assert gpu_aggregates(two_nodes, T0_MS + HOUR, T0_MS + 2 * HOUR) == []


def test_window_at_each_resolution(two_nodes):
    rollup(two_nodes, now_ms=T0_MS + 3 * MIN)
    raw = gpu_window(two_nodes, "GPU-0001", T0_MS + 20_000, T0_MS + 60_000, resolution="raw")
    assert raw.resolution == "raw" and not raw.truncated
    assert [(p.ts_ms, p.n, p.mean["util_pct"], p.max["util_pct"]) for p in raw.points] == [
        (T0_MS + 20_000, 1, 30.0, 30.0), (T0_MS + 40_000, 1, 50.0, 50.0)]

    minutes = gpu_window(two_nodes, "GPU-0000", T0_MS + 30_000, T0_MS + HOUR, resolution="1m")
    assert [(p.ts_ms, p.n, p.min["util_pct"], p.mean["util_pct"], p.max["util_pct"]) for p in minutes.points] == [
        (T0_MS, 3, 0.0, 20.0, 40.0), (T0_MS + MIN, 3, 60.0, 80.0, 100.0), (T0_MS + 2 * MIN, 3, 120.0, 140.0, 160.0)]

    hours = gpu_window(two_nodes, "GPU-0000", T0_MS, T0_MS + HOUR, resolution="1h")
    assert [(p.ts_ms, p.n, p.min["power_w"], p.mean["power_w"], p.max["power_w"]) for p in hours.points] == [
        (T0_MS, 9, 100.0, 180.0, 260.0)]


def test_auto_resolution_follows_the_span_and_max_points_keeps_the_latest(two_nodes):
    rollup(two_nodes, now_ms=T0_MS + 3 * MIN)
    picks = [gpu_window(two_nodes, "GPU-0000", T0_MS, T0_MS + span).resolution
             for span in (2 * HOUR, 2 * HOUR + 1, 72 * HOUR, 72 * HOUR + 1)]
    assert picks == ["raw", "1m", "1m", "1h"]
    cut = gpu_window(two_nodes, "GPU-0000", T0_MS, T0_MS + HOUR, max_points=2)
    assert cut.truncated and [p.ts_ms for p in cut.points] == [T0_MS + 140_000, T0_MS + 160_000]
    with pytest.raises(LookupError):
        gpu_window(two_nodes, "GPU-NOPE", T0_MS, T0_MS + HOUR)


def test_events_filter_by_time_and_node_newest_first(engine):
    writer = BatchWriter(engine)
    writer.write(make_batch([T0_MS]))
    writer.write(Batch(node=NODE, events=[
        HealthEvent(T0_MS + 1000, "xid", "Xid 48", gpu_uuid="GPU-0001", xid=48),
        HealthEvent(T0_MS + 2000, "source_error", "psutil failed")]))
    writer.write(Batch(node=OTHER, events=[HealthEvent(T0_MS + 3000, "gpu_lost", "GPU 2 lost")]))
    events = health_events(engine)
    assert [(e.hostname, e.kind, e.gpu_uuid, e.xid) for e in events] == [
        ("node-b", "gpu_lost", None, None), ("node-a", "source_error", None, None), ("node-a", "xid", "GPU-0001", 48)]
    window = health_events(engine, start_ms=T0_MS + 1000, end_ms=T0_MS + 3000)
    assert [e.kind for e in window] == ["source_error", "xid"]
    assert [e.detail for e in health_events(engine, hostname="node-a", limit=1)] == ["psutil failed"]


def test_host_window_is_in_time_order(two_nodes):
    points = host_window(two_nodes, "node-a", T0_MS + 20_000, T0_MS + 80_000)
    assert [(p.ts_ms, p.metrics["cpu_pct"], p.metrics["load1"]) for p in points] == [
        (T0_MS + 20_000, 50.0, None), (T0_MS + 40_000, 50.0, None), (T0_MS + 60_000, 50.0, None)]
