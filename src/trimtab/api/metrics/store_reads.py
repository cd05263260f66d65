"""What one scrape reads from the store: the live jobs graded over their newest window, per-job counts of
decisions and changes, and the node verdicts — a fixed number of queries whatever the number of jobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from trimtab.grading.balance import BalanceReport


@dataclass
class JobScrape:
    """The live jobs graded over their newest window, and per-job counts of decisions and changes (all jobs in
    the store)."""

    summaries: list  # list[trimtab.grading.job_report.JobSummary]
    decisions: list[tuple[str, str, Optional[str], int]]  # (job, rule, outcome, count)
    changes: list[tuple[str, str, str, int]]              # (job, source, status, count)
    simulated_jobs: set[str]
    plan_errors: list[tuple[str, int]] = field(default_factory=list)  # (job, failed plans ever)


def read_jobs(engine, rules, now_ms: Optional[int] = None) -> JobScrape:
    """The jobs, their newest steps, the probe baselines not known yet, the simulated hosts, and the decision and
    change counts (the store's GROUP BYs)."""
    from trimtab.grading.job_report import LIVE_JOB_S, job_summaries
    from trimtab.store import changes as change_store
    from trimtab.store import jobs as job_store
    from trimtab.store.decisions import decision_counts
    from trimtab.store.plan_status import error_totals

    now = now_ms if now_ms is not None else int(time.time() * 1000)
    every = job_store.list_jobs(engine, limit=100_000, offset=0)
    since = now - int(LIVE_JOB_S * 1000)
    live = [j for j in every if j.last_report_ms is not None and j.last_report_ms >= since]
    simulated_hosts = job_store.simulated_hostnames(engine)
    summaries = job_summaries(engine, live, rules, now, decisions=0, simulated_hosts=simulated_hosts, planner=False)
    return JobScrape(summaries=summaries, decisions=decision_counts(engine), changes=change_store.change_counts(engine),
                     simulated_jobs={j.name for j in every if any(h in simulated_hosts for h in j.hostnames)},
                     plan_errors=error_totals(engine))


def read_store(engine, rules, window_s: float) -> tuple[list[BalanceReport], JobScrape]:
    """Node verdicts over ``window_s`` and the jobs. Jobs first: while any job reports, node verdicts leave the
    job checks to the job series."""
    from trimtab.grading.node_report import node_reports

    jobs = read_jobs(engine, rules)
    # Freshness is not a series (a scrape's own timestamps say how old a target's data is): not judged here.
    return node_reports(engine, window_s, rules=rules, live_jobs=bool(jobs.summaries), freshness=False), jobs
