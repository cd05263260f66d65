"""Prometheus exposition (text format 0.0.4) of the latest snapshot: ``GET /metrics`` renders it on every scrape.

Names follow dcgm-exporter where DCGM has the field, in dcgm-exporter's units and labels, so dashboards built for
DCGM work — its current generation by default (4.10: ratios, bytes, Hz, ``hostname``), the legacy one (up to 4.8.2:
percent, MiB, MHz, ``Hostname``) behind the daemon's ``--metrics-dcgm-names legacy`` (``dcgm_names``); everything
else is ``trimtab_*`` in base units. A metric a GPU does not report is absent, never 0.
Nothing here calls NVML: GPU series come from :meth:`ApiContext.latest_gpus` (per-link NVLink, off unless the
daemon's ``--metrics-nvlink-links`` or the scrape's ``?nvlink_links=true`` asks, from
:meth:`ApiContext.latest_links`); balance verdicts, job series and rebalancer counters from a fixed number of
store queries per scrape, whatever the number of jobs; a failing store drops only the series it feeds (counted in
``trimtab_scrape_errors_total``).

By subject: ``gpus`` (per-GPU and per-link series), ``dcgm_names`` (the two generations of DCGM names),
``nodes`` (balance verdicts, ``trimtab_node_simulated``), ``jobs`` (job series, rebalancer counters),
``store_reads`` (what a scrape reads from the store), ``scrape_errors``, ``families`` (how every family is built, ``simulated`` label included), ``text_family`` (gauge
families written line by line), ``collector``.
"""

from trimtab.api.metrics.collector import CONTENT_TYPE, TrimtabCollector, job_metric_families, render_metrics
from trimtab.api.metrics.gpus import DCGM_METRICS
from trimtab.api.metrics.jobs import job_families
from trimtab.api.metrics.store_reads import JobScrape, read_jobs

__all__ = ["CONTENT_TYPE", "DCGM_METRICS", "JobScrape", "TrimtabCollector", "job_families", "job_metric_families",
           "read_jobs", "render_metrics"]
