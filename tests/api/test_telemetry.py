"""The read side: health, nodes, GPUs with their latest sample, windows of samples at each resolution, the balance
verdict, paginated events, /metrics — and the simulated flag on everything that carries a simulated node's data."""

from __future__ import annotations


import pytest

from trimtab.contract.readings import GPU_METRIC_NAMES, HealthEvent
from trimtab.store.models import HOUR_MS, MINUTE_MS
from trimtab.store.rollup import rollup
from tests.api.conftest import REAL_NODE, SIM_NODE, now_ms, recent_batch
from tests.store.conftest import T0_MS, make_batch


def test_healthz_says_ok_version_mode_and_components(make_api):
    api = make_api("sqlite", mode="server", component_status=lambda: {"agent": "running"})
    body = api.get("/healthz").json()
    assert body["status"] == "ok" and body["store_reachable"] is True and body["mode"] == "server"
    assert body["version"] and body["components"] == {"agent": "running"} and body["simulated"] is False


def test_nodes_list_gpu_counts_and_first_last_seen(api):
    batch = recent_batch(n_gpus=3)
    api.ingest(batch)
    (node,) = api.get("/v1/nodes").json()["nodes"]
    assert node["hostname"] == "node-a" and node["gpu_count"] == 3 and node["driver_version"] == "550.54"
    assert node["first_seen_ms"] == batch.gpu_samples[0].ts_ms and node["simulated"] is False


def test_gpus_carry_every_metric_by_name_with_unsupported_as_null(api):
    batch = recent_batch(power_w=300.0, pcie_tx_bytes_per_s=31.5e9, pcie_rx_bytes_per_s=1e9)
    api.ingest(batch)
    api.ingest(recent_batch(SIM_NODE))
    gpus = api.get("/v1/gpus", node="node-a").json()["gpus"]
    assert [g["uuid"] for g in gpus] == [g.uuid for g in batch.gpus]
    latest = gpus[1]["latest"]
    assert set(latest["metrics"]) == set(GPU_METRIC_NAMES)
    assert latest["metrics"]["util_pct"] == 40.0 and latest["metrics"]["power_w"] == 300.0
    assert latest["metrics"]["sm_active_pct"] is None and latest["metrics"]["nvlink_tx_bytes_per_s"] is None
    assert latest["pcie_pct_of_peak"] == pytest.approx(50.0)
    assert latest["ts_ms"] == batch.gpu_samples[-1].ts_ms and 0 <= latest["age_s"] < 10
    assert len(api.get("/v1/gpus").json()["gpus"]) == 4
    assert api.get("/v1/gpus", node="nowhere").json() == {"simulated": False, "gpus": []}


def test_a_gpu_without_a_recent_sample_has_no_latest(api):
    api.ingest(make_batch([T0_MS], n_gpus=1, uuid_prefix="GPU-old-"))  # years ago
    (gpu,) = api.get("/v1/gpus").json()["gpus"]
    assert gpu["latest"] is None


def test_samples_of_a_window_come_raw_oldest_first(api):
    batch = make_batch([T0_MS + 1000 * i for i in range(10)], n_gpus=1)
    api.ingest(batch)
    r = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS + 2000, end_ms=T0_MS + 6000)
    body = r.json()
    assert r.status_code == 200 and body["resolution"] == "raw" and body["truncated"] is False
    assert [p["ts_ms"] for p in body["points"]] == [T0_MS + 2000, T0_MS + 3000, T0_MS + 4000, T0_MS + 5000]
    assert body["points"][0]["mean"]["util_pct"] == 2.0 and body["points"][0]["min"] is None
    assert body["points"][0]["n"] == 1 and body["hostname"] == "node-a"
    capped = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS, end_ms=T0_MS + 60_000, max_points=3).json()
    assert capped["truncated"] is True and [p["ts_ms"] for p in capped["points"]] == [T0_MS + 7000, T0_MS + 8000,
                                                                                       T0_MS + 9000]
    windowed = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS + 5000, window_s=2).json()
    assert [p["ts_ms"] for p in windowed["points"]] == [T0_MS + 5000, T0_MS + 6000]


