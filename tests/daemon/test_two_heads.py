"""Two `trimtab server`s on one PostgreSQL (issue 39: no single point of failure at the head): both take ingest and
serve reads of everything stored; exactly one plans, and both say which (/v1/planner, /healthz); the planning one
killed with SIGKILL, the other plans within 10 s."""

import signal
import time

import httpx
import pytest

from tests.store.conftest import make_batch
from tests.support.procs import admin_secret, free_port, stop, trimtab, wait_http
from trimtab.contract.readings import NodeInfo

pytestmark = pytest.mark.postgres
TAKEOVER_MAX_S = 10.0


def planner(base: str) -> dict:
    return httpx.get(f"{base}/v1/planner", timeout=5).json()


def test_two_servers_share_ingest_and_reads_one_plans_and_the_other_takes_over_its_death(pg_url, tmp_path):
    ports = [free_port(), free_port()]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    servers = []
    try:
        for i, port in enumerate(ports):
            servers.append(trimtab("server", "--db", pg_url, "--port", str(port), "--status-every", "100",
                                   env={"TRIMTAB_STATE_DIR": str(tmp_path / f"state{i}")}))
            wait_http(f"{bases[i]}/healthz", timeout_s=60, proc=servers[i])
        admin = admin_secret(tmp_path / "state0")
        token = httpx.post(f"{bases[0]}/v1/tokens", json={"name": "agents", "scope": "agent"},
                           headers={"Authorization": f"Bearer {admin}"}).json()["token"]
        now_ms = int(time.time() * 1000)
        for i, base in enumerate(bases):  # each server takes one node's batch …
            batch = make_batch([now_ms - 1000], node=NodeInfo(hostname=f"node-{i}"), uuid_prefix=f"GPU-{i}-",
                               util_pct=50.0)
            r = httpx.post(f"{base}/v1/ingest", content=batch.to_json(),
                           headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            assert r.status_code == 200, r.text
        for base in bases:  # … and each serves both
            nodes = {n["hostname"] for n in httpx.get(f"{base}/v1/nodes", timeout=5).json()["nodes"]}
            assert nodes == {"node-0", "node-1"}

        views = [planner(base) for base in bases]
        assert views[0]["planning_server"] == views[1]["planning_server"] is not None
        assert sorted(v["this_server_plans"] for v in views) == [False, True]
        leader = next(i for i, v in enumerate(views) if v["this_server_plans"])
        other = 1 - leader
        health = httpx.get(f"{bases[other]}/healthz", timeout=5).json()
        assert health["components"]["rebalancer"]["planner"]["planning_server"] == views[leader]["this_server"]

        servers[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while not planner(bases[other])["this_server_plans"] and time.monotonic() - killed < 2 * TAKEOVER_MAX_S:
            time.sleep(0.1)
        took_s = time.monotonic() - killed
        after = planner(bases[other])
        assert after["this_server_plans"] and after["planning_server"] == views[other]["this_server"]
        assert after["epoch"] == views[other]["epoch"] + 1
        assert took_s < TAKEOVER_MAX_S, f"the other server planned {took_s:.1f} s after the kill"
    finally:
        for server in servers:
            stop(server)
