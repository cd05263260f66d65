"""Soak: do a server's reads and memory stay flat while its store fills with history (issue 39)?

A real `trimtab server` (subprocess, loopback) over a fresh SQLite or PostgreSQL store. ``--nodes`` simulated nodes of
``--gpus`` GPUs (:class:`~trimtab.agent.simulated.SimulatedNode`, per-link NVLink rows included) post their live tick
every ``--interval-s`` over HTTP from a background thread, as agents do. Meanwhile this process writes their
*history* straight into the store with a ``BatchWriter``, as fast as the store takes it: real rows, one a GPU every
``--interval-s`` of data, from ``--hours`` before the start up to the start. Time is compressed that way, not shifted:
the newest samples stay at the wall clock, so the server's live views (which drop readings older than 300 s) see
every GPU, while the rows stored grow by one minute of data per minute written.

After every ``--report-every-min`` minutes of data: the median of ``--repeat`` requests to ``/metrics``,
``/v1/gpus``, ``/v1/balance`` and a window query (``/v1/gpus/{uuid}/samples``, the last 5 minutes raw), the
server's RSS, the rows stored; every ``--before-every``-th report also the latest-sample queries as they were before
migration 0012 (:mod:`bench.soak_before`, same store, called here). At the end, the least-squares slope of each
figure per hour of data and per million rows (flat is the goal).

    python bench/soak.py --db sqlite --hours 1                                # the hour, every data minute
    python bench/soak.py --db sqlite --hours 10 --report-every-min 30         # 10x the rows
    python bench/soak.py --db sqlite --find-n 80,160,320,640,1280 --hours 0.25  # largest N with /metrics < 1 s
    python bench/soak.py --db postgresql --servers 2 --find-n 640,1000,1600 --hours 0.05  # two servers, one store

``--servers 2`` (PostgreSQL): two `trimtab server`s on the one store, the live agents split over them round-robin
(``--agents first``: all on the first, the second reads every GPU from the store), each server's ``/metrics``
timed; a report's /metrics figure is the slowest server's.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's bench/
from bench.live_api import trimtab_server  # noqa: E402
from bench.server_load import agent_token, store_url  # noqa: E402

MIN_MS = 60_000
LIVE_METRICS_S = 1.0  # the target: a scrape of /metrics under a second


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Fleet:
    """The simulated nodes: their live ticks (posted) and their history (written straight to the store)."""

    def __init__(self, n_nodes: int, gpus: int, interval_s: float, run_id: str):
        from trimtab.agent.simulated import SimulatedNode
        from trimtab.contract.readings import NodeInfo

        self.interval_ms = int(interval_s * 1000)
        self.sims = [SimulatedNode(gpus, scenario="balanced", seed=i, hostname=f"soak-{run_id}-{i}")
                     for i in range(n_nodes)]
        self.infos = [NodeInfo(hostname=f"soak-{run_id}-{i}", simulated=True, scenario="balanced")
                      for i in range(n_nodes)]

    def batch(self, i: int, ticks: range, start_ms: int):
        from trimtab.contract.readings import Batch

        batch = Batch(node=self.infos[i], gpus=self.sims[i].inventory().gpus)
        for tick in ticks:
            r = self.sims[i].readings_at(tick, start_ms + tick * self.interval_ms)
            batch.gpu_samples += r.gpu_samples
            batch.nvlink_samples += r.nvlink_samples
            if r.host_sample is not None:
                batch.host_samples.append(r.host_sample)
        return batch

    def write_history(self, writer, start_ms: int, minute: int) -> int:
        """Minute ``minute`` of every node's history (ticks of that minute since ``start_ms``); the rows stored."""
        per_min = MIN_MS // self.interval_ms
        return sum(writer.write(self.batch(i, range(minute * per_min, (minute + 1) * per_min), start_ms)).total_inserted
                   for i in range(len(self.sims)))


TS_SENTINEL = 1_700_000_000_000  # the stamp a pre-rendered live body carries until it is sent
LIVE_VARIANTS = 8  # ticks pre-rendered a node: the bodies sent cycle through them, so readings still move