def test_long_windows_use_the_rollups_and_say_so(api):
    api.ingest(make_batch([T0_MS + 10_000 * i for i in range(12)], n_gpus=1))  # two minutes
    rollup(api.ctx.engine, T0_MS + 3 * HOUR_MS)
    day = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS, end_ms=T0_MS + 24 * HOUR_MS).json()
    assert day["resolution"] == "1m" and [p["ts_ms"] for p in day["points"]] == [T0_MS, T0_MS + MINUTE_MS]
    first = day["points"][0]
    assert first["n"] == 6 and first["min"]["util_pct"] == 0.0 and first["max"]["util_pct"] == 50.0
    assert first["mean"]["util_pct"] == pytest.approx(25.0) and first["max"]["clock_event_mask"] is None
    hourly = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS, end_ms=T0_MS + 30 * 86400_000).json()
    assert hourly["resolution"] == "1h" and hourly["points"][0]["n"] == 12
    forced = api.get("/v1/gpus/GPU-0000/samples", start_ms=T0_MS, end_ms=T0_MS + 24 * HOUR_MS, resolution="raw")
    assert forced.json()["resolution"] == "raw" and len(forced.json()["points"]) == 12


@pytest.mark.parametrize("what", ["samples", "processes"])
def test_samples_and_processes_of_an_unknown_gpu_are_404(api, what):
    r = api.get(f"/v1/gpus/GPU-nope/{what}", window_s=60)
    assert r.status_code == 404 and r.json()["detail"] == "no GPU with uuid 'GPU-nope'"


@pytest.mark.parametrize("what, reader", [("samples", "gpu_window"), ("processes", "gpu_process_window")])
def test_a_gpu_gone_between_its_lookup_and_its_read_is_404(sqlite_api, monkeypatch, what, reader):
    import trimtab.api.routes.gpus as routes

    sqlite_api.ingest(make_batch([T0_MS], n_gpus=1, uuid_prefix="GPU-gone-"))
    uuid = "GPU-gone-0000"
    assert sqlite_api.get(f"/v1/gpus/{uuid}/samples", start_ms=T0_MS, end_ms=T0_MS + 1).status_code == 200

    def gone(*_a, **_k):
        raise LookupError(uuid)

    monkeypatch.setattr(routes, reader, gone)
    r = sqlite_api.get(f"/v1/gpus/{uuid}/{what}", window_s=60)
    assert r.status_code == 404 and r.json()["detail"] == f"no GPU with uuid {uuid!r}"


@pytest.mark.parametrize("params, field", [
    ({"start_ms": 2000, "end_ms": 1000}, "end_ms"),
    ({"start_ms": 1000, "end_ms": 1000}, "end_ms"),
    ({"start_ms": 0, "end_ms": 401 * 86400_000}, "window_s"),
    ({"window_s": 401 * 86400}, "window_s"),
    ({"start_ms": 1, "end_ms": 2, "window_s": 1}, "window_s"),
    ({"window_s": -1}, "window_s"),
    ({"resolution": "5m"}, "resolution"),
    ({"max_points": 0}, "max_points"),
    ({"start_ms": 2**60}, "start_ms"),
])
def test_bad_windows_are_422_naming_the_parameter(sqlite_api, params, field):
    sqlite_api.ingest(make_batch([T0_MS], n_gpus=1))
    r = sqlite_api.get("/v1/gpus/GPU-0000/samples", **params)
    assert r.status_code == 422
    assert ["query", field] in [e["loc"] for e in r.json()["detail"]]


def test_balance_grades_each_node_and_the_worst_status_wins(api):
    assert api.get("/v1/balance").json() == {"status": "no_data", "simulated": False, "window_s": 30.0,
                                             "reports": []}
    api.ingest(recent_batch(REAL_NODE, n_gpus=2, util_pct=lambda i, _t: 50.0 + 5 * i))
    api.ingest(recent_batch(SIM_NODE, n_gpus=2, util_pct=lambda i, _t: 95.0 - 90 * i))  # actor hot, critic idle
    body = api.get("/v1/balance", window_s=60).json()
    assert body["status"] == "act" and body["simulated"] is True
    reports = {r["hostname"]: r for r in body["reports"]}
    assert reports["node-a"]["status"] == "ok" and reports["node-a"]["simulated"] is False
    spread = next(v for v in reports["node-b-sim"]["verdicts"] if v["check"] == "utilization_spread")
    assert spread["status"] == "act" and spread["value"] == pytest.approx(90.0) and spread["advice"]
    only_a = api.get("/v1/balance", window_s=60, node="node-a").json()
    assert only_a["status"] == "ok" and only_a["simulated"] is False and len(only_a["reports"]) == 1
    assert api.get("/v1/balance", window_s=0.5).status_code == 422


