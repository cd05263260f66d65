"""What grows in a server's memory under simulated agents (issue 39): tracemalloc snapshots diffed over a run.

The API of `trimtab server` in this process (mode ``server``, a fresh SQLite or PostgreSQL store) with the agents of
``bench/soak.py`` posting live ticks every ``--interval-s`` and a scraper reading ``/metrics``, ``/v1/gpus``,
``/v1/balance`` and a window every second. A first snapshot after ``--warm-s``, a second after ``--run-s`` more: the
allocations that grew most between them (by file and line), the Python heap traced and the process RSS at each point
(RSS - traced: memory outside Python's allocator, e.g. SQLite's page caches). ``--churn-every`` N: each node takes
a new host name every N ticks (pods that come and go), to show what is kept per host ever seen.

    python bench/soak_memory.py --db sqlite --nodes 20 --interval-s 0.25 --warm-s 30 --run-s 120
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.server_load import agent_token, store_url  # noqa: E402
from bench.soak import LIVE_VARIANTS, Fleet, LiveAgents, rss_mb  # noqa: E402


def sqlite_heap_mb() -> float:
    from trimtab.store.sqlite_pragmas import sqlite_memory_used_bytes

    used = sqlite_memory_used_bytes()
    return float("nan") if used is None else used / 2**20


class Scraper(threading.Thread):
    def __init__(self, base: str, token: str, uuid: str):
        super().__init__(daemon=True)
        self.base, self.token, self.uuid = base, token, uuid
        self.stop_event = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        paths = ("/metrics", "/v1/gpus", "/v1/balance", f"/v1/gpus/{self.uuid}/samples?window_s=300")
        with httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as http:
            while not self.stop_event.wait(1.0):
                for path in paths:
                    http.get(path)
                self.scrapes += 1


class ChurningAgents(LiveAgents):
    """Live agents whose nodes take a new host name every ``every`` ticks."""

    def __init__(self, base: str, token: str, fleet: Fleet, every: int):
        super().__init__(base, token, fleet)
        self.every, self.renames = every, 0

    def body(self, i: int) -> str:
        """Rendered afresh each tick: the node's host name changes under it."""
        return self.render(i, self.ticks % LIVE_VARIANTS)

    def run(self) -> None:
        from trimtab.contract.readings import NodeInfo

        original = list(self.fleet.infos)

        def rename() -> None:
            while not self.stop_event.wait(self.every * self.fleet.interval_ms / 1000):
                self.renames += 1
                self.fleet.infos = [NodeInfo(hostname=f"{n.hostname}-{self.renames}", simulated=True,
                                             scenario=n.scenario) for n in original]

        threading.Thread(target=rename, daemon=True).start()
        super().run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--interval-s", type=float, default=0.25)
    ap.add_argument("--warm-s", type=float, default=30.0)
    ap.add_argument("--run-s", type=float, default=120.0)
    ap.add_argument("--churn-every", type=int, default=0, help="new host names every N ticks (0: never)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()

    from trimtab.api.app import create_app
    from trimtab.api.auth import ensure_admin_token
    from trimtab.api.context import ApiContext
    from trimtab.daemon import ApiServer
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    tmp = Path(tempfile.mkdtemp(prefix="trimtab-soakmem-"))
    url, cleanup = store_url(args.db, tmp)
    token = agent_token(url)
    engine = open_engine(url)
    migrate(engine)
    admin = ensure_admin_token(engine, tmp).read_text().strip()
    tracemalloc.start(10)
    server = ApiServer(create_app(ApiContext(engine=engine, mode="server", state_dir=tmp)), "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{server.port}"
    fleet = Fleet(args.nodes, args.gpus, args.interval_s, secrets.token_hex(2))
    agents = (ChurningAgents(base, token, fleet, args.churn_every) if args.churn_every
              else LiveAgents(base, token, fleet))
    scraper = Scraper(base, admin, fleet.sims[0].inventory().gpus[0].uuid)
    try:
        agents.start()
        scraper.start()
        points = []

        def point(label: str):
            traced, _peak = tracemalloc.get_traced_memory()
            points.append((label, traced / 2**20, rss_mb(os.getpid()), sqlite_heap_mb()))
            print(f"{label:>6}: traced {points[-1][1]:7.1f} MB, SQLite {points[-1][3]:7.1f} MB, "
                  f"RSS {points[-1][2]:7.1f} MB, "
                  f"{agents.sent} posts ({agents.failed} failed), {scraper.scrapes} scrape rounds", flush=True)

        time.sleep(args.warm_s)
        point("warm")
        first = tracemalloc.take_snapshot()
        step = args.run_s / 4
        for k in range(4):
            time.sleep(step)
            point(f"+{step * (k + 1):.0f}s")
        second = tracemalloc.take_snapshot()
        keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
        print(f"grew most between warm and +{args.run_s:.0f}s (by line):")
        for stat in second.filter_traces(keep).compare_to(first.filter_traces(keep), "lineno")[:args.top]:
            print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {stat.traceback[0]}")
        (_, t0, r0, q0), (_, t1, r1, q1) = points[0], points[-1]
        minutes = args.run_s / 60
        print(f"slope: traced {(t1 - t0) / minutes:+.2f} MB/min, SQLite {(q1 - q0) / minutes:+.2f} MB/min, "
              f"RSS {(r1 - r0) / minutes:+.2f} MB/min")
    finally:
        agents.stop_event.set()
        scraper.stop_event.set()
        agents.join(15)
        scraper.join(60)
        server.stop()
        engine.dispose()
        cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
