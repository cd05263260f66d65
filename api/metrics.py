"""Prometheus exposition (text format 0.0.4) of the latest snapshot: ``GET /metrics`` renders it on every scrape.

Names follow dcgm-exporter where DCGM has the field, in dcgm-exporter's units and labels, so dashboards built for
DCGM work; everything else is ``trimtab_*`` in base units. A metric a GPU does not report is absent, never 0.
Nothing here calls NVML: GPU series come from :meth:`ApiContext.latest_gpus`; balance verdicts, job series and
rebalancer counters from a fixed number of store queries per scrape, whatever the number of jobs (see
:func:`read_jobs`); a failing store drops only the series it feeds (counted in ``trimtab_scrape_errors_total``).

Job series (``trimtab_job_*``, labels ``job`` and ``mode``) cover the jobs that reported in the last 10 minutes,
over each job's newest window of steps; the counters ``trimtab_rebalancer_decisions_total`` and
``trimtab_rebalancer_changes_total`` count every job's settled decisions and changes in the store.

Labels of every per-GPU series: ``gpu`` (index), ``UUID``, ``modelName``, ``Hostname`` (dcgm-exporter's spelling),
``hostname`` (trimtab's, shared with the per-node series); plus ``simulated="true"`` on every series of a
simulated node (absent on real ones, so a real node's label set is dcgm-exporter's). ``trimtab_node_simulated``
says 0 or 1 for every node, for joins.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trimtab.agent.readings import GPU_METRICS
from trimtab.api.context import ApiContext
from trimtab.rebalancer.balance import SEVERITY, BalanceReport
from trimtab.store.queries import LatestSample

log = logging.getLogger(__name__)

# What render_metrics returns; spelled out because prometheus_client's CONTENT_TYPE_LATEST moved to 1.0.0.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BALANCE_WINDOW_S = 30.0  # the window `trimtab check` grades by default
MIB = 1024**2
_SPEC_HELP = {m.name: m.help for m in GPU_METRICS}


@dataclass(frozen=True)
class DcgmMetric:
    """One GpuSample field exported under its dcgm-exporter name: value / ``divisor``, help + ``unit_note``."""

    name: str
    field: str
    divisor: float  # stored unit → dcgm-exporter's unit (a division keeps 42.5 % → 0.425 exact in text)
    unit_note: str

    def help(self) -> str:
        return f"{_SPEC_HELP[self.field]} {self.unit_note}"


# Every GPU_METRICS field has a DCGM counterpart (tests pin that a new field gets a decision here).
# Units are dcgm-exporter's: percent for GPU_UTIL, ratios 0-1 for the PROF activities, MiB for framebuffer.
# Our SM/tensor/DRAM activities and PCIe/NVLink rates come from NVML GPM (Hopper+), NVML's counterparts of these
# DCGM profiling fields; DCGM_FI_DEV_FB_TOTAL is a DCGM field that dcgm-exporter's default list leaves out.
DCGM_METRICS: tuple[DcgmMetric, ...] = (
    DcgmMetric("DCGM_FI_DEV_GPU_UTIL", "util_pct", 1, "Unit: %."),
    DcgmMetric("DCGM_FI_PROF_SM_ACTIVE", "sm_active_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_PROF_DRAM_ACTIVE", "dram_bw_util_pct", 100, "Unit: ratio 0-1, as DCGM."),
    DcgmMetric("DCGM_FI_DEV_FB_USED", "mem_used_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_DEV_FB_RESERVED", "mem_reserved_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_DEV_FB_TOTAL", "mem_total_bytes", MIB, "Unit: MiB."),
    DcgmMetric("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s", 1, "Protocol headers included. Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s", 1, "Protocol headers included. Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_s", 1, "Unit: bytes/s."),
    DcgmMetric("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_s", 1, "Unit: bytes/s."),
    DcgmMetric("DCGM_FI_DEV_POWER_USAGE", "power_w", 1, "Unit: W."),
    DcgmMetric("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1, "Unit: C."),
    DcgmMetric("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "Unit: MHz."),
    # Newer DCGM also names this field DCGM_FI_DEV_CLOCKS_EVENT_REASONS (same id); dashboards use the old name.
    DcgmMetric("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "clock_event_mask", 1, "Unit: bitmask of NVML reasons."),
)


def _fb_free_mib(row: LatestSample) -> Optional[float]:
    """DCGM's identity total = used + reserved + free (NVML memory v2)."""
    m = row.metrics
    total, used = m.get("mem_total_bytes"), m.get("mem_used_bytes")
    if total is None or used is None:
        return None
    return max(0.0, total - used - (m.get("mem_reserved_bytes") or 0)) / MIB


