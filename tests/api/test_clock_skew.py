"""A node whose clock is wrong is shown, not lost: refused batches leave it in /v1/nodes with its skew and a
clock_skew event; /healthz is degraded (200) and names it; a node behind is a stale row of /v1/balance and `check`,
saying why — on SQLite and PostgreSQL."""

import json
import re

import pytest

from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.contract.readings import Batch, NodeInfo
from tests.api.conftest import now_ms, recent_batch

HOUR_MS = 3_600_000


def shifted(node_name: str, by_ms: int) -> Batch:
    """A batch of a node whose clock reads ``by_ms`` off the true time: stamped by it, sent by it."""
    batch = recent_batch(node=NodeInfo(hostname=node_name))
    for part in (batch.gpu_samples, batch.host_samples):
        for row in part:
            row.ts_ms += by_ms
    return batch


def send(api, batch: Batch, node_clock_ms: int):
    return api.http.post("/v1/ingest", content=batch.to_json(sent_ms=node_clock_ms), headers={
        "Content-Type": "application/json", **api.auth(api.token("agent"))})


def node(api, hostname: str) -> dict:
    (found,) = [n for n in api.get("/v1/nodes").json()["nodes"] if n["hostname"] == hostname]
    return found


def test_a_node_an_hour_ahead_is_refused_but_listed_with_its_skew_an_event_and_a_degraded_healthz(api):
    for _ in range(5):  # a backlog: refused batch after batch, one event
        r = send(api, shifted("ahead", HOUR_MS), now_ms() + HOUR_MS)
        assert r.status_code == 422, r.text
    listed = node(api, "ahead")
    assert -3610 < listed["clock_skew_s"] < -3590 and listed["clock_off"] is True
    assert listed["clock_refused_ms"] is not None and "ahead of the server's clock" in listed["clock_refused_detail"]
    events = [e for e in api.get("/v1/events", kind="clock_skew").json()["events"] if e["hostname"] == "ahead"]
    refused = [e for e in events if e["detail"].startswith("batch refused")]
    assert len(refused) == 1, events
    assert any("s ahead of the receiver's" in e["detail"] for e in events), events
    health = api.get("/healthz")
    assert health.status_code == 200, "a node's clock degrades what it shows, not the server"
    assert health.json()["status"] == "degraded"
    assert [line for line in health.json()["clocks"] if line.startswith("node ahead:") and "ahead of" in line]
    balance = api.get("/v1/balance").json()
    (row,) = [r for r in balance["reports"] if r["hostname"] == "ahead"]
    assert row["stale"] is True and row["gpus"] == [] and "refused" in row["clock_note"]
    assert balance["status"] == "stale"


def test_a_node_an_hour_behind_is_a_stale_row_with_why_in_balance_and_check(api):
    assert send(api, recent_batch(node=NodeInfo(hostname="right")), now_ms()).status_code == 200
    r = send(api, shifted("behind", -HOUR_MS), now_ms() - HOUR_MS)
    assert r.status_code == 200, "behind is not refused: its samples are stored, an hour old"
    listed = node(api, "behind")
    assert 3590 < listed["clock_skew_s"] < 3610 and listed["clock_off"] is True
    assert node(api, "right")["clock_off"] is False and abs(node(api, "right")["clock_skew_s"]) < 5
    balance = api.get("/v1/balance", window_s=30).json()
    rows = {r["hostname"]: r for r in balance["reports"]}
    assert set(rows) == {"right", "behind"}, "listed, not absent"
    assert rows["behind"]["stale"] is True and 3590 < rows["behind"]["newest_sample_age_s"] < 3620
    assert "behind the receiver's" in rows["behind"]["clock_note"]
    assert rows["right"]["stale"] is False and rows["right"]["clock_note"] is None
    res = CliRunner().invoke(cli, ["check", "--server", api.url, "--window", "30", "--json"])
    assert res.exit_code == 2, res.output
    assert "node behind is STALE" in res.stderr and "behind the receiver's" in res.stderr
    assert {n["hostname"] for n in json.loads(res.stdout)["nodes"]} == {"right", "behind"}
    health = api.get("/healthz").json()
    assert health["status"] == "degraded" and any(line.startswith("node behind:") for line in health["clocks"])


def test_check_on_the_store_names_the_node_behind_too(api):
    if not api.ctx.engine.url.get_backend_name() == "sqlite":
        url = api.ctx.engine.url.render_as_string(hide_password=False)
    else:
        url = f"sqlite:///{api.ctx.engine.url.database}"
    assert send(api, shifted("behind", -HOUR_MS), now_ms() - HOUR_MS).status_code == 200
    res = CliRunner().invoke(cli, ["check", "--db", url, "--window", "30"])
    assert res.exit_code == 2, res.output
    assert "node behind is STALE: its newest sample is" in res.stderr and "(skew +36" in res.stderr
    assert re.search(r"clock: its clock is 3[56]\d\d s behind the receiver's", res.stdout), res.stdout


def test_a_node_in_time_degrades_nothing(api):
    assert send(api, recent_batch(), now_ms()).status_code == 200
    health = api.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["clocks"] == []


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_node_set_right_after_running_ahead_shows_its_current_readings_at_once(backend, request, make_api):
    """A node 2 min ahead is set right (NTP): its stamps step back 2 min. /v1/gpus (the live view) and the store's
    latest rows kept its last reading from before until real time caught up; now its readings of now replace it
    once they are STEP_BACK_MARGIN_MS newer on the server's clock — here at once: the held one was sampled 6 s
    before its batch was sent."""
    from trimtab.store.queries import latest_gpu_samples

    api = make_api("sqlite" if backend == "sqlite" else request.getfixturevalue("pg_url"), mode="server")
    ahead = shifted("ntp", 120_000 - 6_000)  # stamped 2 min ahead, 6 s before it is sent
    for row in ahead.gpu_samples:
        row.util_pct = 11.0
    assert send(api, ahead, now_ms() + 120_000).status_code == 200
    now = shifted("ntp", 0)  # the clock set right: the node's reading of now
    for row in now.gpu_samples:
        row.util_pct = 77.0
    assert send(api, now, now_ms()).status_code == 200
    gpus = [g for g in api.get("/v1/gpus", node="ntp").json()["gpus"]]
    assert gpus and all(g["latest"]["metrics"]["util_pct"] == 77.0 for g in gpus), gpus
    assert all(g["latest"]["ts_ms"] == now.gpu_samples[-1].ts_ms for g in gpus)
    stored = latest_gpu_samples(api.ctx.engine, hostname="ntp")
    assert stored and all(s.metrics["util_pct"] == 77.0 for s in stored), "the store's latest rows likewise"
    assert node(api, "ntp")["clock_off"] is False, "its skew is measured as it is now"
