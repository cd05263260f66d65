"""Ingest throughput of the store: ``BatchWriter`` against the floor of a bare DB-API executemany.

Both sides write the same gpu_samples rows with the same ``INSERT … ON CONFLICT DO NOTHING`` statement, in the
same batch sizes, one commit per batch, each into a freshly migrated empty store (a SQLite file in a temporary
directory; a fresh PostgreSQL schema). The raw side gets its parameter tuples prepared in advance and writes
nothing else; BatchWriter also converts the readings, writes one host row per tick and keeps node/rollup state,
so the ratio is what the whole ingest path costs over the database's own floor.

    python bench/store_ingest.py                 # SQLite and the local PostgreSQL
    python bench/store_ingest.py --pg-url ''     # SQLite only
"""

from __future__ import annotations

import argparse
import random
import secrets
import tempfile
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Callable, Iterator
from urllib.parse import quote

from sqlalchemy import create_engine, text

from trimtab.contract.readings import Batch, GpuInfo, GpuSample, HostSample, NodeInfo
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter, DriverStatement
from trimtab.store.inserts import insert_for
from trimtab.store.migrate import migrate
from trimtab.store.models import gpu_samples, gpus, host_samples, nodes

T0_MS = 1_700_000_000_000


def make_batches(n_gpus: int, ticks: int, ticks_per_batch: int) -> list[Batch]:
    rnd = random.Random(7)
    node = NodeInfo(hostname="bench-node", driver_version="550.54")
    inventory = [GpuInfo(uuid=f"GPU-{i:04d}", index=i, name="NVIDIA H200", pcie_peak_bytes_per_s=63e9,
                         gpm_supported=True) for i in range(n_gpus)]
    batches = []
    for first in range(0, ticks, ticks_per_batch):
        batch = Batch(node=node, gpus=inventory)
        for tick in range(first, min(first + ticks_per_batch, ticks)):
            ts = T0_MS + tick * 1000
            batch.gpu_samples += [GpuSample(
                gpu_uuid=g.uuid, ts_ms=ts, util_pct=rnd.uniform(0, 100), sm_active_pct=rnd.uniform(0, 100),
                sm_occupancy_pct=rnd.uniform(0, 100), tensor_active_pct=rnd.uniform(0, 100),
                dram_bw_util_pct=rnd.uniform(0, 100), mem_used_bytes=rnd.randrange(2**37),
                mem_reserved_bytes=2**29, mem_total_bytes=141 * 2**30, pcie_tx_bytes_per_s=rnd.uniform(0, 6e10),
                pcie_rx_bytes_per_s=rnd.uniform(0, 6e10), nvlink_tx_bytes_per_s=rnd.uniform(0, 4e11),
                nvlink_rx_bytes_per_s=rnd.uniform(0, 4e11), power_w=rnd.uniform(80, 700),
                temperature_c=rnd.uniform(30, 85), sm_clock_mhz=1980, clock_event_mask=0) for g in inventory]
            batch.host_samples.append(HostSample(ts_ms=ts, cpu_pct=rnd.uniform(0, 100), load1=3.0,
                                                 mem_used_bytes=2**36, mem_total_bytes=2**40))
        batches.append(batch)
    return batches