def _ratio_of_pcie_peak(field: str) -> Callable[[LatestSample], Optional[float]]:
    def ratio(row: LatestSample) -> Optional[float]:
        value = row.metrics.get(field)
        return None if value is None or not row.pcie_peak_bytes_per_s else value / row.pcie_peak_bytes_per_s

    return ratio


# Per-GPU series computed from a sample and its GPU's facts: (name, help, value or None).
DERIVED_GPU_METRICS: tuple[tuple[str, str, Callable[[LatestSample], Optional[float]]], ...] = (
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free: total - used - reserved. Unit: MiB.", _fb_free_mib),
    ("trimtab_gpu_pcie_tx_ratio_of_peak", "PCIe TX as a ratio of the link's per-direction peak (max gen x width).",
     _ratio_of_pcie_peak("pcie_tx_bytes_per_s")),
    ("trimtab_gpu_pcie_rx_ratio_of_peak", "PCIe RX as a ratio of the link's per-direction peak (max gen x width).",
     _ratio_of_pcie_peak("pcie_rx_bytes_per_s")),
    ("trimtab_gpu_pcie_peak_bytes_per_second", "Per-direction PCIe peak of the GPU's link, from its max generation "
     "and width.", lambda row: row.pcie_peak_bytes_per_s),
    ("trimtab_gpu_nvlink_links", "Active NVLink links; absent where the GPU has no NVLink.",
     lambda row: row.nvlink_link_count),
    ("trimtab_gpu_sample_timestamp_seconds", "When the GPU's latest sample was taken (Unix time); stale data shows "
     "as an old timestamp.", lambda row: row.ts_ms / 1000),
)


def _finite(value) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


def _simulated(labels: dict[str, str], simulated: bool) -> dict[str, str]:
    if simulated:
        labels["simulated"] = "true"
    return labels


def gpu_labels(row: LatestSample) -> dict[str, str]:
    return _simulated({"gpu": str(row.gpu_index), "UUID": row.gpu_uuid, "modelName": row.gpu_name,
                       "Hostname": row.hostname, "hostname": row.hostname}, row.simulated)


def _gauges(specs: Iterable[tuple[str, str, Callable]], items, labels_of) -> Iterator[Metric]:
    """One gauge family per spec, one sample per item whose value is known; families with no sample are left out."""
    for name, help_text, value_of in specs:
        family = GaugeMetricFamily(name, help_text)
        for item in items:
            value = _finite(value_of(item))
            if value is not None:
                family.add_sample(name, labels_of(item), value)
        if family.samples:
            yield family


def _dcgm_value(d: DcgmMetric) -> Callable[[LatestSample], Optional[float]]:
    def value(row: LatestSample) -> Optional[float]:
        v = row.metrics.get(d.field)
        return None if v is None else v / d.divisor

    return value


def gpu_families(rows: list[LatestSample]) -> Iterator[Metric]:
    dcgm = [(d.name, d.help(), _dcgm_value(d)) for d in DCGM_METRICS]
    yield from _gauges(dcgm + list(DERIVED_GPU_METRICS), rows, gpu_labels)