def test_a_node_whose_samples_stopped_is_stale_with_its_age(api):
    """Samples 20 s old in a 60 s window: graded, but no current verdict (5 intervals of 1 s have passed)."""
    end = now_ms() - 20_000
    r = api.ingest(make_batch([end - 2000, end - 1000, end], n_gpus=2, node=REAL_NODE, uuid_prefix="GPU-old-",
                              util_pct=50.0))
    assert r.status_code < 300, r.text
    body = api.get("/v1/balance", window_s=60).json()
    assert body["status"] == "stale"
    report = body["reports"][0]
    assert report["stale"] is True and report["sample_interval_s"] == 1.0 and report["stale_after_s"] == 5.0
    assert 20 <= report["newest_sample_age_s"] < 40
    api.ingest(recent_batch(REAL_NODE, n_gpus=2))  # the agent is back
    body = api.get("/v1/balance", window_s=60).json()
    assert body["status"] == "ok" and body["reports"][0]["stale"] is False


def test_events_are_paginated_newest_first_and_filtered(api):
    batch = recent_batch(n_gpus=1, seconds=1)
    base = batch.gpu_samples[0].ts_ms - 10_000
    batch.events = [HealthEvent(base + i, "xid" if i % 2 else "source_error", f"event {i}",
                                gpu_uuid=batch.gpus[0].uuid if i % 2 else None, xid=79 if i % 2 else None)
                    for i in range(7)]
    api.ingest(batch)
    first = api.get("/v1/events", limit=3).json()
    assert [e["detail"] for e in first["events"]] == ["event 6", "event 5", "event 4"] and first["next_offset"] == 3
    rest = api.get("/v1/events", limit=3, offset=6).json()
    assert [e["detail"] for e in rest["events"]] == ["event 0"] and rest["next_offset"] is None
    xids = api.get("/v1/events", kind="xid").json()["events"]
    assert [e["xid"] for e in xids] == [79, 79, 79] and all(e["gpu_uuid"] == batch.gpus[0].uuid for e in xids)
    window = api.get("/v1/events", start_ms=base + 2, end_ms=base + 4).json()["events"]
    assert [e["detail"] for e in window] == ["event 3", "event 2"]
    assert api.get("/v1/events", node="other").json()["events"] == []
    assert api.get("/v1/events", limit=1001).status_code == 422
    assert api.get("/v1/events", start_ms=5, end_ms=4).status_code == 422


def test_every_response_with_a_simulated_nodes_data_says_so(api):
    batch = recent_batch(SIM_NODE)
    batch.events = [HealthEvent(batch.gpu_samples[0].ts_ms, "source_error", "simulated hiccup")]
    api.ingest(batch)
    job = {"name": "sim-job", "ranks": 1, "hostnames": [SIM_NODE.hostname]}
    assert api.post("/v1/jobs", job, scope="job").json()["simulated"] is True
    uuid = batch.gpus[0].uuid
    assert api.get("/healthz").json()["simulated"] is True
    nodes = api.get("/v1/nodes").json()
    assert nodes["simulated"] is True and nodes["nodes"][0]["simulated"] is True
    assert nodes["nodes"][0]["scenario"] == "actor-hot"
    gpus = api.get("/v1/gpus").json()
    assert gpus["simulated"] is True and all(g["simulated"] for g in gpus["gpus"])
    assert api.get(f"/v1/gpus/{uuid}/samples", window_s=60).json()["simulated"] is True
    assert api.get(f"/v1/gpus/{uuid}/processes", window_s=60).json()["simulated"] is True
    balance = api.get("/v1/balance", window_s=60).json()
    assert balance["simulated"] is True and balance["reports"][0]["simulated"] is True
    events = api.get("/v1/events").json()
    assert events["simulated"] is True and events["events"][0]["simulated"] is True
    assert api.get("/v1/jobs").json()["simulated"] is True
    assert api.get("/v1/jobs/sim-job/reports").json()["simulated"] is True


def test_a_real_nodes_data_is_not_marked_simulated(sqlite_api):
    sqlite_api.ingest(recent_batch(REAL_NODE))
    for path in ("/healthz", "/v1/nodes", "/v1/gpus", "/v1/events"):
        assert sqlite_api.get(path).json()["simulated"] is False, path


def test_metrics_are_prometheus_text(sqlite_api):
    sqlite_api.ingest(recent_batch())
    r = sqlite_api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_latest_gpus_of_a_server_also_come_from_the_store(make_api):
    """An agent writing to the store directly (not through ingest) still shows on a server."""
    from trimtab.store.ingest import BatchWriter

    api = make_api("sqlite", mode="server")
    batch = recent_batch()
    writer = BatchWriter(api.ctx.engine)
    writer.write(batch)
    writer.close()
    latest = [g["latest"] for g in api.get("/v1/gpus").json()["gpus"]]
    assert all(latest) and latest[0]["ts_ms"] == batch.gpu_samples[-1].ts_ms
    assert now_ms() - latest[0]["ts_ms"] < 10_000
