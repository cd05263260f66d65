"""What the GPU-time ledger costs (issue 40): per step report it folds, and per /metrics scrape, each as a ratio
against today's figure measured in the same run on the same store.

An in-process store (SQLite in a temporary directory) holds ``--jobs`` jobs, each the simulated pipeline of
tests/api/test_gpu_time_truth.py on a 4-GPU simulated node of its own (actor [0,1], critic [2], reward [3]; 10 s
steps; 1 Hz samples) over the last ``--minutes`` minutes.

* per report: ``GET /v1/jobs/{name}/gpu-time``'s work (the window's reads and the ledger) over a window of R
  reports, divided by R, against storing one report (``job_store.add_reports``, the report path, per report) —
  the ledger adds nothing to the report path itself, so this says what reading it back costs per report.
* per scrape: /metrics (render_metrics) with the ledger's counters — a scrape reads the accumulated table only;
  the ledger's ticker advances every job by 15 s between scrapes, timed apart (per tick) — against /metrics
  without them, scrapes alternated, same store, same moment's data. (On main at ef53228 the scrape itself
  advanced the ledger: 1.15x.)

    python bench/gpu_ledger.py                     # 8 jobs, 30 minutes, 20 scrapes each way
    python bench/gpu_ledger.py --smoke             # < 20 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's tests/ helpers

import trimtab.api.metrics.collector as collector  # noqa: E402
import trimtab.store.jobs as job_store  # noqa: E402
from trimtab.agent.scenarios import PIPELINE_SCHEDULE  # noqa: E402
from trimtab.agent.simulated import SimulatedNode  # noqa: E402
from trimtab.api.context import ApiContext  # noqa: E402
from trimtab.api.metrics import render_metrics  # noqa: E402
from trimtab.contract.readings import Batch, NodeInfo  # noqa: E402
from trimtab.contract.roles import RolePlacement  # noqa: E402
from trimtab.contract.step_report import to_columns  # noqa: E402
from trimtab.grading.ledger.read import MAX_ADVANCE_MS, job_ledger  # noqa: E402
from trimtab.grading.ledger.ticker import advance_all  # noqa: E402
from trimtab.store.engine import open_engine
from trimtab.store.ingest import BatchWriter  # noqa: E402
from trimtab.store.migrate import migrate  # noqa: E402
from tests.support.pipeline_job import RANKS, report  # noqa: E402

PERIOD_MS = int(PIPELINE_SCHEDULE.period_s * 1000)
SCRAPE_EVERY_MS = 15_000


def fill(engine, jobs: int, minutes: float, now_ms: int) -> tuple[list, float]:
    """The jobs, their nodes' samples and their reports; returns the jobs and the mean seconds to store a report."""
    t0 = now_ms - now_ms % PERIOD_MS - int(minutes * 60_000)
    steps = int(minutes * 60_000) // PERIOD_MS
    writer, stored, store_s = BatchWriter(engine), [], 0.0
    for j in range(jobs):
        host = f"bench-node-{j}"
        roles = [RolePlacement(role, host, (gpu,), (pid,)) for _, role, gpu, pid in RANKS]
        real_now = job_store.now_ms
        job_store.now_ms = lambda: t0 - 1000
        job, _ = job_store.register_job(engine, f"pipe{j}", 4, {}, [host], {}, "off", None, True, roles=roles)
        node = SimulatedNode(4, scenario="pipeline", hostname=host, seed=j)
        ticks = list(range(t0 - 5000, now_ms, 1000))
        for a in range(0, len(ticks), 300):
            samples = [s for i, ts in enumerate(ticks[a:a + 300], a) for s in node.readings_at(i, ts).gpu_samples]
            writer.write(Batch(node=NodeInfo(hostname=host, simulated=True, scenario="pipeline"),
                               gpus=node.inventory().gpus, gpu_samples=samples))
        for step in range(1, steps + 1):
            job_store.now_ms = lambda s=step: t0 + s * PERIOD_MS + 20
            rows = [to_columns({**report(step, rank, role, gpu, pid), "hostname": host})
                    for rank, role, gpu, pid in RANKS]
            start = time.perf_counter()
            job_store.add_reports(engine, job.id, rows)
            store_s += time.perf_counter() - start
        job_store.now_ms = real_now
        stored.append(job_store.get_job(engine, job.name))
    writer.close()
    return stored, store_s / (jobs * steps * len(RANKS))