def balance_families(reports: list[BalanceReport]) -> Iterator[Metric]:
    """``trimtab_balance_status`` (0 ok or no data, 1 watch, 2 act) and ``trimtab_balance_value`` per check."""
    verdicts = [(r, v) for r in reports for v in r.verdicts]
    specs = (
        ("trimtab_balance_status", f"Balance verdict of a check over the last {BALANCE_WINDOW_S:.0f} s: 0 ok (or no "
         "data), 1 watch, 2 act (as `trimtab check`).", lambda rv: SEVERITY[rv[1].status]),
        ("trimtab_balance_value", f"The value a check graded over the last {BALANCE_WINDOW_S:.0f} s: "
         "utilization_spread in points, pcie in % of link peak, memory in % of total; absent without data.",
         lambda rv: rv[1].value),
    )
    yield from _gauges(specs, verdicts,
                       lambda rv: _simulated({"hostname": rv[0].hostname, "check": rv[1].check}, rv[0].simulated))


def node_families(simulated_by_host: Mapping[str, bool]) -> Iterator[Metric]:
    family = GaugeMetricFamily("trimtab_node_simulated",
                               "1 if the node's data is synthetic (a simulated node), else 0.")
    for hostname, simulated in sorted(simulated_by_host.items()):
        family.add_sample("trimtab_node_simulated", {"hostname": hostname}, 1.0 if simulated else 0.0)
    if family.samples:
        yield family


# -- jobs and the rebalancer -----------------------------------------------------------------------------------

# Settled outcomes only: a counter must never go down, and a pending decision (or change) becomes one of these.
SETTLED_DECISIONS = ("advised", "kept", "rolled_back", "refused", "superseded", "cancelled")
SETTLED_CHANGES = ("applied", "superseded", "cancelled")


@dataclass
class JobScrape:
    """What one scrape read about jobs: the live jobs graded over their newest window, and per-job counts of
    decisions and changes (all jobs in the store)."""

    summaries: list  # list[trimtab.rebalancer.job_report.JobSummary]
    decisions: list[tuple[str, str, Optional[str], int]]  # (job, rule, outcome, count)
    changes: list[tuple[str, str, str, int]]              # (job, source, status, count)
    simulated_jobs: set[str]


def read_jobs(engine, rules, now_ms: Optional[int] = None) -> JobScrape:
    """A fixed number of store queries whatever the number of jobs: the jobs, their newest steps, the probe
    baselines not known yet, the simulated hosts, and two GROUP BY counts."""
    import time

    from sqlalchemy import func, select

    from trimtab.rebalancer.job_report import LIVE_JOB_S, job_summaries
    from trimtab.store import jobs as job_store
    from trimtab.store.models import decisions, jobs, knob_changes

    now = now_ms if now_ms is not None else int(time.time() * 1000)
    every = job_store.list_jobs(engine, limit=100_000, offset=0)
    since = now - int(LIVE_JOB_S * 1000)
    live = [j for j in every if j.last_report_ms is not None and j.last_report_ms >= since]
    simulated_hosts = job_store.simulated_hostnames(engine)
    summaries = job_summaries(engine, live, rules, now, decisions=0, simulated_hosts=simulated_hosts)
    d, c = decisions.c, knob_changes.c
    with engine.connect() as conn:
        decided = conn.execute(select(jobs.c.name, d.rule, d.outcome, func.count()).join_from(decisions, jobs)
                               .group_by(jobs.c.name, d.rule, d.outcome)).all()
        changed = conn.execute(select(jobs.c.name, c.source, c.status, func.count()).join_from(knob_changes, jobs)
                               .group_by(jobs.c.name, c.source, c.status)).all()
    return JobScrape(summaries=summaries, decisions=[tuple(r) for r in decided], changes=[tuple(r) for r in changed],
                     simulated_jobs={j.name for j in every if any(h in simulated_hosts for h in j.hostnames)})


def _job_labels(job: str, mode: Optional[str], simulated: bool, **extra: str) -> dict[str, str]:
    labels = {"job": job, **({"mode": mode} if mode is not None else {}), **extra}
    return _simulated(labels, simulated)


