"""Two agents (separate processes, two simulated nodes) ship to one `trimtab server` on the real PostgreSQL; the
server is killed (SIGKILL) for a while mid-run and restarted on the same port: every sample arrives exactly once."""

import re
import signal

import httpx
import pytest
from sqlalchemy import text

from trimtab.store.engine import open_engine
from tests.support.procs import admin_secret, free_port, stop, trimtab, wait_http
from tests.support.waits import eventually

pytestmark = pytest.mark.postgres
NODES = ("node-a", "node-b")


def nodes_with_samples(pg_url: str) -> set[str]:
    engine = open_engine(pg_url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(text("SELECT DISTINCT n.hostname FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                                         "JOIN nodes n ON n.id = g.node_id")).scalars())
    finally:
        engine.dispose()


def spooled_batches(spool_dir) -> int:
    """Batches waiting in an agent's spool (one a line in its ``*.jsonl`` segments)."""
    return sum(p.read_bytes().count(b"\n") for p in spool_dir.glob("*.jsonl")) if spool_dir.is_dir() else 0


def test_every_sample_arrives_once_through_a_server_crash(pg_url, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"TRIMTAB_STATE_DIR": str(tmp_path / "state")}
    server = trimtab("server", "--db", pg_url, "--port", str(port), env=env)
    try:
        wait_http(f"{base}/healthz", proc=server)
        admin = admin_secret(tmp_path / "state")
        r = httpx.post(f"{base}/v1/tokens", json={"name": "agents", "scope": "agent"},
                       headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code in (200, 201), r.text
        token = r.json()["token"]

        agents = {name: trimtab("agent", "--server", base, "--token", token, "--simulate", "2", "--hostname", name,
                                "--interval", "0.2", "--duration", "9", "--spool-dir", str(tmp_path / name),
                                "--status-every", "100", env=env)
                  for name in NODES}
        # both agents are shipping …
        eventually(lambda: nodes_with_samples(pg_url) == set(NODES), timeout_s=30, interval_s=0.1)
        stop(server, signal.SIGKILL)              # … when the head node dies …
        # … and each spools a few ticks (the outage spans several batches) …
        eventually(lambda: all(spooled_batches(tmp_path / name) >= 3 for name in NODES), timeout_s=30, interval_s=0.1)
        server = trimtab("server", "--db", pg_url, "--port", str(port), env=env)   # … until it comes back
        wait_http(f"{base}/healthz", proc=server)
        logs = {name: p.communicate(timeout=90)[1] for name, p in agents.items()}  # they stop after --duration
    finally:
        stop(server)

    engine = open_engine(pg_url)
    with engine.connect() as conn:
        per_node = conn.execute(text("SELECT n.hostname, COUNT(*) FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                                     "JOIN nodes n ON n.id = g.node_id GROUP BY n.hostname")).all()
        for name, log in logs.items():
            ticks = int(re.findall(r"stopped: .*?: (\d+) ticks", log)[-1])
            spooled = re.search(r"unreachable, spooling", log)
            assert spooled, f"{name} never noticed the outage:\n{log}"
            n, distinct = conn.execute(text(
                "SELECT COUNT(*), COUNT(DISTINCT (s.gpu_id, s.ts_ms)) FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                "JOIN nodes n ON n.id = g.node_id WHERE n.hostname = :h"), {"h": name}).one()
            assert n == distinct == 2 * ticks, f"{name}: {n} rows, {distinct} distinct, {ticks} ticks × 2 GPUs; {per_node}\n{log}"
            simulated = conn.execute(text("SELECT simulated FROM nodes WHERE hostname = :h"), {"h": name}).scalar_one()
            assert simulated is True
    engine.dispose()