@contextmanager
def fresh_store(backend: str, pg_url: str) -> Iterator[str]:
    """The URL of an empty, migrated store; removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="trimtab-bench-") as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            _migrate(url)
            yield url
        return
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    schema = f"trimtab_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = f"{pg_url}{'&' if '?' in pg_url else '?'}options={quote(f'-csearch_path={schema}')}"
        _migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _migrate(url: str) -> None:
    engine = open_engine(url)
    migrate(engine)
    engine.dispose()


def time_trimtab(url: str, batches: list[Batch]) -> float:
    engine = open_engine(url)
    writer = BatchWriter(engine)
    start = time.perf_counter()
    for batch in batches:
        writer.write(batch)
    elapsed = time.perf_counter() - start
    engine.dispose()
    return elapsed


def time_raw(url: str, batches: list[Batch], with_host: bool = False) -> float:
    """Bare driver: the compiled statement, prepared parameter tuples, executemany and commit per batch.
    ``with_host`` adds each batch's host rows (a second executemany, in the same psycopg pipeline)."""
    engine = open_engine(url)
    with engine.begin() as conn:  # the rows the samples point to (not timed)
        node_id = conn.execute(nodes.insert().returning(nodes.c.id), {
            "hostname": "bench-node", "simulated": False, "first_seen_ms": T0_MS, "last_seen_ms": T0_MS}).scalar_one()
        uuids = {s.gpu_uuid for s in batches[0].gpu_samples}
        ids = {u: conn.execute(gpus.insert().returning(gpus.c.id), {
            "node_id": node_id, "uuid": u, "gpu_index": i, "name": "NVIDIA H200", "gpm_supported": True}).scalar_one()
            for i, u in enumerate(sorted(uuids))}
    # The very statements BatchWriter runs: compiled from the dialect's INSERT … ON CONFLICT DO NOTHING.
    statements = []
    for table, key, rows_of in ((gpu_samples, lambda r: ids[r.gpu_uuid], lambda b: b.gpu_samples),
                                (host_samples, lambda r: node_id, lambda b: b.host_samples))[:2 if with_host else 1]:
        names = [c.name for c in table.columns]
        stmt = DriverStatement(insert_for(engine.dialect, table).on_conflict_do_nothing(), engine.dialect, names)
        params = [[stmt.params((key(r), *(getattr(r, n) for n in names[1:]))) for r in rows_of(b)] for b in batches]
        statements.append((stmt.sql, params))
    raw = engine.raw_connection()
    dbapi = raw.driver_connection
    sqlite = engine.dialect.name == "sqlite"
    start = time.perf_counter()
    for i in range(len(batches)):
        if sqlite:
            dbapi.execute("BEGIN")  # the engine's connections leave BEGIN to the caller
        with nullcontext() if sqlite else dbapi.pipeline():
            for sql, params in statements:
                dbapi.cursor().executemany(sql, params[i])
        dbapi.commit()
    elapsed = time.perf_counter() - start
    raw.close()
    engine.dispose()
    return elapsed


def best_times(repeats: int, backend: str, pg_url: str, timers: list[Callable[[str, list[Batch]], float]],
               batches: list[Batch]) -> list[float]:
    """The best time of each timer over ``repeats`` rounds, each on a fresh store; the timers take turns
    within a round, so drift of the machine (PostgreSQL's fsync above all) is shared out evenly."""
    best = [float("inf")] * len(timers)
    for _ in range(repeats):
        for i, timer in enumerate(timers):
            with fresh_store(backend, pg_url) as url:
                best[i] = min(best[i], timer(url, batches))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--batch-ticks", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--repeats", type=int, default=5, help="rounds, each on fresh stores; the best counts")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="PostgreSQL to measure in a fresh schema; '' to skip")
    args = parser.parse_args()

    backends = ["sqlite"] + (["postgresql"] if args.pg_url else [])
    rows = args.gpus * args.ticks
    print(f"{args.gpus} GPUs x {args.ticks} ticks = {rows} gpu_samples rows (+ {args.ticks} host rows for trimtab); "
          f"best of {args.repeats}")
    print("rows/s count gpu_samples rows only. raw: the same INSERT by bare executemany of the gpu rows;")
    print("raw+host: also the host rows, which BatchWriter writes too (the work is then the same but for Python).")
    print(f"{'backend':<11} {'ticks/batch':>11} {'rows/batch':>10} {'trimtab rows/s':>15} {'raw rows/s':>11} "
          f"{'ratio':>6} {'raw+host rows/s':>16} {'ratio':>6}")
    for backend in backends:
        for ticks_per_batch in args.batch_ticks:
            batches = make_batches(args.gpus, args.ticks, ticks_per_batch)
            ours_s, raw_s, both_s = best_times(args.repeats, backend, args.pg_url,
                                               [time_trimtab, time_raw, partial(time_raw, with_host=True)], batches)
            print(f"{backend:<11} {ticks_per_batch:>11} {args.gpus * ticks_per_batch:>10} {rows / ours_s:>15,.0f} "
                  f"{rows / raw_s:>11,.0f} {raw_s / ours_s:>6.2f} {rows / both_s:>16,.0f} {both_s / ours_s:>6.2f}")


if __name__ == "__main__":
    main()