def job_families(data: JobScrape) -> Iterator[Metric]:
    """Per live job (labels job, mode): throughput, step time, phase shares, fragmentation, collective latency and
    its baseline over the job's newest window, knob values and bounds, the grade of each job row; then the
    rebalancer's decisions and changes as counters. Unknown values are absent series."""
    from trimtab.rebalancer.balance import NO_DATA
    from trimtab.rebalancer.window import PHASES

    jobs = data.summaries

    def base(j) -> dict[str, str]:
        return _job_labels(j.name, j.mode, j.simulated)

    window = "over the job's newest window of steps (the rebalancer's window)"
    yield from _gauges((
        ("trimtab_job_samples_per_second", f"Throughput {window}: samples / step time. Unit: samples/s.",
         lambda j: j.samples_per_s),
        ("trimtab_job_step_time_seconds", f"Mean step time (the slowest rank's) {window}. Unit: seconds.",
         lambda j: j.step_time_s),
        ("trimtab_job_fragmentation_ratio", f"Mean allocator fragmentation (1 - allocated/reserved, worst rank) "
         f"{window}. Unit: ratio 0-1.", lambda j: j.fragmentation),
        ("trimtab_job_collective_latency_seconds", f"Mean small all-reduce probe latency {window}. Unit: seconds.",
         lambda j: None if j.collective_latency_us is None else j.collective_latency_us / 1e6),
        ("trimtab_job_collective_latency_baseline_seconds", "The job's own collective-latency baseline: median of "
         "its first probes (the collective_latency rule compares against it). Unit: seconds.",
         lambda j: None if j.probe_baseline_us is None else j.probe_baseline_us / 1e6),
        ("trimtab_job_last_report_timestamp_seconds", "When the job's newest step report arrived (Unix time).",
         lambda j: None if j.last_report_ms is None else j.last_report_ms / 1000),
    ), jobs, base)
    yield from _gauges((
        ("trimtab_job_phase_share_ratio", f"Share of step time spent in a phase (generation, evaluation, "
         f"communication, update, other) {window}. Unit: ratio 0-1.", lambda jp: jp[0].phase_shares.get(jp[1])),
    ), [(j, p) for j in jobs for p in PHASES], lambda jp: {**base(jp[0]), "phase": jp[1]})
    knobs = [(j, k, spec) for j in jobs for k, spec in sorted(j.knobs.items())]
    yield from _gauges((
        ("trimtab_job_knob_value", "Current value of a job's knob (batch_size, prefetch, sync_every; follows "
         "applied changes).", lambda x: x[2].get("value")),
        ("trimtab_job_knob_min", "Lowest value the job allows for the knob.", lambda x: x[2].get("min")),
        ("trimtab_job_knob_max", "Highest value the job allows for the knob.", lambda x: x[2].get("max")),
    ), knobs, lambda x: {**base(x[0]), "knob": x[1]})
    rows = [(j, v) for j in jobs for v in j.verdicts if v.status != NO_DATA]
    yield from _gauges((
        ("trimtab_job_check_status", "Grade of a job row (check: step_composition, fragmentation, "
         "collective_latency) over the job's newest window: 0 ok, 1 watch, 2 act, as `trimtab check`; absent "
         "without data.", lambda jv: SEVERITY[jv[1].status]),
    ), rows, lambda jv: {**base(jv[0]), "check": jv[1].check})

    pending_d: Counter[str] = Counter()
    pending_c: Counter[str] = Counter()
    decided = CounterMetricFamily("trimtab_rebalancer_decisions", "Rebalancer decisions by job, rule and outcome "
                                  "(advised, kept, rolled_back, refused, superseded, cancelled), counted once settled; "
                                  "decisions still measuring are trimtab_rebalancer_decisions_pending.")
    for job, rule, outcome, n in sorted(data.decisions, key=lambda r: tuple(str(x) for x in r)):
        if outcome in SETTLED_DECISIONS:
            decided.add_sample("trimtab_rebalancer_decisions_total",
                               _job_labels(job, None, job in data.simulated_jobs, rule=rule, outcome=outcome), n)
        elif outcome == "pending":
            pending_d[job] += n
    changed = CounterMetricFamily("trimtab_rebalancer_changes", "Knob changes by job, source (rebalancer, manual) "
                                  "and status (applied, superseded, cancelled), counted once settled; changes "
                                  "waiting for the job are trimtab_rebalancer_changes_pending.")
    for job, source, status, n in sorted(data.changes):
        if status in SETTLED_CHANGES:
            changed.add_sample("trimtab_rebalancer_changes_total",
                               _job_labels(job, None, job in data.simulated_jobs, source=source, status=status), n)
        elif status == "pending":
            pending_c[job] += n
    yield from _gauges((
        ("trimtab_rebalancer_decisions_pending", "Decisions whose change is in flight or being measured (0 or 1 "
         "per job).", lambda j: pending_d[j.name]),
        ("trimtab_rebalancer_changes_pending", "Knob changes queued and not yet applied by the job (0 or 1 per "
         "job).", lambda j: pending_c[j.name]),
    ), jobs, base)
    for family in (decided, changed):
        if family.samples:
            yield family


