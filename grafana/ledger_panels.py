"""The GPU-time ledger's panels (issue 40): where each GPU-second of a job went — busy by role and phase, idle by
cause — on both dashboard sets. ``grafana.job_boards`` (PostgreSQL) and ``grafana.node_boards`` (Prometheus) add
them; ``grafana.generate`` writes them.

* Prometheus: the counters ``trimtab_job_gpu_seconds_total`` and ``trimtab_gpu_idle_seconds_total`` as rates, i.e.
  GPUs busy (or idle) on average, stacked by role and phase (or cause) over time. The counters' ``job`` label
  becomes ``exported_job`` under Prometheus' default ``honor_labels: false``, so the panels sum over jobs and select
  by node (the ledger's ``hostname`` label) and GPU.
* PostgreSQL: the store keeps the ledger's accumulated totals (``job_gpu_ledger``: since the ledger first saw the
  job), not a time series. So the busy time over time is folded from the job's step reports the way the ledger
  builds its busy cells (each phase's CUDA-event seconds, else its wall seconds; a rank's role from the GPU it ran
  on), and the accumulated ledger — busy by role and phase, idle by cause with whom a wait was for — is a table.
"""

from __future__ import annotations

from grafana.panels import JOB_IS, sql, promql, table, timeseries

LEDGER_BUSY_PHASES = ("generation", "evaluation", "update", "validation")  # busy: CUDA-event time, else wall time

# The job's GPUs by role: (node, GPU) → its roles joined with '+' (colocated), as the ledger names them.
_ROLES_CTE = (
    "roles AS (\n"
    "  SELECT p ->> 'node' AS node, g::int AS gpu, string_agg(DISTINCT p ->> 'role', '+') AS role\n"
    "  FROM jobs j CROSS JOIN LATERAL json_array_elements(j.roles) AS p\n"
    "    CROSS JOIN LATERAL json_array_elements_text(p -> 'gpus') AS g\n"
    f"  WHERE {JOB_IS} AND j.roles IS NOT NULL GROUP BY 1, 2)")

BUSY_OVER_TIME_SQL = (
    f"WITH {_ROLES_CTE},\nbusy AS (\n"
    + "\n  UNION ALL\n".join(
        f"  SELECT r.received_ms AS t, coalesce(ro.role, 'unknown') || ' · {p}' AS metric, "
        f"coalesce(r.gpu_{p}_s, r.{p}_s) AS gpu_s\n"
        "  FROM job_reports r JOIN jobs j ON j.id = r.job_id\n"
        "    LEFT JOIN roles ro ON ro.node = r.hostname AND ro.gpu = r.local_gpu\n"
        f"  WHERE {JOB_IS} AND r.received_ms BETWEEN $__from AND $__to AND coalesce(r.gpu_{p}_s, r.{p}_s) > 0"
        for p in LEDGER_BUSY_PHASES)
    + "\n)\n"
    "SELECT $__unixEpochGroupAlias(t / 1000.0, $__interval), metric, sum(gpu_s) AS \"GPU-seconds\"\n"
    "FROM busy GROUP BY 1, 2 ORDER BY 1, 2")

LEDGER_COLUMNS = ["GPU", "kind", "role", "phase or cause", "waiting for", "GPU-hours", "share"]
LEDGER_TOTALS_SQL = (
    "SELECT l.hostname || ':' || l.gpu_index AS \"GPU\", l.kind AS \"kind\", l.role AS \"role\",\n"
    "  l.name AS \"phase or cause\", nullif(l.waiting_for, '') AS \"waiting for\", l.gpu_s / 3600.0 AS \"GPU-hours\",\n"
    "  100 * l.gpu_s / nullif(sum(l.gpu_s) OVER (PARTITION BY l.hostname, l.gpu_index), 0) AS \"share\"\n"
    "FROM job_gpu_ledger l JOIN jobs j ON j.id = l.job_id\n"
    f"WHERE {JOB_IS}\nORDER BY l.kind, l.gpu_s DESC")


def ledger_pg_panels() -> list[dict]:
    return [
        timeseries("GPU-seconds by role and phase (stacked)",
                   "Busy GPU-seconds in each interval by role and phase, from the job's step reports as the "
                   "GPU-time ledger counts them: each phase's CUDA-event seconds where the hook timed it, else its "
                   "wall seconds; a rank's role from the GPU it ran on (its placement). Idle time and whom a wait "
                   "was for are in the ledger's table below and in GET /v1/jobs/{name}/gpu-time.",
                   [sql(BUSY_OVER_TIME_SQL)], "s", stack=True, no_value="no phase timings"),
        table("GPU time since the job began (the ledger)",
              "The accumulated GPU-time ledger (the store's job_gpu_ledger, advanced every 15 s by the server): "
              "per GPU, busy GPU-hours by role and phase and idle GPU-hours by cause — waiting (for the role in "
              "'waiting for'), host (its own role's host-side work), communication, no_job, unknown — and each "
              "cell's share of its GPU's time. The /metrics counters trimtab_job_gpu_seconds_total and "
              "trimtab_gpu_idle_seconds_total carry the same.",
              sql(LEDGER_TOTALS_SQL, "table"), LEDGER_COLUMNS, h=10),
    ]


LEDGER_SEL = 'hostname=~"$host", gpu=~"$gpu"'
BUSY_PROM = f"sum by (role, phase) (rate(trimtab_job_gpu_seconds_total{{{LEDGER_SEL}}}[$__rate_interval]))"
IDLE_PROM = f"sum by (cause) (rate(trimtab_gpu_idle_seconds_total{{{LEDGER_SEL}}}[$__rate_interval]))"


def ledger_prom_panels() -> list[dict]:
    return [
        timeseries("GPUs busy by role and phase (GPU-seconds per second, stacked)",
                   "rate(trimtab_job_gpu_seconds_total): the selected GPUs' busy GPU-seconds per second by role and "
                   "phase, summed over jobs — 1.0 is one GPU busy all the time. From trimtab's GPU-time ledger "
                   "(advanced every 15 s by the server, 10–25 s behind now). trimtab's own series: a "
                   "dcgm-exporter-only Prometheus has no data here.",
                   [promql(BUSY_PROM, "{{role}} · {{phase}}")], "none", stack=True, no_value="no ledger data"),
        timeseries("GPUs idle by cause (GPU-seconds per second, stacked)",
                   "rate(trimtab_gpu_idle_seconds_total): the selected GPUs' idle GPU-seconds per second by cause — "
                   "waiting_for_<role> (the role whose GPUs worked meanwhile), host (host-side work of its own "
                   "role), communication, no_job, unknown — summed over jobs.",
                   [promql(IDLE_PROM, "{{cause}}")], "none", stack=True, no_value="no ledger data"),
    ]