def per_report(engine, jobs, now_ms: int, window_s: float, rounds: int) -> tuple[float, int]:
    """Seconds of the window's ledger per report in it (median over rounds), and the reports per window."""
    reports = int(window_s * 1000) // PERIOD_MS * len(RANKS)
    times = []
    for _ in range(rounds):
        for job in jobs:
            start = time.perf_counter()
            job_ledger(engine, job, now_ms - int(window_s * 1000), now_ms)
            times.append(time.perf_counter() - start)
    return statistics.median(times) / reports, reports


def per_scrape(ctx, start_ms: int, scrapes: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """Scrape times with the ledger's counters and without them, alternated; the ledger's tick times (a tick
    advancing every job by 15 s before each pair of scrapes, then one untimed scrape: the first read after a write
    re-reads SQLite's pages, whichever scrape it is); and the time the counters' own part took in each scrape."""
    with_ledger, without, ticks, own = [], [], [], []
    original = collector.ledger_families

    def timed(ctx_):
        begin = time.perf_counter()
        families = list(original(ctx_))
        own.append(time.perf_counter() - begin)
        return iter(families)

    for k in range(scrapes):
        begin = time.perf_counter()
        advance_all(ctx.engine, start_ms + k * SCRAPE_EVERY_MS)
        ticks.append(time.perf_counter() - begin)
        collector.ledger_families = original
        render_metrics(ctx)
        for on in ((True, False) if k % 2 else (False, True)):
            collector.ledger_families = timed if on else (lambda _ctx: iter(()))
            begin = time.perf_counter()
            body = render_metrics(ctx)
            (with_ledger if on else without).append(time.perf_counter() - begin)
            if on and b"trimtab_job_gpu_seconds_total" not in body:
                raise SystemExit("the ledger's counters are missing from /metrics")
    collector.ledger_families = original
    return with_ledger, without, ticks, own


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--window-s", type=float, default=600.0, help="the per-report window (GET …/gpu-time)")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="2 jobs, 6 minutes, 4 scrapes, 1 round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.jobs, args.minutes, args.window_s, args.scrapes, args.rounds = 2, 6.0, 120.0, 4, 1
    with tempfile.TemporaryDirectory(prefix="trimtab-ledger-bench-") as tmp:
        engine = open_engine(f"sqlite:///{tmp}/store.db")
        migrate(engine)
        now_ms = int(time.time() * 1000)
        jobs, store_report_s = fill(engine, args.jobs, args.minutes, now_ms)
        ledger_report_s, n = per_report(engine, jobs, now_ms, args.window_s, args.rounds)
        ctx = ApiContext(engine=engine, mode="server", state_dir=Path(tmp))
        scrape_start = now_ms - int(args.minutes * 60_000 / 2)
        with_ledger, without, ticks, own = per_scrape(ctx, scrape_start, args.scrapes)
        engine.dispose()
    print(f"store: {args.jobs} pipeline jobs x 4 GPUs, {args.minutes:g} min of 10 s steps and 1 Hz samples (SQLite)")
    print(f"per report: storing it {1e3 * store_report_s:.3f} ms; the ledger of a {args.window_s:g} s window "
          f"({n} reports) {1e3 * ledger_report_s:.3f} ms per report; ratio ledger/store "
          f"{ledger_report_s / store_report_s:.2f}")
    rest_on, rest_off, rest_ticks = with_ledger[1:] or with_ledger, without[1:] or without, ticks[1:] or ticks
    print(f"per scrape: /metrics without the ledger's counters {1e3 * statistics.median(rest_off):.1f} ms, with them "
          f"{1e3 * statistics.median(rest_on):.1f} ms (median of {len(rest_on)}); ratio "
          f"{statistics.median(rest_on) / statistics.median(rest_off):.2f}; the counters' own part of a scrape "
          f"{1e3 * statistics.median(own):.1f} ms (median), {statistics.median(own) / statistics.median(rest_off):.3f} "
          f"of a scrape without them")
    print(f"per tick (the ledger's timer, off the scrape path): {1e3 * statistics.median(rest_ticks):.1f} ms to "
          f"advance {args.jobs} jobs by {SCRAPE_EVERY_MS / 1000:g} s (median of {len(rest_ticks)}; the first, which "
          f"accumulates {min(args.minutes / 2, MAX_ADVANCE_MS / 60_000):g} min at once, {1e3 * ticks[0]:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