class LiveAgents(threading.Thread):
    """Posts the tick of the fleet's nodes ``nodes`` (default: all) at the wall clock every interval (the live
    readings the views show).

    Each node's bodies are rendered once (``LIVE_VARIANTS`` ticks, stamped with a sentinel) and only their stamp is
    replaced at send time: building a batch costs ~1.8 ms of this process's CPU a node, which on a 2-core machine
    starved the server it measures and, posted one by one from one thread, kept 540 of 1 600 GPUs live. A thread
    posts its share of the nodes over its own keep-alive connection; ``late`` counts the ticks it did not finish
    within the interval (its nodes' readings then arrive late: a scrape may show fewer GPUs, which find-n checks)."""

    def __init__(self, base: str, token: str, fleet: Fleet, nodes: Optional[list[int]] = None):
        super().__init__(daemon=True)
        self.base, self.token, self.fleet = base, token, fleet
        self.nodes = list(range(len(fleet.sims))) if nodes is None else nodes
        self.stop_event = threading.Event()
        self.sent = self.failed = self.ticks = self.late = 0
        self.bodies = {i: [self.render(i, k) for k in range(LIVE_VARIANTS)] for i in self.nodes}

    def render(self, i: int, k: int) -> str:
        """Node ``i``'s live tick ``k``, stamped with the sentinel."""
        tick = 10**6 + k  # far from the history's ticks; the readings only depend on the tick index
        return self.fleet.batch(i, range(tick, tick + 1), TS_SENTINEL - tick * self.fleet.interval_ms).to_json()

    def body(self, i: int) -> str:
        """What node ``i`` sends this tick, still stamped with the sentinel."""
        return self.bodies[i][self.ticks % LIVE_VARIANTS]

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        interval_s = self.fleet.interval_ms / 1000
        stamp = f'"ts_ms":{TS_SENTINEL}'
        with httpx.Client(base_url=self.base, headers=headers, timeout=10) as http:
            while not self.stop_event.is_set():
                started = time.monotonic()
                now = f'"ts_ms":{int(time.time() * 1000)}'
                for i in self.nodes:
                    body = self.body(i).replace(stamp, now)
                    try:
                        ok = http.post("/v1/ingest", content=body).status_code < 300
                    except httpx.HTTPError:
                        ok = False
                    self.sent += 1
                    self.failed += not ok
                self.ticks += 1
                spent = time.monotonic() - started
                self.late += spent > interval_s
                self.stop_event.wait(max(0.0, interval_s - spent))


def live_threads(base: str, token: str, fleet: Fleet, nodes: list[int], threads: int) -> list[LiveAgents]:
    """``threads`` posting threads for ``nodes`` (round-robin), none without a node."""
    return [LiveAgents(base, token, fleet, nodes[k::threads]) for k in range(max(1, threads)) if nodes[k::threads]]


def timed_get(http: httpx.Client, path: str, repeat: int) -> float:
    """Median milliseconds of ``repeat`` GETs (each must answer 200)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        r = http.get(path)
        times.append(1000 * (time.perf_counter() - started))
        if r.status_code != 200:
            raise SystemExit(f"GET {path}: {r.status_code} {r.text[:200]}")
    return statistics.median(times)


def gpus_in_metrics(http: httpx.Client) -> int:
    """The GPUs one /metrics scrape shows (its per-GPU sample-time series): the live view drops a GPU whose newest
    reading is over 300 s old, so on a starved machine whose live agents fall behind a scrape renders fewer GPUs
    than the fleet has, and its time is not the fleet's (seen 2026-12-06: 1 600 GPUs "59 ms" at load 10)."""
    text = http.get("/metrics").text
    return sum(line.startswith("trimtab_gpu_sample_timestamp_seconds{") for line in text.splitlines())


def measure(http: httpx.Client, uuid: str, repeat: int) -> dict[str, float]:
    return {"metrics_ms": timed_get(http, "/metrics", repeat), "metrics_gpus": gpus_in_metrics(http),
            "gpus_ms": timed_get(http, "/v1/gpus", repeat),
            "balance_ms": timed_get(http, "/v1/balance", repeat),
            "window_ms": timed_get(http, f"/v1/gpus/{uuid}/samples?window_s=300&resolution=raw", repeat)}


def measure_before(engine, repeat: int) -> dict[str, float]:
    """The latest-sample queries as they were before migration 0012 and as they are, on the same store."""
    from bench.soak_before import latest_gpu_samples_before, latest_nvlink_samples_before
    from trimtab.store.queries import latest_gpu_samples, latest_nvlink_samples

    out = {}
    now_ms = int(time.time() * 1000) + 300_000
    for name, fn in (("before_latest_ms", lambda: (latest_gpu_samples_before(engine, not_after_ms=now_ms),
                                                   latest_nvlink_samples_before(engine, not_after_ms=now_ms))),
                     ("after_latest_ms", lambda: (latest_gpu_samples(engine, not_after_ms=now_ms),
                                                  latest_nvlink_samples(engine, not_after_ms=now_ms)))):
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - started))
        out[name] = statistics.median(times)
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def agents_by_server(n_nodes: int, servers: int, spread: str) -> list[list[int]]:
    """Which nodes post to which server: round-robin (``split``) or all to the first (``first``)."""
    if spread == "first":
        return [list(range(n_nodes))] + [[] for _ in range(servers - 1)]
    return [list(range(k, n_nodes, servers)) for k in range(servers)]


