"""A job whose plan raises (issue 38): how many plans the rebalancer tries and how many WARNING lines it logs while
the job reports 4 steps a second. Before: a plan and a line at every report (the job stayed due, so each report
queued it again); now: the job is planned again after plan_retry_min_s doubling up to plan_retry_max_s, one line per
change of the backoff.

The job is real (registered in a fresh SQLite store, its reports stored); its plan is made to raise
ZeroDivisionError (the controller's own bug that issue 38 found is fixed: any exception takes this path). The
rebalancer runs its planning thread as the daemon does (in this process: a child process changes nothing here).

    PYTHONPATH=src python bench/failing_plan.py --seconds 30
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time


def run(seconds: float, every_s: float = 0.25) -> tuple[int, int, int, list[str]]:
    """(reports, plans tried, WARNING lines, the lines)."""
    with tempfile.TemporaryDirectory(prefix="trimtab-failing-plan-") as tmp:
        return _run(tmp, seconds, every_s)


def _run(tmp: str, seconds: float, every_s: float) -> tuple[int, int, int, list[str]]:
    from trimtab.control import service as service_mod
    from trimtab.control.service import Rebalancer
    from trimtab.store import jobs as job_store
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    engine = open_engine(f"sqlite:///{tmp}/t.db")
    migrate(engine)
    job, _ = job_store.register_job(engine, "grpo", 1, {}, ["node-a"],
                                    {"batch_size": {"value": 4, "min": 1, "max": 64}}, "auto", None, True)
    tried: list[float] = []

    def raising(state, *args, **kwargs):
        tried.append(time.monotonic())
        return 1.0 / 0.0

    service_mod.plan = raising
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    logging.getLogger("trimtab.control").addHandler(Lines())
    rb = Rebalancer(engine, interval_s=1.0).start()
    started, step = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        job_store.add_report(engine, job.id, dict(step=step, rank=0, step_time_s=every_s, generation_s=0.8 * every_s,
                                                  samples=8))
        rb.after_report(job_store.get_job(engine, "grpo"), step, every_s)
        step += 1
        time.sleep(every_s)
    rb.stop()
    engine.dispose()
    return step, len(tried), len(lines), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    reports, tried, n_lines, lines = run(args.seconds)
    print(f"{args.seconds:g} s, {reports} reports: {tried} plans tried, {n_lines} WARNING lines")
    for line in lines[:10]:
        print("  ", line[:200])


if __name__ == "__main__":
    main()