def job_metric_families(ctx: ApiContext, data: Optional[JobScrape] = None) -> Iterator[Metric]:
    """Job metrics (``trimtab_job_*``) and rebalancer decisions (``trimtab_rebalancer_*``) from the store; ``data``
    when the scrape has read it already."""
    yield from job_families(data if data is not None else read_jobs(ctx.engine, ctx.rules))


# Scrape errors are counted for the life of the process (a counter must not reset per scrape).
SCRAPE_PARTS = ("gpus", "balance")
_errors: Counter[str] = Counter()
_failing: set[str] = set()
_errors_lock = threading.Lock()


def _guarded(part: str, read: Callable[[], list]) -> list:
    """``read()``, or [] when it fails: a store error drops this part's series, not the whole scrape."""
    try:
        result = read()
    except Exception as exc:  # noqa: BLE001 - whatever the store raises, the scrape must still answer
        with _errors_lock:
            _errors[part] += 1
            first = part not in _failing
            _failing.add(part)
        if first:  # once per outage, not once per scrape
            log.warning("/metrics: %s series left out: %s", part, " ".join(str(exc).split())[:300])
        return []
    with _errors_lock:
        if part in _failing:
            _failing.discard(part)
            log.info("/metrics: %s series are back", part)
    return result


def _error_family() -> Metric:
    family = CounterMetricFamily("trimtab_scrape_errors", "Scrapes of /metrics that left out a part's series because "
                                 "reading it failed (part: gpus = the latest GPU samples, balance = what comes from "
                                 "the store: node verdicts, jobs and rebalancer decisions).", labels=["part"])
    with _errors_lock:
        for part in SCRAPE_PARTS:
            family.add_metric([part], _errors[part])
    return family


class TrimtabCollector:
    """A prometheus_client collector reading ``ctx`` on every ``collect()``; holds no values between scrapes."""

    def __init__(self, ctx: ApiContext):
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        rows = _guarded("gpus", self.ctx.latest_gpus)
        store = _guarded("balance", lambda: [self._read_store()])
        reports, jobs = store[0] if store else ([], None)
        simulated = {r.hostname: r.simulated for r in rows}
        simulated.update({r.hostname: r.simulated for r in reports})
        yield from gpu_families(rows)
        yield from node_families(simulated)
        yield from balance_families(reports)
        if jobs is not None:
            yield from job_metric_families(self.ctx, jobs)
        yield _error_family()

    def _read_store(self) -> tuple[list[BalanceReport], JobScrape]:
        """Jobs first: while any job reports, node verdicts leave the job checks to the job series."""
        from trimtab.rebalancer.node_report import node_reports

        jobs = read_jobs(self.ctx.engine, self.ctx.rules)
        reports = node_reports(self.ctx.engine, BALANCE_WINDOW_S, rules=self.ctx.rules, live_jobs=bool(jobs.summaries))
        return reports, jobs


def render_metrics(ctx: ApiContext) -> bytes:
    """The exposition of ``ctx`` now (serve it with :data:`CONTENT_TYPE`). Blocking (store queries): call it
    from a sync route, which FastAPI runs in its thread pool."""
    registry = CollectorRegistry(auto_describe=False)  # no describe(): register() must not run a collect()
    registry.register(TrimtabCollector(ctx))
    return generate_latest(registry)


__all__ = ["CONTENT_TYPE", "DCGM_METRICS", "JobScrape", "TrimtabCollector", "job_families", "job_metric_families",
           "read_jobs", "render_metrics"]