def soak(args, url: str, tmp: Path, n_nodes: int, quiet: bool = False) -> list[dict]:
    """One run: history of ``args.hours`` written while measuring; the report rows. With ``args.servers`` > 1
    every server is a `trimtab server` on the same store (one state directory: the first one's admin token), the
    live agents spread over them by ``args.agents``, and each report's /metrics time the slowest server's."""
    from trimtab.store.engine import open_engine
    from trimtab.store.ingest import BatchWriter

    token = agent_token(url)
    fleet = Fleet(n_nodes, args.gpus, args.interval_s, secrets.token_hex(2))
    minutes = int(round(args.hours * 60))
    start_ms = int(time.time() * 1000) - minutes * MIN_MS - 10_000  # the history ends 10 s before the start
    engine = open_engine(url)
    writer = BatchWriter(engine)
    rows: list[dict] = []
    stored = 0  # history rows (GPU, per-link NVLink, host); the live ticks add a few more
    with ExitStack() as stack:
        servers = [stack.enter_context(trimtab_server(url, tmp / f"state-{n_nodes}", start_timeout_s=180.0))
                   for _ in range(args.servers)]
        lives = [live for (base, _, _), nodes in zip(servers, agents_by_server(n_nodes, args.servers, args.agents))
                 for live in live_threads(base, token, fleet, nodes, args.live_threads)]
        for live in lives:
            live.start()
        try:
            admin = servers[0][1]
            clients = [stack.enter_context(httpx.Client(base_url=base, timeout=120,
                                                        headers={"Authorization": f"Bearer {admin}"}))
                       for base, _, _ in servers]
            time.sleep(2 * args.interval_s)  # a first live tick of every node
            uuid = fleet.sims[0].inventory().gpus[0].uuid
            started = time.monotonic()
            for minute in range(minutes + 1):
                if minute % args.report_every_min == 0 or minute == minutes:
                    row = {"data_min": minute, "rows": stored, **measure(clients[0], uuid, args.repeat),
                           "rss_mb": max(rss_mb(pid) for _, _, pid in servers), "wall_s": time.monotonic() - started}
                    if len(clients) > 1:
                        row["metrics_ms_by_server"] = [row["metrics_ms"]] + [
                            timed_get(http, "/metrics", args.repeat) for http in clients[1:]]
                        row["metrics_ms"] = max(row["metrics_ms_by_server"])
                    if args.before_every and (minute // args.report_every_min) % args.before_every == 0:
                        row.update(measure_before(engine, 1))
                    rows.append(row)
                    if not quiet:
                        print(_line(row), flush=True)
                if minute < minutes:
                    stored += fleet.write_history(writer, start_ms, minute)
        finally:
            for live in lives:
                live.stop_event.set()
            for live in lives:
                live.join(15)
            writer.close()
            engine.dispose()
        for live in lives:
            if live.failed:
                print(f"live ticks to {live.base}: {live.failed} of {live.sent} posts failed")
        if rows:
            rows[-1]["live_late"] = sum(live.late for live in lives)
            rows[-1]["live_ticks"] = sum(live.ticks for live in lives)
    return rows


def _line(row: dict) -> str:
    before = (f" {row['before_latest_ms']:>10.1f} {row['after_latest_ms']:>9.1f}"
              if "before_latest_ms" in row else f" {'':>10} {'':>9}")
    return (f"{row['data_min']:>5} {row['rows']:>10} {row['metrics_ms']:>9.1f} {row['gpus_ms']:>8.1f} "
            f"{row['balance_ms']:>9.1f} {row['window_ms']:>9.1f} {row['rss_mb']:>7.1f}{before} {row['wall_s']:>7.0f}")


HEADER = (f"{'min':>5} {'rows':>10} {'metrics':>9} {'gpus':>8} {'balance':>9} {'window':>9} {'rss MB':>7} "
          f"{'before ms':>10} {'after ms':>9} {'wall s':>7}")


def report_slopes(rows: list[dict]) -> None:
    hours = [r["data_min"] / 60 for r in rows]
    mrows = [r["rows"] / 1e6 for r in rows]
    print("slopes (least squares over the reports): per hour of data | per million rows")
    for key, unit in (("metrics_ms", "ms"), ("gpus_ms", "ms"), ("balance_ms", "ms"), ("window_ms", "ms"),
                      ("rss_mb", "MB")):
        ys = [r[key] for r in rows]
        print(f"  {key:<12} {slope(hours, ys):>+9.2f} {unit}/h | {slope(mrows, ys):>+9.2f} {unit}/Mrow   "
              f"(first {ys[0]:.1f}, last {ys[-1]:.1f}, max {max(ys):.1f})")
    half = rows[len(rows) // 2:]
    print(f"  rss_mb, second half: {slope([r['data_min'] / 60 for r in half], [r['rss_mb'] for r in half]):+.2f} MB/h")
    before = [r for r in rows if "before_latest_ms" in r]
    if before:
        print("  latest-sample queries, before 0012 vs now: "
              + ", ".join(f"{r['rows']} rows {r['before_latest_ms']:.0f} vs {r['after_latest_ms']:.1f} ms"
                          for r in (before[0], before[-1])))


@contextmanager
def fresh_store(db: str) -> Iterator[tuple[str, Path]]:
    """A fresh, empty store of kind ``db`` and a temporary directory, both gone afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="trimtab-soak-"))
    url, drop = store_url(db, tmp)
    try:
        yield url, tmp
    finally:
        drop()
        shutil.rmtree(tmp, ignore_errors=True)


def find_n(args) -> None:
    """For each N (GPUs) in ``--find-n``: a fresh store with ``--hours`` of history, then the /metrics median
    (of the slowest server, with ``--servers`` > 1: each one's in brackets)."""
    where = (f"{args.servers} servers on one {args.db} store, agents {args.agents}" if args.servers > 1
             else f"one server on {args.db}")
    print(f"find-n: {where}, {args.hours:g} h of history a run")
    print(f"{'GPUs':>6} {'shown':>6} {'rows':>10} {'metrics':>9} {'gpus':>8} {'balance':>9} {'rss MB':>7}  (medians, ms;"
          f" shown: the GPUs /metrics rendered)")
    best = None
    for n_gpus in [int(x) for x in args.find_n.split(",")]:
        with fresh_store(args.db) as (url, tmp):
            rows = soak(args, url, tmp, max(1, n_gpus // args.gpus), quiet=True)
        last = rows[-1]
        each = (" [" + ", ".join(f"{ms:.1f}" for ms in last["metrics_ms_by_server"]) + "]"
                if "metrics_ms_by_server" in last else "")
        print(f"{n_gpus:>6} {last['metrics_gpus']:>6} {last['rows']:>10} {last['metrics_ms']:>9.1f} {last['gpus_ms']:>8.1f} "
              f"{last['balance_ms']:>9.1f} {last['rss_mb']:>7.1f}{each}  (live ticks late {last.get('live_late', 0)} of "
              f"{last.get('live_ticks', 0)})", flush=True)
        if last["metrics_ms"] >= LIVE_METRICS_S * 1000:
            break
        if last["metrics_gpus"] < max(1, n_gpus // args.gpus) * args.gpus:
            print(f"  /metrics showed {last['metrics_gpus']} of the {n_gpus} GPUs (the live agents fell behind): "
                  f"this N is not measured")
            continue
        best = n_gpus
    print(f"largest N tried with /metrics < {LIVE_METRICS_S:g} s ({where}): {best}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    ap.add_argument("--interval-s", type=float, default=1.0, help="seconds between samples (the agent's default)")
    ap.add_argument("--hours", type=float, default=1.0, help="hours of history to write")
    ap.add_argument("--report-every-min", type=int, default=1, help="report every this many minutes of data")
    ap.add_argument("--repeat", type=int, default=3, help="requests per endpoint and report (median)")
    ap.add_argument("--before-every", type=int, default=10,
                    help="time the pre-0012 latest queries every this many reports (0: never)")
    ap.add_argument("--find-n", default="", help="comma-separated GPU counts: find the largest with /metrics < 1 s")
    ap.add_argument("--servers", type=int, default=1,
                    help="trimtab servers on the one store (PostgreSQL: several serve together), each scraped")
    ap.add_argument("--agents", choices=["split", "first"], default="split",
                    help="with --servers > 1: the live agents round-robin over the servers, or all on the first")
    ap.add_argument("--live-threads", type=int, default=4,
                    help="threads posting the live ticks, per server (each its own connection and share of nodes)")
    args = ap.parse_args()
    if args.servers < 1:
        ap.error("--servers must be at least 1")
    if args.servers > 1 and args.db == "sqlite":
        ap.error("--servers > 1 needs --db postgresql (on SQLite a second server serves, but one writer at a time)")

    if args.find_n:
        find_n(args)
        return 0
    on = f", {args.servers} servers (agents {args.agents}, /metrics of the slowest)" if args.servers > 1 else ""
    print(f"soak: {args.db}{on}, {args.nodes} nodes x {args.gpus} GPUs, a sample every {args.interval_s:g} s, "
          f"{args.hours:g} h of history; request medians of {args.repeat} (ms)")
    print(HEADER)
    with fresh_store(args.db) as (url, tmp):
        rows = soak(args, url, tmp, args.nodes)
    report_slopes(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
