"""POST /v1/ingest: batches land once, bad batches get a 422 naming the field, oversized bodies a 413 (declared
or streamed), and a store outage a 503 with Retry-After so the agent spools and retries."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.engine import make_url

from trimtab.contract.readings import GpuProcess, HealthEvent
from tests.api.conftest import SIM_NODE, recent_batch
from tests.support.tcpproxy import TcpProxy


def test_a_batch_is_stored_and_a_replay_inserts_nothing(api):
    batch = recent_batch(seconds=3)
    t = batch.gpu_samples[0].ts_ms
    batch.processes = [GpuProcess(batch.gpus[0].uuid, t, pid=4242, used_memory_bytes=2**30, name="python")]
    batch.events = [HealthEvent(t, "xid", "Xid 79", gpu_uuid=batch.gpus[1].uuid, xid=79)]
    first = api.ingest(batch)
    assert first.status_code == 200
    assert first.json() == {"inserted": 6 + 3 + 1 + 1, "duplicates": 0, "gpu_samples_inserted": 6,
                            "host_samples_inserted": 3, "processes_inserted": 1, "events_inserted": 1,
                            "nvlink_samples_inserted": 0}
    again = api.ingest(batch).json()
    assert again["inserted"] == 0 and again["duplicates"] == 11
    assert api.get("/v1/nodes").json()["nodes"][0]["gpu_count"] == 2


def test_an_ingested_batch_feeds_the_latest_snapshot(sqlite_api):
    batch = recent_batch(power_w=350.5, mem_used_bytes=7 * 2**30)
    assert sqlite_api.ingest(batch).status_code == 200
    snap = {s.gpu_uuid: s for s in sqlite_api.ctx.latest_gpus()}
    assert snap[batch.gpus[0].uuid].metrics["power_w"] == 350.5


@pytest.mark.parametrize("path, value, loc", [
    (("gpu_samples", 0, "util_pct"), 500.0, ["body", "gpu_samples", 0, "util_pct"]),
    (("gpu_samples", 0, "mem_used_bytes"), -1, ["body", "gpu_samples", 0, "mem_used_bytes"]),
    (("gpu_samples", 0, "gpu_uuid"), "G" * 97, ["body", "gpu_samples", 0, "gpu_uuid"]),
    (("gpu_samples", 0, "ts_ms"), -5, ["body", "gpu_samples", 0, "ts_ms"]),
    (("node", "hostname"), "h" * 256, ["body", "node", "hostname"]),
    (("node", "hostname"), "", ["body", "node", "hostname"]),
    (("node", "hostname"), "bad\x00name", ["body", "node", "hostname"]),
    (("gpus", 0, "index"), 99999, ["body", "gpus", 0, "index"]),
    (("host_samples", 0, "cpu_pct"), "lots", ["body", "host_samples", 0, "cpu_pct"]),
])
def test_an_invalid_batch_gets_422_naming_the_field(sqlite_api, path, value, loc):
    body = recent_batch().to_dict()
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    r = sqlite_api.post("/v1/ingest", body, scope="agent")
    assert r.status_code == 422
    assert loc in [e["loc"] for e in r.json()["detail"]]
    assert sqlite_api.get("/v1/nodes").json()["nodes"] == []  # nothing of the batch was stored


def test_nan_and_infinity_are_refused(sqlite_api):
    text = recent_batch().to_json().replace('"util_pct":30.0', '"util_pct":NaN', 1)
    text = text.replace('"util_pct":40.0', '"util_pct":Infinity', 1)
    r = sqlite_api.http.post("/v1/ingest", content=text, headers={
        "Content-Type": "application/json", **sqlite_api.auth(sqlite_api.token("agent"))})
    assert r.status_code == 422
    assert {tuple(e["loc"]) for e in r.json()["detail"]} == {("body", "gpu_samples", 0, "util_pct"),
                                                              ("body", "gpu_samples", 1, "util_pct")}


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00garbage", b"", b"[]", b'"a string"'])
def test_a_body_that_is_not_a_batch_gets_422(sqlite_api, content):
    r = sqlite_api.http.post("/v1/ingest", content=content, headers={
        "Content-Type": "application/json", **sqlite_api.auth(sqlite_api.token("agent"))})
    assert r.status_code == 422, r.text


def test_unknown_fields_from_a_newer_agent_are_ignored(sqlite_api):
    body = recent_batch().to_dict()
    body["gpu_samples"][0]["future_metric_pct"] = 12.0
    body["node"]["rack"] = "r7"
    assert sqlite_api.post("/v1/ingest", body, scope="agent").status_code == 200


def test_a_batch_over_the_row_limit_is_refused(sqlite_api):
    sqlite_api.ctx.max_batch_rows = 5
    r = sqlite_api.ingest(recent_batch(seconds=3))  # 6 GPU + 3 host rows
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]
    assert "at most 5" in r.json()["detail"][0]["msg"]


def test_an_oversized_body_gets_413_by_content_length(sqlite_api):
    sqlite_api.ctx.max_body_bytes = 64 * 1024
    body = recent_batch().to_dict()
    body["events"] = [{"ts_ms": 1, "kind": "xid", "detail": "x" * 8000} for _ in range(10)]
    r = sqlite_api.post("/v1/ingest", body, scope="agent")
    assert r.status_code == 413 and "larger than 65536 bytes" in r.json()["detail"]


def test_an_oversized_chunked_body_gets_413_too(sqlite_api):
    """No Content-Length: the bytes are counted as they stream in."""
    sqlite_api.ctx.max_body_bytes = 64 * 1024
    chunks = [b'{"node": {"hostname": "n"}, "events": ['] + [b'{"ts_ms": 1, "kind": "xid", "detail": "' +
                                                          b"x" * 4000 + b'"},'] * 20 + [b"{}]}"]
    r = sqlite_api.http.post("/v1/ingest", content=iter(chunks), headers={
        "Content-Type": "application/json", **sqlite_api.auth(sqlite_api.token("agent"))})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413


def test_a_small_chunked_batch_is_accepted(sqlite_api):
    text = recent_batch().to_json().encode()
    r = sqlite_api.http.post("/v1/ingest", content=iter([text[:100], text[100:]]), headers={
        "Content-Type": "application/json", **sqlite_api.auth(sqlite_api.token("agent"))})
    assert r.status_code == 200 and r.json()["inserted"] == 9


@pytest.mark.postgres
def test_a_store_outage_answers_503_with_retry_after_and_ingest_resumes(make_api, pg_url):
    url = make_url(pg_url)
    proxy = TcpProxy(url.host, url.port or 5432).start()
    api = make_api(url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False), mode="server")
    token = api.token("agent")
    assert api.ingest(recent_batch(SIM_NODE), token=token).status_code == 200
    proxy.stop()
    try:
        r = api.ingest(recent_batch(SIM_NODE, seconds=5), token=token)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        health = api.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert health.json()["store_reachable"] is False
        assert api.get("/v1/nodes").status_code == 503
    finally:
        proxy.start()
    r = api.ingest(recent_batch(SIM_NODE, seconds=5), token=token)
    assert r.status_code == 200 and r.json()["gpu_samples_inserted"] > 0
    assert api.get("/healthz").json()["status"] == "ok"
    proxy.stop()


def test_the_body_limit_counts_bytes_not_json(sqlite_api):
    sqlite_api.ctx.max_body_bytes = 1000
    small = json.dumps({"node": {"hostname": "n"}})
    assert sqlite_api.http.post("/v1/ingest", content=small, headers={
        "Content-Type": "application/json", **sqlite_api.auth(sqlite_api.token("agent"))}).status_code == 200


FAR_FUTURE_MS = 2**53 - 1


@pytest.mark.parametrize("part", ["gpu_samples", "host_samples"])
def test_a_sample_dated_far_in_the_future_is_refused_naming_the_field_and_the_bound(sqlite_api, part):
    body = recent_batch().to_dict()
    body[part][1]["ts_ms"] = FAR_FUTURE_MS
    r = sqlite_api.http.post("/v1/ingest", json=body, headers=sqlite_api.auth(sqlite_api.token("agent")))
    assert r.status_code == 422, r.text
    error = r.json()["detail"][0]
    assert error["loc"] == ["body", part, 1, "ts_ms"] and "at most 300 s ahead" in error["msg"]
    assert sqlite_api.get("/v1/gpus").json()["gpus"] == [], "nothing of the refused batch was stored"


def test_a_few_seconds_of_clock_skew_are_accepted(sqlite_api):
    ahead = recent_batch()
    for s in ahead.gpu_samples:
        s.ts_ms += 60_000
    assert sqlite_api.ingest(ahead).status_code == 200


def test_a_far_future_sample_in_the_store_or_snapshot_does_not_pin_the_live_view(make_api):
    """An agent writing the store directly (no ingest check) wrote one sample dated 2^53 − 1; the server's live
    view, /v1/gpus and /metrics keep showing the GPU's real, current readings."""
    from trimtab.store.ingest import BatchWriter

    api = make_api("sqlite", mode="server")
    bogus = recent_batch(util_pct=lambda i, t: 0.0)
    for s in bogus.gpu_samples:
        s.ts_ms = FAR_FUTURE_MS
    BatchWriter(api.ctx.engine).write(bogus)
    api.ctx.snapshot.update(bogus)
    assert api.ingest(recent_batch(util_pct=lambda i, t: 77.0)).status_code == 200
    latest = {g["uuid"]: g["latest"] for g in api.get("/v1/gpus").json()["gpus"]}
    assert latest and all(v is not None and v["metrics"]["util_pct"] == 77.0 for v in latest.values()), latest
    util = [line.rsplit(" ", 1)[1] for line in api.get("/metrics").text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL_RATIO{")]  # ratio 0-1: dcgm-exporter's current unit
    assert len(util) == len(latest) and set(util) == {"0.77"}, util


@pytest.mark.parametrize("field, value", [("sm_util_pct", 101.0), ("mem_util_pct", -1.0), ("util_samples", -3),
                                          ("util_from_ms", -5)])
def test_process_activity_is_stored_and_served_and_an_impossible_one_gets_422(sqlite_api, field, value):
    batch = recent_batch(seconds=1)
    t = batch.gpu_samples[0].ts_ms
    batch.processes = [GpuProcess(batch.gpus[0].uuid, t, 4242, 2**30, "python", 37.5, 12.0, 24, t - 5_000, t),
                       GpuProcess(batch.gpus[1].uuid, t, 4243)]  # no activity known: nulls, never 0
    bad = batch.to_dict()
    bad["processes"][0][field] = value
    r = sqlite_api.post("/v1/ingest", bad, scope="agent")
    assert r.status_code == 422 and ["body", "processes", 0, field] in [e["loc"] for e in r.json()["detail"]]
    ok = sqlite_api.ingest(batch)
    assert ok.status_code == 200 and ok.json()["processes_inserted"] == 2
    fields = ("pid", "sm_util_pct", "mem_util_pct", "util_samples", "util_from_ms", "util_to_ms")
    served = [[{k: p[k] for k in fields} for p in sqlite_api.get(f"/v1/gpus/{g.uuid}/processes",
                                                                  window_s=60).json()["processes"]]
              for g in batch.gpus]
    assert served == [[dict(zip(fields, (4242, 37.5, 12.0, 24, t - 5_000, t)))],
                      [dict(zip(fields, (4243, None, None, None, None, None)))]]
    assert sqlite_api.get("/v1/gpus/GPU-nope/processes").status_code == 404
