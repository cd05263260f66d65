"""How many nodes can one `trimtab server` take? N simulated nodes × 8 GPUs, one batch per node per second.

Starts a real `trimtab server` (subprocess, loopback, ephemeral port) on SQLite or PostgreSQL, then for each N in
``--nodes`` sends, for ``--seconds``, one batch per node per second (8 GPU samples + 1 host sample, a tick of a
`SimulatedNode`), spread evenly over the second, from an asyncio client. A send that fails or answers non-2xx
is a drop. After each step the rows in the store are counted against the rows sent. Reports per N: sends,
drops, p50/p99 ingest latency, rows stored/sent, and the p99 ratio to N=1 measured in the same run (the
baseline). The answer is the largest N with 0 drops and p99 < 100 ms.

    python bench/server_load.py --db sqlite --nodes 1,10,25,50,100 --seconds 10
    python bench/server_load.py --db postgresql --nodes 1,10,25,50,100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import trimtab_server  # noqa: E402

PG_BASE = os.environ.get("TRIMTAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def store_url(kind: str, tmp: Path) -> tuple[str, callable]:
    if kind == "sqlite":
        return f"sqlite:///{tmp}/load.db", lambda: None
    from sqlalchemy import create_engine, text

    schema = f"trimtab_load_{secrets.token_hex(3)}"
    admin = create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop():
        with admin.connect() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    sep = "&" if "?" in PG_BASE else "?"
    return f"{PG_BASE}{sep}options={quote(f'-csearch_path={schema}')}", drop


def agent_token(url: str) -> str:
    """An ``agent`` token made in the store itself, as `trimtab token create` does: the server's own first admin
    token goes to a file named after its store (``admin-<database>-<hash>.token`` for a --db of its own)."""
    from trimtab.api.auth import create_token
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    engine = open_engine(url)
    try:
        migrate(engine)
        return create_token(engine, "bench/server_load.py", "agent")[1]
    finally:
        engine.dispose()


def count_rows(url: str) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        n = c.execute(text("SELECT (SELECT COUNT(*) FROM gpu_samples) + (SELECT COUNT(*) FROM host_samples)")).scalar_one()
    eng.dispose()
    return n


async def run_step(base: str, token: str, n_nodes: int, seconds: float, run_id: str) -> dict:
    from trimtab.contract.readings import Batch, NodeInfo
    from trimtab.agent.simulated import SimulatedNode

    nodes = [SimulatedNode(8, scenario="balanced", seed=i, hostname=f"{run_id}-n{n_nodes}-{i}") for i in range(n_nodes)]
    infos = [NodeInfo(hostname=f"{run_id}-n{n_nodes}-{i}", simulated=True, scenario="balanced") for i in range(n_nodes)]
    latencies: list[float] = []
    drops = 0
    rows_sent = 0
    limits = httpx.Limits(max_connections=max(10, n_nodes), max_keepalive_connections=max(10, n_nodes))
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                                 timeout=10.0, limits=limits) as client:
        await client.get(f"{base}/healthz")  # open the connection pool outside the timed sends
        t0 = time.monotonic()

        async def node_loop(i: int) -> None:
            nonlocal drops, rows_sent
            offset = i / n_nodes  # spread the nodes over the second
            tick = 0
            while True:
                due = t0 + offset + tick
                if due - t0 >= seconds:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                ts_ms = int(time.time() * 1000)
                r = nodes[i].readings_at(tick, ts_ms)
                batch = Batch(node=infos[i], gpus=nodes[i].inventory().gpus, gpu_samples=r.gpu_samples,
                              host_samples=[] if r.host_sample is None else [r.host_sample])
                body = batch.to_json()
                started = time.perf_counter()
                try:
                    resp = await client.post(f"{base}/v1/ingest", content=body)
                    ok = resp.status_code < 300
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                if ok:
                    rows_sent += batch.row_count()
                else:
                    drops += 1
                tick += 1

        await asyncio.gather(*(node_loop(i) for i in range(n_nodes)))
    lat = sorted(latencies)
    return {"nodes": n_nodes, "sends": len(lat), "drops": drops, "rows_sent": rows_sent,
            "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--nodes", default="1,10,25,50,100")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trimtab-load-"))
    url, cleanup = store_url(args.db, tmp)
    token = agent_token(url)
    try:
        with trimtab_server(url, tmp / "state", start_timeout_s=60.0) as (base, _admin, _pid):
            run_id = secrets.token_hex(2)
            results, stored_before = [], 0
            print(f"server: {args.db}, {args.seconds:g} s per step, 8 GPUs per node, 1 batch/node/s; "
                  f"cores: {os.cpu_count()}")
            print(f"{'nodes':>6} {'sends':>7} {'drops':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99/base':>9} "
                  f"{'stored/sent':>12}")
            for n in [int(x) for x in args.nodes.split(",")]:
                res = asyncio.run(run_step(base, token, n, args.seconds, run_id))
                time.sleep(0.5)
                stored = count_rows(url)
                res["rows_stored"], stored_before = stored - stored_before, stored
                results.append(res)
                ratio = res["p99_ms"] / results[0]["p99_ms"]
                print(f"{n:>6} {res['sends']:>7} {res['drops']:>6} {res['p50_ms']:>8.1f} {res['p99_ms']:>8.1f} "
                      f"{ratio:>9.2f} {res['rows_stored']:>6}/{res['rows_sent']:<6}")
            ok = [r["nodes"] for r in results
                  if r["drops"] == 0 and r["p99_ms"] < 100 and r["rows_stored"] == r["rows_sent"]]
            print(f"largest N with 0 drops, all rows stored and p99 < 100 ms: {max(ok) if ok else 'none'}")
    finally:
        cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
